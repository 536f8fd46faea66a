"""The reproduce runner on tiny throwaway notebooks: outputs, failure isolation, atomic writes, --resume."""

import json
import os
import time

import nbformat
import pytest

from studylib.errors import StudylibError
from studylib.workbook import paths, save_chapter, show_provenance, to_jsonable
from studylib.workbook.runner import FAILED, OK, UP_TO_DATE, parse_chapters, parse_overrides, reproduce

BODY = """
import studylib.claims as claims
from studylib.workbook import save_chapter
if fail:
    raise ValueError("boom from chapter {n}")
v = claims.judge_at_least("C1", "R^2", (r2, r2 - 5e-4, r2 + 5e-4, 10), 0.99, ">= 0.99", f"model={{model}}", {n})
save_chapter(chapter={n}, title="Toy chapter {n}", verdicts=[v], measurements={{"r2": r2, "model": model}}, declarations=None,
             out_dir=out_dir, params={{"model": model}})
"""


def make_notebook(folder, n, name="toy"):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile = "smoke"\nout_dir = "."\nmodel = "m0"\nr2 = 0.5\nfail = False')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# Toy {n}"), params,
                nbformat.v4.new_code_cell(BODY.format(n=n))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / f"{n:02d}_{name}.ipynb"
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def book(tmp_path):
    nbs = tmp_path / "notebooks"
    (nbs / "params").mkdir(parents=True)
    (nbs / "params" / "smoke.yaml").write_text(
        "common:\n  model: common-model\n  unused_elsewhere: 1\nch01:\n  r2: 0.999\nch02:\n  r2: 0.999\n")
    make_notebook(nbs, 1)
    make_notebook(nbs, 2)
    return nbs, tmp_path / "out"


def run(book, **kw):
    nbs, out = book
    return reproduce(profile="smoke", out_dir=out, notebooks_dir=nbs, progress=False, **kw)


@pytest.mark.notebook
def test_run_writes_reports_index_and_injects_parameters(book):
    _, out = book
    runs = run(book, chapters=[1], overrides={"model": "cli-model"})
    assert [(r.chapter, r.status) for r in runs] == [(1, OK)]
    data = json.loads((out / "ch01.json").read_text())
    # profile section beats common; -p beats both; verdict computed in the notebook from the injected r2.
    assert data["measurements"] == {"r2": 0.999, "model": "cli-model"}
    assert data["verdicts"][0]["verdict"] == "holds" and data["provenance"]["git_commit"]
    html = (out / "ch01.html").read_text()
    assert "verdict-table" in html and "does not hold" not in html
    assert (out / "ch01.ipynb").exists()
    index = (out / "index.html").read_text()
    # the toy chapter saves without a declaration, so its "holds" loads as exploratory (capped)
    assert "C1: inconclusive" in index and "ch01.html" in index and "Toy 1" in index
    assert json.loads((out / "index.json").read_text())["chapters"]["1"]["params"]["model"] == "cli-model"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staging or temp debris


@pytest.mark.notebook
def test_failed_chapter_is_isolated_and_keeps_last_good_results(book):
    nbs, out = book
    assert [r.status for r in run(book, chapters=[2])] == [OK]
    good_json = (out / "ch02.json").read_bytes()
    good_yaml = (nbs / "params" / "smoke.yaml").read_text()
    (nbs / "params" / "smoke.yaml").write_text("ch01:\n  r2: 0.999\nch02:\n  fail: true\n")
    runs = run(book)
    # The failure is reported, the other chapter still ran, and ch02's last good outputs survive.
    assert [r.status for r in runs] == [OK, FAILED] and "boom from chapter 2" in runs[1].error
    assert (out / "ch01.json").exists()
    assert (out / "ch02.json").read_bytes() == good_json
    page = (out / "ch02.html").read_text()  # re-rendered (its neighbours changed), from the good run
    assert "verdict-table" in page and "output_error" not in page and "This chapter failed" not in page
    failed_html = (out / "ch02.failed.html").read_text()
    assert "boom from chapter 2" in failed_html and "This chapter failed" in failed_html
    assert "output_error" in failed_html  # the traceback cell, which test_notebooks asserts is absent
    index = (out / "index.html").read_text()
    assert "boom from chapter 2" in index and "last successful run" in index
    # A later success clears the failure page.
    (nbs / "params" / "smoke.yaml").write_text(good_yaml)
    assert run(book, chapters=[2])[0].status == OK
    assert not (out / "ch02.failed.html").exists()


