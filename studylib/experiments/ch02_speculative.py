"""Chapter 2 measurements: speculative decoding (distilled draft, self-speculation) and prompt lookup.

Every function returns a pandas DataFrame or a dict, so the notebook only calls and displays. Timing
is paired: for each prompt AR and every method run back to back in one process, and a method's
speedup is AR's seconds per token over the method's on the same prompt (for greedy decoding the
outputs are identical, so this is the wall-time ratio; at T=1 outputs differ, so per token is fair).

Method specs are strings so notebook parameters stay papermill-friendly:
``ar``; ``sps:<draft>@<gamma>`` (draft: distilled, distilled:full, self:auto, self:4-11, self:exit:K,
or a model name; gamma: an integer or ``adaptive``); ``pld@<gamma>,<ngram>`` (prompt lookup).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from studylib import plots
from studylib.bench.stats import estimate, ratio_estimate, rotated
from studylib.decoding import ar, prompt_lookup, speculative
from studylib.decoding.speculative import expected_tokens
from studylib.models import (
    LlamaModel,
    arithmetic,
)
from studylib.progress import progress_bar
from studylib.sampling import SamplingParams
from studylib.workbook import illustration as ill
from studylib.workbook.tables import CAPTION_KEY, span, why_not_measured

CHAPTER = 2

# Published numbers, printed beside ours (speedups are wall-clock over each paper's own AR baseline).
ANCHORS = [
    {"method": "SpS (draft model)", "source": "Spec-Bench (Xia et al. 2024)", "speedup": "1.79x", "alpha": "",
     "model": "Vicuna-7B + Vicuna-68M", "hardware": "1x A100, greedy"},
    {"method": "PLD (prompt lookup)", "source": "Spec-Bench (Xia et al. 2024)", "speedup": "1.64x", "alpha": "",
     "model": "Vicuna-7B", "hardware": "1x A100, greedy"},
    {"method": "Lookahead", "source": "Spec-Bench (Xia et al. 2024)", "speedup": "1.13x", "alpha": "",
     "model": "Vicuna-7B", "hardware": "1x A100, greedy"},
    {"method": "EAGLE-2", "source": "Spec-Bench (Xia et al. 2024)", "speedup": "2.19x", "alpha": "",
     "model": "Vicuna-7B", "hardware": "1x A100, greedy"},
    {"method": "SpS (draft model)", "source": "Leviathan et al. 2023", "speedup": "3.4x", "alpha": "0.75",
     "model": "T5-XXL 11B + T5-small", "hardware": "TPU-v4"},
    {"method": "PLD (prompt lookup)", "source": "Saxena 2023 (prompt-lookup-decoding)", "speedup": "2-4x",
     "alpha": "", "model": "Mistral-7B, input-grounded tasks", "hardware": "1x A100"},
]


# ------------------------------------------------------------------------------------------- workloads


@dataclass
class Prompt:
    id: str
    workload: str  # chat | xsum | humaneval
    category: str  # chat category, or the workload itself
    ids: list[int] = field(repr=False)


def load_prompts(tokenizer, n_chat: int, n_xsum: int, n_code: int, seed: int = 0,
                 max_chars: int = 1500, categories: Sequence[str] = ()) -> list[Prompt]:
    """``n_chat`` HELD-OUT chat prompts per category in ``categories`` (all when empty; no draft trained
    on them, and none chose the shipped head), ``n_xsum`` XSum articles and ``n_code`` HumanEval problems
    from the evaluation split (``data.in_draft_pool``: no draft ever trains on them)."""
    from studylib.data import CATEGORIES, _subsample, load_dataset, load_workload
    from studylib.data import load_prompts as chat_set
    from studylib.drafting.data import is_heldout
    from studylib.prompts import encode

    out = []
    for cat in categories or CATEGORIES:
        for rec in [r for r in chat_set(cat) if is_heldout(r.id)][:n_chat]:
            out.append(Prompt(rec.id, "chat", cat, encode(tokenizer, rec)))
    if n_xsum > 0:
        pool = load_dataset("xsum", max_chars=max_chars)
        for rec in _subsample(pool, n_xsum, seed, "xsum (the evaluation split)"):
            out.append(Prompt(rec.id, "xsum", "xsum", encode(tokenizer, rec)))
    if n_code > 0:
        for rec in load_workload("humaneval", n_code, seed, max_chars=max_chars):
            out.append(Prompt(rec.id, "humaneval", "humaneval", encode(tokenizer, rec, chat=rec.messages is not None)))
    return out


def prompt_table(prompts: Sequence[Prompt]) -> pd.DataFrame:
    df = pd.DataFrame([{"workload": p.workload, "category": p.category, "tokens": len(p.ids)} for p in prompts])
    return df.groupby(["workload", "category"], as_index=False, sort=False).agg(
        prompts=("tokens", "size"), mean_prompt_tokens=("tokens", "mean")).round(1)


def conditions_text(model: LlamaModel, max_new_tokens: int, temperature: float = 0.0) -> str:
    mode = "greedy" if temperature == 0 else f"T={temperature:g}"
    return (f"{model.config.name} ({arithmetic(model)}) on {model.device.type} "
            f"({os.cpu_count()} cores, {torch.get_num_threads()} threads); {mode}, {max_new_tokens} new tokens")


# ------------------------------------------------------------------------------------------- running


def parse_spec(spec: str) -> tuple[str, dict]:
    """'ar' | 'sps:<draft>@<gamma>' | 'pld@<gamma>,<ngram>' -> (family, options)."""
    head, _, arg = spec.rpartition("@") if "@" in spec else (spec, "", "")
    if head == "ar":
        return "ar", {}
    if head == "pld":
        g, _, n = arg.partition(",")
        return "prompt-lookup", {"gamma": int(g or 8), "ngram": int(n or 3)}
    if head.startswith("sps:"):
        return "speculative", {"draft": head[4:], "gamma": arg if arg == "adaptive" else int(arg or 4)}
    if head.partition(":")[0] in ("eagle", "eagle1", "eagle3") and head.partition(":")[2] in ("", "full"):
        parts = [int(x) for x in (arg or "5,4,16").split(",")]
        tree = (parts[0], 1, parts[0]) if len(parts) == 1 else tuple(parts)
        if len(tree) != 3:
            raise ValueError(f"bad EAGLE spec {spec!r}; use eagle@GAMMA (a chain) or eagle@DEPTH,TOPK,NODES")
        return "eagle", {"draft": head, "tree": tree}
    raise ValueError(f"unknown method spec {spec!r}; use ar, sps:<draft>@<gamma>, pld@<gamma>,<ngram>, "
                     "eagle@<gamma> or eagle@<depth>,<topk>,<nodes> (eagle1 / eagle3 for a recipe's head, "
                     "with :full for the whole LM head)")


class Runner:
    """Decodes prompts with method specs, resolving each draft once."""

    def __init__(self, model: LlamaModel, tok, draft_meta: dict | None = None, verify_cost=None):
        """verify_cost: relative cost of a target forward over 1, 2, ... tokens, for adaptive gamma."""
        self.model, self.tok, self.meta, self.drafters = model, tok, draft_meta, {}
        self.eagle_path: str | None = None  # the EAGLE head's directory (None: the default cache entry)
        self.verify_cost = None if verify_cost is None else [float(v) for v in verify_cost]

    def drafter(self, spec: str):
        from studylib.experiments.ch02_drafts import resolve

        if spec not in self.drafters:
            self.drafters[spec] = resolve(self.model, spec, self.meta)
        return self.drafters[spec]

    def eagle(self, spec: str):
        """The EAGLE drafter for ``eagle`` / ``eagle1`` / ``eagle3`` (``:full``): ``eagle.head_path``."""
        from studylib.decoding.eagle import resolve_eagle

        key = "eagle-head:" + spec
        if key not in self.drafters:
            # eagle_path stands for the chapter's head ("eagle"); a recipe's head (eagle1, eagle3) resolves by name
            name = spec.partition(":")[0]
            where = self.eagle_path + spec[len("eagle"):] if self.eagle_path is not None and name == "eagle" else spec
            self.drafters[key] = resolve_eagle(where, self.model)
        return self.drafters[key]

    def eagle_cost_ratio(self, spec: str) -> float:
        return self.eagle(spec).cost_ratio(self.model)

    def decode(self, spec: str, ids: list[int], max_new_tokens: int, sampling: SamplingParams):
        family, opts = parse_spec(spec)
        if family == "ar":
            return ar.generate(self.model, ids, max_new_tokens, sampling, tokenizer=self.tok)
        if family == "prompt-lookup":
            return prompt_lookup.generate(self.model, ids, max_new_tokens, sampling, tokenizer=self.tok, **opts)
        if family == "eagle":
            from studylib.decoding import eagle
            from studylib.decoding.eagle import TreeSpec

            return eagle.generate(self.model, ids, max_new_tokens, sampling, tokenizer=self.tok,
                                  draft=self.eagle(opts["draft"]), tree=TreeSpec(*opts["tree"]))
        adaptive = opts["gamma"] == "adaptive" and self.verify_cost is not None
        return speculative.generate(self.model, ids, max_new_tokens, sampling, tokenizer=self.tok,
                                    draft=self.drafter(opts["draft"]), gamma=opts["gamma"],
                                    gamma_max=min(8, len(self.verify_cost) - 1) if adaptive else 8,
                                    verify_cost=self.verify_cost if adaptive else None)


def run_methods(runner: Runner, prompts: Sequence[Prompt], specs: Sequence[str], max_new_tokens: int,
                temperature: float = 0.0, seed: int = 0, repeats: int = 1, keep_results: bool = False,
                show_progress: bool = True):
    """One row per (prompt, method, repeat); AR is the reference, the arms run in a rotating order.
    ``keep_results``: also return {spec: [GenerationResult, ...]} (for per-position acceptance)."""
    specs = ["ar", *[s for s in specs if s != "ar"]]
    if prompts:
        for s in specs:  # warm-up: first-call allocations and draft loading stay out of the timings
            runner.decode(s, prompts[0].ids[:16], 3, SamplingParams())
    rows, kept = [], {s: [] for s in specs}
    for i, p in enumerate(progress_bar(prompts, desc=f"ch02 T={temperature:g}", leave=False, progress=show_progress)):
        for r in range(repeats):
            # Arms interleaved: the order of the methods rotates from prompt to prompt (and repeat), so
            # drift in machine load falls on every arm alike; AR stays the reference whatever its turn.
            results = {}
            for s in rotated(specs, i + r):
                sampling = SamplingParams(temperature, seed=seed + r) if temperature > 0 else SamplingParams()
                results[s] = runner.decode(s, p.ids, max_new_tokens, sampling)
            ref = results["ar"].token_ids
            for s in specs:
                res = results[s]
                kept[s].append(res)
                x = _counts(res)
                rows.append({
                    "prompt": p.id, "workload": p.workload, "category": p.category, "method": s,
                    "family": parse_spec(s)[0], "repeat": r, "temperature": temperature,
                    "new_tokens": res.new_tokens, "wall_s": res.wall_s, "s_per_token": res.wall_s / res.new_tokens,
                    "decode_s": res.wall_s - res.ttft_s, "steps": res.steps, "target_forwards": res.target_forwards,
                    "tokens_per_step": res.tokens_per_step, "accepted": x.get("accepted", 0),
                    "proposed": x.get("proposed", 0),
                    "rejections": x.get("rejections", 0),
                    "draft_s": x.get("draft_s", 0.0), "verify_s": x.get("verify_s", 0.0),
                    "draft_forwards": x.get("draft_forwards", 0),
                    "mean_gamma": float(np.mean(x["gamma_trace"])) if x.get("gamma_trace") else 0.0,
                    "equal_to_ar": res.token_ids == ref,
                })
    return (pd.DataFrame(rows), kept) if keep_results else pd.DataFrame(rows)


def _counts(res) -> dict:
    """Acceptance counts in the chain decoders' terms. For a token tree (EAGLE): accepted = drafted
    tokens committed, proposed = tree nodes verified, a rejection = a step whose path stopped before
    the tree's depth (so alpha is the per-depth continuation rate of the accepted path)."""
    x = res.extra
    if "accepted_depths" not in x:
        return x
    depth, _, nodes = x["tree"]
    hist = x["accepted_depths"]
    return {**x, "accepted": sum(d * c for d, c in enumerate(hist)), "proposed": nodes * res.steps,
            "rejections": sum(hist[:depth]), "gamma_trace": [depth] * res.steps}


