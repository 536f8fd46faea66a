"""A paged KV pool: fixed-size blocks of KV slots, a free list and per-block reference counts.

Every sequence owns a *block table* (a list of block ids); token ``p`` of a sequence lives in slot
``p % block_size`` of block ``table[p // block_size]``. Blocks are reference counted so that the
radix prefix cache and any number of running sequences can share one physical copy of a prefix;
a block returns to the free list when its last reference is dropped.

Storage layout, per layer: ``k[layer]`` and ``v[layer]`` are (num_blocks, block_size, kv_heads,
head_dim). Keeping the slot axis outermost means the pool is also a flat (num_slots, kv_heads,
head_dim) array, so writing new tokens and gathering a sequence are single ``index_copy_`` /
``index_select`` calls on slot ids, whatever the block size (1 included).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from studylib.errors import StudylibError
from studylib.models.config import ModelConfig


class PoolExhausted(StudylibError):
    """The pool is full *right now* (other sequences hold the blocks): wait, evict or preempt."""


class PagedKVPool:
    def __init__(
        self,
        cfg: ModelConfig,
        *,
        block_size: int = 16,
        budget_bytes: int | None = None,
        num_blocks: int | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        if block_size < 1:
            raise StudylibError(f"block_size must be >= 1 token, got {block_size}.")
        self.cfg = cfg
        self.block_size = block_size
        self.device = torch.device(device)
        self.dtype = dtype
        elem = torch.empty(0, dtype=dtype).element_size()
        self.bytes_per_block = cfg.kv_bytes_per_token(elem) * block_size
        if (budget_bytes is None) == (num_blocks is None):
            raise StudylibError("give the KV pool exactly one of budget_bytes= or num_blocks=.")
        if num_blocks is None:
            num_blocks = int(budget_bytes) // self.bytes_per_block
        if num_blocks < 1:
            raise StudylibError(
                f"a KV budget of {budget_bytes} bytes holds no block of {block_size} tokens "
                f"({self.bytes_per_block} bytes each for {cfg.name}); raise the budget or lower block_size."
            )
        self.num_blocks = int(num_blocks)
        shape = (self.num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, device=self.device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, device=self.device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.refcount = [0] * self.num_blocks
        # A stack: recently freed blocks are reused first (warm in cache), and order is deterministic.
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))
        # Called as reclaimer(n) -> blocks freed, before alloc gives up (the radix cache evicts here).
        self.reclaimer: Callable[[int], int] | None = None

    # ---- capacity -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-int(num_tokens) // self.block_size)

    def check_fits(self, num_tokens: int, what: str = "this request") -> None:
        """Raise a clear StudylibError if ``num_tokens`` could never fit, even in an empty pool."""
        need = self.blocks_for(num_tokens)
        if need > self.num_blocks:
            raise StudylibError(
                f"{what} needs {num_tokens} tokens of KV ({need} blocks of {self.block_size}) but the whole "
                f"pool holds {self.num_blocks} blocks ({self.num_slots} tokens, {self.nbytes / 2**20:.1f} MiB); "
                "raise the KV budget (budget_bytes / --kv-budget) or shorten the request."
            )

    # ---- allocation -----------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        """Take ``n`` free blocks (each with one reference, owned by the caller).

        Raises StudylibError when ``n`` exceeds the whole pool and PoolExhausted when the pool is only
        full for now (after asking the reclaimer to evict). Either way the pool is left unchanged.
        """
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > self.num_blocks:
            self.check_fits(n * self.block_size)
        if n > len(self._free) and self.reclaimer is not None:
            self.reclaimer(n - len(self._free))
        if n > len(self._free):
            raise PoolExhausted(
                f"the KV pool has {len(self._free)} free blocks of {self.num_blocks} but {n} are needed; "
                "wait for running sequences to finish, evict cached prefixes or preempt a sequence."
            )
        out = [self._free.pop() for _ in range(n)]
        for b in out:
            self.refcount[b] = 1
        return out

    def incref(self, blocks: Iterable[int]) -> None:
        """Add one reference to each (already allocated) block: a second owner shares it."""
        blocks = list(blocks)
        for b in blocks:
            if self.refcount[b] <= 0:
                raise RuntimeError(f"incref of free block {b}: a use-after-free in the caller")
        for b in blocks:
            self.refcount[b] += 1

    def decref(self, blocks: Iterable[int]) -> int:
        """Drop one reference from each block; return how many blocks went back to the free list."""
        blocks = list(blocks)
        counts: dict[int, int] = {}
        for b in blocks:
            counts[b] = counts.get(b, 0) + 1
        for b, c in counts.items():
            if self.refcount[b] < c:
                raise RuntimeError(f"block {b} released more often than referenced: a double free in the caller")
        freed = 0
        for b in blocks:
            self.refcount[b] -= 1
            if self.refcount[b] == 0:
                self._free.append(b)
                freed += 1
        return freed

    free = decref  # "free my blocks" = drop my references; shared blocks survive for other owners

    def check_accounting(self) -> None:
        """Assert the free list and the reference counts agree (tests and soak runs call this)."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a block is on the free list twice")
        for b, rc in enumerate(self.refcount):
            if rc < 0 or (rc == 0) != (b in free):
                raise AssertionError(f"block {b}: refcount {rc} but on_free_list={b in free}")

    # ---- slot addressing ------------------------------------------------------------------------
    def slots(self, block_table: Sequence[int], start: int, end: int) -> torch.Tensor:
        """Flat slot ids (end - start,) of token positions [start, end) of a sequence."""
        if end > len(block_table) * self.block_size:
            raise ValueError(f"block table of {len(block_table)} blocks cannot hold {end} tokens")
        pos = torch.arange(start, end)
        table = torch.as_tensor(list(block_table), dtype=torch.long)
        return (table[pos // self.block_size] * self.block_size + pos % self.block_size).to(self.device)

    def k_slots(self, layer: int) -> torch.Tensor:
        return self.k[layer].view(self.num_slots, self.cfg.num_kv_heads, self.cfg.head_dim)

    def v_slots(self, layer: int) -> torch.Tensor:
        return self.v[layer].view(self.num_slots, self.cfg.num_kv_heads, self.cfg.head_dim)

    def read(self, layer: int, block_table: Sequence[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A sequence's first ``length`` keys and values, each (kv_heads, length, head_dim) (a copy)."""
        idx = self.slots(block_table, 0, length)
        k = self.k_slots(layer).index_select(0, idx).transpose(0, 1)
        v = self.v_slots(layer).index_select(0, idx).transpose(0, 1)
        return k, v

    def __repr__(self) -> str:
        return (f"PagedKVPool({self.cfg.name}, blocks={self.num_blocks}x{self.block_size} tokens, "
                f"free={self.num_free}, {self.nbytes / 2**20:.1f} MiB)")
