"""Chapter 1, the decode step against the bytes it moves: the same model in several weight formats.

If a batch-1 decode step is bound by reading its weights, its time follows the bytes it reads: halve
the bytes (8-bit, 4-bit blocks) and the step should take about half as long. A step bound by fixed
costs (kernel launches, Python, attention over a short cache) does not shrink with the bytes. So for
each prompt every format decodes the same tokens (formats rotated per prompt), and a line
``seconds = fixed + bytes / bandwidth`` is fitted across the formats: the share of a step that scales
with the bytes, ``bytes / bandwidth / seconds``, is what the claim's "memory-bound" means, measured.
A batch-4 / batch-1 ratio cannot tell the two apart (a step of fixed overhead is also cheap to batch).

The same runs give each engine's achieved fraction of the measured bandwidth (C2, reported per engine;
the decision is taken on the study's fastest faithful engine: one that computes the model's own
weights exactly, the widened fp32 copy or the GGUF's own blocks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from studylib.bench.stats import N_RESAMPLES, Estimate, bca_bounds, rotated
from studylib.decoding import ar
from studylib.progress import progress_bar

# The engines: the name shown, the weights format and whether dense fp32 takes the fused small-step path.
# gguf needs the embedded model's file; q4_1 (and its int8 / bf16 arithmetics) serve any model, random
# weights at real shapes included (the sweeps across model sizes).
ENGINES = {"dense per-op": ("dense", False), "dense fused": ("dense", True), "q8_0": ("q8_0", True),
           "gguf": ("gguf", True), "q4_0": ("q4_0", True), "q4_1": ("q4_1", True), "gguf int8": ("gguf", True),
           "gguf bf16": ("gguf", True), "q4_1 int8": ("q4_1", True), "q4_1 bf16": ("q4_1", True)}
# Engines that change the activations' arithmetic (--act): neither faithful nor in the bytes fit.
ENGINE_ACT = {"gguf int8": "int8", "gguf bf16": "bf16", "q4_1 int8": "int8", "q4_1 bf16": "bf16"}
# Engines that compute with the model's own weights bit for bit (the file is Q4_1 blocks; dense is
# those blocks widened to fp32): only these may decide C2, since a format that changes the weights
# changes the model.
FAITHFUL = ("dense per-op", "dense fused", "gguf")
# The formats of the bytes fit share one engine path (the fused small-step kernels), so the fit
# compares bytes, not code paths.
FIT = ("dense fused", "q8_0", "gguf", "q4_1", "q4_0")


def load_engines(model_name: str, engines: Sequence[str], device: str = "cpu", progress: bool = True,
                 base=None) -> dict:
    """Each engine of ``engines`` loaded. ``base``: ``model_name`` already loaded dense in fp32; each engine
    is then made from its weights (``models.sibling``) instead of loading the model again, so the formats
    side by side cost their own bytes only. The GGUF engine reads its own file either way."""
    from studylib.errors import StudylibError
    from studylib.models import from_loaded, load_model

    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise StudylibError(f"unknown engine(s) {unknown}; choose from {list(ENGINES)}.")
    out = {}
    for name in progress_bar(list(engines), desc="loading formats", progress=progress):
        weights, fused = ENGINES[name]
        act = ENGINE_ACT.get(name, "fp32")
        m = from_loaded(base, model_name, device, "float32", weights, act)
        if m is None:
            m, _ = load_model(model_name, device, "float32", weights=weights, act=act)
        if fused and weights == "dense":
            m.fused_decode = True
        out[name] = m
    return out


def step_bytes(model, context: float) -> float:
    """Bytes one batch-1 decode step reads at ``context`` tokens: every linear weight (block formats at
    their stored size) plus the KV cache read and the new token's KV written."""
    from studylib.models.weights import weight_bytes

    return float(weight_bytes(model)) + (context + 1) * model.config.kv_bytes_per_token(4)


def format_runs(models: Mapping[str, object], prompts: Sequence[Sequence[int]], new_tokens: int,
                progress: bool = True) -> pd.DataFrame:
    """Every prompt decoded greedily by every engine (engines rotated per prompt): seconds per decode step
    (the prefill excluded) and the bytes that step reads at the run's mean context."""
    rows = []
    for i, ids in progress_bar(list(enumerate(prompts)), desc="step vs bytes", progress=progress):
        for name in rotated(list(models), i):
            r = ar.generate(models[name], list(ids), new_tokens)
            steps = max(r.new_tokens - 1, 1)
            rows.append({"engine": name, "prompt": i, "step_s": (r.wall_s - r.ttft_s) / steps,
                         "mbytes_per_step": step_bytes(models[name], len(ids) + r.new_tokens / 2) / 1e6,
                         "tokens": list(r.token_ids)})
    return pd.DataFrame(rows)


