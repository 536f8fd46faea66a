"""One picture per mechanism, drawn by library code: what a reader should see before the numbers.

- ``decode_chain``: prefill is one pass over the prompt, decoding one pass per token (chapter 1);
- ``draft_verify``: one speculative step: the draft proposes, the target checks every proposal in one
  forward, keeps the agreeing prefix and adds its own next token (chapter 2);
- ``radix_tree``: the prefix tree a workload of shared system prompts and follow-up turns builds (chapter 4);
- ``batching_timelines``: the same requests served one at a time, in padded static batches and by
  iteration-level continuous batching, simulated step by step (chapter 5);
- ``block_table``: sequences' logical KV blocks mapped onto a shared physical pool, prefix blocks shared
  (chapter 5);
- ``attention_masks``: which keys each query sees under dense, window, sinks and block-sparse patterns,
  computed by ``studylib.attention.patterns`` itself (chapter 6);
- ``eagle_tree``: EAGLE's dynamic token tree, its nodes chosen by ``eagle.select_nodes`` itself (chapter 2);
- ``lookahead_step``: the Jacobi window, the n-gram pool and the verification branch (chapter 3);
- ``stack_layers``: which cost each technique of the stack acts on (chapter 7);
- ``q4_block_int8_dot``: a Q4_1 block and the int8 dot product, with the library's own rounding (chapter 8).

Each function takes the sizes a chapter ran with (its parameters) and returns a matplotlib Figure;
``MECHANISMS`` maps a chapter to its picture, and ``show_mechanism(N, params)`` draws it in a notebook.
The rendered book puts the same picture under each chapter's summary.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ACCEPT, REJECT, BONUS, DRAFT, TARGET = "#1a7f37", "#c33", "#0b5cad", "#bbbbbb", "#6e6e9e"
SHARED = "#c8e6c9"
OWNERS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")  # no green
# The smallest text a diagram draws: it is shown about as wide as the page column, where 7-8 pt text read too
# small (a reader said so); boxes and figures are sized so 9 pt text fits them.
FONT = 9


def _note(fig, text: str, width: int = 105) -> None:
    """A caption along the figure's top, wrapped so it never runs off the picture."""
    fig.suptitle(textwrap.fill(text, width), fontsize=10, x=0.02, ha="left")


def _plt():
    import matplotlib

    if matplotlib.get_backend().lower() in ("", "agg") or not _in_kernel():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def _box(ax, x, y, w, h, text="", color="#ddd", edge="#555", fontsize=9, hatch=None, text_color="#111"):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, lw=0.8, hatch=hatch))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def _clean(ax):
    ax.set_xticks([])
    ax.set_yticks([])
    for s in ax.spines.values():
        s.set_visible(False)


# ------------------------------------------------------------------------------------------ chapter 1

def decode_chain(prompt_tokens: int = 6, new_tokens: int = 5):
    """Prefill reads the weights once for the whole prompt; each new token needs its own pass."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 2.4))
    _box(ax, 0, 1.1, 2.2, 0.7, f"prefill: one pass over\n{prompt_tokens} prompt tokens", TARGET, text_color="white")
    x = 2.4
    for i in range(new_tokens):
        _box(ax, x, 1.1, 1.1, 0.7, f"pass {i + 1}", TARGET, text_color="white")
        _box(ax, x + 0.3, 0.2, 0.5, 0.5, f"t{i + 1}", BONUS, text_color="white")
        if i + 1 < new_tokens:
            ax.annotate("", xy=(x + 1.3, 1.45), xytext=(x + 0.8, 0.45),
                        arrowprops={"arrowstyle": "->", "color": "#555", "lw": 0.8})
        x += 1.3
    _note(fig, "Every pass reads all the weights and the KV cache; a decode pass makes one token, so latency grows "
               "with the tokens.")
    ax.set_xlim(-0.1, x + 0.1)
    ax.set_ylim(0, 2.0)
    _clean(ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ chapter 2

def draft_verify(gamma: int = 4, accepted: int = 2):
    """One speculative step: ``gamma`` draft tokens, the first ``accepted`` agree with the target, the
    next is rejected and replaced by the target's own token (the bonus token when all agree)."""
    if not 0 <= accepted <= gamma:
        raise ValueError(f"accepted must lie in 0..gamma; got {accepted} of {gamma}")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 2.9))
    for i in range(gamma):
        _box(ax, i * 1.0, 2.0, 0.9, 0.55, f"draft d{i + 1}", DRAFT)
    ax.text(-0.15, 2.27, "draft model\n(small, γ passes)", ha="right", va="center", fontsize=FONT)
    _box(ax, 0, 1.1, gamma * 1.0 + 0.9, 0.55, f"target: ONE forward pass over all {gamma} proposals (+1)", TARGET,
         text_color="white")
    ax.text(-0.15, 1.37, "target model", ha="right", va="center", fontsize=FONT)
    for i in range(gamma + 1):
        if i < accepted:
            color, label = ACCEPT, f"d{i + 1} ✓"
        elif i == accepted:
            color, label = (REJECT if i < gamma else BONUS), ("target's\ntoken" if i < gamma else "bonus")
        else:
            color, label = "#f3f3f3", "discarded"
        _box(ax, i * 1.0, 0.2, 0.9, 0.55, label, color, text_color="white" if color != "#f3f3f3" else "#777")
    ax.text(-0.15, 0.47, "committed", ha="right", va="center", fontsize=FONT)
    _note(fig, f"{accepted + 1} tokens for one target pass: the agreeing prefix, then the target's own next token "
               "(red: the first disagreement, replaced). The output is exactly what the target alone would produce.")
    ax.set_xlim(-1.6, gamma + 1.1)
    ax.set_ylim(0, 2.75)
    _clean(ax)
    fig.tight_layout()
    return fig


