"""Continuous batching over the paged KV pool, and the serving benchmark (chapter 5).

- ``Request`` / ``RequestStatus``: a request and its lifecycle.
- ``Scheduler`` / ``SchedulerConfig``: policies ``sequential``, ``static``, ``continuous`` behind one
  contract (``schedule() -> {request_id: num_tokens}``, ``update_from_output``).
- ``Engine`` / ``EngineConfig``: runs the real model one forward per step; ``Engine.run`` replays
  arrivals in wall-clock time and returns a ``ServingRun``.
- ``workload``: Poisson / gamma arrivals, data-set workloads, JSONL workload files.
- ``metrics``: vLLM-style throughput, TTFT, TPOT, ITL, e2e latency and goodput.
- ``batch_invariant``: the mode in which batched greedy output is bit-identical to single-request.
"""

from studylib.serving.engine import Engine, EngineConfig, ServingRun
from studylib.serving.invariant import batch_invariant
from studylib.serving.request import Request, RequestStatus
from studylib.serving.scheduler import POLICIES, Scheduler, SchedulerConfig, SchedulerOutput

__all__ = ["Engine", "EngineConfig", "ServingRun", "Request", "RequestStatus", "Scheduler",
           "SchedulerConfig", "SchedulerOutput", "POLICIES", "batch_invariant"]