def _fit(table: pd.DataFrame) -> tuple[float, float, float]:
    """Least squares seconds = fixed + slope * bytes over the engines in ``table`` (one row each):
    (fixed seconds, seconds per byte, R^2)."""
    x, y = table["mbytes_per_step"].to_numpy() * 1e6, table["step_s"].to_numpy()
    slope, fixed = np.polyfit(x, y, 1)
    pred = fixed + slope * x
    ss = float(((y - y.mean()) ** 2).sum())
    return float(fixed), float(slope), 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else float("nan")


def _per_prompt(runs: pd.DataFrame, engines: Sequence[str]) -> pd.DataFrame:
    wide = runs[runs.engine.isin(engines)].pivot(index="prompt", columns="engine", values="step_s")
    return wide[list(engines)].dropna()


def bytes_share(runs: pd.DataFrame, at: str = "gguf", engines: Sequence[str] = FIT, n_boot: int = N_RESAMPLES,
                seed: int = 0) -> dict:
    """The share of ``at``'s step that scales with the bytes it reads, from the fit across ``engines``.

    The fit uses each engine's median step over prompts; the CI resamples prompts (each prompt ran every
    engine), refitting each time. A share near 1 says the step is memory-bound; near 0, that fixed costs
    dominate. Also the fit's R^2 and the bandwidth its slope implies."""
    engines = [e for e in engines if e in set(runs.engine)]
    if at not in engines or len(engines) < 3:
        # No fit without 3 formats on one path (block formats run on CPU only): the part then has no CI
        # and the rule cannot decide it, which the row says.
        nan = float("nan")
        return {"at": at, "engines": engines, "estimate": Estimate(nan, nan, nan, 0, []), "r2": nan,
                "implied_gbs": nan, "reason": f"the fit needs {at} and at least 3 formats on one engine path; "
                                              f"this run has {', '.join(engines) or 'none'}"}
    mb = runs.groupby("engine")["mbytes_per_step"].median()
    steps = _per_prompt(runs, engines)

    def share(sample: pd.DataFrame) -> tuple[float, float, float]:
        t = pd.DataFrame({"step_s": sample.median(axis=0), "mbytes_per_step": mb[engines].to_numpy()},
                         index=engines)
        fixed, slope, r2 = _fit(t)
        return slope * mb[at] * 1e6 / t.loc[at, "step_s"], r2, (1 / slope / 1e9 if slope > 0 else float("nan"))

    point, r2, gbs = share(steps)
    rng = np.random.default_rng(seed)
    n = len(steps)
    if n >= 3:
        boots = np.array([share(steps.iloc[rng.integers(0, n, n)])[0] for _ in range(n_boot)])
        jack = np.array([share(steps.drop(steps.index[i]))[0] for i in range(n)])
        lo, hi, mc = bca_bounds(float(point), boots, jack)
    else:
        lo = hi = mc = float("nan")
    return {"at": at, "engines": engines, "estimate": Estimate(float(point), float(lo), float(hi), n, [], mc_error=mc,
                                                               method=f"BCa bootstrap over prompts, {n_boot:,} refits"),
            "r2": r2, "implied_gbs": gbs}


def fraction_by_engine(runs: pd.DataFrame, bandwidth_gbs: float) -> pd.DataFrame:
    """Per engine: median step, tok/s, bytes per step and the achieved fraction of the measured bandwidth
    (bytes / step / bandwidth, CI over prompts), and whether it computes the model's own weights."""
    from studylib.bench.stats import estimate

    rows = []
    for name, g in runs.groupby("engine", sort=False):
        frac = estimate((g["mbytes_per_step"] * 1e6 / g["step_s"] / 1e9 / bandwidth_gbs).to_numpy())
        rows.append({"engine": name, "faithful": name in FAITHFUL, "step_ms": float(g["step_s"].median() * 1e3),
                     "tok_s": float(1 / g["step_s"].median()), "mbytes_per_step": float(g["mbytes_per_step"].median()),
                     "bandwidth_fraction": frac.value, "bandwidth_fraction_low": frac.ci_low,
                     "bandwidth_fraction_high": frac.ci_high, "n": frac.n, "estimate": frac})
    return pd.DataFrame(rows)


def fastest_faithful(by_engine: pd.DataFrame) -> pd.Series:
    """The decisive engine for C2, by the rule declared before the run: the faithful engine with the most
    tokens per second in this run."""
    faithful = by_engine[by_engine["faithful"]]
    return faithful.sort_values("tok_s", ascending=False).iloc[0]


