"""Speculative sampling draws from the target distribution (Leviathan et al. Theorem 3.5), tested
statistically, with a known-wrong sampler run through the same test to show it has the power to fail.

Design: a small vocabulary, the joint distribution of two consecutive tokens (so both the first and a
later draft position, acceptance, residual resampling and the bonus token all matter), a chi-square
goodness-of-fit test at ALPHA (cells with expected count < 5 pooled) and a total-variation bound.
The TV bound is 1.6x the TV a correct sampler is expected to show with this many samples
(E[TV] ~ 0.5 * sum_i sqrt(2 p_i (1 - p_i) / (pi n))), below the TV of the wrong sampler. Seeds are fixed, so the outcome is deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from studylib.decoding import speculative
from studylib.decoding.verify import verify_sampling
from studylib.sampling import SamplingParams, probs, sample_from

ALPHA = 1e-3
V = 6


def _gof(counts: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """(chi-square p-value with small cells pooled, total-variation distance) of counts vs p."""
    n = counts.sum()
    exp = p * n
    big = exp >= 5
    obs_cells = np.append(counts[big], counts[~big].sum())
    exp_cells = np.append(exp[big], exp[~big].sum())
    if exp_cells[-1] == 0:
        obs_cells, exp_cells = obs_cells[:-1], exp_cells[:-1]
    exp_cells = exp_cells * obs_cells.sum() / exp_cells.sum()  # exact float sums, as scipy requires
    pval = stats.chisquare(obs_cells, exp_cells).pvalue
    tv = 0.5 * np.abs(counts / n - p).sum()
    return float(pval), float(tv)


def _tv_bound(p: np.ndarray, n: int) -> float:
    """1.6x the TV a correct sampler is expected to show: E|c_i/n - p_i| ~ sqrt(2 p_i (1 - p_i) / (pi n))."""
    return 1.6 * 0.5 * float(np.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())


def wrong_verify_sampling(target_probs, draft_probs, draft_tokens, generator):
    """A plausible bug: on rejection, resample from p instead of the residual norm(max(0, p - q))."""
    n = len(draft_tokens)
    for i, x in enumerate(draft_tokens):
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        if float(torch.rand((), generator=generator)) * q_x >= float(target_probs[i, x]):
            return i, int(sample_from(target_probs[i], generator))
    return n, int(sample_from(target_probs[n], generator))


def _chain(seed: int, sharp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A first-order Markov 'model': start distribution (V,) and transitions (V, V)."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(V, generator=g), -1), torch.softmax(sharp * torch.randn(V, V, generator=g), -1)


def _spec_two_tokens(p0, P, q0, Q, verifier, gen, gamma: int, deterministic: bool) -> tuple[int, int]:
    """Speculative sampling of two tokens from the chain (p0, P) with draft (q0, Q), as the decoder does:
    draft gamma tokens, verify all of them against gamma + 1 target rows, commit, repeat."""
    out: list[int] = []
    while len(out) < 2:
        q_rows, toks = [], []
        prev = out[-1] if out else None
        for _ in range(gamma):
            q = q0 if prev is None else Q[prev]
            t = int(q.argmax()) if deterministic else int(sample_from(q, gen))
            q_rows.append(q)
            toks.append(t)
            prev = t
        p_rows = [p0 if not out else P[out[-1]], *(P[t] for t in toks)]
        n_acc, nxt = verifier(torch.stack(p_rows), None if deterministic else torch.stack(q_rows), toks, gen)
        out += [*toks[:n_acc], nxt]
    return out[0], out[1]


def _joint_counts(verifier, deterministic: bool, n: int, gamma: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    p0, P = _chain(1, 1.5)
    q0, Q = _chain(2, 1.5)
    gen = torch.Generator().manual_seed(seed)
    counts = np.zeros(V * V)
    for _ in range(n):
        a, b = _spec_two_tokens(p0, P, q0, Q, verifier, gen, gamma, deterministic)
        counts[a * V + b] += 1
    exact = (p0[:, None] * P).flatten().double().numpy()
    return counts, exact


@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-draft", "one-hot-draft"])
def test_speculative_sampling_matches_target_joint(deterministic):
    n = 3000
    counts, exact = _joint_counts(verify_sampling, deterministic, n)
    pval, tv = _gof(counts, exact)
    assert pval > ALPHA, f"chi-square rejects the exact sampler (p={pval:.2e})"
    assert tv < _tv_bound(exact, n), f"TV {tv:.3f} exceeds {_tv_bound(exact, n):.3f}"


@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-draft", "one-hot-draft"])
def test_the_test_rejects_a_sampler_without_residual_resampling(deterministic):
    n = 3000
    counts, exact = _joint_counts(wrong_verify_sampling, deterministic, n)
    pval, tv = _gof(counts, exact)
    assert pval < ALPHA and tv > _tv_bound(exact, n), f"the wrong sampler passed (p={pval:.2e}, TV={tv:.3f})"


# ------------------------------------------------------------------ end to end through the decoder


def _tiny_vocab_models(vocab: int = 8):
    from studylib.models import _random_model
    from studylib.models.presets import tiny_config

    dev, dt = torch.device("cpu"), torch.float32
    target = _random_model(tiny_config(0, vocab_size=vocab), dev, dt, 0).eval()
    draft = _random_model(tiny_config(5, vocab_size=vocab), dev, dt, 5).eval()
    target.config.eos_token_ids, draft.config.eos_token_ids = [], []  # every token is an ordinary token
    return target, draft


def _exact_joint_23(model, prompt, params: SamplingParams, vocab: int) -> np.ndarray:
    """P(x2, x3) = sum_x1 p(x1) p(x2 | x1) p(x3 | x1, x2) under ``params``, by enumeration."""
    from studylib.models import DenseKVCache

    def dist(ids):
        cache = DenseKVCache(model.config, 1, len(ids), model.device, model.dtype)
        return probs(model(torch.tensor([ids]), cache.begin(len(ids)), logits="last").logits[0, -1], params).double()

    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    p1 = dist(prompt)
    for x1 in range(vocab):
        p2 = dist([*prompt, x1])
        for x2 in range(vocab):
            joint[x2] += p1[x1] * p2[x2] * dist([*prompt, x1, x2])
    return joint.flatten().numpy()


def _wrong_verify(target_logits, draft, sampling, gen, q):
    return wrong_verify_sampling(probs(target_logits, sampling), q, draft, gen)


@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_k=5, top_p=0.95)],
                         ids=["T1", "T0.8-topk5-topp0.95"])
def test_speculative_generate_samples_the_target_distribution(params, monkeypatch):
    vocab, n = 8, 2000
    target, draft = _tiny_vocab_models(vocab)
    prompt = [1, 3, 5]
    exact = _exact_joint_23(target, prompt, params, vocab)

    def counts() -> np.ndarray:
        c = np.zeros(vocab * vocab)
        for i in range(n):
            s = SamplingParams(params.temperature, params.top_k, params.top_p, seed=i)
            ids = speculative.generate(target, prompt, 4, s, draft=draft, gamma=2).token_ids
            c[ids[1] * vocab + ids[2]] += 1
        return c

    pval, tv = _gof(counts(), exact)
    assert pval > ALPHA and tv < _tv_bound(exact, n), (pval, tv)
    monkeypatch.setattr(speculative, "verify", _wrong_verify)
    pval, tv = _gof(counts(), exact)
    assert pval < ALPHA and tv > _tv_bound(exact, n), (pval, tv)
