"""Prompt lookup decoding (Saxena 2023): draft tokens copied from earlier text, no draft model.

Input-grounded outputs (summaries, code edits, answers quoting a document) repeat spans of the
prompt. We look for the longest suffix n-gram of the text so far (n = ``ngram`` down to 1) that
occurred earlier in the prompt or the generated text, and propose the up to ``gamma`` tokens that
followed its most recent earlier occurrence. The target verifies them in one forward with the shared
``verify`` step, so greedy output equals AR decoding, and sampling stays exact: a copied proposal is
a draft distribution q = one-hot(token), for which rejection sampling with the residual
norm(max(0, p - q)) is still exact.

A step with no match degenerates to one AR step (a forward of one token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from studylib.decoding.drafts import DraftSession
from studylib.decoding.result import GenerationResult
from studylib.decoding.speculative import speculate
from studylib.errors import StudylibError
from studylib.models import LlamaModel
from studylib.sampling import SamplingParams


@dataclass
class NgramIndex:
    """For n = 1..max_n: the n-gram ending just before position i -> i, for its latest occurrence
    that has a following token. Updated incrementally, so a lookup is a dict access."""

    max_n: int
    table: list[dict[tuple[int, ...], int]] = field(default_factory=list)
    size: int = 0  # tokens of the sequence indexed so far

    def __post_init__(self) -> None:
        self.table = [{} for _ in range(self.max_n + 1)]

    def extend(self, seq: Sequence[int]) -> None:
        """Index seq[size:]; the n-gram seq[i-n:i] gains continuation position i."""
        for i in range(max(self.size, 1), len(seq)):
            for n in range(1, min(self.max_n, i) + 1):
                self.table[n][tuple(seq[i - n : i])] = i
        self.size = len(seq)

    def lookup(self, seq: Sequence[int], gamma: int) -> list[int]:
        """Up to ``gamma`` tokens following the longest earlier match of a suffix of ``seq``."""
        for n in range(min(self.max_n, len(seq) - 1), 0, -1):
            # The table only holds n-grams that ended before the last token, so the suffix itself
            # (which has no continuation yet) never matches itself.
            start = self.table[n].get(tuple(seq[len(seq) - n :]))
            if start is not None:
                return list(seq[start : start + gamma])
        return []


@dataclass
class _LookupSession(DraftSession):
    index: NgramIndex = None

    def propose(self, seq, gamma, sampling, gen):
        self.index.extend(seq)
        return self.index.lookup(seq, gamma), None


@torch.inference_mode()
def generate(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    tokenizer: object | None = None,
    gamma: int = 8,
    ngram: int = 3,
    prefix_store=None,
) -> GenerationResult:
    """Prompt lookup decoding: propose up to ``gamma`` copied tokens, matching suffix n-grams of length
    ``ngram`` down to 1."""
    if gamma == "adaptive" or isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise StudylibError(f"prompt-lookup takes an integer --gamma >= 1 (no draft model to tune against), "
                            f"got {gamma!r}.")
    if not isinstance(ngram, int) or ngram < 1:
        raise StudylibError(f"--ngram must be an integer >= 1, got {ngram!r}.")
    res = speculate(
        model, prompt_ids, max_new_tokens, sampling, tokenizer,
        lambda cache, cap: _LookupSession(index=NgramIndex(ngram)), gamma, "prompt-lookup",
        prefix_store=prefix_store,
    )
    res.extra.update(gamma=gamma, ngram=ngram)
    return res
