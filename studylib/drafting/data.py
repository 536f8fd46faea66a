"""Distillation data for ``studylib train-draft``: text the target writes, with its own next-token
distributions recorded as it writes (top-k log-probs), so training needs no second target pass.

Prompts come from two sources, neither of which is a prompt the chapter evaluates on:
- ``chat``: our chat prompt set minus the held-out split (``is_heldout``) that chapter 2 evaluates;
- ``self``: user turns the target itself writes after the chat template's "user" header, sampled at
  temperature 1, then answered; this adds variety without touching any evaluation set.
Each prompt is answered once greedily (the T=0 text the draft must predict) and ``samples`` times at
``temperature`` (text near the T=1 regime). Generation is batched with left padding in our runtime.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import torch

from studylib.models import DenseKVCache, LlamaModel
from studylib.sampling import SamplingParams, probs, sample_from

HELDOUT_MOD = 3  # a third of each chat category is held out for evaluation
XSUM_HELDOUT_MOD = 4  # a quarter of the XSum articles is kept for chapter 2's evaluation (EAGLE trains on the rest)


def is_heldout(record_id: str) -> bool:
    """The chat prompts chapter 2 evaluates the distilled draft on; training never sees them.

    Ids end in a per-category number (``writing-04``): numbers 1, 4, 7, ... are held out, so every
    category keeps a third of its prompts for evaluation. Other ids fall back to a hash.
    """
    digits = re.search(r"(\d+)$", record_id)
    if digits:
        return int(digits.group(1)) % HELDOUT_MOD == 1
    return int(hashlib.sha256(record_id.encode()).hexdigest(), 16) % HELDOUT_MOD == 0


def xsum_heldout(record_id: str) -> bool:
    """The XSum articles chapter 2 evaluates on; the EAGLE head's training text never includes them."""
    import zlib

    return zlib.crc32(record_id.encode()) % XSUM_HELDOUT_MOD == 0


@dataclass
class Sequence:
    """One training example: prompt + continuation, and the target's top-k at each continuation row."""

    ids: torch.Tensor  # (P + C,) int64, prompt then continuation
    prompt_len: int
    top_idx: torch.Tensor  # (C, k) int32: row j is the target's distribution for continuation token j
    top_logp: torch.Tensor  # (C, k) float16


@torch.inference_mode()
def generate_batch(
    model: LlamaModel, prompts: list[list[int]], max_new: int, sampling: SamplingParams, gen, top_k: int,
    eos: set[int], record: bool = True,
) -> list[Sequence]:
    """Left-padded batched generation; returns continuations (EOS kept) with the target's top-k rows."""
    b, longest = len(prompts), max(len(p) for p in prompts)
    dev = model.device
    ids = torch.zeros(b, longest, dtype=torch.long, device=dev)
    valid = torch.zeros(b, longest, dtype=torch.bool, device=dev)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p, device=dev)
        valid[i, longest - len(p):] = True
    cache = DenseKVCache(model.config, b, longest + max_new, dev, model.dtype)
    logits = model(ids, cache.begin(longest, valid=valid), logits="last").logits[:, -1]  # (B, V)
    outs: list[list[int]] = [[] for _ in range(b)]
    tops: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(b)]
    done = torch.zeros(b, dtype=torch.bool)
    for _ in range(max_new):
        if record:
            logp = torch.log_softmax(logits.float(), -1)
            val, idx = logp.topk(top_k, dim=-1)  # (B, k)
        tok = logits.argmax(-1) if sampling.greedy else sample_from(probs(logits, sampling), gen)  # (B,)
        for i in range(b):
            if not done[i]:
                outs[i].append(int(tok[i]))
                if record:
                    tops[i].append((idx[i].to(torch.int32).cpu(), val[i].half().cpu()))
                done[i] = int(tok[i]) in eos
        if bool(done.all()):
            break
        logits = model(tok[:, None], cache.begin(1)).logits[:, -1]
    seqs = []
    for i, p in enumerate(prompts):
        if not outs[i]:
            continue
        seqs.append(Sequence(
            ids=torch.tensor([*p, *outs[i]], dtype=torch.long), prompt_len=len(p),
            top_idx=torch.stack([t[0] for t in tops[i]]) if record else torch.empty(0),
            top_logp=torch.stack([t[1] for t in tops[i]]) if record else torch.empty(0),
        ))
    return seqs


def chat_prompts(tokenizer) -> list[list[int]]:
    """Chat prompts outside the held-out split, through the chat template."""
    from studylib.data import load_prompts
    from studylib.prompts import encode

    return [encode(tokenizer, r) for r in load_prompts() if not is_heldout(r.id)]


def self_prompts(model: LlamaModel, tokenizer, n: int, seed: int, batch: int, max_len: int = 48) -> list[list[int]]:
    """``n`` user turns written by the target at temperature 1, wrapped in the chat template."""
    from studylib.decoding.common import eos_set
    from studylib.prompts import encode

    marker = "\u00a7"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=True,
                                         tokenize=False)
    head = text.split(marker)[0]
    head_ids = list(tokenizer.encode(head, add_special_tokens=False))
    sampling = SamplingParams(temperature=1.0, seed=seed)
    gen = sampling.generator(model.device)
    eos = eos_set(model, tokenizer)
    out: list[list[int]] = []
    for _ in range(4 * n):  # bounded: a model that only writes empty turns cannot loop forever
        if len(out) >= n:
            break
        k = min(batch, n - len(out))
        for s in generate_batch(model, [head_ids] * k, max_len, sampling, gen, 1, eos, record=False):
            content = tokenizer.decode(s.ids[s.prompt_len:].tolist(), skip_special_tokens=True).strip()
            if content:
                out.append(encode(tokenizer, content, chat=True))
    return out[:n]
