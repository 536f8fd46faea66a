"""Speculative sampling draws from the target distribution (Leviathan et al. Theorem 3.5), tested
statistically, with known-wrong samplers run through the same test to show it has the power to fail.

Design: a small vocabulary and ONE whole speculative step: the gamma draft positions and the bonus
position (gamma + 1, the target's own token after full acceptance), so acceptance, residual resampling
and the bonus token all matter. The test is chapter 2's ``distribution_test``: the joint distribution of
the gamma + 1 tokens and each position's marginal against the exact values, each by a chi-square test
(cells of expected count < 5 pooled) and a total-variation bound (the TV a correct sampler exceeds with
probability alpha / views, simulated), at alpha / views each (Bonferroni). Wrong samplers: no residual
resampling; the bonus token drawn uniformly; the bonus token drawn from the draft. A test that looked at
the draft positions only (as this one once did) accepts the two bonus bugs. Seeds are fixed, so every
outcome is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studylib.decoding.verify import verify_sampling
from studylib.experiments.ch02_peers import distribution_test, sampling_check, tv_null_quantile
from studylib.sampling import sample_from

ALPHA = 1e-3
V = 6
N = 3000


def wrong_verify_sampling(target_probs, draft_probs, draft_tokens, generator):
    """A plausible bug: on rejection, resample from p instead of the residual norm(max(0, p - q))."""
    n = len(draft_tokens)
    for i, x in enumerate(draft_tokens):
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        if float(torch.rand((), generator=generator)) * q_x >= float(target_probs[i, x]):
            return i, int(sample_from(target_probs[i], generator))
    return n, int(sample_from(target_probs[n], generator))


def bonus_uniform_verify_sampling(target_probs, draft_probs, draft_tokens, generator):
    """The exact rule, except that the bonus token is drawn uniformly from the vocabulary."""
    p = target_probs.clone()
    p[len(draft_tokens)] = 1.0 / p.shape[-1]
    return verify_sampling(p, draft_probs, draft_tokens, generator)


def _chain(seed: int, sharp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A first-order Markov 'model': start distribution (V,) and transitions (V, V)."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(V, generator=g), -1), torch.softmax(sharp * torch.randn(V, V, generator=g), -1)


P0, P = _chain(1, 1.5)  # the target
Q0, Q = _chain(2, 1.5)  # the draft


def bonus_from_draft_verify_sampling(target_probs, draft_probs, draft_tokens, generator):
    """The exact rule, except that the bonus token is drawn from the draft's next distribution."""
    p = target_probs.clone()
    p[len(draft_tokens)] = Q[draft_tokens[-1]]
    return verify_sampling(p, draft_probs, draft_tokens, generator)


VERIFIERS = {
    "exact": verify_sampling,
    "no residual resampling": wrong_verify_sampling,
    "bonus uniform": bonus_uniform_verify_sampling,
    "bonus from draft": bonus_from_draft_verify_sampling,
}


def _spec_step(last: int | None, verifier, gen, gamma: int, deterministic: bool) -> list[int]:
    """The tokens one speculative step commits after ``last`` (None: at the start) from the chain
    (P0, P), as the decoder does: draft gamma tokens (sampled from the draft chain (Q0, Q), or, for a
    deterministic drafter, the target's argmax: a guess that is often right, so the bonus position is
    reached often enough to be tested), verify them against gamma + 1 target rows (one per draft
    position and the bonus row), commit the accepted ones plus the target's token."""
    q_rows, toks = [], []
    prev = last
    for _ in range(gamma):
        if deterministic:  # guess the target's likeliest token, as a good n-gram lookup would
            t = int((P0 if prev is None else P[prev]).argmax())
        else:
            q = Q0 if prev is None else Q[prev]
            t = int(sample_from(q, gen))
            q_rows.append(q)
        toks.append(t)
        prev = t
    p_rows = [P0 if last is None else P[last], *(P[t] for t in toks)]
    n_acc, nxt = verifier(torch.stack(p_rows), None if deterministic else torch.stack(q_rows), toks, gen)
    return [*toks[:n_acc], nxt]


