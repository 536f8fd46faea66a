"""EAGLE-style speculative decoding (Li et al. 2024, EAGLE-1/2): a feature-level draft head and a token tree.

The draft is not a smaller language model. It is one decoder layer of the target's shape that works on
the target's own features: ``f_i``, the hidden state after the target's final norm at position i (what
the LM head reads). Given the feature of the previous position and the embedding of the token that was
actually chosen there, it predicts the next feature:

    f^_i = layer(fc([embed(x_i), f_(i-1)]))      logits_i = lm_head(f^_i) predicts x_(i+1)

The token's embedding resolves which of the target's possible continuations was taken (the uncertainty
a feature-only head cannot know about), and the target's features already encode most of what the
next token will be, so one layer predicts far better than a small LM of several layers. Tokens come
from the target's own embedding and LM head (not trained, not stored with the head); the head may use
a reduced vocabulary (FR-Spec, Zhao et al. 2025): only the ``head_ids`` rows of the LM head, the tokens
the target emits most. A token outside them is never proposed, which costs acceptance, never exactness.

Bookkeeping. The target cache holds the committed text minus its last token x_n (as in
``speculative``); the draft's cache holds one row per pair (f_(j), x_(j+1)) for j < n, i.e. exactly as
many rows, each at position j. After a verification the accepted path's true target features are
fed back (the "catch-up" rows), so the draft's context is always built from real features; only the
tree it drafts next runs on its own predictions.

The tree (EAGLE-2's dynamic tree, ``TreeSpec(depth, topk, nodes)``): the last catch-up row gives the
top-``topk`` first tokens; for each further depth the ``topk`` most likely frontier nodes (by the
product of draft probabilities along their path) are run through the draft in one forward, each
seeing the committed context and its own ancestors only, and each adds its ``topk`` best children.
Finally the ``nodes`` most likely nodes of the whole tree are kept (a parent is always at least as
likely as its child, so the kept set is a tree) and verified in ONE target forward with a tree
attention mask. A chain (``--gamma K``) is the tree with topk = 1.

Verification walks down from the root. Greedy: follow the child whose token is the target's argmax;
the output is identical to AR decoding. Sampling (SpecInfer / EAGLE multi-candidate rejection, with
deterministic candidates, i.e. one-hot proposals): at a node with target distribution p, try its
children in order; child c is accepted with probability p(c), and on rejection p loses c and is
renormalised; when every child is rejected the next token is drawn from what is left. The committed
token at each depth is then distributed exactly as p, whatever the tree is (``test_eagle``'s
distribution test, with a known-wrong variant it must reject).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from studylib.decoding.common import Stopwatch, check_lengths, clip_at_stop, eos_set
from studylib.decoding.result import GenerationResult
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, LlamaModel
from studylib.models.config import ModelConfig
from studylib.models.cpu_linear import linear
from studylib.models.llama import DecoderLayer, RMSNorm
from studylib.models.rope import rope_cos_sin, rope_inv_freq
from studylib.sampling import SamplingParams, probs, sample_from

HEAD_FILE = "eagle_head.safetensors"
META_FILE = "eagle_meta.json"
VOCAB_FILE = "eagle_vocab.json"


# ---------------------------------------------------------------------------------------------- the head


HEAD_KINDS = ("eagle1", "eagle3")
# On a block-format target the head's linears run as blocks of this format, in the target's activation
# arithmetic (``EagleDraft.runtime_head``): the format of the target's own embedding and LM head, 1.06 bytes
# a weight against fp32's 4, so a draft forward reads about a quarter of the bytes it did and runs the
# target's kernels (int8 dot products under ``--act int8``) instead of fp32 GEMMs.
HEAD_BLOCK_FORMAT = "q8_0"


def fused_layers(config: ModelConfig) -> tuple[int, int, int]:
    """The target layers whose outputs an EAGLE-3 head fuses: low, middle and high (0-based)."""
    n = config.num_layers
    return (min(2, n - 1), n // 2, max(n - 3, 0))


class EagleHead(nn.Module):
    """fc([embedding, feature]) -> one decoder layer of the target's shape -> the next row's feature.

    ``kind`` says what the feature is:
    - ``eagle1`` (EAGLE-1/2): the target's final-norm hidden state f; the head regresses the next f, which
      the LM head reads directly.
    - ``eagle3`` (EAGLE-3, Li et al. 2025): for committed rows, ``fuse`` maps the target's low, middle and
      high layer outputs (``fused_layers``) to one feature; the head is trained on tokens only (no feature
      regression), its own output is what its next row reads (training-time test), and a norm of its own
      sits before the LM head.
    """

    def __init__(self, target_config: ModelConfig, kind: str = "eagle1"):
        super().__init__()
        if kind not in HEAD_KINDS:
            raise StudylibError(f"unknown EAGLE head kind {kind!r}; use one of {', '.join(HEAD_KINDS)}.")
        self.kind = kind
        self.config = replace(target_config, num_layers=1, name=f"eagle:{target_config.name}")
        h = target_config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.layer = DecoderLayer(self.config, 0)
        if kind == "eagle3":
            self.feature_layers: tuple[int, ...] = fused_layers(target_config)
            self.fuse = nn.Linear(3 * h, h, bias=False)
            self.norm = RMSNorm(h, target_config.rms_norm_eps)
        else:
            self.feature_layers = (-1,)
        inv_freq, scale = rope_inv_freq(self.config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope_scale = scale

    def lift(self, hidden: dict) -> torch.Tensor:
        """The feature of committed rows from the target's hidden states (``feature_layers`` -> (..., H))."""
        if self.kind == "eagle1":
            return hidden[-1]
        x = torch.cat([hidden[i] for i in self.feature_layers], dim=-1)
        return linear(x.to(self.fuse.weight.dtype), self.fuse.weight)

    def readout(self, out: torch.Tensor) -> torch.Tensor:
        """What the LM head reads from the head's output."""
        return out if self.kind == "eagle1" else self.norm(out)

    def forward(self, emb: torch.Tensor, feats: torch.Tensor, kv) -> torch.Tensor:
        """emb, feats: (B, T, H) -> predicted features (B, T, H); ``kv`` gives positions and attention."""
        x = linear(torch.cat([emb, feats], dim=-1), self.fc.weight, self.fc.bias)
        cos, sin = rope_cos_sin(kv.positions(), self.inv_freq, self.rope_scale, x.dtype)
        return self.layer(x, cos, sin, kv)

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def on_blocks(target: LlamaModel) -> bool:
    """Whether a draft beside ``target`` runs on its block path (block-format weights on the CPU)."""
    return getattr(target, "weights_format", "dense") != "dense" and target.device.type == "cpu"


