"""``studylib train-draft --kind eagle``: train the EAGLE head (``eagle``) for a target on this machine.

Recipe, sized for a 2-core CPU and at most ``--max-minutes`` (20 by default):
- Text: (1) the target's own answers to the training chat prompts and to user turns it writes itself
  (``draft_data``; the same generator and settings as the distilled draft, so a run after
  ``train-draft`` reuses that draft's answers instead of writing them again); (2) real prose: story
  summaries from NarrativeQA (``data``), cut into ``--chunk``-token pieces, up to ``--text-tokens``.
  Chapter 2's evaluation sets (held-out chat prompts, XSum articles, HumanEval) are never trained on.
- Features: one prefill of the target per sequence gives its final-norm hidden states f (fast: a
  prefill is a few large matmuls). They are stored in float16 in the work directory.
- Loss per position j (teacher forcing: pair (f_j, x_(j+1)) predicts f_(j+1)): smooth-L1 between
  predicted and true feature, plus ``--cls-weight`` x the cross-entropy of the head's token
  distribution against the target's (both over the head's vocabulary), as in EAGLE. Input features get
  uniform noise (+-``--noise``), which EAGLE uses so the head tolerates its own errors when it drafts
  several tokens on its own predictions. ``--unroll 2`` adds a second pass fed with the first pass's
  predicted features (a cheap form of EAGLE-3's training-time test).
- Head vocabulary (FR-Spec): the ``--head-vocab`` tokens the target ranks first most often in the
  training text; 0 keeps the whole LM head.
- Engineering: seeded (a batch is a function of seed and step, so a resumed run trains the same
  batches), a tqdm bar, a checkpoint in ``cache_dir("drafts", "<target>-eagle-work")``, a hard time
  cap after which the current head is exported and a rerun resumes; the export goes to
  ``cache_dir("drafts", "<target>-eagle")``, which ``--draft eagle`` reads.
- Validation, split by prompt (answers) and by story (prose): top-1 agreement of the head's first
  token with the target's argmax, and the same for the second drafted token (fed its own predicted
  feature), on sequences the head never trained on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from studylib.cache import cache_dir
from studylib.drafting.precision import autocast, train_precision
from studylib.errors import StudylibError


@dataclass
class EagleTrainConfig:
    model: str = "smollm2-135m"
    max_minutes: float = 20.0
    steps: int = 3000
    batch_tokens: int = 2048  # rows per optimizer step (sequences are right-padded to the longest)
    lr: float = 1e-3
    warmup: int = 30
    cls_weight: float = 0.5
    answer_share: float | None = None  # share of every batch drawn from the target's answers (None: as in the data)
    noise: float = 0.1
    unroll: int = 1
    head_vocab: int = 8192
    chunk: int = 384
    text_tokens: int = 120_000
    text_sources: tuple[str, ...] = ("narrativeqa", "xsum")
    # Answers: passed to the distilled draft's generator (``draft_train.DraftTrainConfig`` fields).
    sources: tuple[str, ...] = ("chat", "self")
    self_prompts: int = 16
    samples: int = 1
    gen_tokens: int = 96
    data_share: float = 0.4  # at most this share of max_minutes writes answers and extracts features
    seed: int = 0
    precision: str = "auto"  # auto: bf16 autocast where the CPU multiplies bf16 natively (AMX/AVX512_BF16), else fp32
    save_every: int = 100
    device: str = "cpu"
    fresh: bool = False
    out: str | None = None
    tree: tuple[int, int, int] = (5, 4, 16)  # default tree stored with the head

    def __post_init__(self) -> None:
        self.sources, self.tree = tuple(self.sources), tuple(int(t) for t in self.tree)
        self.text_sources = tuple(self.text_sources)
        checks = {"max_minutes > 0": self.max_minutes > 0, "steps >= 1": self.steps >= 1,
                  "batch_tokens >= 16": self.batch_tokens >= 16, "lr > 0": self.lr > 0,
                  "cls_weight >= 0": self.cls_weight >= 0, "noise >= 0": self.noise >= 0,
                  "unroll in 1..2": self.unroll in (1, 2), "head_vocab >= 0": self.head_vocab >= 0,
                  "chunk >= 16": self.chunk >= 16, "text_tokens >= 0": self.text_tokens >= 0,
                  "0 < data_share < 1": 0 < self.data_share < 1, "gen_tokens >= 1": self.gen_tokens >= 1,
                  "text_sources within narrativeqa,xsum": set(self.text_sources) <= {"narrativeqa", "xsum"}}
        checks["precision in auto|fp32|bf16"] = self.precision in ("auto", "fp32", "bf16")
        checks["0 < answer_share < 1"] = self.answer_share is None or 0 < self.answer_share < 1
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise StudylibError(f"train-draft --kind eagle needs {', '.join(bad)}; fix the option "
                                "(see `studylib train-draft --help`).")

    def key(self, *fields: str) -> str:
        d = asdict(self)
        return hashlib.sha256(json.dumps({f: d[f] for f in fields}, default=str).encode()).hexdigest()[:12]


ANSWER_FIELDS = ("model", "sources", "self_prompts", "samples", "gen_tokens", "seed")
FEATURE_FIELDS = (*ANSWER_FIELDS, "chunk", "text_tokens", "text_sources")
TRAIN_FIELDS = (*FEATURE_FIELDS, "steps", "batch_tokens", "lr", "warmup", "cls_weight", "noise", "unroll",
                "head_vocab", "precision", "answer_share")


def reuse_key(cfg: EagleTrainConfig) -> str:
    """What a cached head must have been trained with to be reused (every training field but the step
    count: a head trained for more steps serves a request for fewer)."""
    return cfg.key(*(f for f in TRAIN_FIELDS if f != "steps"))


def _work(cfg: EagleTrainConfig, target_name: str) -> Path:
    from studylib.decoding.draft_files import slug as _slug

    p = Path(cfg.out).with_name(Path(cfg.out).name + "-work") if cfg.out else \
        cache_dir("drafts", f"{_slug(target_name)}-eagle-work")
    p.mkdir(parents=True, exist_ok=True)
    return p


def _answers(cfg: EagleTrainConfig, target, tok, work: Path, minutes: float) -> tuple[list, bool]:
    """The target's answers, through the distilled draft's generator (and its cached file when the
    settings match)."""
    from studylib.drafting import train as dt

    dcfg = dt.DraftTrainConfig(model=cfg.model, sources=cfg.sources, self_prompts=cfg.self_prompts,
                               samples=cfg.samples, gen_tokens=cfg.gen_tokens, seed=cfg.seed, device=cfg.device,
                               fresh=cfg.fresh)
    shared = dt.work_dir(target.config.name) / "data.pt"
    mine = work / "data.pt"
    if not mine.exists() and shared.exists() and not cfg.fresh:
        state = dt._load_work(shared)
        if state is not None and state.get("key") == dcfg.key(*dt.DATA_FIELDS):
            shutil.copy2(shared, mine)
    return dt._make_data(dcfg, target, tok, work, dt._Deadline(minutes))


def _prose(cfg: EagleTrainConfig, tok) -> list[tuple[str, list[int]]]:
    """(document id, chunk ids) pieces of real text, up to ``text_tokens`` tokens, the sources taken in
    turn: NarrativeQA story summaries (plain text) and XSum articles in their chat prompt, from the draft
    pool only (``data.in_draft_pool``: documents no chapter evaluates)."""
    import random

    from studylib.data import _rows, load_dataset
    from studylib.prompts import encode

    if cfg.text_tokens == 0:
        return []
    rng = random.Random(cfg.seed)
    streams = []
    if "narrativeqa" in cfg.text_sources:
        docs = sorted({row["passage"].strip() for row in _rows("narrativeqa", "draft")} - {""})
        rng.shuffle(docs)
        streams.append((hashlib.sha256(d.encode()).hexdigest()[:12], lambda d=d: [int(t) for t in tok(d)["input_ids"]])
                        for d in docs)
    if "xsum" in cfg.text_sources:
        recs = load_dataset("xsum", split="draft")
        rng.shuffle(recs)
        streams.append((r.id, lambda r=r: [int(t) for t in encode(tok, r)]) for r in recs)
    out, total = [], 0
    while streams and total < cfg.text_tokens:
        for stream in list(streams):
            item = next(stream, None)
            if item is None:
                streams.remove(stream)
                continue
            sid, make = item
            ids = make()
            for s in range(0, max(len(ids) - 16, 1), cfg.chunk):
                piece = ids[s : s + cfg.chunk]
                if len(piece) >= 16:
                    out.append((sid, piece))
                    total += len(piece)
            if total >= cfg.text_tokens:
                break
    return out


@torch.inference_mode()
def extract(target, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One prefill: the target's final-norm features (T, H) in float16 and its argmax token (T,)."""
    from studylib.models import DenseKVCache

    cache = DenseKVCache(target.config, 1, len(ids), target.device, target.dtype)
    out = target(torch.tensor([ids], device=target.device), cache.begin(len(ids)), hidden_layers=(-1,))
    return out.hidden[-1][0].to(torch.float16).cpu(), out.logits[0].argmax(-1).to(torch.int32).cpu()


