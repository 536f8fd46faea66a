"""Pieces every decoder shares: input checks, stopping, and timing."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from studylib.errors import StudylibError
from studylib.models import LlamaModel


def check_lengths(model: LlamaModel, prompt_ids: Sequence[int], max_new_tokens: int, slack: int = 0) -> int:
    """Validate a request and return the KV capacity it needs (prompt + new + ``slack`` draft slots)."""
    if len(prompt_ids) == 0:
        raise StudylibError("the prompt is empty; give at least one token.")
    if max_new_tokens < 1:
        raise StudylibError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    window = model.config.max_position_embeddings
    if len(prompt_ids) + max_new_tokens > window:
        raise StudylibError(
            f"the prompt has {len(prompt_ids)} tokens and max_new_tokens is {max_new_tokens}, which exceeds "
            f"{model.config.name}'s context window of {window}; shorten the prompt or lower --max-new-tokens."
        )
    return min(len(prompt_ids) + max_new_tokens + slack, window + slack)


def eos_set(model: LlamaModel, tokenizer: object | None = None) -> set[int]:
    ids = set(model.config.eos_token_ids)
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def clip_at_stop(tokens: list[int], eos: set[int], budget: int) -> tuple[list[int], bool]:
    """Cut ``tokens`` at the first EOS (kept) or at ``budget``; report whether EOS was hit."""
    for i, t in enumerate(tokens[:budget]):
        if t in eos:
            return tokens[: i + 1], True
    return tokens[:budget], False


class Stopwatch:
    """Wall-clock timing that waits for the GPU, so queued kernels are not mistaken for done."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.t0 = self.now()

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def elapsed(self) -> float:
        return self.now() - self.t0


def as_ids(prompt_ids: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(list(prompt_ids), dtype=torch.long, device=device)[None]