# ------------------------------------------------------------------------------------------- summaries


NO_DRAFT = ("plain decoding (AR) drafts nothing, and a method that proposed no draft token on these prompts "
            "has nothing to accept or reject")


def _alpha(g: pd.DataFrame) -> float:
    """Pooled per-token acceptance MLE: accepted / (accepted + rejections) (truncated-geometric model)."""
    n = g.accepted.sum() + g.rejections.sum()
    return float(g.accepted.sum() / n) if n else float("nan")


def summarise(df: pd.DataFrame, by: str = "category", confidence: float = 0.95) -> pd.DataFrame:
    """Per (``by``, method): paired speedup over AR with a CI at ``confidence`` (95% for the tables; the
    decision's corrected level in ``c3_verdicts``), mean tokens per target step, alpha, acceptance rate
    (accepted / proposed) and the exact-match rate against AR. ``by="all"``: one group."""
    if by == "all":
        df = df.assign(all="all")
    pp = df.groupby([by, "prompt", "method"], as_index=False, sort=False).agg(
        s_per_token=("s_per_token", "median"), tokens_per_step=("tokens_per_step", "mean"),
        accepted=("accepted", "sum"), rejections=("rejections", "sum"), proposed=("proposed", "sum"),
        equal_to_ar=("equal_to_ar", "mean"), mean_gamma=("mean_gamma", "mean"))
    rows = []
    for key, g in pp.groupby(by, sort=False):
        base = g[g.method == "ar"].set_index("prompt")
        for m, gm in g.groupby("method", sort=False):
            gm = gm.set_index("prompt").loc[base.index]
            sp = ratio_estimate(base.s_per_token.values, gm.s_per_token.values, confidence=confidence)
            tps = estimate(gm.tokens_per_step, np.mean, confidence=confidence)  # the mean shown beside it
            rows.append({
                by: key, "method": m, "prompts": len(gm), "speedup": sp.value, "speedup_lo": sp.ci_low,
                "speedup_hi": sp.ci_high, "tokens_per_step": float(gm.tokens_per_step.mean()),
                "tokens_per_step_lo": tps.ci_low, "tokens_per_step_hi": tps.ci_high,
                "tokens_per_step_mc": tps.mc_error, "tokens_per_step_method": tps.method, "alpha": _alpha(gm),
                "accept_rate": float(gm.accepted.sum() / gm.proposed.sum()) if gm.proposed.sum() else float("nan"),
                "exact_match": float(gm.equal_to_ar.mean()), "mean_gamma": float(gm.mean_gamma.mean()),
            })
    return why_not_measured(pd.DataFrame(rows), alpha=NO_DRAFT, accept_rate=NO_DRAFT)


