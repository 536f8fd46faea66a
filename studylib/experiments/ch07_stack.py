"""Chapter 7: the best stack per workload, the waterfall of what each technique adds, and whether the
gains multiply.

``plan_stack`` is the rule (pure, tested): a technique joins the stack only if it helped alone
(the low end of its CI above 1 on that workload), composes with the rest in this checkout (probed with a
tiny request), and, if lossy, kept the quality bar alone. Order: prefix cache, then the fastest lossless
decoder, then window attention. Once every step of the chain is measured, ``settle_stacks`` cuts it back
to its fastest step. The chosen stack is measured again in a confirmation run on fresh requests, so its
reported number is not the maximum of several noisy candidates.

The waterfall telescopes exactly: with m(arm) the median e2e latency of an arm over the workload's
requests, m(ar) / m(stack) = prod_k m(step k-1) / m(step k), so the log bars add up to the stack's
speedup (a ratio of medians, as ``bench.stats.ratio_estimate`` reports it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from studylib.errors import StudylibError
from studylib.experiments.ch07_combined import (
    BASELINE,
    DECODERS,
    PREFIX,
    WINDOW,
    Arm,
    make_arm,
    paired,
    probe,
)
from studylib.experiments.ch07_quality import QUALITY_BAR, window_quality_ok


@dataclass
class StackPlan:
    chain: list[tuple[str, ...]]  # technique sets, each containing the previous; the last is the stack
    notes: list[str]

    @property
    def stack(self) -> tuple[str, ...]:
        return self.chain[-1] if self.chain else ()


def plan_stack(speedups: Mapping[str, float | tuple[float, float, float]], window_quality_ok: bool,
               composable: Callable[[tuple[str, ...]], str | None]) -> StackPlan:
    """Choose the best stack for one workload from single-technique speedups: a value, or (value, CI low,
    CI high) over the workload's requests.

    A technique joins only if it surely helped alone: the low end of its CI above 1 (a point value above 1
    whose CI spans 1 is no evidence of a gain, and stacking on noise made a stack slower than its best
    part). Without a CI the point value decides. Order: prefix cache, then the fastest
    decoder that composes with it (``composable(techniques)`` returns why not, or None), then window
    attention if ``window_quality_ok`` and it composes. If the best decoder cannot stack on the prefix
    cache, the faster of the two alone is kept. Every choice left out is explained in ``notes``.
    """
    notes: list[str] = []
    est = {t: (s, s, s) if isinstance(s, int | float) else tuple(float(x) for x in s) for t, s in speedups.items()}
    helps = {t: v for t, (v, lo, _) in est.items() if lo > 1.0}
    for t, (v, lo, hi) in est.items():
        if v <= 1.0:
            notes.append(f"{t} left out: {v:.2f}x alone (no gain)")
        elif lo <= 1.0:
            notes.append(f"{t} left out: {v:.2f}x alone, but its CI ({lo:.2f}-{hi:.2f}) reaches 1 (no sure gain)")
    chain: list[tuple[str, ...]] = []
    if PREFIX in helps:
        chain.append((PREFIX,))
    for d in sorted((d for d in DECODERS if d in helps), key=helps.get, reverse=True):
        cand = (*chain[-1], d) if chain else (d,)
        why = composable(cand) if len(cand) > 1 else None
        if why is None:
            chain.append(cand)
            break
        notes.append(f"{d} cannot stack on the prefix cache here ({why})")
        if helps[d] > helps.get(PREFIX, 0.0):
            chain = [(d,)]
            notes.append(f"kept {d} alone: faster than the prefix cache alone")
            break
    if WINDOW in helps:
        cand = (*chain[-1], WINDOW) if chain else (WINDOW,)
        why = composable(cand) if len(cand) > 1 else None
        if not window_quality_ok:
            notes.append(f"{WINDOW} left out: below the quality bar on this workload")
        elif why is not None:
            notes.append(f"{WINDOW} cannot join {' + '.join(cand[:-1])} here ({why})")
        else:
            chain.append(cand)
    if not chain:
        notes.append("no technique helped: the best stack is the baseline itself")
    return StackPlan(chain, notes)


def stack_arm_name(plan: StackPlan, decoder_options: Mapping[str, dict], attention: str) -> str:
    return make_arm(plan.stack, decoder_options, attention).name if plan.stack else BASELINE


def chain_arms(plans: Mapping[str, StackPlan], decoder_options: Mapping[str, dict], attention: str,
               measured: Sequence[str]) -> dict[str, list[Arm]]:
    """Per workload, the arms its chain needs that pass 1 did not measure (the multi-technique stacks)."""
    out: dict[str, list[Arm]] = {}
    for wl, plan in plans.items():
        arms = [make_arm(t, decoder_options, attention) for t in plan.chain]
        out[wl] = [a for a in arms if a.name not in measured]
    return {wl: a for wl, a in out.items() if a}


def waterfall_frame(runs: pd.DataFrame, plans: Mapping[str, StackPlan], decoder_options: Mapping[str, dict],
                    attention: str, baseline: str = BASELINE) -> pd.DataFrame:
    """One row per chain step: the technique added and the ratio of median e2e latencies it brought.
    Factors multiply to the stack's speedup (ratio of medians), so the log bars add up exactly."""
    rows = []
    for wl, plan in plans.items():
        w = runs[runs.workload == wl]
        med = w.groupby("arm").e2e_s.median()
        prev, prev_techs, cum = baseline, (), 1.0
        for step, techs in enumerate(plan.chain):
            name = make_arm(techs, decoder_options, attention).name
            added = [t for t in techs if t not in prev_techs]
            factor = float(med[prev] / med[name])
            cum *= factor
            rows.append({"workload": wl, "step": step, "added": " + ".join(added), "arm": name,
                         "factor": factor, "cumulative": cum})
            prev, prev_techs = name, techs
        if not plan.chain:
            rows.append({"workload": wl, "step": 0, "added": "(none)", "arm": baseline, "factor": 1.0,
                         "cumulative": 1.0})
    return pd.DataFrame(rows)


