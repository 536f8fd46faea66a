"""One ``SamplingParams`` for the whole package, and the logits -> distribution -> token path.

Every decoder (and the speculative verifier) turns logits into a distribution with ``probs`` so
that "the target distribution" means one thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from studylib.errors import StudylibError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise StudylibError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}.")
        if self.top_k < 0:
            raise StudylibError(f"top_k must be >= 0 (0 disables it), got {self.top_k}.")
        if not 0 < self.top_p <= 1:
            raise StudylibError(f"top_p must be in (0, 1], got {self.top_p}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        if self.greedy:
            return None
        g = torch.Generator(device=device)
        g.manual_seed(self.seed if self.seed is not None else torch.seed())
        return g


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution over the vocabulary for each row of ``logits`` (..., vocab).

    Greedy gives a one-hot on the argmax, so speculative verification treats both modes alike.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (the top token always stays).
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample_from(p: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of the distribution ``p`` (..., vocab) -> (...)."""
    flat = p.reshape(-1, p.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(p.shape[:-1])


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Next token(s) for ``logits`` (..., vocab) -> (...)."""
    if params.greedy:
        return logits.argmax(-1)
    return sample_from(probs(logits, params), generator)
