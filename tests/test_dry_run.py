"""``studylib reproduce --dry-run``: every real profile passes; typos, wrong types, unknown models and bad
patterns are each one line, exit 2; nothing runs."""

from __future__ import annotations

import shutil

import pytest
import yaml

from studylib.cli import main
from studylib.workbook import paths
from studylib.workbook.dry_run import _compatible, dry_run


@pytest.mark.parametrize("profile", paths.PROFILES, ids=[f"{p}_profile" for p in paths.PROFILES])  # not "gpu": a gpu-marked id is skipped
def test_every_profile_passes_the_dry_run(profile):
    # The gpu profile too, on a machine without CUDA: its CUDA settings must stop with a clear message.
    assert dry_run(profile) == []


@pytest.fixture
def params_copy(tmp_path):
    """notebooks/ with a writable copy of params/ (the notebooks themselves are only read)."""
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    for nb in paths.notebooks_dir().glob("*.ipynb"):
        (nb_dir / nb.name).symlink_to(nb)
    shutil.copytree(paths.notebooks_dir() / "params", nb_dir / "params")
    return nb_dir


def _edit(nb_dir, profile, section, **values):
    path = nb_dir / "params" / f"{profile}.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(cfg))


def test_each_kind_of_problem_is_one_line(params_copy):
    _edit(params_copy, "gpu", "ch06", n_doc=10, n_docs="ten", doc_patterns=["quest:budget=10"])
    _edit(params_copy, "gpu", "ch01", model="no-such-model-anywhere", repeats=2.5)
    problems = dry_run("gpu", notebooks_dir=params_copy, overrides={"speedup_len": [1, 2], "nosuch": 1})
    text = "\n".join(problems)
    assert "ch06 sets 'n_doc'" in text  # a misspelt key
    assert "n_docs = 'ten' is a str, but the notebook's default is an int" in text  # a wrong type
    assert "speedup_len = [1, 2] is a list" in text  # an override of the wrong type
    assert "doc_patterns: bad attention pattern 'quest:budget=10'" in text
    assert "ch01 (01_autoregressive_baseline.ipynb): model: unknown model 'no-such-model-anywhere'" in text
    assert "repeats = 2.5 is a float" in text
    assert "-p nosuch: no chosen chapter" in text
    assert all("\n" not in p for p in problems)


def test_cli_exit_codes(params_copy, capsys):
    assert main(["reproduce", "--profile", "smoke", "--dry-run", "--notebooks", str(params_copy)]) == 0
    assert "Nothing was run" in capsys.readouterr().out
    _edit(params_copy, "smoke", "ch02", gamas=[1, 2])
    assert main(["reproduce", "--profile", "smoke", "--dry-run", "--notebooks", str(params_copy),
                 "--chapters", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gamas" in err and err.startswith("studylib: ")


def test_type_compatibility_rules():
    assert _compatible(1.0, 2) and _compatible(2, 3) and not _compatible(2, 2.5)
    assert not _compatible(True, 1) and not _compatible(1, True) and _compatible(False, True)
    assert _compatible(["a"], ["b", "c"]) and not _compatible(["a"], [1]) and _compatible([], [1, "x"])
    assert _compatible(None, {"x": 1}) and not _compatible({"a": 1}, [1])
