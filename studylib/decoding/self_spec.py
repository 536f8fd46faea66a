"""Self-speculation: choose which target layers the draft skips, by measurement.

How (Zhang et al. 2023, "Draft & Verify", pick layers by search; we use a cheaper greedy search):
1. Calibration text: a few chat prompts (not the evaluation prompts) plus the target's own greedy
   continuation, so the positions scored are ones the draft will actually meet.
2. Score of a skip set S = first-token acceptance under greedy decoding: the fraction of continuation
   positions where the argmax of the target-without-S equals the target's argmax. The draft is scored
   exactly as it runs inside speculative decoding: its query at position t attends to the TARGET's
   keys/values for positions < t (the verified prefix lives in the shared cache) and to its own at t.
3. Greedy elimination: score every single-layer skip first; then, starting from no skipped layers,
   repeatedly skip the one extra layer whose removal keeps the score highest, up to ``budget`` layers,
   trying at each depth only the ``beam`` candidates with the best single-layer scores. This costs
   num_layers + budget * beam scored forwards (~100 for SmolLM2) instead of the 2^L subsets.
4. Along that path pick the number of skipped layers k that maximises the predicted speedup
   max_gamma E[tokens](alpha_k, gamma) / (1 + gamma * c_k), alpha_k being the score and c_k the
   weight-traffic cost ratio of the remaining layers.
The result is cached under ``cache_dir("self_spec")`` keyed by model, weights and calibration.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from studylib.cache import cache_dir
from studylib.models import DenseKVCache, LlamaModel

CALIBRATION_PROMPTS = (
    "Explain how a bicycle gear system works to a twelve-year-old.",
    "Write a short Python function that checks whether a string is a palindrome.",
    "Summarise the causes of the French Revolution in three sentences.",
    "Give me a recipe for a simple tomato pasta sauce.",
    "What are the pros and cons of working from home?",
    "Translate 'the weather is lovely today' into French and Spanish.",
)


class _PrefixFromTarget:
    """KV view for scoring a skip set: queries see the target's KV before them and their own at t."""

    def __init__(self, target_kv: DenseKVCache, length: int):
        self.kv, self.t = target_kv, length
        dev = target_kv.device
        own = torch.eye(length, dtype=torch.bool, device=dev)
        prefix = torch.ones(length, length, dtype=torch.bool, device=dev).tril(-1)
        self.mask = torch.cat([prefix, own], dim=1)[None, None]  # (1, 1, T, 2T)
        self.pos = torch.arange(length, device=dev)[None]

    def positions(self) -> torch.Tensor:
        return self.pos

    def attend(self, layer, q, k, v):
        keys = torch.cat([self.kv.k[layer][:, :, : self.t], k], dim=2)  # (1, Hkv, 2T, D)
        vals = torch.cat([self.kv.v[layer][:, :, : self.t], v], dim=2)
        return F.scaled_dot_product_attention(q, keys, vals, attn_mask=self.mask, enable_gqa=True)


def _calibration_set(model: LlamaModel, prompts: Sequence[Sequence[int]], new_tokens: int):
    """(target cache, target argmax, slice of continuation positions) per calibration sequence."""
    from studylib.decoding import ar

    out = []
    for p in prompts:
        cont = ar.generate(model, p, new_tokens).token_ids
        seq = torch.tensor([*p, *cont], dtype=torch.long, device=model.device)[None]  # (1, T)
        cache = DenseKVCache(model.config, 1, seq.shape[1], model.device, model.dtype)
        best = model(seq, cache.begin(seq.shape[1])).logits[0].argmax(-1)  # (T,)
        out.append((seq, cache, best, slice(len(p) - 1, seq.shape[1] - 1)))
    return out


def score_skip(model: LlamaModel, calib, skip: Sequence[int]) -> float:
    """Greedy first-token acceptance of the target with ``skip`` layers bypassed (module docstring)."""
    hits = total = 0
    for seq, cache, best, region in calib:
        view = _PrefixFromTarget(cache, seq.shape[1])
        guess = model(seq, view, skip_layers=tuple(skip)).logits[0].argmax(-1)  # (T,)
        hits += int((guess[region] == best[region]).sum())
        total += best[region].numel()
    return hits / max(total, 1)


