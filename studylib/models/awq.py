"""AWQ-style 4-bit weights: Q4_0 blocks with activation-aware per-input-channel scales.

Why Q4_0 and not Q4_1: the embedded model was itself made by round-to-nearest Q4_1 (its GGUF file), so
re-quantising its weights to Q4_1 gives back the very same blocks (chapter 8 measures this) and there
is nothing left for AWQ to improve. Q4_0 (symmetric, no offset, 4.5 bits) is lossy on this model, and
AWQ over Q4_0 is compared with plain round-to-nearest Q4_0 at the same size.

Activation-aware weight quantisation (AWQ; Lin, Tang, Tang, Yang, Dang, Gan and Han, "AWQ:
Activation-aware Weight Quantization for LLM Compression and Acceleration", MLSys 2024) rests on one
observation: a few input channels carry much larger activations than the rest, so the weights that
multiply them matter most. Scaling those weight columns up by ``s`` before round-to-nearest and the
activations down by ``1/s`` leaves the product unchanged in exact arithmetic but gives the salient
columns a finer effective grid. Nothing new is stored: the block format stays plain Q4_0 (read by the
same kernel), and ``1/s`` is folded into whatever produces the activations.

What this module does, per decoder layer, from one forward pass over calibration tokens:

1. It records, for every linear, the mean absolute activation of each input channel and up to
   ``MAX_ROWS`` randomly chosen input rows (by swapping ``llama.linear`` for a recording wrapper).
2. ``down_proj`` (input ``silu(gate) * up``): grid-search ``alpha`` in {0, 0.1, ..., 1}, with
   ``s = mean|x| ** alpha`` normalised by ``sqrt(max(s) * min(s))``, minimising the MSE of
   ``x @ W.T`` against ``x @ (Q(W * s) / s).T`` on the sampled rows. ``1/s`` is folded into the *up*
   rows of the fused gate/up weight (scaling ``up`` channel-wise scales the product channel-wise).
3. ``gate_up`` (input: ``post_attention_layernorm``'s output) is then searched the same way on that
   folded weight (its input is unchanged by the fold), and ``1/s`` goes into the norm's weight.
4. ``qkv`` (input: ``input_layernorm``'s output) likewise, folding into ``input_layernorm``.
5. ``o_proj`` is plain round-to-nearest Q4_0: its input comes from ``v`` through the softmax with
   grouped-query heads, so there is no per-channel producer to fold into (AWQ's reference code also
   skips the v -> o scaling when the head counts differ).
6. The embedding and an untied head are Q8_0, as for every block format (``quant.embedding_and_head``).

``alpha = 0`` (``s = 1``) is plain round-to-nearest and is always in the grid, so on the calibration
rows each linear is never worse than RTN Q4_0. The search is per linear and greedy (not the full
block-output loss of the paper, nor its weight clipping search), and activations are recorded once
from the dense model, which the folds leave mathematically unchanged.

Calibration: ``calibration`` is a LongTensor of token ids, (batch, seq), without padding; the chapter
passes ids of real text. With ``None`` (e.g. ``load_model(..., weights="awq4")``) it falls back to
seeded random ids of shape ``DEFAULT_CALIBRATION``, which fit the model's shapes but not its
language: expect a smaller gain than with real text.

``awq_quantise`` changes the model in place: the RMSNorm weights are divided by the scales, so the
model is only the same function again once the returned blocks replace its linears
(``weights._install``, which ``apply_weights`` calls right after).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from studylib.errors import StudylibError
from studylib.models.quant import QuantTensor, dequantize_ref, embedding_and_head, quantize

FMT = "q4_0"
ALPHAS = tuple(i / 10 for i in range(11))  # 0 first: plain RTN wins ties
MAX_ROWS = 256  # sampled input rows per linear for the search loss
DEFAULT_CALIBRATION = (8, 64)  # (batch, seq) of the seeded random ids used when none are given
_log = logging.getLogger(__name__)


@dataclass
class _Stats:
    """One linear's inputs: sum of |x| per channel over ``count`` rows, and sampled rows."""

    abs_sum: torch.Tensor
    count: int = 0
    rows: list[torch.Tensor] = field(default_factory=list)

    def mean(self) -> torch.Tensor:
        return self.abs_sum / max(self.count, 1)

    def sample(self, gen: torch.Generator) -> torch.Tensor:
        x = torch.cat(self.rows)
        if x.shape[0] > MAX_ROWS:
            x = x[torch.randperm(x.shape[0], generator=gen)[:MAX_ROWS]]
        return x


