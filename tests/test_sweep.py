"""``studylib sweep``: the spec's checks, the dry run without Ray, a two-cell sweep on a local Ray cluster,
a failing cell that stays local, and ``--resume`` that executes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from studylib.cli import main
from studylib.errors import StudylibError
from studylib.sweep import run as sweep_run
from studylib.sweep.spec import cell_name, load_spec, problems
from tests.test_workbook import make_notebook


@pytest.fixture
def toy(tmp_path):
    nbs = tmp_path / "notebooks"
    (nbs / "params").mkdir(parents=True)
    (nbs / "params" / "smoke.yaml").write_text("common:\n  model: tiny-random\nch01:\n  r2: 0.999\n")
    make_notebook(nbs, 1)
    return nbs, tmp_path


def _spec(tmp_path, **raw):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "toy", "profile": "smoke", "chapters": [1], **raw}))
    return path


def test_spec_problems_are_one_line_each():
    bad = problems({"name": "a b", "profile": "cpu", "chapters": [], "gird": {"x": [1]},
                    "resources": {"num_cpu": 2}, "retries": -1, "grid": {"model": "m1"}})
    assert len(bad) == 6 and all("\n" not in b for b in bad)
    text = "\n".join(bad)
    assert "'gird'" in text and "did you mean 'grid'" in text and "num_cpu" in text and "retries" in text
    assert "grid.model must be a non-empty list" in text and "chapters must be" in text


def test_cells_expand_a_product_and_a_list_with_stable_names(tmp_path):
    spec = load_spec(_spec(tmp_path, grid={"r2": [0.5, 0.999], "model": ["a"]}, cells=[{"r2": 0.7}],
                           params={"model": "base"}))
    cells = spec.expand()
    assert [c.params for c in cells] == [{"model": "a", "r2": 0.5}, {"model": "a", "r2": 0.999},
                                         {"model": "base", "r2": 0.7}]
    assert cells[0].name == cell_name(1, {"r2": 0.5, "model": "a"}) == "ch01-model=a-r2=0.5"
    assert cells[2].name == "ch01-r2=0.7"  # named by what varies, not by the shared params


def test_a_bad_spec_exits_2_with_one_line_per_problem(tmp_path, capsys):
    path = _spec(tmp_path, grid={"r2": 0.5}, retriez=2)
    assert main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0].startswith("studylib: error:") and len(lines) == 2 and "Traceback" not in err


@pytest.mark.notebook
def test_dry_run_checks_every_cell_and_never_starts_ray(toy, monkeypatch):
    nbs, tmp_path = toy
    monkeypatch.setattr(sweep_run, "init_ray", lambda *a, **k: pytest.fail("the dry run started Ray"))
    good = load_spec(_spec(tmp_path, grid={"r2": [0.5, 0.9]}))
    assert sweep_run.check(good, nbs) == []
    wrong = load_spec(_spec(tmp_path, grid={"r2": ["high", 0.9], "colour": [1]}))
    bad = sweep_run.check(wrong, nbs)
    assert any("r2 = 'high' is a str" in b for b in bad) and any("colour" in b for b in bad)
    assert all(b.startswith("cell ch01-") for b in bad)


@pytest.mark.notebook
def test_a_two_cell_sweep_on_local_ray_resumes_and_keeps_failures_local(toy, monkeypatch):
    nbs, tmp_path = toy
    out = tmp_path / "out"
    spec = load_spec(_spec(tmp_path, grid={"r2": [0.5, 0.999]}, resources={"num_cpus": 1}))
    first = sweep_run.run_sweep(spec, notebooks_dir=nbs, out_dir=out, progress=False, num_cpus=2)
    assert [c["status"] for c in first["cells"]] == ["ok", "ok"]
    for c in first["cells"]:
        data = json.loads((out / c["cell"] / "ch01.json").read_text())
        assert data["measurements"]["r2"] == c["overrides"]["r2"]
        rec = json.loads((out / c["cell"] / "cell.json").read_text())
        assert rec["where"]["host"] and rec["where"]["isa"] and rec["key"]["params"]["r2"] == c["overrides"]["r2"]
        assert (out / c["cell"] / "ch01.ipynb").exists() and (out / c["cell"] / "ch01.html").exists()
    # --resume: every cell is up to date, so nothing runs and Ray is not even started
    monkeypatch.setattr(sweep_run, "init_ray", lambda *a, **k: pytest.fail("resume executed a cell"))
    again = sweep_run.run_sweep(spec, notebooks_dir=nbs, out_dir=out, progress=False, resume=True)
    assert [c["status"] for c in again["cells"]] == ["up to date", "up to date"]
    monkeypatch.undo()
    # one cell made to fail: retried, recorded failed with its error; the other keeps its results
    failing = load_spec(_spec(tmp_path, grid={"r2": [0.999], "fail": [False, True]}, retries=1))
    res = sweep_run.run_sweep(failing, notebooks_dir=nbs, out_dir=out, progress=False, num_cpus=2)
    by = {c["overrides"]["fail"]: c for c in res["cells"]}
    assert by[False]["status"] == "ok" and (out / by[False]["cell"] / "ch01.json").exists()
    assert by[True]["status"] == "failed" and by[True]["attempts"] == 2 and "boom" in by[True]["error"]
    assert not (out / by[True]["cell"] / "ch01.json").exists()
    assert json.loads((out / "sweep.json").read_text())["cells"][1]["status"] == "failed"


def test_unknown_address_is_refused():
    with pytest.raises(StudylibError, match="--address"):
        sweep_run.init_ray("tcp://nowhere")


@pytest.mark.notebook
def test_the_gpu_sweep_passes_its_dry_run_here(capsys):
    """benchmarks/gpu_sweep.yaml is the same grid for a GPU cluster; CI checks it without a GPU."""
    from studylib.workbook import paths

    assert main(["sweep", str(paths.repo_root() / "benchmarks" / "gpu_sweep.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 cells pass the dry run" in out and "random_llama3-8b" in out


def test_the_sweep_page_puts_cells_side_by_side_and_the_front_page_links_it(tmp_path):
    """From saved cell results only: the grid, each cell's verdict with its number and link, a figure per
    quantity measured in every cell, and a front-page entry."""
    from studylib.claims import judge_at_least
    from studylib.sweep.page import quantities, sweeps_block, write_sweep_page
    from studylib.workbook import save_chapter

    out = tmp_path / "reports" / "sweeps" / "toy"
    cells = []
    for r2 in (0.95, 0.999):
        name = f"ch01-r2={r2}"
        v = judge_at_least("C1", "R^2", (r2, r2 - 1e-3, r2 + 1e-3, 10), 0.99, ">= 0.99", "toy", 1)
        save_chapter(chapter=1, title="Toy", verdicts=[v], measurements={}, declarations=None, out_dir=out / name,
                     params={})
        (out / name / "ch01.html").write_text("<p>cell page</p>")
        cells.append({"cell": name, "chapter": 1, "overrides": {"r2": r2}, "status": "ok", "attempts": 1,
                      "where": {"host": "h", "device": "cpu", "isa": "avx2"}})
    cells.append({"cell": "ch01-r2=bad", "chapter": 1, "overrides": {"r2": "bad"}, "status": "failed", "attempts": 2,
                  "error": "ValueError: boom", "where": None})
    # a failed rerun of a cell that once succeeded: its old results are not this sweep's
    v = judge_at_least("C1", "R^2", (0.5, 0.49, 0.51, 10), 0.99, ">= 0.99", "toy", 1)
    save_chapter(chapter=1, title="Toy", verdicts=[v], measurements={}, declarations=None, out_dir=out / "ch01-r2=bad",
                 params={})
    (out / "ch01-r2=bad" / "ch01.failed.html").write_text("<p>failed</p>")
    (out / "sweep.json").write_text(json.dumps({"name": "toy", "profile": "smoke", "chapters": [1],
                                                "grid": {"r2": [0.95, 0.999, "bad"]}, "cells": cells}))
    # chapter 1 cells also carry their step cost against rows: the regime figure is drawn from it
    for r2, slope in ((0.95, 0.9), (0.999, 0.2)):
        data = json.loads((out / f"ch01-r2={r2}" / "ch01.json").read_text())
        data["measurements"]["step_vs_rows"] = [{"engine": "q4_1", "rows": k, "v": 1 + slope * (k - 1),
                                                  "v_low": 1 + 0.9 * slope * (k - 1), "v_high": 1 + 1.1 * slope * (k - 1)}
                                                 for k in (1, 2, 4, 8)]
        data["measurements"]["bandwidth_fraction"] = {"value": 0.6 if r2 == 0.95 else 1.1, "ci_low": 0.5,
                                                      "ci_high": 1.2, "n": 5}
        (out / f"ch01-r2={r2}" / "ch01.json").write_text(json.dumps(data))
    q = quantities(json.loads((out / "sweep.json").read_text()), out)
    assert len(q) == 1 and [p[1] for p in next(iter(q.values()))] == [0.95, 0.999]
    text = write_sweep_page(out).read_text()
    assert "ch01-r2=0.95/ch01.html" in text and "boom" in text and "quantity_00.png" in text
    assert "ch01-r2=bad/ch01.failed.html" in text and "0.5 " not in text.split("ch01-r2=bad")[-1][:300]
    assert (out / "quantity_00.png").exists()
    assert "regime.png" in text and (out / "regime.png").exists()
    figures = json.loads((out / "figures.json").read_text())  # the book's figure check read every figure
    assert figures == {"figures": 2, "defects": []}, figures
    assert "sweeps/toy/index.html" in sweeps_block(tmp_path / "reports")
    # ...and the regime table: v(8) per cell with its CI, v(16) missing where the cell did not step 16 rows
    from studylib.sweep.page import regime_table

    table = regime_table(json.loads((out / "sweep.json").read_text()), out)
    assert [r["cell"] for r in table] == ["r2=0.95", "r2=0.999"]
    assert table[0]["v(8)"].startswith("7.3") and table[1]["v(8)"].startswith("2.4") and table[0]["v(16)"] == "-"
    assert "The regime, per cell" in text
    # a fraction of bandwidth above 1 is named as the probe's shortfall, for that cell only
    assert "A fraction above 1</b> (r2=0.999)" in text and "_fraction" not in text
    from studylib.sweep.page import regime_text, step_cost_frame

    sentence = regime_text(step_cost_frame(json.loads((out / "sweep.json").read_text()), out))
    assert sentence == "Medians per cell, q4_1: v(4) from 1.6 to 3.7 and v(8) from 2.4 to 7.3 across the 2 cells."
    assert sentence in text


def test_names_never_collide_and_equal_cells_run_once(tmp_path):
    long = "/x/" + "a" * 60
    spec = load_spec(_spec(tmp_path, grid={"model": [long + "1", long + "2"]}, cells=[{"model": long + "1"}]))
    cells = spec.expand()
    assert len(cells) == 2 and len({c.name for c in cells}) == 2  # shortened names got their params' hash
    assert problems({"name": "x", "profile": "cpu", "chapters": [1], "grid": {1: [2]}, "concurrency": 0})[0:2] == [
        "the spec: grid keys must be parameter names (text), got ['1']",
        "the spec: concurrency must be an integer >= 1 (cells at once), got 0"]


def test_a_cell_no_node_can_hold_is_refused_not_waited_for():
    class FakeRay:
        @staticmethod
        def cluster_resources():
            return {"CPU": 2.0, "memory": 8 * 2**30}

    assert sweep_run._unschedulable(FakeRay, {"num_cpus": 4.0, "num_gpus": 1.0}) == {"num_cpus": 4.0, "num_gpus": 1.0}
    assert sweep_run._unschedulable(FakeRay, {"num_cpus": 2.0}) == {}


def test_the_resume_key_names_uncommitted_code_and_the_machine():
    from studylib.sweep.spec import Cell

    a = sweep_run.cell_key(Cell(1, {"r2": 0.5}), {"r2": 0.5, "model": "tiny-random"}, "abc", None)
    b = sweep_run.cell_key(Cell(1, {"r2": 0.5}), {"r2": 0.5, "model": "tiny-random"}, "abc", "f00d")
    assert a != b and a["cpu"] and a["isa"]


SWEEP_FIGURE_LOGS = sorted((Path(__file__).parents[1] / "reports").glob("*/sweeps/*/figures.json"))


def test_every_committed_sweep_has_its_figure_log():
    sweeps = sorted((Path(__file__).parents[1] / "reports").glob("*/sweeps/*/sweep.json"))
    assert sweeps and [s.with_name("figures.json") for s in sweeps] == SWEEP_FIGURE_LOGS


@pytest.mark.parametrize("log", SWEEP_FIGURE_LOGS, ids=lambda p: p.parent.name)
def test_committed_sweep_figures_were_checked_and_are_clean(log):
    got = json.loads(log.read_text())
    assert got["figures"] >= 1 and got["defects"] == [], "; ".join(got["defects"])


def test_a_wide_grid_keeps_its_figure_to_a_page_and_its_labels_apart(tmp_path):
    from studylib.sweep.page import _figure

    pts = [(f"model=random:a-rather-long-model-name-{i}, threads=2", 1 + i / 10, 0.9 + i / 10, 1.2 + i / 10, 1.0)
           for i in range(20)]
    defects: list[str] = []
    _figure("C1 ch01: a quantity", pts, tmp_path / "q.png", defects)
    assert defects == [] and (tmp_path / "q.png").exists()
    from PIL import Image

    assert Image.open(tmp_path / "q.png").size[0] <= 12 * 110 + 50  # at most 12 inches at 110 dpi


def test_the_sweep_answers_its_question_in_its_first_sentence_from_its_cells():
    import pandas as pd

    from studylib.sweep.page import _params_words, answer_text

    frame = pd.DataFrame([
        {"cell": "small", "engine": "int8", "rows": 1, "v": 1.0}, {"cell": "small", "engine": "int8", "rows": 16, "v": 2.6},
        {"cell": "big", "engine": "int8", "rows": 1, "v": 1.0}, {"cell": "big", "engine": "int8", "rows": 16, "v": 3.2}])
    text = answer_text(frame)
    assert text.startswith("The answer, from the cells below: with int8, a step of 16 rows costs 2.6 to 3.2")
    assert "no cell of the grid behaves as the source assumes" in text
    frame.loc[frame.v == 2.6, "v"] = 1.2
    assert "near 1 (a memory-bound step) on small" in answer_text(frame)
    assert _params_words({"lengths": [8, 16], "repeats": 5}) == "lengths = 8, 16; repeats = 5"


def test_the_sweep_page_says_why_a_cell_disagrees_with_the_main_run(tmp_path):
    """A cell whose decision differs from the study's own chapter is named with the verdicts, read as the
    cells table reads them (an unregistered hold reads inconclusive there, so it does here), and the causes
    first: the weights, the deciding engine, the commit, then the names of the settings that differ."""
    from studylib.sweep.page import disagreements

    def chapter(path, verdict, model, commit, engine, threads=2):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"verdicts": [{"id": "C2", "role": "decision", "verdict": verdict,
                                                  "metric": "m", "chapter": 1}],
                                    "params": {"model": model, "threads": threads},
                                    "measurements": {"decisive_engine": engine},
                                    "provenance": {"git_commit": commit}}))

    reports = tmp_path / "reports" / "cpu"
    sweep = reports / "sweeps" / "s"
    chapter(reports / "ch01.json", "does not hold", "smollm2-135m", "a" * 40, "gguf")
    chapter(sweep / "ch01-model=big" / "ch01.json", "holds", "random:big", "b" * 40, "q4_1", threads=4)
    chapter(sweep / "ch01-model=same" / "ch01.json", "does not hold", "random:same", "b" * 40, "q4_1")
    summary = {"profile": "cpu", "grid": {"model": ["big", "same"]}, "params": {},
               "cells": [{"cell": f"ch01-model={m}", "chapter": 1, "overrides": {"model": m}, "status": "ok"}
                         for m in ("big", "same")]}
    got = disagreements(summary, sweep)
    # the cell's hold predates any registration, so the table shows it inconclusive: the sentence agrees
    assert len(got) == 1 and "C2: inconclusive here, does not hold in the main run" in got[0], got
    assert "random weights at big's shapes" in got[0] and "smollm2-135m's trained weights" in got[0]
    assert "the deciding engine is q4_1 in the cell and gguf in the main run" in got[0]
    assert "bbbbbbbbbbbb" in got[0] and "aaaaaaaaaaaa" in got[0] and "1 setting differs (threads;" in got[0]


def test_an_exploratory_cell_says_why_its_verdict_is_not_its_parts():
    """A cell measured before the study's declarations changed shows "3/3 parts hold" beside "inconclusive";
    the sweep page carries the rules' own reason after the number, and says nothing for a confirmatory one."""
    import dataclasses

    from studylib.claims import Verdict
    from studylib.decisions import exploratory
    from studylib.sweep.page import _why_exploratory

    row = Verdict("C2", "", "m", "3/3 parts hold", None, "", "holds", "every part holds", 1, role="decision")
    assert _why_exploratory(row) == ""
    marked = exploratory(row, "its declaration changed in commit abc, after the result's commit def")
    text = _why_exploratory(marked)
    assert marked.verdict != "holds" and "its declaration changed in commit abc" in text and "it read 'holds'" in text
    assert _why_exploratory(dataclasses.replace(marked, conditions="")) == " (exploratory)"
    # an exploratory row whose conditions carry no reason never prints its conditions as the reason
    assert _why_exploratory(dataclasses.replace(marked, conditions="smollm2, 2 threads")) == " (exploratory)"
