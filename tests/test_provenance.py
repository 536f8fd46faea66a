"""Provenance: full commit plus a separate dirty flag, the pinned environment's hash, the CPU's ISA."""

from __future__ import annotations

import hashlib
import importlib
import re
import subprocess

import pytest

from studylib.bench import provenance as provenance_fn
from studylib.workbook.chapter import provenance_rows

# studylib.bench re-exports the function provenance() under the module's name; this is the module.
provenance_module = importlib.import_module("studylib.bench.provenance")

CPUINFO = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\nbogomips\t: 1\n"


@pytest.mark.parametrize("flags, label, present", [
    ("avx avx2 fma", "avx2", ["avx2"]),
    ("avx2 avx512f avx512bw", "avx512", ["avx2", "avx512f"]),
    ("avx2 avx512f avx512_vnni avx512_bf16", "avx512_bf16", ["avx2", "avx512f", "avx512_bf16", "avx512_vnni"]),
    ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", "amx_bf16",
     ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]),
    ("sse4_2", "baseline", []),
])
def test_cpu_isa_label_and_flags(flags, label, present):
    assert provenance_module.cpu_isa(CPUINFO.format(flags=flags)) == {"label": label, "flags": present}


def test_cpu_isa_without_a_flags_line():
    assert provenance_module.cpu_isa("Features: fp asimd\n") == {"label": "baseline", "flags": []}


def test_constraints_sha256(tmp_path):
    f = tmp_path / "constraints.txt"
    f.write_text("torch==2.13.0\n")
    assert provenance_module.constraints_sha256(f) == hashlib.sha256(b"torch==2.13.0\n").hexdigest()
    assert provenance_module.constraints_sha256(tmp_path / "absent.txt") is None


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_git_state_full_commit_and_separate_dirty_flag(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("1")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "ch01.json").write_text("{}")
    _git(tmp_path, "add", "a.txt", "reports/ch01.json")
    _git(tmp_path, "commit", "-q", "-m", "x")
    monkeypatch.setattr(provenance_module, "REPO_ROOT", tmp_path)
    commit, dirty = provenance_module.git_state()
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and dirty is False
    (tmp_path / "new.txt").write_text("untracked files do not make the tree dirty")
    assert provenance_module.git_state() == (commit, False)
    # the study's outputs, rewritten chapter by chapter during a run, do not make the code dirty
    (tmp_path / "reports" / "ch01.json").write_text('{"new": 1}')
    assert provenance_module.git_state() == (commit, False)
    (tmp_path / "a.txt").write_text("2")
    assert provenance_module.git_state() == (commit, True)
    monkeypatch.setattr(provenance_module, "REPO_ROOT", tmp_path / "not-a-repo")
    assert provenance_module.git_state() == ("unknown", False)


def test_provenance_record(monkeypatch):
    monkeypatch.setattr(provenance_module, "git_state", lambda: ("a" * 40, True))
    prov = provenance_fn(model="m")
    assert prov["git_commit"] == "a" * 40 and prov["git_dirty"] is True
    assert prov["constraints_sha256"] == provenance_module.constraints_sha256()
    assert re.fullmatch(r"[0-9a-f]{64}", prov["constraints_sha256"])  # the repo commits constraints.txt
    assert prov["isa"]["label"] in ("amx_bf16", "avx512_bf16", "avx512", "avx2", "baseline")
    assert prov["params"] == {"model": "m"}


@pytest.mark.parametrize("prov, label", [
    ({"git_commit": "0123456789abcdef" * 2 + "01234567", "git_dirty": False}, "0123456789ab"),
    ({"git_commit": "0123456789abcdef" * 2 + "01234567", "git_dirty": True}, "0123456789ab (dirty tree)"),
    ({"git_commit": "0123456789abcdef0123+dirty"}, "0123456789ab (dirty tree)"),  # the old format
    ({"git_commit": "0123456789abcdef0123"}, "0123456789ab"),
    ({}, "unknown"),
])
def test_commit_label_reads_new_and_old_records(prov, label):
    assert provenance_module.commit_label(prov) == label


def test_provenance_rows_show_short_commit_dirty_mark_and_isa():
    rows = dict(provenance_rows({"git_commit": "f" * 40, "git_dirty": True, "cpu": "C", "cpu_count": 2,
                                 "isa": {"label": "avx2", "flags": ["avx2"]}}))
    assert rows["git commit"] == "f" * 12 + " (dirty tree)"
    assert "ISA avx2" in rows["hardware"]
