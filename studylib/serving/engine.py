"""The serving engine: requests in, one real forward pass per step, wall-clock timings out.

    engine = Engine(model, EngineConfig(scheduler="continuous", prefix_cache="radix"), tokenizer)
    run = engine.run(requests)          # replays each request's arrival_s in real time
    run.summary()                       # vLLM-style throughput / TTFT / TPOT / ITL / e2e latency

Each step: the scheduler picks ``{request_id: num_tokens}``, the runner executes that as one forward
(ragged through the paged pool, or a padded rectangle for ``static``), the scheduler commits the
sampled tokens. The timeline records each step: its time, queue lengths, batch, and the KV memory held
while its forward ran (``kv_reserved_bytes`` the policy holds, ``kv_live_bytes`` of them holding K/V
that running requests need; the gap is fragmentation). Requests that can never be served (longer than
the context window or than the whole KV budget) are rejected when they arrive, with the reason
recorded; the engine keeps serving the rest.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from studylib.decoding.common import eos_set
from studylib.errors import StudylibError
from studylib.kvcache import PagedKVPool, make_prefix_cache
from studylib.models import LlamaModel
from studylib.sampling import SamplingParams
from studylib.serving.blocks import BlockManager
from studylib.serving.invariant import batch_invariant, kernels_apply
from studylib.serving.metrics import summarize
from studylib.serving.request import Request, RequestStatus
from studylib.serving.runners import DenseBatchRunner, PagedRunner
from studylib.serving.scheduler import Scheduler, SchedulerConfig, dense_reserved

DEFAULT_KV_BUDGET_MIB = 256.0


@dataclass
class EngineConfig:
    scheduler: str = "continuous"  # sequential | static | continuous
    prefix_cache: str = "none"  # radix | none
    max_batch_tokens: int = 512
    max_running: int = 32
    chunk_size: int | None = None
    cache_aware: bool = False
    max_bypass: int = 16  # cache_aware: the most times a waiting request may be jumped over
    block_size: int = 16
    kv_budget_mib: float | None = None  # the KV memory budget (default 256 MiB); or give num_blocks
    num_blocks: int | None = None
    # Bit-exact vs. the single-request decoder. None = on where the C kernels apply (fp32 dense weights
    # on CPU), where it costs nothing; True elsewhere falls back to the slow row-by-row reference.
    batch_invariant: bool | None = None
    attention: str = "auto"  # PagedBatch attention strategy: auto | loop | padded
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Speculation inside the batch: "prompt-lookup:GAMMA,NGRAM" (a greedy request verifies up to GAMMA
    # tokens copied from its own text in the batched step), or None.
    speculate: str | None = None

    def __post_init__(self) -> None:
        self.scheduler_config()  # validates the scheduling options
        if self.kv_budget_mib is not None and self.num_blocks is not None:
            raise StudylibError("give one of kv_budget_mib (--kv-budget-mib) or num_blocks, not both.")
        if self.kv_budget_mib is None and self.num_blocks is None:
            self.kv_budget_mib = DEFAULT_KV_BUDGET_MIB
        if self.kv_budget_mib is not None and self.kv_budget_mib <= 0:
            raise StudylibError(f"kv_budget_mib must be > 0, got {self.kv_budget_mib}.")
        if self.block_size < 1:
            raise StudylibError(f"block_size must be >= 1, got {self.block_size}.")
        if self.speculation()[0] and not self.sampling.greedy:
            raise StudylibError("speculation inside the batch verifies greedily: keep the engine's default "
                                "sampling greedy (requests may still ask for their own sampling, and then do not "
                                "speculate), or set speculate none.")
        if self.attention not in ("auto", "loop", "padded"):
            raise StudylibError(f"unknown attention strategy {self.attention!r}; use auto, loop or padded.")

    def speculation(self) -> tuple[int, int]:
        """(gamma, ngram) of ``speculate``; (0, 3) when off."""
        if self.speculate in (None, "", "none"):
            return 0, 3
        kind, _, args = str(self.speculate).partition(":")
        try:
            gamma, ngram = (int(a) for a in (args or "8,3").split(","))
        except ValueError:
            gamma = ngram = -1
        if kind != "prompt-lookup" or gamma < 1 or ngram < 1:
            raise StudylibError(f"speculate={self.speculate!r}: give prompt-lookup:GAMMA,NGRAM (e.g. prompt-lookup:8,3) "
                                "or none.")
        return gamma, ngram

    def scheduler_config(self) -> SchedulerConfig:
        gamma, ngram = self.speculation()
        return SchedulerConfig(self.scheduler, self.max_batch_tokens, self.max_running, self.chunk_size,
                               self.prefix_cache, self.cache_aware, self.max_bypass, gamma, ngram)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sampling"] = asdict(self.sampling)
        return d


@dataclass
class ServingRun:
    """Everything one benchmark run produced."""

    requests: list[Request]
    duration_s: float
    timeline: list[dict]  # one row per step: t, step_s, waiting, running, batch_tokens, kv_used, kv_*_bytes
    config: dict
    steps: int
    preemptions: int
    cache_metrics: dict | None = None
    bypassed: dict[str, int] = field(default_factory=dict)  # request id -> times jumped over (cache_aware)

    def summary(self, slo: dict | None = None) -> dict:
        s = summarize(self.requests, self.duration_s, slo=slo, steps=self.steps, preemptions=self.preemptions)
        s["max_bypassed"] = max(self.bypassed.values(), default=0)
        s.update(self.host_time())
        return s

    def host_time(self, min_rows: int = 1) -> dict:
        """The engine's own share of its steps of at least ``min_rows`` sequences: host seconds (scheduling,
        bookkeeping, committing) over host + forward seconds, and the median per step."""
        rows = [t for t in self.timeline if t.get("batch_seqs", 0) >= min_rows and "host_s" in t]
        host = sum(t["host_s"] for t in rows)
        total = host + sum(t["forward_s"] for t in rows)
        per = sorted(t["host_s"] for t in rows)
        return {"host_share": host / total if total > 0 else None,
                "host_s_per_step_p50": per[len(per) // 2] if per else None, "host_steps": len(rows)}

    def records(self) -> list[dict]:
        return [{**r.record(), "bypassed": self.bypassed.get(r.id, 0)} for r in self.requests]


class Engine:
    def __init__(self, model: LlamaModel, config: EngineConfig | None = None, tokenizer: object | None = None):
        self.model = model
        self.config = config = config or EngineConfig()
        self.eos = frozenset(eos_set(model, tokenizer))
        sc = config.scheduler_config()
        cfg, dev, dt = model.config, model.device, model.dtype
        # KV bytes one token occupies (all layers, K and V) in this engine's cache dtype.
        self.kv_token_bytes = cfg.kv_bytes_per_token(torch.empty(0, dtype=dt).element_size())
        budget = None if config.kv_budget_mib is None else int(config.kv_budget_mib * 2**20)
        self.pool: PagedKVPool | None = None
        self.prefix_cache = None
        if sc.paged:
            self.pool = PagedKVPool(cfg, block_size=config.block_size, budget_bytes=budget,
                                    num_blocks=config.num_blocks, device=dev, dtype=dt)
            self.prefix_cache = make_prefix_cache(sc.prefix_cache, self.pool)
            self.scheduler = Scheduler(sc, BlockManager(self.pool, self.prefix_cache))
            self.runner = PagedRunner(model, self.pool, config.sampling, config.attention)
            self.capacity = self.pool.num_slots
        else:
            self.capacity = (budget // self.kv_token_bytes if budget is not None
                             else config.num_blocks * config.block_size)
            self.scheduler = Scheduler(sc, None, dense_capacity=self.capacity)
            self.runner = DenseBatchRunner(model, config.sampling)
        self.invariant = config.batch_invariant
        if self.invariant is None:
            # Dense fp32 linears become invariant in the mode; int8/bf16-activation block linears are already.
            self.invariant = (kernels_apply(dev) and dt == torch.float32
                              and (getattr(model, "weights_format", "dense") == "dense"
                                   or getattr(model, "act", "fp32") != "fp32"))
        self.t0 = time.perf_counter()
        self.timeline: list[dict] = []
        self.steps = 0
        self.batch: list[Request] = []  # static: the rows of the padded rectangle now allocated

    # ---- requests -------------------------------------------------------------------------------
    def now(self) -> float:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - self.t0

    def check(self, req: Request) -> None:
        """Raise StudylibError if ``req`` could never be served by this engine."""
        window = self.model.config.max_position_embeddings
        if len(req.prompt_ids) + req.max_new_tokens > window:
            raise StudylibError(
                f"request {req.id!r}: {len(req.prompt_ids)} prompt tokens + max_new_tokens {req.max_new_tokens} "
                f"exceed the context window of {window}; shorten the prompt or lower max_new_tokens.")
        if self.pool is not None:
            self.pool.check_fits(req.max_total_tokens, f"request {req.id!r}")
        elif dense_reserved([req]) > self.capacity:
            raise StudylibError(
                f"request {req.id!r} needs {dense_reserved([req])} KV slots but the budget holds {self.capacity}; "
                "raise --kv-budget-mib or shorten the request.")

    def add_request(self, req: Request) -> None:
        """Queue ``req``; raises StudylibError (engine state unchanged) if it can never be served."""
        self.check(req)
        if not req.eos_ids and not req.ignore_eos:
            req.eos_ids = self.eos
        self.scheduler.add(req)

    def submit(self, req: Request) -> bool:
        """``add_request`` that records a rejection on the request instead of raising."""
        try:
            self.add_request(req)
            return True
        except StudylibError as err:
            req.status, req.stop_reason, req.error = RequestStatus.ABORTED, "rejected", str(err)
            req.finished_s = self.now()
            return False

    def abort(self, request_id: str) -> Request | None:
        return self.scheduler.abort(request_id, self.now())

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- one step -------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Schedule, run one forward pass, commit. Returns the requests that finished in this step.

        The timeline splits the step's time: ``forward_s`` (the runner: the model's forward and the
        sampling), ``host_s`` (everything else: scheduling, block bookkeeping, committing tokens), the
        engine's own cost that a fast kernel cannot hide."""
        t_sched = time.perf_counter()
        out = self.scheduler.schedule()
        if not out:
            return []
        reqs = self.scheduler.requests
        if out.new_batch is not None:
            self.batch = [reqs[rid] for rid in out.new_batch]
        reserved, live = self.kv_bytes(out)
        start = self.now()
        ctx = batch_invariant(self.model.device) if self.invariant else contextlib.nullcontext()
        with ctx:
            if isinstance(self.runner, PagedRunner):
                batch = [reqs[rid] for rid in out.num_tokens]
                sampled = self.runner.run(batch, [out.num_tokens[r.id] for r in batch], out.drafts)
            elif out.new_batch is not None:
                sampled = self.runner.start([reqs[rid] for rid in out.new_batch])
            else:
                sampled = self.runner.decode(set(out.num_tokens))
        end = self.now()
        done = self.scheduler.update_from_output(out, sampled, end)
        if isinstance(self.runner, DenseBatchRunner) and not self.scheduler.running:
            self.runner.reset()
            self.batch = []
        self.steps += 1
        host = (time.perf_counter() - t_sched) - (end - start)
        self.timeline.append({
            "t": end, "step_s": end - start, "forward_s": end - start, "host_s": host,
            "waiting": len(self.scheduler.waiting),
            "running": len(self.scheduler.running) + len(done), "batch_seqs": len(out.num_tokens),
            "batch_tokens": out.total_tokens, "preempted": len(out.preempted), "kv_used": self.kv_used(),
            "kv_reserved_bytes": reserved, "kv_live_bytes": live,
            "drafted_tokens": sum(len(d) for d in out.drafts.values()),
            "accepted_tokens": sum(len(sampled[r]) - 1 for r in out.drafts if r in sampled),
        })
        return done

    def kv_bytes(self, out) -> tuple[int, int]:
        """(reserved, live) KV bytes while the step ``out`` runs, after its blocks were allocated.

        Reserved: what the policy holds. Paged: pool blocks in use (running requests and the prefix
        cache) x bytes per block. Static: the padded rectangle the batch was given, rows x (longest
        prompt + longest output), held until the whole batch ends, finished rows included.
        Live: slots holding K/V of running requests once this step has written, i.e. their computed
        tokens plus the ones this step computes. A block shared through the prefix cache is counted
        once (these are physical bytes), so live <= reserved; without sharing it is the sum over running
        requests of their tokens."""
        per_token = self.kv_token_bytes
        running = self.scheduler.running
        if self.pool is None:
            live = sum(r.num_computed + out.num_tokens.get(r.id, 0) for r in running)
            return (dense_reserved(self.batch) if self.batch else 0) * per_token, live * per_token
        bs = self.pool.block_size
        # Only full blocks are ever shared (prefix hits are whole blocks); a request's last, partial
        # block is its own. So: each distinct full block once, plus every partial block's tokens.
        full: set[int] = set()
        partial = 0
        for r in running:
            n = r.num_computed + out.num_tokens.get(r.id, 0)
            full.update(r.block_table[: n // bs])
            partial += n % bs
        return self.pool.num_used * bs * per_token, (len(full) * bs + partial) * per_token

    def kv_used(self) -> float:
        """Fraction of the KV budget in use: pool blocks held (prefix cache included) for the paged
        policies, slots reserved by the padded rectangle for ``static``."""
        if self.pool is not None:
            return self.pool.num_used / self.pool.num_blocks
        running = self.scheduler.running
        return dense_reserved(running) / self.capacity if running else 0.0

    # ---- a whole benchmark ----------------------------------------------------------------------
    def run(self, requests: Sequence[Request], *, progress: bool = False) -> ServingRun:
        """Serve ``requests``, each entering the queue at its ``arrival_s`` (wall clock from now)."""
        from studylib.progress import progress_bar

        pending = deque(sorted(requests, key=lambda r: r.arrival_s))
        self.t0 = time.perf_counter()
        self.timeline, self.steps = [], 0
        self.batch = []
        bar = progress_bar(total=len(pending), progress=progress, desc=f"serve[{self.config.scheduler}]", leave=False)
        while pending or self.has_work():
            now = self.now()
            while pending and pending[0].arrival_s <= now:
                if not self.submit(pending.popleft()):
                    bar.update(1)
            if not self.has_work():
                time.sleep(max(0.0, pending[0].arrival_s - self.now()))
                continue
            bar.update(len(self.step()))
        bar.close()
        ends = [r.finished_s for r in requests if r.finished_s is not None]
        metrics = self.prefix_cache.metrics.as_dict() if self.prefix_cache is not None else None
        bypassed = {r.id: self.scheduler.bypassed.get(r.id, 0) for r in requests}
        config = {**self.config.to_dict(), "batch_invariant": self.invariant}  # as resolved
        return ServingRun(list(requests), max(ends, default=self.now()), self.timeline, config,
                          self.steps, self.scheduler.num_preemptions, metrics, bypassed)
