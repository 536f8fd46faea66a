"""``--weights FORMAT``: which stored form of the weights the linears compute with.

- ``dense``: the fp32/bf16 tensors (the HF-parity reference, the default);
- ``gguf``: the embedded model's own GGUF blocks (Q4_1 linears, Q8_0 embedding and tied head), read
  from the file, no dequantised copy kept. Its dequantised values *are* the dense fp32 model (the
  converter dequantises the same file), so ``gguf`` is the same model reading 5.6x fewer bytes;
- ``q8_0``, ``q4_0``, ``q4_1``: re-quantised from the dense weights by round-to-nearest (lossy in
  general; the embedded model's weights are Q4_1 values already, so ``q4_1`` reproduces its blocks);
- ``awq4``: Q4_0 with activation-aware per-channel scales (AWQ-style, see ``awq.py``), lossy;
- ``FORMAT+bf16prefill`` (any block format): the same weights, but steps longer than the kernel's
  row limit (prefill) widen them to bf16 and multiply bf16 activations in the BLAS GEMM (AMX or
  AVX512_BF16 where the CPU has them). Opt-in because it is no longer the fp32 model for those steps:
  decode stays exact, the prompt's KV carries bf16 rounding.

Activations, norms, RoPE and the KV cache stay fp32 in every format; only linear weights and the
embedding change form.

``--act ARITH`` (``apply_act``) picks what the block-format linears multiply x in:
- ``fp32`` (default): x stays fp32 and the weights are widened to fp32 in registers: the exact model;
- ``int8``: each row of x is rounded to int8 per 32-block with an fp32 scale (llama.cpp's scheme) and
  multiplied in integer dot products (``int8_linear``): a model of its own, the same for every row
  count, so lossless methods stay token-identical to AR under it;
- ``bf16``: each element of x is rounded to bf16 and the block sums run in bf16 dot products
  (``bf16_linear``, AVX512-BF16 where the CPU has it): also a model of its own, closer to fp32 than
  int8, with the same guarantees.
"""

from __future__ import annotations

import torch
from torch import nn

from studylib.errors import StudylibError
from studylib.models.quant import QuantTensor, embedding_and_head, quantize

WEIGHT_FORMATS = ("dense", "gguf", "q8_0", "q4_0", "q4_1", "awq4")
ACTS = ("fp32", "int8", "bf16")
OPTIONS = ("bf16prefill",)  # FORMAT+OPTION
_GGUF_MODELS = ("smollm2-135m",)