def specbench_table(df: pd.DataFrame) -> pd.DataFrame:
    """Spec-Bench layout: one row per method, speedup per category, then overall speedup [CI], mean
    accepted tokens per step (tau), alpha and exact match."""
    per_cat = summarise(df, "category")
    overall = summarise(df, "all").set_index("method")
    wide = per_cat.pivot(index="method", columns="category", values="speedup")
    wide = wide[[c for c in dict.fromkeys(per_cat.category)]].round(2)
    wide.columns = [f"{c} x" for c in wide.columns]
    wide["overall x [95% CI]"] = [f"{overall.speedup[m]:.2f} [{overall.speedup_lo[m]:.2f}, {overall.speedup_hi[m]:.2f}]"
                                  for m in wide.index]
    wide["tau (tokens/step)"] = overall.tokens_per_step.reindex(wide.index).round(2)
    wide["alpha"] = overall.alpha.reindex(wide.index).round(3)
    wide["exact match vs AR"] = overall.exact_match.reindex(wide.index).round(3)
    order = [m for m in dict.fromkeys(df.method)]
    out = why_not_measured(wide.loc[order].reset_index(), alpha=NO_DRAFT)
    per = df.groupby("category").prompt.nunique()
    if len(per) > 1 and ill.is_illustration(per.min()):
        # The overall column rests on every prompt; a category's column on its own few.
        few = ill.units(per.min()) if per.min() == per.max() else f"{per.min()}-{per.max()} prompts"
        out.attrs[CAPTION_KEY] = (f"Per-category columns: illustrations (n = {few} each): too few to "
                                  f"conclude, no CI is shown; the overall CI rests on {df.prompt.nunique()} prompts")
    return out


