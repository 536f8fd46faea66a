"""Is serving lossless? Compare each request's greedy tokens with the single-request AR decoder.

Batched arithmetic is not bit-identical to single-request arithmetic (see ``invariant``), so in the
default mode a greedy token can flip at a near-tie and the rest of that request diverges. We count
such requests (the divergence rate) and where they first differ; under ``batch_invariant`` the rate
must be exactly zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from studylib.decoding import ar
from studylib.serving.invariant import batch_invariant
from studylib.serving.request import Request


def ar_references(model, requests: Sequence[Request], tokenizer=None, invariant: bool = False) -> list[list[int]]:
    """Greedy tokens of each request decoded alone by ``studylib.decoding.ar``."""
    ctx = batch_invariant(model.device) if invariant else contextlib.nullcontext()
    with ctx:
        return [ar.generate(model, r.prompt_ids, r.max_new_tokens, tokenizer=tokenizer).token_ids for r in requests]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(outputs: Sequence[Sequence[int]], references: Sequence[Sequence[int]]) -> dict:
    """How many requests differ from their reference, and where (token index) each first differs."""
    firsts = [first_difference(o, r) for o, r in zip(outputs, references, strict=True)]
    diverged = [f for f in firsts if f is not None]
    n = len(firsts)
    return {
        "requests": n, "identical": n - len(diverged),
        "divergence_rate": len(diverged) / n if n else 0.0,
        "first_divergence": diverged,
        "tokens_compared": sum(len(r) for r in references),
    }
