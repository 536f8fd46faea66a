"""Quest (Tang et al., ICML 2024): query-aware page selection over a KV cache that keeps every token.

The cache is cut into pages of P consecutive keys. Each page keeps a summary of its keys: the
per-channel minimum and maximum. For a query q, no key k in the page can score more than

    bound(page) = sum_d max(q_d * min_d, q_d * max_d) = q+ . max + q- . min      (q+ = max(q, 0), q- = min(q, 0))

so the summaries rank pages by an *upper bound* on the attention score they could hold. A decode step
reads the first S keys (sinks), the R most recent keys (the query's own included) and the top pages by
bound, B keys in all, and attends to those only. Nothing is evicted: a page skipped now is read the
moment a later query needs it, which is what "memory-augmented" buys over a window.

GQA. SmolLM2 shares each KV head among G query heads. Selecting per query head would read up to G
different page sets from one KV head; here one set is chosen per KV head, so a step reads exactly B
keys per KV head. A page's group score is the largest of its G bounds: an upper bound on the largest
logit any head of the group could give a key in it. With G = 1 this is Quest's own per-head ranking.
(Normalising each head by its best page first, so that every head has an equal say, measured worse:
diffuse heads then outvote the head that points at a retrieved fact, and the needle test lost it.)

Layout of this module: the selection (shared by every backend), the torch backend and the pure-
PyTorch reference, the fused C kernel for CPU decode, then ``QuestKVCache``. The Triton kernel
(``triton_backend.quest_decode``) takes the selected token indices and does the gathering attention.

On CPU a fp32 ``QuestKVCache`` runs ``csrc/quest_decode.c``: scoring, selection and attention in one
call per layer, reading straight from the cache (the eager version spends more on ~15 small ops and
two copies per layer than the bytes it saves). ``STUDYLIB_QUEST_KERNEL`` = ``auto`` (default: the C
kernel where it builds), ``c`` (it or a clear error) or ``torch``; ``kernel_backend()`` names the one in
use and the tests hold both to the reference.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from studylib.attention.patterns import Quest
from studylib.errors import StudylibError
from studylib.models.config import ModelConfig
from studylib.models.kv import DenseKVCache


# --------------------------------------------------------------------------------------------------
# Page summaries and selection
# --------------------------------------------------------------------------------------------------
def page_summaries(k: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-page, per-channel min and max of keys k (B, Hkv, T, D): two (B, Hkv, ceil(T/P), D) tensors.
    A last partial page is summarised over the keys it holds."""
    B, Hkv, T, D = k.shape
    n = -(-T // page)
    pad = n * page - T
    lo = F.pad(k, (0, 0, 0, pad), value=float("inf")) if pad else k
    hi = F.pad(k, (0, 0, 0, pad), value=float("-inf")) if pad else k
    return lo.reshape(B, Hkv, n, page, D).amin(3), hi.reshape(B, Hkv, n, page, D).amax(3)


def page_bounds(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Upper bound of q . k over each page: q (B, H, D) against summaries (B, Hkv, NP, D) -> (B, H, NP).
    Unscaled (the 1/sqrt(D) of attention does not change the order)."""
    B, H, D = q.shape
    Hkv = kmin.shape[1]
    qg = q.reshape(B, Hkv, H // Hkv, D).float()  # fp32 ranks: 16-bit sums would reorder close pages
    bound = qg.clamp(min=0) @ kmax.float().transpose(-1, -2) + qg.clamp(max=0) @ kmin.float().transpose(-1, -2)
    return bound.reshape(B, H, -1)


@functools.lru_cache(maxsize=8)
def _step_plan(seq_len: int, pattern: Quest, device: str):
    """What a step at ``seq_len`` keys shares across layers and heads: the candidate pages (holding a key
    that is neither sink nor recent), how many to read, and the fixed sink and recent slots."""
    P, S, R = pattern.page, pattern.sinks, pattern.recent
    n_pages = -(-seq_len // P)
    first = torch.arange(n_pages, device=device) * P
    last = torch.clamp(first + P, max=seq_len) - 1
    cand = (last >= S) & (first < seq_len - R)
    fixed = torch.cat([torch.arange(S, device=device), torch.arange(seq_len - R, seq_len, device=device)])
    return n_pages, cand, min(pattern.n_pages, int(cand.sum())), fixed


def select_tokens(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, seq_len: int,
                  pattern: Quest) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys one decode step reads: (idx, valid), both (B, Hkv, S + R + pages * P).

    ``idx`` holds key slots (sinks and recent keys, then the chosen pages' slots); ``valid`` is False
    for slots that must not count: beyond ``seq_len``, or already among the sinks or recent keys (a page
    overlapping them is read whole but each key is counted once). q is (B, H, D); kmin/kmax hold at
    least ceil(seq_len / P) pages.
    """
    P, S, R = pattern.page, pattern.sinks, pattern.recent
    if not pattern.selects(seq_len):
        raise StudylibError(f"{pattern.spec} reads every key at {seq_len} tokens; attend densely instead.")
    B, H, _ = q.shape
    Hkv = kmin.shape[1]
    n_pages, cand, k_pages, fixed = _step_plan(seq_len, pattern, str(q.device))
    bound = page_bounds(q, kmin[:, :, :n_pages], kmax[:, :, :n_pages]).masked_fill(~cand, float("-inf"))
    score = bound.reshape(B, Hkv, H // Hkv, n_pages).amax(2)  # non-candidates stay -inf
    # Stable sort, not topk: on a tie the lower page wins, so every backend and the reference read the
    # same pages.
    top = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :k_pages]  # (B, Hkv, k)
    pages = (top[..., None] * P + torch.arange(P, device=q.device)).reshape(B, Hkv, k_pages * P)
    idx = torch.cat([fixed.expand(B, Hkv, S + R), pages], dim=-1)
    valid = torch.cat([torch.ones(B, Hkv, S + R, dtype=torch.bool, device=q.device),
                       (pages >= S) & (pages < seq_len - R)], dim=-1)
    return idx, valid


# --------------------------------------------------------------------------------------------------
# Attention over the selection: torch backend and reference
# --------------------------------------------------------------------------------------------------
def gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                     valid: torch.Tensor) -> torch.Tensor:
    """q (B, H, 1, D) attends to k/v (B, Hkv, >= slots, D) at slots idx (B, Hkv, L) where valid."""
    B, H, _, D = q.shape
    Hkv, L = idx.shape[1], idx.shape[2]
    T = k.shape[2]
    # One row gather over (batch, head, slot) flattened: much faster on CPU than gather() with an index
    # expanded over head_dim. Only the selected keys are read.
    flat = (idx + (torch.arange(B * Hkv, device=idx.device) * T).view(B, Hkv, 1)).reshape(-1)
    kg = k.reshape(B * Hkv * T, D).index_select(0, flat).view(B, Hkv, L, D)
    vg = v.reshape(B * Hkv * T, D).index_select(0, flat).view(B, Hkv, L, D)
    mask = valid[:, :, None, None, :].expand(B, Hkv, H // Hkv, 1, L).reshape(B, H, 1, L)
    return F.scaled_dot_product_attention(q, kg, vg, attn_mask=mask, enable_gqa=True)


def quest_attention(q, k, v, pattern: Quest, kmin=None, kmax=None, backend: str = "torch") -> torch.Tensor:
    """Quest attention of q (B, H, Tq, D) over k/v (B, Hkv, T, D). Prefill (Tq > 1) and steps within
    the budget are dense; a decode step past the budget reads its selection. Summaries are computed
    from k when not given (a cache keeps them up to date instead)."""
    from studylib.attention.torch_backend import dense_sdpa

    T = k.shape[2]
    if q.shape[2] > 1 or not pattern.selects(T):
        return dense_sdpa(q, k, v)
    if kmin is None or kmax is None:
        kmin, kmax = page_summaries(k, pattern.page)
    idx, valid = select_tokens(q[:, :, 0], kmin, kmax, T, pattern)
    if backend == "triton":
        from studylib.attention.triton_backend import quest_decode

        return quest_decode(q, k, v, torch.where(valid, idx, -1).to(torch.int32))
    if backend not in ("torch", "masked"):
        raise StudylibError(f"quest runs on the torch or triton backend, not {backend!r}.")
    return gather_attention(q, k, v, idx, valid)


def quest_mask_ref(q: torch.Tensor, k: torch.Tensor, pattern: Quest) -> torch.Tensor:
    """The reference's view of one decode step: (B, H, 1, T) bool, which keys each query head sees,
    built with plain loops over pages from the raw keys (no cached summaries, no gathering)."""
    B, H, _, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    G = H // Hkv
    P, S, R = pattern.page, pattern.sinks, pattern.recent
    vis = torch.zeros(B, H, 1, T, dtype=torch.bool)
    if not pattern.selects(T):
        vis[:] = True
        return vis
    qf, kf = q[:, :, 0].double().cpu(), k.double().cpu()
    for b in range(B):
        for hk in range(Hkv):
            scores = []
            for p0 in range(0, T, P):
                keys = kf[b, hk, p0: p0 + P]
                if p0 + keys.shape[0] - 1 < S or p0 >= T - R:
                    continue
                lo, hi = keys.min(0).values, keys.max(0).values
                rel = []
                for h in range(hk * G, hk * G + G):
                    rel.append(torch.maximum(qf[b, h] * lo, qf[b, h] * hi).sum())
                scores.append((p0, rel))
            ranked = sorted(scores, key=lambda s: -max(float(r) for r in s[1]))
            seen = torch.zeros(T, dtype=torch.bool)
            seen[:S] = True
            seen[T - R:] = True
            for p0, _ in ranked[: pattern.n_pages]:
                seen[p0: p0 + P] = True
            vis[b, hk * G: hk * G + G, 0] = seen
    return vis


def quest_attention_ref(q, k, v, pattern: Quest) -> torch.Tensor:
    """Dense fp32 attention under ``quest_mask_ref``: the ground truth the backends are tested against."""
    G = q.shape[1] // k.shape[1]
    mask = quest_mask_ref(q, k, pattern).to(q.device)
    kf, vf = k.float().repeat_interleave(G, 1), v.float().repeat_interleave(G, 1)
    scores = (q.float() @ kf.transpose(-1, -2)) * q.shape[-1] ** -0.5
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    return (p @ vf).to(q.dtype)


def teacher_forced_mask(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, start: int,
                        pattern: Quest) -> torch.Tensor:
    """Which keys each of n teacher-forced queries reads: (B, Hkv, n, start + n) bool.

    Query i (q[:, :, i], its token at slot start + i) sees what a decode step at ``start + i + 1`` keys
    would read: the sinks, its R recent keys and its own top pages by group bound (stable order, fewest
    of ``pattern.n_pages`` and the candidates), or every earlier key where the step reads them all. So a
    known text is scored in one forward instead of n steps, with the same selection as stepping.

    Needs recent >= page: then every candidate page of query i ends before slot start + i, so the
    summaries, refreshed over the whole chunk's keys, are the ones its step would have seen.
    """
    P, S, R = pattern.page, pattern.sinks, pattern.recent
    if R < P:
        raise StudylibError(f"{pattern.spec}: teacher-forced selection needs recent >= page (a candidate page "
                            "could hold later keys); feed the tokens one step at a time instead.")
    B, H, n, D = q.shape
    Hkv = kmin.shape[1]
    L = start + n
    n_pages = -(-L // P)
    dev = q.device
    seq = start + 1 + torch.arange(n, device=dev)  # keys each query's step would hold
    first = torch.arange(n_pages, device=dev) * P
    cand = (first + P - 1 >= S)[None] & (first[None] < (seq - R)[:, None])  # (n, NP)
    qg = q.reshape(B, Hkv, H // Hkv, n, D).float()
    lo, hi = kmin[:, :, :n_pages].float(), kmax[:, :, :n_pages].float()
    bound = qg.clamp(min=0) @ hi[:, :, None].transpose(-1, -2) + qg.clamp(max=0) @ lo[:, :, None].transpose(-1, -2)
    score = bound.amax(2).masked_fill(~cand, float("-inf"))  # (B, Hkv, n, NP)
    k = min(pattern.n_pages, n_pages)
    top = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :k]
    chosen = torch.zeros_like(score, dtype=torch.bool)
    # a query with fewer candidates than pages to read takes them all and no -inf page
    chosen.scatter_(-1, top, torch.gather(score, -1, top) > float("-inf"))
    keys = torch.arange(L, device=dev)
    sees = chosen.repeat_interleave(P, -1)[..., :L]
    sees |= (keys < S) | (keys[None] >= (seq - R)[:, None])
    causal = keys[None] < seq[:, None]  # (n, L)
    dense = ~torch.tensor([pattern.selects(int(t)) for t in seq.tolist()], device=dev)
    return (sees | dense[:, None]) & causal


def teacher_forced_attention(q, k, v, kmin, kmax, start: int, pattern: Quest) -> torch.Tensor:
    """Attention of n teacher-forced queries q (B, H, n, D) over k/v (B, Hkv, start + n, D), each reading
    its own decode step's selection (``teacher_forced_mask``)."""
    G = q.shape[1] // k.shape[1]
    mask = teacher_forced_mask(q, kmin, kmax, start, pattern).repeat_interleave(G, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


# --------------------------------------------------------------------------------------------------
# The fused CPU kernel
# --------------------------------------------------------------------------------------------------
_C_STATE: dict = {}


def _c_kernel():
    """The loaded C function, or None (torch path) with the reason in _C_STATE["why"]."""
    import ctypes
    import os

    setting = os.environ.get("STUDYLIB_QUEST_KERNEL", "auto").strip().lower() or "auto"
    if setting in _C_STATE:
        return _C_STATE[setting]
    if setting not in ("auto", "c", "torch"):
        raise StudylibError(f"STUDYLIB_QUEST_KERNEL={setting!r} is not one of auto, c, torch; unset it or pick one.")
    fn = None
    if setting != "torch":
        from pathlib import Path

        from studylib.models.build import compile_kernel, has_avx2_fma

        try:
            if not has_avx2_fma():
                raise StudylibError("this CPU lacks AVX2/FMA")
            lib = ctypes.CDLL(str(compile_kernel(Path(__file__).parent / "csrc" / "quest_decode.c")))
            fn = lib.quest_decode_f32
            fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 11 + [ctypes.c_float, ctypes.c_int]
            fn.restype = None
        except (StudylibError, OSError) as err:
            if setting == "c":
                raise StudylibError(f"STUDYLIB_QUEST_KERNEL=c, but the C kernel is unavailable ({err}); install a "
                                    "C compiler on an AVX2 machine, or set it to auto or torch.") from None
            _C_STATE["why"] = str(err)
    _C_STATE[setting] = fn
    return fn


def kernel_backend() -> str:
    """``c`` or ``torch``: what a fp32 CPU QuestKVCache decode step runs on this machine right now."""
    return "c" if _c_kernel() is not None else "torch"


def quest_decode_c(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor,
                   seq_len: int, pattern: Quest) -> torch.Tensor:
    """The fused CPU step: q (B, H, 1, D) over the first ``seq_len`` slots of k/v (B, Hkv, Tmax, D) with
    page summaries kmin/kmax (B, Hkv, NPmax, D); fp32, contiguous. Same selection as ``select_tokens``."""
    fn = _c_kernel()
    if fn is None:
        raise StudylibError(f"the Quest C kernel is off ({_C_STATE.get('why', 'STUDYLIB_QUEST_KERNEL=torch')}).")
    if not pattern.selects(seq_len):
        raise StudylibError(f"{pattern.spec} reads every key at {seq_len} tokens; attend densely instead.")
    if q.dim() != 4 or q.shape[2] != 1 or k.dim() != 4 or q.device.type != "cpu" or not q.dtype.is_floating_point:
        raise ValueError(f"quest_decode_c takes one decode row per sequence on the CPU: q (B, H, 1, D) and k/v "
                         f"(B, Hkv, Tmax, D), got q {q.dtype} {tuple(q.shape)} on {q.device}, k {tuple(k.shape)}")
    B, H, _, D = q.shape
    Hkv, Tmax = k.shape[1], k.shape[2]
    ts = (q, k, v, kmin, kmax)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() for t in ts[1:]):
        raise ValueError("quest_decode_c takes contiguous fp32 CPU caches and summaries")
    n_pages = -(-Tmax // pattern.page)
    if (v.shape != k.shape or k.shape[0] != B or k.shape[3] != D or Hkv < 1 or H % Hkv
            or kmin.shape != kmax.shape or kmin.shape != (B, Hkv, kmin.shape[2], D) or kmin.shape[2] < n_pages
            or not 0 < seq_len <= Tmax):
        raise ValueError(f"quest_decode_c: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, summaries "
                         f"{tuple(kmin.shape)} / {tuple(kmax.shape)} and seq_len {seq_len} do not fit: k and v must "
                         f"be (B, Hkv, Tmax, D) with Hkv dividing H, the summaries (B, Hkv, >= {n_pages}, D), and "
                         f"0 < seq_len <= Tmax")
    q = q.float().contiguous()
    n_sel = _step_plan(seq_len, pattern, "cpu")[2]
    out = torch.empty(B, H, 1, D, dtype=torch.float32)
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), kmin.data_ptr(), kmax.data_ptr(), out.data_ptr(), B, H, Hkv, D,
       Tmax, kmin.shape[2], seq_len, pattern.page, pattern.sinks, pattern.recent, n_sel, D ** -0.5,
       torch.get_num_threads())
    return out


# --------------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------------
class QuestKVCache(DenseKVCache):
    """A ``DenseKVCache`` (every token kept) plus per-page key summaries per layer; plain single-token
    decode steps past the budget read only their selection, everything else attends densely.

    Prefill, verification trees, padded batches and multi-token steps stay dense (Quest selects for
    decode only), so a speculative decoder over this cache verifies exactly what it would verify over
    a dense one; only single-token steps are approximated. ``keys_read`` is what the current step
    reads, in tokens' worth of K/V summed over layers, for the bytes-per-step figures.
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device, dtype, pattern: Quest,
                 backend: str = "torch"):
        super().__init__(cfg, batch, max_len, device, dtype)
        self.pattern, self.backend = pattern, backend
        n_pages = -(-max_len // pattern.page)
        shape = (batch, cfg.num_kv_heads, n_pages, cfg.head_dim)
        self.kmin = [torch.full(shape, float("inf"), device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.kmax = [torch.full(shape, float("-inf"), device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self._select = False
        self._teacher_forced = False

    @property
    def keys_read(self) -> float:
        layers = len(self.k)
        return self.pattern.read_tokens(self.length, layers) if self._select else float(self.length * layers)

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(t.numel() * t.element_size() for t in self.kmin + self.kmax)

    def begin(self, n, tree_mask=None, valid=None, positions=None):
        super().begin(n, tree_mask=tree_mask, valid=valid, positions=positions)
        plain = tree_mask is None and positions is None and not self.padded
        self._select = plain and n == 1 and self.pattern.selects(self.length)
        self._teacher_forced = False
        return self

    def begin_teacher_forced(self, n: int) -> QuestKVCache:
        """Open a forward over ``n`` known tokens in which each position attends to what its own decode
        step would read (``teacher_forced_attention``): scoring a text costs one forward, not n steps.
        Only for tokens whose next-token predictions are read, not for prefill. A refused call (a padded
        cache, recent < page, or no room for n more tokens) leaves the cache exactly as it was."""
        P, R = self.pattern.page, self.pattern.recent
        if self.padded:
            raise StudylibError("teacher-forced Quest needs an unpadded cache; score each sequence alone.")
        if R < P:
            raise StudylibError(f"{self.pattern.spec}: teacher-forced selection needs recent >= page (a candidate "
                                "page could hold later keys); feed the tokens one step at a time instead.")
        self.begin(n)  # checks the room before it changes anything
        self._teacher_forced = self.pattern.selects(self.length)
        return self

    def _summarise(self, layer: int, s: int, e: int) -> None:
        """Recompute the summaries of the pages that slots s..e-1 fall in, from the stored keys (a
        page's later slots may be stale after a rollback; the summary covers slots < e only)."""
        P = self.pattern.page
        p0, p1 = s // P, (e - 1) // P + 1
        lo, hi = page_summaries(self.k[layer][:, :, p0 * P: e], P)
        self.kmin[layer][:, :, p0:p1] = lo
        self.kmax[layer][:, :, p0:p1] = hi

    def attend(self, layer, q, k, v):
        s, n = self._start, self._n
        L = s + n
        if self._teacher_forced and layer >= self.pattern.dense_layers:
            self.k[layer][:, :, s:L] = k
            self.v[layer][:, :, s:L] = v
            self._summarise(layer, s, L)
            return teacher_forced_attention(q, self.k[layer][:, :, :L], self.v[layer][:, :, :L], self.kmin[layer],
                                            self.kmax[layer], s, self.pattern)
        if not self._select or layer < self.pattern.dense_layers:
            out = super().attend(layer, q, k, v)  # writes the slots and attends densely
            self._summarise(layer, s, L)
            return out
        self.k[layer][:, :, s:L] = k
        self.v[layer][:, :, s:L] = v
        self._summarise(layer, s, L)
        if self.backend == "torch" and q.device.type == "cpu" and q.dtype == torch.float32 and _c_kernel():
            return quest_decode_c(q, self.k[layer], self.v[layer], self.kmin[layer], self.kmax[layer], L, self.pattern)
        idx, valid = select_tokens(q[:, :, 0], self.kmin[layer], self.kmax[layer], L, self.pattern)
        if self.backend == "triton":
            from studylib.attention.triton_backend import quest_decode

            return quest_decode(q, self.k[layer], self.v[layer], torch.where(valid, idx, -1).to(torch.int32))
        return gather_attention(q, self.k[layer], self.v[layer], idx, valid)

    def copy_from(self, other: DenseKVCache) -> QuestKVCache:
        """Take over a dense cache's contents (e.g. one prefill shared by several arms) and summarise it."""
        L = other.length
        for layer in range(len(self.k)):
            self.k[layer][:, :, :L] = other.k[layer][:, :, :L]
            self.v[layer][:, :, :L] = other.v[layer][:, :, :L]
            if L:
                self._summarise(layer, 0, L)
        self.valid[:, :L] = other.valid[:, :L]
        self.next_pos, self.padded, self.length = other.next_pos.clone(), other.padded, L
        return self
