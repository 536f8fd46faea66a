"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): draft gamma tokens, verify in one pass.

Every step feeds the target ``[last committed token] + draft`` (gamma + 1 tokens) in ONE forward and
hands the gamma + 1 next-token distributions to ``verify``, which accepts a prefix of the draft and
adds one target token (the correction, or a bonus after full acceptance). The step therefore commits
between 1 and gamma + 1 tokens and the output is exactly what AR decoding would produce (greedy) or
is distributed exactly like it (sampling), whatever the draft is.

KV bookkeeping: the target cache always holds the committed text minus its last token. A verify pass
writes gamma + 1 slots and is truncated back to the accepted ones, so the cache equals a fresh
prefill of the committed text (see tests). The draft keeps its own cache in step (``drafts``).

``speculate`` is the shared loop; prompt lookup reuses it with an n-gram proposer.

Adaptive gamma (``gamma="adaptive"``): per-token acceptance is modelled as i.i.d. with probability
alpha, so a step accepts a truncated-geometric number of tokens. alpha is estimated online as
accepted / (accepted + rejections), with counts decayed by ``DECAY`` per step (recent text matters
more) and a prior of one pseudo-acceptance and one pseudo-rejection. Before each step we pick the
gamma in 1..gamma_max that maximises the predicted speedup E[tokens](alpha, gamma) / (v(gamma) + gamma * c),
where c is the draft/target cost ratio (weights read per token, ``cost_model.layer_cost``, unless given) and
v(gamma) the cost of verifying gamma + 1 tokens relative to one AR step (1 unless a measured curve is
given: on a GPU it is ~1, on a CPU it grows with gamma and the rule then prefers short drafts).
It is deterministic, so a seeded sampling run is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from studylib.decoding.common import Stopwatch, check_lengths, clip_at_stop, eos_set
from studylib.decoding.cost_model import expected_tokens, predicted_speedup
from studylib.decoding.drafts import DraftSession, ModelDraft, SelfDraft, resolve_draft
from studylib.decoding.result import GenerationResult
from studylib.decoding.verify import verify
from studylib.errors import StudylibError
from studylib.kvcache.dense_bridge import prefill
from studylib.models import DenseKVCache, LlamaModel
from studylib.sampling import SamplingParams, sample

DECAY = 0.8


@dataclass
class AdaptiveGamma:
    """Online gamma from a decayed estimate of alpha (module docstring)."""

    cost_ratio: float
    gamma_max: int = 8
    # verify_cost[n - 1]: cost of a target forward over n tokens relative to one token (None: all 1).
    verify_cost: Sequence[float] | None = None
    accepted: float = 1.0
    rejected: float = 1.0

    def __post_init__(self) -> None:
        if self.gamma_max < 1:
            raise StudylibError(f"gamma_max must be >= 1, got {self.gamma_max}.")
        if self.cost_ratio < 0:
            raise StudylibError(f"cost_ratio must be >= 0, got {self.cost_ratio}.")
        if self.verify_cost is not None and len(self.verify_cost) < self.gamma_max + 1:
            raise StudylibError(f"verify_cost needs {self.gamma_max + 1} entries (forwards of 1..gamma_max + 1 "
                                f"tokens), got {len(self.verify_cost)}.")

    def _v(self, gamma: int) -> float:
        return 1.0 if self.verify_cost is None else float(self.verify_cost[gamma])

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def next(self) -> int:
        a = self.alpha
        return max(range(1, self.gamma_max + 1), key=lambda g: predicted_speedup(a, g, self.cost_ratio, self._v(g)))

    def update(self, accepted: int, proposed: int) -> None:
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (1.0 if accepted < proposed else 0.0)


@dataclass
class _Counts:
    proposed: int = 0
    accepted: int = 0
    rejections: int = 0
    gammas: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0

    def alpha(self) -> float | None:
        """MLE of the per-token acceptance probability under the truncated-geometric model."""
        n = self.accepted + self.rejections
        return self.accepted / n if n else None