@pytest.mark.notebook
def test_resume_skips_up_to_date_and_reruns_stale(book, monkeypatch):
    from studylib.workbook import runner

    nbs, out = book
    lib = nbs / "fake_lib.py"  # stands in for the studylib sources, which other work may be editing
    lib.write_text("x = 1\n")
    monkeypatch.setattr(runner, "library_sources", lambda: [lib])
    run(book, chapters=[1])
    stamp = (out / "ch01.json").stat().st_mtime_ns
    assert [r.status for r in run(book, chapters=[1], resume=True)] == [UP_TO_DATE]
    assert (out / "ch01.json").stat().st_mtime_ns == stamp
    assert [r.status for r in run(book, chapters=[1], resume=True, overrides={"r2": 0.995})] == [OK]
    assert [r.status for r in run(book, chapters=[1], resume=True, overrides={"r2": 0.995})] == [UP_TO_DATE]
    future = time.time() + 5
    os.utime(lib, (future, future))  # a newer library source makes the chapter stale
    assert [r.status for r in run(book, chapters=[1], resume=True, overrides={"r2": 0.995})] == [OK]


def test_atomic_write_never_leaves_partial_files(tmp_path, monkeypatch):
    target = tmp_path / "ch01.json"
    paths.atomic_write(target, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(paths.os, "replace", broken_replace)
    with pytest.raises(OSError):
        paths.atomic_write(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ch01.json"]


def test_bad_input_is_a_clear_error(book):
    with pytest.raises(StudylibError, match="available chapters: 1, 2"):
        run(book, chapters=[9])
    nbs, out = book
    with pytest.raises(StudylibError, match="unknown profile 'fast'.*smoke"):
        reproduce(profile="fast", out_dir=out, notebooks_dir=nbs, progress=False)
    with pytest.raises(StudylibError, match="no chosen chapter has such a parameter"):
        run(book, overrides={"modle": "x"})
    (nbs / "params" / "smoke.yaml").write_text("ch01:\n  r3: 0.5\n")
    with pytest.raises(StudylibError, match="ch01 sets r3, which 01_toy.ipynb has no parameter for"):
        run(book, chapters=[1])
    with pytest.raises(StudylibError, match="key=value"):
        parse_overrides(["model"])
    with pytest.raises(StudylibError):
        parse_chapters("one")


def test_parsers():
    assert parse_chapters("1,3-4") == [1, 3, 4] and parse_chapters(None) is None
    assert parse_overrides(["a=8", "b=0.5", "c=smollm2-135m", "d=[1, 2]", "e=true"]) == {
        "a": 8, "b": 0.5, "c": "smollm2-135m", "d": [1, 2], "e": True}


def test_save_chapter_and_provenance_outside_a_notebook(tmp_path, capsys):
    import numpy as np

    from studylib.bench.stats import BCA, Estimate
    from studylib.claims import judge_at_least

    v = judge_at_least("C2", "fraction", Estimate(0.7, 0.6, 0.8, 3, [0.6, 0.7, 0.8]), 0.5, ">=0.5", "", 1)
    path = save_chapter(1, "t", [v], {"e": Estimate(1.0, 1.0, 1.0, 1, [1.0]), "a": np.arange(3),
                                      "x": np.float32(2.5), "nan": float("nan")}, tmp_path, declarations=None)
    data = json.loads(path.read_text())
    assert data["measurements"] == {"e": {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0, "n": 1, "samples": [1.0],
                                          "confidence": 0.95, "method": BCA,
                                          "mc_error": 0.0},
                                    "a": [0, 1, 2], "x": 2.5, "nan": None}
    # every record names the code that measured it (studylib.code_registration)
    assert set(data["code_fingerprint"]) == {"code", "params", "files"} and data["code_fingerprint"]["params"] is None
    assert "C2" in capsys.readouterr().out
    with pytest.raises(ValueError, match="chapter"):
        save_chapter(2, "t", [v], {}, tmp_path, display=False, declarations=None)
    show_provenance(model="m", device="cpu")
    out = capsys.readouterr().out
    assert "parameters: model=m; device=cpu" in out and "git commit" in out
    assert to_jsonable({1: (1, 2)}) == {"1": [1, 2]}


def test_claims_cli_reads_the_reports(tmp_path, capsys):
    from studylib.claims import judge_at_least
    from studylib.cli import main

    r2 = (0.999, 0.998, 0.9995, 10)  # value, CI, n prompts
    save_chapter(1, "t", [judge_at_least("C1", "R^2", r2, 0.99, ">=0.99", "", 1)], {}, tmp_path, display=False, declarations=None)
    assert main(["claims", "--dir", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    # saved without a declaration: the decision is exploratory and cannot read "holds"
    assert rows[0]["id"] == "C1" and rows[0]["verdict"] == "inconclusive" and rows[0]["chapter"] == 1
    assert rows[0]["exploratory"] and "it read 'holds'" in rows[0]["conditions"]
    assert set(rows[0]) == {"id", "claim", "metric", "measured", "ci", "claimed", "verdict", "conditions", "chapter",
                            "n", "threshold", "direction", "role", "unit", "by_construction", "confidence", "tried",
                            "registered_in", "exploratory", "power", "ci_method", "mc_error"}
    assert rows[0]["n"] == 10 and rows[0]["threshold"] == 0.99 and rows[0]["direction"] == "at_least"
    assert main(["claims", "--dir", str(tmp_path / "nothing")]) == 2  # no chNN.json there: one-line error


def test_kernel_choice_prefers_a_studylib_kernel_of_this_interpreter(monkeypatch):
    import sys

    from jupyter_client import kernelspec

    from studylib.workbook.runner import kernel_for_this_python

    class Spec:
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]

    monkeypatch.setattr(kernelspec.KernelSpecManager, "get_kernel_spec", lambda self, name: Spec())
    assert kernel_for_this_python() == "studylib"
    Spec.argv = ["/some/other/env/bin/python", "-m", "ipykernel_launcher"]
    assert kernel_for_this_python() == "python3"  # never run the chapters in another environment

    def missing(self, name):
        raise kernelspec.NoSuchKernel(name)

    monkeypatch.setattr(kernelspec.KernelSpecManager, "get_kernel_spec", missing)
    assert kernel_for_this_python() == "python3"


def test_index_leads_with_one_line_per_claim_and_lists_every_verdict(tmp_path, monkeypatch):
    from studylib import decisions
    from studylib.claims import decide_parts, judge_at_least

    # synthetic records have no registered declaration; the page's layout is what is tested here
    monkeypatch.setattr(decisions, "apply_registration", lambda data, path=None: data)
    from studylib.workbook.render import write_index

    lat = judge_at_least("C7", "latency reduction", (3.0, 2.5, 3.5, 10), 10.0, ">10x", "cpu", 7)
    q = judge_at_least("C7", "quality", (1.0, 1.0, 1.0, 10), 0.99, ">99%", "cpu", 7)
    save_chapter(7, "Combined", decide_parts("C7", "all at once", [q, lat], "", "cpu", 7), {}, tmp_path, declarations=None,
                 display=False)
    save_chapter(1, "Baseline", [judge_at_least("C1", "R^2", (0.999, 0.998, 0.9995, 10), 0.99, ">=0.99", "cpu", 1)],
                 {}, tmp_path, display=False, declarations=None)
    index = {"profile": "cpu", "updated": "now", "chapters": {"1": {"status": "ok", "seconds": 12.0}}}
    page = write_index(tmp_path, index, {}).read_text()
    assert page.index("The verdicts") < page.index("<h2>The chapters</h2>") < page.index("Every verdict")
    assert "C7: does not hold" in page and "C1: holds" in page and "12 s" in page
    assert "C7: holds" not in page  # the quality part gets no badge of its own