def synthetic_state(target, n_seqs: int, length: int, seed: int = 0) -> dict:
    """Features of random token sequences (tests: a tiny random target trains in seconds)."""
    g = torch.Generator().manual_seed(seed)
    state = {"ids": [], "feats": [], "argmax": [], "held": [], "kind": []}
    for i in range(n_seqs):
        ids = torch.randint(3, target.config.vocab_size, (length,), generator=g).tolist()
        f, top = extract(target, ids)
        state["ids"].append(ids), state["feats"].append(f), state["argmax"].append(top)
        state["held"].append(i % 5 == 0), state["kind"].append("synthetic")
    return state


@torch.inference_mode()
def _features(cfg: EagleTrainConfig, target, tok, work: Path, deadline: float) -> tuple[dict, bool]:
    """Prefill every sequence once and keep (ids, features, held-out flag); resumable."""
    from studylib.progress import progress_bar

    path, key = work / "features.pt", cfg.key(*FEATURE_FIELDS)
    state = torch.load(path, weights_only=True) if path.exists() and not cfg.fresh else None
    if state is None or state.get("key") != key:
        state = {"key": key, "ids": [], "feats": [], "argmax": [], "held": [], "kind": [], "answers_done": False}
    answers_complete = state["answers_done"]
    if not answers_complete:
        seqs, answers_complete = _answers(cfg, target, tok, work,
                                          max((deadline - time.monotonic()) / 60 * 0.5, 0.01))
        # Held out by prompt: sampled answers to one prompt share most of their text.
        jobs = [(s.ids.tolist(), zlib.crc32(s.ids[: s.prompt_len].numpy().tobytes()) % 10 == 0, "answer")
                for s in seqs]
    else:
        jobs = []
    n_answer_jobs = len(jobs)
    jobs += [(ids, zlib.crc32(sid.encode()) % 10 == 0, "prose") for sid, ids in _prose(cfg, tok)]
    cap = target.config.max_position_embeddings
    have = {tuple(i) for i in state["ids"]}
    todo = [j for j in jobs if tuple(j[0][:cap]) not in have]
    stopped = False
    with progress_bar(todo, desc="eagle features (target prefill)", leave=False) as bar:
        for ids, held, kind in bar:
            if time.monotonic() >= deadline:
                stopped = True
                break
            ids = ids[:cap]
            feats, top = extract(target, ids)
            state["ids"].append(ids)
            state["feats"].append(feats)
            state["argmax"].append(top)
            state["held"].append(bool(held))
            state["kind"].append(kind)
    have = {tuple(i) for i in state["ids"]}
    # Answers count as done only when every one of them has its features (a stop mid-way resumes them).
    state["answers_done"] = bool(answers_complete and all(tuple(j[0][:cap]) in have for j in jobs[:n_answer_jobs]))
    torch.save(state, path)
    return state, bool(state["answers_done"] and not stopped)