# ------------------------------------------------------------------------------------------- theory


def gamma_sweep(runner: Runner, prompts: Sequence[Prompt], draft: str, gammas: Sequence[int],
                max_new_tokens: int, temperature: float = 0.0) -> pd.DataFrame:
    """Leviathan et al. Table 4 style: per gamma, measured alpha, tokens per step and speedup beside
    the theory (1 - a^(g+1)) / (1 - a) and the predicted speedup with measured costs. Below
    ``MIN_UNITS`` prompts the sweep is an illustration (``studylib.workbook.illustration``): no CI columns.

    Costs are measured in the same runs, relative to one AR decode step t_ar: c = draft forward / t_ar and
    v(g) = verify forward of g + 1 tokens / t_ar. Leviathan's model assumes v = 1 (verification as cheap
    as one step, true on a memory-bound accelerator); on a CPU v grows with g, so we show both."""
    # "eagle": the EAGLE head's chain (a tree of top-1 children), else a draft model's speculative decoding
    specs = [f"eagle@{g}" if draft == "eagle" else f"sps:{draft}@{g}" for g in gammas]
    df = run_methods(runner, prompts, specs, max_new_tokens, temperature)
    ar_rows = df[df.method == "ar"].set_index("prompt")
    t_ar = float((ar_rows.decode_s / (ar_rows.new_tokens - 1).clip(lower=1)).median())
    rows = []
    for g, spec in zip(gammas, specs, strict=True):
        d = df[df.method == spec]
        a = _alpha(d)
        c = float(d.draft_s.sum() / max(d.draft_forwards.sum(), 1)) / t_ar
        v = float(d.verify_s.sum() / max(d.steps.sum(), 1)) / t_ar
        sp = ratio_estimate(ar_rows.loc[d.prompt].s_per_token.values, d.s_per_token.values)
        rows.append({
            "gamma": g, "prompts": int(d.prompt.nunique()), "alpha": a, "tokens_per_step": float(d.accepted.sum() + d.steps.sum()) / max(d.steps.sum(), 1),
            "theory_tokens_per_step": expected_tokens(a, g), "c": c, "v": v,
            "predicted_speedup_leviathan": expected_tokens(a, g) / (1 + g * c),
            "predicted_speedup_measured_v": expected_tokens(a, g) / (g * c + v),
            "speedup": sp.value, "speedup_lo": sp.ci_low, "speedup_hi": sp.ci_high,
        })
    return ill.illustration(pd.DataFrame(rows), len(prompts), "prompts")