def head_on_blocks(head: EagleHead, act: str, fmt: str = HEAD_BLOCK_FORMAT) -> EagleHead:
    """A copy of ``head`` whose linears (fc, the layer's fused q/k/v and gate/up, o, down, EAGLE-3's fuse)
    are ``fmt`` blocks multiplied in ``act``, packed once here; norms and RoPE stay fp32. The draft's output
    may move (its weights are rounded), the decoder's never does: the target verifies every token."""
    import copy

    from studylib.models.quant import act_kernel, quantize
    from studylib.models.weights import QuantLinear, install_layer

    kernel = act_kernel(act)

    def blocks(w: torch.Tensor):
        qt = quantize(w.detach().float(), fmt)
        qt.act = act
        if kernel is not None:
            kernel.pack(qt)
        return qt

    q = copy.deepcopy(head).float()
    q.fc = QuantLinear(blocks(head.fc.weight), head.fc.bias.detach().float())
    attn, mlp = q.layer.self_attn, q.layer.mlp
    if attn.qkv_weight is None:
        attn.fuse()
    if mlp.gate_up_weight is None:
        mlp.fuse()
    install_layer(q.layer, blocks(attn.qkv_weight), blocks(attn.o_proj.weight), blocks(mlp.gate_up_weight),
                  blocks(mlp.down_proj.weight))
    if head.kind == "eagle3":
        q.fuse = QuantLinear(blocks(head.fuse.weight))
    return q.eval()


