"""Jacobi parallel decoding (Santilli et al. 2023), greedy and exact.

Greedy decoding is a fixed-point problem: the n tokens after the committed text must each equal the
argmax given everything before them. Jacobi decoding guesses all n at once and refines every guess
in parallel, one forward per iteration, instead of solving them one by one.

One iteration over a block with ``r`` unresolved positions feeds ``[c, g_1 .. g_{r-1}]`` (c = last
committed token, g = current guesses) and reads ``r`` argmaxes ``y_0 .. y_{r-1}``. ``y_0`` is exact;
``y_i`` is exact when every guess before it was already right (g_j == y_{j-1} for j <= i). So each
iteration commits the longest such prefix (at least one token, as AR would) and keeps ``y`` as the
next guesses for the rest. That commit rule is exactly greedy verification of the guesses, so the
output is token-identical to AR, and a block of n resolves in at most n iterations.

The KV cache keeps only the committed part: after an iteration the slots of ``c`` and the accepted
guesses are valid (their inputs were right), everything after them is rolled back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from studylib.decoding.common import Stopwatch, as_ids, check_lengths, clip_at_stop, eos_set
from studylib.decoding.result import GenerationResult
from studylib.decoding.verify import verify_greedy
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, LlamaModel
from studylib.sampling import SamplingParams

INITS = ("pad", "random", "prompt")


@dataclass(frozen=True)
class JacobiConfig:
    block: int = 8  # n: positions guessed and refined together
    max_iters: int | None = None  # iterations per block before moving on (None: block, always enough)
    init: str = "pad"  # first guess: pad token | random tokens | copy from the context (see _initial)
    seed: int = 0  # for init="random"

    def __post_init__(self) -> None:
        if self.block < 1:
            raise StudylibError(f"--block must be >= 1 (1 is plain AR decoding), got {self.block}.")
        if self.max_iters is not None and self.max_iters < 1:
            raise StudylibError(f"--max-iters must be >= 1, got {self.max_iters}.")
        if self.init not in INITS:
            raise StudylibError(f"--init must be one of {', '.join(INITS)}, got {self.init!r}.")

    @property
    def iters(self) -> int:
        return self.block if self.max_iters is None else self.max_iters


def require_greedy(sampling: SamplingParams, method: str) -> None:
    if not sampling.greedy:
        raise StudylibError(
            f"--method {method} is implemented as a greedy-exact decoder (as in its paper); use "
            "--temperature 0, or --method speculative for exact sampling at temperature > 0."
        )


class _Guesser:
    """Initial guesses for a fresh block."""

    def __init__(self, cfg: JacobiConfig, vocab: int, pad: int):
        self.cfg, self.vocab, self.pad = cfg, vocab, pad
        self.gen = torch.Generator().manual_seed(cfg.seed)

    def __call__(self, m: int, context: list[int]) -> list[int]:
        if self.cfg.init == "random":
            return torch.randint(0, self.vocab, (m,), generator=self.gen).tolist()
        if self.cfg.init == "prompt":
            # Copy what followed the latest earlier occurrence of the last token: text often repeats.
            last = context[-1]
            for i in range(len(context) - 2, -1, -1):
                if context[i] == last:
                    copied = context[i + 1 : i + 1 + m]
                    return copied + [self.pad] * (m - len(copied))
        return [self.pad] * m


@torch.inference_mode()
def generate(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    tokenizer: object | None = None,
    block: int = 8,
    max_iters: int | None = None,
    init: str = "pad",
    seed: int = 0,
    trace: bool = False,
) -> GenerationResult:
    """Jacobi decoding. ``trace=True`` records every iteration's block state in ``extra["trajectory"]``."""
    cfg = JacobiConfig(block, max_iters, init, seed)
    require_greedy(sampling, "jacobi")
    cap = check_lengths(model, prompt_ids, max_new_tokens, slack=cfg.block)
    eos = eos_set(model, tokenizer)
    pad = getattr(tokenizer, "pad_token_id", None)
    guesser = _Guesser(cfg, model.config.vocab_size, int(pad) if pad is not None else 0)
    clock = Stopwatch(model.device)
    cache = DenseKVCache(model.config, 1, cap, model.device, model.dtype)
    ids = as_ids(prompt_ids, model.device)
    first = model(ids, cache.begin(ids.shape[1]), logits="last").logits[0, -1]
    out = [int(first.argmax())]
    ttft = clock.elapsed()
    context = [int(t) for t in prompt_ids] + out
    forward_tokens, accepted, iters_per_block, blocks = [ids.shape[1]], [], [], []
    stop = "eos" if out[0] in eos else "length"

    while stop == "length" and len(out) < max_new_tokens:
        m = min(cfg.block, max_new_tokens - len(out))
        guesses = guesser(m, context)  # guesses for the m positions after c
        done: list[int] = []  # tokens of this block committed so far
        states = [{"iter": 0, "tokens": list(guesses), "fixed": 0}]
        it = 0
        while len(done) < m and it < cfg.iters and stop == "length":
            r = m - len(done)
            start = cache.length
            inp = torch.tensor([[context[-1], *guesses[: r - 1]]], device=model.device)  # (1, r)
            logits = model(inp, cache.begin(r)).logits[0]  # (r, V)
            forward_tokens.append(r)
            it += 1
            n_ok, nxt = verify_greedy(logits, guesses[: r - 1])
            refined = logits.argmax(-1).tolist()  # y_0 .. y_{r-1}
            cache.truncate(start + n_ok + 1)  # c and the n_ok right guesses have valid KV
            commit, hit_eos = clip_at_stop([*guesses[:n_ok], nxt], eos, max_new_tokens - len(out))
            out += commit
            context += commit
            done += commit
            accepted.append(len(commit))
            guesses = refined[n_ok + 1 :]
            if hit_eos:
                stop = "eos"
            if trace:
                states.append({"iter": it, "tokens": done + guesses, "fixed": len(done)})
        iters_per_block.append(it)
        if trace:
            blocks.append({"start": len(out) - len(done), "size": m, "final": done, "states": states})

    extra = {"block": cfg.block, "init": cfg.init, "iters_per_block": iters_per_block,
             "forward_tokens": forward_tokens}
    if trace:
        extra["trajectory"] = blocks
    return GenerationResult(
        token_ids=out, text=tokenizer.decode(out) if tokenizer is not None else "", new_tokens=len(out),
        target_forwards=len(forward_tokens), steps=len(accepted), accepted_lengths=accepted,
        ttft_s=ttft, wall_s=clock.elapsed(), prompt_tokens=len(prompt_ids), method="jacobi",
        stop_reason=stop, extra=extra,
    )
