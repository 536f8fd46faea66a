"""The shipped draft head's training corpus: the target's own answers at scale, with its features.

Published draft heads are trained once on tens of millions of tokens; chapter 2's old recipe had ~10k
tokens of the target's answers. This builds millions, resumably, in shards.

**Prompt pool** (``pool``): the shipped data sets' *draft split* only (``data.in_draft_pool``: a hashed
share of the documents that no chapter's loader ever returns), plus user turns the target writes itself:
- ``xsum``: each pool article with each task of ``XSUM_TASKS`` (the article first, so the prefix cache
  shares it between the tasks);
- ``nqa``: each pool NarrativeQA question, in the chapters' prompt form, and each pool story with each
  task of ``STORY_TASKS``;
- ``code``: each pool HumanEval problem (plain completion);
- ``self``: user turns the target writes at T = 1 after the chat template's user header (chat-like
  variety that touches no evaluation set).
Our chat prompts (``data/prompts/chat.jsonl``) are evaluation-only and never in the pool.

**Answers**: every prompt once greedily and ``samples`` times at T = 1 (``temperature``), by the serving
engine (continuous batching with a radix prefix cache) on the fastest arithmetic this engine has
(``--weights gguf --act int8``: the batched integer steps), up to ``max_new`` tokens.

**Features**: the dense fp32 target prefills each prompt once and each answer on top of the prompt's
cache (rolled back between answers): the outputs of layers ``layers(config)`` (EAGLE-3's low, middle and
high features) and the final-norm hidden state (EAGLE-1's input, and the target's distribution through
the LM head), stored in float16.

**Storage** (``corpus_dir``): one folder per shard, written whole and renamed into place (a killed run
never leaves half a shard): ``index.json`` (prompts and answers, token ids, feature rows) and
``feats.npy`` (rows, 4, hidden) float16, read memory-mapped. ``manifest.json`` sums the shards. A rerun
skips finished shards; the corpus key (every setting that changes the data) names the folder.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from studylib.cache import cache_dir
from studylib.errors import StudylibError
from studylib.sampling import SamplingParams

XSUM_TASKS = (
    "Summarise the article above in one sentence.",
    "Summarise the article above in three sentences.",
    "List the main facts of the article above as short bullet points.",
    "Explain the news story above to a ten-year-old.",
)
STORY_TASKS = (
    "Retell the story above in one paragraph.",
    "Who are the main characters of the story above, and what does each of them want?",
    "Write a different ending for the story above.",
)
FEATURES = ("low", "mid", "high", "final")  # the order of the feature axis in feats.npy


def layers(config) -> tuple[int, int, int]:
    """The three layer outputs EAGLE-3 fuses: low, middle and high (0-based layer indices)."""
    from studylib.decoding.eagle import fused_layers

    return fused_layers(config)


@dataclass
class CorpusConfig:
    model: str = "smollm2-135m"
    tokens: int = 2_000_000  # answer tokens to reach (the corpus stops at the first shard past it)
    samples: int = 1  # sampled answers per prompt, beside the greedy one
    temperature: float = 1.0
    max_new: int = 256
    max_prompt: int = 768  # prompts longer than this (tokens) are skipped
    per_shard: dict = field(default_factory=lambda: {"xsum": 4, "nqa": 8, "story": 1, "code": 2, "self": 32})
    self_tokens: int = 64  # longest user turn the target writes
    weights: str = "gguf"  # the generating engine
    act: str = "int8"
    max_running: int = 64
    kv_budget_mib: float = 2048.0
    seed: int = 0
    max_minutes: float | None = None  # stop after the shard running at this point (a rerun resumes)
    out: str | None = None

    def __post_init__(self) -> None:
        checks = {"tokens >= 1": self.tokens >= 1, "samples >= 0": self.samples >= 0,
                  "temperature > 0": self.temperature > 0, "max_new >= 1": self.max_new >= 1,
                  "max_prompt >= 16": self.max_prompt >= 16, "max_running >= 1": self.max_running >= 1,
                  "per_shard counts >= 0": all(int(v) >= 0 for v in self.per_shard.values()),
                  f"per_shard keys within {sorted(SOURCES)}": set(self.per_shard) <= set(SOURCES),
                  "max_minutes > 0": self.max_minutes is None or self.max_minutes > 0}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise StudylibError(f"draft corpus needs {', '.join(bad)}; fix the option.")

    def key(self) -> str:
        """Every setting that changes the data (not the stopping point, the cap or the folder)."""
        d = asdict(self)
        for k in ("tokens", "max_minutes", "out", "max_running", "kv_budget_mib"):
            d.pop(k)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


SOURCES = ("xsum", "nqa", "story", "code", "self")


@dataclass
class PoolPrompt:
    id: str
    source: str
    ids: list[int]


def _chat(tokenizer, text: str) -> list[int]:
    from studylib.prompts import encode

    return encode(tokenizer, text, chat=True)


def pool(tokenizer, seed: int = 0, sources=("xsum", "nqa", "story", "code")) -> dict[str, list[PoolPrompt]]:
    """The document prompts of the pool for ``sources``, each list shuffled with ``seed`` (``self``
    turns are written by the target per shard, see ``self_turns``)."""
    from studylib.data import load_dataset
    from studylib.prompts import encode

    rng = random.Random(seed)
    out: dict[str, list[PoolPrompt]] = {s: [] for s in SOURCES}
    if "xsum" in sources:
        xsum = load_dataset("xsum", split="draft")
        rng.shuffle(xsum)
        # the tasks of one article stay together (they share the article's prefix in the cache)
        for r in xsum:
            out["xsum"].extend(PoolPrompt(f"{r.id}#t{j}", "xsum", _chat(tokenizer, f"{r.meta['document']}\n\n{task}"))
                               for j, task in enumerate(XSUM_TASKS))
    if "nqa" in sources or "story" in sources:
        nqa = load_dataset("narrativeqa", split="draft")
        rng.shuffle(nqa)
        if "nqa" in sources:
            out["nqa"] = [PoolPrompt(r.id, "nqa", encode(tokenizer, r)) for r in nqa]
        if "story" in sources:
            stories = sorted({r.meta["document"] for r in nqa})
            rng.shuffle(stories)
            for st in stories:
                sid = hashlib.sha256(st.encode()).hexdigest()[:10]
                out["story"].extend(PoolPrompt(f"story-{sid}#t{j}", "story", _chat(tokenizer, f"{st}\n\n{task}"))
                                    for j, task in enumerate(STORY_TASKS))
    if "code" in sources:
        code = load_dataset("humaneval", split="draft")
        rng.shuffle(code)
        out["code"] = [PoolPrompt(r.id, "code", encode(tokenizer, r)) for r in code]
    return out


def _group_size(source: str) -> int:
    return len(XSUM_TASKS) if source == "xsum" else len(STORY_TASKS) if source == "story" else 1


def shard_prompts(docs: dict[str, list[PoolPrompt]], cfg: CorpusConfig, shard: int) -> list[PoolPrompt]:
    """Shard ``shard``'s document prompts: ``per_shard[source]`` documents of each source (an XSum
    article or a story with all its tasks), in pool order; a source that has run out adds none."""
    out = []
    for source in ("xsum", "nqa", "story", "code"):
        g = _group_size(source)
        n = int(cfg.per_shard.get(source, 0)) * g
        out.extend(p for p in docs[source][shard * n:(shard + 1) * n] if len(p.ids) <= cfg.max_prompt)
    return out


def _serve(model, prompts: list[list[int]], max_new: int, eos: set[int], cfg: CorpusConfig,
           samplings: list[SamplingParams]) -> list[list[list[int]]]:
    """Every prompt answered once per entry of ``samplings``, all in one continuous-batching run (each
    request carries its own sampling; the prefix cache shares a prompt between its answers). Returns
    [sampling][prompt] -> output ids."""
    from studylib.serving.engine import Engine, EngineConfig
    from studylib.serving.request import Request

    reqs = [Request(f"{i}/{k}", list(p), max_new, eos_ids=frozenset(eos), sampling=sp)
            for i, p in enumerate(prompts) for k, sp in enumerate(samplings)]
    engine = Engine(model, EngineConfig(scheduler="continuous", prefix_cache="radix", max_running=cfg.max_running,
                                        max_batch_tokens=1024, kv_budget_mib=cfg.kv_budget_mib))
    engine.run(reqs)
    # The engine's KV pool (kv_budget_mib) sits in reference cycles; free it now, not when the cyclic
    # collector next runs, or pools pile up (16 GB after 3 shards at three engines a shard, measured).
    del engine
    gc.collect()
    out = [[[] for _ in prompts] for _ in samplings]
    for r in reqs:
        i, k = (int(x) for x in r.id.split("/"))
        out[k][i] = list(r.output_ids)
    return out


def self_turns(model, tokenizer, n: int, cfg: CorpusConfig, seed: int) -> list[PoolPrompt]:
    """``n`` user turns the target writes at T = 1 after the chat template's user header, each wrapped
    as a chat prompt (turns of under 8 characters are dropped, so a shard may get fewer)."""
    from studylib.decoding.common import eos_set

    if n == 0:
        return []
    marker = "\u00a7"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=True,
                                         tokenize=False)
    head = list(tokenizer.encode(text.split(marker)[0], add_special_tokens=False))
    eos = eos_set(model, tokenizer)
    outs = _serve(model, [head] * n, cfg.self_tokens, eos, cfg, [SamplingParams(temperature=1.0, seed=seed)])[0]
    turns = []
    for i, o in enumerate(outs):
        # a turn cut off at self_tokens is kept: still a request the target then answers
        content = tokenizer.decode([t for t in o if t not in eos], skip_special_tokens=True).strip()
        if len(content) >= 8:
            turns.append(PoolPrompt(f"self-{seed}-{i}", "self", _chat(tokenizer, content)))
    return turns


@torch.inference_mode()
def features(model, prompt: list[int], answers: list[list[int]]) -> tuple[np.ndarray, list[int]]:
    """(rows, 4, hidden) float16 features of the prompt, then of each answer on the prompt's cache, and
    the first row of each answer. Rows: the prompt's P tokens, then each answer's tokens."""
    from studylib.models import DenseKVCache

    want = (*layers(model.config), -1)
    longest = len(prompt) + max((len(a) for a in answers), default=0)
    cache = DenseKVCache(model.config, 1, longest, model.device, model.dtype)

    def run(ids: list[int]) -> np.ndarray:
        out = model(torch.tensor([ids], device=model.device), cache.begin(len(ids)), logits="none",
                    hidden_layers=want)
        return torch.stack([out.hidden[i][0] for i in want], dim=1).to(torch.float16).cpu().numpy()

    parts, starts, row = [run(prompt)], [], len(prompt)
    for a in answers:
        cache.truncate(len(prompt))
        starts.append(row)
        if a:
            parts.append(run(a))
        row += len(a)
    return np.concatenate(parts, axis=0), starts


def corpus_dir(cfg: CorpusConfig, target_name: str) -> Path:
    from studylib.decoding.draft_files import slug as _slug

    base = Path(cfg.out) if cfg.out else cache_dir("drafts", f"{_slug(target_name)}-corpus-{cfg.key()}")
    base.mkdir(parents=True, exist_ok=True)
    return base


def _write_shard(dest: Path, index: dict, feats: np.ndarray) -> None:
    if not np.isfinite(feats).all():  # a residual stream past float16's range would train on inf
        raise StudylibError(f"{dest.name}: a feature overflowed float16; store this corpus in float32.")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "feats.npy", feats)
    (tmp / "index.json").write_text(json.dumps(index))
    os.replace(tmp, dest)  # whole or not at all: a killed run leaves at most a .tmp, redone next time


def shard_dirs(base: Path) -> list[Path]:
    return sorted(p for p in base.glob("shard-*") if p.is_dir() and not p.name.endswith(".tmp"))


def read_manifest(base: Path) -> dict:
    """The corpus's totals from its finished shards (``shards``, ``prompts``, ``answers``, tokens)."""
    shards = shard_dirs(base)
    tot = {"shards": 0, "prompts": 0, "answers": 0, "answer_tokens": 0, "feature_rows": 0, "by_source": {}}
    for s in shards:
        idx = json.loads((s / "index.json").read_text())
        tot["shards"] += 1
        tot["prompts"] += len(idx["prompts"])
        tot["answers"] += len(idx["answers"])
        tot["feature_rows"] += idx["rows"]
        for a in idx["answers"]:
            n = len(a["ids"])
            tot["answer_tokens"] += n
            src = idx["prompts"][a["prompt"]]["source"]
            tot["by_source"][src] = tot["by_source"].get(src, 0) + n
    return tot