def _spec_tokens(verifier, gen, gamma: int, deterministic: bool) -> list[int]:
    """The first gamma + 1 tokens (positions 1 .. gamma + 1), stepping as often as needed."""
    out: list[int] = []
    while len(out) < gamma + 1:
        out += _spec_step(out[-1] if out else None, verifier, gen, gamma, deterministic)
    return out[: gamma + 1]


def _exact_joint(k: int) -> np.ndarray:
    """P(x1..xk) of the target chain, shape (V,)*k."""
    joint, trans = P0.double().numpy(), P.double().numpy()
    for _ in range(k - 1):
        joint = np.einsum("...i,ij->...ij", joint, trans)
    return joint


def _samples(name: str, deterministic: bool, gamma: int = 2, n: int = N, seed: int = 0) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    return np.array([_spec_tokens(VERIFIERS[name], gen, gamma, deterministic) for _ in range(n)])


MODES = pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-draft", "one-hot-draft"])


def test_exact_joint_is_the_chain():
    joint = _exact_joint(3)
    assert joint.shape == (V, V, V) and joint.sum() == pytest.approx(1.0)
    a, b, c = 1, 4, 2
    assert joint[a, b, c] == pytest.approx(float(P0[a] * P[a, b] * P[b, c]), rel=1e-6)


def test_the_distribution_test_accepts_draws_from_the_exact_distribution():
    joint = _exact_joint(3)
    rng = np.random.default_rng(7)
    flat = rng.choice(joint.size, size=N, p=joint.ravel() / joint.sum())
    tokens = np.stack(np.unravel_index(flat, joint.shape), axis=1)
    t = distribution_test(tokens, joint, ALPHA)
    assert not t["rejected"], t
    assert t["views"] == 4  # the joint and three marginals


def test_tv_bound_is_a_tail_quantile():
    p = np.full(8, 1 / 8)
    lo, hi = tv_null_quantile(p, 1000, 0.5), tv_null_quantile(p, 1000, 1e-3)
    assert 0 < lo < hi < 0.2


@MODES
@pytest.mark.parametrize("gamma", [2, 3])
def test_speculative_sampling_matches_the_target_at_every_position(deterministic, gamma):
    tokens = _samples("exact", deterministic, gamma)
    assert tokens.shape == (N, gamma + 1)
    t = distribution_test(tokens, _exact_joint(gamma + 1), ALPHA)
    assert not t["rejected"], f"the exact sampler was rejected: {t}"


@MODES
@pytest.mark.parametrize("name", ["no residual resampling", "bonus uniform", "bonus from draft"])
def test_the_test_rejects_wrong_samplers(deterministic, name):
    t = distribution_test(_samples(name, deterministic), _exact_joint(3), ALPHA)
    assert t["rejected"] and t["chi2_p"] < ALPHA, f"the wrong sampler '{name}' passed: {t}"


@MODES
@pytest.mark.parametrize("name", ["bonus uniform", "bonus from draft"])
def test_only_the_bonus_position_shows_a_bonus_bug(deterministic, name):
    """Positions 1..gamma of a bonus bug are exact: a test that skips the bonus position cannot see it."""
    tokens = _samples(name, deterministic)
    exact = _exact_joint(3)
    assert not distribution_test(tokens[:, :2], exact.sum(axis=2), ALPHA, bonus_last=False)["rejected"]
    t = distribution_test(tokens, exact, ALPHA)
    assert t["rejected"] and "position 3 (bonus)" in t["rejected_by"], t
    assert "position 1" not in t["rejected_by"] and "position 2" not in t["rejected_by"], t


# ------------------------------------------------------------------ end to end through the decoder


@pytest.mark.slow
@pytest.mark.parametrize("params", [{}, {"temperature": 0.8, "top_k": 5, "top_p": 0.95}],
                         ids=["T1", "T0.8-topk5-topp0.95"])
def test_chapter_check_accepts_the_decoder_and_rejects_every_wrong_sampler(params):
    """Chapter 2's check: the decoder's own loop (``speculate``) on tiny-vocabulary random models, tokens
    2..gamma + 2 (one speculative step including the bonus position) against enumeration."""
    df = sampling_check(n=800, **params)
    assert list(df.expect_reject) == [False, True, True]
    assert (df.positions == 3).all()
    assert df.as_expected.all(), df.to_string()