def default_calibration(vocab_size: int, shape: tuple[int, int] = DEFAULT_CALIBRATION) -> torch.Tensor:
    """Seeded random token ids, the fallback when no calibration text is given."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, shape, generator=gen)


def record_inputs(model, ids: torch.Tensor) -> dict[int, _Stats]:
    """Run ``ids`` through ``model`` once, recording every linear's input keyed by ``id(weight)``."""
    from studylib.models import llama
    from studylib.models.kv import DenseKVCache

    gen = torch.Generator().manual_seed(0)
    stats: dict[int, _Stats] = {}
    original = llama.linear

    def recording(x, weight, bias=None):
        flat = x.detach().reshape(-1, x.shape[-1]).float()
        st = stats.setdefault(id(weight), _Stats(torch.zeros(flat.shape[1])))
        st.abs_sum += flat.abs().sum(0)
        st.count += flat.shape[0]
        if flat.shape[0] > MAX_ROWS:
            flat = flat[torch.randperm(flat.shape[0], generator=gen)[:MAX_ROWS]]
        st.rows.append(flat.clone())
        return original(x, weight, bias)

    batch, seq = ids.shape
    cache = DenseKVCache(model.config, batch, seq, device=model.device, dtype=model.dtype)
    llama.linear = recording
    try:
        with torch.inference_mode():
            model(ids.to(model.device), cache.begin(seq), logits="none")
    finally:
        llama.linear = original
    # Plain tensors again (outside inference mode), so later in-place folds may use them.
    return {k: _Stats(v.abs_sum.clone(), v.count, [r.clone() for r in v.rows]) for k, v in stats.items()}


