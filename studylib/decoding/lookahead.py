"""Lookahead decoding (Fu et al. 2024), greedy and exact.

Jacobi iteration rarely fixes more than one token per step on its own, but its trajectory keeps
producing plausible n-grams. Lookahead decoding runs two branches in ONE forward:

- the lookahead branch: a 2-D window of W columns x (N-1) levels, the last N-1 Jacobi iterations over
  W future positions. Each step advances it by one iteration; the column diagonals form n-grams that
  go into a pool keyed by their first token (``ngram_pool.NGramPool``);
- the verification branch: up to G pool n-grams that start with the current token, each checked as a
  draft by greedy verification. The longest accepted candidate wins, so a step commits
  ``1 + accepted`` tokens, and the output is token-identical to AR decoding.

The mask that keeps the branches (and the candidates) from seeing each other is built by
``tree_mask.lookahead_layout``; the accepted candidate's KV slots are then compacted next to the
prefix with ``DenseKVCache.keep``. Degenerate settings: N=1 or G=0 never verifies anything, which is
AR decoding with (for G=0) the lookahead branch's extra work; W=1 keeps one column.

``prompt_pool=True`` also feeds the pool the n-grams of the text itself: the prompt up front (the
reference implementation's POOL_FROM_PROMPT) and each committed stretch of output. Candidates stay
drafts, so this changes only how many tokens a step accepts, never which tokens come out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from studylib.decoding.common import Stopwatch, check_lengths, clip_at_stop, eos_set
from studylib.decoding.jacobi import require_greedy
from studylib.decoding.ngram_pool import NGramPool, PoolConfig
from studylib.decoding.result import GenerationResult
from studylib.decoding.tree_mask import lookahead_layout
from studylib.decoding.verify import verify_greedy
from studylib.errors import StudylibError
from studylib.kvcache.dense_bridge import prefill
from studylib.models import LlamaModel
from studylib.sampling import SamplingParams


@dataclass(frozen=True)
class LookaheadConfig:
    window: int = 5  # W: future positions the Jacobi window covers
    ngram: int = 4  # N: n-gram size (N-1 lookahead levels, candidates of N-1 tokens)
    guesses: int = 5  # G: candidates verified per step
    prompt_pool: bool = False  # also pool the n-grams of the text itself: prompt, then output as it grows
    pool_per_key: int | None = None  # continuations kept per key (default: max(G, 1))
    pool_keys: int = 4096
    seed: int = 0  # for the initial window (tokens drawn from the prompt)
    merge: bool = True  # candidates sharing a prefix share its tokens in the forward (tree_mask)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise StudylibError(f"--window must be >= 1, got {self.window}.")
        if self.ngram < 1:
            raise StudylibError(f"--ngram must be >= 1 (1 disables both branches), got {self.ngram}.")
        if self.guesses < 0:
            raise StudylibError(f"--guesses must be >= 0, got {self.guesses}.")
        PoolConfig(self.per_key, self.pool_keys)  # validates the pool bounds

    @property
    def per_key(self) -> int:
        return self.pool_per_key if self.pool_per_key is not None else max(self.guesses, 1)

    @property
    def forward_size(self) -> int:
        """Most tokens in one steady-state forward: c + (N-1) levels of W + G candidates of N-1 (fewer
        when candidates share prefixes and ``merge`` is on)."""
        m = self.ngram - 1
        return 1 + m * self.window + self.guesses * m if m else 1


@torch.inference_mode()
def generate(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    tokenizer: object | None = None,
    window: int = 5,
    ngram: int = 4,
    guesses: int = 5,
    prompt_pool: bool = False,
    pool_per_key: int | None = None,
    seed: int = 0,
    merge: bool = True,
    prefix_store=None,
) -> GenerationResult:
    """``prefix_store``: a ``kvcache.dense_bridge.PrefixStore``; the prompt's cached prefix is reused."""
    cfg = LookaheadConfig(window, ngram, guesses, prompt_pool, pool_per_key, seed=seed, merge=merge)
    require_greedy(sampling, "lookahead")
    W, m = cfg.window, cfg.ngram - 1
    cap = check_lengths(model, prompt_ids, max_new_tokens, slack=cfg.forward_size)
    eos = eos_set(model, tokenizer)
    dev = model.device
    clock = Stopwatch(dev)
    prompt = [int(t) for t in prompt_ids]
    cache, first = prefill(model, prompt, cap, prefix_store)
    first = first[0]
    out = [int(first.argmax())]
    ttft = clock.elapsed()
    pool = NGramPool(PoolConfig(cfg.per_key, cfg.pool_keys))
    if cfg.prompt_pool and m:
        pool.add_from_sequence(prompt, cfg.ngram)
    # levels[l][j]: lookahead token at level l, column j. Level 0 starts as tokens drawn from the
    # prompt (plausible vocabulary); the other levels fill up from the first N-2 steps' outputs.
    gen = torch.Generator().manual_seed(cfg.seed)
    levels = [[prompt[i] for i in torch.randint(0, len(prompt), (W,), generator=gen).tolist()]] if m else []
    forward_tokens, accepted, hits = [len(prompt)], [], 0
    stop = "eos" if out[0] in eos else "length"

    while stop == "length" and len(out) < max_new_tokens:
        c, budget = out[-1], max_new_tokens - len(out)
        # A candidate longer than budget-1 can only add tokens that would be clipped.
        cands = list(dict.fromkeys(cd[: budget - 1] for cd in pool.lookup(c, cfg.guesses)))
        cands = [cd for cd in cands if cd]
        k = len(levels)
        layout = lookahead_layout(W, k, cands, merge=cfg.merge)
        tokens = [c, *(t for lvl in levels for t in lvl), *layout.cand_tokens]
        rows = [0, *(layout.level_index(k - 1) if k else []), *range(1 + k * W, layout.size)]
        row_of = {idx: r for r, idx in enumerate(rows)}
        start = cache.length
        pos = (start + layout.offsets).to(dev)[None]  # (1, n)
        view = cache.begin(layout.size, tree_mask=layout.mask, positions=pos)
        inp = torch.tensor([tokens], device=dev)  # (1, n)
        logits = model(inp, view, logits=torch.tensor(rows, device=dev)).logits[0]  # (len(rows), V)
        forward_tokens.append(layout.size)

        best, best_ok, nxt = -1, 0, int(logits[0].argmax())
        for i, cd in enumerate(cands):
            n_ok, tok = verify_greedy(logits[[row_of[x] for x in [0, *layout.cand_index(i)]]], cd)
            if n_ok > best_ok:
                best, best_ok, nxt = i, n_ok, tok
        slots = [start] + ([start + x for x in layout.cand_index(best)[:best_ok]] if best >= 0 else [])
        cache.keep(start, slots)  # the cache again equals a plain prefill of the committed text
        hits += best_ok > 0
        commit = [*(cands[best][:best_ok] if best >= 0 else []), nxt]
        commit, hit_eos = clip_at_stop(commit, eos, budget)
        out += commit
        accepted.append(len(commit))
        if cfg.prompt_pool and m:
            # The n-grams that end in the new tokens (code and summaries repeat their own phrases).
            text = prompt + out
            for end in range(max(len(text) - len(commit) + 1, cfg.ngram), len(text) + 1):
                pool.add(text[end - cfg.ngram], text[end - cfg.ngram + 1 : end])
        if hit_eos:
            stop = "eos"

        if k:
            newest = logits[[row_of[x] for x in layout.level_index(k - 1)]].argmax(-1).tolist()  # (W,)
            if k < m:  # warm-up: the window is not N-1 levels deep yet
                levels.append(newest)
            else:
                for j in range(W):
                    pool.add(levels[0][j], [*(levels[lv][j] for lv in range(1, k)), newest[j]])
                levels = [*levels[1:], newest]

    extra = {"window": W, "ngram": cfg.ngram, "guesses": cfg.guesses, "prompt_pool": cfg.prompt_pool,
             "pool_size": len(pool), "pool_evicted": pool.evicted, "hit_steps": hits,
             "forward_tokens": forward_tokens}
    wall = clock.elapsed()
    if prefix_store is not None:
        extra["prefix_hit_tokens"] = prefix_store.last_hit
        prefix_store.store(prompt + out, cache)
    return GenerationResult(
        token_ids=out, text=tokenizer.decode(out) if tokenizer is not None else "", new_tokens=len(out),
        target_forwards=len(forward_tokens), steps=len(accepted), accepted_lengths=accepted,
        ttft_s=ttft, wall_s=wall, prompt_tokens=len(prompt), method="lookahead",
        stop_reason=stop, extra=extra,
    )