def interaction(runs: pd.DataFrame, workload: str, stack: str, parts: Sequence[str], baseline: str = BASELINE,
                n_boot: int = 2000, seed: int = 0, confidence: float = 0.95) -> dict:
    """Stack speedup over the product of its parts' single speedups (1 = the gains multiply, < 1 = the
    stack falls short of the product), with a paired bootstrap CI at ``confidence`` over requests (all
    arms resampled together)."""
    arms = [stack, *parts]
    cols = {a: paired(runs, workload, a, baseline) for a in arms}
    b = cols[stack][0].e2e_s.to_numpy()
    t = {a: cols[a][1].e2e_s.to_numpy() for a in arms}
    if any(len(v) != len(b) for v in t.values()):
        raise StudylibError(f"{workload}: the stack and its parts did not run the same requests.")

    def stat(idx):
        med_b = np.median(b[idx])
        return (med_b / np.median(t[stack][idx])) / np.prod([med_b / np.median(t[p][idx]) for p in parts])

    point = float(stat(np.arange(len(b))))
    if len(b) < 2:  # one request: no CI, and the verdict rules decide nothing on it
        return {"value": point, "ci_low": float("nan"), "ci_high": float("nan")}
    rng = np.random.default_rng(seed)
    boots = [stat(rng.integers(0, len(b), len(b))) for _ in range(n_boot)]
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(boots, [tail, 100 - tail])
    return {"value": point, "ci_low": float(lo), "ci_high": float(hi)}


