"""Seeded shared-prefix workloads for chapter 4, built from the study's data (``studylib.data``).

Five shapes, each a list of requests in arrival order:

- ``system_prompt``: one long system prompt (NarrativeQA stories) shared by many questions about it;
- ``few_shot``: prompts sharing k worked examples, drawn from a few example sets (one per "task");
- ``multi_turn``: chats where each turn extends the last *including the model's own reply*
  (closed loop: the next prompt is the previous prompt + its output + the new user turn);
- ``tree_of_thought``: branches of reasoning steps growing from one problem statement;
- ``no_sharing``: unrelated single-turn prompts, the control.

Prompts are token ids, assembled from separately encoded segments (a system turn, user turns, the
generation prompt), so the shared part of two prompts is *exactly* the same ids by construction,
never an accident of how a tokenizer merges across a boundary. With a chat model the segments use
its ChatML markers; with the byte tokenizer of the random models they use plain ``<role>`` tags.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from studylib.data import load_dataset, load_prompts
from studylib.errors import StudylibError

WORKLOADS = ("system_prompt", "few_shot", "multi_turn", "tree_of_thought", "no_sharing")


@dataclass
class PrefixRequest:
    id: str
    tokens: list[int]  # the prompt; for a follow-up turn, only what the client adds to the history
    max_new_tokens: int
    group: str  # what the request shares with: a system prompt, an example set, a chat, a tree
    follows: str | None = None  # closed loop: the prompt is follows' prompt + its output + close + tokens
    close: list[int] = field(default_factory=list)  # ends the previous assistant turn (follow-ups only)


@dataclass
class PrefixWorkload:
    name: str
    requests: list[PrefixRequest]
    description: str

    def prompt(self, req: PrefixRequest, done: Mapping[str, tuple[list[int], list[int]]],
               eos: set[int] = frozenset()) -> list[int]:
        """The full prompt of ``req``; ``done`` maps finished request ids to (prompt, output)."""
        if req.follows is None:
            return list(req.tokens)
        if req.follows not in done:
            raise StudylibError(f"request {req.id!r} follows {req.follows!r}, which has not run yet.")
        prev_prompt, prev_out = done[req.follows]
        reply = list(prev_out[:-1] if prev_out and prev_out[-1] in eos else prev_out)
        return list(prev_prompt) + reply + list(req.close) + list(req.tokens)


class _Chat:
    """Encodes chat segments for ``tokenizer``: ChatML when it has the markers, plain tags otherwise."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.chatml = len(tokenizer.encode("<|im_start|>", add_special_tokens=False)) == 1

    def ids(self, text: str) -> list[int]:
        return [int(i) for i in self.tok.encode(text, add_special_tokens=False)]

    def turn(self, role: str, content: str) -> list[int]:
        return self.ids(f"<|im_start|>{role}\n{content}<|im_end|>\n" if self.chatml else f"<{role}>{content}\n")

    def open_turn(self, role: str) -> list[int]:
        return self.ids(f"<|im_start|>{role}\n" if self.chatml else f"<{role}>")

    def close(self) -> list[int]:
        return self.ids("<|im_end|>\n" if self.chatml else "\n")

    def generation_prompt(self) -> list[int]:
        return self.open_turn("assistant")


def _answer(meta: dict) -> str:
    """NarrativeQA's first reference answer (the raw field is a printed Python list)."""
    raw = meta.get("answers", "")
    raw = "".join(raw) if isinstance(raw, list) and all(len(str(a)) <= 1 for a in raw) else raw
    if isinstance(raw, str) and raw.startswith("["):
        try:
            raw = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            pass
    return str(raw[0] if isinstance(raw, list) and raw else raw).strip()


def _stories(seed: int) -> list[tuple[str, list[dict]]]:
    """NarrativeQA stories in a seeded order, each with its question records."""
    by_doc: dict[str, list[dict]] = {}
    for r in load_dataset("narrativeqa"):
        by_doc.setdefault(r.meta["document"], []).append(r.meta)
    docs = sorted(by_doc)
    random.Random(seed).shuffle(docs)
    return [(d, by_doc[d]) for d in docs]


