"""Decoders, chosen by name. Each module exposes ``generate(model, prompt_ids, max_new_tokens,
sampling, tokenizer=None, **options) -> GenerationResult``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from studylib.decoding.result import GenerationResult
from studylib.errors import StudylibError
from studylib.sampling import SamplingParams

# method name -> module under studylib.decoding
METHODS: dict[str, str] = {
    "ar": "ar",
    "speculative": "speculative",
    "prompt-lookup": "prompt_lookup",
    "jacobi": "jacobi",
    "lookahead": "lookahead",
}


def get_decoder(method: str) -> Callable[..., GenerationResult]:
    if method not in METHODS:
        raise StudylibError(f"unknown method {method!r}; choose one of {sorted(METHODS)}.")
    try:
        module = importlib.import_module(f"studylib.decoding.{METHODS[method]}")
    except ModuleNotFoundError as exc:
        raise StudylibError(f"method {method!r} is not implemented in this checkout ({exc}).") from exc
    return module.generate


def decode(
    method: str, model, prompt_ids: Sequence[int], max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(), tokenizer=None, **options,
) -> GenerationResult:
    result = get_decoder(method)(model, prompt_ids, max_new_tokens, sampling, tokenizer=tokenizer, **options)
    result.method = method
    return result


__all__ = ["GenerationResult", "SamplingParams", "METHODS", "decode", "get_decoder"]