def eagle_tree(depth: int = 3, topk: int = 2, nodes: int = 6, seed: int = 3):
    """EAGLE's dynamic tree (EAGLE-2): the head reads the target's feature of the last token, proposes the
    top-k next tokens, expands the most likely frontier at each depth, and the ``nodes`` likeliest nodes
    (``eagle.select_nodes``, the library's own rule) go to ONE target forward under a tree mask; the
    longest path the target agrees with is committed."""
    import math
    import random

    from studylib.decoding.eagle import select_nodes

    rng = random.Random(seed)
    tokens, parents, depths, scores = [], [], [], []
    frontier = [-1]
    for d in range(1, depth + 1):
        beam = sorted(frontier, key=lambda i: -scores[i] if i >= 0 else 0)[:topk]
        frontier = []
        for parent in beam:
            probs = sorted((rng.random() for _ in range(topk)), reverse=True)
            total = sum(probs) * 1.3
            for p in probs:
                frontier.append(len(tokens))
                tokens.append(len(tokens))
                parents.append(parent)
                depths.append(d)
                scores.append((scores[parent] if parent >= 0 else 0.0) + math.log(p / total))
    kept = select_nodes(tokens, parents, depths, scores, nodes)
    kept_ids = set(kept.tokens)
    path = [kept.tokens[0]]
    while True:  # the drawn accepted path: the likeliest child at each depth, while it was kept
        kids = [t for t, par in zip(kept.tokens, kept.parents, strict=True) if par >= 0 and kept.tokens[par] == path[-1]]
        if not kids or len(path) >= depth - 1:
            break
        path.append(kids[0])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.4))
    pos = {}
    per_depth: dict[int, list[int]] = {}
    for i, d in enumerate(depths):
        per_depth.setdefault(d, []).append(i)
    for d, ids in per_depth.items():
        for r, i in enumerate(ids):
            pos[i] = (1.6 * d, (len(ids) - 1) / 2 - r)
    ax.add_patch(__import__("matplotlib.patches", fromlist=["FancyBboxPatch"]).FancyBboxPatch(
        (-0.55, -0.35), 1.1, 0.7, boxstyle="round,pad=0.02", facecolor=TARGET, edgecolor="#555"))
    ax.text(0, 0, "last token\n+ its feature", ha="center", va="center", fontsize=FONT, color="white")
    for i in range(len(tokens)):
        x, y = pos[i]
        px, py = (0, 0) if parents[i] < 0 else pos[parents[i]]
        ax.plot([px + 0.5, x - 0.5], [py, y], color="#999", lw=0.8, zorder=0)
        color = ACCEPT if i in path else (DRAFT if i in kept_ids else "#f3f3f3")
        p = math.exp(scores[i])
        _box(ax, x - 0.5, y - 0.25, 1.0, 0.5, f"p={p:.2f}" if p >= 0.01 else "p<0.01", color,
             text_color="white" if i in path else ("#111" if i in kept_ids else "#999"), fontsize=FONT)
    ax.text(1.6, max(y for _, y in pos.values()) + 0.7, f"the head drafts {depth} levels, top-{topk} at each", fontsize=FONT,
            ha="left")
    _note(fig, f"Grey: the {nodes} likeliest nodes (probability of the whole path), verified together in ONE target "
               "forward, each seeing only its ancestors (tree attention mask). Green: the path the target agreed "
               "with, committed with the target's own next token. Pale: drafted but not verified.")
    ax.set_xlim(-0.8, 1.6 * depth + 0.8)
    ax.set_ylim(min(y for _, y in pos.values()) - 0.6, max(y for _, y in pos.values()) + 1.0)
    _clean(ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ chapter 3

def lookahead_step(window: int = 4, ngram: int = 3, guesses: int = 2):
    """One lookahead step: a window of Jacobi guesses is refined in the same forward that verifies
    n-grams from the pool (those starting with the last token); the pool collects the n-grams the window
    produces, and the verified branch's agreeing prefix is committed."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.text(-0.2, 2.35, "lookahead branch\n(Jacobi window)", ha="right", va="center", fontsize=FONT)
    for r in range(ngram - 1):
        for c in range(window):
            _box(ax, c * 0.9, 2.0 - r * 0.55, 0.8, 0.45, f"g{r + 1},{c + 1}", DRAFT, fontsize=FONT)
    ax.annotate("", xy=(window * 0.9 + 0.5, 1.4), xytext=(window * 0.9 + 0.05, 1.9),
                arrowprops={"arrowstyle": "->", "color": "#555"})
    _box(ax, window * 0.9 + 0.5, 0.95, 2.2, 0.5, f"n-gram pool: {ngram}-grams\nseen in the window", SHARED, fontsize=FONT)
    ax.text(-0.2, 0.45, "verification branch\n(pool n-grams)", ha="right", va="center", fontsize=FONT)
    for gi in range(guesses):
        for c in range(ngram - 1):
            col = ACCEPT if gi == 0 and c == 0 else (REJECT if gi == 0 and c == 1 else "#f3f3f3")
            _box(ax, 0.9 * c + gi * 0.9 * ngram, 0.2, 0.8, 0.45, f"n{gi + 1}.{c + 1}", col,
                 text_color="white" if col in (ACCEPT, REJECT) else "#555", fontsize=FONT)
    _box(ax, -0.1, -0.75, window * 0.9 + 3.0, 0.6, "the target: ONE forward over the window and every branch\n"
         "(attention mask: each row sees its own branch)", TARGET, text_color="white", fontsize=FONT)
    _note(fig, "Lossless: only a pool n-gram the target agrees with, token by token, is committed (green), then the "
               "target's own next token; the window's guesses only feed the pool.")
    ax.set_xlim(-2.2, window * 0.9 + 3.2)
    ax.set_ylim(-0.9, 2.7)
    _clean(ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ chapter 7

def stack_layers(parts: Sequence[str] = ("prefix cache (radix)", "continuous batching", "speculative / lookahead",
                                         "4-bit weights, int8 activations", "sparse attention")):
    """How the techniques compose in one serving stack: each acts on a different cost of a request, so
    their gains multiply only when their costs do not overlap."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 2.8))
    acts = {"prefix cache (radix)": "skips the shared prompt's prefill (TTFT)",
            "continuous batching": "fills each step with many requests (throughput)",
            "speculative / lookahead": "commits several tokens per target step (TPOT)",
            "4-bit weights, int8 activations": "makes every step read and compute less",
            "sparse attention": "reads less of a long KV cache per step"}
    for i, name in enumerate(parts):
        y = len(parts) - 1 - i
        _box(ax, 0, y * 0.5, 3.2, 0.42, name, OWNERS[i % len(OWNERS)], text_color="white", fontsize=FONT)
        ax.text(3.4, y * 0.5 + 0.21, acts.get(name, ""), va="center", fontsize=FONT)
    _note(fig, "A stack's gain is at most the product of its parts' gains, and less where two act on the same cost "
               "(batching fills the compute that speculation would use); chapter 7 measures the stack against that "
               "product.")
    ax.set_xlim(-0.1, 9)
    ax.set_ylim(-0.1, len(parts) * 0.5)
    _clean(ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ chapter 8

def q4_block_int8_dot(seed: int = 0):
    """A Q4_1 block of 32 weights (4-bit codes q, an fp16 scale d and minimum m: w = d q + m), and the int8
    dot product with activations rounded per block (``int8_linear.quantize_activations``, the library's own
    rounding): integer sum s = sum q x8, then d dx s + m sx."""
    import numpy as np
    import torch

    from studylib.models.int8_linear import quantize_activations

    g = np.random.default_rng(seed)
    w = g.normal(0, 0.05, 32)
    m, d = w.min(), (w.max() - w.min()) / 15
    q = np.clip(np.round((w - m) / d), 0, 15).astype(int)
    x = torch.tensor(g.normal(0, 1, (1, 32)), dtype=torch.float32)
    xq, dx, sq, sx = quantize_activations(x)
    xq = xq[0].numpy().astype(int)
    s_int = int((q * xq).sum())
    approx = float(d * float(dx[0, 0]) * s_int + m * float(sx[0, 0]))
    exact = float((d * q + m) @ x[0].numpy())
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(9, 3.6), gridspec_kw={"height_ratios": [1, 1]})
    for ax, vals, title, cmap in ((axes[0], q, f"Q4_1 block: 32 codes q (0..15), d = {d:.4f}, m = {m:.4f}; w = d q + m "
                                   "(20 bytes for 32 weights)", "Blues"),
                                  (axes[1], xq, f"x rounded per block to int8: dx = max|x| / 127 = {float(dx[0, 0]):.4f}; "
                                   "x8 = round(x / dx)", "RdBu")):
        ax.imshow(np.asarray(vals)[None, :], cmap=cmap, aspect="auto")
        dark = 11 if cmap == "Blues" else 80  # white text on the dark end of the colour map
        for i, v in enumerate(vals):
            ax.text(i, 0, str(v), ha="center", va="center", fontsize=FONT, color="white" if abs(v) >= dark else "#111")
        ax.set_title(title, fontsize=FONT, loc="left")
        _clean(ax)
    _note(fig, f"The dot product in integers: s = sum q x8 = {s_int} (exact; one VNNI instruction does 32 or 64 of these "
               f"products, one AMX tile multiply 16,384), then d dx s + m sum(x) = {approx:.4f} against {exact:.4f} in fp32: the rounding of x is "
               "what --act int8 changes, and chapter 8 measures its cost in quality.")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ chapter 4

def radix_tree(system_tokens: int = 1024, systems: int = 2, questions: int = 3, turn_tokens: int = 40):
    """The tree a few requests build: shared system prompts at the root's children, each request's own
    tokens as leaves; an edge label is the tokens the node holds (a radix tree stores runs, not tokens)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    width = systems * questions
    _box(ax, width / 2 - 0.6, 2.5, 1.2, 0.45, "root", "#eee")
    for s in range(systems):
        cx = s * questions + questions / 2
        _box(ax, cx - 1.1, 1.35, 2.2, 0.6, f"system prompt {chr(65 + s)}\n{system_tokens} tokens, cached once",
             ACCEPT, text_color="white")
        ax.plot([width / 2, cx], [2.5, 1.95], color="#555", lw=0.8)
        for q in range(questions):
            x = s * questions + q + 0.5
            _box(ax, x - 0.42, 0.2, 0.84, 0.55, f"question {q + 1}\n~{turn_tokens} tok", "#f6f8fa")
            ax.plot([cx, x], [1.35, 0.75], color="#555", lw=0.8)
    _note(fig, f"A request that matches a path reuses that path's KV: each question here prefills only its own "
               f"~{turn_tokens} tokens instead of {system_tokens + turn_tokens}.")
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(0, 3.0)
    _clean(ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ chapter 5

def simulate_batching(requests: Sequence[tuple[int, int]], slots: int) -> dict[str, list[tuple[int, int, int, str]]]:
    """Step-by-step schedules of (arrival step, output tokens) requests: sequential, static batches of
    ``slots`` (all wait for the longest), continuous (a freed slot is refilled at the next step).
    Returns policy -> [(request, start step, end step, kind)] with kind "work" or "idle" (a static row
    that finished but still occupies its slot)."""
    out: dict[str, list[tuple[int, int, int, str]]] = {"sequential": [], "static": [], "continuous": []}
    t = 0
    for i, (arr, n) in enumerate(requests):
        t = max(t, arr)
        out["sequential"].append((i, t, t + n, "work"))
        t += n
    t, pending = 0, list(range(len(requests)))
    while pending:
        batch = [i for i in pending if requests[i][0] <= t][:slots]
        if not batch:
            t = min(requests[i][0] for i in pending)
            continue
        longest = max(requests[i][1] for i in batch)
        for i in batch:
            out["static"].append((i, t, t + requests[i][1], "work"))
            if requests[i][1] < longest:
                out["static"].append((i, t + requests[i][1], t + longest, "idle"))
            pending.remove(i)
        t += longest
    t, waiting, running = 0, list(range(len(requests))), {}
    while waiting or running:
        for i in [i for i in waiting if requests[i][0] <= t][: slots - len(running)]:
            running[i] = t
            waiting.remove(i)
        t += 1
        for i, start in list(running.items()):
            if t - start >= requests[i][1]:
                out["continuous"].append((i, start, t, "work"))
                del running[i]
    return out


def batching_timelines(requests: Sequence[tuple[int, int]] = ((0, 6), (0, 2), (0, 4), (1, 3), (2, 5), (3, 2)),
                       slots: int = 3):
    """Gantt charts of the three policies on the same requests (one row per request, time in steps)."""
    plt = _plt()
    sched = simulate_batching(requests, slots)
    fig, axes = plt.subplots(1, 3, figsize=(10, 2.9), sharey=True)
    colors = [plt.cm.tab10(i % 10) for i in range(len(requests))]
    for ax, (name, rows) in zip(axes, sched.items(), strict=True):
        end = max(e for _, _, e, _ in rows)
        for i, s, e, kind in rows:
            ax.barh(i, e - s, left=s, color="white" if kind == "idle" else colors[i], edgecolor="#555",
                    hatch="///" if kind == "idle" else None, height=0.7)
        for i, (arr, _) in enumerate(requests):
            ax.plot(arr, i, marker="|", color="#222", ms=12)
        ax.set_title(f"{name}: done at step {end}", fontsize=9)
        ax.set_xlabel("decode steps")
        ax.invert_yaxis()
    axes[0].set_yticks(range(len(requests)), [f"request {i + 1}" for i in range(len(requests))], fontsize=FONT)
    fig.suptitle(f"The same {len(requests)} requests, {slots} slots (| arrival; hatched: a finished row still "
                 "holding its static slot)", fontsize=9)
    fig.tight_layout()
    return fig


def block_table(lengths: Sequence[int] = (40, 52, 35), shared: int = 32, block_size: int = 16):
    """Sequences' logical blocks mapped onto one physical pool; the first ``shared`` tokens (a common
    prefix) live in blocks every sequence points at, so they are stored once."""
    plt = _plt()
    import math

    shared_blocks = shared // block_size
    fig, ax = plt.subplots(figsize=(9.5, 3.0))
    next_free = shared_blocks
    placements = []
    for n in lengths:
        blocks = math.ceil(n / block_size)
        phys = []
        for b in range(blocks):
            if b < shared_blocks and n >= shared:
                phys.append(b)
            else:
                phys.append(next_free)
                next_free += 1
        placements.append(phys)
    pool = next_free
    # the pool starts right of the longest block table, and wraps at 8 blocks a row
    x0 = max(len(phys) for phys in placements) * 0.9 + 0.7
    pool_rows = math.ceil(pool / 8)
    # 9.5 inches held the drawing's old fixed range of 11.9 units (pool at x = 5.3): keep that scale, so the
    # text keeps its size as the drawing widens, and add height for rows past three
    fig.set_size_inches(9.5 * (x0 + 6.6) / 11.9, 3.0 + 0.45 * max(0, pool_rows - 3, len(lengths) - 3))
    for s, phys in enumerate(placements):
        y = 2.2 - s * 0.75
        ax.text(-0.2, y + 0.25, f"seq {s + 1} ({lengths[s]} tok)", ha="right", va="center", fontsize=FONT)
        for b, p in enumerate(phys):
            is_shared = b < shared_blocks and lengths[s] >= shared
            fill = min(block_size, lengths[s] - b * block_size)
            _box(ax, b * 0.9, y, 0.8, 0.5, f"L{b}→P{p}" + ("" if fill == block_size else f"\n{fill}/{block_size}"),
                 SHARED if is_shared else OWNERS[s % len(OWNERS)], text_color="#111" if is_shared else "white",
                 fontsize=FONT)
    ax.text(x0, 2.95, f"physical pool ({block_size} tokens per block)", fontsize=FONT)
    for p in range(pool):
        owner = next((s for s, phys in enumerate(placements) if p in phys and p >= shared_blocks), None)
        _box(ax, x0 + (p % 8) * 0.55, 2.2 - (p // 8) * 0.65, 0.5, 0.5, f"P{p}",
             SHARED if p < shared_blocks else OWNERS[(owner or 0) % len(OWNERS)], fontsize=FONT,
             text_color="#111" if p < shared_blocks else "white")
    _note(fig, f"Green: the {shared}-token common prefix, stored once and pointed at by every sequence. Only a "
               "sequence's last block is partly empty, so the waste is under one block per sequence.")
    ax.set_xlim(-2.0, x0 + 8 * 0.55 + 0.2)
    ax.set_ylim(min(2.2 - (len(lengths) - 1) * 0.75, 2.2 - (pool_rows - 1) * 0.65) - 0.2, 3.15)
    _clean(ax)
    fig.tight_layout()
    return fig


def serving_mechanisms(block_size: int = 16):
    """Chapter 5's two pictures, stacked: the three batching policies, then the paged block table."""
    return [batching_timelines(), block_table(block_size=block_size)]