def system_prompt(tokenizer, *, n_requests: int = 16, system_tokens: int = 1024, max_new_tokens: int = 16,
                  seed: int = 0) -> PrefixWorkload:
    """One system prompt of exactly ``system_tokens`` tokens (instructions + stories), then questions."""
    chat = _Chat(tokenizer)
    head = chat.open_turn("system") + chat.ids(
        "You answer questions about the stories below in one short sentence.\n\n")
    tail = chat.close()
    body: list[int] = []
    questions: list[str] = []
    for doc, metas in _stories(seed):
        if len(head) + len(body) + len(tail) >= system_tokens and len(questions) >= n_requests:
            break
        body += chat.ids(doc + "\n\n")
        questions += [m["question"] for m in metas]
    room = system_tokens - len(head) - len(tail)
    if room < 1:
        raise StudylibError(f"system_tokens={system_tokens} is too short for the instructions; use >= 64.")
    system = head + body[:room] + tail
    g = random.Random(seed)
    asked = g.sample(questions[: max(n_requests, 30)], n_requests)
    reqs = [PrefixRequest(f"sys-{i:02d}", system + chat.turn("user", q) + chat.generation_prompt(),
                          max_new_tokens, "system") for i, q in enumerate(asked)]
    return PrefixWorkload("system_prompt", reqs,
                          f"one {len(system)}-token system prompt (NarrativeQA stories) + {n_requests} questions")


def few_shot(tokenizer, *, n_requests: int = 12, k: int = 8, n_groups: int = 2, max_new_tokens: int = 16,
             seed: int = 0) -> PrefixWorkload:
    """Each request: an instruction, the k examples of its task, then a new question."""
    chat = _Chat(tokenizer)
    pool = [m for _, metas in _stories(seed + 1) for m in metas if _answer(m)]
    g = random.Random(seed)
    g.shuffle(pool)
    need = n_groups * k + n_requests
    if len(pool) < need:
        raise StudylibError(f"few_shot needs {need} question/answer pairs; NarrativeQA has {len(pool)}.")
    groups = [pool[i * k : (i + 1) * k] for i in range(n_groups)]
    fresh = pool[n_groups * k : need]
    reqs = []
    for i in range(n_requests):
        gi = g.randrange(n_groups)
        shots = "".join(f"Q: {m['question']}\nA: {_answer(m)}\n\n" for m in groups[gi])
        prefix = chat.turn("system", f"Answer like the examples (task {gi + 1}).\n\n{shots}".rstrip())
        q = chat.turn("user", f"Q: {fresh[i]['question']}")
        reqs.append(PrefixRequest(f"shot-{i:02d}", prefix + q + chat.generation_prompt(), max_new_tokens,
                                  f"task{gi + 1}"))
    return PrefixWorkload("few_shot", reqs, f"{n_requests} questions, {k} shared examples from {n_groups} tasks")


def multi_turn(tokenizer, *, n_conversations: int = 3, turns: int = 4, max_new_tokens: int = 32,
               seed: int = 0) -> PrefixWorkload:
    """Interleaved chats; every turn after the first extends the previous prompt + reply (closed loop)."""
    chat = _Chat(tokenizer)
    prompts = [r.messages[0]["content"] for r in load_prompts()]
    g = random.Random(seed)
    g.shuffle(prompts)
    if len(prompts) < n_conversations * turns:
        raise StudylibError(f"multi_turn needs {n_conversations * turns} user turns; the chat set has {len(prompts)}.")
    system = chat.turn("system", "You are a helpful assistant. Keep answers short.")
    reqs = []
    for t in range(turns):  # round-robin: several users talk at once, so their chats compete for the pool
        for c in range(n_conversations):
            user = chat.turn("user", prompts[c * turns + t]) + chat.generation_prompt()
            rid, prev = f"chat{c}-t{t}", f"chat{c}-t{t - 1}"
            if t == 0:
                reqs.append(PrefixRequest(rid, system + user, max_new_tokens, f"chat{c}"))
            else:
                reqs.append(PrefixRequest(rid, user, max_new_tokens, f"chat{c}", follows=prev, close=chat.close()))
    return PrefixWorkload("multi_turn", reqs, f"{n_conversations} interleaved chats x {turns} turns (closed loop)")