class CausalKV:
    """Attention for training: a fresh causal pass over whole sequences, no cache."""

    def __init__(self, batch: int, seq: int, device):
        self._pos = torch.arange(seq, device=device)[None].expand(batch, seq)

    def positions(self) -> torch.Tensor:
        return self._pos

    def attend(self, layer, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class DraftKV:
    """The draft's one-layer cache: committed rows, then the rows of the tree being drafted.

    ``open(positions, visible)`` starts a forward of n rows at slots [used, used + n); ``visible``
    (n, used + n) says which slots each new row attends to (None: everything before it, causally)."""

    def __init__(self, cfg: ModelConfig, capacity: int, device, dtype):
        shape = (1, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.capacity, self.used, self.committed = capacity, 0, 0
        self._pos = None
        self._mask = None

    def open(self, positions: torch.Tensor, visible: torch.Tensor | None = None) -> DraftKV:
        n = int(positions.numel())
        if self.used + n > self.capacity:
            raise StudylibError(f"the draft cache holds {self.capacity} rows but this step needs {self.used + n}; "
                                "lower the tree size or max_new_tokens.")
        self._pos = positions.reshape(1, n)
        if visible is None and n > 1:
            visible = torch.ones(n, self.used + n, dtype=torch.bool, device=self.k.device)
            visible[:, self.used:] = torch.ones(n, n, dtype=torch.bool, device=self.k.device).tril()
        self._mask = None if visible is None else visible[None, None]
        self._n = n
        return self

    def positions(self) -> torch.Tensor:
        return self._pos

    def attend(self, layer, q, k, v):
        s, n = self.used, self._n
        self.k[:, :, s : s + n] = k
        self.v[:, :, s : s + n] = v
        self.used = s + n
        return F.scaled_dot_product_attention(q, self.k[:, :, : s + n], self.v[:, :, : s + n],
                                              attn_mask=self._mask, enable_gqa=True)

    def commit(self) -> None:
        """The rows written so far are committed context (catch-up rows)."""
        self.committed = self.used

    def drop_tree(self) -> None:
        self.used = self.committed


# ---------------------------------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class TreeSpec:
    """depth: draft forwards per step; topk: children per expanded node and nodes expanded per depth;
    nodes: draft tokens verified per step (the target verifies nodes + 1 rows)."""

    depth: int
    topk: int
    nodes: int

    def __post_init__(self) -> None:
        if self.depth < 1 or self.topk < 1 or self.nodes < 1:
            raise StudylibError(f"a draft tree needs depth, topk and nodes >= 1, got {self.depth},{self.topk},"
                                f"{self.nodes}; write --tree DEPTH,TOPK,NODES such as --tree 5,4,16.")
        most = self.topk + (self.depth - 1) * self.topk * self.topk
        if self.nodes > most:
            raise StudylibError(f"a tree of depth {self.depth} and topk {self.topk} drafts at most {most} nodes, "
                                f"fewer than the {self.nodes} asked for; lower NODES or raise DEPTH/TOPK.")

    @classmethod
    def chain(cls, gamma: int) -> TreeSpec:
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
            raise StudylibError(f"gamma must be an integer >= 1, got {gamma!r}.")
        return cls(gamma, 1, gamma)

    @classmethod
    def parse(cls, text: str) -> TreeSpec:
        parts = str(text).replace(" ", "").split(",")
        try:
            d, k, n = (int(p) for p in parts)
        except ValueError:
            raise StudylibError(f"cannot read the tree {text!r}; write DEPTH,TOPK,NODES such as 5,4,16.") from None
        return cls(d, k, n)

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    def label(self) -> str:
        return f"{self.depth}" if self.is_chain else f"{self.depth},{self.topk},{self.nodes}"


@dataclass
class DraftTree:
    """The kept nodes, parents before children. parent[i] = -1 for a child of the root."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> list[list[int]]:
        """Per row of the verify block (0 = root, i + 1 = node i): the rows of its children, best first."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i + 1)
        return kids

    def mask(self, device) -> torch.Tensor:
        """(n + 1, n + 1) bool over [root, nodes...]: each row sees the root, its ancestors and itself."""
        n = len(self) + 1
        m = torch.zeros(n, n, dtype=torch.bool)
        m[:, 0] = True
        for i in range(len(self)):
            m[i + 1] = m[self.parents[i] + 1]
            m[i + 1, i + 1] = True
        return m.to(device)


def select_nodes(tokens: list[int], parents: list[int], depths: list[int], scores: list[float], keep: int
                 ) -> DraftTree:
    """The ``keep`` highest-scoring nodes, closed under ancestors, reindexed parents-first.

    Scores are sums of log-probabilities, so a child never beats its parent; sorting by (score, depth)
    visits every parent before its children, and a node whose parent was not kept is skipped."""
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i], i))
    kept: list[int] = []
    taken = set()
    for i in order:
        if len(kept) == keep:
            break
        if parents[i] < 0 or parents[i] in taken:
            kept.append(i)
            taken.add(i)
    kept.sort(key=lambda i: (depths[i], -scores[i], i))
    new = {old: j for j, old in enumerate(kept)}
    return DraftTree(tokens=[tokens[i] for i in kept], parents=[new[parents[i]] if parents[i] >= 0 else -1 for i in kept],
                     depths=[depths[i] for i in kept], scores=[scores[i] for i in kept])


