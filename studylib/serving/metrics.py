"""Serving metrics in the conventions of vLLM's ``benchmark_serving``.

- TTFT: first output token time minus the request's arrival (queueing included).
- TPOT: per request, (last token time - first token time) / (output tokens - 1); one-token outputs
  have no TPOT. ITL: every gap between consecutive tokens of a request, pooled over requests.
- E2EL: completion time minus arrival.
- Throughput: output tokens (and completed requests) per second of benchmark duration, from the
  start of the run to the last completion.
- Goodput: completed requests per second that met every SLO the user gave (``ttft_s``, ``tpot_s``,
  ``e2el_s``, in seconds), as in vLLM's ``--goodput``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from studylib.errors import StudylibError
from studylib.serving.request import Request, RequestStatus

SLO_KEYS = ("ttft_s", "tpot_s", "e2el_s")


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """{mean, p50, p90, p99} of ``values``; all None when there are none."""
    data = np.asarray([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return {"mean": float(data.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def check_slo(slo: Mapping[str, float] | None) -> dict[str, float]:
    slo = dict(slo or {})
    bad = sorted(set(slo) - set(SLO_KEYS))
    if bad:
        raise StudylibError(f"unknown SLO key(s) {bad}; use {list(SLO_KEYS)} (seconds).")
    for k, v in slo.items():
        if not v > 0:
            raise StudylibError(f"SLO {k} must be > 0 seconds, got {v}.")
    return slo


def meets_slo(req: Request, slo: Mapping[str, float]) -> bool:
    for key, limit in slo.items():
        value = getattr(req, key)
        if key == "tpot_s" and value is None:
            continue  # a one-token output has no TPOT to violate
        if value is None or value > limit:
            return False
    return True


def summarize(requests: Sequence[Request], duration_s: float, slo: Mapping[str, float] | None = None,
              steps: int | None = None, preemptions: int | None = None) -> dict:
    """The ``bench-serve --json`` summary (vLLM's benchmark keys first, then extras)."""
    slo = check_slo(slo)
    done = [r for r in requests if r.status is RequestStatus.FINISHED]
    out_tokens = sum(len(r.output_ids) for r in done)
    prompt_tokens = sum(len(r.prompt_ids) for r in done)
    dur = max(float(duration_s), 1e-9)
    good = [r for r in done if meets_slo(r, slo)]
    return {
        "requests": len(done),
        "output_tokens": out_tokens,
        "duration_s": float(duration_s),
        "throughput_tok_s": out_tokens / dur,
        "requests_per_s": len(done) / dur,
        "prefix_hit_rate": sum(r.prefix_hit_tokens for r in done) / prompt_tokens if prompt_tokens else 0.0,
        "ttft_s": distribution(r.ttft_s for r in done),
        "tpot_s": distribution(r.tpot_s for r in done),
        "itl_s": distribution(x for r in done for x in r.itl_s),
        "e2el_s": distribution(r.e2el_s for r in done),
        # extras
        "aborted": sum(r.status is RequestStatus.ABORTED and r.stop_reason == "abort" for r in requests),
        "rejected": sum(r.stop_reason == "rejected" for r in requests),
        "prompt_tokens": prompt_tokens,
        "slo": slo,
        "goodput_req_s": len(good) / dur if slo else None,
        "steps": steps,
        "preemptions": preemptions,
    }


def timeline_frame(timeline: Sequence[Mapping]):
    """The per-step time series as a DataFrame (t, waiting, running, batch_tokens, kv_used, kv_reserved_bytes,
    kv_live_bytes, ...)."""
    import pandas as pd

    return pd.DataFrame(list(timeline))
