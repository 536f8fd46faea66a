"""Where speculative drafts come from: a separate small model, or the target itself with layers skipped.

Draft specs (``--draft`` on the CLI, ``draft=`` in ``speculative.generate``):
- a model name or path that ``load_model`` accepts and that shares the target's vocabulary
  (``tiny-random:1``, a local HF directory...);
- ``distilled``: the draft ``studylib train-draft`` made for this target (see ``draft_train``), with its
  LM head cut to the tokens the target emits most; ``distilled:full`` keeps the whole head;
- ``self:LAYERS``: the target skipping LAYERS, 0-based, ranges inclusive (``self:4-11,20``);
- ``self:exit:K``: early exit, i.e. the first K layers, then the target's final norm and LM head;
- ``self:auto`` / ``self:auto:K``: the skipped layers chosen by measurement (``self_spec``).

A drafter opens one *session* per request. A session owns whatever cache it needs and keeps it in
step with the committed text: its invariant is that the target cache holds every committed token but
the last one, which is the first input of the next verify block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from studylib.decoding.cost_model import layer_cost
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, LlamaModel
from studylib.models.cpu_linear import linear
from studylib.sampling import SamplingParams, probs, sample_from


def _pick(logits: torch.Tensor, sampling: SamplingParams, gen) -> tuple[int, torch.Tensor | None]:
    """Choose a draft token from (V,) logits; return it with the distribution it came from."""
    if sampling.greedy:
        return int(logits.argmax()), None
    q = probs(logits, sampling)  # (V,)
    return int(sample_from(q, gen)), q


@dataclass
class DraftSession:
    """Per-request draft state. ``propose`` returns (tokens, q (n, V) or None for greedy)."""

    forwards: int = 0

    def propose(self, seq: list[int], gamma: int, sampling: SamplingParams, gen) -> tuple[list[int], torch.Tensor | None]:
        raise NotImplementedError

    def rollback(self, committed: int) -> None:
        """The target cache now holds ``committed`` tokens (all committed text but the last token)."""


@dataclass
class ModelDraft:
    """A separate draft model with the target's vocabulary and its own dense KV cache.

    ``head_ids``: optional vocabulary subset (N,) for the draft's LM head. Projecting onto N rows
    instead of all V cuts the draft's largest matmul; tokens outside the subset get probability 0,
    which only lowers acceptance for them and keeps verification exact.
    """

    model: LlamaModel
    name: str = "draft"
    head_ids: torch.Tensor | None = None

    def cost_ratio(self, target: LlamaModel) -> float:
        cost = layer_cost(self.model)
        if self.head_ids is not None:
            cost -= (self.model.config.vocab_size - len(self.head_ids)) * self.model.config.hidden_size
        return cost / layer_cost(target)

    def check(self, target: LlamaModel) -> None:
        if self.model.config.vocab_size != target.config.vocab_size:
            raise StudylibError(
                f"the draft {self.name!r} has a vocabulary of {self.model.config.vocab_size} tokens but the target "
                f"has {target.config.vocab_size}; speculative decoding needs a draft with the same tokenizer."
            )

    def session(self, target: LlamaModel, target_cache: DenseKVCache, capacity: int) -> DraftSession:
        self.check(target)
        head = None
        if self.head_ids is not None:
            ids = self.head_ids.to(self.model.device)
            head = (ids, self.model.lm_head.weight.detach()[ids].contiguous())  # (N,), (N, hidden)
        return _ModelSession(model=self.model, head=head, cache=DenseKVCache(
            self.model.config, 1, capacity, self.model.device, self.model.dtype))

    def describe(self) -> str:
        return self.name


@dataclass
class _ModelSession(DraftSession):
    model: LlamaModel = None
    cache: DenseKVCache = None
    head: tuple[torch.Tensor, torch.Tensor] | None = None

    def _next_logits(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        if self.head is None:
            return self.model(ids, self.cache.begin(n), logits="last").logits[0, -1]  # (V,)
        rows, weight = self.head
        h = self.model(ids, self.cache.begin(n), logits="none", hidden_layers=(-1,)).hidden[-1][0, -1]  # (hidden,)
        full = torch.full((self.model.config.vocab_size,), float("-inf"), device=h.device)
        return full.index_copy_(0, rows, linear(h, weight).float())  # (V,), -inf outside the subset

    def propose(self, seq, gamma, sampling, gen):
        dev = self.model.device
        # Catch up on everything committed since the last proposal (the prompt, on the first call).
        pending = torch.tensor(seq[self.cache.length:], dtype=torch.long, device=dev)[None]  # (1, p)
        logits = self._next_logits(pending, pending.shape[1])
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(gamma):
            t, q = _pick(logits, sampling, gen)
            tokens.append(t)
            if q is not None:
                qs.append(q)
            if i + 1 < gamma:  # the last draft token is never fed: the target scores it
                logits = self._next_logits(torch.tensor([[t]], dtype=torch.long, device=dev), 1)
        self.forwards += gamma
        return tokens, (torch.stack(qs) if qs else None)

    def rollback(self, committed):
        # If every draft token was accepted the cache lacks the last one; the next call feeds it.
        if self.cache.length > committed:
            self.cache.truncate(committed)


@dataclass
class SelfDraft:
    """The target with ``skip_layers`` bypassed (layer skipping, or an early exit when the skipped
    layers are the top ones). It writes KV for its own layers into the target's cache at the draft
    slots; the verify pass then overwrites those slots in every layer, so nothing stale survives."""

    skip_layers: tuple[int, ...]
    label: str = ""
    calibration: dict = field(default_factory=dict)

    def cost_ratio(self, target: LlamaModel) -> float:
        return layer_cost(target, target.config.num_layers - len(self.skip_layers)) / layer_cost(target)

    def session(self, target: LlamaModel, target_cache: DenseKVCache, capacity: int) -> DraftSession:
        bad = [i for i in self.skip_layers if not 0 <= i < target.config.num_layers]
        if bad or len(set(self.skip_layers)) >= target.config.num_layers:
            raise StudylibError(f"cannot skip layers {list(self.skip_layers)} of a {target.config.num_layers}-layer "
                                "model; give 0-based layers and keep at least one.")
        return _SelfSession(model=target, cache=target_cache, skip=tuple(self.skip_layers))

    def describe(self) -> str:
        return self.label or f"self:{format_layers(self.skip_layers)}"


@dataclass
class _SelfSession(DraftSession):
    model: LlamaModel = None
    cache: DenseKVCache = None
    skip: tuple[int, ...] = ()

    def propose(self, seq, gamma, sampling, gen):
        start = self.cache.length  # == len(seq) - 1: the last committed token is not cached yet
        x = torch.tensor([[seq[-1]]], dtype=torch.long, device=self.model.device)
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for _ in range(gamma):
            logits = self.model(x, self.cache.begin(1), logits="last", skip_layers=self.skip).logits[0, -1]
            t, q = _pick(logits, sampling, gen)
            tokens.append(t)
            if q is not None:
                qs.append(q)
            x = torch.tensor([[t]], dtype=torch.long, device=self.model.device)
        self.cache.truncate(start)
        self.forwards += gamma
        return tokens, (torch.stack(qs) if qs else None)


def parse_layers(text: str, num_layers: int) -> tuple[int, ...]:
    """'4-11,20' -> (4, 5, ..., 11, 20)."""
    out: set[int] = set()
    try:
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise StudylibError(f"cannot parse layers {text!r}; write 0-based layers and ranges like self:4-11,20.") from None
    if not out or min(out) < 0 or max(out) >= num_layers:
        raise StudylibError(f"layers {text!r} are outside 0..{num_layers - 1}; the target has {num_layers} layers.")
    return tuple(sorted(out))


def format_layers(layers: Sequence[int]) -> str:
    parts, run = [], []
    for i in sorted(layers):
        if run and i != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(i)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def resolve_draft(spec, target: LlamaModel):
    """Turn a draft spec (see the module docstring), a LlamaModel or a drafter into a drafter."""
    if isinstance(spec, ModelDraft | SelfDraft):
        return spec
    if isinstance(spec, LlamaModel):
        d = ModelDraft(spec, spec.config.name)
        d.check(target)
        return d
    if not isinstance(spec, str) or not spec:
        raise StudylibError("speculative decoding needs a draft: --draft <model|distilled|self:LAYERS|self:exit:K|"
                            "self:auto>.")
    n = target.config.num_layers
    if spec.startswith("self:"):
        rest = spec[5:]
        if rest.startswith("exit:"):
            try:
                k = int(rest[5:])
            except ValueError:
                raise StudylibError(f"self:exit:K needs an integer K, got {spec!r}.") from None
            if not 1 <= k < n:
                raise StudylibError(f"self:exit:{k}: K must be in 1..{n - 1} for a {n}-layer target.")
            return SelfDraft(tuple(range(k, n)), label=spec)
        if rest == "auto" or rest.startswith("auto:"):
            from studylib.decoding.self_spec import choose_skip_layers

            budget = int(rest[5:]) if rest.startswith("auto:") else None
            layers, info = choose_skip_layers(target, budget=budget)
            return SelfDraft(tuple(layers), label=f"self:{format_layers(layers)}", calibration=info)
        return SelfDraft(parse_layers(rest, n), label=spec)
    if spec in ("distilled", "distilled:full"):
        return distilled_draft(target, full_head=spec.endswith(":full"))
    from studylib.models import load_model

    model, _ = load_model(spec, target.device, target.dtype)
    d = ModelDraft(model, Path(spec).name or spec)
    d.check(target)
    return d


def distilled_draft(target: LlamaModel, full_head: bool = False, path: str | Path | None = None) -> ModelDraft:
    """The draft ``studylib train-draft`` exported for this target (or in ``path``; see ``draft_train``)."""
    import json

    from studylib.decoding.draft_files import distilled_dir, load_draft_weights

    path = Path(path) if path is not None else distilled_dir(target.config.name)
    if not (path / "config.json").exists():
        raise StudylibError(f"no distilled draft for {target.config.name!r} in {path}; run "
                            f"`studylib train-draft --model {target.config.name}` first (or use --draft self:auto).")
    model = load_draft_weights(path, target.device, target.dtype)
    vocab = path / "draft_vocab.json"
    head = None
    if not full_head and vocab.exists() and json.loads(vocab.read_text()):
        head = torch.tensor(json.loads(vocab.read_text()), dtype=torch.long)
    d = ModelDraft(model, "distilled:full" if head is None else "distilled", head)
    d.check(target)
    return d