# ---------------------------------------------------------------------------------------------- verification


def walk_greedy(logits: torch.Tensor, tree: DraftTree) -> tuple[list[int], int]:
    """(rows of the accepted nodes, next token): follow the child that equals the target's argmax."""
    best = logits.argmax(-1).tolist()  # (n + 1,) one sync
    kids = tree.children()
    row, path = 0, []
    while True:
        nxt = best[row]
        child = next((c for c in kids[row] if tree.tokens[c - 1] == nxt), None)
        if child is None:
            return path, nxt
        path.append(child)
        row = child


def walk_sampling(logits: torch.Tensor, tree: DraftTree, sampling: SamplingParams, gen, exact: bool = True
                  ) -> tuple[list[int], int]:
    """Multi-candidate rejection with one-hot proposals (module docstring). ``exact=False`` is the
    known-wrong variant the tests must catch: a rejected child is not removed from p."""
    kids = tree.children()
    row, path = 0, []
    while True:
        p = probs(logits[row], sampling).clone()  # (V,)
        moved = False
        for c in kids[row]:
            tok = tree.tokens[c - 1]
            u = float(torch.rand((), generator=gen, device=logits.device))
            if u < float(p[tok]):
                path.append(c)
                row, moved = c, True
                break
            if exact:
                p[tok] = 0.0
                total = p.sum()
                if not bool(total > 1e-12):  # every candidate had all the mass: cannot happen after a rejection
                    p = probs(logits[row], sampling)
                    break
                p = p / total
        if not moved:
            return path, int(sample_from(p, gen))


# ---------------------------------------------------------------------------------------------- the drafter


