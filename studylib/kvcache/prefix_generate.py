"""Single-request generation through the paged pool with a prefix cache (chapter 4).

``PrefixCachedDecoder`` keeps one pool and one prefix cache across calls, so a request whose prompt
starts like an earlier request's text prefills only the new suffix. Per request:

1. match the longest cached prefix of ``prompt[:-1]`` (the last prompt token is always recomputed:
   its logits give the first output token) and lock it;
2. prefill the rest through ``PagedBatch``, in chunks when ``prefill_chunk`` is set;
3. decode one token at a time, allocating a block whenever a new one starts;
4. insert prompt + output into the cache, unlock, and release this request's own references.

Cold vs warm determinism: with ``prefill_chunk=C`` (a multiple of the block size) chunks sit on
a fixed grid of absolute positions [kC, (k+1)C), and a hit is rounded *down* to that grid, so a
warm request runs exactly the forwards the cold one ran for the same positions, with identical
shapes and inputs: its output is bitwise the cold output. With ``prefill_chunk=None`` the whole
suffix goes in one forward (fastest TTFT); its matmul shapes differ from the cold prefill's, so
logits can differ in the last bits and, rarely, a greedy token can flip. Chapter 4 measures both.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from studylib.decoding.common import Stopwatch, as_ids, check_lengths, eos_set
from studylib.decoding.result import GenerationResult
from studylib.errors import StudylibError
from studylib.kvcache.naive import make_prefix_cache
from studylib.kvcache.paged_view import PagedBatch
from studylib.kvcache.pool import PagedKVPool, PoolExhausted
from studylib.models import LlamaModel
from studylib.sampling import SamplingParams, sample


class PrefixCachedDecoder:
    def __init__(
        self,
        model: LlamaModel,
        cache: str = "radix",
        *,
        block_size: int = 16,
        budget_bytes: int | None = None,
        capacity_tokens: int | None = None,
        prefill_chunk: int | None = None,
        tokenizer: object | None = None,
    ):
        """Give the pool size as ``budget_bytes`` or ``capacity_tokens`` (default: 4096 tokens)."""
        if budget_bytes is not None and capacity_tokens is not None:
            raise StudylibError("give budget_bytes or capacity_tokens for the KV pool, not both.")
        if prefill_chunk is not None and (prefill_chunk < 1 or prefill_chunk % block_size):
            raise StudylibError(
                f"prefill_chunk={prefill_chunk} must be a positive multiple of block_size={block_size}, so "
                "chunks and cached blocks share one grid; or pass None for a single-shot suffix prefill."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.prefill_chunk = prefill_chunk
        nb = None
        if budget_bytes is None:
            nb = -(-(capacity_tokens or 4096) // block_size)
        self.pool = PagedKVPool(model.config, block_size=block_size, budget_bytes=budget_bytes,
                                num_blocks=nb, device=model.device, dtype=model.dtype)
        self.cache = make_prefix_cache(cache, self.pool)
        self.keep_first_logits = False  # set True to get extra["first_logits"] (the determinism study)

    def _grow(self, table: list[int], length: int) -> None:
        """Make ``table`` hold ``length`` tokens, evicting cold prefixes if the pool is full."""
        need = self.pool.blocks_for(length) - len(table)
        if need <= 0:
            return
        try:
            table.extend(self.pool.alloc(need))
        except PoolExhausted as exc:
            raise StudylibError(
                f"the KV pool ({self.pool.num_blocks} blocks of {self.pool.block_size}) cannot hold this "
                f"request's {length} tokens next to the prefix it is reading; raise the KV budget."
            ) from exc

    def _prefill_spans(self, start: int, end: int) -> list[tuple[int, int]]:
        c = self.prefill_chunk
        if c is None:
            return [(start, end)]
        spans, s = [], start
        while s < end:
            e = min((s // c + 1) * c, end)
            spans.append((s, e))
            s = e
        return spans

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        tokenizer: object | None = None,
    ) -> GenerationResult:
        model, pool, cache = self.model, self.pool, self.cache
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        prompt = [int(t) for t in prompt_ids]
        check_lengths(model, prompt, max_new_tokens)
        pool.check_fits(len(prompt) + max_new_tokens)
        eos = eos_set(model, tokenizer)
        gen = sampling.generator(model.device)
        clock = Stopwatch(model.device)

        match = cache.match_prefix(prompt[:-1])
        hit = match.length
        if self.prefill_chunk is not None:
            hit = hit // self.prefill_chunk * self.prefill_chunk  # stay on the cold run's chunk grid
        cache.lock(match.node)
        shared = match.blocks[: hit // pool.block_size]
        pool.incref(shared)  # this request's own reference, released with its other blocks
        table = list(shared)
        out: list[int] = []
        forwards, ttft, stop = 0, 0.0, "length"
        try:
            self._grow(table, len(prompt))
            ids = as_ids(prompt, model.device)
            for s, e in self._prefill_spans(hit, len(prompt)):
                view = PagedBatch(pool, [table], [s], [e - s])
                logits = model(ids[:, s:e], view, logits="last").logits[:, -1]
                forwards += 1
            first_logits = logits[0].clone() if self.keep_first_logits else None
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
                length = len(prompt) + len(out) - 1  # tokens whose KV is in the pool
                self._grow(table, length + 1)
                logits = model(tok[:, None], PagedBatch(pool, [table], [length], [1])).logits[:, -1]
                forwards += 1
            wall = clock.elapsed()
            # KV exists for every token but the last sampled one; cache all of it for later requests.
            kv_len = len(prompt) + len(out) - 1
            cache.insert((prompt + out)[:kv_len], table)
        finally:
            cache.unlock(match.node)
            pool.decref(table)
        return GenerationResult(
            token_ids=out, text=tokenizer.decode(out) if tokenizer is not None else "", new_tokens=len(out),
            target_forwards=forwards, steps=len(out) - 1, accepted_lengths=[1] * (len(out) - 1),
            ttft_s=ttft, wall_s=wall, prompt_tokens=len(prompt), method=f"ar+{cache.name}", stop_reason=stop,
            extra={"prefix_hit_tokens": hit, "matched_tokens": match.length, "prefill_tokens": len(prompt) - hit,
                   "cache": cache.name, "block_size": pool.block_size, "prefill_chunk": self.prefill_chunk,
                   **({"first_logits": first_logits} if first_logits is not None else {})},
        )

    def reset(self) -> None:
        """Drop every cached prefix (a cold start) and zero the metrics."""
        self.cache.clear()
        self.cache.reset_metrics()
