"""``studylib reproduce`` from a dirty git tree: refused for the committed reports folder unless
--allow-dirty, allowed elsewhere, and every page made from a dirty tree says so."""

from __future__ import annotations

import json

import nbformat
import pytest

from studylib.cli import main
from studylib.errors import StudylibError
from studylib.workbook import paths, runner
from studylib.workbook.render import render_html, write_index
from studylib.workbook.runner import OK, ChapterRun, reproduce


@pytest.fixture
def book(tmp_path, monkeypatch):
    """A throwaway checkout: notebooks/ with one chapter, and its reports/ as the committed folder."""
    root = tmp_path / "repo"
    nbs = root / "notebooks"
    (nbs / "params").mkdir(parents=True)
    (nbs / "params" / "cpu.yaml").write_text("ch01:\n  x: 1\n")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("profile = 'cpu'\nout_dir = '.'\nx = 0")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(nbs / "01_toy.ipynb"))
    monkeypatch.setattr(paths, "repo_root", lambda: root)
    ran = []

    def fake_run_chapter(notebook, chapter, params, out_dir, kernel_name, cell_timeout=None, dirty=False):
        ran.append({"chapter": chapter, "out": out_dir, "dirty": dirty})
        return ChapterRun(chapter, notebook.name, OK, 0.1, None, {"x": params["x"]}, "now", dirty)

    monkeypatch.setattr(runner, "run_chapter", fake_run_chapter)
    return root, nbs, ran


def dirty(monkeypatch, value: bool):
    monkeypatch.setattr(runner, "tree_is_dirty", lambda: value)


def test_committed_reports_folder():
    root = paths.repo_root()
    assert runner.committed_reports(root / "reports" / "cpu")
    assert runner.committed_reports(root / "reports" / "gpu" / "sub")
    assert not runner.committed_reports(root / "reports" / "smoke")  # git-ignored scratch
    assert not runner.committed_reports(root / "reports" / "_tmp_check")
    assert not runner.committed_reports(root / "notebooks")


def test_dirty_tree_refuses_the_committed_reports_folder(book, monkeypatch):
    root, nbs, ran = book
    dirty(monkeypatch, True)
    with pytest.raises(StudylibError, match=r"uncommitted changes.*commit or stash.*--allow-dirty"):
        reproduce(profile="cpu", notebooks_dir=nbs, progress=False)  # default out: reports/cpu
    assert ran == [] and not (root / "reports").exists()  # refused before anything ran or was written


def test_cli_dirty_tree_is_one_line_and_exit_2(book, monkeypatch, capsys):
    _, nbs, ran = book
    dirty(monkeypatch, True)
    code = main(["reproduce", "--profile", "cpu", "--notebooks", str(nbs), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and ran == []
    assert err.startswith("studylib: error:") and err.count("\n") == 1
    assert "commit or stash" in err and "--allow-dirty" in err and "reports/cpu" in err


def test_allow_dirty_proceeds_and_marks_the_pages(book, monkeypatch, capsys):
    root, nbs, ran = book
    dirty(monkeypatch, True)
    code = main(["reproduce", "--profile", "cpu", "--notebooks", str(nbs), "--no-progress", "--allow-dirty"])
    assert code == 0, capsys.readouterr().err
    out = root / "reports" / "cpu"
    assert ran == [{"chapter": 1, "out": out, "dirty": True}]
    assert json.loads((out / "index.json").read_text())["chapters"]["1"]["dirty_tree"] is True
    index = (out / "index.html").read_text()
    assert "Dirty tree:</b> chapter 1." in index and "(dirty tree)</td>" in index


def test_clean_tree_writes_the_committed_folder_unmarked(book, monkeypatch):
    root, nbs, ran = book
    dirty(monkeypatch, False)
    reproduce(profile="cpu", notebooks_dir=nbs, progress=False)
    assert ran[0]["dirty"] is False
    assert "dirty tree" not in (root / "reports" / "cpu" / "index.html").read_text().lower()


def test_dirty_tree_may_write_another_folder(book, monkeypatch, tmp_path):
    _, nbs, ran = book
    dirty(monkeypatch, True)
    out = tmp_path / "elsewhere"
    reproduce(profile="cpu", notebooks_dir=nbs, out_dir=out, progress=False)  # no --allow-dirty needed
    assert ran == [{"chapter": 1, "out": out, "dirty": True}]  # still marked
    assert "Dirty tree:" in (out / "index.html").read_text()


def test_resume_reruns_a_dirty_chapter_once_the_tree_is_clean(book, monkeypatch, tmp_path):
    _, nbs, ran = book
    out = tmp_path / "out"
    monkeypatch.setattr(runner, "up_to_date", lambda *a, **k: True)
    dirty(monkeypatch, True)
    reproduce(profile="cpu", notebooks_dir=nbs, out_dir=out, progress=False)
    assert len(ran) == 1
    reproduce(profile="cpu", notebooks_dir=nbs, out_dir=out, progress=False, resume=True)
    assert len(ran) == 1  # still dirty, still up to date: skipped, and keeps its mark
    assert json.loads((out / "index.json").read_text())["chapters"]["1"]["dirty_tree"] is True
    dirty(monkeypatch, False)
    reproduce(profile="cpu", notebooks_dir=nbs, out_dir=out, progress=False, resume=True)
    assert len(ran) == 2 and ran[-1]["dirty"] is False
    assert "dirty tree" not in (out / "index.html").read_text().lower()


def test_chapter_page_dirty_banner(tmp_path):
    assert "Dirty tree." in render_html(None, dirty=True)
    assert "Dirty tree." in render_html(None, error="boom", dirty=True)
    assert "Dirty tree" not in render_html(None)
    write_index(tmp_path, {"profile": "cpu", "chapters": {"1": {"status": "ok", "dirty_tree": False}}}, {})
    assert "dirty tree" not in (tmp_path / "index.html").read_text().lower()