@dataclass
class EagleDraft:
    """A trained head for one target, with its tree shape and (optional) reduced vocabulary."""

    head: EagleHead
    head_ids: torch.Tensor | None = None  # (N,) long, or None for the full LM head
    tree: TreeSpec = field(default_factory=lambda: TreeSpec(5, 4, 16))
    name: str = "eagle"
    meta: dict = field(default_factory=dict)
    # target model -> {full head?: (ids, rows)}; weak, so a dropped model takes its rows with it
    _projections: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, repr=False,
                                                    compare=False)
    # target model -> {(weights, act): the head that runs beside it}
    _runtime: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, repr=False,
                                                compare=False)

    def runtime_head(self, target: LlamaModel) -> EagleHead:
        """The head as it runs beside ``target``: on block-format weights, on the target's path
        (``head_on_blocks``: its linears as ``HEAD_BLOCK_FORMAT`` blocks in the target's ``--act``); on dense
        weights, the head itself. Built once per target and arithmetic."""
        if not on_blocks(target):
            return self.head
        fmt, act = target.weights_format, getattr(target, "act", "fp32")
        per_target = self._runtime.setdefault(target, {})
        if (fmt, act) not in per_target:
            per_target[(fmt, act)] = head_on_blocks(self.head, act)
        return per_target[(fmt, act)]

    def arithmetic(self, target: LlamaModel) -> str:
        """How the draft multiplies beside ``target``, for results ("q8_0 x int8", or the head's dtype)."""
        if not on_blocks(target):
            return str(self.head.fc.weight.dtype).removeprefix("torch.")
        return f"{HEAD_BLOCK_FORMAT} x {getattr(target, 'act', 'fp32')}"

    def projection(self, target: LlamaModel) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(head ids on the device or None, the LM head rows the draft projects onto), built once per
        target. A block-format head (``--weights gguf``) keeps its kernel for the full vocabulary and is
        dequantised row by row for a reduced one."""
        from studylib.models.quant import QuantTensor

        per_target = self._projections.setdefault(target, {})
        w0 = target.lm_head.weight
        key = (self.head_ids is None, getattr(w0, "act", None))  # apply_act may change the arithmetic later
        cached = per_target.get(key)
        if cached is None:
            w = target.lm_head.weight
            if self.head_ids is None:
                cached = (None, w)
            elif type(w) is QuantTensor:
                # the target's own block rows, in its arithmetic: the reduced head reads 1.06 bytes a weight
                from studylib.models.quant import act_kernel

                ids = self.head_ids.to(target.device)
                rows = QuantTensor(w.data[ids.cpu()].contiguous(), w.fmt, (len(ids), w.shape[1]), w.prefill_dtype,
                                   w.act)
                kernel = act_kernel(w.act)
                if kernel is not None:
                    kernel.pack(rows)
                cached = (ids, rows)
            else:
                ids = self.head_ids.to(target.device)
                cached = (ids, w.detach()[ids].to(target.dtype).contiguous())
            per_target[key] = cached
        return cached

    def with_tree(self, tree: TreeSpec) -> EagleDraft:
        return replace(self, tree=tree)

    def full_head(self) -> EagleDraft:
        return replace(self, head_ids=None, name=self.name + ":full")

    def check(self, target: LlamaModel) -> None:
        c, h = target.config, self.head.config
        if (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size) != \
                (h.hidden_size, h.num_heads, h.num_kv_heads, h.head_dim, h.intermediate_size):
            raise StudylibError(f"the EAGLE head was trained for a target of width {h.hidden_size} but "
                                f"{c.name} has width {c.hidden_size}; train one with "
                                f"`studylib train-draft --kind eagle --model {c.name}`.")

    def cost_ratio(self, target: LlamaModel) -> float:
        """Weights read per draft forward over the target's (the first guess at c; chapter 2 measures it)."""
        from studylib.decoding.cost_model import layer_cost

        c = target.config
        rows = c.vocab_size if self.head_ids is None else len(self.head_ids)
        fuse = 3 * c.hidden_size * c.hidden_size if self.head.kind == "eagle3" else 0  # per committed row
        body = layer_cost(target, 1) - c.vocab_size * c.hidden_size + 2 * c.hidden_size * c.hidden_size + fuse
        if not on_blocks(target):
            return (body + rows * c.hidden_size) / layer_cost(target)
        # on block weights, bytes: the head's linears as HEAD_BLOCK_FORMAT blocks (runtime_head), its rows the
        # target's own, against every weight byte the target's step reads
        from studylib.models.quant import FORMATS
        from studylib.models.weights import weight_bytes

        head_w = target.lm_head.weight
        per_head_weight = head_w.nbytes / (head_w.shape[0] * head_w.shape[1])
        per_weight = FORMATS[HEAD_BLOCK_FORMAT][1] / 32
        return (body * per_weight + rows * c.hidden_size * per_head_weight) / weight_bytes(target)

    def describe(self) -> str:
        return f"{self.name}@{self.tree.label()}"