def _rtn_error(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> float:
    """MSE of ``x @ w.T`` against the same with ``w`` stored as ``Q(w * s) / s``."""
    w_hat = dequantize_ref(quantize(w * s[None, :], FMT)) / s[None, :]
    return F.linear(x, w - w_hat).pow(2).mean().item()


def search_scales(x: torch.Tensor, w: torch.Tensor, act_mean: torch.Tensor, alphas=ALPHAS):
    """Grid-search the per-input-channel scale of one linear.

    ``x``: (rows, K) sampled inputs; ``w``: (N, K) weight; ``act_mean``: (K,) mean |x| per channel.
    Returns ``(alpha, s, losses)``: the best exponent, its (K,) scales (all ones for alpha 0), and
    the output MSE for each alpha tried."""
    x, w, act = x.float(), w.detach().float(), act_mean.float().clamp_min(1e-5)
    best: tuple[float, torch.Tensor] | None = None
    losses: dict[float, float] = {}
    for alpha in alphas:
        s = act.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        losses[alpha] = _rtn_error(x, w, s)
        if best is None or losses[alpha] < losses[best[0]]:
            best = (alpha, s)
    assert best is not None, "empty alpha grid"
    return best[0], best[1], losses


def awq_fold(model, calibration: torch.Tensor | None = None):
    """Choose the scales and fold them: returns ``(weights, alphas)``, where ``weights`` holds the
    scaled dense (N, K) weights to quantise (keys ``{i}.qkv``, ``{i}.o``, ``{i}.gate_up``, ``{i}.down``)
    and ``alphas`` the chosen exponent per scaled linear. The norms' weights are divided in place; the
    model's own linear weights are left untouched (the fused tensors may be shared)."""
    if model.weights_format != "dense" or model.dtype != torch.float32:
        raise StudylibError(f"AWQ quantises a dense fp32 model; this one is {model.weights_format} "
                            f"{str(model.dtype).replace('torch.', '')}.")
    if any(layer.self_attn.qkv_weight is None or layer.mlp.gate_up_weight is None for layer in model.model.layers):
        model.fuse_projections()
    ids = default_calibration(model.config.vocab_size) if calibration is None else calibration
    if ids.dim() != 2:
        raise ValueError(f"calibration ids must be (batch, seq), got shape {tuple(ids.shape)}")
    stats = record_inputs(model, ids.long())
    gen = torch.Generator().manual_seed(0)
    weights: dict[str, torch.Tensor] = {}
    alphas: dict[str, float] = {}
    # The grid search is most of AWQ's cost and its outcome (one alpha per linear) depends only on the
    # model's weights, the calibration ids and this module: a fresh process (a whole run) that loads the
    # same arm again reuses the chosen alphas. Each linear still runs search_scales, over its one alpha,
    # with the same sampled rows, so the scales and the blocks are the very ones the full search gives.
    key = _alpha_key(model, ids)
    chosen = _cached_alphas(key)

    def grid(name: str):
        return (chosen[name],) if chosen is not None and name in chosen else ALPHAS
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qkv = attn.qkv_weight.detach().float()
            gate_up = mlp.gate_up_weight.detach().float()
            down = mlp.down_proj.weight.detach().float()
            st_qkv, st_gu, st_down = (stats[id(w)] for w in (attn.qkv_weight, mlp.gate_up_weight,
                                                               mlp.down_proj.weight))
            # down first: its 1/s goes into the up rows of gate_up, which is searched afterwards.
            alphas[f"{i}.down"], s, _ = search_scales(st_down.sample(gen), down, st_down.mean(), grid(f"{i}.down"))
            weights[f"{i}.down"] = down * s[None, :]
            inter = gate_up.shape[0] // 2  # gate rows, then up rows
            gate_up = torch.cat([gate_up[:inter], gate_up[inter:] / s[:, None]])
            # gate_up: input is post_attention_layernorm's output, unchanged by the fold above.
            alphas[f"{i}.gate_up"], s, _ = search_scales(st_gu.sample(gen), gate_up, st_gu.mean(),
                                                        grid(f"{i}.gate_up"))
            weights[f"{i}.gate_up"] = gate_up * s[None, :]
            layer.post_attention_layernorm.weight.data.div_(s.to(layer.post_attention_layernorm.weight.dtype))
            alphas[f"{i}.qkv"], s, _ = search_scales(st_qkv.sample(gen), qkv, st_qkv.mean(), grid(f"{i}.qkv"))
            weights[f"{i}.qkv"] = qkv * s[None, :]
            layer.input_layernorm.weight.data.div_(s.to(layer.input_layernorm.weight.dtype))
            # o_proj: no per-channel producer to fold into (v -> softmax -> grouped heads): plain RTN.
            weights[f"{i}.o"] = attn.o_proj.weight.detach().float()
    _log.debug("awq alphas: %s", alphas)
    if chosen is None:
        _store_alphas(key, alphas)
    return weights, alphas


def _alpha_key(model, ids: torch.Tensor) -> str:
    """What the chosen alphas depend on: every weight of the model, the calibration ids, this module's
    source and the grid."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(repr(ALPHAS).encode())
    h.update(ids.long().contiguous().numpy().tobytes())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


def _cached_alphas(key: str) -> dict[str, float] | None:
    import json

    from studylib.cache import cache_dir

    if os.environ.get("STUDYLIB_AWQ_CACHE", "1") == "0":
        return None
    path = cache_dir("awq") / f"{key}.json"
    try:
        return {k: float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return None


def _store_alphas(key: str, alphas: dict[str, float]) -> None:
    import json

    from studylib.cache import cache_dir

    if os.environ.get("STUDYLIB_AWQ_CACHE", "1") == "0":
        return
    path = cache_dir("awq") / f"{key}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(alphas))
    tmp.replace(path)


def awq_quantise(model, calibration: torch.Tensor | None) -> dict[str, QuantTensor]:
    """AWQ-style Q4_0 blocks for ``model``'s linears (plus Q8_0 embedding / untied head), keyed as
    ``quant.embedding_and_head`` keys them. Folds the scales into the model's norms in place (see the
    module docstring); ``calibration``: (batch, seq) token ids of real text, or None for seeded
    random ids."""

    weights, _ = awq_fold(model, calibration)
    return {**{name: quantize(w, FMT) for name, w in weights.items()}, **embedding_and_head(model)}
