"""Chapter 7's latency reduction over whole runs: each chosen stack against AR, in fresh processes.

The confirmation run decides which stack each workload gets and whether it keeps quality; its per-request
CI is over requests inside one process, so it cannot see how the machine varies between runs. C7's
latency part is a machine-level speed-up, so it is judged over whole runs (``studylib.bench.whole_runs``):
each run reloads the model and the drafter, rebuilds the decoder options from the chapter's parameters
(the same strings the notebook passes, so the same draft), serves the confirmation requests through AR
and through the workload's settled stack, interleaved per request, and reports one median e2e speed-up per
workload. A workload whose settled stack is AR itself gets exactly 1.0 (the stack is the baseline; nothing
is timed), so it stays a condition of the decision, where it misses a >10x bar as it should.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from studylib.bench.stats import Estimate, no_ci

METRIC = "latency:"  # + workload: the run's median e2e speed-up of the settled stack over AR


def latency_run(model: str, weights: str, act: str, stacks: Mapping[str, Sequence[str]], n_requests: int,
                max_new_tokens: int, system_tokens: int, conversations: int, turns: int, max_chars: int, seed: int,
                draft: str, draft_fallback: str | None, gamma: int, lookup_gamma: int, lookup_ngram: int,
                lookahead: str, attention: str, block_size: int = 16, capacity_tokens: int = 8192,
                device: str = "cpu", dtype: str = "float32", run_index: int = 0,
                sparse_contexts: Sequence[int] = (), sparse_steps: int = 4, sparse_prompts: int = 3, **_) -> dict:
    """One whole run: ``stacks`` maps each workload to its settled stack's techniques (empty: AR).
    Returns ``{"latency:<workload>": speed-up}``, and with ``sparse_contexts`` C8's sparse-growth metrics
    (``sparse_growth_run``) from the same process."""
    from studylib.experiments import ch07_combined as cc
    from studylib.models import load_model

    timed = [wl for wl, techs in stacks.items() if techs]
    out = {f"{METRIC}{wl}": 1.0 for wl, techs in stacks.items() if not techs}
    if not timed and not sparse_contexts:
        return out
    lm, tok = load_model(model, device, dtype, weights=weights, act=act)
    if sparse_contexts:
        out.update(sparse_growth_run(lm, tok, attention, sparse_contexts, sparse_steps, sparse_prompts,
                                     seed + 1000 * run_index))
    if not timed:
        return out
    options, _ = cc.decoder_options(lm, draft, draft_fallback, gamma, lookup_gamma, lookup_ngram, lookahead)
    wls = cc.build_workloads(tok, timed, n_requests=n_requests, max_new_tokens=max_new_tokens,
                             system_tokens=system_tokens, conversations=max(1, n_requests // turns), turns=turns,
                             max_chars=max_chars, seed=seed)
    arms = {wl: [cc.make_arm((), options, attention), cc.make_arm(tuple(stacks[wl]), options, attention)]
            for wl in timed}
    rows = cc.run_arms(lm, tok, wls, arms, block_size=block_size, capacity_tokens=capacity_tokens, progress=False)
    summary = cc.latency_summary(rows)
    for wl in timed:
        name = arms[wl][1].name
        out[f"{METRIC}{wl}"] = float(summary[(summary.workload == wl) & (summary.arm == name)].speedup.iloc[0])
    return out


GROWTH, GAIN_LONG = "sparse_growth", "sparse_gain_longest"


def sparse_growth_run(lm, tok, attention: str, contexts: Sequence[int], steps: int, prompts: int, seed: int) -> dict:
    """C8's "sparse attention's gain grows with context" as one whole run's numbers: the decode-step
    speed-up of ``attention`` over dense (both per-op) at the shortest and the longest of ``contexts`` on
    ``prompts`` texts of this run's seed; returns the median over texts of (speed-up at longest / at
    shortest) and the median speed-up at the longest context. The run, not the text, is the unit."""
    import numpy as np

    from studylib.experiments.ch07_system import sparse_vs_context

    ends = [int(min(contexts)), int(max(contexts))]
    df = sparse_vs_context(lm, attention, ends, steps, seed, prompts, tok, progress=False)
    wide = df.pivot(index="prompt", columns="context", values="speedup")[ends].dropna()
    return {GROWTH: float(np.median(wide[ends[1]] / wide[ends[0]])), GAIN_LONG: float(np.median(wide[ends[1]]))}


def stacks_for_runs(plans: Mapping) -> dict[str, list[str]]:
    """The settled plans as the whole runs take them: workload -> the stack's techniques (empty: AR)."""
    return {wl: list(plan.stack) for wl, plan in plans.items()}


def latency_over_runs(runs, workloads: Sequence[str], confidence: float = 0.95) -> dict[str, Estimate]:
    """Per workload, the settled stack's e2e speed-up over AR with its CI over the whole runs at
    ``confidence``; a workload the runs did not measure stays a condition without a CI."""
    return {wl: runs.get(f"{METRIC}{wl}", confidence) or no_ci(confidence=confidence) for wl in workloads}
