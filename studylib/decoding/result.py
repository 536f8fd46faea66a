"""The one result record every decoder returns (Spec-Bench style)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated tokens only (EOS included when it ended the output)
    text: str
    new_tokens: int
    target_forwards: int  # forward passes of the target model, prefill included
    steps: int  # decoding steps after prefill (one verify = one step)
    accepted_lengths: list[int]  # tokens committed per step
    ttft_s: float
    wall_s: float
    prompt_tokens: int = 0
    method: str = "ar"
    stop_reason: str = "length"  # "eos" or "length"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_step(self) -> float:
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def compression(self) -> float:
        """New tokens per target forward after prefill: ``new_tokens / (target_forwards - 1)``.

        The prefill forward is left out of the denominator, but the token it yields is counted in the
        numerator, so autoregressive decoding of n tokens (n forwards: the prefill, then n - 1 decode
        steps) gives n / (n - 1), e.g. 64/63 = 1.016, not 1.0; it tends to 1.0 for long outputs, and a
        single token (one forward) gives 1.0 (the denominator is clamped to 1). Compare methods at the
        same output length, or use ``tokens_per_step`` (exactly 1.0 for AR once it takes a decode step)."""
        return self.new_tokens / max(self.target_forwards - 1, 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
