"""Teacher-forced perplexity of a long text through our runtime, with a pluggable KV cache.

The text is fed in chunks of new tokens that append to one cache, exactly as decoding would see it,
so a sparse-attention cache (chapter 6) is measured on the context it would really keep. Only one
chunk's logits exist at a time: memory is the cache plus ``chunk x vocab`` floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from studylib.errors import StudylibError
from studylib.models import DenseKVCache

# kv_factory(cfg, max_len, device, dtype) -> a cache with begin(n) returning the KV view for n new tokens.
KVFactory = Callable[..., object]


@dataclass
class PerplexityResult:
    ppl: float
    nll: float  # mean negative log-likelihood per predicted token, in nats
    tokens: int  # predicted tokens: len(token_ids) - 1
    token_nll: torch.Tensor  # (tokens,) fp32 NLL of token i+1 given tokens 0..i, for per-position plots


def _dense(cfg, max_len, device, dtype):
    return DenseKVCache(cfg, 1, max_len, device, dtype)


def teacher_forced(model, token_ids, chunk: int = 256, kv_factory: KVFactory | None = None, what: str = "perplexity",
                   progress: bool = False):
    """Feed ``token_ids`` through one cache ``chunk`` new tokens at a time, as decoding would see it, and
    yield ``(start, n, logits)`` per chunk: ``logits`` (n, V) predict tokens ``start + 1 .. start + n``.
    The last token is only a target, never an input. Checks the text first (``what`` names the caller
    in the errors). Only one chunk's logits exist at a time."""
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    T = int(ids.numel())
    if T < 2:
        raise StudylibError(f"{what} needs at least 2 tokens (one to condition on, one to predict).")
    if chunk < 1:
        raise StudylibError("chunk must be at least 1 token.")
    cfg = model.config
    if T > cfg.max_position_embeddings:
        raise StudylibError(f"{T} tokens exceed the model's context window of {cfg.max_position_embeddings}; "
                            "use a shorter text.")
    kv = (kv_factory or _dense)(cfg, T, model.device, model.dtype)
    ids = ids.to(model.device)
    starts = range(0, T - 1, chunk)
    if progress:
        from studylib.progress import progress_bar

        starts = progress_bar(starts, desc=what, unit="chunk")
    for s in starts:
        n = min(chunk, T - 1 - s)
        yield s, n, model.forward(ids[s : s + n][None], kv.begin(n), logits="all").logits[0]


def perplexity(model, token_ids, chunk: int = 256, kv_factory: KVFactory | None = None,
               progress: bool = False) -> PerplexityResult:
    """Perplexity of ``token_ids`` (a list or 1-D tensor) under ``model``.

    ``kv_factory`` builds the cache (default ``DenseKVCache``); ``chunk`` is how many new tokens each
    forward takes. With a dense cache the result does not depend on ``chunk`` beyond float rounding.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    T = int(ids.numel())
    nll = torch.empty(max(T - 1, 0), dtype=torch.float32)
    for s, n, logits in teacher_forced(model, ids, chunk, kv_factory, "perplexity", progress):
        nll[s : s + n] = F.cross_entropy(logits.float(), ids[s + 1 : s + n + 1].to(logits.device),
                                         reduction="none").cpu()
    mean = float(nll.mean())
    return PerplexityResult(ppl=math.exp(mean), nll=mean, tokens=T - 1, token_nll=nll)


@torch.inference_mode()
def compare_to_dense(model, token_ids, factories: dict[str, KVFactory], chunk: int = 256) -> dict[str, dict]:
    """Teacher-forced pass of ``token_ids`` under a dense cache and under each named cache, in lockstep
    chunk by chunk, so each chunk's two distributions can be compared without storing T x vocab logits.

    Returns per name: ``nll`` (T-1,) per-token NLL, ``kl`` the mean KL(dense || name) per predicted
    token in nats, ``top1`` the share of positions where both argmaxes agree; "dense" has its own nll.
    These are the llama.cpp community's measures of a lossy change (beside the perplexity ratio)."""
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    T = int(ids.numel())
    if T < 2:
        raise StudylibError("compare_to_dense needs at least 2 tokens.")
    cfg, device = model.config, model.device
    caches = {"dense": _dense(cfg, T, device, model.dtype)}
    caches.update({k: f(cfg, T, device, model.dtype) for k, f in factories.items()})
    ids = ids.to(device)
    out = {k: {"nll": torch.empty(T - 1), "kl_sum": 0.0, "top1_sum": 0} for k in caches}
    for s in range(0, T - 1, chunk):
        n = min(chunk, T - 1 - s)
        x, y = ids[s : s + n][None], ids[s + 1 : s + n + 1]
        ref = None
        for k, kv in caches.items():
            logp = F.log_softmax(model.forward(x, kv.begin(n), logits="all").logits[0].float(), -1)  # (n, V)
            out[k]["nll"][s : s + n] = -logp.gather(1, y[:, None])[:, 0].cpu()
            if k == "dense":
                ref = logp
                continue
            out[k]["kl_sum"] += float((ref.exp() * (ref - logp)).sum())
            out[k]["top1_sum"] += int((ref.argmax(-1) == logp.argmax(-1)).sum())
    return {k: {"nll": v["nll"], "kl": v["kl_sum"] / (T - 1), "top1": v["top1_sum"] / (T - 1)}
            for k, v in out.items()}