# ------------------------------------------------------------------------------------------ chapter 6

def attention_masks(specs: Sequence[str] = ("dense", "window:32", "sinks:4,28", "blocksparse:16,2,1,1"),
                    seq_len: int = 128):
    """Which keys (columns) each query (rows) sees, from each pattern's own ``mask``."""
    import torch

    from studylib.attention.patterns import Pattern

    plt = _plt()
    fig, axes = plt.subplots(1, len(specs), figsize=(2.4 * len(specs), 2.8))
    pos = torch.arange(seq_len)
    for ax, spec in zip(axes if len(specs) > 1 else [axes], specs, strict=True):
        pattern = Pattern.parse(spec)
        vis = pattern.mask(pos, pos).float().numpy()
        ax.imshow(vis, cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
        keep = vis.sum() / (seq_len * (seq_len + 1) / 2)
        ax.set_title(f"{spec}\n{keep:.0%} of causal pairs", fontsize=FONT)
        ax.set_xlabel("key", fontsize=FONT)
        ax.set_xticks([])
        ax.set_yticks([])
    (axes[0] if len(specs) > 1 else axes).set_ylabel("query", fontsize=FONT)
    fig.suptitle(f"Attention masks over {seq_len} tokens (blue: the query attends to the key)", fontsize=FONT + 1)
    fig.tight_layout(rect=(0, 0, 1, 0.88))  # the panels' two-line titles stay under the figure's own
    return fig


def _ch02(p: Mapping[str, Any]):
    gamma = int(p.get("gamma") or 4)
    tree = [int(t) for t in str(p.get("eagle_tree") or "3,2,6").split(",")]
    depth, topk, nodes = (tree + [3, 2, 6])[:3]
    return [draft_verify(gamma, min(2, gamma)), eagle_tree(min(depth, 4), min(topk, 3), min(nodes, 10))]


def _ch04(p: Mapping[str, Any]):
    return [radix_tree(int(p.get("system_tokens") or 1024))]


def _ch05(p: Mapping[str, Any]):
    return serving_mechanisms(int(p.get("block_size") or 16))


def _ch06(p: Mapping[str, Any]):
    return [attention_masks()]


# chapter -> (caption, builder of the figures from the chapter's parameters)
MECHANISMS: dict[int, tuple[str, Callable[[Mapping[str, Any]], list]]] = {
    1: ("How decoding spends its passes", lambda p: [decode_chain()]),
    2: ("One speculative step, and EAGLE's token tree", _ch02),
    3: ("One lookahead step", lambda p: [lookahead_step(int(p.get("window") or 4), int(p.get("ngram") or 3),
                                                        int(p.get("guesses") or 2))]),
    4: ("The prefix tree", _ch04),
    5: ("Three ways to batch, and where the KV lives", _ch05),
    6: ("What each attention pattern lets a query see", _ch06),
    7: ("How the techniques compose", lambda p: [stack_layers()]),
    8: ("A 4-bit block and the int8 dot product", lambda p: [q4_block_int8_dot()]),
}


def mechanism_figures(chapter: int, params: Mapping[str, Any] | None = None) -> tuple[str, list]:
    """(caption, figures) for a chapter; ("", []) for a chapter without one."""
    caption, build = MECHANISMS.get(chapter, ("", None))
    return (caption, build(params or {})) if build else ("", [])


def show_mechanism(chapter: int, **params: Any) -> None:
    """Draw the chapter's mechanism picture(s) in a notebook."""
    _, figs = mechanism_figures(chapter, params)
    if _in_kernel():
        from IPython.display import display

        for f in figs:
            display(f)
    plt = _plt()
    for f in figs:
        plt.close(f)
