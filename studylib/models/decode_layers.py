"""All decoder layers of a few-row step in one C call, for block-format models on the contiguous cache.

``csrc/decode_layers.c`` runs norms, the block-format linears, RoPE, the KV writes, attention, SiLU
and residuals for every layer; PyTorch keeps the embedding, the RoPE tables, the final norm and the
head. It applies when the model's weights are in a block format (``--weights gguf|q8_0|...``), the
cache is a plain ``DenseKVCache`` (sparse patterns and the paged pool keep their own attention),
the step has at most ``MAX_ROWS`` rows and no layer is skipped (intermediate layer outputs come back
from the C call too, for EAGLE-3's features). Every step
of such a model that qualifies takes this path, so AR decode, speculative verification and token
trees compute each row the same way (row invariance: see the C source).

``STUDYLIB_DECODE_LAYERS=auto|torch``: ``torch`` turns it off (the per-op PyTorch path), to measure
what it saves; ``path(model, kv, rows)`` says which path a step takes.
"""

from __future__ import annotations

import ctypes
import os

import torch

from studylib.errors import StudylibError
from studylib.models import invariant
from studylib.models.kv import DenseKVCache
from studylib.models.quant import FORMATS, QuantTensor, act_kernel, lib

MAX_ROWS = 64  # verify blocks and token trees fit; longer steps go to the per-op path (BLAS GEMM)
F32 = 3  # the kernel's code for plain fp32 weights (csrc/quant_linear.c)
# A fresh prefill (empty cache) of more rows than this goes to the GEMM path too: it is faster there
# (measured: 64 rows 1.4x), and no later step recomputes those rows, so row invariance is not at stake.
PREFILL_GEMM_ROWS = 16


