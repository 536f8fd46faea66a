"""Replay a finished workload through a prefix cache without the model: exact hit counts for any pool size.

Which tokens hit depends only on the token sequences and the pool size, not on the KV values, so the
hit-rate vs. pool-size curve comes from replaying the recorded (prompt, output) pairs through a real
``RadixCache`` over a pool of the same block count, built on a tiny model shape so that no real KV
memory is allocated. The replay does what ``PrefixCachedDecoder`` does per request: match the
prompt minus its last token, lock, grow to the request's full KV length (evicting LRU prefixes),
insert, unlock, release.

``compare_policies`` puts the radix cache's LRU beside the clairvoyant reference of
``studylib.kvcache.belady`` (Belady's farthest-next-use rule under the same tree, lock and space
constraints) at one pool size, request by request: the reference the hit rate is judged against when
the pool is smaller than the working set.
"""

from __future__ import annotations

from collections.abc import Sequence

from studylib.kvcache.belady import Trace, belady_hits
from studylib.kvcache.naive import make_prefix_cache
from studylib.kvcache.pool import PagedKVPool
from studylib.models.presets import tiny_config

_SHAPE = tiny_config()  # block counts are all that matter; the tiny shape keeps the tensors small


def replay_hits(sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *, block_size: int, num_blocks: int,
                cache: str = "radix") -> dict:
    """Hit tokens per request for ``sequences`` = [(prompt, output), ...] in arrival order."""
    pool = PagedKVPool(_SHAPE, block_size=block_size, num_blocks=num_blocks)
    pc = make_prefix_cache(cache, pool)
    hits, prompts, peak = [], 0, 0
    for prompt, out in sequences:
        prompt, out = list(prompt), list(out)
        kv_len = len(prompt) + len(out) - 1
        pool.check_fits(kv_len + 1, "a replayed request")
        m = pc.match_prefix(prompt[:-1])
        pc.lock(m.node)
        pool.incref(m.blocks)
        table = list(m.blocks)
        table += pool.alloc(pool.blocks_for(kv_len) - len(table))
        peak = max(peak, pool.num_used)
        pc.insert((prompt + out)[:kv_len], table)
        pc.unlock(m.node)
        pool.decref(table)
        hits.append(m.length)
        prompts += len(prompt)
    pool.check_accounting()
    return {"hits": hits, "hit_tokens": sum(hits), "prompt_tokens": prompts,
            "hit_rate": sum(hits) / max(prompts, 1), "evicted_blocks": pc.metrics.evicted_blocks,
            "num_blocks": num_blocks, "peak_blocks": peak}


def working_set_blocks(sequences: Sequence[tuple[Sequence[int], Sequence[int]]], block_size: int) -> int:
    """The smallest pool that never evicts: the peak blocks in use when nothing is ever evicted."""
    total = sum(-(-(len(p) + len(o)) // block_size) for p, o in sequences)
    return replay_hits(sequences, block_size=block_size, num_blocks=total + 1)["peak_blocks"]


def min_pool_blocks(sequences: Sequence[tuple[Sequence[int], Sequence[int]]], block_size: int) -> int:
    """The smallest pool every request fits in alone (its KV plus the next token's slot)."""
    return max(-(-(len(p) + len(o)) // block_size) for p, o in sequences)


def compare_policies(sequences: Sequence[tuple[Sequence[int], Sequence[int]]] | Trace, *, block_size: int,
                     num_blocks: int) -> dict[str, dict]:
    """The same trace at one pool size under "lru" (the real ``RadixCache``, ``replay_hits``) and
    "belady" (``studylib.kvcache.belady``), each with per-request hit tokens in ``["hits"]``."""
    trace = sequences if isinstance(sequences, Trace) else Trace(sequences, block_size)
    seqs = sequences.sequences if isinstance(sequences, Trace) else sequences
    return {"lru": replay_hits(seqs, block_size=block_size, num_blocks=num_blocks),
            "belady": belady_hits(trace, block_size=block_size, num_blocks=num_blocks)}
