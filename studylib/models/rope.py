"""Rotary position embeddings, with the scaling variants Llama-family checkpoints use."""

from __future__ import annotations

import math

import torch

from studylib.errors import StudylibError
from studylib.models.config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """Return (inv_freq of shape (head_dim/2,), attention_scaling) for ``cfg``'s RoPE variant."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = cfg.rope_scaling
    if not scaling:
        return inv_freq, 1.0
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, blended, scaled), 1.0
    # Less common variants (yarn, longrope, dynamic NTK): defer to transformers' own tables so the
    # numbers match the checkpoint's reference implementation exactly.
    try:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        hf = LlamaConfig(
            hidden_size=cfg.num_heads * cfg.head_dim,
            num_attention_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
            max_position_embeddings=cfg.max_position_embeddings,
            rope_theta=cfg.rope_theta,
            rope_scaling=dict(scaling),
        )
        inv, attn_scale = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
        return inv.float(), float(attn_scale)
    except Exception as exc:  # pragma: no cover - depends on the transformers version
        raise StudylibError(
            f"RoPE scaling type {kind!r} is not supported by this runtime ({exc}); "
            "supported: default, linear, llama3, and what transformers' ROPE_INIT_FUNCTIONS provides."
        ) from exc


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (batch, 1, seq, head_dim) for integer ``positions`` of shape (batch, seq)."""
    freqs = positions[..., None].float() * inv_freq  # (B, T, D/2), in fp32 like the reference
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype)[:, None], (emb.sin() * scale).to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (batch, heads, seq, head_dim) in the half-split layout HF checkpoints use."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
