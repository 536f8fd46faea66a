"""Speculation inside continuous batching: a greedy request carries its prompt-lookup draft into the batched
step, its verification rows beside other requests' decode and prefill rows. Its output must equal
single-request AR token for token, with and without the prefix cache, under chunked prefill and
preemption; and the drafts must really be verified (some accepted), or the test proves nothing."""

from __future__ import annotations

import pytest

from studylib.errors import StudylibError
from studylib.models import load_model
from studylib.serving import Engine, EngineConfig, Request
from studylib.serving.check import ar_references
from studylib.serving.scheduler import SchedulerConfig


@pytest.fixture(scope="module")
def tiny_int8():
    return load_model("tiny-random", weights="q4_1", act="int8")[0]


def repetitive(n: int, seed: int = 0) -> list[Request]:
    """Prompts that repeat a phrase, so the model's text has n-grams to copy (a random model also loops)."""
    import random

    g = random.Random(seed)
    out = []
    for i in range(n):
        phrase = [g.randrange(3, 250) for _ in range(g.randrange(3, 7))]
        prompt = (phrase * g.randrange(2, 5))[: g.randrange(8, 30)] + [g.randrange(3, 250)]
        out.append(Request(f"r{i}", prompt, g.randrange(4, 24)))
    return out


CONFIGS = {
    "continuous-radix": dict(scheduler="continuous", prefix_cache="radix", max_batch_tokens=64),
    "chunked-preempt": dict(scheduler="continuous", prefix_cache="radix", max_batch_tokens=20, chunk_size=7,
                            block_size=4, num_blocks=40),
    "continuous-none": dict(scheduler="continuous", prefix_cache="none", max_batch_tokens=48),
    "sequential": dict(scheduler="sequential", prefix_cache="radix", block_size=2, num_blocks=200),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("gamma", [1, 4])
def test_speculation_in_the_batch_equals_single_request_ar(tiny_int8, name, gamma):
    base = repetitive(10, seed=gamma)
    refs = ar_references(tiny_int8, base)
    reqs = [Request(r.id, r.prompt_ids, r.max_new_tokens) for r in base]
    kw = dict(CONFIGS[name])
    if "num_blocks" not in kw:
        kw["kv_budget_mib"] = 4
    engine = Engine(tiny_int8, EngineConfig(speculate=f"prompt-lookup:{gamma},3", **kw))
    engine.run(reqs)
    assert [r.output_ids for r in reqs] == refs
    drafted = sum(t["drafted_tokens"] for t in engine.timeline)
    accepted = sum(t["accepted_tokens"] for t in engine.timeline)
    assert drafted > 0 and 0 < accepted <= drafted  # drafts went into the batch and some were kept
    assert engine.steps < sum(len(r) for r in refs) + len(reqs) * 2  # fewer steps than one per token


def test_a_sampled_request_never_speculates_beside_greedy_ones(tiny_int8):
    from studylib.sampling import SamplingParams

    base = repetitive(6, seed=9)
    refs = ar_references(tiny_int8, base)
    reqs = [Request(r.id, r.prompt_ids, r.max_new_tokens) for r in base]
    reqs[0].sampling = SamplingParams(temperature=1.0, seed=3)
    engine = Engine(tiny_int8, EngineConfig(speculate="prompt-lookup:4,3", kv_budget_mib=4))
    drafts_for = []
    step = engine.scheduler.schedule

    def spy():
        out = step()
        drafts_for.extend(out.drafts)
        return out

    engine.scheduler.schedule = spy
    engine.run(reqs)
    assert "r0" not in drafts_for and drafts_for
    assert [r.output_ids for r in reqs[1:]] == refs[1:]


@pytest.mark.parametrize(("kw", "word"), [
    (dict(speculate="lookahead:4,3"), "prompt-lookup"), (dict(speculate="prompt-lookup:0,3"), "prompt-lookup"),
    (dict(speculate="prompt-lookup:4,3", scheduler="static"), "paged scheduler"),
])
def test_bad_speculation_settings_are_one_clear_error(kw, word):
    with pytest.raises(StudylibError, match=word):
        EngineConfig(**kw)
    with pytest.raises(StudylibError, match="speculate_gamma"):
        SchedulerConfig(speculate_gamma=-1)


def test_greedy_engine_default_is_required(tiny_int8):
    from studylib.sampling import SamplingParams

    with pytest.raises(StudylibError, match="greedy"):
        EngineConfig(speculate="prompt-lookup:4,3", sampling=SamplingParams(temperature=0.7))


def test_the_engine_times_its_own_work_apart_from_the_forward(tiny_int8):
    """Every step records the forward's seconds and the host's (scheduling, bookkeeping, commits), so the
    engine's own cost per step at a given batch is read from the run."""
    reqs = repetitive(8, seed=2)
    engine = Engine(tiny_int8, EngineConfig(kv_budget_mib=4))
    run = engine.run(reqs)
    assert all(t["host_s"] >= 0 and t["forward_s"] > 0 for t in run.timeline)
    share = run.host_time()
    assert 0 < share["host_share"] < 1 and share["host_steps"] == len(run.timeline)
    assert run.host_time(min_rows=10**6)["host_share"] is None  # no step that large: nothing to say
    assert "host_share" in run.summary()
