"""Chapter 7, part 1: end-to-end latency of every technique alone and of the best stack, per workload.

One baseline for everything: ``studylib.decoding.ar``, one request at a time, no prefix cache, dense
attention, same model, dtype and threads. Each *arm* is the baseline with some techniques switched on
(prefix cache, a lossless decoder, sparse attention). Arms run request by request, in a rotating order,
so that machine noise falls on all of them alike; every request's latency is paired with the baseline's
on the same request (``bench.stats.ratio_estimate``).

The best stack is chosen per workload by ``plan_stack`` from the single-technique results (a technique
joins only if it helped alone, composes with the rest in this checkout, and, if lossy, kept the quality
bar), then measured in a second pass. The waterfall telescopes exactly: the ratio of median latencies
baseline -> stack is the product of the step ratios along the chain.

Quality is in ``ch07_quality``; throughput and interaction effects in ``ch07_system``; the verdicts,
anchors and figures in ``ch07_report``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from studylib.bench.stats import ratio_estimate, rotated
from studylib.decoding import decode, get_decoder
from studylib.decoding.common import Stopwatch, eos_set
from studylib.errors import StudylibError
from studylib.workloads.prefix import PrefixRequest, PrefixWorkload

CHAPTER = 7
BASELINE = "ar"
PREFIX, WINDOW = "prefix cache", "window attention"
DECODERS = ("prompt-lookup", "speculative", "lookahead")  # the lossless decoders a stack may use
WORKLOADS = ("chat", "system_prompt", "multi_turn", "xsum", "humaneval")


# ------------------------------------------------------------------------------------------ workloads


@dataclass
class NamedWorkload:
    """A workload in arrival order; ``records`` keeps the source rows (references, tests) by request id."""

    name: str
    workload: PrefixWorkload
    records: dict = field(default_factory=dict)

    @property
    def requests(self) -> list[PrefixRequest]:
        return self.workload.requests


def encode_record(tokenizer, rec) -> list[int]:
    """Chat records through the chat template (plain joined text for tokenizers without one, e.g. the
    byte tokenizer of the random test models); HumanEval as plain completion, as it is scored."""
    from studylib.prompts import encode

    if rec.messages is not None and not getattr(tokenizer, "chat_template", None):
        return [int(t) for t in tokenizer.encode("\n".join(m["content"] for m in rec.messages))]
    return encode(tokenizer, rec, chat=rec.messages is not None)


def build_workloads(tokenizer, names: Sequence[str] = WORKLOADS, *, n_requests: int = 4, max_new_tokens: int = 48,
                    system_tokens: int = 512, conversations: int = 2, turns: int = 2, max_chars: int = 1500,
                    seed: int = 0) -> dict[str, NamedWorkload]:
    """The chapter's named workloads. ``multi_turn`` has ``conversations x turns`` requests (closed loop);
    the others ``n_requests``. XSum articles and HumanEval prompts longer than ``max_chars`` characters are
    skipped before sampling (CPU prefill)."""
    from studylib.data import load_workload
    from studylib.workloads import prefix

    out: dict[str, NamedWorkload] = {}
    for name in names:
        if name == "system_prompt":
            w = prefix.system_prompt(tokenizer, n_requests=n_requests, system_tokens=system_tokens,
                                     max_new_tokens=max_new_tokens, seed=seed)
            out[name] = NamedWorkload(name, w)
        elif name == "multi_turn":
            w = prefix.multi_turn(tokenizer, n_conversations=conversations, turns=turns,
                                  max_new_tokens=max_new_tokens, seed=seed)
            out[name] = NamedWorkload(name, w)
        elif name in ("chat", "xsum", "humaneval"):
            recs = load_workload(name, n_requests, seed, max_chars=max_chars if name != "chat" else None)
            reqs = [PrefixRequest(r.id, encode_record(tokenizer, r), max_new_tokens, name) for r in recs]
            w = PrefixWorkload(name, reqs, f"{len(reqs)} {name} prompts")
            out[name] = NamedWorkload(name, w, {r.id: r for r in recs})
        else:
            raise StudylibError(f"unknown chapter-7 workload {name!r}; choose from {list(WORKLOADS)}.")
    return out


def workloads_frame(workloads: Mapping[str, NamedWorkload]) -> pd.DataFrame:
    rows = []
    for name, w in workloads.items():
        lens = [len(r.tokens) for r in w.requests]
        rows.append({"workload": name, "requests": len(lens), "description": w.workload.description,
                     "prompt tokens (first turn)": f"{min(lens)}-{max(lens)}",
                     "max new tokens": w.requests[0].max_new_tokens,
                     "closed loop": any(r.follows for r in w.requests)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ arms


@dataclass
class Arm:
    """The baseline with ``techniques`` switched on. ``method``/``options`` say how to decode."""

    name: str
    techniques: tuple[str, ...] = ()
    method: str = BASELINE
    prefix_cache: bool = False
    attention: str | None = None
    options: dict = field(default_factory=dict)

    @property
    def lossless(self) -> bool:
        return self.attention in (None, "dense")


def make_arm(techniques: Sequence[str], decoder_options: Mapping[str, dict], attention: str) -> Arm:
    """The arm for a set of techniques (prefix cache, at most one decoder, window attention)."""
    techs = tuple(techniques)
    decoders = [t for t in techs if t in DECODERS]
    if len(decoders) > 1:
        raise StudylibError(f"an arm runs one decoder, got {decoders}.")
    method = decoders[0] if decoders else BASELINE
    name = " + ".join(techs) if techs else BASELINE
    if WINDOW in techs:
        name = name.replace(WINDOW, f"{WINDOW} ({attention})")
    return Arm(name, techs, method, PREFIX in techs, attention if WINDOW in techs else None,
               dict(decoder_options.get(method, {})))


def chapter_draft(model, spec: str = "auto", fallback: str | None = None):
    """(drafter, why). ``auto``: the layers a cached ``self:auto`` search chose for this model (chapter 2
    runs that search, so a whole-study run always has it), else ``fallback`` (default an early exit at ~85%
    depth), because the search itself costs minutes on a CPU. A distilled draft left in the cache by an earlier
    ``studylib train-draft`` is not picked up by ``auto``: the chapter would then depend on what a machine
    happened to train before (chapter 2 no longer trains it); ask for it by name (``draft: distilled``)."""
    import json

    from studylib.cache import cache_dir
    from studylib.decoding.drafts import SelfDraft, format_layers, resolve_draft

    if spec != "auto":
        return resolve_draft(spec, model), f"{spec} (as asked)"
    found = []
    for f in cache_dir("self_spec").glob("*.json"):
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if info.get("model") == model.config.name and info.get("layers"):
            found.append((f.stat().st_mtime, info))
    if found:
        info = max(found, key=lambda x: x[0])[1]
        label = f"self:{format_layers(info['layers'])}"
        return SelfDraft(tuple(info["layers"]), label=label, calibration=info), \
            f"{label}: layers chosen by a cached self:auto search"
    n = model.config.num_layers
    fb = fallback or f"self:exit:{max(1, min(n - 1, round(0.85 * n)))}"
    return resolve_draft(fb, model), f"{fb}: no cached self:auto search for {model.config.name}"


def decoder_options(model, draft: str = "auto", draft_fallback: str | None = None, gamma: int = 4,
                    lookup_gamma: int = 8, lookup_ngram: int = 3, lookahead: str = "lookahead:5,4,5"
                    ) -> tuple[dict, str]:
    """Options per decoder, and a line saying which draft speculative decoding uses. ``lookahead`` is
    chapter 3's spec string (``lookahead:W,N,G`` or ``lookahead:W,N,G+prompt``)."""
    from studylib.experiments.ch03_jacobi_lookahead import parse_config

    drafter, why = chapter_draft(model, draft, draft_fallback)
    try:
        method, la = parse_config(lookahead)
    except ValueError as exc:
        raise StudylibError(f"lookahead: {exc}") from None
    if method != "lookahead":
        raise StudylibError(f"lookahead takes 'lookahead:W,N,G[+prompt]', got {lookahead!r}.")
    return {"speculative": {"draft": drafter, "gamma": int(gamma)},
            "prompt-lookup": {"gamma": int(lookup_gamma), "ngram": int(lookup_ngram)},
            "lookahead": la}, why


