"""Every chapter notebook in notebooks/ runs in the smoke profile without errors and renders its verdicts.

Slow by nature (each chapter loads the embedded model): marked ``notebook``; run with ``-m notebook``.
"""

import json

import pytest

from studylib.workbook import paths
from studylib.workbook.runner import OK, discover, reproduce

CHAPTERS = sorted(discover(paths.notebooks_dir())) if paths.notebooks_dir().is_dir() else []


@pytest.mark.notebook
@pytest.mark.parametrize("chapter", CHAPTERS, ids=[f"ch{c:02d}" for c in CHAPTERS])
def test_chapter_runs_in_smoke_profile(chapter, tmp_path):
    runs = reproduce(profile="smoke", chapters=[chapter], out_dir=tmp_path, progress=False)
    assert [r.status for r in runs] == [OK], runs[0].error
    nn = f"ch{chapter:02d}"
    data = json.loads((tmp_path / f"{nn}.json").read_text())
    assert data["chapter"] == chapter and data["verdicts"], "the chapter must save at least one verdict"
    html = (tmp_path / f"{nn}.html").read_text()
    assert "verdict-table" in html and "output_error" not in html
    for v in data["verdicts"]:
        assert v["id"] in html and v["verdict"] in html
    assert "IProgress" not in html and "it/s]" not in html  # no progress-bar debris in the report
    assert f"{nn}.html" in (tmp_path / "index.html").read_text()
    figures = json.loads((tmp_path / f"{nn}.figures.json").read_text())  # studylib.workbook.figure_check
    assert figures["defects"] == [], "; ".join(figures["defects"])


def test_every_chapter_is_in_every_profile():
    import yaml

    for profile in paths.PROFILES:
        cfg = yaml.safe_load((paths.params_dir() / f"{profile}.yaml").read_text())
        missing = [c for c in CHAPTERS if f"ch{c:02d}" not in cfg]
        assert not missing, f"{profile}.yaml has no section for chapters {missing}"
