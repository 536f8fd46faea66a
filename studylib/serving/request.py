"""A serving request and its lifecycle: waiting -> running -> finished, or aborted at any point.

A request is preempted by *recompute*: its KV blocks are released, ``num_computed`` drops to 0 and it
waits again at the front of the queue; when readmitted, its prompt plus the tokens it has generated so
far are prefilled again and decoding resumes where it stopped (vLLM's default preemption mode).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from studylib.errors import StudylibError
from studylib.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"

    @property
    def done(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.ABORTED)


@dataclass(eq=False)
class Request:
    id: str
    prompt_ids: list[int]
    max_new_tokens: int
    arrival_s: float = 0.0  # seconds after the benchmark's start; latencies are measured from here
    eos_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False  # vLLM's benchmark option: always produce max_new_tokens tokens
    # This request's own sampling (None: the engine's), as vLLM's requests carry theirs. Requests with equal
    # settings share one generator, so a sampled request's draws depend on its batch-mates.
    sampling: SamplingParams | None = None

    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens of ``all_ids`` whose K/V sit in the pool
    block_table: list[int] = field(default_factory=list)
    prefix_hit_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    num_preemptions: int = 0
    stop_reason: str | None = None  # "eos" | "length" | "abort" | "rejected"
    error: str | None = None
    # Engine-clock times (seconds since the benchmark's start).
    first_scheduled_s: float | None = None
    token_times: list[float] = field(default_factory=list)  # when each output token was produced
    finished_s: float | None = None
    # Opaque handle of the prefix cache (the matched node a running request keeps locked).
    prefix_handle: object | None = None
    admitted_once: bool = False

    def __post_init__(self) -> None:
        self.id = str(self.id)
        self.prompt_ids = [int(t) for t in self.prompt_ids]
        if not self.prompt_ids:
            raise StudylibError(f"request {self.id!r} has an empty prompt; give at least one token.")
        if int(self.max_new_tokens) < 1:
            raise StudylibError(f"request {self.id!r}: max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        self.max_new_tokens = int(self.max_new_tokens)
        if self.arrival_s < 0:
            raise StudylibError(f"request {self.id!r}: arrival_s must be >= 0, got {self.arrival_s}.")
        self.eos_ids = frozenset(int(t) for t in self.eos_ids)

    # ---- token bookkeeping ------------------------------------------------------------------------
    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Known tokens whose K/V still have to be computed (1 while decoding)."""
        return self.num_tokens - self.num_computed

    @property
    def max_total_tokens(self) -> int:
        """The most KV this request can ever hold: the prompt plus every output token but the last,
        whose K/V is never needed (it is sampled, not fed back)."""
        return len(self.prompt_ids) + self.max_new_tokens - 1

    @property
    def in_prefill(self) -> bool:
        return self.remaining > 1 or not self.output_ids

    def append_token(self, token: int, now: float) -> bool:
        """Record one sampled token; return True when the request is complete."""
        self.output_ids.append(int(token))
        self.token_times.append(now)
        if not self.ignore_eos and int(token) in self.eos_ids:
            self.stop_reason = "eos"
        elif len(self.output_ids) >= self.max_new_tokens:
            self.stop_reason = "length"
        return self.stop_reason is not None

    # ---- metrics ----------------------------------------------------------------------------------
    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.arrival_s if self.token_times else None

    @property
    def e2el_s(self) -> float | None:
        return self.finished_s - self.arrival_s if self.finished_s is not None and self.token_times else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM's TPOT); None for one-token outputs."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive output tokens."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    def record(self) -> dict:
        """The per-request line of ``bench-serve --records``."""
        return {
            "id": self.id, "status": self.status.value, "token_ids": list(self.output_ids),
            "prompt_tokens": len(self.prompt_ids), "output_tokens": len(self.output_ids),
            "arrival_s": self.arrival_s, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2el_s": self.e2el_s,
            "prefix_hit_tokens": self.prefix_hit_tokens, "preemptions": self.num_preemptions,
            "stop_reason": self.stop_reason, "error": self.error,
        }
