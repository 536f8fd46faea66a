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
        """New tokens per target forward after prefill (1.0 for autoregressive decoding)."""
        return self.new_tokens / max(self.target_forwards - 1, 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
