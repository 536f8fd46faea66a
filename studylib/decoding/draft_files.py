"""Where drafters live on disk and how a decoder loads one: the part of drafting that decoding needs.

Training a drafter (``studylib.drafting``) writes these directories; the decoders (``drafts``, ``eagle``)
only read them. Keeping the paths and the loader here lets training import decoding and never the other
way round."""

from __future__ import annotations

import json
from pathlib import Path

from studylib.cache import cache_dir

SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "drafts"  # heads that ship with the study


def slug(name: str) -> str:
    """A model name as a directory name: its last path part, with anything but [A-Za-z0-9-_.] as "_"."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(name).name or name)


def distilled_dir(target_name: str) -> Path:
    """The exported distilled draft of ``target_name`` (``studylib.drafting.train``)."""
    return cache_dir("drafts", f"{slug(target_name)}-distilled")


def draft_meta(target_name: str) -> dict | None:
    """The distilled draft's metadata and path, or None when none was trained."""
    path = distilled_dir(target_name) / "draft_meta.json"
    return {**json.loads(path.read_text()), "path": str(path.parent)} if path.exists() else None


def shipped_dir(target_name: str, name: str = "eagle") -> Path:
    """A head that ships with the study (``studylib/assets/drafts``)."""
    return SHIPPED / f"{slug(target_name)}-{name}"


def load_draft_weights(path: Path, device, dtype):
    """The runtime model in an exported draft directory (no tokenizer needed, so random targets work)."""
    from transformers import AutoConfig

    from studylib.bench.provenance import record_artifact
    from studylib.models import ModelConfig, _load_weights

    path = Path(record_artifact("draft", path))  # its weights' sha256 goes into provenance
    cfg = ModelConfig.from_hf(AutoConfig.from_pretrained(path), name=f"draft:{path.name}")
    return _load_weights(path, cfg, device, dtype)
