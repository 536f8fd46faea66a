"""Attention patterns: which earlier keys each query may see. One object serves every backend.

Spec grammar (``Pattern.parse``), positions counted from 0, causality always implied:

- ``dense``: every key at or before the query.
- ``window:W``: the W most recent keys, the query's own included: k in (q - W, q].
- ``sinks:S,W``: StreamingLLM, the first S keys ("attention sinks") plus ``window:W``; budget S + W.
- ``blocksparse:block=B,local=L,global=G,random=R,seed=X`` (BigBird/Longformer style; any subset
  of keys, any order; defaults block=64, local=4, global=1, random=0, seed=0), or positionally
  ``blocksparse:B,L,G,R[,X]`` (no '=' signs, which papermill's parameter cells need): positions fall in
  blocks of B; query block i sees key blocks i-L+1..i (local, its own included, L >= 1), blocks
  0..G-1 (global) and R further earlier blocks drawn by a seeded hash (random). Within the
  query's own block the token-level causal rule applies.
- ``quest:budget=B,page=P,sinks=S,recent=R,dense=L`` (Quest, Tang et al. 2024; defaults page=16,
  sinks=4, recent=64, dense=2), or positionally ``quest:B[,P,S,R,L]``: memory-augmented attention.
  The cache keeps every token; each decode step reads the S first and R most recent keys plus the
  pages (P keys each) whose key summaries promise the highest scores for that step's query, at most
  B keys in all; the first L layers stay dense (Quest's choice: early layers attend broadly). The
  choice depends on the query, so it is no fixed mask: ``mask`` is dense causal (prefill and
  multi-token forwards stay dense) and ``studylib.attention.quest`` does the per-step selection.

The pattern never produces an empty row for a real query (each query always sees itself); rows
can only be empty for padding queries (position -1), and every backend returns 0 there.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch

from studylib.errors import StudylibError

GRAMMAR = (
    "dense | int8kv (dense over an 8-bit KV cache) | window:W | sinks:S,W | blocksparse:block=B,local=L,global=G,random=R,seed=X "
    "(or positionally blocksparse:B,L,G,R[,X]) | quest:budget=B,page=P,sinks=S,recent=R,dense=L "
    "(or positionally quest:B[,P,S,R,L]; defaults page=16,sinks=4,recent=64,dense=2; B >= S + R + P) "
    "(blocksparse keys optional, defaults block=64,local=4,global=1,random=0,seed=0; all integers, "
    "W >= 1, S >= 0, B a power of two >= 16, L >= 1)"
)


def _bad(spec: str, why: str) -> StudylibError:
    return StudylibError(f"bad attention pattern {spec!r}: {why}; the grammar is {GRAMMAR}.")


@dataclass(frozen=True)
class Pattern:
    """Base class. ``window`` = 0 means unlimited; ``sinks`` = number of always-visible first keys."""

    window: int = 0
    sinks: int = 0

    kind = "dense"

    # --- construction -------------------------------------------------------------------------
    @staticmethod
    def parse(spec: str | Pattern | None) -> Pattern:
        if isinstance(spec, Pattern):
            return spec
        if spec is None:
            return Dense()
        if not isinstance(spec, str):
            raise _bad(repr(spec), "not a string")
        text = spec.strip().lower()
        name, _, args = text.partition(":")
        if name == "dense" and not args:
            return Dense()
        if name == "int8kv" and not args:
            return Int8KV()
        if name == "window":
            (w,) = _ints(spec, args, 1)
            return Window(window=w)
        if name == "sinks":
            s, w = _ints(spec, args, 2)
            return Sinks(window=w, sinks=s)
        if name == "blocksparse":
            defaults = {"block": 64, "local": 4, "global": 1, "random": 0, "seed": 0}
            kw = _keywords(spec, _positional(spec, args, defaults, 4, "blocksparse:B,L,G,R or blocksparse:B,L,G,R,X"),
                           defaults)
            return BlockSparse(block=kw["block"], local=kw["local"], n_global=kw["global"],
                               n_random=kw["random"], seed=kw["seed"])
        if name == "quest":
            defaults = {"budget": 0, "page": 16, "sinks": 4, "recent": 64, "dense": 2}
            kw = _keywords(spec, _positional(spec, args, defaults, 1, "quest:B or quest:B,P,S,R,L"), defaults)
            why = _quest_problem(kw["budget"], kw["page"], kw["sinks"], kw["recent"], kw["dense"])
            if why:
                raise _bad(spec, why)  # name the spec as written, not its canonical form
            return Quest(budget=kw["budget"], page=kw["page"], sinks=kw["sinks"], recent=kw["recent"],
                         dense_layers=kw["dense"])
        raise _bad(spec, f"unknown pattern {name!r}" if name else "empty spec")

    def __post_init__(self) -> None:
        if self.window < 0 or self.sinks < 0:
            raise _bad(self.spec, "window and sinks must be non-negative")

    @property
    def spec(self) -> str:
        return "dense"

    def __str__(self) -> str:
        return self.spec

    # --- the mask -----------------------------------------------------------------------------
    def mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Boolean visibility (..., Tq, Tk) for positions q_pos (..., Tq) and k_pos (..., Tk).

        Leading dimensions broadcast (a (B, Tq) q_pos against a (B, Tk) or (Tk,) k_pos). A
        position of -1 marks padding and is visible to nothing and sees nothing. This is the
        ``DenseKVCache.mask_fn`` hook's signature, so a pattern can be assigned to it directly.
        """
        q = q_pos[..., :, None]
        k = k_pos[..., None, :]
        vis = (k <= q) & (k >= 0) & (q >= 0)
        if self.window:
            near = k > q - self.window
            vis = vis & ((k < self.sinks) | near) if self.sinks else vis & near
        return self._extra(q, k, vis)

    __call__ = mask

    def _extra(self, q: torch.Tensor, k: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
        return vis

    # --- budgets ------------------------------------------------------------------------------
    def kv_budget(self, seq_len: int) -> int:
        """Keys the query at position ``seq_len - 1`` attends to: the KV a decode step reads."""
        if not self.window:
            return seq_len
        return min(seq_len, self.window + self.sinks)

    def visible_pairs(self, seq_len: int) -> int:
        """(query, key) pairs a causal pass over ``seq_len`` tokens computes under this pattern:
        query p sees min(p + 1, S + W) keys, so the sum has a closed form."""
        cap = self.window + self.sinks if self.window else seq_len
        full = min(cap, seq_len)
        return full * (full + 1) // 2 + (seq_len - full) * cap

    def read_tokens(self, seq_len: int, num_layers: int) -> float:
        """K/V read by one decode step after ``seq_len`` tokens, in tokens' worth (all layers): the
        bytes a step moves are this times one token's K and V in one layer."""
        return float(self.kv_budget(seq_len) * num_layers)

    def density(self, seq_len: int) -> float:
        """Fraction of the causal (q, k) pairs this pattern keeps over a sequence of ``seq_len``."""
        return self.visible_pairs(seq_len) / (seq_len * (seq_len + 1) / 2)

    # --- kernels' view ------------------------------------------------------------------------
    def tile_mask(self, tq: int, tk: int, bm: int, bn: int) -> torch.Tensor:
        """(ceil(tq/bm), ceil(tk/bn)) bool: which (query tile, key tile) pairs hold any visible pair.

        Queries are the last ``tq`` of ``tk`` positions. Kernels visit only the True tiles (that is
        how they skip work) and apply the token-level rule inside each tile.
        """
        off = tk - tq
        q_lo = off + torch.arange(0, tq, bm)
        q_hi = torch.clamp(q_lo + bm - 1, max=tk - 1)
        k_lo = torch.arange(0, tk, bn)
        k_hi = torch.clamp(k_lo + bn - 1, max=tk - 1)
        act = k_lo[None, :] <= q_hi[:, None]
        if self.window:
            near = k_hi[None, :] > q_lo[:, None] - self.window
            act = act & (near | (k_lo[None, :] < self.sinks))
        return self._extra_tiles(tq, tk, bm, bn, act)

    def _extra_tiles(self, tq, tk, bm, bn, act: torch.Tensor) -> torch.Tensor:
        return act


@dataclass(frozen=True)
class Dense(Pattern):
    kind = "dense"


@dataclass(frozen=True)
class Int8KV(Pattern):
    """Dense attention over a KV cache stored in 8 bits (``kvcache.int8.Int8KVCache``): every key is
    still visible; what changes is how many bytes each one costs to keep and to read."""

    kind = "int8kv"

    @property
    def spec(self) -> str:
        return "int8kv"


@dataclass(frozen=True)
class Window(Pattern):
    kind = "window"

    def __post_init__(self) -> None:
        if self.window < 1:
            raise _bad(self.spec, "the window W must be >= 1 (the query always sees itself)")

    @property
    def spec(self) -> str:
        return f"window:{self.window}"


@dataclass(frozen=True)
class Sinks(Pattern):
    kind = "sinks"

    def __post_init__(self) -> None:
        if self.window < 1 or self.sinks < 0:
            raise _bad(self.spec, "need S >= 0 sinks and a window W >= 1")

    @property
    def spec(self) -> str:
        return f"sinks:{self.sinks},{self.window}"


@dataclass(frozen=True)
class BlockSparse(Pattern):
    kind = "blocksparse"
    block: int = 64
    local: int = 4
    n_global: int = 1
    n_random: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        b = self.block
        if b < 16 or b & (b - 1):
            raise _bad(self.spec, f"block={b} must be a power of two >= 16")
        if self.local < 1 or self.n_global < 0 or self.n_random < 0:
            raise _bad(self.spec, "need local >= 1, global >= 0, random >= 0")

    @property
    def spec(self) -> str:
        return (f"blocksparse:block={self.block},local={self.local},global={self.n_global},"
                f"random={self.n_random},seed={self.seed}")

    def layout(self, n_blocks: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """(n_blocks, n_blocks) bool block visibility, lower triangular; row i is the same for every
        ``n_blocks`` > i, so a longer sequence never changes what a shorter one saw."""
        return _layout(self, n_blocks).to(device)

    def kv_budget(self, seq_len: int) -> int:
        nb = (seq_len + self.block - 1) // self.block
        last = (seq_len - 1) % self.block + 1  # tokens of the query's own block it can see
        return int(self.layout(nb)[-1, :-1].sum()) * self.block + last

    def visible_pairs(self, seq_len: int) -> int:
        B = self.block
        nb = (seq_len + B - 1) // B
        earlier = (self.layout(nb).sum(1) - 1).tolist()  # visible blocks before each diagonal one
        sizes = [min(B, seq_len - i * B) for i in range(nb)]
        return sum(n * c * B + n * (n + 1) // 2 for n, c in zip(sizes, earlier, strict=True))

    def _extra(self, q, k, vis):
        qb = torch.clamp(q, min=0) // self.block
        kb = torch.clamp(k, min=0) // self.block
        n = int(torch.maximum(qb.max(), kb.max())) + 1 if q.numel() and k.numel() else 1
        lay = self.layout(n, q.device)
        return vis & lay[qb, kb]

    def _extra_tiles(self, tq, tk, bm, bn, act):
        # A tile is live if any (query block, key block) pair it overlaps is in the layout.
        nb = (tk + self.block - 1) // self.block
        lay = self.layout(nb)
        off = tk - tq
        rows_b = (off + torch.arange(tq)) // self.block  # pattern block of each query row
        cols_b = torch.arange(tk) // self.block
        nqt, nkt = act.shape
        by_row = torch.zeros(nqt * bm, nb, dtype=torch.bool)
        by_row[:tq] = lay[rows_b]
        by_tile = by_row.view(nqt, bm, nb).any(1)  # (nqt, nb)
        full = torch.zeros(nqt, nkt * bn, dtype=torch.bool)
        full[:, :tk] = by_tile[:, cols_b]
        return act & full.view(nqt, nkt, bn).any(2)


@dataclass(frozen=True)
class Quest(Pattern):
    """Query-aware page selection over a cache that keeps every token (see the module docstring).

    ``window`` stays 0: as a static mask Quest is dense causal; ``sinks`` are the always-read first keys.
    """

    kind = "quest"
    budget: int = 1024
    page: int = 16
    recent: int = 64
    dense_layers: int = 2

    def __post_init__(self) -> None:
        why = _quest_problem(self.budget, self.page, self.sinks, self.recent, self.dense_layers)
        if why:
            raise _bad(self.spec, why)

    @property
    def spec(self) -> str:
        return (f"quest:budget={self.budget},page={self.page},sinks={self.sinks},recent={self.recent},"
                f"dense={self.dense_layers}")

    @property
    def n_pages(self) -> int:
        """Pages a step reads beside the sinks and the recent keys."""
        return (self.budget - self.sinks - self.recent) // self.page

    @property
    def keys_read(self) -> int:
        """Keys a selecting step reads: sinks + recent + whole pages (the budget rounded down to pages)."""
        return self.sinks + self.recent + self.n_pages * self.page

    def kv_budget(self, seq_len: int) -> int:
        return min(seq_len, self.keys_read)

    def selects(self, seq_len: int) -> bool:
        """Whether a decode step over ``seq_len`` keys selects at all (within the budget it reads them all)."""
        return seq_len > self.keys_read

    def read_tokens(self, seq_len: int, num_layers: int) -> float:
        # A page summary (min and max per channel) is the size of one token's K and V.
        if not self.selects(seq_len):
            return float(seq_len * num_layers)
        sparse = self.kv_budget(seq_len) + -(-seq_len // self.page)
        dense = min(self.dense_layers, num_layers)
        return float(dense * seq_len + (num_layers - dense) * sparse)


def _quest_problem(budget: int, page: int, sinks: int, recent: int, dense: int) -> str | None:
    if page < 1 or recent < 1 or sinks < 0 or dense < 0:
        return "need page >= 1, recent >= 1 (the query's own key), sinks >= 0, dense >= 0"
    if budget < sinks + recent + page:
        return (f"budget={budget} must hold the sinks, the recent keys and at least one page: at least "
                f"{sinks + recent + page}")
    return None


@functools.lru_cache(maxsize=128)
def tile_table(pattern: Pattern, tq: int, tk: int, bm: int, bn: int, device: str = "cpu"):
    """What the kernels loop over: (idx (nQT, width) int32, cnt (nQT,) int32, cnt[0] as an int).

    Row t lists query tile t's live key tiles in ascending order (``tile_mask``), padded after
    ``cnt[t]`` entries. Cached, so a decode loop at a fixed length builds it once.
    """
    live = pattern.tile_mask(tq, tk, bm, bn)
    cnt = live.sum(1).to(torch.int32)
    width = max(1, int(cnt.max()))
    order = torch.argsort((~live).to(torch.int8), dim=1, stable=True)[:, :width].to(torch.int32)
    return order.contiguous().to(device), cnt.to(device), int(cnt[0])


def _hash(a: torch.Tensor, b: torch.Tensor, seed: int) -> torch.Tensor:
    """A counter-based integer hash of (a, b, seed), so random blocks need no RNG state."""
    m = 0x7FFFFFFF
    x = (a * 0x27D4EB2D + b * 0x165667B1 + (seed & m) * 0x61C88647) & m
    for mul in (0x2C1B3C6D, 0x297A2D39):
        x = x ^ (x >> 15)
        x = (x * mul) & m
    return x ^ (x >> 13)


@functools.lru_cache(maxsize=32)
def _layout(p: BlockSparse, n: int) -> torch.Tensor:
    qb = torch.arange(n)[:, None]
    kb = torch.arange(n)[None, :]
    lay = (kb <= qb) & ((qb - kb < p.local) | (kb < p.n_global))
    if p.n_random and n > 1:
        cand = (kb <= qb) & ~lay  # earlier blocks neither local nor global
        score = _hash(qb.expand(n, n), kb.expand(n, n), p.seed).double()
        score = score.masked_fill(~cand, float("inf"))
        r = min(p.n_random, n)
        val, idx = score.topk(r, dim=1, largest=False)
        pick = torch.zeros(n, n, dtype=torch.bool)
        pick.scatter_(1, idx, torch.isfinite(val))
        lay = lay | pick
    return lay


def _ints(spec: str, args: str, n: int) -> list[int]:
    parts = [a.strip() for a in args.split(",")] if args else []
    if len(parts) != n or not all(re.fullmatch(r"\d+", a) for a in parts):
        raise _bad(spec, f"expected {n} non-negative integer argument(s) after ':'")
    return [int(a) for a in parts]


def _positional(spec: str, args: str, defaults: dict[str, int], min_n: int, form: str) -> str:
    """The keyword form of a positional argument list (``64,4,1,2`` -> ``block=64,local=4,...``, in the
    order of ``defaults``), which papermill parameter cells need (they cannot hold '='); keyword
    arguments pass through unchanged."""
    if not args or "=" in args:
        return args
    vals = [a.strip() for a in args.split(",")]
    if not min_n <= len(vals) <= len(defaults) or not all(re.fullmatch(r"\d+", a) for a in vals):
        raise _bad(spec, f"the positional form is {form}")
    return ",".join(f"{k}={v}" for k, v in zip(defaults, vals, strict=False))


def _keywords(spec: str, args: str, defaults: dict[str, int]) -> dict[str, int]:
    out = dict(defaults)
    for item in filter(None, (a.strip() for a in args.split(","))):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or key not in defaults or not re.fullmatch(r"\d+", val.strip()):
            raise _bad(spec, f"cannot read {item!r}; use key=integer with keys {sorted(defaults)}")
        out[key] = int(val)
    return out