def default_prompts(model: LlamaModel) -> list[list[int]]:
    from studylib.prompts import encode

    tok = tokenizer_for(model)
    chat = bool(getattr(tok, "chat_template", None))
    return [encode(tok, text, chat=chat) for text in CALIBRATION_PROMPTS]


def tokenizer_for(model: LlamaModel):
    name = model.config.name
    if model.config.random_weights:
        from studylib.models.tokenizer import ByteTokenizer

        return ByteTokenizer(model.config.vocab_size)
    from transformers import AutoTokenizer

    from studylib.models import model_dir

    return AutoTokenizer.from_pretrained(model_dir(name))


def _fingerprint(model: LlamaModel, prompts, budget, new_tokens, beam) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([model.config.name, model.config.num_layers, budget, new_tokens, beam,
                         [list(map(int, p)) for p in prompts]]).encode())
    # The choice depends on the arithmetic too: a block-format head (--weights gguf) is fingerprinted by
    # its first bytes, and the weights format and activation arithmetic are part of the key.
    from studylib.models.quant import QuantTensor

    w = model.lm_head.weight
    h.update(f"{getattr(model, 'weights_format', 'dense')}:{getattr(model, 'act', 'fp32')}".encode())
    if isinstance(w, QuantTensor):
        h.update(w.data[:8].cpu().numpy().tobytes())
    else:
        h.update(w[:8].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def choose_skip_layers(
    model: LlamaModel,
    prompts: Sequence[Sequence[int]] | None = None,
    budget: int | None = None,
    new_tokens: int = 48,
    beam: int | None = 6,
    use_cache: bool = True,
) -> tuple[list[int], dict]:
    """Pick the layers a self-speculative draft skips (module docstring); returns (layers, info).

    budget: the most layers to skip (default half). info holds the greedy path (layer, score) and the
    predicted speedup at each depth, so the chapter can plot the trade-off. beam: at each depth only the
    ``beam`` remaining layers with the best single-layer scores are tried (None: all of them).
    """
    from studylib.decoding.cost_model import layer_cost, predicted_speedup
    from studylib.progress import progress_bar

    n = model.config.num_layers
    budget = n // 2 if budget is None else budget
    if not 1 <= budget < n:
        from studylib.errors import StudylibError

        raise StudylibError(f"self:auto:K needs 1 <= K < {n} (the target's layer count), got {budget}.")
    prompts = default_prompts(model) if prompts is None else [list(p) for p in prompts]
    key = _fingerprint(model, prompts, budget, new_tokens, beam)
    path = cache_dir("self_spec") / f"{key}.json"
    if use_cache and path.exists():
        info = json.loads(path.read_text())
        return info["layers"], info
    calib = _calibration_set(model, prompts, new_tokens)
    steps = [{"skipped": [], "alpha": score_skip(model, calib, [])}]
    width = n if beam is None else min(beam, n)
    with progress_bar(total=n + (budget - 1) * width, desc="self-spec layer search", leave=False) as bar:
        single = {}
        for layer in range(n):
            single[layer] = score_skip(model, calib, [layer])
            bar.update()
        skipped: list[int] = []
        scores = dict(single)
        for depth in range(budget):
            if depth:
                rest = sorted((i for i in range(n) if i not in skipped), key=lambda i: -single[i])[:width]
                scores = {}
                for layer in rest:
                    scores[layer] = score_skip(model, calib, [*skipped, layer])
                    bar.update()
            layer = max(scores, key=scores.get)
            skipped.append(layer)
            steps.append({"skipped": sorted(skipped), "alpha": scores[layer]})
    full = layer_cost(model)
    for s in steps:
        c = layer_cost(model, n - len(s["skipped"])) / full
        s["cost_ratio"] = c
        s["best_gamma"], s["predicted_speedup"] = max(
            ((g, predicted_speedup(s["alpha"], g, c)) for g in range(1, 9)), key=lambda t: t[1])
    best = max(steps[1:], key=lambda s: s["predicted_speedup"])
    info = {"layers": best["skipped"], "path": steps, "single": [single[i] for i in range(n)], "budget": budget, "new_tokens": new_tokens,
            "model": model.config.name}
    if use_cache:  # whole or not at all: a reader in another process never sees half a file
        from studylib.workbook.paths import atomic_write  # here, not at import: the workbook package is heavy

        atomic_write(path, json.dumps(info, indent=1))
    return best["skipped"], info