def build_shard(cfg: CorpusConfig, shard: int, docs, gen_model, feat_model, tokenizer) -> tuple[dict, np.ndarray]:
    """One shard: its prompts, the answers (greedy, then sampled), and every row's features."""
    from studylib.decoding.common import eos_set

    seed = cfg.seed * 1_000_003 + shard
    clock = {"start": time.perf_counter()}
    prompts = shard_prompts(docs, cfg, shard)
    prompts += [p for p in self_turns(gen_model, tokenizer, int(cfg.per_shard.get("self", 0)), cfg, seed)
                if len(p.ids) <= cfg.max_prompt]
    clock["self_turns"] = time.perf_counter()
    if not prompts:
        return {"prompts": [], "answers": [], "rows": 0}, np.zeros((0, len(FEATURES), gen_model.config.hidden_size),
                                                                  np.float16)
    eos = eos_set(gen_model, tokenizer)
    ids = [p.ids for p in prompts]
    kinds = [("greedy", SamplingParams())] + [
        (f"sample{s}", SamplingParams(temperature=cfg.temperature, seed=seed + 7919 * (s + 1))) for s in range(cfg.samples)]
    runs = list(zip([k for k, _ in kinds], _serve(gen_model, ids, cfg.max_new, eos, cfg, [sp for _, sp in kinds]),
                    strict=True))
    clock["answers"] = time.perf_counter()
    index = {"shard": shard, "key": cfg.key(), "features": list(FEATURES), "layers": list(layers(feat_model.config)),
             "prompts": [], "answers": []}
    chunks, row = [], 0
    for i, p in enumerate(prompts):
        answers = [outs[i] for _, outs in runs]
        f, starts = features(feat_model, p.ids, answers)
        index["prompts"].append({"id": p.id, "source": p.source, "ids": p.ids, "row": row})
        for (kind, _), a, st in zip(runs, answers, starts, strict=True):
            index["answers"].append({"prompt": i, "kind": kind, "ids": a, "row": row + st})
        chunks.append(f)
        row += f.shape[0]
    index["rows"] = row
    clock["features"] = time.perf_counter()
    index["seconds"] = {k: round(clock[k] - clock[prev], 2) for prev, k in
                        (("start", "self_turns"), ("self_turns", "answers"), ("answers", "features"))}
    return index, np.concatenate(chunks, axis=0)


