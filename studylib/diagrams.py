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
  computed by ``studylib.attention.patterns`` itself (chapter 6).

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


def _note(fig, text: str, width: int = 120) -> None:
    """A caption along the figure's top, wrapped so it never runs off the picture."""
    fig.suptitle(textwrap.fill(text, width), fontsize=8.5, x=0.02, ha="left")


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


def _box(ax, x, y, w, h, text="", color="#ddd", edge="#555", fontsize=8, hatch=None, text_color="#111"):
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
    ax.text(-0.15, 2.27, "draft model\n(small, γ passes)", ha="right", va="center", fontsize=8)
    _box(ax, 0, 1.1, gamma * 1.0 + 0.9, 0.55, f"target: ONE forward pass over all {gamma} proposals (+1)", TARGET,
         text_color="white")
    ax.text(-0.15, 1.37, "target model", ha="right", va="center", fontsize=8)
    for i in range(gamma + 1):
        if i < accepted:
            color, label = ACCEPT, f"d{i + 1} ✓"
        elif i == accepted:
            color, label = (REJECT if i < gamma else BONUS), ("target's\ntoken" if i < gamma else "bonus")
        else:
            color, label = "#f3f3f3", "discarded"
        _box(ax, i * 1.0, 0.2, 0.9, 0.55, label, color, text_color="white" if color != "#f3f3f3" else "#777")
    ax.text(-0.15, 0.47, "committed", ha="right", va="center", fontsize=8)
    _note(fig, f"{accepted + 1} tokens for one target pass: the agreeing prefix, then the target's own next token "
               "(red: the first disagreement, replaced). The output is exactly what the target alone would produce.")
    ax.set_xlim(-1.6, gamma + 1.1)
    ax.set_ylim(0, 2.75)
    _clean(ax)
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
    axes[0].set_yticks(range(len(requests)), [f"request {i + 1}" for i in range(len(requests))], fontsize=8)
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
    for s, phys in enumerate(placements):
        y = 2.2 - s * 0.75
        ax.text(-0.2, y + 0.25, f"seq {s + 1} ({lengths[s]} tok)", ha="right", va="center", fontsize=8)
        for b, p in enumerate(phys):
            is_shared = b < shared_blocks and lengths[s] >= shared
            fill = min(block_size, lengths[s] - b * block_size)
            _box(ax, b * 0.9, y, 0.8, 0.5, f"L{b}→P{p}" + ("" if fill == block_size else f"\n{fill}/{block_size}"),
                 SHARED if is_shared else OWNERS[s % len(OWNERS)], text_color="#111" if is_shared else "white",
                 fontsize=7)
    x0 = 5.3
    ax.text(x0, 2.95, f"physical pool ({block_size} tokens per block)", fontsize=8)
    for p in range(pool):
        owner = next((s for s, phys in enumerate(placements) if p in phys and p >= shared_blocks), None)
        _box(ax, x0 + (p % 8) * 0.55, 2.2 - (p // 8) * 0.65, 0.5, 0.5, f"P{p}",
             SHARED if p < shared_blocks else OWNERS[(owner or 0) % len(OWNERS)], fontsize=7,
             text_color="#111" if p < shared_blocks else "white")
    _note(fig, f"Green: the {shared}-token common prefix, stored once and pointed at by every sequence. Only a "
               "sequence's last block is partly empty, so the waste is under one block per sequence.")
    ax.set_xlim(-2.0, x0 + 8 * 0.55 + 0.2)
    ax.set_ylim(0.5, 3.15)
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
        ax.set_title(f"{spec}\n{keep:.0%} of causal pairs", fontsize=8)
        ax.set_xlabel("key", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    (axes[0] if len(specs) > 1 else axes).set_ylabel("query", fontsize=8)
    fig.suptitle(f"Attention masks over {seq_len} tokens (blue: the query attends to the key)", fontsize=9)
    fig.tight_layout()
    return fig


def _ch02(p: Mapping[str, Any]):
    gamma = int(p.get("gamma") or 4)
    return [draft_verify(gamma, min(2, gamma))]


def _ch04(p: Mapping[str, Any]):
    return [radix_tree(int(p.get("system_tokens") or 1024))]


def _ch05(p: Mapping[str, Any]):
    return serving_mechanisms(int(p.get("block_size") or 16))


def _ch06(p: Mapping[str, Any]):
    return [attention_masks()]


# chapter -> (caption, builder of the figures from the chapter's parameters)
MECHANISMS: dict[int, tuple[str, Callable[[Mapping[str, Any]], list]]] = {
    1: ("How decoding spends its passes", lambda p: [decode_chain()]),
    2: ("One speculative step", _ch02),
    4: ("The prefix tree", _ch04),
    5: ("Three ways to batch, and where the KV lives", _ch05),
    6: ("What each attention pattern lets a query see", _ch06),
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