def head_vocabulary(target, state: dict, size: int) -> list[int]:
    """The ``size`` tokens the target ranks first most often on the training sequences (EOS kept)."""
    from collections import Counter

    if size == 0 or size >= target.config.vocab_size:
        return []
    counts: Counter = Counter()
    for top, held in zip(state["argmax"], state["held"], strict=True):
        if not held:
            counts.update(top.tolist())
    ranked = [t for t, _ in counts.most_common()]
    rest = [t for t in range(target.config.vocab_size) if t not in counts]
    keep = list(dict.fromkeys([*target.config.eos_token_ids, *ranked, *rest]))[:size]
    return sorted(keep)


def _batch(state: dict, rows: list[int], device) -> tuple[torch.Tensor, ...]:
    """Right-padded (ids (B, T), feats (B, T, H), target argmax (B, T), valid (B, T))."""
    longest = max(len(state["ids"][i]) for i in rows)
    h = state["feats"][rows[0]].shape[1]
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    feats = torch.zeros(len(rows), longest, h)
    top = torch.zeros(len(rows), longest, dtype=torch.long)
    valid = torch.zeros(len(rows), longest, dtype=torch.bool)
    for b, i in enumerate(rows):
        n = len(state["ids"][i])
        ids[b, :n] = torch.tensor(state["ids"][i])
        feats[b, :n] = state["feats"][i].float()
        top[b, :n] = state["argmax"][i].long()
        valid[b, :n] = True
    return ids.to(device), feats.to(device), top.to(device), valid.to(device)


