"""Chapter 2's timing section as one whole run (``studylib.bench.whole_runs``), apart from the chapter's
modules so that the decoders' comparison (``ch02_speculative``) and the shipped head (``ch02_eagle``) need
not import each other."""

from __future__ import annotations

from collections.abc import Sequence

from studylib.experiments.ch02_eagle import chapter_head
from studylib.experiments.ch02_speculative import Runner, load_prompts, run_methods


def timing_run(model: str, weights: str, act: str, eagle_head: str, headline: str, max_new_tokens: int,
               n_chat: int, n_xsum: int, n_code: int, t1_prompts: int, seed: int = 0, max_chars: int = 1500,
               categories: Sequence[str] = (), device: str = "cpu", dtype: str = "float32", **_) -> dict:
    """Chapter 2's timing section as one whole run (``studylib.bench.whole_runs``): in a fresh process,
    load the engine and the shipped head, decode the held-out prompts with AR and ``headline`` (arms
    rotated per prompt), greedily and at T = 1 on the first ``t1_prompts``, and return this run's
    paired speed-up per workload (the median AR time per token over the headline's, as ``summarise``'s
    point). Exactness and the sampling test stay in the chapter's main run."""
    from studylib.models import load_model

    lm, tok = load_model(model, device, dtype, weights=weights, act=act)
    runner = Runner(lm, tok, None)
    runner.eagle_path = chapter_head(model, eagle_head, loaded=(lm, tok))["path"]
    prompts = load_prompts(tok, n_chat, n_xsum, n_code, seed=seed, max_chars=max_chars, categories=categories)
    out = {}
    for temp, some in ((0.0, prompts), (1.0, prompts[:t1_prompts])):
        if not some:
            continue
        df = run_methods(runner, some, [headline], max_new_tokens, temperature=temp, seed=seed, show_progress=False)
        for w, g in df.groupby("workload", sort=False):
            per = g.groupby(["prompt", "method"])["s_per_token"].median().unstack("method")
            out[f"speedup:T{temp:g}:{w}"] = float(per["ar"].median() / per[headline].median())
    return out