def theory_long(sweep: pd.DataFrame) -> pd.DataFrame:
    """The sweep in long form for one seaborn line plot: measured vs the two predictions."""
    cols = {"speedup": "measured", "predicted_speedup_leviathan": "predicted (v = 1, Leviathan)",
            "predicted_speedup_measured_v": "predicted (measured v)"}
    return sweep.melt(id_vars="gamma", value_vars=list(cols), var_name="series", value_name="x AR").replace(
        {"series": cols})


# ------------------------------------------------------------------------------------------- verdicts


def anchors_frame(summary_all: pd.DataFrame | None = None, model: str = "", hardware: str = "") -> pd.DataFrame:
    """Published anchors followed by our overall greedy numbers (from ``summarise(df, "all")``)."""
    rows = list(ANCHORS)
    if summary_all is not None:
        for r in summary_all[summary_all.method != "ar"].itertuples():
            rows.append({"method": r.method, "source": "this study (measured)",
                         "speedup": f"{r.speedup:.2f}x [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]",
                         "alpha": "" if np.isnan(r.alpha) else f"{r.alpha:.2f}", "model": model, "hardware": hardware})
    return pd.DataFrame(rows)


def _n(r) -> int | None:
    n = getattr(r, "prompts", None)
    return None if n is None or pd.isna(n) else int(n)


def performance_aim(by_workload: pd.DataFrame, pld: str, sps: str | None, peers: pd.DataFrame | None = None
                    ) -> pd.DataFrame:
    """The study's performance targets, measured, not asserted: PLD >= 2x AR on XSum; the distilled draft >= 1.5x AR on
    chat; both faster than the HF peer configured the same way (from ``hf_peer_summary``). A target read off fewer
    than ``MIN_UNITS`` prompts is an illustration: its row shows the value, no CI, and "met" is left empty."""
    rows = []
    for method, workload, target in ((pld, "xsum", 2.0), *(((sps, "chat", 1.5),) if sps else ())):
        r = by_workload[(by_workload.method == method) & (by_workload.workload == workload)]
        if len(r):
            r = r.iloc[0]
            rows.append(ill.aim_row(f"{method} on {workload} >= {target}x our AR", r.speedup, r.speedup_lo,
                                    r.speedup_hi, target, _n(r)))
    if peers is not None and len(peers):
        for r in peers.itertuples():
            rows.append(ill.aim_row(f"{r.ours} faster than {r.peer}", r.ours_over_peer, getattr(r, "lo", None),
                                    getattr(r, "hi", None), 1.0, _n(r), strict=True))
    return aims_table(pd.DataFrame(rows))


def aims_table(*frames: pd.DataFrame) -> pd.DataFrame:
    """Aim rows of several frames in one table; when a row is not judged (an illustration), the note says why."""
    out = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else \
        pd.DataFrame(columns=["aim", "measured", "ci", "met"])
    return why_not_measured(out, met=ill.NOT_JUDGED) if out.met.isna().any() else out


