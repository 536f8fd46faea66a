"""Chapter 2, second half: the HF peers run beside ours, and the sampling-distribution check.

Peers: transformers' assisted generation (``generate(assistant_model=...)``) with the same distilled
draft and the same fixed gamma (``num_assistant_tokens``, constant schedule, confidence-based early
stop disabled), and HF prompt lookup (``prompt_lookup_num_tokens``, ``max_matching_ngram_size``) with
our gamma and n-gram size. Each prompt runs every configuration back to back, so ratios are paired.

Sampling check: the decoder's own loop (``speculative.speculate``) on two random models with a vocabulary
of 8. Token 1 comes from the prefill; tokens 2 .. gamma + 2 are one speculative step, gamma draft
positions and the bonus position (the target's own token after full acceptance). Their joint
distribution and each position's marginal are judged against the exact values by enumeration, with
chi-square and a total-variation bound (``distribution_test``). Two wrong samplers go through the same
test to show it can fail: one without residual resampling, one that draws the bonus token uniformly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from studylib.bench.stats import ratio_estimate
from studylib.experiments.ch02_speculative import Prompt, Runner
from studylib.progress import progress_bar
from studylib.sampling import SamplingParams, probs, sample_from
from studylib.workbook import illustration as ill
from studylib.workbook.tables import why_not_measured

# ------------------------------------------------------------------------------------------- HF peers


def _hf_generate(hf, ids: list[int], max_new_tokens: int, eos: int, **kw) -> tuple[list[int], float]:
    x = torch.tensor([ids], device=hf.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                          pad_token_id=eos, eos_token_id=eos, **kw)
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def hf_peers(runner: Runner, prompts: Sequence[Prompt], draft_path: str | None, gamma: int, ngram: int,
             max_new_tokens: int, pld_gamma: int | None = None, extra: Sequence[str] = ()) -> pd.DataFrame:
    """Ours and HF's AR, draft-model speculation (``gamma``; only with a ``draft_path``: HF's assisted
    generation needs a draft model) and prompt lookup (``pld_gamma``, default ``gamma``, and ``ngram``), per
    prompt, greedy. ``extra``: more of our methods on the same prompts (the EAGLE headline, compared with
    HF's assisted generation, else HF's AR)."""
    pld_gamma = gamma if pld_gamma is None else pld_gamma
    from studylib.models import load_hf_model

    model = runner.model
    dtype = str(model.dtype).replace("torch.", "")
    hf = load_hf_model(model.config.name, str(model.device), dtype)
    eos = model.config.eos_token_ids[0]
    hf_cfgs = {"hf:ar": {}}
    ours = ["ar"]
    if draft_path is not None:
        hf_draft = load_hf_model(draft_path, str(model.device), dtype)
        # HF reads the drafting knobs from the assistant's own generation config.
        hf_draft.generation_config.num_assistant_tokens = gamma
        hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
        hf_draft.generation_config.assistant_confidence_threshold = 0.0
        hf_cfgs[f"hf:assisted@{gamma}"] = {"assistant_model": hf_draft}
        ours.append(f"sps:distilled:full@{gamma}")
    hf_cfgs[f"hf:pld@{pld_gamma},{ngram}"] = {"prompt_lookup_num_tokens": pld_gamma, "max_matching_ngram_size": ngram}
    ours += [f"pld@{pld_gamma},{ngram}", *extra]
    warm = prompts[0].ids[:16] if prompts else []
    for cfg in hf_cfgs.values():
        _hf_generate(hf, warm, 3, eos, **cfg)
    for s in ours:
        runner.decode(s, warm, 3, SamplingParams())
    rows = []
    for p in progress_bar(prompts, desc="ch02 HF peers", leave=False):
        ref = None
        for s in ours:
            res = runner.decode(s, p.ids, max_new_tokens, SamplingParams())
            ref = res.token_ids if s == "ar" else ref
            rows.append({"prompt": p.id, "workload": p.workload, "config": s, "impl": "studylib",
                         "new_tokens": res.new_tokens, "wall_s": res.wall_s, "equal_to_our_ar": res.token_ids == ref})
        for name, cfg in hf_cfgs.items():
            toks, wall = _hf_generate(hf, p.ids, max_new_tokens, eos, **cfg)
            rows.append({"prompt": p.id, "workload": p.workload, "config": name, "impl": "hf",
                         "new_tokens": len(toks), "wall_s": wall, "equal_to_our_ar": toks == ref})
    df = pd.DataFrame(rows)
    df["s_per_token"] = df.wall_s / df.new_tokens.clip(lower=1)
    return df


def hf_peer_summary(df: pd.DataFrame, gamma: int, ngram: int, pld_gamma: int | None = None,
                    extra: Sequence[str] = ()) -> pd.DataFrame:
    """Paired ratios: each of ours over the HF peer configured the same way (> 1: ours is faster),
    and each method's speedup over its own implementation's AR. ``extra`` methods are set against HF's
    assisted generation with our distilled draft (the strongest HF speculative peer here). On fewer than
    ``MIN_UNITS`` prompts the table is an illustration (``studylib.workbook.illustration``): no CI columns."""
    pld_gamma = gamma if pld_gamma is None else pld_gamma
    have = set(df.config)
    spec_peer = f"hf:assisted@{gamma}" if f"hf:assisted@{gamma}" in have else "hf:ar"
    pairs = [("ar", "hf:ar"), (f"sps:distilled:full@{gamma}", f"hf:assisted@{gamma}"),
             (f"pld@{pld_gamma},{ngram}", f"hf:pld@{pld_gamma},{ngram}"),
             *((m, spec_peer) for m in extra if m in have)]
    pairs = [(o, p) for o, p in pairs if o in have and p in have]
    wide = df.pivot_table(index="prompt", columns="config", values="s_per_token")
    eq = df.groupby("config").equal_to_our_ar.mean()
    rows = []
    for ours, peer in pairs:
        r = ratio_estimate(wide[peer].values, wide[ours].values)
        own = ratio_estimate(wide["ar"].values, wide[ours].values)
        hf_own = ratio_estimate(wide["hf:ar"].values, wide[peer].values)
        rows.append({"ours": ours, "peer": peer, "prompts": len(wide), "ours_over_peer": r.value, "lo": r.ci_low,
                     "hi": r.ci_high,
                     "ours_vs_our_ar": own.value, "peer_vs_hf_ar": hf_own.value,
                     "ours_exact": float(eq[ours]), "peer_equal_to_our_ar": float(eq[peer])})
    return ill.illustration(pd.DataFrame(rows), len(wide), "prompts")


# ------------------------------------------------------------------------------------------- sampling

TV_REPS = 20_000  # simulated samples of a correct sampler behind each TV bound


def ar_joint(dist, prefix: Sequence[int], k: int, vocab: int) -> np.ndarray:
    """The exact joint distribution (vocab,)*k of the next ``k`` tokens after ``prefix`` when they are
    sampled one by one; ``dist(ids)`` is the (vocab,) next-token distribution after ``ids``."""
    p = np.asarray(dist(list(prefix)), dtype=np.float64)
    if k == 1:
        return p
    return np.stack([p[x] * ar_joint(dist, [*prefix, x], k - 1, vocab) for x in range(vocab)])


def distribution_views(tokens: np.ndarray, exact: np.ndarray,
                       bonus_last: bool = True) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, counts, exact probabilities) of every view the test judges: the joint of all k positions
    and each position's marginal. ``tokens``: (n, k) samples of k consecutive tokens; ``exact``: their
    exact joint, shape (V,)*k. ``bonus_last``: the last position is the bonus position (k = gamma + 1)
    and is named so."""
    tokens = np.asarray(tokens, dtype=np.int64)
    k = tokens.shape[1]
    if exact.ndim != k:
        raise ValueError(f"samples of {k} positions against a joint of {exact.ndim}")
    vocab = exact.shape[0]
    flat = np.ravel_multi_index(tuple(tokens.T), exact.shape)
    views = [(f"joint of positions 1-{k}", np.bincount(flat, minlength=exact.size).astype(np.float64),
              exact.ravel())]
    for j in range(k):
        marginal = exact.sum(axis=tuple(i for i in range(k) if i != j))
        name = f"position {j + 1}" + (" (bonus)" if bonus_last and j == k - 1 else "")
        views.append((name, np.bincount(tokens[:, j], minlength=vocab).astype(np.float64), marginal))
    return views


