"""The converted-model cache is verified by hash and rebuilt when corrupt."""

from __future__ import annotations

import json

from studylib.cache import sha256_file
from studylib.models import hub


def _fake_cache(directory):
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"weights")
    (directory / "config.json").write_text("{}")
    files = {p.name: sha256_file(p) for p in directory.iterdir()}
    (directory / hub.MANIFEST).write_text(json.dumps({"files": files}))


def test_verify_accepts_intact_and_rejects_corrupt(tmp_path):
    d = tmp_path / "m"
    _fake_cache(d)
    assert hub._verify(d)
    (d / "model.safetensors").write_bytes(b"weightz")  # same size, one byte flipped
    assert not hub._verify(d)
    _fake_cache(tmp_path / "n")
    (tmp_path / "n" / "config.json").unlink()
    assert not hub._verify(tmp_path / "n")
    assert not hub._verify(tmp_path / "missing")


def test_corrupt_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))
    built = []

    def fake_convert(dest):
        built.append(dest)
        _fake_cache(dest) if not dest.exists() else None

    monkeypatch.setattr(hub, "_convert", fake_convert)
    d = hub.smollm2_dir()
    assert built == [d] and hub._verify(d)
    assert hub.smollm2_dir() == d and len(built) == 1  # intact: no rebuild
    (d / "model.safetensors").write_bytes(b"garbage")
    import shutil

    def rebuild(dest):
        built.append(dest)
        shutil.rmtree(dest)
        _fake_cache(dest)

    monkeypatch.setattr(hub, "_convert", rebuild)
    assert hub.smollm2_dir() == d and len(built) == 2 and hub._verify(d)