def speed_over_runs(runs, temperature: float, workloads=None, confidence: float = 0.95) -> dict:
    """Per workload, the headline's speed-up at ``temperature`` over whole runs (t on the log of the runs),
    each CI at ``confidence``. ``workloads``: the main run's; one the runs did not measure stays a
    condition without a CI."""
    from studylib.bench.stats import no_ci

    key = f"speedup:T{temperature:g}:"
    found = {m.removeprefix(key): runs.estimate(m, confidence) for m in runs.metrics() if m.startswith(key)}
    for w in workloads or ():
        found.setdefault(w, no_ci(confidence=confidence))
    return found


def c3_confidence() -> tuple[float, int]:
    """The level of every C3 CI in this chapter and how many conditions it is corrected for: Bonferroni
    over the workloads C3@2 declares, since any one clearing would carry a part."""
    from studylib.decisions import level

    return level("C3", CHAPTER)


def c3_verdicts(by_workload: pd.DataFrame, headline: str, sampling: pd.DataFrame | None,
                conditions: str, t1: pd.DataFrame | None = None, runs=None, greedy: pd.DataFrame | None = None,
                sampled: pd.DataFrame | None = None) -> list:
    """C3 from this chapter: one decision over its parts, all needed at once for the ``headline`` method
    (declared before the run, not picked after it): greedy exactness of every method (all or nothing);
    the sampling distribution unchanged, with a known-wrong sampler rejected (all or nothing); tokens per
    target forward >= 1.1 and a wall-clock speedup > 1 per workload (CI over prompts), at T=0 and, when
    given, at T=1.

    The workloads are a family (any one clearing carries a part): given the per-prompt rows (``greedy``,
    and ``sampled`` for T=1), every CI is recomputed at the Bonferroni level for the declared workloads
    (``c3_confidence``), the speed-ups over ``runs`` too, and the rows record ``tried``; without them the
    rows are judged at the level ``by_workload`` carries and say they are uncorrected."""
    from studylib.claims import decide_parts, judge_at_least, judge_checks

    confidence, k = c3_confidence()
    corrected = k > 1 and greedy is not None and (t1 is None or sampled is not None)
    if corrected:
        by_workload = summarise(greedy, "workload", confidence)
        t1 = summarise(sampled, "workload", confidence) if t1 is not None else None
    else:
        confidence = 0.95
    tried = k if corrected else None
    family = (f"each CI at {confidence:.2%}, Bonferroni over the {k} declared workloads" if corrected else
              f"CIs at 95%, not corrected for the {k} workloads (no per-prompt rows given)" if k > 1 else "")
    conditions_c = "; ".join(x for x in (conditions, family) if x)

    s = by_workload[by_workload.method != "ar"]
    exact = {f"{r.method} on {r.workload} ({r.prompts} prompts)": r.exact_match == 1.0 for r in s.itertuples()}
    # the units are prompts: each method was compared with AR on every prompt of every workload, and the
    # fewest prompts any method saw is the n (one differing prompt anywhere decides "does not hold")
    per_method = s.groupby("method")["prompts"].sum()
    parts = [judge_checks("C3", "greedy output token-identical to AR (every method, prompt)", exact,
                          "lossless (\"without losing coherence\")", conditions, CHAPTER,
                          n=int(per_method.min()) if len(per_method) else 0, unit="prompts")]
    if sampling is not None and len(sampling):
        checks = {f"{r.sampler}: {'rejected' if r.expect_reject else 'accepted'} as expected": r.as_expected
                  for r in sampling.itertuples()}
        parts.append(judge_checks("C3", "sampling distribution unchanged (chi-square + TV, tiny-vocab model)",
                                  checks, "unchanged distribution",
                                  conditions + "; known-wrong samplers included to show power", CHAPTER))
    m = s[s.method == headline]

    def per_workload(df, col):
        return {r.workload: (getattr(r, col), getattr(r, col + "_lo"), getattr(r, col + "_hi"), r.prompts)
                for r in df.itertuples()}

    tps = {r.workload: {"value": r.tokens_per_step, "ci_low": r.tokens_per_step_lo, "ci_high": r.tokens_per_step_hi,
                        "n": r.prompts, "mc_error": getattr(r, "tokens_per_step_mc", 0.0),
                        "method": getattr(r, "tokens_per_step_method", None)} for r in m.itertuples()}
    parts.append(judge_at_least("C3", f"tokens per target forward, {headline}", tps,
                                1.1, "several tokens per forward pass (> 1; bar 1.1)", conditions_c, CHAPTER,
                                confidence=confidence, tried=tried))
    # The speed-ups are machine-level numbers: judged over whole runs (``runs``, t on the log of the run
    # medians), the main run's prompt-level CIs shown beside them; without runs they count no repeats.
    def beside(df) -> str:
        return "in this page's main run, over prompts (BCa; shown, not deciding): " + "; ".join(
            f"{w} {v:.3g} [{lo:.3g}, {hi:.3g}]" for w, (v, lo, hi, _) in per_workload(df, "speedup").items())

    note = f"{len(runs.runs)} whole runs (fresh processes, engine and head reloaded)" if runs is not None else ""
    speed0 = (speed_over_runs(runs, 0.0, list(m.workload), confidence) if runs is not None
              else per_workload(m, "speedup"))
    parts.append(judge_at_least("C3", f"wall-clock speedup over AR, {headline}, T=0", speed0, 1.0, "faster than AR",
                                "; ".join(x for x in (conditions, note, beside(m) if runs is not None else "", family)
                                          if x), CHAPTER, unit="whole runs", confidence=confidence, tried=tried))
    if t1 is not None:
        m1 = t1[t1.method == headline]
        if len(m1):
            speed1 = (speed_over_runs(runs, 1.0, list(m1.workload), confidence) if runs is not None
                      else per_workload(m1, "speedup"))
            cond1 = conditions.replace("greedy", "T=1")
            parts.append(judge_at_least("C3", f"wall-clock speedup over AR, {headline}, T=1", speed1, 1.0,
                                        "faster than AR",
                                        "; ".join(x for x in (cond1, note, beside(m1) if runs is not None else "",
                                                              family) if x), CHAPTER, unit="whole runs",
                                        confidence=confidence, tried=tried))
    return decide_parts("C3", f"parallel decoding, lossless and faster ({headline})", parts,
                        "lossless, several tokens per forward, faster than AR", conditions, CHAPTER)


