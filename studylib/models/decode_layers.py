"""All decoder layers of a few-row step in one C call, for block-format models on the contiguous cache.

``csrc/decode_layers.c`` runs norms, the block-format linears, RoPE, the KV writes, attention, SiLU
and residuals for every layer; PyTorch keeps the embedding, the RoPE tables, the final norm and the
head. It applies when the model's weights are in a block format (``--weights gguf|q8_0|...``), the
cache is a plain ``DenseKVCache`` (sparse patterns and the paged pool keep their own attention),
the step has at most ``MAX_ROWS`` rows and no intermediate layer outputs are asked for. Every step
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
from studylib.models.quant import FORMATS, QuantTensor, lib

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


def path(model, kv, rows: int) -> str:
    """``fused`` or ``torch``: which path a step of ``rows`` rows of ``model`` on ``kv`` takes.

    Block-format models take the fused path by default; a dense fp32 model does when its
    ``fused_decode`` attribute is set (chapter 8 sets it on its reference, so that the formats are
    compared on one engine; the study's other chapters keep the per-op path)."""
    c = model.config
    fresh_prefill = getattr(kv, "_start", 1) == 0 and rows > PREFILL_GEMM_ROWS
    wants = model.weights_format != "dense" or (getattr(model, "fused_decode", False) and model.dtype == torch.float32)
    ok = (wants and type(kv) is DenseKVCache and rows <= MAX_ROWS and not fresh_prefill
          and kv.device.type == "cpu" and kv.k[0].dtype == torch.float32
          and c.num_heads % c.num_kv_heads == 0 and c.head_dim <= 512 and c.head_dim % 2 == 0
          and enabled() and not invariant.active() and lib() is not None)
    return "fused" if ok else "torch"


I8_BASE = 10  # csrc/decode_layers.c: format codes of weights packed for int8 activations


def _weight(w) -> tuple[int, int]:
    """(data pointer, kernel format code) of a block weight or a contiguous fp32 tensor."""
    if isinstance(w, QuantTensor):
        if w.act == "int8":
            from studylib.models import int8_linear

            return int8_linear.pack(w).data_ptr(), I8_BASE + int8_linear.CODES[w.fmt]
        return w.data.data_ptr(), FORMATS[w.fmt][0]
    if w.dtype != torch.float32 or not w.is_contiguous():
        raise StudylibError("decode_layers takes block-format or contiguous fp32 weights")
    return w.data_ptr(), F32


def _layers(model, kv: DenseKVCache):
    # The pointer table is rebuilt only when the cache or the model's weights change (~0.1 ms to build).
    first = model.model.layers[0].self_attn.qkv_weight
    key = (id(model), id(kv), id(first), getattr(first, "act", None))
    cached = getattr(kv, "_decode_layers", None)
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
        table[i].k_cache, table[i].v_cache = kv.k[i].data_ptr(), kv.v[i].data_ptr()
    kv._decode_layers = (key, table, keep)  # keep: everything the table points into stays alive
    return table


def run(model, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: DenseKVCache) -> torch.Tensor:
    """x (B, T, hidden) after every layer; the cache has had ``kv.begin(T)`` called."""
    c = model.config
    B, T, hid = x.shape
    if B != kv.batch or T != kv._n or kv.k[0].shape != (B, c.num_kv_heads, kv.max_len, c.head_dim):
        raise StudylibError(f"decode_layers: a ({B}, {T}) step does not fit a cache of batch {kv.batch} opened "
                            f"for {kv._n} tokens")
    x = x.float().contiguous().clone()
    cos_t = cos.float().expand(B, 1, T, c.head_dim).reshape(B, T, c.head_dim).contiguous()
    sin_t = sin.float().expand(B, 1, T, c.head_dim).reshape(B, T, c.head_dim).contiguous()
    mask = kv._mask
    mask_u8 = None
    if mask is not None:
        mask_u8 = mask.expand(B, 1, T, kv.length).reshape(B, T, kv.length).to(torch.uint8).contiguous()
    if getattr(model, "act", "fp32") == "int8":
        from studylib.models import int8_linear

        # The int8 linears live in their own library (one build per ISA path): hand over its entry.
        lib().decode_layers_set_i8(ctypes.cast(int8_linear.lib().i8_linear, ctypes.c_void_p))
    rc = lib().decode_layers(
        c.num_layers, ctypes.addressof(_layers(model, kv)), x.data_ptr(), B, T, hid, c.num_heads,
        c.num_kv_heads, c.head_dim, c.intermediate_size, float(c.rms_norm_eps), cos_t.data_ptr(),
        sin_t.data_ptr(), kv._start, kv.max_len, None if mask_u8 is None else mask_u8.data_ptr(),
        torch.get_num_threads())
    if rc:
        raise StudylibError(f"decode_layers failed ({rc})")
    return x
