"""The serving engine on tiny-random: lossless greedy output, batch invariance, rejections, aborts,
metrics, workloads and the ``bench-serve`` CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from studylib.cli import main
from studylib.errors import StudylibError
from studylib.models import load_model
from studylib.serving import Engine, EngineConfig, Request, RequestStatus
from studylib.serving.check import ar_references, divergence, first_difference
from studylib.serving.invariant import linear_rows, sdpa_rows
from studylib.serving.metrics import distribution, summarize
from studylib.serving.workload import arrival_times, read_workload, synthetic_workload, to_requests

SUMMARY_KEYS = {"requests", "output_tokens", "duration_s", "throughput_tok_s", "requests_per_s",
                "prefix_hit_rate", "ttft_s", "tpot_s", "itl_s", "e2el_s"}


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


def workload(n=10, seed=0, shared=16):
    items = synthetic_workload(n, seed, prompt_len=(1, 24), output_len=(1, 12), shared_prefix=shared)
    return to_requests(items, None)


def serve(model, reqs, **kw):
    if "num_blocks" not in kw:
        kw.setdefault("kv_budget_mib", 4)
    engine = Engine(model, EngineConfig(**kw))
    return engine, engine.run(reqs)


# ---- lossless greedy output ---------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["none", "radix"])
def test_continuous_greedy_matches_single_request_ar(tiny, prefix):
    model, _ = tiny
    reqs = workload(12)
    refs = ar_references(model, reqs)
    _, run = serve(model, reqs, scheduler="continuous", prefix_cache=prefix, max_batch_tokens=48, chunk_size=16)
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
    report = divergence([r.output_ids for r in reqs], refs)
    # Batched fp32 arithmetic differs from single-request arithmetic in the last bits; on tiny-random
    # a greedy flip needs a near-tie, so almost every request must match exactly.
    assert report["divergence_rate"] <= 0.1, report


CONFIGS = {
    "continuous-radix-chunked-preempt": dict(scheduler="continuous", prefix_cache="radix", max_batch_tokens=16,
                                             chunk_size=7, block_size=4, num_blocks=24),
    "continuous-none": dict(scheduler="continuous", prefix_cache="none", max_batch_tokens=64),
    "cache-aware": dict(scheduler="continuous", prefix_cache="radix", cache_aware=True, max_running=3,
                        block_size=2, num_blocks=80),
    "sequential-radix": dict(scheduler="sequential", prefix_cache="radix", block_size=1, num_blocks=200),
    "static": dict(scheduler="static", max_running=4),
}


@pytest.fixture(scope="module")
def invariant_refs(tiny):
    model, _ = tiny
    reqs = workload(10, seed=3)
    return reqs, ar_references(model, reqs, invariant=True)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batch_invariant_mode_is_exactly_single_request_ar(tiny, invariant_refs, name):
    model, _ = tiny
    base, refs = invariant_refs
    reqs = [Request(r.id, r.prompt_ids, r.max_new_tokens) for r in base]
    engine, run = serve(model, reqs, batch_invariant=True, **CONFIGS[name])
    assert [r.output_ids for r in reqs] == refs
    s = run.summary()
    if name.startswith("continuous-radix"):
        assert run.preemptions > 0  # the configuration really exercised preemption...
    if "radix" in name or name == "cache-aware":
        assert s["prefix_hit_rate"] > 0  # ...and prefix hits
    if engine.pool is not None:
        engine.prefix_cache.clear()
        engine.pool.check_accounting()
        assert engine.pool.num_free == engine.pool.num_blocks


def test_the_pure_pytorch_reference_mode_is_also_exactly_single_request_ar(tiny, monkeypatch):
    # STUDYLIB_INVARIANT_KERNELS=off forces RowByRow (what CUDA or a machine without a C compiler gets).
    from studylib.serving.invariant import kernels_apply

    monkeypatch.setenv("STUDYLIB_INVARIANT_KERNELS", "off")
    assert not kernels_apply("cpu")
    model, _ = tiny
    base = workload(4, seed=5)
    refs = ar_references(model, base, invariant=True)
    reqs = [Request(r.id, r.prompt_ids, r.max_new_tokens) for r in base]
    serve(model, reqs, batch_invariant=True, **CONFIGS["continuous-radix-chunked-preempt"])
    assert [r.output_ids for r in reqs] == refs


def test_batch_invariant_kernels_are_row_independent():
    torch.manual_seed(0)
    x, w, b = torch.randn(13, 40), torch.randn(24, 40), torch.randn(24)
    full = linear_rows(x, w, b)
    assert all(torch.equal(full[i : i + 1], linear_rows(x[i : i + 1], w, b)) for i in range(13))
    torch.testing.assert_close(full, F.linear(x, w, b))
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    mask = torch.ones(2, 1, 5, 9, dtype=torch.bool).tril(4)
    mask[1, :, :, :3] = False  # left padding in row 1
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(sdpa_rows(q, k, v, attn_mask=mask, enable_gqa=True), ref)
    qc = torch.randn(1, 4, 9, 8)
    torch.testing.assert_close(sdpa_rows(qc, k[:1], v[:1], is_causal=True, enable_gqa=True),
                               F.scaled_dot_product_attention(qc, k[:1], v[:1], is_causal=True, enable_gqa=True))
    # One query's result does not depend on the other queries in the call.
    one = sdpa_rows(q[:1, :, 2:3], k[:1, :, :7], v[:1, :, :7], enable_gqa=True)
    assert torch.equal(one, sdpa_rows(q[:1], k[:1], v[:1], attn_mask=mask[:1], enable_gqa=True)[:, :, 2:3])


def test_batch_invariant_logits_are_bitwise_equal_across_batching(tiny):
    # The last prompt token's logits of sequence A: alone in a dense cache (what AR computes), and in
    # the paged pool split into two chunks while batched with other sequences. Bitwise equal only
    # under batch_invariant.
    from studylib.kvcache import PagedBatch, PagedKVPool
    from studylib.models import DenseKVCache
    from studylib.serving import batch_invariant

    model, _ = tiny
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randint(3, 259, (n,), generator=gen).tolist() for n in (23, 9, 14))
    with batch_invariant():
        dense = DenseKVCache(model.config, 1, 32)
        alone = model(torch.tensor([a]), dense.begin(len(a)), logits="last").logits[0, -1]
        pool = PagedKVPool(model.config, block_size=4, num_blocks=32)
        ta, tb, tc = (pool.alloc(pool.blocks_for(len(x))) for x in (a, b, c))
        view = PagedBatch(pool, [tb, ta], [0, 0], [len(b), 10])  # b whole, a's first 10 tokens
        model(torch.tensor([b + a[:10]]), view, logits="none")
        view = PagedBatch(pool, [tc, ta], [0, 10], [len(c), len(a) - 10])  # c whole, the rest of a
        batched = model(torch.tensor([c + a[10:]]), view, logits=view.logit_index()).logits[0, 1]
    assert torch.equal(alone, batched)


def test_divergence_report():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    r = divergence([[1, 2], [3, 4]], [[1, 2], [3, 5]])
    assert r["divergence_rate"] == 0.5 and r["first_divergence"] == [1]


# ---- bad input and aborts -----------------------------------------------------------------------

def test_requests_too_long_are_rejected_and_others_served(tiny):
    model, _ = tiny
    window = model.config.max_position_embeddings
    good = workload(4)
    too_long = Request("long", [5] * (window - 3), 8)
    too_big = Request("big", [5] * 200, 8)  # fits the window, not the 8-block x 16-token pool
    engine = Engine(model, EngineConfig(num_blocks=8, kv_budget_mib=None))
    with pytest.raises(StudylibError, match="context window"):
        engine.add_request(too_long)
    with pytest.raises(StudylibError, match="whole pool"):
        engine.check(too_big)
    run = engine.run([too_long, *good, too_big])
    assert too_long.stop_reason == too_big.stop_reason == "rejected"
    assert "context window" in too_long.error and "pool" in too_big.error
    assert all(r.status is RequestStatus.FINISHED for r in good)
    s = run.summary()
    assert s["rejected"] == 2 and s["requests"] == 4


def test_static_rejects_a_request_larger_than_the_dense_budget(tiny):
    model, _ = tiny
    engine = Engine(model, EngineConfig(scheduler="static", num_blocks=4, block_size=16, kv_budget_mib=None))
    with pytest.raises(StudylibError, match="KV slots"):
        engine.add_request(Request("big", [5] * 60, 8))


def test_abort_while_serving(tiny):
    model, _ = tiny
    reqs = workload(6)
    engine = Engine(model, EngineConfig(kv_budget_mib=4))
    for r in reqs:
        engine.add_request(r)
    engine.step()
    engine.abort(reqs[0].id)
    engine.abort(reqs[-1].id)
    while engine.has_work():
        engine.step()
    assert reqs[0].status is RequestStatus.ABORTED and reqs[0].stop_reason == "abort"
    assert all(r.status is RequestStatus.FINISHED for r in reqs[1:-1])
    assert engine.pool.num_used == engine.prefix_cache.cached_blocks  # only the tree holds blocks


# ---- timing, metrics, workloads -----------------------------------------------------------------

def test_arrivals_are_replayed_in_wall_clock_time(tiny):
    model, _ = tiny
    items = synthetic_workload(4, 1, prompt_len=(2, 6), output_len=(2, 3))
    reqs = to_requests(items, None, rate=40.0, seed=2)
    _, run = serve(model, reqs)
    for r in reqs:
        assert r.token_times[0] >= r.arrival_s and r.ttft_s > 0
        assert r.e2el_s >= r.ttft_s
    assert run.duration_s >= max(r.arrival_s for r in reqs)
    t = [row["t"] for row in run.timeline]
    assert t == sorted(t)
    assert all(0 <= row["kv_used"] <= 1 and row["batch_seqs"] <= 32 for row in run.timeline)


def test_metrics_follow_vllm_conventions():
    a = Request("a", [1, 2], 3, arrival_s=1.0)
    a.token_times, a.output_ids, a.finished_s = [1.5, 1.7, 2.1], [5, 6, 7], 2.1
    b = Request("b", [1, 2, 3], 1, arrival_s=0.0)
    b.token_times, b.output_ids, b.finished_s = [0.4], [5], 0.4
    for r in (a, b):
        r.status = RequestStatus.FINISHED
    s = summarize([a, b], duration_s=2.1, slo={"ttft_s": 0.45})
    assert SUMMARY_KEYS <= s.keys()
    assert s["output_tokens"] == 4 and s["requests"] == 2
    assert s["throughput_tok_s"] == pytest.approx(4 / 2.1)
    assert s["ttft_s"]["mean"] == pytest.approx((0.5 + 0.4) / 2)
    assert s["tpot_s"]["mean"] == pytest.approx(0.3)  # b has one token: no TPOT
    assert s["itl_s"]["p50"] == pytest.approx(0.3)  # gaps 0.2 and 0.4, pooled
    assert s["e2el_s"]["p99"] == pytest.approx(0.4 + 0.99 * (1.1 - 0.4))  # numpy's linear percentile
    assert s["goodput_req_s"] == pytest.approx(1 / 2.1)  # only b meets TTFT <= 0.45 s
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
    with pytest.raises(StudylibError, match="SLO"):
        summarize([a], 1.0, slo={"latency": 1.0})


def test_arrival_times_are_seeded_poisson_or_gamma():
    t = arrival_times(4000, rate=8.0, seed=1)
    assert t[0] == 0.0 and t == sorted(t) and t == arrival_times(4000, rate=8.0, seed=1)
    gaps = torch.tensor(t).diff()
    assert gaps.mean().item() == pytest.approx(1 / 8, rel=0.05)
    assert (gaps.std() / gaps.mean()).item() == pytest.approx(1.0, rel=0.1)  # exponential: CV = 1
    bursty = torch.tensor(arrival_times(4000, rate=8.0, burstiness=0.25, seed=1)).diff()
    assert (bursty.std() / bursty.mean()).item() == pytest.approx(2.0, rel=0.15)  # CV = 1/sqrt(shape)
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(StudylibError, match="rate"):
        arrival_times(3, 0.0)


@pytest.mark.parametrize("line, match", [
    ("not json", "not valid JSON"),
    ('{"prompt": "hi", "max_new_tokens": 4}', "no 'id'"),
    ('{"id": "x", "max_new_tokens": 4}', "exactly one of"),
    ('{"id": "x", "prompt": "hi", "max_new_tokens": 0}', "max_new_tokens"),
    ('{"id": "x", "prompt": "hi", "max_new_tokens": 4, "arrival_s": -1}', "arrival_s"),
    ('{"id": "x", "messages": [{"role": "user"}], "max_new_tokens": 4}', "messages"),
    ('{"id": "x", "prompt": "hi", "max_new_tokens": 4, "rate": 3}', "unknown field"),
    ('{"id": "a", "prompt": "hi", "max_new_tokens": 4}', "repeats id"),
])
def test_workload_file_errors_name_the_line(tmp_path, line, match):
    path = tmp_path / "w.jsonl"
    path.write_text('{"id": "a", "prompt": "hello", "max_new_tokens": 3}\n' + line + "\n")
    with pytest.raises(StudylibError, match=match) as err:
        read_workload(path)
    assert "w.jsonl:2" in str(err.value)


def test_workload_file_arrivals_override_the_rate(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"id": "a", "prompt": "hello", "max_new_tokens": 3, "arrival_s": 0.5}\n'
                    '{"id": "b", "messages": [{"role": "user", "content": "hi"}], "max_new_tokens": 2}\n')
    _, tok = load_model("tiny-random")
    reqs = to_requests(read_workload(path), tok, rate=math.inf)
    assert [r.arrival_s for r in reqs] == [0.5, 0.0]
    assert reqs[0].prompt_ids == tok("hello")["input_ids"] and reqs[1].max_new_tokens == 2


# ---- the CLI ------------------------------------------------------------------------------------

def test_bench_serve_json_and_records(tmp_path, capsys):
    records = tmp_path / "r.jsonl"
    rc = main(["bench-serve", "--model", "tiny-random", "--workload", "synthetic", "--num-requests", "5",
               "--max-new-tokens", "4", "--prefix-cache", "radix", "--records", str(records), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["requests"] == 5 and set(summary["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    assert len(lines) == 5
    assert {"id", "token_ids", "ttft_s", "e2el_s", "prefix_hit_tokens"} <= lines[0].keys()
    assert sum(len(x["token_ids"]) for x in lines) == summary["output_tokens"]


def test_bench_serve_reports_bad_input_on_one_line(tmp_path, capsys):
    path = tmp_path / "w.jsonl"
    path.write_text('{"id": "a", "prompt": "hello", "max_new_tokens": "many"}\n')
    rc = main(["bench-serve", "--model", "tiny-random", "--workload", str(path), "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and "w.jsonl:1" in err and "max_new_tokens" in err
    rc = main(["bench-serve", "--model", "tiny-random", "--workload", "synthetic", "--scheduler", "static",
               "--prefix-cache", "radix"])
    assert rc == 2 and "static" in capsys.readouterr().err


# ---- the embedded model -------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_continuous_matches_ar():
    model, tok = load_model("smollm2-135m")
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
             "The three primary colours are"]
    reqs = [Request(str(i), tok(t)["input_ids"], 16) for i, t in enumerate(texts)]
    refs = ar_references(model, reqs, tok)
    for prefix in ("none", "radix"):
        trial = [Request(r.id, r.prompt_ids, 16) for r in reqs]
        Engine(model, EngineConfig(prefix_cache=prefix, block_size=4), tok).run(trial)
        report = divergence([r.output_ids for r in trial], refs)
        assert report["divergence_rate"] <= 0.25, report
    exact_refs = ar_references(model, reqs, tok, invariant=True)
    trial = [Request(r.id, r.prompt_ids, 16) for r in reqs]
    Engine(model, EngineConfig(prefix_cache="radix", block_size=4, batch_invariant=True), tok).run(trial)
    assert [r.output_ids for r in trial] == exact_refs


# ---- chapter 5 helpers ---------------------------------------------------------------------------

def test_chapter_helpers_read_the_numbers(tmp_path):
    from studylib.experiments import ch05_batching as ch05
    from studylib.experiments import ch05_interplay as inter

    rows = [{"arm": a, "rate": math.inf, "repeat": k, "throughput_tok_s": t * (1 + 0.01 * k), "requests_per_s": t / 10}
            for a, t in (("sequential", 10.0), ("static", 20.0), ("continuous", 40.0)) for k in range(3)]
    df = pd.DataFrame(rows)
    assert ch05.relative_rates(df, [0.5, 2]) == [0.5, 2.0]  # sequential serves 1 req/s
    with pytest.raises(StudylibError, match="no saturation run of 'paged'"):  # one message for every rate reader
        ch05.relative_rates(df, [1], base_arm="paged")
    gains = ch05.saturation_gains(df, treated="continuous")
    g = gains.set_index("baseline").gain
    assert g["sequential"] == pytest.approx(4.0) and g["static"] == pytest.approx(2.0)
    curve = pd.DataFrame({"arm": ["a", "a", "a"], "rate": [1.0, 2.0, math.inf], "ttft_p99_s": [0.1, 0.5, 9.0],
                          "tpot_p99_s": [0.01, 0.02, 0.05], "throughput_tok_s": [5.0, 9.0, 12.0]})
    best = ch05.max_sustainable_rate(curve, {"ttft_s": 1.0, "tpot_s": 0.1}).iloc[0]
    assert best.max_rate_req_s == 2.0 and best.throughput_there_tok_s == 9.0
    # Speculation is free where verifying gamma+1 tokens costs one step, and useless where it costs gamma+1.
    step = pd.DataFrame([{"batch": 1, "tokens_per_seq": 1, "step_s": 1.0}, {"batch": 1, "tokens_per_seq": 3, "step_s": 1.0},
                         {"batch": 8, "tokens_per_seq": 1, "step_s": 2.0}, {"batch": 8, "tokens_per_seq": 3, "step_s": 6.0}])
    c8 = inter.c8_table(step, alpha=0.5, gamma=2, draft_cost=0.0).set_index("batch")
    assert c8.loc[1, "speculative_gain"] == pytest.approx(1.75)  # (1 - 0.5^3) / (1 - 0.5)
    assert c8.loc[8, "speculative_gain"] == pytest.approx(1.75 / 3) and c8.loc[8, "batching_gain"] == 4.0
    # Chapter 2's alpha is found from the runner's staging folder; without it the parameters are used.
    staging = tmp_path / ".staging" / "ch05"
    staging.mkdir(parents=True)
    assert inter.speculative_inputs(staging, 0.7, 4, 0.1)["alpha"] == 0.7
    (tmp_path / "ch02.json").write_text(json.dumps({"measurements": {"overall": [
        {"method": "sps:distilled@4", "alpha": 0.6}, {"method": "prompt-lookup", "alpha": 0.2}]}}))
    spec = inter.speculative_inputs(staging, 0.7, 4, 0.1)
    assert spec["alpha"] == 0.6 and "chapter 2" in spec["source"]


def test_speculative_inputs_read_chapter_2s_distilled_draft_only(tmp_path):
    from studylib.experiments import ch05_interplay as inter

    staging = tmp_path / ".staging" / "ch05"
    staging.mkdir(parents=True)
    (tmp_path / "ch02.json").write_text(json.dumps({"measurements": {
        "overall": [{"method": "sps:distilled@4", "alpha": 0.17}, {"method": "sps:self:4@4", "alpha": 0.94},
                    {"method": "pld@8,3", "alpha": 0.56}],
        "draft_table": [{"draft": "target", "measured_c": 1.0}, {"draft": "distilled", "measured_c": 0.157}]}}))
    spec = inter.speculative_inputs(staging, 0.7, 4, 0.1)
    assert spec["alpha"] == 0.17  # not the median with self-speculation's 0.94
    assert spec["draft_cost"] == 0.157 and "measured cost" in spec["source"]
    assert spec["tokens_per_step"] is None and spec["verify_tokens"] == 5  # a chain of gamma = 4


def test_the_batching_model_describes_chapter_2s_headline_drafter_when_it_ran(tmp_path):
    from studylib.experiments import ch05_interplay as inter

    staging = tmp_path / ".staging" / "ch05"
    staging.mkdir(parents=True)
    (tmp_path / "ch02.json").write_text(json.dumps({"measurements": {
        "headline": "eagle@5,4,16",
        "overall": [{"method": "sps:distilled@4", "alpha": 0.17}, {"method": "eagle@5,4,16", "alpha": 0.33}],
        "draft_table": [{"draft": "distilled", "measured_c": 0.157}],
        "eagle_trees": [{"method": "eagle@3", "c": 0.3, "tau": 1.4, "verify_tokens": 4, "draft_forwards_per_step": 3},
                        {"method": "eagle@5,4,16", "depth": 5, "c": 0.52, "tau": 1.5, "verify_tokens": 17,
                         "draft_forwards_per_step": 5.0}]}}))
    spec = inter.speculative_inputs(staging, 0.7, 4, 0.1)
    assert spec["drafter"] == "eagle@5,4,16" and spec["draft_cost"] == 0.52 and spec["tokens_per_step"] == 1.5
    assert spec["verify_tokens"] == 17 and spec["draft_forwards"] == 5.0 and spec["alpha"] == 0.33
    assert "eagle@5,4,16" in inter.speculative_inputs_text(spec)
    # The tree's verify step (17 tokens) is read off the curve, and the measured tau replaces the chain formula.
    step = pd.DataFrame([{"batch": 1, "tokens_per_seq": 1, "step_s": 1.0}, {"batch": 1, "tokens_per_seq": 17, "step_s": 2.0}])
    c8 = inter.c8_table(step, spec["alpha"], spec["gamma"], spec["draft_cost"], spec["tokens_per_step"],
                        spec["verify_tokens"], spec["draft_forwards"]).set_index("batch")
    assert c8.loc[1, "speculative_gain"] == pytest.approx(1.5 / (2.0 + 5.0 * 0.52))


def test_c5_needs_both_gains_over_whole_runs():
    from studylib.bench.whole_runs import WholeRuns
    from studylib.claims import FAILS, HOLDS, INCONCLUSIVE
    from studylib.experiments import ch05_batching as ch05
    from studylib.experiments import ch05_runs as runs5

    def runs(n, seq, static, cont):
        rng = np.random.default_rng(0)
        out = []
        for _ in range(n):
            t = {a: v * (1 + 0.01 * rng.standard_normal()) for a, v in
                 (("sequential", seq), ("static", static), ("continuous", cont), ("continuous+radix", cont))}
            m = {f"gain:{a}/{b}": t[a] / t[b] for a in ("continuous", "continuous+radix") for b in t if b != a}
            out.append({"metrics": m})
        return WholeRuns("synthetic:run", {}, out)

    rows = ch05.judge_c5(runs5.gains_over_runs(runs(5, 10.0, 20.0, 40.0)), None, "c")
    assert rows[0].verdict == HOLDS and [r.n for r in rows[1:]] == [5, 5] and rows[1].unit == "whole runs"
    slow = runs(5, 10.0, 60.0, 40.0)  # continuous loses to static
    assert ch05.judge_c5(runs5.gains_over_runs(slow), None, "c")[0].verdict == FAILS
    assert ch05.judge_c5(runs5.gains_over_runs(runs(2, 10.0, 20.0, 40.0)), None, "c")[0].verdict == INCONCLUSIVE

    # the same gains from replays inside one process count no repeats
    def replays(n, seq, static, cont):
        return pd.DataFrame([{"arm": arm, "rate": math.inf, "repeat": k, "throughput_tok_s": t}
                             for k in range(n) for arm, t in (("sequential", seq), ("static", static),
                                                              ("continuous", cont), ("continuous+radix", cont))])
    assert ch05.judge_c5(ch05.saturation_gains(replays(5, 10.0, 20.0, 40.0)), None, "c")[0].verdict == INCONCLUSIVE


# ---- cache-aware admission: the starvation bound ---------------------------------------------------

def interleaved_prompts(n, n_prefix=3, prefix_len=32, seed=0):
    """Prompts behind ``n_prefix`` shared prefixes in round-robin order (A, B, C, A, B, C, ...)."""
    import random

    rng = random.Random(seed)
    stems = [[rng.randrange(3, 259) for _ in range(prefix_len)] for _ in range(n_prefix)]
    return [stems[i % n_prefix] + [rng.randrange(3, 259) for _ in range(rng.randint(2, 10))] for i in range(n)]


def bypass_scheduler(max_bypass, cache_aware=True):
    from studylib.kvcache import PagedKVPool, make_prefix_cache
    from studylib.serving import Scheduler, SchedulerConfig
    from studylib.serving.blocks import BlockManager

    pool = PagedKVPool(load_model("tiny-random")[0].config, block_size=4, num_blocks=64)
    cfg = SchedulerConfig("continuous", max_running=1, prefix_cache="radix", cache_aware=cache_aware,
                          max_bypass=max_bypass)
    return Scheduler(cfg, BlockManager(pool, make_prefix_cache("radix", pool)))


def admission_order(sched, prompts):
    for i, p in enumerate(prompts):
        sched.add(Request(f"r{i}", p, 2))
    order = []
    while sched.has_work():
        out = sched.schedule()
        order += [rid for rid in out.num_tokens if rid not in order]
        sched.update_from_output(out, {rid: 7 for rid in out.num_tokens}, now=0.0)
    return order


@pytest.mark.parametrize("bound", [0, 2, 5])
def test_cache_aware_admission_bypasses_no_request_more_than_max_bypass(bound):
    prompts = interleaved_prompts(30)
    sched = bypass_scheduler(bound)
    order = admission_order(sched, prompts)
    assert sorted(order) == sorted(f"r{i}" for i in range(30))
    assert max(sched.bypassed.values()) == bound  # the bound holds, and binds on this workload
    if bound == 0:
        assert order == [f"r{i}" for i in range(30)]  # max_bypass 0 is first come, first served
    unbounded = bypass_scheduler(10_000)
    admission_order(unbounded, prompts)
    assert max(unbounded.bypassed.values()) > 5  # without the bound, the LPM order starves some requests


def test_fcfs_bypasses_nobody_and_max_bypass_is_validated():
    sched = bypass_scheduler(3, cache_aware=False)
    order = admission_order(sched, interleaved_prompts(12))
    assert order == [f"r{i}" for i in range(12)] and set(sched.bypassed.values()) == {0}
    from studylib.serving import SchedulerConfig

    with pytest.raises(StudylibError, match="max_bypass"):
        SchedulerConfig(max_bypass=-1)
    with pytest.raises(StudylibError, match="max_bypass"):
        EngineConfig(max_bypass=1.5)


def test_engine_records_bypasses_and_cache_aware_hits_at_least_fcfs(tiny):
    # Four prefixes of 8 blocks, two requests in flight, a 24-block pool: the cache cannot keep every
    # prefix, so FCFS (cycling A, B, C, D) evicts each before its next use and LPM regroups them. (With a
    # pool that holds every prefix, LPM can hit slightly less: it may admit two requests for the same
    # not-yet-cached prefix in one step, where the interleaved FCFS order never does.)
    model, _ = tiny
    prompts = interleaved_prompts(24, n_prefix=4)
    runs = {}
    for aware in (False, True):
        reqs = [Request(f"r{i}", p, 3, ignore_eos=True) for i, p in enumerate(prompts)]
        _, runs[aware] = serve(model, reqs, prefix_cache="radix", cache_aware=aware, max_bypass=3,
                               max_running=2, block_size=4, num_blocks=24)
        assert set(runs[aware].bypassed) == {r.id for r in reqs}
        assert all(r["bypassed"] == runs[aware].bypassed[r["id"]] for r in runs[aware].records())
    assert runs[False].summary()["max_bypassed"] == 0
    assert 0 < runs[True].summary()["max_bypassed"] <= 3
    assert runs[True].summary()["prefix_hit_rate"] >= runs[False].summary()["prefix_hit_rate"]


# ---- KV bytes in the timeline --------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(scheduler="continuous"), dict(scheduler="continuous", prefix_cache="radix"),
                                dict(scheduler="static", max_running=4)])
def test_timeline_kv_bytes_reserved_cover_live(tiny, kw):
    from studylib.serving.scheduler import dense_reserved

    model, _ = tiny
    reqs = workload(12, seed=5)
    engine, run = serve(model, reqs, block_size=4, **kw)
    per_token = model.config.kv_bytes_per_token(4)
    assert engine.kv_token_bytes == per_token
    for row in run.timeline:
        assert 0 < row["kv_live_bytes"] <= row["kv_reserved_bytes"]
        assert row["kv_live_bytes"] % per_token == 0 and row["kv_reserved_bytes"] % per_token == 0
        if kw["scheduler"] == "continuous" and "prefix_cache" not in kw:
            # The paged pool wastes less than one block per running sequence (the last, partial one).
            assert row["kv_reserved_bytes"] - row["kv_live_bytes"] < row["running"] * 4 * per_token
    if kw["scheduler"] == "static":
        first = [r for r in reqs if r.first_scheduled_s == min(q.first_scheduled_s for q in reqs)]
        row = run.timeline[0]  # the first batch's prefill: the whole rectangle, prompts only live
        assert row["kv_reserved_bytes"] == dense_reserved(first) * per_token
        assert row["kv_live_bytes"] == sum(len(r.prompt_ids) for r in first) * per_token


# ---- bench-serve --num-requests ------------------------------------------------------------------

def test_bench_serve_serves_every_request_of_a_file_by_default(tmp_path, capsys):
    from studylib.serving.workload import make_workload

    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"question {i}", "max_new_tokens": 2}) + "\n"
                            for i in range(20)))
    assert len(make_workload(str(path))) == 20 and len(make_workload("synthetic")) == 16
    rc = main(["bench-serve", "--model", "tiny-random", "--workload", str(path), "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["requests"] == 20  # not the first 16
    rc = main(["bench-serve", "--model", "tiny-random", "--workload", str(path), "--num-requests", "3", "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["requests"] == 3
    rc = main(["bench-serve", "--model", "tiny-random", "--workload", "synthetic", "--num-requests", "4",
               "--max-new-tokens", "2", "--prefix-cache", "radix", "--cache-aware", "--max-bypass", "0", "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["max_bypassed"] == 0
    rc = main(["bench-serve", "--model", "tiny-random", "--workload", "synthetic", "--max-bypass", "-1"])
    assert rc == 2 and "max_bypass" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_int8():
    return load_model("tiny-random", weights="q4_1", act="int8")[0]


@pytest.fixture(scope="module")
def tiny_bf16():
    return load_model("tiny-random", weights="q4_1", act="bf16")[0]


@pytest.mark.parametrize("name", ["continuous-radix-chunked-preempt", "static"])
def test_bf16_serving_is_exactly_single_request_ar_too(tiny_bf16, name):
    base = workload(8, seed=4)
    refs = ar_references(tiny_bf16, base)
    reqs = [Request(r.id, r.prompt_ids, r.max_new_tokens) for r in base]
    engine, _ = serve(tiny_bf16, reqs, **CONFIGS[name])
    assert engine.invariant and [r.output_ids for r in reqs] == refs


@pytest.mark.parametrize("name", list(CONFIGS))
def test_int8_serving_is_exactly_single_request_ar_through_the_fused_step(tiny_int8, name):
    """With int8 activations every step (prefill chunks, decodes, the paged pool, the dense
    rectangle) runs the one fused C step, whose rows are invariant by construction: the engine equals
    single-request AR token for token, in the default mode, under preemption and prefix hits."""
    from studylib.models import decode_layers

    base = workload(10, seed=3)
    refs = ar_references(tiny_int8, base)
    reqs = [Request(r.id, r.prompt_ids, r.max_new_tokens) for r in base]
    engine, _ = serve(tiny_int8, reqs, **CONFIGS[name])
    assert engine.invariant  # reported as batch-invariant: it is, by construction
    assert [r.output_ids for r in reqs] == refs
    if engine.pool is not None:
        from studylib.kvcache import PagedBatch

        view = PagedBatch(engine.pool, [[0]], [0], [1])
        assert decode_layers.path(tiny_int8, view, 1) == "fused"


def test_requests_carry_their_own_sampling(tiny_int8):
    """Greedy and sampled requests in one batch: the greedy ones stay exactly single-request AR, the
    sampled ones follow their own settings, and the same seeds replay the same run."""
    from studylib.sampling import SamplingParams

    base = workload(6, seed=5)
    refs = ar_references(tiny_int8, base)
    hot = SamplingParams(temperature=1.0, seed=11)

    def run():
        reqs = [Request(f"{r.id}:{k}", r.prompt_ids, r.max_new_tokens, sampling=None if k == "g" else hot)
                for r in base for k in ("g", "s")]
        serve(tiny_int8, reqs, scheduler="continuous", prefix_cache="radix", max_batch_tokens=32)
        return [r.output_ids for r in reqs]

    first, again = run(), run()
    assert first[0::2] == refs and first == again
    assert first[1::2] != refs
