"""Schedulers with one contract: each step, ``schedule()`` decides ``{request_id: num_tokens}`` and, after
the forward pass, ``update_from_output()`` commits what it produced (vLLM v1's interface).

``num_tokens`` covers every phase: a whole prompt, a chunk of one (chunked prefill), a recompute after
preemption, or 1 for a decode step. Policies:

- ``sequential``: one request at a time, admitted when the previous one ends (the naive baseline).
- ``static``: fixed batches, padded to a rectangle and run to completion before the next batch may
  start (request-level batching, as in FasterTransformer or HF ``generate``). Each row reserves its
  prompt plus ``max_new_tokens`` of KV, so the memory budget also caps the batch size; the batch size is
  ``max_running`` and the padded prefill is one forward (``max_batch_tokens`` does not apply). A batch
  starts with whatever is waiting when the previous one ends (no waiting to fill it up).
- ``continuous``: iteration-level scheduling (Orca): running requests are served first, then waiting
  ones are admitted into the same step while others decode, within the token budget.

Admission order is first come, first served, except with ``cache_aware`` (SGLang's longest-prefix-match
order): the waiting request with the longest cached prefix goes first. That order can starve a request
whose prefix is never cached, so it is bounded: every admission that jumps over a waiting request counts
one bypass against it, and a request bypassed ``max_bypass`` times is admitted next, whatever its hits
(``Scheduler.bypassed`` holds the counts). Preempted requests always go first.

``sequential`` and ``continuous`` run on the paged pool and may use the prefix cache; ``static`` runs
on a dense padded cache (see ``engine.DenseBatchRunner``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from studylib.decoding.prompt_lookup import NgramIndex
from studylib.errors import StudylibError
from studylib.serving.blocks import BlockManager
from studylib.serving.request import Request, RequestStatus

POLICIES = ("sequential", "static", "continuous")


@dataclass
class SchedulerConfig:
    policy: str = "continuous"
    max_batch_tokens: int = 512  # tokens per forward pass (prefill chunks + decodes)
    max_running: int = 32  # requests in flight; the batch size of ``static``
    chunk_size: int | None = None  # longest prefill chunk; None = max_batch_tokens
    prefix_cache: str = "none"  # "radix" | "none"
    cache_aware: bool = False  # admit the waiting request with the longest cached prefix first
    max_bypass: int = 16  # cache_aware: a request jumped over this many times is admitted next (FCFS)
    # Prompt-lookup drafts inside the batch: a greedy decoding request brings up to ``speculate_gamma``
    # tokens copied from its own text (longest suffix n-gram of up to ``speculate_ngram`` tokens) into the
    # step as verification rows beside the other requests' rows; 0 = off.
    speculate_gamma: int = 0
    speculate_ngram: int = 3

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise StudylibError(f"unknown scheduler {self.policy!r}; choose one of {list(POLICIES)}.")
        if self.prefix_cache not in ("radix", "none"):
            raise StudylibError(f"unknown prefix cache {self.prefix_cache!r}; choose radix or none.")
        if self.max_batch_tokens < 1 or self.max_running < 1:
            raise StudylibError("max_batch_tokens and max_running must be >= 1.")
        if isinstance(self.max_bypass, bool) or not isinstance(self.max_bypass, int) or self.max_bypass < 0:
            raise StudylibError(f"max_bypass must be an integer >= 0 (0 = first come, first served), "
                                f"got {self.max_bypass!r}.")
        if self.chunk_size is None:
            self.chunk_size = self.max_batch_tokens
        if not 1 <= self.chunk_size <= self.max_batch_tokens:
            raise StudylibError(f"chunk_size must be in 1..max_batch_tokens ({self.max_batch_tokens}), "
                                f"got {self.chunk_size}.")
        if self.policy == "static" and self.prefix_cache != "none":
            raise StudylibError(
                "the static scheduler runs fixed, padded batches in a dense cache that cannot share KV "
                "blocks; use --prefix-cache none with --scheduler static, or a paged scheduler "
                "(sequential, continuous) with --prefix-cache radix.")
        if self.cache_aware and self.prefix_cache == "none":
            raise StudylibError("cache-aware admission orders by cached prefix length; it needs --prefix-cache radix.")
        for name in ("speculate_gamma", "speculate_ngram"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "speculate_gamma" else 1):
                raise StudylibError(f"{name} must be an integer >= {0 if name == 'speculate_gamma' else 1}, got {v!r}.")
        if self.speculate_gamma and self.policy == "static":
            raise StudylibError("speculation inside the batch needs a paged scheduler (continuous or sequential); "
                                "the static batch is a padded rectangle that cannot grow rows per request.")
        if self.policy == "sequential":
            self.max_running = 1

    @property
    def paged(self) -> bool:
        return self.policy != "static"


@dataclass
class SchedulerOutput:
    num_tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens to run this step
    preempted: list[str] = field(default_factory=list)
    new_batch: list[str] | None = None  # static: a fresh batch's row order (its prefill step)
    drafts: dict[str, list[int]] = field(default_factory=dict)  # request id -> tokens it verifies this step

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens.values())

    def __bool__(self) -> bool:
        return bool(self.num_tokens)


def dense_reserved(reqs: list[Request]) -> int:
    """KV slots a padded static batch reserves: every row as long as the longest prompt plus the
    longest output (the fragmentation PagedAttention removes)."""
    return len(reqs) * (max(len(r.prompt_ids) for r in reqs) + max(r.max_new_tokens for r in reqs))


class Scheduler:
    """Owns the queues and the request lifecycle. ``blocks`` is None for the dense static policy."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager | None = None,
                 dense_capacity: int | None = None):
        if config.paged and blocks is None:
            raise ValueError(f"the {config.policy} scheduler needs a BlockManager over a paged pool")
        self.config = config
        self.blocks = blocks
        # static: KV slots the dense batch may reserve (rows x (longest prompt + longest output)).
        self.dense_capacity = dense_capacity
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        # request id -> how many admissions jumped over it while it waited (cache-aware order only)
        self.bypassed: dict[str, int] = {}
        self.lookups: dict[str, NgramIndex] = {}  # request id -> its prompt-lookup index (speculation)

    # ---- queue management -----------------------------------------------------------------------
    def add(self, req: Request) -> None:
        if req.id in self.requests:
            raise StudylibError(f"request id {req.id!r} is already in the engine; ids must be unique.")
        req.status = RequestStatus.WAITING
        self.requests[req.id] = req
        self.bypassed[req.id] = 0
        self.waiting.append(req)

    def abort(self, request_id: str, now: float) -> Request | None:
        """Stop a request wherever it is; its blocks go back at once. Unknown or finished ids are ignored."""
        req = self.requests.get(request_id)
        if req is None or req.status.done:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            if self.blocks is not None:
                self.blocks.release(req, cache=False)
        else:
            self.waiting.remove(req)
        self._finish(req, RequestStatus.ABORTED, "abort", now)
        return req

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self.config.policy == "static":
            return self._schedule_static()
        return self._schedule_paged()

    def _schedule_paged(self) -> SchedulerOutput:
        cfg, out = self.config, SchedulerOutput()
        budget = cfg.max_batch_tokens
        # 1. Requests already running, oldest first: they hold memory and are closest to done.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.remaining, cfg.chunk_size, budget)
            draft = self._draft(req, budget - 1) if n == 1 else []
            n += len(draft)
            while not self.blocks.grow(req, req.num_computed + n):
                # Pool exhausted even after evicting cold prefixes: preempt the youngest request.
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim.id)
                if victim is req:
                    break
            if req.status is RequestStatus.RUNNING:
                out.num_tokens[req.id] = n
                if draft:
                    out.drafts[req.id] = draft
                budget -= n
                i += 1
        # 2. Admit waiting requests into the same step (for ``sequential``, only when nothing runs).
        while self.waiting and budget > 0 and len(self.running) < cfg.max_running and not out.preempted:
            req = self._next_waiting()
            n = self.blocks.admit(req, min(cfg.chunk_size, budget))
            if n is None:
                break  # the pool is full: wait for running requests to finish
            self._count_bypasses(req)
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.num_tokens[req.id] = n
            budget -= n
        return out

    def _draft(self, req: Request, room: int) -> list[int]:
        """Up to ``speculate_gamma`` tokens copied from ``req``'s own text to verify in this step: only for
        a greedy request that is decoding (its one known token left), never past its token budget."""
        cfg = self.config
        if not cfg.speculate_gamma or not req.output_ids or req.remaining != 1 or room < 1 or (
                req.sampling is not None and not req.sampling.greedy):
            return []
        index = self.lookups.get(req.id)
        if index is None:
            index = self.lookups[req.id] = NgramIndex(cfg.speculate_ngram)
        seq = req.all_ids
        index.extend(seq)
        left = req.max_new_tokens - len(req.output_ids) - 1  # the last token is sampled, never verified
        return index.lookup(seq, min(cfg.speculate_gamma, left, room))

    def _next_waiting(self) -> Request:
        head = self.waiting[0]
        if not self.config.cache_aware or head.num_preemptions:
            return head  # preempted requests (all at the front) go first
        # The starvation bound: the first request (queue order) bypassed max_bypass times goes next.
        # Everything ahead of it has been bypassed fewer times, so no count ever exceeds the bound.
        limit = self.config.max_bypass
        for req in self.waiting:
            if self.bypassed.get(req.id, 0) >= limit:
                return req
        # Longest usable cached prefix first (SGLang's LPM); ties keep arrival order.
        best, best_hit = head, -1
        for req in self.waiting:
            hit = self.blocks.peek(req)
            if hit > best_hit:
                best, best_hit = req, hit
        return best

    def _count_bypasses(self, admitted: Request) -> None:
        """``admitted`` leaves the queue now: each request waiting ahead of it was jumped over once."""
        for req in self.waiting:
            if req is admitted:
                return
            self.bypassed[req.id] = self.bypassed.get(req.id, 0) + 1

    def _preempt(self, req: Request) -> None:
        """Preemption by recompute: drop the KV, keep the generated tokens, requeue at the front."""
        self.running.remove(req)
        self.blocks.release(req, cache=False)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _schedule_static(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.running:
            out.num_tokens = {r.id: 1 for r in self.running}
            return out
        batch: list[Request] = []
        while self.waiting and len(batch) < self.config.max_running:
            if batch and self.dense_capacity is not None and \
                    dense_reserved(batch + [self.waiting[0]]) > self.dense_capacity:
                break  # the padded rectangle would not fit the memory budget
            batch.append(self.waiting.popleft())
        for req in batch:
            req.status = RequestStatus.RUNNING
        self.running = batch
        out.num_tokens = {r.id: r.num_tokens for r in batch}
        out.new_batch = [r.id for r in batch]
        return out

    # ---- committing a step ----------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, int], now: float) -> list[Request]:
        """Advance each scheduled request by its tokens and append the token sampled for it (requests
        whose chunk ended mid-prompt sample nothing). Returns the requests that finished."""
        done = []
        for rid, n in out.num_tokens.items():
            req = self.requests[rid]
            if req.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            if rid in out.drafts:
                # a verification: the last token and the accepted drafts now have K/V; the rejected
                # drafts' slots hold nothing anyone reads and are overwritten by the next step
                tokens = list(sampled[rid])
                req.num_computed += len(tokens)
            else:
                tokens = [sampled[rid]] if rid in sampled else []
                req.num_computed += n
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now
            if req.num_computed < req.num_tokens:
                continue
            if self.blocks is not None and not req.output_ids:
                self.blocks.cache_computed(req)  # the prompt is done: share its KV with later arrivals
            if any(req.append_token(t, now) for t in tokens):  # stops at the first token that ends it
                req.num_computed = min(req.num_computed, req.num_tokens)
                self.running.remove(req)
                self.lookups.pop(rid, None)
                if self.blocks is not None:
                    self.blocks.release(req, cache=True)
                self._finish(req, RequestStatus.FINISHED, req.stop_reason, now)
                done.append(req)
        return done

    @staticmethod
    def _finish(req: Request, status: RequestStatus, reason: str, now: float) -> None:
        req.status = status
        req.stop_reason = reason
        req.finished_s = now
        req.prefix_handle = None