class QuantLinear(nn.Module):
    """A linear whose weight is a ``QuantTensor`` (read by ``cpu_linear.linear``)."""

    def __init__(self, weight: QuantTensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = weight
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from studylib.models.quant import linear

        return linear(x, self.weight, self.bias)


class QuantEmbedding(nn.Module):
    def __init__(self, weight: QuantTensor):
        super().__init__()
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.rows(ids)


def check_weights(fmt: str, model_name: str | None = None, device: str | torch.device = "cpu") -> str:
    """Validate a ``--weights`` value (and its model/device) without loading anything; returns it."""
    from studylib.models.names import ALIASES

    base, plus, option = fmt.partition("+")
    if base not in WEIGHT_FORMATS or (plus and (option not in OPTIONS or base == "dense")):
        raise StudylibError(f"unknown --weights {fmt!r}; use one of {', '.join(WEIGHT_FORMATS)}, or a block format "
                            f"with +{' / +'.join(OPTIONS)} (e.g. gguf+bf16prefill).")
    fmt = base
    if fmt != "dense" and torch.device(device).type != "cpu":
        raise StudylibError(f"--weights {fmt} runs on CPU only (block kernels); use --weights dense on {device}.")
    if fmt == "gguf" and model_name is not None and ALIASES.get(model_name, model_name) not in _GGUF_MODELS:
        raise StudylibError(f"--weights gguf reads the embedded model's GGUF file; {model_name!r} has none here: "
                            "use --weights q4_1 (or q8_0/q4_0/awq4) to quantise it.")
    return fmt


def apply_weights(model, fmt: str, *, calibration: torch.Tensor | None = None):
    """Put ``model``'s linears and embedding in ``fmt`` (in place; returns the model)."""
    check_weights(fmt, model.config.name, model.device)
    name = fmt
    fmt, _, option = fmt.partition("+")
    if fmt == "dense":
        return model
    if model.weights_format != "dense":
        raise StudylibError(f"the model's weights are {model.weights_format} already; load it dense to re-quantise.")
    if model.dtype != torch.float32:
        raise StudylibError(f"--weights {fmt} computes in fp32; load with --dtype float32.")
    if fmt == "gguf":
        tensors = _gguf_tensors(model.config)
    else:
        tensors = _requantised(model, fmt, calibration)
    if option == "bf16prefill":
        for qt in tensors.values():
            qt.prefill_dtype = torch.bfloat16
    _install(model, tensors)
    model.weights_format = name
    return model


def check_act(act: str, weights: str = "gguf") -> str:
    """Validate an ``--act`` value against the ``--weights`` it composes with; returns it."""
    if act not in ACTS:
        raise StudylibError(f"unknown --act {act!r}; use one of {', '.join(ACTS)}.")
    if act != "fp32" and weights.partition("+")[0] == "dense":
        raise StudylibError(f"--act {act} rounds the activations of block-format linears; add --weights gguf "
                            "(or q8_0 / q4_0 / q4_1 / awq4), or use --act fp32 with dense weights.")
    return act


def apply_act(model, act: str):
    """Make every block-format linear of ``model`` multiply in ``act`` (in place; returns the model).
    The weights are packed for that arithmetic's kernel here, once, so no timed step pays for it."""
    check_act(act, model.weights_format)
    if act == model.act:
        return model
    from studylib.models.quant import act_kernel

    kernel = act_kernel(act)
    for w in linear_weights(model):
        if isinstance(w, QuantTensor):
            w.act = act
            if kernel is not None:
                kernel.pack(w)
    model.act = act
    return model


def install_layer(layer, qkv: QuantTensor, o: QuantTensor, gate_up: QuantTensor, down: QuantTensor) -> None:
    """Swap a decoder layer's linears for block weights (fused q/k/v and gate/up), dropping the dense ones."""
    attn, mlp = layer.self_attn, layer.mlp
    attn.qkv_weight = qkv
    attn.q_proj = attn.k_proj = attn.v_proj = None
    attn.o_proj = QuantLinear(o)
    mlp.gate_up_weight = gate_up
    mlp.gate_proj = mlp.up_proj = None
    mlp.down_proj = QuantLinear(down)


def _install(model, t: dict[str, QuantTensor]) -> None:
    """Swap in block weights and drop the dense ones (no dequantised copy is kept)."""
    model._fused = False  # the dense fused copies are gone; .to() must not rebuild them
    for i, layer in enumerate(model.model.layers):
        install_layer(layer, t[f"{i}.qkv"], t[f"{i}.o"], t[f"{i}.gate_up"], t[f"{i}.down"])
    model.model.embed_tokens = QuantEmbedding(t["embed"])
    model.lm_head = QuantLinear(t.get("head", t["embed"]))


def _requantised(model, fmt: str, calibration: torch.Tensor | None) -> dict[str, QuantTensor]:
    if fmt == "awq4":
        from studylib.models.awq import awq_quantise

        return awq_quantise(model, calibration)
    out: dict[str, QuantTensor] = {}
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        out[f"{i}.qkv"] = quantize(attn.qkv_weight, fmt)
        out[f"{i}.o"] = quantize(attn.o_proj.weight, fmt)
        out[f"{i}.gate_up"] = quantize(mlp.gate_up_weight, fmt)
        out[f"{i}.down"] = quantize(mlp.down_proj.weight, fmt)
    return {**out, **embedding_and_head(model)}


def _unpermute_rows(n: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (it interleaves each head's two RoPE halves)."""
    return torch.arange(n).view(heads, (n // heads) // 2, 2).transpose(1, 2).reshape(n)


def _gguf_tensors(cfg) -> dict[str, QuantTensor]:
    from studylib.bench.provenance import record_artifact
    from studylib.models.gguf_index import tensor_blocks, tensor_index
    from studylib.models.hub import smollm2_gguf

    path = record_artifact("gguf", smollm2_gguf())
    raw = tensor_index(path)  # the tensor infos only: GGUFReader would parse the whole vocabulary first

    def block(name: str) -> QuantTensor:
        if name not in raw:
            raise StudylibError(f"the GGUF file has no tensor {name!r}; it is not the embedded SmolLM2 layout.")
        t = raw[name]
        data = torch.from_numpy(tensor_blocks(path, t))
        return QuantTensor(data, t.fmt, (data.shape[0], int(t.shape[0])))

    def cat(parts: list[QuantTensor]) -> QuantTensor:
        if len({p.fmt for p in parts}) != 1:
            raise StudylibError("GGUF tensors fused into one matmul must share a block format")
        data = torch.cat([p.data for p in parts])
        return QuantTensor(data, parts[0].fmt, (data.shape[0], parts[0].shape[1]))

    def rows(qt: QuantTensor, order: torch.Tensor) -> QuantTensor:
        return QuantTensor(qt.data[order], qt.fmt, qt.shape)

    out: dict[str, QuantTensor] = {}
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        q, k = block(p + "attn_q.weight"), block(p + "attn_k.weight")
        q = rows(q, _unpermute_rows(q.shape[0], cfg.num_heads))
        k = rows(k, _unpermute_rows(k.shape[0], cfg.num_kv_heads))
        out[f"{i}.qkv"] = cat([q, k, block(p + "attn_v.weight")])
        out[f"{i}.o"] = block(p + "attn_output.weight")
        out[f"{i}.gate_up"] = cat([block(p + "ffn_gate.weight"), block(p + "ffn_up.weight")])
        out[f"{i}.down"] = block(p + "ffn_down.weight")
    out["embed"] = block("token_embd.weight")
    if "output.weight" in raw:
        out["head"] = block("output.weight")
    return out


def linear_weights(model) -> list:
    """Every weight a decode step multiplies by, in layer order, fused where the model fused them
    (q/k/v and gate/up), ending with the head: dense tensors or ``QuantTensor`` blocks."""
    out = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        out += [a.qkv_weight] if a.qkv_weight is not None else [p.weight for p in (a.q_proj, a.k_proj, a.v_proj)]
        out += [a.o_proj.weight]
        out += [m.gate_up_weight] if m.gate_up_weight is not None else [p.weight for p in (m.gate_proj, m.up_proj)]
        out += [m.down_proj.weight]
    return out + [model.lm_head.weight]


def weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every linear incl. the head (not the embedding, of
    which a step reads one row)."""
    return sum(w.nbytes if isinstance(w, QuantTensor) else w.numel() * w.element_size()
               for w in linear_weights(model))
