"""``studylib train-draft``: distil a small Llama-family draft from the target (default smollm2-135m).

No smaller SmolLM2 exists, so we make one. The recipe, chosen for a 2-core CPU and ~25 minutes:
- Shape: the target's width (576 for SmolLM2-135M) and tokenizer, ``--layers`` decoder layers (4 of
  30), tied embeddings. Width is kept so the draft starts from the target's own weights: embeddings,
  final norm and ``--layers`` of its layers. ``--init auto`` measures the distillation loss of a few
  candidate layer subsets (first k, evenly spaced, first k-1 plus the last, half from each end) and
  starts from the lowest.
- Data (``draft_data``): text the target writes for training prompts, with its top-k next-token
  log-probs recorded while it writes. Chapter 2's evaluation prompts are never trained on.
- Loss: cross-entropy of the draft against the target's top-k distribution (renormalised), i.e.
  forward KL up to a constant, on the continuation tokens. AdamW, linear warm-up, cosine decay.
- Engineering: seeded (batches are a function of seed and step, so resuming reproduces the run), a
  tqdm bar, a checkpoint in ``cache_dir("drafts", "<target>-distilled-work")`` (``<out>-work`` with
  ``--out``) every ``--save-every``
  steps, a hard wall-time cap (``--max-minutes``, data generation included) after which the current
  weights are exported and a rerun resumes. Data generation may use at most ``--data-share`` of the
  cap, so training always gets the rest: a cap spent entirely on writing data would export the
  untrained layer slice (acceptance ~0), and a run that trained no step raises instead of exporting.
  The export is an HF-format directory (config.json, model.safetensors, tokenizer files,
  draft_meta.json, draft_vocab.json) in ``cache_dir("drafts", "<target>-distilled")``, which ``--draft distilled`` and ``load_model(path)`` read.
- ``draft_vocab.json``: the ``--head-vocab`` tokens the target emits most often. The draft's LM head
  is the largest part of its cost; ``--draft distilled`` projects onto these rows only (proposals
  outside them are simply never made, which stays exact), ``distilled:full`` uses the whole head.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from studylib.cache import cache_dir
from studylib.decoding.draft_files import distilled_dir, slug
from studylib.errors import StudylibError


def work_dir(target_name: str) -> Path:
    return cache_dir("drafts", f"{slug(target_name)}-distilled-work")


@dataclass
class DraftTrainConfig:
    model: str = "smollm2-135m"
    layers: int = 4
    init: str = "auto"  # auto | spaced | first | random
    sources: tuple[str, ...] = ("chat", "self")
    self_prompts: int = 48
    samples: int = 2  # sampled answers per prompt, besides the greedy one
    gen_tokens: int = 160
    temperature: float = 0.8
    store_top_k: int = 32
    steps: int = 600
    batch_size: int = 4
    lr: float = 5e-4
    warmup: int = 20
    max_minutes: float = 25.0
    data_share: float = 0.5  # at most this share of max_minutes goes to generating data
    freeze_embeddings: bool = True  # keep the target's (tied) embedding/head: 2/3 of the draft's weights
    seed: int = 0
    head_vocab: int = 8192
    gen_batch: int = 8
    save_every: int = 50
    device: str = "cpu"
    fresh: bool = False
    out: str | None = None

    def __post_init__(self) -> None:
        self.sources = tuple(self.sources)
        checks = {
            "layers >= 1": self.layers >= 1, "steps >= 1": self.steps >= 1, "batch_size >= 1": self.batch_size >= 1,
            "lr > 0": self.lr > 0, "max_minutes > 0": self.max_minutes > 0, "gen_tokens >= 1": self.gen_tokens >= 1,
            "store_top_k >= 1": self.store_top_k >= 1, "samples >= 0": self.samples >= 0,
            "head_vocab >= 0": self.head_vocab >= 0, "0 < data_share < 1": 0 < self.data_share < 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise StudylibError(f"train-draft needs {', '.join(bad)}; fix the option (see `studylib train-draft --help`).")
        if self.init not in ("auto", "spaced", "first", "random"):
            raise StudylibError(f"--init must be auto, spaced, first or random, got {self.init!r}.")
        if not self.sources or set(self.sources) - {"chat", "self"}:
            raise StudylibError(f"--sources takes chat and/or self, got {','.join(self.sources)!r}.")

    def key(self, *fields: str) -> str:
        d = asdict(self)
        return hashlib.sha256(json.dumps({f: d[f] for f in fields}, default=str).encode()).hexdigest()[:12]


DATA_FIELDS = ("model", "sources", "self_prompts", "samples", "gen_tokens", "temperature", "store_top_k", "seed")
TRAIN_FIELDS = (*DATA_FIELDS, "layers", "init", "steps", "batch_size", "lr", "warmup", "freeze_embeddings")


class _Deadline:
    def __init__(self, minutes: float):
        self.end = time.monotonic() + minutes * 60

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.end


# ---------------------------------------------------------------------------------------------- data


def _load_work(path: Path) -> dict | None:
    """A work file (data.pt, ckpt.pt) with ``torch.load(weights_only=True)``: tensors and plain
    containers only, so a tampered cache file cannot run code. Files of older versions pickled
    ``draft_data.Sequence`` objects; that one plain dataclass is allowed in, nothing else."""
    from studylib.drafting.data import Sequence

    with torch.serialization.safe_globals([Sequence]):
        return torch.load(path, weights_only=True)


def _seqs_to_plain(seqs: list) -> list[dict]:
    return [{"ids": s.ids, "prompt_len": int(s.prompt_len), "top_idx": s.top_idx, "top_logp": s.top_logp}
            for s in seqs]


def _seqs_from_plain(rows: list) -> list:
    from studylib.drafting.data import Sequence

    return [r if isinstance(r, Sequence) else Sequence(**r) for r in rows]


def _make_data(cfg: DraftTrainConfig, target, tok, work: Path, deadline: _Deadline) -> tuple[list, bool]:
    """Generate (or resume generating) the distillation set; returns (sequences, complete)."""
    from studylib.decoding.common import eos_set
    from studylib.drafting.data import chat_prompts, generate_batch, self_prompts
    from studylib.progress import progress_bar
    from studylib.sampling import SamplingParams

    path, key = work / "data.pt", cfg.key(*DATA_FIELDS)
    state = _load_work(path) if path.exists() and not cfg.fresh else None
    if state is not None:
        state["seqs"] = _seqs_from_plain(state["seqs"])
    if state is None or state.get("key") != key:
        prompts = chat_prompts(tok) if "chat" in cfg.sources else []
        if "self" in cfg.sources:
            prompts += self_prompts(target, tok, cfg.self_prompts, cfg.seed, cfg.gen_batch)
        state = {"key": key, "prompts": prompts, "done": 0, "seqs": []}
    prompts = state["prompts"]
    # Task i: prompt i % P, answered greedily in round 0 and by sampling in rounds 1..samples.
    tasks = [(r, i) for r in range(cfg.samples + 1) for i in range(len(prompts))]
    eos = eos_set(target, tok)
    with progress_bar(total=len(tasks), initial=state["done"], desc="draft data (target writes)", leave=False) as bar:
        while state["done"] < len(tasks) and not deadline.passed:
            chunk = tasks[state["done"] : state["done"] + cfg.gen_batch]
            rnd = chunk[0][0]
            chunk = [t for t in chunk if t[0] == rnd]  # one sampling mode per batch
            sampling = SamplingParams(0.0) if rnd == 0 else SamplingParams(cfg.temperature, seed=cfg.seed + state["done"])
            gen = sampling.generator(target.device)
            state["seqs"] += generate_batch(target, [prompts[i] for _, i in chunk], cfg.gen_tokens, sampling, gen,
                                            cfg.store_top_k, eos)
            state["done"] += len(chunk)
            bar.update(len(chunk))
            torch.save({**state, "seqs": _seqs_to_plain(state["seqs"])}, path)
    return state["seqs"], state["done"] >= len(tasks)


# ---------------------------------------------------------------------------------------------- model


def _choose_init_layers(cfg: DraftTrainConfig, target, seqs) -> tuple[list[int], dict]:
    """Which target layers the draft starts from; ``auto`` measures the candidates (module docstring)."""
    n, k = target.config.num_layers, min(cfg.layers, target.config.num_layers)
    cands = {
        "first": list(range(k)),
        "spaced": sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)}),
        "first+last": [*range(k - 1), n - 1] if k > 1 else [0],
        "ends": [*range(k - k // 2), *range(n - k // 2, n)],
    }
    if cfg.init in ("first", "spaced"):
        return cands[cfg.init], {}
    if cfg.init == "random" or not seqs:
        return cands["first"], {}
    # Measure: the distillation loss of each candidate before any training, on a few sequences.
    probe = seqs[:: max(len(seqs) // 8, 1)][:8]
    losses = {}
    for name, keep in cands.items():
        draft = _build_draft(cfg, target, keep).eval()
        with torch.no_grad():
            losses[name] = float(_loss(draft, _batch(probe, cfg.device))[0])
    best = min(losses, key=losses.get)
    return cands[best], {"init_losses": losses, "init_choice": best}


def _build_draft(cfg: DraftTrainConfig, target, keep: list[int]):
    from transformers import LlamaConfig, LlamaForCausalLM

    c = target.config
    hf_cfg = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=len(keep), num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=c.attention_bias, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_ids[0],
        pad_token_id=0,
    )
    torch.manual_seed(cfg.seed)
    draft = LlamaForCausalLM(hf_cfg)
    if cfg.init != "random":
        src = {k: v.detach().clone().float() for k, v in target.state_dict().items()}
        state = {k: v for k, v in src.items() if not k.startswith("model.layers.")}
        for j, i in enumerate(keep):
            prefix = f"model.layers.{i}."
            state.update({f"model.layers.{j}." + k[len(prefix):]: v for k, v in src.items() if k.startswith(prefix)})
        draft.load_state_dict(state, strict=False)
    if c.tie_word_embeddings:
        draft.tie_weights()
    return draft.float().to(cfg.device).train()


def _batch(seqs, device):
    """Right-padded inputs and the (row, position) of every continuation token to score."""
    T = max(len(s.ids) - 1 for s in seqs)
    inp = torch.zeros(len(seqs), T, dtype=torch.long)
    att = torch.zeros(len(seqs), T, dtype=torch.long)
    rows, cols = [], []
    for b, s in enumerate(seqs):
        n = len(s.ids) - 1
        inp[b, :n], att[b, :n] = s.ids[:-1], 1
        c = s.top_idx.shape[0]
        rows.append(torch.full((c,), b))
        cols.append(torch.arange(s.prompt_len - 1, s.prompt_len - 1 + c))
    top_idx = torch.cat([s.top_idx for s in seqs]).long()  # (N, k)
    top_logp = torch.cat([s.top_logp for s in seqs]).float()  # (N, k)
    return (inp.to(device), att.to(device), torch.cat(rows).to(device), torch.cat(cols).to(device),
            top_idx.to(device), top_logp.to(device))


def _loss(draft, batch) -> tuple[torch.Tensor, float]:
    inp, att, rows, cols, top_idx, top_logp = batch
    hidden = draft.model(input_ids=inp, attention_mask=att).last_hidden_state  # (B, T, H)
    logits = draft.lm_head(hidden[rows, cols]).float()  # (N, V): only the scored positions
    logq = torch.log_softmax(logits, -1)
    p = torch.softmax(top_logp, -1)  # the target's top-k, renormalised
    loss = -(p * logq.gather(1, top_idx)).sum(-1).mean()
    top1 = float((logits.argmax(-1) == top_idx[:, 0]).float().mean())
    return loss, top1


def _lr(cfg: DraftTrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


# ---------------------------------------------------------------------------------------------- export


def _head_vocab(seqs, size: int, eos: list[int]) -> list[int]:
    """The ``size`` tokens the target most often ranks first (ties broken by top-k presence)."""
    first, anywhere = Counter(), Counter()
    for s in seqs:
        first.update(s.top_idx[:, 0].tolist())
        anywhere.update(s.top_idx.flatten().tolist())
    ranked = sorted(anywhere, key=lambda t: (-first.get(t, 0), -anywhere[t], t))
    keep = list(dict.fromkeys([*eos, *ranked]))[:size]
    return sorted(keep)


def _export(draft, cfg: DraftTrainConfig, target, meta: dict, head: list[int]) -> Path:
    from studylib.models import model_dir

    dest = Path(cfg.out) if cfg.out else distilled_dir(target.config.name)
    tmp = dest.parent / (dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    draft.save_pretrained(tmp, safe_serialization=True)
    src = model_dir(target.config.name) if not target.config.random_weights else None
    if src is not None:
        for f in src.iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "manifest.json"):
                shutil.copy2(f, tmp / f.name)
    meta["path"] = str(dest)
    (tmp / "draft_vocab.json").write_text(json.dumps(head))
    (tmp / "draft_meta.json").write_text(json.dumps(meta, indent=1, default=str))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest




# ---------------------------------------------------------------------------------------------- train


def train_draft(cfg: DraftTrainConfig, loaded: tuple | None = None) -> dict:
    """Generate data, train (resuming a checkpoint when the config matches) and export; returns the meta.

    ``loaded``: the target as ``(model, tokenizer)`` when the caller already has it in float32."""
    from studylib.models import load_model
    from studylib.progress import progress_bar

    t_start = time.monotonic()
    deadline = _Deadline(cfg.max_minutes)
    data_deadline = _Deadline(cfg.max_minutes * cfg.data_share)
    torch.manual_seed(cfg.seed)
    target, tok = loaded if loaded is not None else load_model(cfg.model, cfg.device, "float32")
    work = Path(cfg.out).with_name(Path(cfg.out).name + "-work") if cfg.out else work_dir(target.config.name)
    work.mkdir(parents=True, exist_ok=True)
    seqs, data_complete = _make_data(cfg, target, tok, work, data_deadline)
    if not seqs:
        raise StudylibError("train-draft: the time cap passed before any data was generated; raise --max-minutes.")
    # Held out by prompt, not by sequence: sampled answers to one prompt share most of their text, so a
    # per-sequence split would score the draft on answers it has nearly seen.
    held = [zlib.crc32(s.ids[: s.prompt_len].numpy().tobytes()) % 10 == 0 for s in seqs]
    val = [s for s, h in zip(seqs, held, strict=True) if h] or seqs[::20]
    train = [s for s, h in zip(seqs, held, strict=True) if not h] or seqs
    ckpt_path, key = work / "ckpt.pt", cfg.key(*TRAIN_FIELDS)
    ckpt = _load_work(ckpt_path) if ckpt_path.exists() and not cfg.fresh else None
    if ckpt is not None and ckpt.get("key") != key:
        ckpt = None
    keep, init_info = (ckpt["keep"], ckpt["init_info"]) if ckpt else _choose_init_layers(cfg, target, seqs)
    draft = _build_draft(cfg, target, keep)
    if cfg.freeze_embeddings:
        # The embedding (and the LM head tied to it) already maps into the target's output space;
        # freezing it leaves AdamW a third of the parameters and keeps short runs from overfitting it.
        draft.get_input_embeddings().weight.requires_grad_(False)
    trainable = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=0.0)
    step, history = 0, []
    if ckpt:
        draft.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        step, history = ckpt["step"], ckpt["history"]

    def save() -> None:
        torch.save({"key": key, "keep": keep, "init_info": init_info, "model": draft.state_dict(),
                    "optim": opt.state_dict(), "step": step, "history": history}, ckpt_path)

    with progress_bar(total=cfg.steps, initial=step, desc="draft distillation", leave=False) as bar:
        while step < cfg.steps and not deadline.passed:
            g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)  # batch = f(seed, step): resumable
            pick = torch.randint(0, len(train), (cfg.batch_size,), generator=g).tolist()
            for group in opt.param_groups:
                group["lr"] = _lr(cfg, step)
            loss, top1 = _loss(draft, _batch([train[i] for i in pick], cfg.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            step += 1
            history.append({"step": step, "loss": loss.item(), "top1": top1})
            bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{top1:.2f}")
            bar.update()
            if step % cfg.save_every == 0:
                save()
    save()
    if step == 0:
        raise StudylibError(f"train-draft: the {cfg.max_minutes:g}-minute cap passed before any training step, so there "
                            "is no draft to export; raise --max-minutes (a rerun resumes from the cached data).")
    draft.eval()
    with torch.no_grad():
        vals = [_loss(draft, _batch(val[i : i + cfg.batch_size], cfg.device)) for i in range(0, len(val), cfg.batch_size)]
    c = target.config
    meta = {
        "target": c.name, "layers": len(keep), "init_layers": keep, **init_info,
        "params": sum(p.numel() for p in draft.parameters()), "target_params": c.num_params,
        "steps_done": step, "steps_total": cfg.steps, "complete": step >= cfg.steps and data_complete,
        "data_complete": data_complete, "sequences": len(seqs),
        "train_tokens": int(sum(s.top_idx.shape[0] for s in train)),
        "val_loss": sum(float(v[0]) for v in vals) / max(len(vals), 1),
        "val_top1": sum(v[1] for v in vals) / max(len(vals), 1),
        "history": history[-200:], "minutes_this_run": (time.monotonic() - t_start) / 60,
        "heldout_rule": "chat ids numbered 1, 4, 7, ... (draft_data.is_heldout) are never trained on; val_* are "
                        "scored on the training prompts whose crc32 % 10 == 0, held out with all their answers", "config": asdict(cfg),
    }
    head = _head_vocab(seqs, cfg.head_vocab, c.eos_token_ids) if cfg.head_vocab else []
    meta["head_vocab"] = len(head)
    _export(draft, cfg, target, meta, head)
    return meta


