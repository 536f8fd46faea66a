"""Model runners: turn one scheduled step into one forward pass and return the sampled tokens.

- ``PagedRunner`` flattens the ragged batch into one row (1, sum n_i) and runs it against
  ``PagedBatch``, the view of the paged pool: prefill chunks and decodes share the forward.
- ``DenseBatchRunner`` is the static baseline: a rectangle (B, L) left-padded to the longest prompt in
  a ``DenseKVCache``; rows that finished early keep being computed (as padding) until the batch ends.
"""

from __future__ import annotations

import torch

from studylib.kvcache import PagedBatch, PagedKVPool
from studylib.models import DenseKVCache, LlamaModel
from studylib.sampling import SamplingParams, sample
from studylib.serving.request import Request


class RowSampler:
    """Next tokens for a step's rows, each with its request's sampling (``Request.sampling``) or the
    engine's. Requests sharing settings share one generator (seeded from those settings), so a batch of
    greedy and sampled requests is one forward and a per-group draw."""

    def __init__(self, default: SamplingParams, device):
        self.default, self.device = default, device
        self.generators: dict[tuple, torch.Generator | None] = {}

    def _gen(self, p: SamplingParams):
        key = (p.temperature, p.top_k, p.top_p, p.seed)
        if key not in self.generators:
            self.generators[key] = p.generator(self.device)
        return self.generators[key]

    def __call__(self, logits: torch.Tensor, reqs: list[Request | None]) -> torch.Tensor:
        params = [(r.sampling if r is not None and r.sampling is not None else self.default) for r in reqs]
        if all(p == params[0] for p in params):
            return sample(logits, params[0], self._gen(params[0]))
        out = logits.argmax(-1)
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(params):
            if not p.greedy:
                groups.setdefault((p.temperature, p.top_k, p.top_p, p.seed), []).append(i)
        for rows in groups.values():
            p = params[rows[0]]
            out[rows] = sample(logits[rows], p, self._gen(p))
        return out


class PagedRunner:
    def __init__(self, model: LlamaModel, pool: PagedKVPool, sampling: SamplingParams, attention: str = "auto"):
        self.model, self.pool, self.sampling = model, pool, sampling
        self.attention = attention
        self.sampler = RowSampler(sampling, model.device)

    @torch.inference_mode()
    def run(self, reqs: list[Request], ns: list[int], drafts: dict[str, list[int]] | None = None) -> dict:
        """One forward over every scheduled row. Returns request id -> its next token, or, for a request
        verifying ``drafts[id]`` (greedy), the tokens it commits: the drafts the model agrees with, then
        the model's own next token (the correction, or a bonus after every draft was accepted)."""
        dev = self.model.device
        drafts = drafts or {}
        cached = [r.num_computed for r in reqs]
        chunks = [r.all_ids[c : c + 1] + drafts[r.id] if r.id in drafts else r.all_ids[c : c + n]
                  for r, c, n in zip(reqs, cached, ns, strict=True)]
        if any(len(ch) != n for ch, n in zip(chunks, ns, strict=True)):
            raise ValueError("a scheduled row count differs from its chunk (a draft that does not fit its step)")
        ids = torch.tensor([t for ch in chunks for t in ch], dtype=torch.long, device=dev)[None]  # (1, N)
        view = PagedBatch(self.pool, [r.block_table for r in reqs], cached, ns, mode=self.attention)
        # Only sequences whose chunk reaches their last known token produce a next token; a verifying one
        # needs a row of logits for each token it feeds.
        want = [i for i, (r, c, n) in enumerate(zip(reqs, cached, ns, strict=True))
                if c + n == r.num_tokens or r.id in drafts]
        if not want:
            self.model(ids, view, logits="none")
            return {}
        last = view.logit_index()
        rows = [list(range(int(last[i]) - ns[i] + 1, int(last[i]) + 1)) if reqs[i].id in drafts else [int(last[i])]
                for i in want]
        idx = torch.tensor([j for r in rows for j in r], dtype=torch.long, device=dev)
        logits = self.model(ids, view, logits=idx).logits[0]  # (rows wanted, vocab)
        out, at, plain, plain_rows = {}, 0, [], []
        for i, r in zip(want, rows, strict=True):
            if reqs[i].id in drafts:
                top = logits[at : at + len(r)].argmax(-1).tolist()
                draft = drafts[reqs[i].id]
                k = 0
                while k < len(draft) and draft[k] == top[k]:
                    k += 1
                out[reqs[i].id] = draft[:k] + [top[k]]
            else:
                plain.append(i)
                plain_rows.append(at)
            at += len(r)
        if plain:
            toks = self.sampler(logits[plain_rows], [reqs[i] for i in plain]).tolist()
            out.update({reqs[i].id: t for i, t in zip(plain, toks, strict=True)})
        return out


class DenseBatchRunner:
    def __init__(self, model: LlamaModel, sampling: SamplingParams, pad_id: int = 0):
        self.model, self.sampling, self.pad_id = model, sampling, pad_id
        self.sampler = RowSampler(sampling, model.device)
        self.by_id: dict[str, Request] = {}
        self.rows: list[str] = []
        self.cache: DenseKVCache | None = None
        self.last: torch.Tensor | None = None  # (B,) the token each row feeds next

    @torch.inference_mode()
    def start(self, reqs: list[Request]) -> dict[str, int]:
        """Prefill a new batch: prompts left-padded to the longest, one forward."""
        dev, cfg = self.model.device, self.model.config
        L = max(len(r.prompt_ids) for r in reqs)
        span = L + max(r.max_new_tokens for r in reqs)
        self.cache = DenseKVCache(cfg, len(reqs), span, dev, self.model.dtype)
        ids = torch.full((len(reqs), L), self.pad_id, dtype=torch.long, device=dev)  # (B, L)
        valid = torch.zeros(len(reqs), L, dtype=torch.bool, device=dev)
        for b, r in enumerate(reqs):
            ids[b, L - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, device=dev)
            valid[b, L - len(r.prompt_ids):] = True
        self.rows = [r.id for r in reqs]
        self.by_id = {r.id: r for r in reqs}
        logits = self.model(ids, self.cache.begin(L, valid=valid), logits="last").logits[:, -1]  # (B, V)
        return self._sample(logits, set(self.rows))

    @torch.inference_mode()
    def decode(self, live: set[str]) -> dict[str, int]:
        """One decode step for the whole rectangle; rows not in ``live`` compute a pad token."""
        feed = self.last.clone()
        alive = torch.tensor([rid in live for rid in self.rows], device=feed.device)
        feed[~alive] = self.pad_id
        logits = self.model(feed[:, None], self.cache.begin(1)).logits[:, -1]  # (B, V)
        return self._sample(logits, live)

    def _sample(self, logits: torch.Tensor, live: set[str]) -> dict[str, int]:
        self.last = self.sampler(logits, [self.by_id.get(rid) for rid in self.rows])  # (B,)
        toks = self.last.tolist()
        return {rid: t for rid, t in zip(self.rows, toks, strict=True) if rid in live}

    def reset(self) -> None:
        self.cache, self.rows, self.last = None, [], None