def losses(head, embed: torch.Tensor, w_head: torch.Tensor, head_ids: torch.Tensor | None,
           ids, feats, top, valid, cls_weight: float, noise: float, unroll: int, gen: torch.Generator | None
           ) -> tuple[torch.Tensor, dict]:
    """EAGLE's loss on one batch (module docstring); returns (loss, {top1, top1_2, reg, cls})."""
    from studylib.decoding.eagle import CausalKV

    x_in, f_in, f_out = ids[:, 1:], feats[:, :-1], feats[:, 1:]  # pair (f_j, x_(j+1)) -> f_(j+1)
    m = (valid[:, 1:] & valid[:, :-1]).float()  # (B, T-1)
    denom = m.sum().clamp_min(1.0)
    emb = F.embedding(x_in, embed)
    if noise > 0:
        f_in = f_in + (torch.rand(f_in.shape, generator=gen, device=f_in.device) * 2 - 1) * noise
    kv = CausalKV(ids.shape[0], ids.shape[1] - 1, ids.device)
    with torch.no_grad():
        p_t = torch.softmax(f_out @ w_head.T, -1)  # (B, T-1, N) target's distribution on the head's rows
    want = top[:, 1:]  # (B, T-1): the target's own token after x_(j+1), over the full vocabulary
    stats, total = {}, 0.0
    pred = None
    for step in range(unroll):
        if step == 1:  # fed the first pass's predictions, shifted: row j gets f^_j instead of f_j
            f_in = torch.cat([feats[:, :1], pred[:, :-1]], dim=1)
        pred = head(emb, f_in, kv)  # (B, T-1, H)
        reg = (F.smooth_l1_loss(pred, f_out, reduction="none").mean(-1) * m).sum() / denom
        logq = torch.log_softmax(pred @ w_head.T, -1)
        cls = (-(p_t * logq).sum(-1) * m).sum() / denom
        total = total + reg + cls_weight * cls
        with torch.no_grad():
            got = logq.argmax(-1) if head_ids is None else head_ids.to(logq.device)[logq.argmax(-1)]
            top1 = ((got == want).float() * m).sum() / denom
        sfx = "" if step == 0 else "_2"
        stats.update({f"reg{sfx}": float(reg.detach()), f"cls{sfx}": float(cls.detach()), f"top1{sfx}": float(top1)})
    return total, stats