def _chi2_p(counts: np.ndarray, p: np.ndarray) -> float:
    """Chi-square goodness-of-fit p-value, cells of expected count < 5 pooled into one."""
    from scipy import stats

    exp = p * counts.sum()
    big = exp >= 5
    obs_c = np.append(counts[big], counts[~big].sum())
    exp_c = np.append(exp[big], exp[~big].sum())
    if exp_c[-1] == 0:
        if obs_c[-1] > 0:  # a token the target cannot produce
            return 0.0
        obs_c, exp_c = obs_c[:-1], exp_c[:-1]
    if len(obs_c) < 2:
        return 1.0
    return float(stats.chisquare(obs_c, exp_c * obs_c.sum() / exp_c.sum()).pvalue)


def tv_null_quantile(p: np.ndarray, n: int, level: float, reps: int = TV_REPS, seed: int = 0) -> float:
    """The total-variation distance that a correct sampler (n draws from ``p``) exceeds with probability
    ``level``, from ``reps`` simulated samples (seeded)."""
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    rng = np.random.default_rng(seed)
    tvs = []
    for lo in range(0, reps, 5000):
        c = rng.multinomial(n, p, size=min(5000, reps - lo))
        tvs.append(0.5 * np.abs(c / n - p).sum(axis=1))
    return float(np.quantile(np.concatenate(tvs), 1.0 - level))