def tree_of_thought(tokenizer, *, branching: int = 3, depth: int = 2, max_new_tokens: int = 16,
                    seed: int = 0) -> PrefixWorkload:
    """A problem statement, then every node of a ``branching``-ary tree of reasoning steps (BFS order)."""
    chat = _Chat(tokenizer)
    g = random.Random(seed)
    problem = g.choice(load_prompts("reasoning")).messages[0]["content"]
    sentences = [s.strip() + "." for r in load_dataset("xsum", n=40, seed=seed)
                 for s in (r.meta.get("document") or r.prompt or "").split(". ") if 40 < len(s) < 200]
    g.shuffle(sentences)
    stem = chat.turn("system", "Explore several lines of reasoning, one step at a time.") + chat.open_turn("user") \
        + chat.ids(problem + "\nLet's think step by step.\n")
    reqs, frontier, used = [], [((), [])], 0
    for level in range(1, depth + 1):
        nxt = []
        for path, ids in frontier:
            for b in range(branching):
                step = chat.ids(f"Step {level}, idea {b + 1}: {sentences[used % len(sentences)]}\n")
                used += 1
                node = (path + (b,), ids + step)
                nxt.append(node)
                name = "-".join(str(i) for i in node[0])
                prompt = stem + node[1] + chat.close() + chat.generation_prompt()
                reqs.append(PrefixRequest(f"tot-{name}", prompt, max_new_tokens, "tree"))
        frontier = nxt
    return PrefixWorkload("tree_of_thought", reqs, f"branching {branching}, depth {depth}: {len(reqs)} nodes")


def no_sharing(tokenizer, *, n_requests: int = 12, max_new_tokens: int = 16, seed: int = 0) -> PrefixWorkload:
    """Unrelated single-turn chat prompts (no system prompt): nothing beyond the turn marker is shared."""
    chat = _Chat(tokenizer)
    records = load_prompts()
    g = random.Random(seed)
    picks = g.sample(records, n_requests)
    reqs = [PrefixRequest(f"solo-{i:02d}", chat.turn("user", r.messages[0]["content"]) + chat.generation_prompt(),
                          max_new_tokens, f"solo{i}") for i, r in enumerate(picks)]
    return PrefixWorkload("no_sharing", reqs, f"{n_requests} unrelated chat prompts")


BUILDERS = {"system_prompt": system_prompt, "few_shot": few_shot, "multi_turn": multi_turn,
            "tree_of_thought": tree_of_thought, "no_sharing": no_sharing}


def make_workload(name: str, tokenizer, seed: int = 0, **options) -> PrefixWorkload:
    if name not in BUILDERS:
        raise StudylibError(f"unknown prefix workload {name!r}; choose one of {list(WORKLOADS)}.")
    return BUILDERS[name](tokenizer, seed=seed, **options)


def optimal_hits(queries: Sequence[Sequence[int]], cached: Sequence[Sequence[int]], block_size: int = 1
                 ) -> list[int]:
    """What a prefix cache that never forgets could serve: for each request i, the longest prefix of
    ``queries[i]`` shared with any ``cached[j]``, j < i, rounded down to whole blocks.

    Pass each request's prompt minus its last token (always recomputed) as the query, and the text
    whose KV it leaves behind (prompt + output minus the last token) as its cached sequence.
    """
    out = []
    for i, q in enumerate(queries):
        best = 0
        for prev in cached[:i]:
            n, m = 0, min(len(prev), len(q))
            while n < m and prev[n] == q[n]:
                n += 1
            best = max(best, n)
        out.append(best // block_size * block_size)
    return out
