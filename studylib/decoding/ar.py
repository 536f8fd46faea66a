"""Autoregressive decoding: the baseline every other method is measured against."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from studylib.decoding.common import Stopwatch, as_ids, check_lengths, eos_set
from studylib.decoding.result import GenerationResult
from studylib.errors import StudylibError
from studylib.kvcache.dense_bridge import prefill
from studylib.models import LlamaModel
from studylib.sampling import SamplingParams, sample


@torch.inference_mode()
def generate(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    tokenizer: object | None = None,
    attention: str | None = None,
    prefix_store=None,
) -> GenerationResult:
    """``attention``: a sparse pattern spec (``window:W``, ``sinks:S,W``...); None or "dense" is exact.
    ``prefix_store``: a ``kvcache.dense_bridge.PrefixStore`` to reuse cached prompt prefixes."""
    cap = check_lengths(model, prompt_ids, max_new_tokens)
    eos = eos_set(model, tokenizer)
    gen = sampling.generator(model.device)
    clock = Stopwatch(model.device)
    hit = 0
    if attention in (None, "dense"):
        cache, logits = prefill(model, prompt_ids, cap, prefix_store)
        hit = prefix_store.last_hit if prefix_store is not None else 0
    else:
        if prefix_store is not None:
            raise StudylibError("prefix_store works with dense attention only; drop one of the two.")
        from studylib.attention import make_cache

        cache = make_cache(attention, model.config, cap, model.device, model.dtype)
        ids = as_ids(prompt_ids, model.device)
        logits = model(ids, cache.begin(ids.shape[1]), logits="last").logits[:, -1]
    out: list[int] = []
    ttft = 0.0
    stop = "length"
    while True:
        tok = sample(logits, sampling, gen)  # (1,)
        t = int(tok.item())
        out.append(t)
        if len(out) == 1:
            ttft = clock.elapsed()
        if t in eos:
            stop = "eos"
            break
        if len(out) >= max_new_tokens:
            break
        logits = model(tok[:, None], cache.begin(1)).logits[:, -1]
    wall = clock.elapsed()
    if prefix_store is not None:
        prefix_store.store([*prompt_ids, *out], cache)
    return GenerationResult(
        token_ids=out, text=tokenizer.decode(out) if tokenizer is not None else "", new_tokens=len(out),
        target_forwards=len(out), steps=len(out) - 1, accepted_lengths=[1] * (len(out) - 1),
        ttft_s=ttft, wall_s=wall, prompt_tokens=len(prompt_ids), method="ar", stop_reason=stop,
        extra={"prefix_hit_tokens": hit} if prefix_store is not None else {},
    )
