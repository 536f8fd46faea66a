"""The Llama-family architecture description shared by every model the runtime runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # HF-style rope scaling dict: {"rope_type": "llama3" | "linear" | "dynamic" | "yarn", "factor": ...}
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 puts a bias on q/k/v
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = "unnamed"
    # True for random-weight models: every result that uses one is labelled as such.
    random_weights: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

    @property
    def num_params(self) -> int:
        d, f, L = self.hidden_size, self.intermediate_size, self.num_layers
        attn = d * self.head_dim * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * d * f
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return L * (attn + mlp + 2 * d) + emb + d

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_hf(cls, hf: Any, name: str = "unnamed") -> ModelConfig:
        """Build from a transformers config (Llama, Mistral, Qwen2, SmolLM all map here)."""
        eos = hf.eos_token_id
        eos_ids = list(eos) if isinstance(eos, list | tuple) else ([eos] if eos is not None else [])
        rope_params = getattr(hf, "rope_parameters", None) or {}
        theta = rope_params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        scaling = getattr(hf, "rope_scaling", None)
        if scaling is None and rope_params.get("rope_type", "default") != "default":
            scaling = dict(rope_params)
        if scaling is not None:
            scaling = dict(scaling)
            if scaling.get("rope_type", scaling.get("type", "default")) == "default":
                scaling = None
        heads = hf.num_attention_heads
        return cls(
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
            rms_norm_eps=hf.rms_norm_eps,
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(hf, "attention_bias", False)) or hf.model_type == "qwen2",
            bos_token_id=hf.bos_token_id,
            eos_token_ids=eos_ids,
            name=name,
        )