# ------------------------------------------------------------------------------------------- prose


def explain_runs(runs, headline: str) -> str:
    """The speed-ups over whole runs, per temperature and workload, in one paragraph."""
    parts = []
    for temp in (0.0, 1.0):
        est = speed_over_runs(runs, temp)
        if est:
            cells = "; ".join(f"{w} {e.value:.2f}x [{e.ci_low:.2f}, {e.ci_high:.2f}]" for w, e in est.items())
            parts.append(f"at T = {temp:g}: {cells}")
    return (f"Over {len(runs.runs)} whole runs (fresh processes, the engine and the head reloaded), {headline} runs "
            f"{'; '.join(parts)} of AR's speed (95% CIs, t on the log of the run medians). The verdict judges the same runs at "
            "its corrected level with the declared drift between cold runs, so its CIs (in the verdict table) are "
            "wider; the tables above give one run's CIs over prompts, which cannot see how runs differ.")


def speedup_figure(summary: pd.DataFrame, by: str = "workload", title: str = "Speedup over our AR decoder"):
    """Grouped bars of the speedup per ``by`` and method, with the bootstrap 95% CI as error bars."""
    import matplotlib.pyplot as plt

    s = summary[summary.method != "ar"]
    groups, methods = list(dict.fromkeys(s[by])), list(dict.fromkeys(s.method))
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=plots.FIGSIZE)
    pal = plots.palette(methods)  # every method its own colour, even two unknown names hashing alike
    for j, m in enumerate(methods):
        d = s[s.method == m].set_index(by).reindex(groups)
        x = np.arange(len(groups)) - 0.4 + width * (j + 0.5)
        ax.bar(x, d.speedup, width, label=m, color=pal[m])
        ax.errorbar(x, d.speedup, yerr=[d.speedup - d.speedup_lo, d.speedup_hi - d.speedup], fmt="none",
                    ecolor="black", capsize=2, lw=0.8)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set(title=title, ylabel="x AR (per token)", xlabel=by)
    ax.legend(fontsize="small", ncol=2)
    return plots.tidy(ax)


def _best(summary: pd.DataFrame, workload: str) -> pd.Series | None:
    s = summary[(summary.workload == workload) & (summary.method != "ar")]
    return s.loc[s.speedup.idxmax()] if len(s) else None