def build(cfg: CorpusConfig, models: tuple | None = None, progress: bool = True) -> dict:
    """Add shards until the corpus holds ``cfg.tokens`` answer tokens, the pool runs dry or the time cap
    passes; returns the manifest (also written to ``manifest.json``). ``models``: (features model,
    generating model, tokenizer), else loaded from ``cfg``."""
    from studylib.models import load_model
    from studylib.progress import progress_bar

    t0 = time.monotonic()
    if models is None:
        feat_model, tokenizer = load_model(cfg.model, "cpu", "float32")
        gen_model, _ = load_model(cfg.model, "cpu", "float32", weights=cfg.weights, act=cfg.act)
    else:
        feat_model, gen_model, tokenizer = models
    if feat_model.weights_format != "dense" or feat_model.dtype != torch.float32:
        raise StudylibError("the draft corpus takes its features from the dense float32 target.")
    base = corpus_dir(cfg, feat_model.config.name)
    docs = pool(tokenizer, cfg.seed, [k for k, v in cfg.per_shard.items() if int(v) > 0 and k != "self"])
    have = read_manifest(base)["answer_tokens"]
    bar = progress_bar(total=cfg.tokens, initial=min(have, cfg.tokens), desc="draft corpus (answer tokens)",
                       progress=progress, unit="tok")
    shard, stopped = 0, None
    while have < cfg.tokens:
        if cfg.max_minutes is not None and time.monotonic() - t0 > cfg.max_minutes * 60:
            stopped = "time cap"
            break
        dest = base / f"shard-{shard:05d}"
        if not dest.exists():
            index, feats = build_shard(cfg, shard, docs, gen_model, feat_model, tokenizer)
            if not index["prompts"]:
                stopped = "pool exhausted"
                break
            _write_shard(dest, index, feats)
            n = sum(len(a["ids"]) for a in index["answers"])
            have += n
            bar.update(min(n, max(cfg.tokens - bar.n, 0)))
        shard += 1
    bar.close()
    man = read_manifest(base)
    man.update({"key": cfg.key(), "config": asdict(cfg), "complete": man["answer_tokens"] >= cfg.tokens,
                "stopped": stopped, "path": str(base), "hash": corpus_hash(base)})
    (base / "manifest.json").write_text(json.dumps(man, indent=1))
    return man


