"""The one verification step every lossless drafting method shares.

A drafter proposes ``n`` tokens; the target scores the prompt-so-far plus those tokens in ONE forward,
which yields ``n + 1`` next-token distributions (row i predicts the token after draft position i-1;
row 0 is the token after the committed text). Verification decides how many draft tokens survive and
which token the target contributes next, so every step commits ``accepted + 1`` tokens.

- Greedy: accept while the draft equals the target's argmax; the next token is the argmax at the
  first mismatch (or after the last draft token). The output is token-identical to AR decoding.
- Sampling (Leviathan et al. 2023, Chen et al. 2023): accept draft token x_i with probability
  min(1, p_i(x_i) / q_i(x_i)); on the first rejection draw from the residual norm(max(0, p_i - q_i)).
  With full acceptance draw a bonus token from p_n. The committed tokens are then distributed exactly
  as if sampled from the target p one by one, whatever q is. A deterministic drafter (prompt lookup,
  Jacobi guesses) is the special case q_i = one-hot(x_i), which is still exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from studylib.sampling import SamplingParams, probs, sample_from


def verify_greedy(target_logits: torch.Tensor, draft_tokens: Sequence[int]) -> tuple[int, int]:
    """Return (number of draft tokens accepted, the target's next token).

    target_logits: (n+1, V) logits (or probabilities: only the argmax matters) for the n draft slots plus
    one; draft_tokens: n ids.
    """
    n = len(draft_tokens)
    if target_logits.shape[0] < n + 1:
        raise ValueError(f"need {n + 1} target rows for {n} draft tokens, got {target_logits.shape[0]}")
    best = target_logits[: n + 1].argmax(-1).tolist()  # (n+1,) one sync for the whole block
    accepted = 0
    while accepted < n and best[accepted] == int(draft_tokens[accepted]):
        accepted += 1
    return accepted, int(best[accepted])


def verify_sampling(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: Sequence[int],
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative rejection sampling; return (accepted draft tokens, the next token).

    target_probs: (n+1, V) target distributions p_0..p_n (after temperature/top-k/top-p).
    draft_probs: (n, V) the distributions q_i the draft tokens were sampled from, or None for a
    deterministic proposal (q_i = one-hot of the proposed token).
    """
    n = len(draft_tokens)
    if target_probs.shape[0] < n + 1:
        raise ValueError(f"need {n + 1} target rows for {n} draft tokens, got {target_probs.shape[0]}")
    if n == 0:
        return 0, int(sample_from(target_probs[0], generator).item())
    dev = target_probs.device
    toks = torch.as_tensor(list(draft_tokens), dtype=torch.long, device=dev)
    rows = torch.arange(n, device=dev)
    p_x = target_probs[rows, toks].float()  # (n,)
    q_x = draft_probs[rows, toks].float() if draft_probs is not None else torch.ones(n, device=dev)
    # Always draw n uniforms so the generator advances the same way whatever gets accepted.
    u = torch.rand(n, generator=generator, device=dev)
    # u < p/q written without the division (q_x > 0 for a token that was actually drawn from q).
    reject = (u * q_x >= p_x).tolist()
    for i in range(n):
        if reject[i]:
            return i, int(sample_from(residual(target_probs[i], _q_row(draft_probs, i, toks)), generator).item())
    return n, int(sample_from(target_probs[n], generator).item())


def _q_row(draft_probs: torch.Tensor | None, i: int, toks: torch.Tensor) -> torch.Tensor:
    # A deterministic proposal is a one-hot q; pass the token id and let ``residual`` zero it out.
    return draft_probs[i] if draft_probs is not None else toks[i]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) (V,); q may be a (V,) distribution or a scalar token id tensor (one-hot)."""
    if q.dim() == 0:
        r = p.float().clone()
        r[q] = 0.0
    else:
        r = (p.float() - q.float()).clamp_min(0.0)
    total = r.sum()
    # p == q up to rounding: a rejection then has probability ~0, and p itself is the right fallback.
    if not bool(total > 1e-12):
        return p.float()
    return r / total


def verify(
    target_logits: torch.Tensor,
    draft_tokens: Sequence[int],
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
    draft_probs: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Dispatch on the sampling mode: greedy argmax matching, else exact rejection sampling.

    target_logits: (n+1, V) raw logits; they go through ``sampling.probs`` so "the target distribution"
    is the same one AR decoding samples from. draft_probs: (n, V) or None for deterministic drafts.
    """
    if sampling.greedy:
        return verify_greedy(target_logits, draft_tokens)
    return verify_sampling(probs(target_logits, sampling), draft_probs, draft_tokens, generator)


__all__ = ["residual", "verify", "verify_greedy", "verify_sampling"]