def _lr(cfg: EagleTrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def _pick(state: dict, train: list[int], cfg: EagleTrainConfig, step: int) -> list[int]:
    """Sequences for one step: a seeded draw until ``batch_tokens`` rows (function of seed and step).

    ``answer_share``: the target's own answers are few beside the prose but are what the head drafts at
    run time (the assistant's turn); a share makes them fill that part of every batch whatever their
    share of the data (None: batches are drawn in proportion to the data)."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    answers = [i for i in train if state["kind"][i] == "answer"]
    others = [i for i in train if state["kind"][i] != "answer"]
    share = cfg.answer_share
    pools = [(answers, share), (others, 1.0 - share)] if share is not None and answers and others else [(train, 1.0)]
    rows = []
    for pool, share in pools:
        order = torch.randperm(len(pool), generator=g).tolist()
        tokens, budget = 0, cfg.batch_tokens * share
        for i in order:
            if tokens >= budget:
                break
            rows.append(pool[i])
            tokens += len(state["ids"][pool[i]])
    return rows


def train_loop(head, opt, state: dict, train: list[int], embed, w_head, ids_t, cfg: EagleTrainConfig, precision: str,
               step: int, history: list, end: float, save=None) -> int:
    """Optimizer steps until ``cfg.steps`` or the monotonic deadline ``end``; returns the step reached."""
    from studylib.progress import progress_bar

    device = embed.device
    head.train()
    with progress_bar(total=cfg.steps, initial=step, desc="eagle head", leave=False) as bar:
        while step < cfg.steps and time.monotonic() < end:
            ids, feats, top, valid = _batch(state, _pick(state, train, cfg, step), device)
            for group in opt.param_groups:
                group["lr"] = _lr(cfg, step)
            g = torch.Generator(device=device).manual_seed(cfg.seed + 7919 * step)
            with autocast(precision, device):
                loss, st = losses(head, embed, w_head, ids_t, ids, feats, top, valid, cfg.cls_weight, cfg.noise,
                                  cfg.unroll, g)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            history.append({"step": step, "loss": float(loss.detach()), **st})
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1=f"{st['top1']:.2f}")
            bar.update()
            if save is not None and step % cfg.save_every == 0:
                save(step)
    head.eval()
    return step


def train_on_state(target, state: dict, steps: int, seed: int = 0, batch_tokens: int = 256, lr: float = 1e-3,
                   precision: str = "fp32") -> dict:
    """Train a fresh head on ready features (tests, and anyone with their own features)."""
    from studylib.decoding.eagle import EagleHead

    torch.manual_seed(seed)
    cfg = EagleTrainConfig(steps=steps, seed=seed, batch_tokens=batch_tokens, lr=lr, warmup=min(5, steps),
                           head_vocab=0, precision=precision)
    train = [i for i, h in enumerate(state["held"]) if not h]
    head = EagleHead(target.config).to(target.device)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    embed, w = target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    history: list = []
    train_loop(head, opt, state, train, embed, w, None, cfg, precision, 0, history, math.inf)
    return {"head": head, "history": history}


def train_eagle(cfg: EagleTrainConfig, loaded: tuple | None = None) -> dict:
    """Build the data, train (resuming a matching checkpoint) and export; returns the head's metadata."""
    from studylib.decoding.eagle import EagleHead, eagle_dir, save_head
    from studylib.models import load_model

    t_start = time.monotonic()
    end = t_start + cfg.max_minutes * 60
    torch.manual_seed(cfg.seed)
    target, tok = loaded if loaded is not None else load_model(cfg.model, cfg.device, "float32")
    if target.dtype != torch.float32 or target.weights_format != "dense":
        raise StudylibError("train-draft --kind eagle trains on the float32 dense target; load it without --weights.")
    work = _work(cfg, target.config.name)
    state, data_complete = _features(cfg, target, tok, work, t_start + cfg.max_minutes * 60 * cfg.data_share)
    if not state["ids"]:
        raise StudylibError("train-draft --kind eagle: the time cap passed before any feature was extracted; "
                            "raise --max-minutes (a rerun resumes).")
    held = state["held"]
    train = [i for i, h in enumerate(held) if not h] or list(range(len(held)))
    val = [i for i, h in enumerate(held) if h] or train[::10]
    vocab = head_vocabulary(target, state, cfg.head_vocab)
    embed = target.model.embed_tokens.weight.detach()
    w_full = target.lm_head.weight.detach()
    ids_t = torch.tensor(vocab, dtype=torch.long) if vocab else None
    w_head = w_full[ids_t].contiguous() if ids_t is not None else w_full
    torch.manual_seed(cfg.seed)  # the head's initial weights depend on the seed only, not on what ran before
    head = EagleHead(target.config).to(target.device)
    precision = train_precision(cfg.precision, target.device)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    # The checkpoint belongs to this config AND this training set (features may have grown since).
    ckpt_path = work / "ckpt.pt"
    key = cfg.key(*TRAIN_FIELDS) + hashlib.sha256(json.dumps([len(state["ids"][i]) for i in train]).encode()
                                                  ).hexdigest()[:8]
    ckpt = torch.load(ckpt_path, weights_only=True) if ckpt_path.exists() and not cfg.fresh else None
    step, history = 0, []
    if ckpt is not None and ckpt.get("key") == key and ckpt.get("vocab") == vocab:
        head.load_state_dict(ckpt["head"])
        opt.load_state_dict(ckpt["optim"])
        step, history = ckpt["step"], ckpt["history"]

    def save(at: int) -> None:
        torch.save({"key": key, "vocab": vocab, "head": head.state_dict(), "optim": opt.state_dict(),
                    "step": at, "history": history}, ckpt_path)

    step = train_loop(head, opt, state, train, embed, w_head, ids_t, cfg, precision, step, history, end, save)
    save(step)
    if step == 0:
        raise StudylibError(f"train-draft --kind eagle: the {cfg.max_minutes:g}-minute cap passed before any "
                            "training step; raise --max-minutes (a rerun resumes from the cached features).")
    val_stats = []
    with torch.no_grad():
        for i in range(0, len(val), 4):
            ids, feats, top, valid = _batch(state, val[i : i + 4], target.device)
            _, st = losses(head, embed, w_head, ids_t, ids, feats, top, valid, cfg.cls_weight, 0.0, 2, None)
            val_stats.append((st, int(valid[:, 1:].sum())))
    weight = sum(n for _, n in val_stats) or 1

    def vmean(k: str) -> float:
        return sum(s[k] * n for s, n in val_stats) / weight

    c = target.config
    meta = {
        "kind": "eagle", "target": c.name, "reuse_key": reuse_key(cfg), "params": head.params, "target_params": c.num_params,
        "steps_done": step, "steps_total": cfg.steps, "complete": step >= cfg.steps and data_complete,
        "data_complete": data_complete, "sequences": len(state["ids"]),
        "answer_sequences": sum(k == "answer" for k in state["kind"]),
        "train_tokens": int(sum(len(state["ids"][i]) for i in train)),
        "val_tokens": int(sum(len(state["ids"][i]) for i in val)),
        "val_top1": vmean("top1"), "val_top1_second": vmean("top1_2"), "val_reg": vmean("reg"),
        "precision": precision, "head_vocab": len(vocab), "tree": list(cfg.tree), "history": history[-300:],
        "minutes_this_run": (time.monotonic() - t_start) / 60,
        "heldout_rule": "answers to training prompts whose crc32 % 10 == 0 and NarrativeQA stories whose id "
                        "crc32 % 10 == 0 are never trained on; chapter 2's held-out chat prompts, XSum and "
                        "HumanEval are not in the data at all",
        "config": asdict(cfg),
    }
    dest = Path(cfg.out) if cfg.out else eagle_dir(c.name)
    tmp = dest.parent / (dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    meta["path"] = str(dest)
    save_head(head, tmp, vocab, meta)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    from studylib.decoding import eagle

    eagle._LOADED.clear()
    return meta


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``--kind eagle`` (prefixed where they would clash with the distilled draft's)."""
    d = EagleTrainConfig()
    p.add_argument("--eagle-steps", type=int, default=d.steps, help="EAGLE: optimizer steps (default 3000)")
    p.add_argument("--batch-tokens", type=int, default=d.batch_tokens, help="EAGLE: rows per step")
    p.add_argument("--eagle-lr", type=float, default=d.lr)
    p.add_argument("--cls-weight", type=float, default=d.cls_weight, help="EAGLE: weight of the token loss")
    p.add_argument("--noise", type=float, default=d.noise, help="EAGLE: uniform noise on input features")
    p.add_argument("--unroll", type=int, default=d.unroll, help="EAGLE: 2 adds a pass on its own predictions")
    p.add_argument("--text-tokens", type=int, default=d.text_tokens, help="EAGLE: NarrativeQA prose tokens")
    p.add_argument("--chunk", type=int, default=d.chunk, help="EAGLE: prose chunk length")
    p.add_argument("--tree", default=",".join(map(str, d.tree)), help="EAGLE: default tree DEPTH,TOPK,NODES")
    p.add_argument("--eagle-head-vocab", type=int, default=d.head_vocab,
                   help="EAGLE: rows of the reduced LM head (FR-Spec; 0: the whole head)")
    p.add_argument("--precision", default=d.precision, help="EAGLE: auto | fp32 | bf16 training matmuls")
    p.add_argument("--preset", default=None, choices=("shipped",),
                   help="EAGLE: shipped = build the draft corpus and train as the shipped head was (head_train)")
    p.add_argument("--recipe", default="eagle3", choices=("eagle3", "eagle1"),
                   help="EAGLE with --preset: EAGLE-3's recipe (default) or EAGLE-1/2's")


def run(args: argparse.Namespace) -> int:
    """``studylib train-draft --kind eagle`` (``studylib.drafting.cli`` checks the options first)."""
    from studylib.decoding.eagle import TreeSpec

    tree = TreeSpec.parse(args.tree)
    d = EagleTrainConfig()
    for name in ("max_minutes", "self_prompts", "samples", "gen_tokens"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(d, name))
    cfg = EagleTrainConfig(
        model=args.model, max_minutes=args.max_minutes,
        steps=args.eagle_steps, batch_tokens=args.batch_tokens, lr=args.eagle_lr, cls_weight=args.cls_weight,
        noise=args.noise, unroll=args.unroll, head_vocab=args.eagle_head_vocab, chunk=args.chunk,
        text_tokens=args.text_tokens, sources=tuple(args.sources.split(",")), self_prompts=args.self_prompts,
        samples=args.samples, gen_tokens=args.gen_tokens, seed=args.seed, save_every=args.save_every,
        device=args.device, fresh=args.fresh, out=args.out, tree=(tree.depth, tree.topk, tree.nodes),
        precision=args.precision,
    )
    meta = train_eagle(cfg)
    state = "complete" if meta["complete"] else "stopped at the time cap; rerun the same command to resume"
    print(f"eagle head: {meta['path']} ({meta['params'] / 1e6:.1f}M params, head vocabulary "
          f"{meta['head_vocab'] or 'full'}), {meta['steps_done']}/{meta['steps_total']} steps, {state}; held-out "
          f"top-1 agreement {meta['val_top1']:.3f} (first token), {meta['val_top1_second']:.3f} (second)")
    return 0
