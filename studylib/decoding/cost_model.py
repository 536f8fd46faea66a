"""The cost model of a speculative step, in one place for every drafter and decoder.

A step verifies gamma + 1 rows at ``verify_cost`` target forwards and drafts gamma tokens at ``cost_ratio``
target forwards each; with per-token acceptance alpha it commits ``expected_tokens(alpha, gamma)`` tokens
(Leviathan et al. 2023). ``layer_cost`` is the first guess at a draft's cost ratio: the weights a forward
reads, which bound a batch-1 step."""

from __future__ import annotations

from studylib.models import LlamaModel


def expected_tokens(alpha: float, gamma: int) -> float:
    """Leviathan et al. eq. 1: expected tokens committed per target forward, (1 - a^(g+1)) / (1 - a)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Leviathan et al. Theorem 3.8: walltime improvement when a draft forward costs c target forwards
    and verifying gamma + 1 tokens costs ``verify_cost`` target forwards (1 in the paper, where the
    target is memory-bound; more on a CPU, where a forward of several tokens costs more than one)."""
    return expected_tokens(alpha, gamma) / (verify_cost + gamma * cost_ratio)


def layer_cost(model: LlamaModel, layers: int | None = None) -> float:
    """Weights read per decoded token (in parameters): the layers run plus the LM head.

    The embedding lookup reads one row, so it is left out; at batch 1 a forward is bound by
    weight traffic, which makes this the natural first guess at the draft/target cost ratio.
    """
    c = model.config
    per_layer = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) + 3 * c.hidden_size * c.intermediate_size
    n = c.num_layers if layers is None else layers
    return float(n * per_layer + c.vocab_size * c.hidden_size)