def single_arms(decoder_options: Mapping[str, dict], attention: str, decoders: Sequence[str] = DECODERS,
                prefix_cache: bool = True, window: bool = True) -> list[Arm]:
    """The baseline and every technique alone."""
    techs = ([PREFIX] if prefix_cache else []) + list(decoders) + ([WINDOW] if window else [])
    return [make_arm((), decoder_options, attention), *(make_arm((t,), decoder_options, attention) for t in techs)]


def missing_options(method: str, arm: Arm) -> list[str]:
    """Keywords this arm needs that ``method``'s generate() does not accept in this checkout."""
    params = inspect.signature(get_decoder(method)).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    need = (["prefix_store"] if arm.prefix_cache else []) + (["attention"] if not arm.lossless else [])
    return [k for k in need if k not in params]


def make_store(model, block_size: int, capacity_tokens: int):
    from studylib.kvcache.dense_bridge import PrefixStore

    return PrefixStore(model, block_size=block_size, capacity_tokens=capacity_tokens)


def decode_arm(model, tokenizer, arm: Arm, prompt: Sequence[int], max_new_tokens: int, store=None):
    """One request through ``arm`` (greedy). Raises StudylibError if the arm cannot be built here."""
    missing = missing_options(arm.method, arm)
    if missing:
        raise StudylibError(
            f"{arm.name}: the {arm.method} decoder takes no {', '.join(m + '=' for m in missing)} keyword in "
            "this checkout, so it cannot be stacked that way.")
    kw = dict(arm.options)
    if arm.prefix_cache:
        kw["prefix_store"] = store
    if not arm.lossless:
        kw["attention"] = arm.attention
    return decode(arm.method, model, list(prompt), max_new_tokens, tokenizer=tokenizer, **kw)