def explain_greedy(by_workload: pd.DataFrame, headline: str, pld: str) -> str:
    """One paragraph read off the numbers, true whatever they are."""
    lines = []
    exact = by_workload[by_workload.method != "ar"].exact_match
    lines.append(f"Every method reproduced AR's greedy output on {exact.eq(1.0).sum()} of {len(exact)} "
                 "(method, workload) cells" + (" (all of them)." if exact.eq(1.0).all() else
                                                 "; any cell below 1.0 is a bug to investigate."))
    for w in dict.fromkeys(by_workload.workload):
        b = _best(by_workload, w)
        n = int(by_workload[by_workload.workload == w].prompts.min())
        if b is not None and ill.is_illustration(n):
            s = by_workload[(by_workload.workload == w) & (by_workload.method != "ar")]
            lines.append(f"On {w}, {ill.sentence(n)}, the methods ran at {s.speedup.min():.2f}-"
                         f"{s.speedup.max():.2f}x AR.")
        elif b is not None:
            verdict = "faster than" if b.speedup_lo > 1 else ("not clearly different from" if b.speedup_hi >= 1
                                                             else "slower than")
            lines.append(f"On {w} the best method is {b.method} at {b.speedup:.2f}x "
                         f"[{b.speedup_lo:.2f}, {b.speedup_hi:.2f}], {verdict} AR, with {b.tokens_per_step:.2f} "
                         "tokens per target step.")
    p = by_workload[by_workload.method == pld]
    if len(p) and not ill.is_illustration(int(p.prompts.min())):
        hi = p.loc[p.tokens_per_step.idxmax()]
        lines.append(f"Prompt lookup commits most per step on {hi.workload} ({hi.tokens_per_step:.2f} tokens), "
                     "where the output copies the input.")
    return " ".join(lines)


def _sweep_n(sweep: pd.DataFrame) -> int | None:
    """The prompts the gamma sweep ran on (None for a frame without the column)."""
    return int(sweep.prompts.min()) if "prompts" in sweep and len(sweep) else None


def explain_sweep(sweep: pd.DataFrame) -> str:
    n = _sweep_n(sweep)
    if n is not None and ill.is_illustration(n):
        return (f"The gamma sweep is {ill.sentence(n)}: the table shows what was measured on "
                f"{'that prompt' if n == 1 else 'those prompts'}, beside the theory, and no gamma or prediction is "
                "picked from it.")
    best = sweep.loc[sweep.speedup.idxmax()]
    gap = (sweep.tokens_per_step - sweep.theory_tokens_per_step).abs().max()
    lev = (sweep.predicted_speedup_leviathan - sweep.speedup).abs().mean()
    mv = (sweep.predicted_speedup_measured_v - sweep.speedup).abs().mean()
    closer = "the measured-v prediction" if mv < lev else "Leviathan's v = 1 prediction"
    return (f"The measured speedup peaks at gamma = {int(best.gamma)} ({best.speedup:.2f}x). Measured tokens per "
            f"step stay within {gap:.2f} of (1 - a^(g+1)) / (1 - a) at the measured alpha. The draft costs "
            f"c = {sweep.c.median():.2f} of an AR step per forward of the chain, which drafts one token (a tree's "
            f"forwards below draft several nodes at once, so the tree table's c is its own), and verifying costs "
            f"v = {span(sweep.v.min(), sweep.v.max(), '.2f')} "
            f"steps; {closer} is closer to what we measured (mean absolute error {min(lev, mv):.2f} vs "
            f"{max(lev, mv):.2f}), because on this CPU verifying gamma + 1 tokens is not free.")


def explain_aims(aims: pd.DataFrame, sweep: pd.DataFrame | None = None) -> str:
    if aims.empty:
        return "No aim could be evaluated with this profile's workloads."
    judged = aims[aims.met.notna()]
    met = judged[judged.met.astype(bool)]
    missed = judged[~judged.met.astype(bool)]
    if judged.empty:
        return (f"No aim is judged: all {len(aims)} are illustrations on too few prompts to conclude (the table "
                "gives n).")
    text = f"{len(met)} of {len(judged)} of this chapter's performance targets met."
    if len(judged) < len(aims):
        text += (f" {len(aims) - len(judged)} more {'is' if len(aims) - len(judged) == 1 else 'are'} not judged: "
                 "illustrations on too few prompts to conclude (the table gives n).")
    if len(missed):
        text += (" Missed: " + "; ".join(f"{r.aim} (measured {r.measured:.2f} {r.ci})" for r in missed.itertuples())
                 + ".")
        n = None if sweep is None else _sweep_n(sweep)
        if sweep is not None and len(sweep) and not (n is not None and ill.is_illustration(n)):
            text += (f" The gamma sweep shows where the gain goes on this machine: a draft forward costs "
                     f"c = {sweep.c.median():.2f} AR steps and verifying gamma + 1 tokens v = {sweep.v.min():.2f}-"
                     f"{sweep.v.max():.2f} steps (Leviathan's analysis assumes v = 1), against "
                     f"{sweep.tokens_per_step.max():.2f} tokens per step at best.")
    return text
