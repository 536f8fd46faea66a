"""Chapter 7, part 2: the quality every arm and stack retains against the AR baseline.

- Lossless arms (dense attention): the exact-match rate of greedy outputs against the baseline, which
  must be 100%; anything less is reported, not excused.
- Lossy arms (sparse attention): all three of the study's measures, and the quality retained is the
  worst of them: token-level greedy agreement with the baseline; the task score relative to the
  baseline's (XSum ROUGE-L F1 via ``studylib.eval.rouge``, HumanEval pass@1 via
  ``studylib.eval.humaneval``, each program run in a subprocess with a timeout); and the inverse
  perplexity ratio on long real text (chapter 6's ``long_context_quality``, block-bootstrap CI), which
  counts only on workloads whose contexts outgrew the pattern's KV budget (below it the pattern is
  exactly dense attention).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from studylib.bench.stats import estimate
from studylib.experiments.ch07_combined import BASELINE, NamedWorkload, agreement, paired
from studylib.workbook.tables import why_not_measured

TASKS = {"xsum": "ROUGE-L F1", "humaneval": "pass@1"}
QUALITY_BAR = 0.99  # ">99% of original generation quality"


def task_scores(runs: pd.DataFrame, workloads: Mapping[str, NamedWorkload], timeout: float = 10.0) -> pd.DataFrame:
    """Per request and arm: ROUGE-L F1 against the XSum reference, or 1/0 for a HumanEval pass.
    Identical completions are executed once (lossless arms repeat the baseline's)."""
    from studylib.eval.humaneval import check
    from studylib.eval.rouge import rouge_pairs

    rows, passed = [], {}
    for r in runs[runs.workload.isin(TASKS)].itertuples():
        rec = workloads[r.workload].records.get(r.request)
        if rec is None:
            continue
        if r.workload == "xsum":
            score = rouge_pairs([r.text], [rec.meta["reference"]], types=("rougeL",))[0]["rougeL"]
        else:
            key = (r.request, r.text)
            if key not in passed:
                passed[key] = check(rec, r.text, timeout=timeout).passed
            score = float(passed[key])
        rows.append({"workload": r.workload, "request": r.request, "arm": r.arm, "metric": TASKS[r.workload],
                     "score": score})
    return pd.DataFrame(rows, columns=["workload", "request", "arm", "metric", "score"])


def perplexity_ratio(model, tokenizer, spec: str, n_tokens: int, gen_tokens: int = 16, seed: int = 0,
                     progress: bool = False) -> dict:
    """Chapter 6's measurement for one pattern: perplexity ratio vs dense on ``n_tokens`` of real text
    (with its CI) and the greedy agreement of a continuation from the very cache the text built."""
    from studylib.experiments.ch06_long_context import long_context_quality, quality_summary

    res = long_context_quality(model, tokenizer, n_tokens, [spec], gen_tokens=gen_tokens, seed=seed,
                               progress=progress)
    row = quality_summary(res).set_index("pattern").loc[spec]
    return {"spec": spec, "n_tokens": n_tokens, "ppl_dense": float(res["runs"]["dense"]["ppl"]),
            "ppl": float(row.ppl), "ppl_ratio": float(row.ppl_ratio), "ppl_ratio_low": float(row.ppl_ratio_low),
            "ppl_ratio_high": float(row.ppl_ratio_high), "long_context_agreement": float(row.agreement)}


def retained(lossless: bool, exact: float, agree: float, task_ratio: float | None,
             ppl_ratio: float | None) -> tuple[float, str]:
    """Quality retained and the measure that binds: exact match for lossless arms, else the worst of
    greedy agreement, task-score ratio and 1 / perplexity ratio (those that were measured)."""
    if lossless:
        return exact, "exact match"
    cands = {"greedy agreement": agree}
    if task_ratio is not None and math.isfinite(task_ratio):
        cands["task score ratio"] = task_ratio
    if ppl_ratio is not None and math.isfinite(ppl_ratio) and ppl_ratio > 0:
        cands["1 / perplexity ratio"] = 1.0 / ppl_ratio
    key = min(cands, key=cands.get)
    return float(cands[key]), key


def task_ratio(scores: pd.DataFrame, workload: str, arm: str, baseline: str = BASELINE) -> tuple[float, float, float]:
    """(arm mean score, baseline mean score, ratio); ratio is NaN when the baseline scores 0."""
    s = scores[scores.workload == workload]
    a, b = s[s.arm == arm].score.mean(), s[s.arm == baseline].score.mean()
    return float(a), float(b), (float(a / b) if b > 0 else float("nan"))


def quality_frame(runs: pd.DataFrame, scores: pd.DataFrame, ppl: Mapping[str, dict] | None = None,
                  baseline: str = BASELINE) -> pd.DataFrame:
    """Per (workload, arm): exact match, agreement, task score vs baseline, perplexity ratio (lossy arms:
    ``ppl`` maps attention spec -> ``perplexity_ratio`` result), and the quality retained with a CI."""
    rows = []
    for (wl, arm), g in runs.groupby(["workload", "arm"], sort=False):
        b, t = paired(runs, wl, arm, baseline)
        exact = [float(x == y) for x, y in zip(t.tokens, b.tokens, strict=True)]
        agree = [agreement(x, y) for x, y in zip(t.tokens, b.tokens, strict=True)]
        lossless = bool(g.lossless.iloc[0])
        p = (ppl or {}).get(g.attention.iloc[0]) if not lossless and reaches_sparsity(g) else None
        has_task = wl in TASKS and len(scores[(scores.workload == wl) & (scores.arm == arm)])
        a_score, b_score, ratio = task_ratio(scores, wl, arm, baseline) if has_task else (None, None, None)
        value, binding = retained(lossless, float(np.mean(exact)), float(np.mean(agree)),
                                  None if lossless else ratio, p["ppl_ratio"] if p else None)
        per_req = exact if binding == "exact match" else agree if binding == "greedy agreement" else None
        est = estimate(per_req, np.mean) if per_req else None
        rows.append({
            "workload": wl, "arm": arm, "lossless": lossless, "requests": len(t),
            "exact_match": float(np.mean(exact)), "agreement": float(np.mean(agree)),
            "task_metric": TASKS.get(wl), "task_score": a_score, "baseline_task_score": b_score,
            "task_ratio": ratio, "ppl_ratio": p["ppl_ratio"] if p else None,
            "ppl_ratio_ci": (p["ppl_ratio_low"], p["ppl_ratio_high"]) if p else None,
            "quality_retained": value, "binding": binding,
            "retained_low": est.ci_low if est is not None else value,
            "retained_high": est.ci_high if est is not None else value,
        })
    no_task = (f"scored only on {' and '.join(TASKS)}, which have reference answers, when their scores were "
               "computed; a ratio is also undefined where the baseline scores 0")
    no_ppl = ("a lossless arm keeps dense attention, and a sparse arm whose contexts never outgrew its window "
              "attended exactly as dense does, so there is no perplexity change to measure")
    return why_not_measured(pd.DataFrame(rows), task_metric=no_task, task_score=no_task, baseline_task_score=no_task,
                            task_ratio=no_task, ppl_ratio=no_ppl, ppl_ratio_ci=no_ppl)


def reaches_sparsity(rows: pd.DataFrame) -> bool:
    """Did any request of this arm grow past its pattern's KV budget? If not, the sparse pattern saw
    every key and computed exactly dense attention, and a perplexity ratio measured at long context
    says nothing about this workload."""
    from studylib.attention import Pattern

    pattern = Pattern.parse(rows.attention.iloc[0])
    longest = int((rows.prompt_tokens + rows.new_tokens).max())
    return pattern.kv_budget(longest) < longest


def window_quality_ok(quality: pd.DataFrame, window_arm: str, threshold: float) -> dict[str, bool]:
    """Per workload: did the window-attention arm alone keep the quality bar (point value)?"""
    q = quality[quality.arm == window_arm]
    return {r.workload: bool(r.quality_retained >= threshold) for r in q.itertuples()}


def lossless_check(quality: pd.DataFrame) -> pd.DataFrame:
    """Lossless arms whose greedy output was not token-identical to the baseline on every request."""
    q = quality[quality.lossless & (quality.arm != BASELINE)]
    return q[q.exact_match < 1.0][["workload", "arm", "exact_match", "agreement"]]