def probe(model, tokenizer, arm: Arm, block_size: int = 16) -> str | None:
    """Why ``arm`` cannot run in this checkout (None if it can): a tiny request twice (the second one
    hits the prefix cache, if the arm has one), errors caught."""
    store = make_store(model, block_size, 4 * block_size) if arm.prefix_cache else None
    try:
        for _ in range(2):
            decode_arm(model, tokenizer, arm, list(range(3, 3 + block_size + 2)), 2, store)
    except (StudylibError, TypeError) as exc:
        return str(exc)
    return None


# ----------------------------------------------------------------------------------------------- runs


def run_arms(model, tokenizer, workloads: Mapping[str, NamedWorkload],
             arms: Sequence[Arm] | Mapping[str, Sequence[Arm]], *,
             block_size: int = 16, capacity_tokens: int = 8192, warmup: bool = True,
             progress: bool | None = None) -> pd.DataFrame:
    """One row per (workload, request, arm). A prefix-cache arm keeps one store across a workload's
    requests (that is the point) and a fresh one per workload; closed-loop turns are built from each
    arm's own earlier outputs. e2e_s is the caller-visible time of the whole call. ``arms`` may map a
    workload name to the arms to run on it (workloads it does not name are skipped)."""
    from studylib.progress import progress_bar

    per = dict(arms) if isinstance(arms, Mapping) else {name: list(arms) for name in workloads}
    per = {name: list(a) for name, a in per.items() if name in workloads and a}
    eos = eos_set(model, tokenizer)
    if warmup:
        first = next(iter(workloads.values())).requests[0].tokens[:32]
        unique = {a.name: a for lst in per.values() for a in lst}
        for arm in unique.values():  # lazy initialisation (draft loading, kernels) out of the timed runs
            decode_arm(model, tokenizer, arm, first, 2, make_store(model, block_size, 512))
    rows = []
    total = sum(len(workloads[n].requests) * len(a) for n, a in per.items())
    with progress_bar(total=total, desc="ch07 latency", leave=False, progress=progress) as bar:
        for name, todo in per.items():
            wl = workloads[name]
            stores = {a.name: make_store(model, block_size, capacity_tokens) for a in todo if a.prefix_cache}
            done: dict[str, dict] = {a.name: {} for a in todo}
            for i, req in enumerate(wl.requests):
                for arm in rotated(todo, i):  # no arm always runs first
                    prompt = wl.workload.prompt(req, done[arm.name], eos)
                    clock = Stopwatch(model.device)
                    res = decode_arm(model, tokenizer, arm, prompt, req.max_new_tokens, stores.get(arm.name))
                    e2e = clock.elapsed()
                    done[arm.name][req.id] = (prompt, res.token_ids)
                    rows.append(_row(wl.name, i, req, arm, prompt, res, e2e))
                    bar.update()
    return pd.DataFrame(rows)


