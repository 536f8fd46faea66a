"""The names a model goes by, and where its files are: what ``load_model`` and provenance both read.

A leaf of ``studylib.models`` (it imports no kernel, only the presets and, when asked for a path, the hub), so that
provenance can name a model's files without importing the engine that runs it."""

from __future__ import annotations

from pathlib import Path

from studylib.errors import StudylibError
from studylib.models.presets import RANDOM_PRESETS

DEFAULT_MODEL = "smollm2-135m"
SUPPORTED_ARCHS = {"llama", "mistral", "qwen2"}
ALIASES = {"smollm2": "smollm2-135m", "smollm2-135m-instruct": "smollm2-135m", "default": "smollm2-135m"}
SUPPORTED_TEXT = (
    "smollm2-135m (embedded), tiny-random[:seed], random:<preset> with preset in "
    f"{sorted(RANDOM_PRESETS)}, or a local path / locally cached HF id of a "
    f"{'/'.join(sorted(SUPPORTED_ARCHS))} checkpoint"
)


def model_dir(name: str) -> Path | None:
    """The HF-format directory behind ``name``, or None for random models."""
    name = ALIASES.get(name, name)
    if name == "smollm2-135m":
        from studylib.models.hub import smollm2_dir

        return smollm2_dir()
    if name.startswith(("tiny-random", "random:")):
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise StudylibError(f"{path} has no config.json, so it is not an HF-format checkpoint; "
                                f"supported: {SUPPORTED_TEXT}.")
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception as exc:
        raise StudylibError(f"unknown model {name!r}: not a directory and not in the local HF cache; "
                            f"supported: {SUPPORTED_TEXT}.") from exc
