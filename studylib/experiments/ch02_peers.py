"""Chapter 2, second half: the HF peers run beside ours, and the sampling-distribution check.

Peers: transformers' assisted generation (``generate(assistant_model=...)``) with the same distilled
draft and the same fixed gamma (``num_assistant_tokens``, constant schedule, confidence-based early
stop disabled), and HF prompt lookup (``prompt_lookup_num_tokens``, ``max_matching_ngram_size``) with
our gamma and n-gram size. Each prompt runs every configuration back to back, so ratios are paired.

Sampling check: the decoder's own loop (``speculative.speculate``) on two random models with a vocabulary
of 8, the joint distribution of generated tokens 2 and 3 (both draft positions, residual resampling and
the bonus token matter there) against its exact value by enumeration, judged by chi-square and a TV
bound; a sampler without residual resampling goes through the same test to show it can fail.
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

# ------------------------------------------------------------------------------------------- HF peers


def _hf_generate(hf, ids: list[int], max_new_tokens: int, eos: int, **kw) -> tuple[list[int], float]:
    x = torch.tensor([ids], device=hf.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                          pad_token_id=eos, eos_token_id=eos, **kw)
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def hf_peers(runner: Runner, prompts: Sequence[Prompt], draft_path: str, gamma: int, ngram: int,
             max_new_tokens: int, pld_gamma: int | None = None) -> pd.DataFrame:
    """Ours and HF's AR, draft-model speculation (``gamma``) and prompt lookup (``pld_gamma``, default
    ``gamma``, and ``ngram``), per prompt, greedy."""
    pld_gamma = gamma if pld_gamma is None else pld_gamma
    from studylib.models import load_hf_model

    model = runner.model
    dtype = str(model.dtype).replace("torch.", "")
    hf = load_hf_model(model.config.name, str(model.device), dtype)
    hf_draft = load_hf_model(draft_path, str(model.device), dtype)
    eos = model.config.eos_token_ids[0]
    # HF reads the drafting knobs from the assistant's own generation config.
    hf_draft.generation_config.num_assistant_tokens = gamma
    hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
    hf_draft.generation_config.assistant_confidence_threshold = 0.0
    hf_cfgs = {
        "hf:ar": {},
        f"hf:assisted@{gamma}": {"assistant_model": hf_draft},
        f"hf:pld@{pld_gamma},{ngram}": {"prompt_lookup_num_tokens": pld_gamma, "max_matching_ngram_size": ngram},
    }
    ours = ["ar", f"sps:distilled:full@{gamma}", f"pld@{pld_gamma},{ngram}"]
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


def hf_peer_summary(df: pd.DataFrame, gamma: int, ngram: int, pld_gamma: int | None = None) -> pd.DataFrame:
    """Paired ratios: each of ours over the HF peer configured the same way (> 1: ours is faster),
    and each method's speedup over its own implementation's AR."""
    pld_gamma = gamma if pld_gamma is None else pld_gamma
    pairs = [("ar", "hf:ar"), (f"sps:distilled:full@{gamma}", f"hf:assisted@{gamma}"),
             (f"pld@{pld_gamma},{ngram}", f"hf:pld@{pld_gamma},{ngram}")]
    wide = df.pivot_table(index="prompt", columns="config", values="s_per_token")
    eq = df.groupby("config").equal_to_our_ar.mean()
    rows = []
    for ours, peer in pairs:
        r = ratio_estimate(wide[peer].values, wide[ours].values)
        own = ratio_estimate(wide["ar"].values, wide[ours].values)
        hf_own = ratio_estimate(wide["hf:ar"].values, wide[peer].values)
        rows.append({"ours": ours, "peer": peer, "ours_over_peer": r.value, "lo": r.ci_low, "hi": r.ci_high,
                     "ours_vs_our_ar": own.value, "peer_vs_hf_ar": hf_own.value,
                     "ours_exact": float(eq[ours]), "peer_equal_to_our_ar": float(eq[peer])})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------- sampling


def _gof(counts: np.ndarray, p: np.ndarray) -> tuple[float, float, float]:
    """(chi-square p-value with cells of expected count < 5 pooled, TV distance, TV bound).

    The bound is 1.6x the TV expected from a correct sampler: E|c_i/n - p_i| ~ sqrt(2 p_i (1 - p_i) / (pi n))."""
    from scipy import stats

    n = counts.sum()
    exp = p * n
    big = exp >= 5
    obs_c = np.append(counts[big], counts[~big].sum())
    exp_c = np.append(exp[big], exp[~big].sum())
    if exp_c[-1] == 0:
        obs_c, exp_c = obs_c[:-1], exp_c[:-1]
    pval = float(stats.chisquare(obs_c, exp_c * obs_c.sum() / exp_c.sum()).pvalue)
    tv = float(0.5 * np.abs(counts / n - p).sum())
    bound = 1.6 * 0.5 * float(np.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())
    return pval, tv, bound


def _wrong_verifier(target_logits, draft, sampling, gen, q):
    """No residual resampling: on rejection draw from the target p itself (a classic bug)."""
    p = probs(target_logits, sampling)
    for i, x in enumerate(draft):
        q_x = 1.0 if q is None else float(q[i, x])
        if float(torch.rand((), generator=gen)) * q_x >= float(p[i, x]):
            return i, int(sample_from(p[i], gen))
    return len(draft), int(sample_from(p[len(draft)], gen))


def sampling_check(n: int = 2000, temperature: float = 1.0, top_k: int = 0, alpha: float = 1e-3,
                   vocab: int = 8) -> pd.DataFrame:
    """Exact sampler vs a wrong one through the decoder loop (module docstring); one row per sampler."""
    from studylib.decoding.drafts import ModelDraft
    from studylib.decoding.speculative import speculate
    from studylib.models import DenseKVCache, _random_model
    from studylib.models.presets import tiny_config

    dev, dt = torch.device("cpu"), torch.float32
    target = _random_model(tiny_config(0, vocab_size=vocab), dev, dt, 0).eval()
    draft = ModelDraft(_random_model(tiny_config(5, vocab_size=vocab), dev, dt, 5).eval(), "tiny-draft")
    target.config.eos_token_ids, draft.model.config.eos_token_ids = [], []
    prompt = [1, 3, 5]

    def dist(ids):  # (V,) float64 under the sampling params
        cache = DenseKVCache(target.config, 1, len(ids), dev, dt)
        logits = target(torch.tensor([ids]), cache.begin(len(ids)), logits="last").logits[0, -1]
        return probs(logits, SamplingParams(temperature, top_k)).double()

    p1 = dist(prompt)
    exact = torch.zeros(vocab, vocab, dtype=torch.float64)
    for x1 in range(vocab):
        p2 = dist([*prompt, x1])
        for x2 in range(vocab):
            exact[x2] += p1[x1] * p2[x2] * dist([*prompt, x1, x2])
    exact = exact.flatten().numpy()
    rows = []
    for name, verifier, expect_reject in (("exact (residual resampling)", None, False),
                                          ("wrong (resample from p)", _wrong_verifier, True)):
        counts = np.zeros(vocab * vocab)
        for i in progress_bar(range(n), desc=f"sampling check: {name}", leave=False):
            res = speculate(target, prompt, 4, SamplingParams(temperature, top_k, seed=i), None,
                            lambda cache, cap: draft.session(target, cache, cap), 2, "speculative",
                            verifier=verifier)
            counts[res.token_ids[1] * vocab + res.token_ids[2]] += 1
        pval, tv, bound = _gof(counts, exact)
        rejected = pval < alpha or tv > bound
        rows.append({"sampler": name, "samples": n, "chi2_p": pval, "tv": tv, "tv_bound": bound,
                     "rejected": rejected, "expect_reject": expect_reject, "as_expected": rejected == expect_reject})
    return pd.DataFrame(rows)
