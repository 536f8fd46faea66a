"""Serving workloads: what arrives, when, and how much each request asks for.

- Arrivals: Poisson at ``rate`` requests/s (exponential gaps), or gamma gaps with a ``burstiness``
  factor (shape; 1 = Poisson, < 1 burstier, > 1 more regular; vLLM's ``--burstiness``). ``rate=inf``
  sends everything at t = 0 (saturation). Seeded.
- Contents: a data set from ``studylib.data.load_workload`` ("chat", "xsum", "humaneval", ...); output
  budgets come from the data set's reference answers where it has them (xsum summaries, HumanEval
  solutions), capped at ``max_new_tokens``; "synthetic" draws random token ids (for tiny models).
- Files: JSONL with ``id``, ``prompt`` (text) or ``messages`` (chat), ``max_new_tokens`` and an optional
  ``arrival_s``; every line is validated and errors name the line.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studylib.errors import StudylibError
from studylib.prompts import jsonl_objects
from studylib.serving.request import Request


@dataclass
class WorkloadItem:
    id: str
    max_new_tokens: int
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None  # pre-tokenised (synthetic workloads, tests)
    arrival_s: float | None = None


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """``n`` arrival times (s), the first at 0, gaps ~ Gamma(shape=burstiness, mean=1/rate)."""
    if n < 0:
        raise StudylibError(f"the number of requests must be >= 0, got {n}.")
    if not rate > 0:
        raise StudylibError(f"the request rate must be > 0 requests/s (inf = all at once), got {rate}.")
    if not burstiness > 0:
        raise StudylibError(f"burstiness must be > 0 (1 = Poisson), got {burstiness}.")
    if math.isinf(rate) or n == 0:
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def read_workload(path: str | Path) -> list[WorkloadItem]:
    """Parse a workload JSONL file (see the module docstring); StudylibError names the bad line."""
    path = Path(path)
    items: list[WorkloadItem] = []
    seen: set[str] = set()
    for where, obj in jsonl_objects(path, "workload", "id, prompt or messages, max_new_tokens"):
        unknown = sorted(set(obj) - {"id", "prompt", "messages", "max_new_tokens", "arrival_s"})
        if unknown:
            raise StudylibError(f"{where} has unknown field(s) {unknown}; allowed: id, prompt, messages, "
                                "max_new_tokens, arrival_s.")
        if "id" not in obj:
            raise StudylibError(f"{where} has no 'id'; give each request a unique id.")
        rid = str(obj["id"])
        if rid in seen:
            raise StudylibError(f"{where} repeats id {rid!r}; ids must be unique.")
        seen.add(rid)
        prompt, messages = obj.get("prompt"), obj.get("messages")
        if (prompt is None) == (messages is None):
            raise StudylibError(f"{where} needs exactly one of 'prompt' (text) or 'messages' (chat).")
        if prompt is not None and (not isinstance(prompt, str) or not prompt):
            raise StudylibError(f"{where}: 'prompt' must be a non-empty string.")
        if messages is not None and (not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages)):
            raise StudylibError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects.")
        mnt = obj.get("max_new_tokens")
        if isinstance(mnt, bool) or not isinstance(mnt, int) or mnt < 1:
            raise StudylibError(f"{where}: 'max_new_tokens' must be an integer >= 1, got {mnt!r}.")
        arr = obj.get("arrival_s")
        if arr is not None and (isinstance(arr, bool) or not isinstance(arr, int | float)
                                or not math.isfinite(arr) or arr < 0):
            raise StudylibError(f"{where}: 'arrival_s' must be a number >= 0 (seconds), got {arr!r}.")
        items.append(WorkloadItem(rid, mnt, prompt, messages, None, None if arr is None else float(arr)))
    if not items:
        raise StudylibError(f"workload file {path} holds no requests.")
    return items


def _output_budget(meta: dict, tokenizer, cap: int, floor: int | None, rng: random.Random) -> int:
    """The data set's reference answer length in tokens, capped at ``cap``. Without a reference (our
    chat set has none): uniform in [floor, cap] when ``floor`` is given, else ``cap``."""
    ref = meta.get("reference") or meta.get("canonical_solution")
    if ref and tokenizer is not None:
        return max(1, min(cap, len(tokenizer(ref)["input_ids"])))
    return rng.randint(min(floor, cap), cap) if floor is not None else cap


def dataset_workload(name: str, n: int, seed: int = 0, max_new_tokens: int = 64, tokenizer=None,
                     max_chars: int | None = None, min_new_tokens: int | None = None) -> list[WorkloadItem]:
    """``n`` requests from a data set; the set is cycled (reshuffled with the seed) when ``n`` is larger.
    ``min_new_tokens`` spreads the output budgets of records without a reference answer."""
    from studylib.data import load_workload

    records = load_workload(name, None, seed, max_chars)
    rng = random.Random(seed)
    order: list = []
    while len(order) < n:
        rng.shuffle(records)
        order.extend(records)
    items = []
    for i, rec in enumerate(order[:n]):
        budget = _output_budget(rec.meta, tokenizer, max_new_tokens, min_new_tokens, rng)
        items.append(WorkloadItem(f"{rec.id}#{i}", budget, rec.prompt, rec.messages))
    return items


def synthetic_workload(n: int, seed: int = 0, vocab: int = 259, prompt_len: tuple[int, int] = (8, 64),
                       output_len: tuple[int, int] = (4, 32), shared_prefix: int = 0) -> list[WorkloadItem]:
    """Random token prompts (ids >= 3, avoiding the byte tokenizer's specials) with lengths uniform in
    the given inclusive ranges; the first ``shared_prefix`` tokens are common to all requests."""
    rng = random.Random(seed)
    stem = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    items = []
    for i in range(n):
        body = [rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_len))]
        items.append(WorkloadItem(f"syn-{i}", rng.randint(*output_len), prompt_ids=stem + body))
    return items


DEFAULT_NUM_REQUESTS = 16


def make_workload(name: str, n: int | None = None, seed: int = 0, max_new_tokens: int = 64, tokenizer=None,
                  max_chars: int | None = None) -> list[WorkloadItem]:
    """A named workload ("synthetic", a data set name) or a JSONL file path. ``n`` requests; None means
    every request of a file, ``DEFAULT_NUM_REQUESTS`` of a data set or the synthetic generator."""
    if n is not None and n < 1:
        raise StudylibError(f"the number of requests must be >= 1, got {n}.")
    if name != "synthetic" and (name.endswith(".jsonl") or Path(name).is_file()):
        items = read_workload(name)
        return items if n is None else items[:n]
    n = DEFAULT_NUM_REQUESTS if n is None else n
    if name == "synthetic":
        return synthetic_workload(n, seed, vocab=getattr(tokenizer, "vocab_size", 259) or 259,
                                  output_len=(max(1, max_new_tokens // 2), max_new_tokens))
    return dataset_workload(name, n, seed, max_new_tokens, tokenizer, max_chars)


def to_requests(items: list[WorkloadItem], tokenizer, *, rate: float = math.inf, burstiness: float = 1.0,
                seed: int = 0, max_new_tokens: int | None = None, ignore_eos: bool = False) -> list[Request]:
    """Tokenise ``items`` and give each an arrival time: its own ``arrival_s`` if the file had one,
    else from ``rate`` / ``burstiness``. ``max_new_tokens`` (if given) caps every request."""
    from studylib.prompts import PromptRecord, encode

    times = arrival_times(len(items), rate, burstiness, seed)
    out = []
    for item, t in zip(items, times, strict=True):
        if item.prompt_ids is not None:
            ids = list(item.prompt_ids)
        else:
            ids = encode(tokenizer, PromptRecord(item.id, prompt=item.prompt, messages=item.messages))
        budget = item.max_new_tokens if max_new_tokens is None else min(item.max_new_tokens, max_new_tokens)
        arrival = item.arrival_s if item.arrival_s is not None else t
        out.append(Request(item.id, ids, budget, arrival_s=arrival, ignore_eos=ignore_eos))
    return out
