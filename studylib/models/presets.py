"""Architecture shapes for ``random:<preset>`` models and the ``tiny-random`` unit-test model."""

from __future__ import annotations

from studylib.models.config import ModelConfig

_L3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}

# name: (hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, extras)
RANDOM_PRESETS: dict[str, tuple] = {
    "smollm2-135m": (576, 1536, 30, 9, 3, 64, 49152, dict(tie_word_embeddings=True, rope_theta=1e5, max_position_embeddings=8192)),
    "smollm2-360m": (960, 2560, 32, 15, 5, 64, 49152, dict(tie_word_embeddings=True, rope_theta=1e5, max_position_embeddings=8192)),
    "smollm2-1.7b": (2048, 8192, 24, 32, 32, 64, 49152, dict(tie_word_embeddings=True, rope_theta=1.3e5, max_position_embeddings=8192)),
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 64, 151936, dict(tie_word_embeddings=True, attention_bias=True, rope_theta=1e6, max_position_embeddings=32768)),
    "llama3.2-1b": (2048, 8192, 16, 32, 8, 64, 128256, dict(tie_word_embeddings=True, rope_theta=5e5, rope_scaling=_L3_ROPE, max_position_embeddings=131072)),
    "llama2-7b": (4096, 11008, 32, 32, 32, 128, 32000, dict(max_position_embeddings=4096)),
    "llama3-8b": (4096, 14336, 32, 32, 8, 128, 128256, dict(rope_theta=5e5, max_position_embeddings=8192)),
    "mistral-7b": (4096, 14336, 32, 32, 8, 128, 32768, dict(rope_theta=1e6, max_position_embeddings=32768)),
}


def preset_config(preset: str) -> ModelConfig:
    h, f, L, nh, nkv, hd, vocab, extra = RANDOM_PRESETS[preset]
    return ModelConfig(
        vocab_size=vocab, hidden_size=h, intermediate_size=f, num_layers=L, num_heads=nh,
        num_kv_heads=nkv, head_dim=hd, bos_token_id=1, eos_token_ids=[2],
        name=f"random:{preset}", random_weights=True, **extra,
    )


def tiny_config(seed: int = 0, vocab_size: int = 259) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096,
        tie_word_embeddings=False, bos_token_id=1, eos_token_ids=[2],
        name="tiny-random" if seed == 0 else f"tiny-random:{seed}", random_weights=True,
    )
