"""Train an EAGLE head on the draft corpus (``draft_corpus``), with EAGLE-1/2's recipe or EAGLE-3's.

**Data.** Every answer of the corpus, with up to ``context`` tokens of its prompt before it (the head
attends over them; they carry no loss). Answers to prompts whose id hashes to 0 mod ``HELDOUT_MOD`` are
held out: the validation curve is measured on them and they are never trained on.

**Recipes** (``kind``), one decoder layer of the target's shape each (``eagle.EagleHead``):
- ``eagle1``: the input is the target's final-norm feature f_j (with uniform noise, +-``noise``), paired
  with the embedding of x_(j+1); the loss is smooth-L1 between the predicted and the true f_(j+1), plus
  ``cls_weight`` x the cross-entropy against the target's distribution p(x_(j+2)) = softmax(W f_(j+1)).
- ``eagle3``: the input of committed rows is ``fuse`` of the target's low, middle and high layer outputs;
  the loss is the cross-entropy only, summed over ``ttt_steps`` training-time-test steps: step s feeds
  row j the head's own step-(s-1) output of row j-1, and row j attends to step 1's rows up to j-s+1 and
  to its own chain (``TTTKV``), exactly what a depth-s node of the draft tree sees at run time.
Both project onto the same head vocabulary (FR-Spec: the ``head_vocab`` tokens the target ranks first
most often in the training answers; 0 keeps all), so the two are compared at equal size and cost.

**Engineering.** A batch is a function of (seed, step), so a resumed run trains the same batches; AdamW
with warmup and cosine decay over ``max_steps``; bf16 autocast where the CPU multiplies bf16 natively;
a checkpoint every ``eval_every`` steps, with the held-out curve (top-1 agreement of the first and
second drafted tokens with the target's argmax over the full vocabulary); training stops by the curve,
when ``patience`` evaluations in a row gain less than ``min_delta``, or at ``max_steps`` / the time cap.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from studylib.decoding.draft_files import shipped_dir
from studylib.drafting.precision import autocast, train_precision
from studylib.errors import StudylibError

HELDOUT_MOD = 20  # 1 in 20 prompts (with all their answers) is validation only


@dataclass
class HeadTrainConfig:
    kind: str = "eagle3"
    corpus: str = ""  # the corpus folder (draft_corpus.build's ``path``)
    context: int = 128  # prompt tokens before each answer
    batch_tokens: int = 4096
    lr: float = 6e-4
    warmup: int = 200
    max_steps: int = 2_400  # a stop (about 3 passes over a 2M-token corpus); the curve may stop it sooner
    decay_steps: int = 2_400  # the learning rate's cosine decay, whatever the stop
    eval_every: int = 250
    eval_answers: int = 256
    patience: int = 4
    min_delta: float = 0.003
    cls_weight: float = 0.5  # eagle1
    noise: float = 0.1  # eagle1
    ttt_steps: int = 3  # eagle3
    head_vocab: int = 8192  # FR-Spec; the full LM head is measured beside it at run time (eagle_heads.py)
    precision: str = "auto"
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_minutes: float = 10.0  # also save this often, so a killed run loses minutes, not an eval interval

    def __post_init__(self) -> None:
        from studylib.decoding.eagle import HEAD_KINDS

        checks = {f"kind in {'|'.join(HEAD_KINDS)}": self.kind in HEAD_KINDS, "context >= 0": self.context >= 0,
                  "batch_tokens >= 16": self.batch_tokens >= 16, "lr > 0": self.lr > 0,
                  "max_steps >= 1": self.max_steps >= 1, "decay_steps >= 1": self.decay_steps >= 1, "eval_every >= 1": self.eval_every >= 1,
                  "patience >= 1": self.patience >= 1, "ttt_steps >= 1": self.ttt_steps >= 1,
                  "head_vocab >= 0": self.head_vocab >= 0, "checkpoint_minutes >= 0": self.checkpoint_minutes >= 0,
                  "precision in auto|fp32|bf16": self.precision in ("auto", "fp32", "bf16")}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise StudylibError(f"head training needs {', '.join(bad)}; fix the option.")

    def key(self) -> str:
        d = asdict(self)
        for k in ("max_minutes", "max_steps", "patience", "min_delta", "eval_every", "checkpoint_minutes"):
            d.pop(k)  # when to stop is not what is trained
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def heldout(document: str) -> bool:
    """Whether a document's prompts are validation only (by document: an article's four tasks, a story's
    tasks and questions, stay on one side)."""
    return zlib.crc32(document.encode()) % HELDOUT_MOD == 0


class Corpus:
    """The corpus's answers as training windows, features read memory-mapped."""

    def __init__(self, base: str | Path, context: int):
        from studylib.drafting.corpus import document_of, shard_dirs

        self.base, self.context = Path(base), context
        self.feats: list[np.ndarray] = []
        self.items: list[tuple] = []  # (shard, prompt ids, prompt row, answer ids, answer row, held out, source)
        for si, d in enumerate(shard_dirs(self.base)):
            idx = json.loads((d / "index.json").read_text())
            self.feats.append(np.load(d / "feats.npy", mmap_mode="r"))
            for a in idx["answers"]:
                p = idx["prompts"][a["prompt"]]
                if a["ids"]:
                    held = heldout(document_of(p["id"], p["source"]))
                    self.items.append((si, p["ids"], p["row"], a["ids"], a["row"], held, p["source"]))
        if not self.items:
            raise StudylibError(f"no answers in {self.base}; build it with `studylib draft-corpus`.")
        self.train = [i for i, it in enumerate(self.items) if not it[5]]
        self.val = [i for i, it in enumerate(self.items) if it[5]]
        self.hidden = self.feats[0].shape[-1]
        self.layers = tuple(json.loads((shard_dirs(self.base)[0] / "index.json").read_text())["layers"])

    def window(self, i: int) -> tuple[list[int], np.ndarray, int]:
        """(token ids, features (T, 4, H) float16, where the answer starts) of item ``i``."""
        si, pids, prow, aids, arow, _, _ = self.items[i]
        c = min(self.context, len(pids))
        f = self.feats[si]
        rows = np.concatenate([f[prow + len(pids) - c: prow + len(pids)], f[arow: arow + len(aids)]])
        return [*pids[len(pids) - c:], *aids], rows, c

    def tokens(self, items) -> int:
        return sum(min(self.context, len(self.items[i][1])) + len(self.items[i][3]) for i in items)

    def batch(self, items: list[int], device) -> dict:
        """Right-padded tensors: ids (B, T), feats (B, T, 4, H) fp32, valid (B, T), answer start (B,)."""
        wins = [self.window(i) for i in items]
        longest = max(len(w[0]) for w in wins)
        b = len(wins)
        ids = torch.zeros(b, longest, dtype=torch.long)
        feats = torch.zeros(b, longest, 4, self.hidden)
        valid = torch.zeros(b, longest, dtype=torch.bool)
        start = torch.zeros(b, dtype=torch.long)
        for r, (t, f, c) in enumerate(wins):
            ids[r, : len(t)] = torch.tensor(t)
            feats[r, : len(t)] = torch.from_numpy(np.asarray(f, dtype=np.float32))
            valid[r, : len(t)] = True
            start[r] = c
        return {"ids": ids.to(device), "feats": feats.to(device), "valid": valid.to(device), "start": start.to(device),
                "layers": self.layers}

    def pick(self, step: int, seed: int, batch_tokens: int) -> list[int]:
        """A batch of training answers: a seeded draw until ``batch_tokens`` tokens (function of seed, step)."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        out, n = [], 0
        for j in torch.randint(len(self.train), (4 * batch_tokens // 64 + 8,), generator=g).tolist():
            i = self.train[j]
            out.append(i)
            n += min(self.context, len(self.items[i][1])) + len(self.items[i][3])
            if n >= batch_tokens:
                break
        return out


class TTTKV:
    """Attention for training-time test: step s's row j sees step 1's rows 0..j-s+1 and its own chain
    (step t's row j-s+t, t = 2..s), as a depth-s node of the draft tree sees the committed context and
    its ancestors."""

    def __init__(self, batch: int, seq: int, device):
        self._pos = torch.arange(seq, device=device)[None].expand(batch, seq)
        self.seq, self.device = seq, device
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def positions(self) -> torch.Tensor:
        return self._pos

    def mask(self, s: int) -> torch.Tensor:
        t = self.seq
        j = torch.arange(t, device=self.device)[:, None]
        i = torch.arange(t, device=self.device)[None, :]
        blocks = [i <= j - s + 1] + [i == j - s + u for u in range(2, s + 1)]
        return torch.cat(blocks, dim=1)  # (T, s T)

    def attend(self, layer, q, k, v):
        self.k.append(k)
        self.v.append(v)
        s = len(self.k)
        if s == 1:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, torch.cat(self.k, 2), torch.cat(self.v, 2),
                                              attn_mask=self.mask(s)[None, None], enable_gqa=True)


def unrolled(head, embed: torch.Tensor, batch: dict, steps: int, noise: float = 0.0, gen=None) -> list[torch.Tensor]:
    """The head's outputs (B, T-1, H) for steps 1..``steps``: rows are pairs (feature_j, x_(j+1)); step 1
    reads the target's features, step s > 1 the head's own step-(s-1) output of the row before."""
    ids, feats = batch["ids"], batch["feats"]
    hid = {i: feats[:, :-1, k] for k, i in enumerate((*batch["layers"], -1))}
    g = head.lift(hid)
    if noise > 0:
        g = g + (torch.rand(g.shape, generator=gen, device=g.device) * 2 - 1) * noise
    emb = F.embedding(ids[:, 1:], embed)
    kv = TTTKV(ids.shape[0], ids.shape[1] - 1, ids.device)
    outs = []
    for s in range(steps):
        if s:
            g = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], dim=1)
        outs.append(head(emb, g, kv))
    return outs


def losses(head, embed, w_head, head_ids, w_full, batch: dict, steps: int, cls_weight: float, noise: float,
           gen=None, full_top1: bool = False) -> tuple[torch.Tensor, dict]:
    """The recipe's loss on one batch, and per step the top-1 agreement with the target's argmax (over
    the head vocabulary, or the full vocabulary when ``full_top1``)."""
    feats, valid = batch["feats"], batch["valid"]
    t1 = feats.shape[1] - 1
    f_next = feats[:, 1:, 3]  # the target's final-norm feature at j + 1: its distribution of x_(j+2)
    j = torch.arange(t1, device=feats.device)[None]
    # rows that predict an answer token: x_(j+2) is in the answer (so it exists)
    after = torch.cat([valid[:, 2:], torch.zeros_like(valid[:, :1])], dim=1)
    m = (valid[:, 1:] & valid[:, :-1] & after & (j + 2 >= batch["start"][:, None])).float()
    with torch.no_grad():
        p_t = torch.softmax(f_next @ w_head.T, -1)
        ref = (f_next @ w_full.T).argmax(-1) if full_top1 else \
            (p_t.argmax(-1) if head_ids is None else head_ids[p_t.argmax(-1)])
    outs = unrolled(head, embed, batch, steps, noise if head.kind == "eagle1" else 0.0, gen)
    total, stats = None, {}
    for s, out in enumerate(outs):
        ms = m * (j >= s).float()  # step s + 1 needs s rows before it
        denom = ms.sum().clamp_min(1.0)
        logq = torch.log_softmax(head.readout(out) @ w_head.T, -1)
        cls = (-(p_t * logq).sum(-1) * ms).sum() / denom
        if head.kind == "eagle1":  # one step, feature regression plus the token loss
            loss = ((F.smooth_l1_loss(out, f_next, reduction="none").mean(-1) * ms).sum() / denom
                    + cls_weight * cls) if s == 0 else None
        else:
            loss = cls
        if loss is not None:
            total = loss if total is None else total + loss
        with torch.no_grad():
            got = logq.argmax(-1)
            got = got if head_ids is None else head_ids[got]
            stats[f"top1_{s + 1}"] = float(((got == ref).float() * ms).sum() / denom)
            stats[f"cls_{s + 1}"] = float(cls.detach())
            stats[f"n_{s + 1}"] = float(ms.sum())
    return total, stats


def head_vocabulary(corpus: Corpus, w_full: torch.Tensor, size: int, eos: list[int], sample: int = 400) -> list[int]:
    """FR-Spec's reduced vocabulary: the ``size`` tokens the target ranks first most often on (a sample
    of) the training answers, EOS kept; [] when ``size`` is 0 or covers the vocabulary."""
    vocab = w_full.shape[0]
    if size == 0 or size >= vocab:
        return []
    counts = torch.zeros(vocab, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    for j in torch.randperm(len(corpus.train), generator=g)[:sample].tolist():
        i = corpus.train[j]
        si, _, _, aids, arow, _, _ = corpus.items[i]
        f = torch.from_numpy(np.asarray(corpus.feats[si][arow: arow + len(aids), 3], dtype=np.float32))
        counts += torch.bincount((f @ w_full.T).argmax(-1), minlength=vocab)
    ranked = torch.argsort(-counts, stable=True).tolist()
    keep = list(dict.fromkeys([*eos, *ranked]))[:size]
    return sorted(keep)


def evaluate(head, corpus: Corpus, embed, w_head, head_ids, w_full, cfg: HeadTrainConfig, device) -> dict:
    """Held-out top-1 agreement of the first and second drafted tokens with the target's argmax over the
    full vocabulary, token-weighted, on the first ``eval_answers`` held-out answers."""
    items = corpus.val[: cfg.eval_answers]
    tot: dict[str, float] = {}
    weight: dict[str, float] = {}
    head.eval()
    with torch.no_grad(), autocast(cfg.precision, device):
        for k in range(0, len(items), 8):
            b = corpus.batch(items[k: k + 8], device)
            _, st = losses(head, embed, w_head, head_ids, w_full, b, 2, cfg.cls_weight, 0.0, full_top1=True)
            for key, v in st.items():
                if key.startswith("n_"):
                    continue
                n = st["n_" + key.rsplit("_", 1)[1]]  # the rows this step scored
                tot[key] = tot.get(key, 0.0) + v * n
                weight[key] = weight.get(key, 0.0) + n
    head.train()
    return {k: v / max(weight[k], 1.0) for k, v in tot.items()}


def _lr(cfg: HeadTrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(cfg.decay_steps - cfg.warmup, 1)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def plateaued(curve: list[dict], patience: int, min_delta: float) -> bool:
    """Stop by the curve: the last ``patience`` evaluations each gained less than ``min_delta`` held-out
    top-1 over the best before them."""
    if len(curve) <= patience:
        return False
    best_before = max(c["top1_1"] for c in curve[:-patience])
    return max(c["top1_1"] for c in curve[-patience:]) < best_before + min_delta


def train(cfg: HeadTrainConfig, work: str | Path, loaded: tuple | None = None, progress: bool = True) -> dict:
    """Train (resuming ``work``'s checkpoint when it matches) until the curve flattens, ``max_steps`` or
    the time cap; returns the state: head, vocabulary, curve, history, timing."""
    from studylib.decoding.eagle import EagleHead
    from studylib.models import load_model
    from studylib.progress import progress_bar

    t0 = time.monotonic()
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    target, tok = loaded if loaded is not None else load_model(_corpus_model(cfg.corpus), "cpu", "float32")
    if target.weights_format != "dense" or target.dtype != torch.float32:
        raise StudylibError("head training reads the dense float32 target's embedding and LM head.")
    device = target.device
    corpus = Corpus(cfg.corpus, cfg.context)
    embed = target.model.embed_tokens.weight.detach()
    w_full = target.lm_head.weight.detach()
    precision = train_precision(cfg.precision, device)
    ckpt_path = work / "ckpt.pt"
    from studylib.drafting.corpus import corpus_hash

    # The checkpoint belongs to these settings on this corpus (one extended in place is another corpus).
    key = cfg.key() + corpus_hash(Path(cfg.corpus))[:12]
    ckpt = torch.load(ckpt_path, weights_only=True) if ckpt_path.exists() else None
    if ckpt is not None and ckpt.get("key") != key:
        ckpt = None
    vocab = ckpt["vocab"] if ckpt is not None else \
        head_vocabulary(corpus, w_full, cfg.head_vocab, list(target.config.eos_token_ids))
    head_ids = torch.tensor(vocab, dtype=torch.long, device=device) if vocab else None
    w_head = w_full[head_ids].contiguous() if head_ids is not None else w_full
    torch.manual_seed(cfg.seed)
    head = EagleHead(target.config, cfg.kind).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    step, curve, history, seconds, finished = 0, [], [], 0.0, None
    if ckpt is not None:
        head.load_state_dict(ckpt["head"])
        opt.load_state_dict(ckpt["optim"])
        step, curve, history, seconds = ckpt["step"], ckpt["curve"], ckpt["history"], ckpt["seconds"]
        finished = ckpt.get("stop")

    last_save = [time.monotonic()]

    def save() -> None:
        last_save[0] = time.monotonic()
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"key": key, "vocab": vocab, "head": head.state_dict(), "optim": opt.state_dict(),
                    "step": step, "curve": curve, "history": history, "stop": stop,
                    "seconds": seconds + time.monotonic() - t_run}, tmp)
        tmp.replace(ckpt_path)

    steps = 1 if cfg.kind == "eagle1" else cfg.ttt_steps
    end = math.inf if cfg.max_minutes is None else t0 + cfg.max_minutes * 60
    t_run = time.monotonic()
    # A run the curve already stopped stays stopped: a rerun returns the same head, not more training.
    stop = finished if finished == "curve flat" else None
    head.train()
    with progress_bar(total=cfg.max_steps, initial=step, desc=f"{cfg.kind} head", progress=progress) as bar:
        while stop is None:
            if step % cfg.eval_every == 0 and (not curve or curve[-1]["step"] != step):
                curve.append({"step": step, "tokens": step * cfg.batch_tokens,
                              **evaluate(head, corpus, embed, w_head, head_ids, w_full, cfg, device)})
                save()
                if plateaued(curve, cfg.patience, cfg.min_delta):
                    stop = "curve flat"
                    break
            if step >= cfg.max_steps:
                stop = "max_steps"
                break
            if time.monotonic() >= end:
                stop = "time cap"
                break
            b = corpus.batch(corpus.pick(step, cfg.seed, cfg.batch_tokens), device)
            for group in opt.param_groups:
                group["lr"] = _lr(cfg, step)
            g = torch.Generator(device=device).manual_seed(cfg.seed + 7919 * step)
            with autocast(precision, device):
                loss, st = losses(head, embed, w_head, head_ids, w_full, b, steps, cfg.cls_weight, cfg.noise, g)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            history.append({"step": step, "loss": float(loss.detach()), **st})
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1=f"{st['top1_1']:.2f}",
                            val=f"{curve[-1]['top1_1']:.3f}" if curve else "-")
            bar.update()
            if time.monotonic() - last_save[0] >= cfg.checkpoint_minutes * 60:
                save()  # a batch is a function of (seed, step): resuming here trains what would have followed
    if curve[-1]["step"] != step:  # the exported weights' own held-out figures, not an earlier step's
        curve.append({"step": step, "tokens": step * cfg.batch_tokens,
                      **evaluate(head, corpus, embed, w_head, head_ids, w_full, cfg, device)})
    save()
    head.eval()
    best = max(curve, key=lambda c: c["top1_1"])
    return {"head": head, "vocab": vocab, "curve": curve, "history": history[-500:], "step": step, "stop": stop,
            "precision": precision, "seconds": seconds + time.monotonic() - t_run, "final": curve[-1], "best": best,
            "train_answers": len(corpus.train), "val_answers": len(corpus.val),
            "train_tokens_seen": step * cfg.batch_tokens}


def _corpus_model(base: str) -> str:
    man = Path(base) / "manifest.json"
    if not man.exists():
        raise StudylibError(f"{base} has no manifest.json; build the corpus with `studylib draft-corpus` first.")
    return json.loads(man.read_text())["config"]["model"]


def export(result: dict, cfg: HeadTrainConfig, target, dest: Path, corpus_manifest: dict) -> dict:
    """Write the head in float16 with its vocabulary and manifest (sha256 of the weights, the training
    config, the corpus hash, the held-out curve, training time and machine); returns the manifest."""
    from studylib.bench.provenance import provenance
    from studylib.decoding.eagle import HEAD_FILE, save_head

    head = result["head"]
    c = target.config
    meta = {
        "kind": "eagle", "head_kind": cfg.kind, "target": c.name, "params": sum(p.numel() for p in head.parameters()),
        "dtype": "float16", "head_vocab": len(result["vocab"]), "tree": [5, 4, 16],
        "training": {"config": asdict(cfg), "steps": result["step"], "stop": result["stop"],
                     "tokens_seen": result["train_tokens_seen"], "seconds": result["seconds"],
                     "precision": result["precision"], "train_answers": result["train_answers"],
                     "val_answers": result["val_answers"]},
        "corpus": {"hash": corpus_manifest.get("hash"), "answer_tokens": corpus_manifest.get("answer_tokens"),
                   "answers": corpus_manifest.get("answers"), "prompts": corpus_manifest.get("prompts"),
                   "by_source": corpus_manifest.get("by_source"), "config": corpus_manifest.get("config")},
        "heldout": {"rule": f"answers to prompts with crc32(id) % {HELDOUT_MOD} == 0, never trained on",
                    "final": result["final"], "best": result["best"], "curve": result["curve"]},
        "machine": {k: v for k, v in provenance().items() if k in ("date", "git_commit", "python", "cpu", "isa",
                                                                    "cpu_count", "torch_threads", "versions")},
    }
    tmp = dest.with_name(dest.name + ".tmp")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    head16 = type(head)(target.config, cfg.kind)
    head16.load_state_dict(head.state_dict())
    save_head(head16.half(), tmp, result["vocab"], meta)
    meta["sha256"] = hashlib.sha256((tmp / HEAD_FILE).read_bytes()).hexdigest()
    from studylib.decoding.eagle import META_FILE

    (tmp / META_FILE).write_text(json.dumps(meta, indent=1, default=str))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return meta


def shipped_config(target_name: str, kind: str) -> tuple[dict | None, dict | None]:
    """(corpus config, training config) of the shipped ``kind`` head for ``target_name``, from its
    manifest, or (None, None) when none ships."""
    from studylib.decoding.eagle import META_FILE

    path = shipped_dir(target_name, kind) / META_FILE
    if not path.exists():
        return None, None
    meta = json.loads(path.read_text())
    return meta["corpus"]["config"], meta["training"]["config"]


def run_preset(args) -> int:
    """``train-draft --kind eagle --preset shipped [--recipe eagle3|eagle1]``: build the shipped corpus
    (resumable) and train the head as the shipped one was trained (its manifest's settings; the
    defaults where none ships yet), then say how close the retrain comes to the shipped head."""
    from dataclasses import fields

    from studylib.cache import cache_dir
    from studylib.decoding.draft_files import slug as _slug
    from studylib.decoding.eagle import eagle_dir
    from studylib.drafting import corpus as draft_corpus
    from studylib.models import load_model

    t0 = time.monotonic()
    kind = args.recipe
    corpus_cfg, train_cfg = shipped_config(args.model, kind)
    ckw = {k: v for k, v in (corpus_cfg or {}).items() if k in {f.name for f in fields(draft_corpus.CorpusConfig)}}
    ckw.update(model=args.model, max_minutes=args.max_minutes, out=None)
    man = draft_corpus.build(draft_corpus.CorpusConfig(**ckw))
    if not man["complete"]:
        print(f"draft corpus: {man['answer_tokens']:,} answer tokens so far ({man['stopped']}); rerun the same "
              "command to resume.")
        return 0
    left = None if args.max_minutes is None else args.max_minutes - (time.monotonic() - t0) / 60
    if left is not None and left <= 0:
        print("draft corpus complete; the time cap passed before training; rerun the same command to train.")
        return 0
    tkw = {k: v for k, v in (train_cfg or {"kind": kind}).items() if k in {f.name for f in fields(HeadTrainConfig)}}
    tkw.update(corpus=man["path"], max_minutes=left)
    cfg = HeadTrainConfig(**tkw)
    target, tok = load_model(args.model, "cpu", "float32")
    res = train(cfg, cache_dir("drafts", f"{_slug(args.model)}-{kind}-work"), loaded=(target, tok))
    dest = Path(args.out) if args.out else eagle_dir(args.model).with_name(f"{_slug(args.model)}-{kind}")
    meta = export(res, cfg, target, dest, man)
    got = meta["heldout"]["final"]
    line = (f"{kind} head: {dest} ({meta['params'] / 1e6:.1f}M params, {meta['training']['steps']} steps, stopped: "
            f"{meta['training']['stop']}); held-out top-1 {got['top1_1']:.3f} (first drafted token), "
            f"{got['top1_2']:.3f} (second)")
    shipped = shipped_dir(args.model, kind)
    # Writing over the shipped head itself (how benchmarks/ship_heads.sh makes it) leaves nothing to compare with.
    if (shipped / "eagle_meta.json").exists() and dest.resolve() != shipped.resolve():
        line += "; " + against_shipped(meta, json.loads((shipped / "eagle_meta.json").read_text()))
    print(line)
    return 0


def against_shipped(meta: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """How close a retrain came to the shipped head, in words: final against final when the retrain ran as
    long, else against the shipped run's own held-out curve at the retrain's last step (a partial retrain,
    stopped by a time cap, is compared with where the shipped run stood at the same step)."""
    got, steps = meta["heldout"]["final"], int(meta["training"]["steps"])
    ref_steps = int(ref["training"]["steps"])
    if steps >= ref_steps:
        r = ref["heldout"]["final"]
        return (f"the shipped head: {r['top1_1']:.3f} and {r['top1_2']:.3f} "
                f"(difference {got['top1_1'] - r['top1_1']:+.3f} on the first drafted token)")
    # Step 0 is the untrained head: a retrain stopped before the first evaluation has nothing to be compared with.
    trained = [c for c in ref["heldout"].get("curve") or [] if int(c["step"]) > 0]
    points = [c for c in trained if int(c["step"]) <= steps]
    if not points:
        first = min((int(c["step"]) for c in trained), default=None)
        return (f"the shipped run has no held-out point at or before step {steps}"
                + (f" (its first is at step {first}: retrain at least that long)" if first else ""))
    r = max(points, key=lambda c: int(c["step"]))
    # The retrain evaluated at the same steps: compare at the latest step both have, where the two runs
    # should agree to the bit if training is deterministic (its final point may lie a few steps later).
    mine = {int(c["step"]): c for c in meta["heldout"].get("curve") or []}
    same = mine.get(int(r["step"]))
    if same is not None:
        exact = same["top1_1"] == r["top1_1"] and same.get("cls_1") == r.get("cls_1")
        return (f"the shipped run at step {int(r['step'])} of {ref_steps}: {r['top1_1']:.5f} against this run's "
                f"{same['top1_1']:.5f} at the same step ("
                + ("identical, loss included: the training reproduced bit for bit" if exact else
                   f"difference {same['top1_1'] - r['top1_1']:+.5f}") + ")")
    return (f"the shipped run at step {int(r['step'])} of {ref_steps}: {r['top1_1']:.3f} and {r['top1_2']:.3f} "
            f"(difference {got['top1_1'] - r['top1_1']:+.3f} on the first drafted token)")
