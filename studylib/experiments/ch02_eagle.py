"""Chapter 2, EAGLE: the head (train or reuse), its exact-sampling check, chain vs tree, tree size.

Costs are measured in the same runs, in units of one AR decode step t_ar on the same prompts: the
draft costs c per draft forward, verifying a tree of n nodes costs v(n + 1), and the predicted speedup
is tau / (v + depth x c), tau the tokens committed per step. Beside it stands a *model* for a
memory-bound accelerator (labelled as such): v = 1 and c the head's share of the weights read per
forward (``EagleDraft.cost_ratio``), at the tau measured here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from studylib.bench.stats import estimate, ratio_estimate
from studylib.experiments.ch02_peers import TREE_ONLY
from studylib.workbook import illustration as ill
from studylib.workbook.tables import why_not_measured

# How a head's training ended, in words (head_train's stop reasons).
_STOPS = {"max_steps": "stopped at its step cap", "curve flat": "stopped when its held-out curve flattened",
          "time cap": "stopped at its time cap"}


def chapter_head(model_name: str, name: str = "eagle", retrain: bool = False, loaded: tuple | None = None) -> dict:
    """The EAGLE head chapter 2 runs: the one shipped with the study (``name``: ``eagle``, the shipped
    default, or ``eagle1`` / ``eagle3``; ``eagle.head_path``), read from its manifest; nothing is trained.
    ``retrain``: rebuild the draft corpus and retrain that head as the shipped one was trained (its
    manifest's settings; hours on a CPU, resumable), into the cache, and use that instead. Returns the
    manifest with ``path``, ``trained_now`` and ``sha256`` (of the weights file this run loads)."""
    import hashlib

    from studylib.decoding.eagle import HEAD_FILE, META_FILE, head_path
    from studylib.errors import StudylibError

    path = head_path(name, model_name)
    if retrain:
        from studylib.decoding.draft_files import slug as _slug
        from studylib.drafting import corpus as draft_corpus
        from studylib.drafting import head_train

        meta = json.loads((path / META_FILE).read_text()) if (path / META_FILE).exists() else {}
        kind = meta.get("head_kind", name if name in ("eagle1", "eagle3") else "eagle3")
        ccfg, tcfg = head_train.shipped_config(model_name, kind)
        man = draft_corpus.build(draft_corpus.CorpusConfig(**{**(ccfg or {}), "model": model_name, "max_minutes": None,
                                                              "out": None}))
        cfg = head_train.HeadTrainConfig(**{**(tcfg or {"kind": kind}), "corpus": man["path"], "max_minutes": None})
        from studylib.cache import cache_dir
        from studylib.models import load_model

        target = loaded if loaded is not None and loaded[0].weights_format == "dense" and \
            loaded[0].dtype == torch.float32 else load_model(model_name, "cpu", "float32")
        res = head_train.train(cfg, cache_dir("drafts", f"{_slug(model_name)}-{kind}-work"), loaded=target)
        path = cache_dir("drafts", f"{_slug(model_name)}-{kind}-retrained")
        head_train.export(res, cfg, target[0], path, man)
    if not (path / HEAD_FILE).exists():
        raise StudylibError(f"no EAGLE head {name!r} for {model_name} in {path}; the study ships one for "
                            "smollm2-135m; for another model train one with `studylib train-draft --kind eagle "
                            f"--preset shipped --model {model_name}`, or run the chapter with -p retrain_drafts=true.")
    meta = json.loads((path / META_FILE).read_text()) if (path / META_FILE).exists() else {}
    meta.update(path=str(path), trained_now=retrain,
                sha256=hashlib.sha256((path / HEAD_FILE).read_bytes()).hexdigest())
    return meta


def head_summary(meta: dict) -> str:
    """What the head is, what it was trained on and how it scores on held-out answers, from its manifest."""
    tr, corpus, held = meta.get("training", {}), meta.get("corpus", {}), meta.get("heldout", {})
    fin = held.get("final", {})
    recipe = {"eagle3": "EAGLE-3's recipe (the target's low, middle and high layers fused; trained on its own "
                        "predictions, training-time test)",
              "eagle1": "EAGLE-1/2's recipe (the target's last feature; the next feature regressed)"}.get(
        meta.get("head_kind"), "an unknown recipe")
    origin = "retrained in this run" if meta.get("trained_now") else "shipped with the study"
    mach = meta.get("machine", {})
    return (f"The EAGLE head ({origin}; sha256 {meta.get('sha256', '')[:12]}) is one decoder layer of the target's "
            f"shape, {meta.get('params', 0) / 1e6:.1f}M parameters, trained with {recipe} on "
            f"{(corpus.get('answer_tokens') or 0):,} tokens of the target's own answers ({corpus.get('answers') or 0:,} "
            f"answers to {corpus.get('prompts') or 0:,} prompts, none of them a prompt any chapter evaluates) for "
            f"{tr.get('steps')} steps ({(tr.get('seconds') or 0) / 3600:.1f} hours in {tr.get('precision')} on "
            f"{mach.get('cpu', 'a CPU')}; {_STOPS.get(tr.get('stop'), 'stopped: ' + str(tr.get('stop')))}). On held-out answers its first drafted token "
            f"equals the target's {100 * fin.get('top1_1', float('nan')):.1f}% of the time and its second "
            f"{100 * fin.get('top1_2', float('nan')):.1f}%. Its LM head keeps the {meta.get('head_vocab') or 'full'} "
            "tokens the target ranks first most often (FR-Spec); `eagle:full` uses the whole LM head.")


def training_curve(meta: dict) -> pd.DataFrame:
    """The held-out curve from the manifest: tokens seen against top-1 of the first and second drafted token."""
    curve = pd.DataFrame(meta.get("heldout", {}).get("curve", []))
    if curve.empty:
        return curve
    long = curve.melt(id_vars="tokens", value_vars=[c for c in ("top1_1", "top1_2") if c in curve],
                      var_name="drafted token", value_name="held-out top-1")
    return long.replace({"drafted token": {"top1_1": "first", "top1_2": "second"}})


def corpus_table(meta: dict) -> pd.DataFrame:
    """The head's training data by source (answer tokens), from its manifest."""
    by = meta.get("corpus", {}).get("by_source") or {}
    words = {"self": "user turns the target wrote itself", "xsum": "XSum articles (draft split), four tasks each",
             "nqa": "NarrativeQA questions (draft split)", "story": "NarrativeQA stories (draft split), three tasks each",
             "code": "HumanEval problems (draft split)"}
    total = sum(by.values()) or 1
    return pd.DataFrame([{"source": words.get(k, k), "answer_tokens": v, "share": v / total}
                         for k, v in sorted(by.items(), key=lambda kv: -kv[1])])


# ------------------------------------------------------------------------------------------- exactness


def eagle_sampling_check(n: int = 2000, vocab: int = 8, tree: tuple[int, int, int] = (2, 2, 4),
                         temperature: float = 1.0, alpha: float = 1e-3) -> pd.DataFrame:
    """The multi-candidate tree verification, and a known-wrong variant, through the decoder loop.

    A tiny random target with an 8-token vocabulary and a random head drafting a (2, 2, 4) tree: each
    sample generates ``depth + 2`` tokens, the first from the prefill and the next ``depth + 1`` from
    tree steps, and those are judged against their exact joint by enumeration (``distribution_test``:
    chi-square and total variation on the joint and every marginal, Bonferroni). The wrong walk does not
    remove a rejected candidate from p, which over-weights the drafted tokens."""
    from studylib.decoding import eagle
    from studylib.experiments.ch02_peers import ar_joint, distribution_test
    from studylib.models import DenseKVCache, _random_model
    from studylib.models.presets import tiny_config
    from studylib.progress import progress_bar
    from studylib.sampling import SamplingParams, probs

    dev, dt = torch.device("cpu"), torch.float32
    target = _random_model(tiny_config(0, vocab_size=vocab), dev, dt, 0).eval()
    target.config.eos_token_ids = []
    torch.manual_seed(11)
    head = eagle.EagleHead(target.config).eval()
    # Sharpen the random head a little so its top-k candidates carry real probability mass.
    with torch.no_grad():
        head.fc.weight.mul_(3.0)
    drafter = eagle.EagleDraft(head, None, eagle.TreeSpec(*tree))
    prompt = [1, 3, 5]
    k = tree[0] + 1
    sampling_args = (temperature,)

    def dist(ids):
        cache = DenseKVCache(target.config, 1, len(ids), dev, dt)
        logits = target(torch.tensor([ids]), cache.begin(len(ids)), logits="last").logits[0, -1]
        return probs(logits, SamplingParams(*sampling_args)).double().numpy()

    with torch.inference_mode():
        p1 = dist(prompt)
        exact = sum(p1[x1] * ar_joint(dist, [*prompt, x1], k, vocab) for x1 in range(vocab))

    def wrong(logits, tree_, sampling, gen):
        return eagle.walk_sampling(logits, tree_, sampling, gen, exact=False)

    rows = []
    for name, walker, expect in (("exact (multi-candidate)", None, False),
                                 ("wrong (rejected candidate kept in p)", wrong, True)):
        tokens = np.zeros((n, k), dtype=np.int64)
        deep = 0
        for i in progress_bar(range(n), desc=f"eagle sampling check: {name}", leave=False):
            res = eagle.generate(target, prompt, k + 1, SamplingParams(temperature, seed=i), draft=drafter,
                                 walker=walker)
            tokens[i] = res.token_ids[1 : k + 1]
            deep += res.accepted_lengths[0] > 1
        t = distribution_test(tokens, exact, alpha)
        rows.append({"sampler": name, "samples": n, "positions": k, "first_step_accepted_a_draft": deep / n, **t,
                     "expect_reject": expect, "as_expected": t["rejected"] == expect})
    return why_not_measured(pd.DataFrame(rows), first_step_accepted_a_draft=TREE_ONLY)


# ------------------------------------------------------------------------------------------- trees


def per_position(df: pd.DataFrame, results: dict) -> pd.DataFrame:
    """Per method: of the steps whose accepted path reached depth d - 1, the share that reached d."""
    rows = []
    for spec, res_list in results.items():
        hist = np.sum([r.extra["accepted_depths"] for r in res_list], axis=0)
        reach = [hist[d:].sum() for d in range(len(hist))]
        for d in range(1, len(hist)):
            rows.append({"method": spec, "depth": d, "steps_reaching": int(reach[d - 1]),
                         "acceptance": reach[d] / reach[d - 1] if reach[d - 1] else float("nan")})
    return pd.DataFrame(rows)


def acceptance_by_depth(positions: pd.DataFrame) -> pd.DataFrame:
    """``per_position`` as a table: one row per depth, one column per method (3 decimals); an illustration's
    label (``tree_sweep`` on too few prompts) carries over."""
    table = ill.carry(positions, positions.pivot(index="depth", columns="method", values="acceptance").round(3))
    return why_not_measured(table, **{str(m): "this tree has no level this deep, or no step reached the level "
                                               "above it" for m in table.columns})


def tree_sweep(runner, prompts: Sequence, specs: Sequence[str], max_new_tokens: int, verify_cost=None,
               cost_model: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Chain and trees on the same prompts, arms interleaved with AR: per spec the measured tau (tokens
    per target forward), c, v, predicted and measured speedup, and the accelerator model (v = 1,
    c = weights ratio) at the same tau. Returns (table, per-position acceptance); on fewer than ``MIN_UNITS``
    prompts both are illustrations (``studylib.workbook.illustration``): no CI columns, labelled with n."""
    from studylib.decoding.eagle import TreeSpec
    from studylib.experiments.ch02_speculative import parse_spec, run_methods

    df, results = run_methods(runner, prompts, list(specs), max_new_tokens, keep_results=True)
    ar_rows = df[df.method == "ar"].set_index("prompt")
    costs = engine_costs(df).set_index("method")
    rows = []
    for spec in specs:
        d = df[df.method == spec]
        _, opts = parse_spec(spec)
        tree = opts["tree"]
        k = costs.loc[spec]
        sp = ratio_estimate(ar_rows.loc[d.prompt].s_per_token.values, d.s_per_token.values)
        tps = estimate(d.tokens_per_step, np.mean)  # tau is a mean, so its CI is the mean's
        c_model = runner.eagle_cost_ratio(opts["draft"]) if hasattr(runner, "eagle_cost_ratio") else float("nan")
        rows.append({
            "method": spec, "shape": "chain" if TreeSpec(*tree).is_chain else "tree", "depth": tree[0],
            "topk": tree[1], "verify_tokens": tree[2] + 1, "prompts": len(d), "tau": k.tau,
            "tau_lo": tps.ci_low, "tau_hi": tps.ci_high, "c": k.c, "v": k.v,
            "draft_forwards_per_step": k.draft_forwards_per_step, "predicted_speedup": k.predicted_speedup,
            "speedup": sp.value, "speedup_lo": sp.ci_low, "speedup_hi": sp.ci_high,
            "model_accelerator_speedup": k.tau / (1.0 + k.draft_forwards_per_step * c_model),
        })
    pos = per_position(df, {s: results[s] for s in specs})
    n = int(df.prompt.nunique())
    return ill.illustration(pd.DataFrame(rows), n, "prompts"), ill.illustration(pos, n, "prompts")


def engine_costs(df: pd.DataFrame) -> pd.DataFrame:
    """Per method of a ``run_methods`` frame: tau, c and v in AR steps of the same engine (as in
    ``tree_sweep``), and the speedup they predict, so a slowdown on one engine can be read off its costs."""
    ar_rows = df[df.method == "ar"].set_index("prompt")
    t_ar = float((ar_rows.decode_s / (ar_rows.new_tokens - 1).clip(lower=1)).median())
    rows = []
    for spec in [m for m in dict.fromkeys(df.method) if m != "ar"]:
        d = df[df.method == spec]
        steps = max(int(d.steps.sum()), 1)
        tau = float(d.new_tokens.sum() - len(d)) / steps
        c = float(d.draft_s.sum() / max(d.draft_forwards.sum(), 1)) / t_ar
        v = float(d.verify_s.sum() / steps) / t_ar
        f = float(d.draft_forwards.sum()) / steps
        rows.append({"method": spec, "ar_ms_per_token": 1e3 * t_ar, "tau": tau, "c": c, "v": v,
                     "draft_forwards_per_step": f, "predicted_speedup": tau / (v + f * c)})
    return pd.DataFrame(rows)


def explain_engine(costs: pd.DataFrame, engine: str) -> str:
    if costs.empty:
        return f"Nothing was run on the {engine} engine."
    parts = [f"{r.method}: tau = {r.tau:.2f} tokens per step, a draft forward costs c = {r.c:.2f} and verifying "
             f"v = {r.v:.2f} AR steps, so tau / (v + {r.draft_forwards_per_step:.0f} c) predicts {r.predicted_speedup:.2f}x"
             for r in costs.itertuples()]
    return (f"On the {engine} engine an AR step takes {costs.ar_ms_per_token.iloc[0]:.1f} ms. " + "; ".join(parts)
            + ". The faster the target step, the larger the draft's share of it, and the verify block is "
            "computed row by row in that engine's fused kernel, so verify cost grows with the tree.")


TREE_SERIES = {"speedup": "measured (this CPU)", "predicted_speedup": "predicted from measured c, v (this CPU)",
               "model_accelerator_speedup": "model: memory-bound accelerator (v = 1), same tau"}


def tree_long(sweep: pd.DataFrame) -> pd.DataFrame:
    """Measured and predicted speedup against verify size, and the accelerator model, in long form: one row
    per (shape, verify size, series)."""
    out = sweep.melt(id_vars=["verify_tokens", "shape"], value_vars=list(TREE_SERIES), var_name="series",
                     value_name="x AR")
    out["series"] = out.series.map(TREE_SERIES)
    return out


def tree_figure(sweep: pd.DataFrame, title: str):
    """Speed-up against tokens verified per step: one colour per series (measured, predicted, modelled), one
    line style per shape (chain, tree), so a shape's points join up along its verify sizes. Tidied like
    every workbook figure (the title wraps to its panel, the legend moves off the data)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from studylib import plots

    long = tree_long(sweep)
    ax = plt.subplots(figsize=plots.FIGSIZE)[1]
    sns.lineplot(data=long, x="verify_tokens", y="x AR", hue="series", style="shape", markers=True,
                 palette=plots.palette(long.series.unique()), errorbar=None, ax=ax)
    # seaborn heads each legend section ("series", "shape") with an entry of its own; the entries say enough
    handles, labels = ax.get_legend_handles_labels()
    kept = [(h, lab) for h, lab in zip(handles, labels, strict=True) if lab not in ("series", "shape")]
    ax.legend(*zip(*kept, strict=True), fontsize="small")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("tokens verified per step")
    ax.set_ylabel("speed-up over AR")
    ax.set_title(title)
    return plots.tidy(ax)


def explain_trees(sweep: pd.DataFrame) -> str:
    if sweep.empty:
        return "No tree was run in this profile."
    n = int(sweep.prompts.min()) if "prompts" in sweep else None
    if n is not None and ill.is_illustration(n):
        return (f"The chain and tree comparison is {ill.sentence(n)}: the table and figure show what was measured "
                f"on {'that prompt' if n == 1 else 'those prompts'}, and no shape is picked from them.")
    best = sweep.loc[sweep.speedup.idxmax()]
    lines = [f"The fastest shape here is {best.method} ({best['shape']}, {int(best.verify_tokens)} tokens verified per "
             f"step): {best.speedup:.2f}x AR [{best.speedup_lo:.2f}, {best.speedup_hi:.2f}] with tau = {best.tau:.2f} "
             f"tokens per target forward."]
    chains, trees = sweep[sweep["shape"] == "chain"], sweep[sweep["shape"] == "tree"]
    for r in trees.itertuples():
        same = chains[chains.verify_tokens == r.verify_tokens]
        if len(same):
            ch = same.iloc[0]
            lines.append(f"At {int(r.verify_tokens)} verified tokens the tree commits {r.tau:.2f} tokens per step "
                         f"against the chain's {ch.tau:.2f}.")
    grow = sweep.sort_values("verify_tokens")
    lines.append(f"Verifying costs v = {grow.v.iloc[0]:.2f} AR steps at {int(grow.verify_tokens.iloc[0])} tokens and "
                 f"{grow.v.iloc[-1]:.2f} at {int(grow.verify_tokens.iloc[-1])}: on this CPU a bigger tree buys "
                 "acceptance with verify time, which a memory-bound accelerator (the model curve, v = 1) would not "
                 "charge.")
    return " ".join(lines)


def eagle_aims(by_workload: pd.DataFrame, spec: str, on_gguf: pd.DataFrame | None = None,
               engine: str = "the chapter's engine") -> pd.DataFrame:
    """The EAGLE aims, measured: >= 2.5 tokens per target forward on chat; >= 1.5x our AR on chat on the
    chapter's engine (``engine`` names it: its weights and activations) and on the GGUF engine with fp32
    activations. "met" needs the CI's low end at or above the aim; a row read off fewer than ``MIN_UNITS``
    prompts is an illustration and is not judged."""
    from studylib.experiments.ch02_speculative import _n, aims_table

    rows = []
    r = by_workload[(by_workload.method == spec) & (by_workload.workload == "chat")]
    if len(r):
        r = r.iloc[0]
        rows.append(ill.aim_row(f"{spec} on chat >= 2.5 tokens per target forward", r.tokens_per_step,
                                r.tokens_per_step_lo, r.tokens_per_step_hi, 2.5, _n(r)))
        rows.append(ill.aim_row(f"{spec} on chat >= 1.5x our AR ({engine})", r.speedup, r.speedup_lo,
                                r.speedup_hi, 1.5, _n(r)))
    if on_gguf is not None:
        g = on_gguf[(on_gguf.method == spec)]
        if len(g):
            g = g.iloc[0]
            rows.append(ill.aim_row(f"{spec} on chat >= 1.5x our AR (gguf weights, fp32 activations, AR on the "
                                    "same engine)",
                                    g.speedup, g.speedup_lo, g.speedup_hi, 1.5, _n(g)))
    return aims_table(pd.DataFrame(rows))
