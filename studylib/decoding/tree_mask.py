"""The token layout and attention mask of one lookahead-decoding forward (Fu et al. 2024, Fig. 5).

One forward carries three groups of new tokens, laid out in this order:

    [ c | lookahead levels 0..k-1, W tokens each | verification candidates ]

- ``c`` is the last committed token (not yet in the KV cache), at relative position 0.
- Lookahead token (l, j) (level l, column j) sits at relative position l + j + 1. Its context must be
  one contiguous causal sequence, so it sees ``c``, level-0 tokens of the columns before it
  (positions 1..j) and the tokens of its own column at levels <= l (positions j+1..j+l+1). Column j
  read top to bottom is then a diagonal of the Jacobi trajectory: an n-gram in which every token was
  predicted from the ones before it.
- Candidate token t of a candidate sits at relative position t + 1 and sees ``c`` and its own
  candidate's tokens up to t: each candidate is verified as if it alone followed ``c``. With
  ``merge=True`` candidates that share a prefix share its tokens (a token tree, as in SpecInfer), so a
  forward carries each distinct prefix once; the paper lays candidates out flat (``merge=False``).

The prefix in the KV cache is visible to every token (``DenseKVCache.begin`` adds it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class LookaheadLayout:
    mask: torch.Tensor  # (n, n) bool: mask[q, k] is True when token q may attend to token k
    offsets: torch.Tensor  # (n,) long: position of each token relative to c
    window: int  # W
    levels: int  # k lookahead levels present in this forward (0 disables the branch)
    cand_tokens: tuple[int, ...]  # the token at each verification slot, in layout order
    paths: tuple[tuple[int, ...], ...]  # per candidate: forward indices of its tokens, in order

    @property
    def size(self) -> int:
        return int(self.offsets.numel())

    def level_index(self, level: int) -> list[int]:
        """Indices (into the forward) of the W tokens of lookahead ``level``."""
        start = 1 + level * self.window
        return list(range(start, start + self.window))

    def cand_index(self, i: int) -> list[int]:
        """Indices (into the forward) of candidate ``i``'s tokens."""
        return list(self.paths[i])


def lookahead_layout(window: int, levels: int, cands: Sequence[Sequence[int]], merge: bool = True
                     ) -> LookaheadLayout:
    """The mask and relative positions for ``levels`` lookahead levels of width ``window`` and the
    verification candidates ``cands`` (token sequences). Layouts are cached (a decode revisits the
    same ones), so treat the returned tensors as read-only."""
    return _build(int(window), int(levels), tuple(tuple(int(t) for t in c) for c in cands), bool(merge))


@lru_cache(maxsize=1024)
def _build(window: int, levels: int, cands: tuple[tuple[int, ...], ...], merge: bool) -> LookaheadLayout:
    if window < 1 and levels > 0:
        raise ValueError(f"window must be >= 1 when lookahead levels are present, got {window}")
    start = 1 + levels * window
    # Verification slots: one per (merged) prefix. parent[s] is the slot before s in its candidate
    # (None for the first token, whose parent is c).
    slot_of: dict[tuple[int, ...], int] = {}
    tokens: list[int] = []
    parent: list[int | None] = []
    depth: list[int] = []
    paths = []
    for cand in cands:
        path = []
        for t in range(len(cand)):
            key = cand[: t + 1] if merge else (len(paths), *cand[: t + 1])
            if key not in slot_of:
                slot_of[key] = start + len(tokens)
                tokens.append(cand[t])
                parent.append(path[-1] if path else None)
                depth.append(t + 1)
            path.append(slot_of[key])
        paths.append(tuple(path))

    n = start + len(tokens)
    mask = torch.zeros(n, n, dtype=torch.bool)
    offsets = torch.zeros(n, dtype=torch.long)
    mask[:, 0] = True  # everyone sees c

    def la(level: int, col: int) -> int:
        return 1 + level * window + col

    for lvl in range(levels):
        for col in range(window):
            q = la(lvl, col)
            offsets[q] = lvl + col + 1
            for j in range(col):  # level-0 tokens of earlier columns: positions 1..col
                mask[q, la(0, j)] = True
            for l2 in range(lvl + 1):  # own column up to own level: positions col+1..col+lvl+1
                mask[q, la(l2, col)] = True
    for i in range(len(tokens)):
        q = start + i
        offsets[q] = depth[i]
        a: int | None = q
        while a is not None:  # itself and its ancestors
            mask[q, a] = True
            a = parent[a - start]
    return LookaheadLayout(mask, offsets, window, levels, tuple(tokens), tuple(paths))


__all__ = ["LookaheadLayout", "lookahead_layout"]