def corpus_hash(base: Path) -> str:
    """sha256 over the shards' token ids and layout (prompts, answers, layers, rows; not the timings), in
    shard order: the data hash a head's manifest records. The features follow from these and the target.
    The sampled answers depend on how the engine batched them (``max_running``, the KV budget), so a
    rebuild under other settings is another corpus with another hash."""
    h = hashlib.sha256()
    for s in shard_dirs(base):
        idx = json.loads((s / "index.json").read_text())
        h.update(json.dumps({k: idx.get(k) for k in ("shard", "layers", "prompts", "answers", "rows")},
                            sort_keys=True).encode())
    return h.hexdigest()


_NQA_STORY: dict[str, str] = {}


def document_of(prompt_id: str, source: str) -> str:
    """The document a pool prompt comes from, so that held-out splits keep every prompt on one document
    together: an XSum article (all its tasks), a NarrativeQA story (its tasks and every question on it),
    a HumanEval problem, or the user turn itself."""
    if source in ("xsum", "story"):
        return prompt_id.split("#")[0]
    if source == "nqa":
        if not _NQA_STORY:
            from studylib.data import load_dataset

            for r in load_dataset("narrativeqa", split="draft"):
                _NQA_STORY[r.id] = "story-" + hashlib.sha256(r.meta["document"].encode()).hexdigest()[:10]
        return _NQA_STORY.get(prompt_id, prompt_id)
    return prompt_id