def _row(workload: str, order: int, req: PrefixRequest, arm: Arm, prompt, res, e2e: float) -> dict:
    n = res.new_tokens
    return {
        "workload": workload, "request": req.id, "order": order, "arm": arm.name, "method": arm.method,
        "techniques": arm.techniques, "lossless": arm.lossless, "attention": arm.attention or "dense",
        "prompt_tokens": len(prompt),
        "new_tokens": n, "hit_tokens": res.extra.get("prefix_hit_tokens", 0), "ttft_s": res.ttft_s,
        "e2e_s": e2e, "tpot_s": (res.wall_s - res.ttft_s) / max(n - 1, 1),
        "target_forwards": res.target_forwards, "tokens_per_forward": res.compression,
        "alpha": res.extra.get("alpha"), "cost_ratio": res.extra.get("measured_cost_ratio"),
        "tokens": list(res.token_ids), "text": res.text,
    }


# -------------------------------------------------------------------------------------------- summary


def agreement(a: Sequence[int], b: Sequence[int]) -> float:
    """Token-level agreement of two greedy outputs: positions that match over the longer length."""
    n = max(len(a), len(b))
    if n == 0:
        return 1.0
    return sum(x == y for x, y in zip(a, b, strict=False)) / n


def paired(runs: pd.DataFrame, workload: str, arm: str, baseline: str = BASELINE) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Baseline and arm rows of one workload, aligned request by request."""
    w = runs[runs.workload == workload]
    b = w[w.arm == baseline].set_index("request")
    t = w[w.arm == arm].set_index("request")
    common = [r for r in b.index if r in t.index]
    return b.loc[common], t.loc[common]


def latency_summary(runs: pd.DataFrame, baseline: str = BASELINE, confidence: float = 0.95) -> pd.DataFrame:
    """Per (workload, arm): paired speedups of e2e latency, TTFT and TPOT with CIs at ``confidence`` (95%,
    or corrected where a decision compares several), and agreement."""
    rows = []
    for (wl, arm), _ in runs.groupby(["workload", "arm"], sort=False):
        b, t = paired(runs, wl, arm, baseline)
        e2e, ttft, tpot = (ratio_estimate(b[c].to_numpy(), t[c].to_numpy(), confidence=confidence)
                           for c in ("e2e_s", "ttft_s", "tpot_s"))
        same = [x == y for x, y in zip(t.tokens, b.tokens, strict=True)]
        rows.append({
            "workload": wl, "arm": arm, "techniques": t.techniques.iloc[0], "lossless": bool(t.lossless.iloc[0]),
            "requests": len(t), "speedup": e2e.value, "speedup_low": e2e.ci_low, "speedup_high": e2e.ci_high,
            "ttft_speedup": ttft.value, "ttft_low": ttft.ci_low, "ttft_high": ttft.ci_high,
            "tpot_speedup": tpot.value, "tpot_low": tpot.ci_low, "tpot_high": tpot.ci_high,
            "e2e_p50_s": float(np.median(t.e2e_s)), "tokens_per_forward": float(t.tokens_per_forward.mean()),
            "hit_rate": float(t.hit_tokens.sum() / max(t.prompt_tokens.sum(), 1)),
            "exact_match": float(np.mean(same)),
            "agreement": float(np.mean([agreement(x, y) for x, y in zip(t.tokens, b.tokens, strict=True)])),
        })
    return pd.DataFrame(rows)


def speedup_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Workload x arm grid of 'speedup [low, high]' strings, for reading."""
    s = summary.assign(cell=[f"{v:.2f} [{lo:.2f}, {hi:.2f}]" for v, lo, hi in
                             zip(summary.speedup, summary.speedup_low, summary.speedup_high, strict=True)])
    return s.pivot(index="workload", columns="arm", values="cell").reindex(summary.workload.unique())