def speculate(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams,
    tokenizer,
    open_session: Callable[[DenseKVCache, int], DraftSession],
    gamma: int | AdaptiveGamma,
    method: str,
    on_step: Callable[[DenseKVCache, list[int]], None] | None = None,
    verifier: Callable | None = None,
    prefix_store=None,
) -> GenerationResult:
    """The propose-verify-commit loop. ``on_step(target_cache, committed_ids)`` is a test hook;
    ``verifier`` is swappable so the chapter can show its statistical test catches a broken one;
    ``prefix_store`` (a ``kvcache.dense_bridge.PrefixStore``) reuses the target's cached prompt prefix."""
    cap = check_lengths(model, prompt_ids, max_new_tokens)
    eos = eos_set(model, tokenizer)
    gen = sampling.generator(model.device)
    clock = Stopwatch(model.device)
    cache, logits = prefill(model, prompt_ids, cap, prefix_store)  # logits: (1, V)
    first = int(sample(logits, sampling, gen).item())
    ttft = clock.elapsed()
    seq = [int(t) for t in prompt_ids] + [first]
    out = [first]
    lengths: list[int] = []
    stats = _Counts()
    stop = "eos" if first in eos else "length"
    session = open_session(cache, cap)
    while stop != "eos" and len(out) < max_new_tokens:
        remaining = max_new_tokens - len(out)
        # Never draft past the budget: a step commits at most gamma + 1 tokens.
        g = min(gamma.next() if isinstance(gamma, AdaptiveGamma) else gamma, remaining - 1)
        t0 = clock.now()
        draft, q = session.propose(seq, g, sampling, gen) if g > 0 else ([], None)
        t1 = clock.now()
        start = cache.length  # == len(seq) - 1
        block = torch.tensor([seq[-1], *draft], dtype=torch.long, device=model.device)[None]  # (1, n+1)
        target_logits = model(block, cache.begin(block.shape[1])).logits[0]  # (n+1, V)
        n_acc, nxt = (verifier or verify)(target_logits, draft, sampling, gen, q)
        cache.truncate(start + 1 + n_acc)
        stats.draft_s += t1 - t0
        stats.verify_s += clock.now() - t1
        new, hit = clip_at_stop([*draft[:n_acc], nxt], eos, remaining)
        seq += new
        out += new
        lengths.append(len(new))
        session.rollback(cache.length)
        if draft:
            stats.proposed += len(draft)
            stats.accepted += n_acc
            stats.rejections += int(n_acc < len(draft))
            stats.gammas.append(len(draft))
            if isinstance(gamma, AdaptiveGamma):
                gamma.update(n_acc, len(draft))
        else:
            stats.gammas.append(0)
        if on_step is not None:
            on_step(cache, seq)
        if hit:
            stop = "eos"
    wall = clock.elapsed()
    hit = None
    if prefix_store is not None:
        hit = prefix_store.last_hit
        prefix_store.store(seq, cache)
    steps = len(lengths)
    extra = {
        "alpha": stats.alpha(),
        "accept_rate": stats.accepted / stats.proposed if stats.proposed else None,
        "proposed": stats.proposed,
        "accepted": stats.accepted,
        "rejections": stats.rejections,
        "draft_forwards": session.forwards,
        "gamma_trace": stats.gammas,
        # Seconds per draft forward over seconds per verify forward: the measured cost ratio c.
        "measured_cost_ratio": (stats.draft_s / session.forwards) / (stats.verify_s / steps)
        if session.forwards and steps and stats.verify_s > 0 else None,
        "draft_s": stats.draft_s,
        "verify_s": stats.verify_s,
        **({"prefix_hit_tokens": hit} if hit is not None else {}),
    }
    return GenerationResult(
        token_ids=out, text=tokenizer.decode(out) if tokenizer is not None else "", new_tokens=len(out),
        target_forwards=1 + steps, steps=steps, accepted_lengths=lengths, ttft_s=ttft, wall_s=wall,
        prompt_tokens=len(prompt_ids), method=method, stop_reason=stop, extra=extra,
    )


def make_gamma(gamma: int | str, cost_ratio: float, gamma_max: int = 8,
               verify_cost: Sequence[float] | None = None) -> int | AdaptiveGamma:
    if gamma == "adaptive":
        return AdaptiveGamma(cost_ratio=cost_ratio, gamma_max=gamma_max, verify_cost=verify_cost)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise StudylibError(f"gamma must be an integer >= 1 or 'adaptive', got {gamma!r}.")
    return gamma


@torch.inference_mode()
def generate(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    tokenizer: object | None = None,
    draft: str | LlamaModel | ModelDraft | SelfDraft | None = None,
    gamma: int | str | None = None,
    gamma_max: int = 8,
    cost_ratio: float | None = None,
    verify_cost: Sequence[float] | None = None,
    on_step: Callable[[DenseKVCache, list[int]], None] | None = None,
    prefix_store=None,
    tree: str | None = None,
) -> GenerationResult:
    """Speculative decoding with ``draft`` (a spec string, a LlamaModel or a resolved drafter).

    gamma: draft length (default 4), or "adaptive" (module docstring) up to ``gamma_max``; cost_ratio and
    verify_cost (relative cost of a target forward over 1..gamma_max + 1 tokens) feed the adaptive rule.
    An EAGLE draft (``eagle``, ``eagle:full``, an ``EagleDraft``) goes to ``eagle.generate``: ``gamma``
    drafts a chain, ``tree`` ("DEPTH,TOPK,NODES") a token tree, neither the head's default tree.
    """
    from studylib.decoding import eagle

    if isinstance(draft, eagle.EagleDraft) or (isinstance(draft, str) and draft.split(":")[0] == "eagle"):
        if gamma == "adaptive":
            raise StudylibError("an EAGLE draft takes --gamma K (a chain) or --tree DEPTH,TOPK,NODES, not adaptive.")
        res = eagle.generate(model, prompt_ids, max_new_tokens, sampling, tokenizer, draft=draft, tree=tree,
                             gamma=gamma, on_step=on_step)
        res.method = "speculative"
        return res
    if tree is not None:
        raise StudylibError("--tree applies to an EAGLE draft (--draft eagle); a model draft drafts a chain (--gamma).")
    gamma = 4 if gamma is None else gamma
    drafter = resolve_draft(draft, model)
    c = drafter.cost_ratio(model) if cost_ratio is None else cost_ratio
    policy = make_gamma(gamma, c, gamma_max, verify_cost)
    res = speculate(
        model, prompt_ids, max_new_tokens, sampling, tokenizer,
        lambda cache, cap: drafter.session(model, cache, cap), policy, "speculative", on_step,
        prefix_store=prefix_store,
    )
    res.extra.update(draft=drafter.describe(), gamma=gamma, cost_ratio_estimate=c)
    return res


__all__ = ["AdaptiveGamma", "expected_tokens", "generate", "make_gamma", "predicted_speedup", "resolve_draft",
           "speculate"]