class _Session:
    """Per-request state: the draft cache and the head's projection."""

    def __init__(self, draft: EagleDraft, target: LlamaModel, capacity: int):
        self.d, self.target = draft, target
        self.head = draft.runtime_head(target)
        self.ids, self.w_head = draft.projection(target)
        slack = draft.tree.depth * draft.tree.topk + 1
        self.kv = DraftKV(draft.head.config, capacity + slack, target.device, target.dtype)
        self.forwards = 0

    def _run(self, feats: torch.Tensor, tokens: Sequence[int], positions: torch.Tensor, visible=None) -> torch.Tensor:
        """Draft rows (R, H) for pairs (feats[r], tokens[r]) -> predicted features (R, H)."""
        ids = torch.as_tensor(list(tokens), dtype=torch.long, device=feats.device)
        emb = self.target.model.embed_tokens(ids[None])  # (1, R, H); a block-format embedding dequantises
        out = self.head(emb, feats[None].to(emb.dtype), self.kv.open(positions, visible))[0]
        self.forwards += 1
        return out

    def _logp(self, h: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(linear(self.head.readout(h), self.w_head).float(), -1)  # (R, N)

    def _token(self, idx: torch.Tensor) -> torch.Tensor:
        return idx if self.ids is None else self.ids[idx]

    def catch_up(self, feats: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
        """Feed committed pairs (true features); return the last row's predicted feature (H,)."""
        start = self.kv.committed
        pos = torch.arange(start, start + len(tokens), device=feats.device)
        out = self._run(feats, tokens, pos)
        self.kv.commit()
        return out[-1]

    def draft(self, root: torch.Tensor) -> DraftTree:
        """Grow the dynamic tree from the root's predicted feature (module docstring)."""
        spec = self.d.tree
        k = spec.topk
        n = self.kv.committed  # the root row sits at position n - 1; depth-d nodes at n - 1 + d
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        scores: list[float] = []
        feats: list[torch.Tensor] = []  # per node: the feature its children will be fed (after expansion)
        slot: dict[int, int] = {}  # node -> draft-cache slot once expanded
        lp, idx = self._logp(root[None])[0].topk(k)
        frontier = []
        for s, t in zip(lp.tolist(), self._token(idx).tolist(), strict=True):
            frontier.append(len(tokens))
            tokens.append(t), parents.append(-1), depths.append(1), scores.append(s), feats.append(root)
        for depth in range(2, spec.depth + 1):
            beam = sorted(frontier, key=lambda i: -scores[i])[:k]
            used = self.kv.used
            visible = torch.zeros(len(beam), used + len(beam), dtype=torch.bool)
            visible[:, :n] = True
            for r, i in enumerate(beam):
                a = parents[i]
                while a >= 0:
                    visible[r, slot[a]] = True
                    a = parents[a]
                visible[r, used + r] = True
                slot[i] = used + r
            pos = torch.full((len(beam),), n - 2 + depth, dtype=torch.long, device=root.device)
            out = self._run(torch.stack([feats[i] for i in beam]), [tokens[i] for i in beam], pos,
                            visible.to(root.device))
            lp, idx = self._logp(out).topk(k, dim=-1)  # (R, k)
            toks = self._token(idx).tolist()
            frontier = []
            for r, i in enumerate(beam):
                for s, t in zip(lp[r].tolist(), toks[r], strict=True):
                    frontier.append(len(tokens))
                    tokens.append(t), parents.append(i), depths.append(depth), scores.append(scores[i] + s)
                    feats.append(out[r])
        self.kv.drop_tree()
        return select_nodes(tokens, parents, depths, scores, spec.nodes)


def _target_features(model: LlamaModel, ids: torch.Tensor, view, layers=(-1,), logits="all"):
    out = model(ids, view, logits=logits, hidden_layers=layers)
    return out.logits, {i: h[0] for i, h in out.hidden.items()}  # (1, T, V) or empty, {layer: (T, H)}


@torch.inference_mode()
def generate(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    tokenizer: object | None = None,
    draft: EagleDraft | str | None = "eagle",
    tree: TreeSpec | str | None = None,
    gamma: int | None = None,
    walker: Callable | None = None,
    on_step: Callable[[DenseKVCache, list[int]], None] | None = None,
) -> GenerationResult:
    """EAGLE decoding. ``draft``: an ``EagleDraft`` or a spec (``eagle``, ``eagle:full``, or a
    directory); ``tree`` (``TreeSpec`` or "D,K,N") or ``gamma`` (a chain) override its tree; ``walker``
    swaps the verification walk (tests). Returns the shared ``GenerationResult``."""
    drafter = resolve_eagle(draft, model)
    if tree is not None and gamma is not None:
        raise StudylibError("give either --tree or --gamma for an EAGLE draft, not both.")
    if gamma is not None:
        drafter = drafter.with_tree(TreeSpec.chain(gamma))
    elif tree is not None:
        drafter = drafter.with_tree(tree if isinstance(tree, TreeSpec) else TreeSpec.parse(tree))
    spec = drafter.tree
    cap = check_lengths(model, prompt_ids, max_new_tokens, slack=spec.nodes + 1)
    eos = eos_set(model, tokenizer)
    gen = sampling.generator(model.device)
    clock = Stopwatch(model.device)
    dev = model.device
    prompt = [int(t) for t in prompt_ids]
    cache = DenseKVCache(model.config, 1, cap, dev, model.dtype)
    head = drafter.runtime_head(model)
    logits, hid = _target_features(model, torch.tensor([prompt], device=dev), cache.begin(len(prompt)),
                                   head.feature_layers, "last")
    feats = head.lift(hid)
    first = int(logits[0, -1].argmax()) if sampling.greedy else int(sample_from(probs(logits[0, -1], sampling), gen))
    ttft = clock.elapsed()
    out, lengths, depth_hist = [first], [], [0] * (spec.depth + 1)
    stop = "eos" if first in eos else "length"
    session = _Session(drafter, model, cap)
    # Catch-up pairs (f_(j), x_(j+1)): the prompt's features with the tokens after them.
    pend_feats, pend_toks = feats, [*prompt[1:], first]
    draft_s = verify_s = 0.0
    while stop != "eos" and len(out) < max_new_tokens:
        t0 = clock.now()
        root = session.catch_up(pend_feats, pend_toks)
        tree_ = session.draft(root)
        t1 = clock.now()
        start = cache.length
        block = torch.tensor([[out[-1], *tree_.tokens]], device=dev)  # (1, n + 1)
        pos = (start + torch.tensor([0, *tree_.depths], device=dev))[None]
        view = cache.begin(block.shape[1], tree_mask=tree_.mask(dev), positions=pos)
        logits, hid = _target_features(model, block, view, head.feature_layers)
        logits = logits[0]
        path, nxt = walk_greedy(logits, tree_) if sampling.greedy else \
            (walker or walk_sampling)(logits, tree_, sampling, gen)
        cache.keep(start, [start + r for r in [0, *path]])
        verify_s += clock.now() - t1
        draft_s += t1 - t0
        remaining = max_new_tokens - len(out)
        new, hit = clip_at_stop([*(tree_.tokens[r - 1] for r in path), nxt], eos, remaining)
        if cache.length > start + len(new):  # cut at EOS or the budget: drop the slots past the output
            cache.truncate(start + len(new))
        out += new
        lengths.append(len(new))
        depth_hist[len(path)] += 1
        keep = [0, *path]
        pend_feats = head.lift({i: h[keep] for i, h in hid.items()})
        pend_toks = [*(tree_.tokens[r - 1] for r in path), nxt]
        if on_step is not None:
            on_step(cache, prompt + out)
        if hit:
            stop = "eos"
    wall = clock.elapsed()
    steps = len(lengths)
    # Per-position acceptance: of the steps whose path reached depth d - 1, the share that went on to d.
    reach = [sum(depth_hist[d:]) for d in range(spec.depth + 1)]
    per_pos = [reach[d] / reach[d - 1] if reach[d - 1] else None for d in range(1, spec.depth + 1)]
    extra = {
        "draft": drafter.describe(), "tree": [spec.depth, spec.topk, spec.nodes],
        "draft_arithmetic": drafter.arithmetic(model), "accepted_depths": depth_hist, "per_position_acceptance": per_pos,
        "mean_accepted": (sum(lengths) - steps) / steps if steps else None,
        "draft_forwards": session.forwards, "draft_s": draft_s, "verify_s": verify_s,
        "verify_tokens": spec.nodes + 1,
        "measured_cost_ratio": (draft_s / session.forwards) / (verify_s / steps)
        if session.forwards and steps and verify_s > 0 else None,
    }
    return GenerationResult(
        token_ids=out, text=tokenizer.decode(out) if tokenizer is not None else "", new_tokens=len(out),
        target_forwards=1 + steps, steps=steps, accepted_lengths=lengths, ttft_s=ttft, wall_s=wall,
        prompt_tokens=len(prompt), method="eagle", stop_reason=stop, extra=extra,
    )


# ---------------------------------------------------------------------------------------------- storage


def eagle_dir(target_name: str) -> Path:
    from studylib.cache import cache_dir
    from studylib.decoding.draft_files import slug as _slug

    return cache_dir("drafts", f"{_slug(target_name)}-eagle")


def save_head(head: EagleHead, path: Path, head_ids: Sequence[int], meta: dict) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(path / HEAD_FILE))
    (path / VOCAB_FILE).write_text(json.dumps([int(t) for t in head_ids]))
    (path / META_FILE).write_text(json.dumps(meta, indent=1, default=str))


def load_head(path: Path, target: LlamaModel) -> EagleDraft:
    from safetensors.torch import load_file

    from studylib.bench.provenance import record_artifact

    meta = json.loads((path / META_FILE).read_text()) if (path / META_FILE).exists() else {}
    head = EagleHead(target.config, meta.get("head_kind", "eagle1"))
    head.load_state_dict(load_file(str(record_artifact("eagle_head", path / HEAD_FILE))))
    head.to(device=target.device, dtype=target.dtype).eval()
    ids = json.loads((path / VOCAB_FILE).read_text()) if (path / VOCAB_FILE).exists() else []
    tree = TreeSpec(*meta["tree"]) if meta.get("tree") else TreeSpec(5, 4, 16)
    d = EagleDraft(head, torch.tensor(ids, dtype=torch.long) if ids else None, tree, "eagle", meta)
    d.check(target)
    return d


_LOADED: dict[tuple[str, str], EagleDraft] = {}


def head_path(name: str, target_name: str) -> Path:
    """Where the head called ``name`` lives: ``eagle`` is the shipped default (the better of the two
    recipes, by chapter 2's measurement; ``studylib/assets/drafts/<target>-eagle.default`` names it) and
    else the head ``train-draft --kind eagle`` made in the cache; ``eagle1`` / ``eagle3`` are the shipped
    head of that recipe, else the one ``train-draft --kind eagle --preset shipped --recipe R`` made."""
    from studylib.decoding.draft_files import SHIPPED, shipped_dir
    from studylib.decoding.draft_files import slug as _slug

    if name == "eagle":
        pointer = SHIPPED / f"{_slug(target_name)}-eagle.default"
        if pointer.exists():
            return shipped_dir(target_name, pointer.read_text().strip())
        return eagle_dir(target_name)
    shipped = shipped_dir(target_name, name)
    if (shipped / HEAD_FILE).exists():
        return shipped
    return eagle_dir(target_name).with_name(f"{_slug(target_name)}-{name}")


def resolve_eagle(spec, target: LlamaModel) -> EagleDraft:
    """``eagle`` (the shipped default head, else the one ``train-draft --kind eagle`` made), ``eagle1`` /
    ``eagle3`` (a recipe's head, see ``head_path``), any of them with ``:full`` (the whole LM head instead
    of the reduced vocabulary), a directory holding a head, or an ``EagleDraft``."""
    if isinstance(spec, EagleDraft):
        spec.check(target)
        return spec
    if spec is None:
        spec = "eagle"
    if not isinstance(spec, str):
        raise StudylibError(f"an EAGLE draft is 'eagle', 'eagle1', 'eagle3' (with ':full') or a directory, got "
                            f"{type(spec).__name__}.")
    full = spec.endswith(":full")
    base = spec[: -len(":full")] if full else spec
    path = head_path(base, target.config.name) if base in ("eagle", *HEAD_KINDS) else Path(base)
    if not (path / HEAD_FILE).exists():
        raise StudylibError(f"no EAGLE head {base!r} for {target.config.name!r} in {path}; run "
                            f"`studylib train-draft --kind eagle --model {target.config.name}` (or with "
                            "`--preset shipped`) first.")
    key = (str(path.resolve()), f"{target.config.name}:{target.dtype}:{target.device}")
    if key not in _LOADED:
        _LOADED[key] = load_head(path, target)
    d = _LOADED[key]
    return d.full_head() if full else d


__all__ = ["CausalKV", "DraftKV", "DraftTree", "EagleDraft", "EagleHead", "TreeSpec", "eagle_dir", "generate",
           "load_head", "resolve_eagle", "save_head", "select_nodes", "walk_greedy",
           "walk_sampling"]