def explain(share: dict, by_engine: pd.DataFrame, decisive: pd.Series) -> str:
    e = share["estimate"]
    if share.get("reason"):
        return f"No bytes fit: {share['reason']}."
    rows = "; ".join(f"{r.engine} {r.bandwidth_fraction:.2f} of the bandwidth at {r.tok_s:.0f} tok/s"
                     for r in by_engine.itertuples())
    return (f"Across {len(share['engines'])} weight formats on one engine path, a batch-1 step's time follows "
            f"the bytes it reads with R² = {share['r2']:.3f}; the fit's slope is a bandwidth of "
            f"{share['implied_gbs']:.1f} GB/s. The share of a {share['at']} step that scales with its bytes is "
            f"{e.value:.2f} (95% CI {e.ci_low:.2f}-{e.ci_high:.2f}, n = {e.n} prompts); the rest is fixed cost "
            f"per step. Per engine, in this run (one process, of the bandwidth probed at its start): {rows}. C2 is "
            f"decided on the fastest engine that computes the model's own weights, {decisive.engine}, over the whole "
            f"runs below, so its value there differs a little from this run's.")


# ------------------------------------------------------------------------------ whole runs

def timing_run(model: str, engines: Sequence[str], prompts: int, new_tokens: int, bandwidth_gbs: float,
               device: str = "cpu", at: str = "gguf", **_) -> dict:
    """Chapter 1's timing section as one whole run (``studylib.bench.whole_runs``): in a fresh process,
    load the model and every engine, decode ``prompts`` chat prompts with each (engines rotated per
    prompt) and return this run's numbers: the bytes share at ``at`` (the fit across the formats on one
    engine path) and, per engine, its median tokens/s and achieved fraction of ``bandwidth_gbs`` (the
    bandwidth this same process measured just before)."""
    from studylib.bench.ar_bench import default_prompts
    from studylib.models import load_model
    from studylib.prompts import encode

    base, tok = load_model(model, device, "float32")
    models = load_engines(model, engines, device, progress=False, base=base)
    runs = format_runs(models, [encode(tok, r) for r in default_prompts(prompts)], new_tokens, progress=False)
    share = float(bytes_share(runs, at=at, n_boot=0)["estimate"].value)
    out = {"bytes_share": share} if np.isfinite(share) else {}  # no fit without 3 formats on one path
    for name, g in runs.groupby("engine", sort=False):
        out[f"tok_s:{name}"] = float(1 / g["step_s"].median())
        out[f"bandwidth_fraction:{name}"] = float((g["mbytes_per_step"] * 1e6 / g["step_s"] / 1e9 / bandwidth_gbs).median())
    return out


def fastest_faithful_over_runs(runs) -> str:
    """The decisive engine for C2 by the declared rule, over whole runs: the faithful engine with the
    most tokens per second (the geometric mean of its runs)."""
    faithful = [m.removeprefix("tok_s:") for m in runs.metrics() if m.startswith("tok_s:")
                and m.removeprefix("tok_s:") in FAITHFUL]
    if not faithful:
        raise ValueError("the whole runs measured no faithful engine (dense per-op, dense fused or gguf)")
    return max(faithful, key=lambda e: runs.estimate(f"tok_s:{e}").value)


def explain_runs(runs, engine: str) -> str:
    """The whole runs in one sentence: how many, the bytes share and the decisive engine's fraction of
    the bandwidth with their CIs over runs, and how far the runs spread."""
    share, frac = runs.get("bytes_share"), runs.estimate(f"bandwidth_fraction:{engine}")
    bws = [r["bandwidth_gbs"] for r in runs.runs]

    def ci(e) -> str:
        return f"{e.value:.3f} [{e.ci_low:.3f}, {e.ci_high:.3f}] (runs ranged {min(e.samples):.3f}-{max(e.samples):.3f})"

    shared = (f"the share of a step that scales with its bytes is {ci(share)} and " if share is not None else
              "no bytes fit was possible (fewer than 3 formats on one engine path), and ")
    return (f"The decisions rest on {len(runs.runs)} whole runs: fresh processes, each reloading the model and "
            f"every engine and measuring the read bandwidth again ({min(bws):.1f}-{max(bws):.1f} GB/s across "
            f"them). Over the runs, {shared}{engine} moves {ci(frac)} of the bandwidth its run measured (95% CIs, "
            "t on the log of the run values). A CI over the prompts of one run cannot see this spread, so it is "
            "shown, not used. The main run's values above differ from these because that one process divides by "
            "its own bandwidth probe and times its own prompts: each run here re-probes and times fewer prompts.")