def _per_shard(text: str) -> dict:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, n = part.partition("=")
        if not sep or not n.strip().isdigit():
            raise StudylibError(f"--per-shard takes SOURCE=N pairs (e.g. xsum=4,self=32), got {part!r}.")
        out[name.strip()] = int(n)
    return out


def add_arguments(p) -> None:
    d = CorpusConfig()
    p.add_argument("--model", default=d.model)
    p.add_argument("--tokens", type=int, default=d.tokens, help="answer tokens to reach (default 2,000,000)")
    p.add_argument("--samples", type=int, default=d.samples, help="sampled answers per prompt beside the greedy one")
    p.add_argument("--temperature", type=float, default=d.temperature, help="of the sampled answers")
    p.add_argument("--max-new", type=int, default=d.max_new, help="longest answer (tokens)")
    p.add_argument("--max-prompt", type=int, default=d.max_prompt, help="longest prompt (tokens); longer are skipped")
    p.add_argument("--per-shard", default=",".join(f"{k}={v}" for k, v in d.per_shard.items()),
                   help="documents per shard per source: xsum, nqa, story, code, self")
    p.add_argument("--weights", default=d.weights, help="the generating engine's weights (default gguf)")
    p.add_argument("--act", default=d.act, help="the generating engine's activations (default int8)")
    p.add_argument("--max-running", type=int, default=d.max_running, help="requests decoded together")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-minutes", type=float, default=None, help="stop after the shard running then; rerun resumes")
    p.add_argument("--out", default=None, help="corpus folder (default: the cache, named by the corpus key)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")


def run(args) -> int:
    from studylib.models.weights import check_act, check_weights

    check_weights(args.weights, args.model, "cpu")
    check_act(args.act, args.weights)
    cfg = CorpusConfig(model=args.model, tokens=args.tokens, samples=args.samples, temperature=args.temperature,
                       max_new=args.max_new, max_prompt=args.max_prompt, per_shard=_per_shard(args.per_shard),
                       weights=args.weights, act=args.act, max_running=args.max_running, seed=args.seed,
                       max_minutes=args.max_minutes, out=args.out)
    man = build(cfg)
    if args.json:
        print(json.dumps({k: v for k, v in man.items() if k != "config"}))
    else:
        state = "complete" if man["complete"] else f"stopped ({man['stopped']}); rerun the same command to resume"
        print(f"draft corpus: {man['path']}: {man['answer_tokens']:,} answer tokens in {man['answers']:,} answers "
              f"to {man['prompts']:,} prompts ({man['shards']} shards), {state}")
    return 0