def plan_stacks(model, tokenizer, summary: pd.DataFrame, quality: pd.DataFrame, options: Mapping[str, dict],
                attention: str, threshold: float = QUALITY_BAR) -> dict[str, StackPlan]:
    """``plan_stack`` per workload; composability is probed once per technique set with a tiny request."""
    window_arm = make_arm((WINDOW,), options, attention).name
    ok = window_quality_ok(quality, window_arm, threshold)
    probed: dict[tuple, str | None] = {}

    def composable(techs):
        if techs not in probed:
            probed[techs] = probe(model, tokenizer, make_arm(techs, options, attention))
        return probed[techs]

    plans = {}
    for wl, g in summary.groupby("workload", sort=False):
        lows = g.speedup_low if "speedup_low" in g else g.speedup
        highs = g.speedup_high if "speedup_high" in g else g.speedup
        speed = {t[0]: (s, lo, hi) for t, s, lo, hi in zip(g.techniques, g.speedup, lows, highs, strict=True)
                 if len(t) == 1}
        plans[wl] = plan_stack(speed, ok.get(wl, False), composable)
    return plans


def settle_stacks(plans: Mapping[str, StackPlan], summary: pd.DataFrame, options: Mapping[str, dict],
                  attention: str) -> dict[str, StackPlan]:
    """Each workload's chain cut back to its fastest step, once every step has been measured: a technique
    that helped alone can still slow the stack it joins (its gain overlaps the others'), and a stack slower
    than a shorter one is no stack to confirm. Point values of this pass decide; the confirmation run
    measures the settled stack again on fresh requests, so picking here biases nothing it reports."""
    out = {}
    for wl, plan in plans.items():
        g = summary[summary.workload == wl].set_index("arm").speedup
        speeds = [float(g.get(make_arm(t, options, attention).name, float("nan"))) for t in plan.chain]
        if len(speeds) < 2 or any(np.isnan(speeds)):
            out[wl] = plan
            continue
        best = int(np.argmax(speeds))
        if best == len(speeds) - 1:
            out[wl] = plan
            continue
        cut = [t for t in plan.stack if t not in plan.chain[best]]
        out[wl] = StackPlan(plan.chain[:best + 1], [*plan.notes, (
            f"{' and '.join(cut)} dropped: the stack with {'them' if len(cut) > 1 else 'it'} measured "
            f"{speeds[-1]:.2f}x, below the {speeds[best]:.2f}x of {make_arm(plan.chain[best], options, attention).name}")])
    return out


def plans_frame(plans: Mapping[str, StackPlan], options, attention) -> pd.DataFrame:
    return pd.DataFrame([{"workload": wl, "best stack": stack_arm_name(p, options, attention),
                          "chain": " -> ".join(make_arm(t, options, attention).name for t in p.chain) or "-",
                          "notes": "; ".join(p.notes)} for wl, p in plans.items()])


def plans_text(plans: Mapping[str, StackPlan], options, attention) -> str:
    """Markdown: each workload's stack and why every other technique is not in it."""
    lines = []
    for wl, p in plans.items():
        chain = " -> ".join(make_arm(t, options, attention).name for t in p.chain) or "nothing"
        lines.append(f"- **{wl}**: {chain}." + (f" {'; '.join(p.notes)}." if p.notes else ""))
    return "\n".join(lines)


def interaction_frame(runs: pd.DataFrame, plans: Mapping[str, StackPlan], options, attention) -> pd.DataFrame:
    """Per workload whose stack has 2+ techniques: stack speedup / product of the parts' speedups. C8's
    stacking check passes if ANY of these workloads has its CI wholly below 1, so the CIs are at
    ``corrected_confidence(k)`` with k the number of workloads tried (the ``confidence`` column)."""
    from studylib.claims import corrected_confidence

    tried = [wl for wl, plan in plans.items() if len(plan.stack) >= 2]
    confidence = corrected_confidence(max(1, len(tried)))
    rows = []
    for wl in tried:
        plan = plans[wl]
        stack = make_arm(plan.stack, options, attention).name
        parts = [make_arm((t,), options, attention).name for t in plan.stack]
        est = interaction(runs, wl, stack, parts, confidence=confidence)
        n = int(((runs.workload == wl) & (runs.arm == stack)).sum())
        rows.append({"workload": wl, "stack": stack, "ratio": est["value"], "low": est["ci_low"],
                     "high": est["ci_high"], "requests": n, "confidence": confidence})
    return pd.DataFrame(rows, columns=["workload", "stack", "ratio", "low", "high", "requests", "confidence"])
