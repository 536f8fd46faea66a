"""A compact Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM) in plain PyTorch.

Parameter names follow the HF checkpoints, so a transformers state dict loads as is. Attention
never touches a cache directly: each layer hands its new q, k, v to ``kv.attend(layer, q, k, v)``.
The contiguous cache (``kv.DenseKVCache``), the paged pool and sparse patterns all plug in there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from studylib.models import decode_layers
from studylib.models.config import ModelConfig
from studylib.models.cpu_linear import linear
from studylib.models.rope import apply_rope, rope_cos_sin, rope_inv_freq


class AttentionKV(Protocol):
    """The one narrow interface between the layers and any KV storage."""

    def positions(self) -> torch.Tensor:
        """Position ids of the tokens in this forward, (batch, seq)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k, v (batch, kv_heads, seq, head_dim) for ``layer`` and return attention of q
        (batch, heads, seq, head_dim) over everything visible, in q's shape."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before the weight, exactly as the reference does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        b = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=b)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=b)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=b)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.qkv_weight: torch.Tensor | None = None  # set by fuse(): one matmul instead of three
        self.qkv_bias: torch.Tensor | None = None

    def fuse(self) -> None:
        projs = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_weight, self.qkv_bias = _fuse_linears(projs)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: AttentionKV) -> torch.Tensor:
        B, T, _ = x.shape
        if self.qkv_weight is not None:
            q, k, v = linear(x, self.qkv_weight, self.qkv_bias).split(
                [self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        else:
            q, k, v = (linear(x, p.weight, p.bias) for p in (self.q_proj, self.k_proj, self.v_proj))
        q = q.view(B, T, self.h, self.d).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.hkv, self.d).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, self.hkv, self.d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = kv.attend(self.layer, q, k, v)  # (B, H, T, D)
        return linear(out.transpose(1, 2).reshape(B, T, self.h * self.d), self.o_proj.weight)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_weight: torch.Tensor | None = None

    def fuse(self) -> None:
        self.gate_up_weight, _ = _fuse_linears((self.gate_proj, self.up_proj))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_weight is not None:
            gate, up = linear(x, self.gate_up_weight).chunk(2, dim=-1)
        else:
            gate, up = linear(x, self.gate_proj.weight), linear(x, self.up_proj.weight)
        return linear(F.silu(gate) * up, self.down_proj.weight)


def _fuse_linears(linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights of linears sharing an input, and re-point each linear's weight at its
    slice of the fused tensor, so there is one copy in memory and state_dict() still works."""
    weight = torch.cat([lin.weight.data for lin in linears], dim=0)
    has_bias = linears[0].bias is not None
    bias = torch.cat([lin.bias.data for lin in linears]) if has_bias else None
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight.data = weight[start : start + rows]
        if has_bias:
            lin.bias.data = bias[start : start + rows]
        start += rows
    return weight, bias


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (batch, seq or 1, vocab), fp32
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (batch, seq, hidden)


class LlamaModel(nn.Module):
    """The runtime model. ``forward`` runs new tokens through every layer against a KV view."""

    weights_format = "dense"  # or a block format, set by models.weights.apply_weights
    act = "fp32"  # the activations' arithmetic in block-format linears, set by models.weights.apply_act
    fused_decode = False  # dense fp32 only: run small steps through decode_layers too (chapter 8's reference)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        inv_freq, scale = rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope_scale = scale

    def fuse_projections(self) -> LlamaModel:
        """Run q/k/v and gate/up as one matmul each: fewer, larger kernels per layer (decode on CPU
        is dominated by per-op overhead and weight reads). Call after any dtype/device move."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        self._fused = True
        return self

    def _apply(self, fn, recurse=True):
        # .to()/.cuda()/.bfloat16() replace parameter storage; rebuild the fused copies from them.
        out = super()._apply(fn, recurse)
        if getattr(self, "_fused", False):
            self.fuse_projections()
        return out

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        kv: AttentionKV,
        *,
        logits: str | torch.Tensor = "all",
        hidden_layers: Iterable[int] = (),
        skip_layers: Iterable[int] = (),
    ) -> ForwardOutput:
        """Run ``input_ids`` (batch, seq) through the model.

        ``logits``: "all" positions, "last" only (saves the vocab projection in prefill), "none", or an
        index tensor of positions. ``hidden_layers``: layer outputs to return (-1 = after the final
        norm). ``skip_layers``: layers to bypass, for self-speculative drafts.
        """
        want, skip = set(hidden_layers), set(skip_layers)
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(kv.positions(), self.inv_freq, self.rope_scale, x.dtype)
        hidden: dict[int, torch.Tensor] = {}
        if not (skip and want - {-1}) and decode_layers.path(self, kv, x.shape[0] * x.shape[1]) == "fused":
            # all layers in one C call (see decode_layers), which also hands back intermediate layers and
            # bypasses a self-speculative draft's skipped ones (per-op, such a draft cost 2.2 target steps)
            x = decode_layers.run(self, x, cos, sin, kv, want - {-1}, hidden, skip_layers=skip)
        else:
            for i, layer in enumerate(self.model.layers):
                if i not in skip:
                    x = layer(x, cos, sin, kv)
                if i in want:
                    hidden[i] = x
        x = self.model.norm(x)
        if -1 in want:
            hidden[-1] = x
        if isinstance(logits, torch.Tensor):
            x = x[:, logits]
        elif logits == "last":
            x = x[:, -1:]
        elif logits == "none":
            return ForwardOutput(logits=x.new_empty(0), hidden=hidden)
        return ForwardOutput(logits=linear(x, self.lm_head.weight).float(), hidden=hidden)