def distribution_test(tokens: np.ndarray, exact: np.ndarray, alpha: float = 1e-3, reps: int = TV_REPS,
                      seed: int = 0, bonus_last: bool = True) -> dict:
    """Do ``tokens`` ((n, k) samples) come from ``exact`` (their joint, (V,)*k)? Every view of
    ``distribution_views`` gets a chi-square test and a total-variation test, each at alpha / (number of
    views) (Bonferroni), so a correct sampler is rejected with probability at most about 2 alpha. The TV
    bound is the TV a correct sampler exceeds with that probability (simulated). Rejected if any view
    fails either test. Returns chi2_p (the smallest p-value, Bonferroni-adjusted), tv and tv_bound of the
    view furthest over (or nearest to) its bound, that view's name, the views that failed, and rejected."""
    n = int(len(tokens))
    views = distribution_views(tokens, exact, bonus_last)
    level = alpha / len(views)
    rows = []
    for i, (name, counts, p) in enumerate(views):
        tv = float(0.5 * np.abs(counts / n - p).sum())
        rows.append((name, _chi2_p(counts, p), tv, tv_null_quantile(p, n, level, reps, seed + i)))
    p_adj = min(1.0, min(r[1] for r in rows) * len(views))
    worst = max(rows, key=lambda r: r[2] / r[3] if r[3] > 0 else math.inf)
    failed = [r[0] for r in rows if r[1] < level or r[2] > r[3]]
    return {"chi2_p": p_adj, "tv": worst[2], "tv_bound": worst[3], "worst_view": worst[0],
            "views": len(views), "rejected_by": "; ".join(failed), "rejected": bool(failed)}


def _wrong_verifier(target_logits, draft, sampling, gen, q):
    """No residual resampling: on rejection draw from the target p itself (a classic bug)."""
    p = probs(target_logits, sampling)
    for i, x in enumerate(draft):
        q_x = 1.0 if q is None else float(q[i, x])
        if float(torch.rand((), generator=gen)) * q_x >= float(p[i, x]):
            return i, int(sample_from(p[i], gen))
    return len(draft), int(sample_from(p[len(draft)], gen))


def _bonus_uniform_verifier(target_logits, draft, sampling, gen, q):
    """The exact rule except for the bonus token: after full acceptance it is drawn uniformly from the
    vocabulary instead of from the target's last row (a bug only the bonus position can show)."""
    from studylib.decoding.verify import verify_sampling

    p = probs(target_logits, sampling).clone()
    p[len(draft)] = 1.0 / p.shape[-1]
    return verify_sampling(p, q, draft, gen)


SAMPLERS = (("exact (residual resampling)", None, False),
            ("wrong (resample from p)", _wrong_verifier, True),
            ("wrong (bonus token uniform)", _bonus_uniform_verifier, True))


# The chain and tree samplers' checks are shown in one table; both record the same reasons, so they survive
# pd.concat (which keeps attrs only when they agree).
TREE_ONLY = "tallied only for the tree (EAGLE) samplers; the chain samplers' check does not count it"


def sampling_check(n: int = 2000, temperature: float = 1.0, top_k: int = 0, alpha: float = 1e-3,
                   vocab: int = 8, gamma: int = 2, top_p: float = 1.0) -> pd.DataFrame:
    """The exact sampler and the wrong ones through the decoder loop; one row per sampler.

    Each sample generates gamma + 2 tokens: the first comes from the prefill (plain sampling), the next
    gamma + 1 from one speculative step (gamma draft positions and the bonus position). Those gamma + 1
    tokens are judged against their exact joint by enumeration (``distribution_test``)."""
    from studylib.decoding.drafts import ModelDraft
    from studylib.decoding.speculative import speculate
    from studylib.models import DenseKVCache, _random_model
    from studylib.models.presets import tiny_config

    dev, dt = torch.device("cpu"), torch.float32
    target = _random_model(tiny_config(0, vocab_size=vocab), dev, dt, 0).eval()
    draft = ModelDraft(_random_model(tiny_config(5, vocab_size=vocab), dev, dt, 5).eval(), "tiny-draft")
    target.config.eos_token_ids, draft.model.config.eos_token_ids = [], []
    prompt = [1, 3, 5]
    k = gamma + 1

    def dist(ids):  # (V,) float64 under the sampling params
        cache = DenseKVCache(target.config, 1, len(ids), dev, dt)
        logits = target(torch.tensor([ids]), cache.begin(len(ids)), logits="last").logits[0, -1]
        return probs(logits, SamplingParams(temperature, top_k, top_p)).double().numpy()

    with torch.inference_mode():
        p1 = dist(prompt)
        exact = sum(p1[x1] * ar_joint(dist, [*prompt, x1], k, vocab) for x1 in range(vocab))
    rows = []
    for name, verifier, expect_reject in SAMPLERS:
        tokens = np.zeros((n, k), dtype=np.int64)
        for i in progress_bar(range(n), desc=f"sampling check: {name}", leave=False):
            res = speculate(target, prompt, k + 1, SamplingParams(temperature, top_k, top_p, seed=i), None,
                            lambda cache, cap: draft.session(target, cache, cap), gamma, "speculative",
                            verifier=verifier)
            tokens[i] = res.token_ids[1:k + 1]
        t = distribution_test(tokens, exact, alpha)
        rows.append({"sampler": name, "samples": n, "positions": k, **t, "expect_reject": expect_reject,
                     "as_expected": t["rejected"] == expect_reject})
    return why_not_measured(pd.DataFrame(rows), first_step_accepted_a_draft=TREE_ONLY)