class _Layer(ctypes.Structure):
    _fields_ = [("w", ctypes.c_void_p * 4), ("fmt", ctypes.c_int * 4), ("qkv_bias", ctypes.c_void_p),
                ("norm_in", ctypes.c_void_p), ("norm_post", ctypes.c_void_p),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


def enabled() -> bool:
    m = os.environ.get("STUDYLIB_DECODE_LAYERS", "auto").strip().lower() or "auto"
    if m not in ("auto", "torch"):
        raise StudylibError(f"STUDYLIB_DECODE_LAYERS={m!r} is not auto or torch; unset it or pick one.")
    return m == "auto"


def _is_paged(kv) -> bool:
    # By name, not isinstance: importing kvcache here would be circular (kvcache imports the models).
    return type(kv).__name__ == "PagedBatch" and hasattr(kv, "kernel_slots")


def path(model, kv, rows: int) -> str:
    """``fused`` or ``torch``: which path a step of ``rows`` rows of ``model`` on ``kv`` takes.

    Block-format models take the fused path by default; a dense fp32 model does when its
    ``fused_decode`` attribute is set (chapter 8 sets it on its reference, so that the formats are
    compared on one engine; the study's other chapters keep the per-op path).

    With int8 or bf16 activations (``model.act``) every step takes it, whatever its rows, on the
    contiguous cache and on the serving engine's paged pool alike: one arithmetic for decoding,
    verification, trees, batches and prefill, so a row's bits never depend on the step it is in (the
    batch-invariant mode has nothing to change there). With fp32 activations long fresh prefills and
    steps over ``MAX_ROWS`` go to the GEMM path (faster there), and the paged pool keeps its own."""
    c = model.config
    own_act = getattr(model, "act", "fp32") != "fp32"  # int8 / bf16: one kernel for every row count
    shape_ok = (c.num_heads % c.num_kv_heads == 0 and c.head_dim <= 512 and c.head_dim % 2 == 0
                and enabled() and lib() is not None)
    if not shape_ok:
        return "torch"
    if own_act and _is_paged(kv):
        pool = kv.pool
        return "fused" if (kv.mask_fn is None and pool.device.type == "cpu" and pool.dtype == torch.float32) else "torch"
    fresh_prefill = getattr(kv, "_start", 1) == 0 and rows > PREFILL_GEMM_ROWS
    wants = model.weights_format != "dense" or (getattr(model, "fused_decode", False) and model.dtype == torch.float32)
    ok = (wants and type(kv) is DenseKVCache and (own_act or (rows <= MAX_ROWS and not fresh_prefill))
          and kv.device.type == "cpu" and kv.k[0].dtype == torch.float32
          and (own_act or not invariant.active()))
    return "fused" if ok else "torch"


class _KVMap(ctypes.Structure):  # csrc/decode_layers.c's kvmap_t: the paged pool's addressing
    _fields_ = [("nseq", ctypes.c_int), ("tok_off", ctypes.c_void_p), ("cached", ctypes.c_void_p),
                ("k_slots", ctypes.c_void_p), ("slot_off", ctypes.c_void_p)]


ACT_BASE = 10  # csrc/decode_layers.c: format codes of weights packed for int8 / bf16 activations


def _weight(w) -> tuple[int, int]:
    """(data pointer, kernel format code) of a block weight or a contiguous fp32 tensor."""
    if isinstance(w, QuantTensor):
        if w.act != "fp32":
            kernel = act_kernel(w.act)
            return kernel.pack(w).data_ptr(), ACT_BASE + kernel.CODES[w.fmt]
        return w.data.data_ptr(), FORMATS[w.fmt][0]
    if w.dtype != torch.float32 or not w.is_contiguous():
        raise StudylibError("decode_layers takes block-format or contiguous fp32 weights")
    return w.data_ptr(), F32


def _layers(model, kv):
    # The pointer table is rebuilt only when the cache or the model's weights change (~0.1 ms to build);
    # for the paged pool it is kept on the pool, which outlives the per-step views.
    owner = kv.pool if _is_paged(kv) else kv
    ks = [owner.k[i] for i in range(len(model.model.layers))]
    vs = [owner.v[i] for i in range(len(model.model.layers))]
    first = model.model.layers[0].self_attn.qkv_weight
    key = (id(model), id(owner), id(first), getattr(first, "act", None))
    cached = getattr(owner, "_decode_layers", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    table = (_Layer * len(model.model.layers))()
    keep = []
    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        ws = (a.qkv_weight, a.o_proj.weight, m.gate_up_weight, m.down_proj.weight)
        if any(w is None for w in ws):
            raise StudylibError("decode_layers needs fused q/k/v and gate/up weights (fuse_projections)")
        for j, w in enumerate(ws):
            table[i].w[j], table[i].fmt[j] = _weight(w)
        bias = None if a.qkv_bias is None else a.qkv_bias.float().contiguous()
        norms = [layer.input_layernorm.weight.detach().float().contiguous(),
                 layer.post_attention_layernorm.weight.detach().float().contiguous()]
        keep += [*ws, bias, *norms]
        table[i].qkv_bias = None if bias is None else bias.data_ptr()
        table[i].norm_in, table[i].norm_post = norms[0].data_ptr(), norms[1].data_ptr()
        table[i].k_cache, table[i].v_cache = ks[i].data_ptr(), vs[i].data_ptr()
    owner._decode_layers = (key, table, keep)  # keep: everything the table points into stays alive
    return table


def run(model, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv, hidden_layers=(),
        hidden: dict | None = None, skip_layers=()) -> torch.Tensor:
    """x (B, T, hidden) after every layer; the cache has had ``kv.begin(T)`` called (or ``kv`` is a
    ``PagedBatch`` view of the pool, x (1, N, hidden) its sequences' new tokens back to back).
    ``hidden_layers``: layer indices whose outputs go into ``hidden`` (index -> (B, T, hidden)).
    ``skip_layers``: layers bypassed (a self-speculative draft); their cache slots for these tokens are
    left as they were, as the per-op path leaves them. Not with ``hidden_layers``: an index would be
    ambiguous once layers are missing."""
    c = model.config
    skip = sorted(set(skip_layers))
    if skip and hidden_layers:
        raise StudylibError("decode_layers: skip_layers and hidden_layers together are not supported")
    if any(not 0 <= i < c.num_layers for i in skip):
        raise StudylibError(f"decode_layers: cannot skip layers {skip} of a {c.num_layers}-layer model")
    if x.dim() != 3 or x.shape[-1] != c.hidden_size or x.device.type != "cpu" or not x.dtype.is_floating_point:
        raise ValueError(f"decode_layers: x must be a floating CPU tensor (B, T, {c.hidden_size}), got {x.dtype} "
                         f"{tuple(x.shape)} on {x.device}")
    B, T, hid = x.shape
    if cos.shape[-1] != c.head_dim or sin.shape != cos.shape or cos.numel() not in (T * c.head_dim, B * T * c.head_dim):
        raise ValueError(f"decode_layers: cos/sin must hold {T} positions of {c.head_dim} (per sequence or shared), "
                         f"got {tuple(cos.shape)} / {tuple(sin.shape)}")
    paged = _is_paged(kv)
    if paged:
        if B != 1 or T != kv.num_tokens:
            raise StudylibError(f"decode_layers: a ({B}, {T}) step does not fit a paged batch of {kv.num_tokens} tokens")
        tok_off, cached, k_slots, slot_off = kv.kernel_slots()
        kvmap = _KVMap(len(kv.new), tok_off.data_ptr(), cached.data_ptr(), k_slots.data_ptr(), slot_off.data_ptr())
        start, max_len, mask_u8 = 0, 0, None
    else:
        if B != kv.batch or T != kv._n or kv.k[0].shape != (B, c.num_kv_heads, kv.max_len, c.head_dim):
            raise StudylibError(f"decode_layers: a ({B}, {T}) step does not fit a cache of batch {kv.batch} opened "
                                f"for {kv._n} tokens")
        kvmap, start, max_len = None, kv._start, kv.max_len
        mask = kv._mask
        mask_u8 = None
        if mask is not None:
            mask_u8 = mask.expand(B, 1, T, kv.length).reshape(B, T, kv.length).to(torch.uint8).contiguous()
    x = x.float().contiguous().clone()
    cos_t = cos.float().expand(B, 1, T, c.head_dim).reshape(B, T, c.head_dim).contiguous()
    sin_t = sin.float().expand(B, 1, T, c.head_dim).reshape(B, T, c.head_dim).contiguous()
    if getattr(model, "act", "fp32") != "fp32":
        # The int8 / bf16 linears live in their own library (one build per ISA path): hand over its entry.
        lib().decode_layers_set_act(ctypes.c_void_p(act_kernel(model.act).entry()))
    outs, table = {}, None
    if hidden_layers:
        table = (ctypes.c_void_p * c.num_layers)()
        for i in sorted(set(hidden_layers)):
            if not 0 <= i < c.num_layers:
                raise StudylibError(f"decode_layers: no layer {i} in a {c.num_layers}-layer model")
            outs[i] = torch.empty(B, T, hid)
            table[i] = outs[i].data_ptr()
    table_all = _layers(model, kv)
    if skip:
        # The kept layers' entries, in order: the C loop runs whatever table it is given.
        kept = [i for i in range(c.num_layers) if i not in skip]
        layers, n_layers = (_Layer * len(kept))(*(table_all[i] for i in kept)), len(kept)
    else:
        layers, n_layers = table_all, c.num_layers
    rc = lib().decode_layers(
        n_layers, ctypes.addressof(layers), x.data_ptr(), B, T, hid, c.num_heads,
        c.num_kv_heads, c.head_dim, c.intermediate_size, float(c.rms_norm_eps), cos_t.data_ptr(),
        sin_t.data_ptr(), start, max_len, None if mask_u8 is None else mask_u8.data_ptr(),
        torch.get_num_threads(), None if kvmap is None else ctypes.byref(kvmap), table)
    if rc:
        raise StudylibError(f"decode_layers failed ({rc})")
    if hidden is not None:
        hidden.update(outs)
    return x


def reference(model, ids: torch.Tensor, kv):
    """The pure-PyTorch reference of the fused step: the same forward of ``ids`` over ``kv`` with every
    layer run op by op (``STUDYLIB_DECODE_LAYERS=torch``). Returns the model's output."""
    old = os.environ.get("STUDYLIB_DECODE_LAYERS")
    os.environ["STUDYLIB_DECODE_LAYERS"] = "torch"
    try:
        return model(ids, kv.begin(ids.shape[1]), logits="all")
    finally:
        if old is None:
            os.environ.pop("STUDYLIB_DECODE_LAYERS", None)
        else:
            os.environ["STUDYLIB_DECODE_LAYERS"] = old
