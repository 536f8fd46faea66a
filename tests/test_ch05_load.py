"""Chapter 5 at load (``studylib.experiments.ch05_load``) on tiny-random: every function runs for real on
tiny sizes; the capacity search's logic is checked with a fake probe. No wall-clock thresholds."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest

from studylib.errors import StudylibError
from studylib.experiments import ch05_load as load
from studylib.serving.workload import WorkloadItem, synthetic_workload, to_requests

ENGINE = {"block_size": 4, "kv_budget_mib": 4}


def interleaved(n, n_prefix=4, prefix_len=32, seed=0):
    rng = random.Random(seed)
    stems = [[rng.randrange(3, 259) for _ in range(prefix_len)] for _ in range(n_prefix)]
    return [WorkloadItem(f"r{i}", rng.randint(2, 4), prompt_ids=stems[i % n_prefix] +
                         [rng.randrange(3, 259) for _ in range(rng.randint(2, 10))]) for i in range(n)]


# ---- (a) the workload ------------------------------------------------------------------------------

def test_shared_prefix_workload_interleaves_distinct_system_prompts(tiny):
    _, tok = tiny
    items = load.shared_prefix_workload(tok, 7, system_tokens=64, n_systems=3, seed=1, max_new_tokens=8,
                                        min_new_tokens=2)
    assert len(items) == 7 and len({i.id for i in items}) == 7
    systems = [i.messages[0]["content"] for i in items]
    assert all(i.messages[0]["role"] == "system" and i.messages[1]["role"] == "user" for i in items)
    assert len(set(systems[:3])) == 3 and systems[3:6] == systems[:3] and systems[6] == systems[0]  # A B C A ...
    assert all(60 <= len(tok.encode(s, add_special_tokens=False)) <= 64 for s in systems)
    assert all(2 <= i.max_new_tokens <= 8 for i in items)
    reqs = to_requests(items, tok)
    assert reqs[0].prompt_ids[:60] == reqs[3].prompt_ids[:60] != reqs[1].prompt_ids[:60]
    assert items == load.shared_prefix_workload(tok, 7, system_tokens=64, n_systems=3, seed=1, max_new_tokens=8,
                                                min_new_tokens=2)  # seeded


# ---- (b) capacity -----------------------------------------------------------------------------------

def fake_probe(capacity, calls=None):
    """A system whose p99 TTFT is 0.1 s up to ``capacity`` req/s and 10 s beyond."""
    def probe(rate):
        if calls is not None:
            calls.append(rate)
        return {"ttft_p99_s": 0.1 if rate <= capacity else 10.0, "tpot_p99_s": 0.01,
                "throughput_tok_s": 100.0 * min(rate, capacity)}
    return probe


def test_capacity_search_brackets_then_bisects_in_log_rate():
    calls = []
    res = load.capacity_search(None, None, [], ("continuous", "none"), {"ttft_s": 1.0, "tpot_s": 0.05},
                               rate_lo=1.0, rate_hi=16.0, probes=6, run_probe=fake_probe(3.0, calls))
    assert calls[:2] == [1.0, 16.0] and calls[2] == pytest.approx(4.0)  # the ends, then the geometric middle
    assert len(res.probes) == 6 and list(res.probes["rate"]) == calls
    lo, hi = res.bracket
    assert res.capacity == lo <= 3.0 < hi and hi / lo == pytest.approx(16 ** (1 / 16))  # 4 halvings of log range
    assert not res.censored
    assert {"arm", "rate", "ttft_p99_s", "tpot_p99_s", "throughput_tok_s", "met"} <= set(res.probes)
    assert list(res.probes["met"]) == [r <= 3.0 for r in calls]


def test_capacity_search_edges_and_table():
    slo = {"ttft_s": 1.0}
    # the floor at rate_lo: nothing below the range is tried
    none = load.capacity_search(None, None, [], ("static", "none"), slo, 1.0, 8.0, rate_floor=1.0,
                                run_probe=fake_probe(0.5))
    assert none.capacity is None and none.bracket == (None, 1.0) and len(none.probes) == 1
    top = load.capacity_search(None, None, [], ("continuous", "radix"), slo, 1.0, 8.0, run_probe=fake_probe(50))
    assert top.capacity == 8.0 and top.censored and len(top.probes) == 2
    # Unfinished requests fail a probe whatever the latencies.
    short = load.capacity_search(None, None, [], ("continuous", "none"), slo, 1.0, 8.0, probes=2,
                                 run_probe=lambda r: {**fake_probe(50)(r), "completed": 9 if r > 2 else 10,
                                                      "requests": 10})
    assert short.capacity == 1.0 and short.bracket == (1.0, 8.0)
    a = load.capacity_search(None, None, [], ("continuous", "none"), slo, 1.0, 16.0, run_probe=fake_probe(3.0))
    b = load.capacity_search(None, None, [], ("continuous", "radix"), slo, 1.0, 16.0, run_probe=fake_probe(6.0))
    table = load.capacity_table([a, b, none], baseline="continuous").set_index("arm")
    assert table.loc["continuous+radix", "capacity_vs_baseline"] == pytest.approx(b.capacity / a.capacity)
    assert table.loc["continuous", "capacity_vs_baseline"] == 1.0
    assert pd.isna(table.loc["static", "capacity_vs_baseline"])
    assert table.loc["continuous", "throughput_at_capacity_tok_s"] == pytest.approx(100 * a.capacity)
    with pytest.raises(StudylibError, match="baseline"):
        load.capacity_table([a], baseline="sequential")
    for bad in (dict(slo={}), dict(rate_lo=4.0, rate_hi=2.0), dict(probes=1), dict(slo={"ttft": 1.0})):
        kw = dict(slo=slo, rate_lo=1.0, rate_hi=8.0, probes=4, run_probe=fake_probe(3.0)) | bad
        with pytest.raises(StudylibError):
            load.capacity_search(None, None, [], ("continuous", "none"), **kw)


def test_capacity_search_steps_down_below_a_failed_range_then_bisects():
    """The committed run's search stopped after one probe: the lowest rate missed the SLO and nothing lower
    was tried. Now it steps down by the range's factor until a rate meets the SLO, then bisects."""
    calls = []
    res = load.capacity_search(None, None, [], ("continuous", "radix"), {"ttft_s": 1.0}, rate_lo=4.0,
                               rate_hi=8.0, probes=5, run_probe=fake_probe(1.5, calls), rate_floor=0.5)
    assert calls[:3] == [4.0, 2.0, 1.0]  # a factor of 2 (the range's) per step down
    assert calls[3] == pytest.approx(2 ** 0.5)  # then the geometric middle of (1, 2)
    assert res.capacity == pytest.approx(2 ** 0.5) and res.bracket[1] == pytest.approx(2 ** 0.75)
    assert res.capacity <= 1.5 < res.bracket[1] and not res.censored
    assert list(res.probes["met"]) == [r <= 1.5 for r in calls]
    # the floor stops the descent: 4, 2, 1 fail, and 0.5 is below a floor of 0.6
    low = load.capacity_search(None, None, [], ("continuous", "radix"), {"ttft_s": 1.0}, 4.0, 8.0, probes=6,
                               rate_floor=0.6, run_probe=fake_probe(0.3))
    assert list(low.probes["rate"]) == [4.0, 2.0, 1.0] and low.capacity is None and low.bracket == (None, 1.0)
    # the probe budget stops it too; the default floor is one range below rate_lo (4 / 2 = 2)
    short = load.capacity_search(None, None, [], ("continuous", "radix"), {"ttft_s": 1.0}, 4.0, 8.0, probes=6,
                                 run_probe=fake_probe(0.3))
    assert list(short.probes["rate"]) == [4.0, 2.0] and short.capacity is None
    with pytest.raises(StudylibError, match="rate_floor"):
        load.capacity_search(None, None, [], ("continuous", "radix"), {"ttft_s": 1.0}, 4.0, 8.0, rate_floor=5.0,
                             run_probe=fake_probe(0.3))


def test_capacity_search_runs_the_real_engine(tiny):
    model, tok = tiny
    items = synthetic_workload(6, 0, prompt_len=(4, 12), output_len=(2, 4))
    res = load.capacity_search(model, tok, items, ("continuous", "none"), {"ttft_s": 1e3, "tpot_s": 1e3},
                               rate_lo=200.0, rate_hi=400.0, probes=2, engine=ENGINE)
    assert res.capacity == 400.0 and res.censored  # a generous SLO: met at both ends
    assert list(res.probes["completed"]) == [6, 6] and res.probes["met"].all()


# ---- (c) latency under load -------------------------------------------------------------------------

def test_latency_under_load_pairs_requests_across_arms(tiny):
    model, tok = tiny
    items = synthetic_workload(8, 2, prompt_len=(4, 16), output_len=(2, 5))
    arms = [("sequential", "none"), ("continuous", "radix", {"cache_aware": True})]
    rows = load.latency_under_load(model, tok, items, 500.0, arms, seed=3, engine=ENGINE)
    assert len(rows) == 16 and set(rows["arm"]) == {"sequential", "continuous+radix[cache_aware=True]"}
    assert (rows["status"] == "finished").all() and (rows["e2el_s"] >= rows["ttft_s"]).all()
    by_arm = rows.groupby("arm")["output_tokens"].apply(list)
    assert by_arm.iloc[0] == by_arm.iloc[1] == [i.max_new_tokens for i in items]  # EOS ignored: same work
    est = load.e2e_ratio(rows, "continuous+radix[cache_aware=True]", "sequential")
    assert est.n == 8 and math.isfinite(est.value) and est.ci_low <= est.value <= est.ci_high


def test_e2e_ratio_is_the_paired_ratio_of_medians():
    rows = pd.DataFrame({"arm": ["b"] * 4 + ["t"] * 3, "id": ["1", "2", "3", "4", "1", "2", "3"],
                         "e2el_s": [2.0, 4.0, 6.0, 100.0, 1.0, 2.0, 3.0]})
    est = load.e2e_ratio(rows, treated="t", baseline="b")
    assert est.n == 3 and est.value == pytest.approx(2.0)  # request 4 has no pair
    with pytest.raises(StudylibError, match="arm"):
        load.e2e_ratio(rows, treated="x", baseline="b")


# ---- (d) cache-aware admission ----------------------------------------------------------------------

def test_cache_aware_comparison_respects_the_bound_and_hits_more(tiny):
    model, tok = tiny
    items = interleaved(24)
    df = load.cache_aware_comparison(model, tok, items, math.inf, max_bypass=3, engine={"block_size": 16},
                                     max_running=2).set_index("cache_aware")
    assert len(df) == 2 and (df["completed"] == 24).all()
    assert df.loc[False, "max_bypassed"] == 0 and 0 < df.loc[True, "max_bypassed"] <= 3
    assert df.loc[True, "prefix_hit_rate"] >= df.loc[False, "prefix_hit_rate"]
    assert df["kv_budget_mib"].nunique() == 1 and df["kv_budget_mib"].iloc[0] == pytest.approx(
        load.tight_kv_budget(model, tok, items, 2, 16))
    for col in ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s"):
        assert (df[col] > 0).all()


def test_tight_budget_holds_the_running_set_plus_one_prefix(tiny):
    model, tok = tiny
    items = interleaved(8, prefix_len=32)
    longest = max(r.max_total_tokens for r in to_requests(items, tok))
    blocks = 3 * -(-longest // 16) + 2 + 1  # 3 running + the 32-token prefix (2 blocks) + 1
    assert load.tight_kv_budget(model, tok, items, 3, 16) == blocks * 16 * 512 / 2**20
    assert load._longest_shared_prefix([[1, 2, 3], [1, 2, 4], [5]]) == 2


# ---- (e) fragmentation ------------------------------------------------------------------------------

def test_fragmentation_static_reserves_more_than_it_uses(tiny):
    model, tok = tiny
    items = synthetic_workload(16, 4, prompt_len=(4, 100), output_len=(2, 30))  # heterogeneous lengths
    df = load.fragmentation(model, tok, items, kv_budget_mib=0.5, engine={"block_size": 4}).set_index("arm")
    assert list(df.index) == ["static", "continuous"] and (df["completed"] == 16).all()
    assert (df["reserved_mean_mib"] >= df["live_mean_mib"]).all()
    assert (df["reserved_peak_mib"] <= 0.5 + 1e-9).all()  # within the budget
    assert (df["reserved_peak_mib"] >= df["live_at_peak_mib"]).all()
    assert df.loc["continuous", "waste_mean"] < df.loc["static", "waste_mean"]
    assert 0 <= df.loc["continuous", "waste_mean"] < 1 and 0 < df.loc["static", "waste_mean"] < 1
    assert (df["max_batch"] >= df["mean_batch"]).all() and (df["mean_batch"] >= 1).all()


def test_kv_memory_weights_steps_by_time():
    tl = [{"step_s": 3.0, "kv_reserved_bytes": 4 * 2**20, "kv_live_bytes": 2**20, "batch_seqs": 4},
          {"step_s": 1.0, "kv_reserved_bytes": 2 * 2**20, "kv_live_bytes": 2 * 2**20, "batch_seqs": 1}]
    m = load.kv_memory(tl)
    assert m["reserved_mean_mib"] == pytest.approx(3.5) and m["live_mean_mib"] == pytest.approx(1.25)
    assert m["waste_mean"] == pytest.approx(1 - 1.25 / 3.5)
    assert m["reserved_peak_mib"] == 4 and m["waste_at_peak"] == pytest.approx(0.75)
    assert m["mean_batch"] == pytest.approx(3.25) and m["max_batch"] == 4


# ---- (f) chunked prefill ----------------------------------------------------------------------------

def test_chunked_prefill_itl_measures_the_running_decodes(tiny):
    model, tok = tiny
    rng = np.random.default_rng(0)
    decodes = [WorkloadItem(f"d{i}", 12, prompt_ids=rng.integers(3, 259, 8).tolist()) for i in range(3)]
    longs = [WorkloadItem("long", 2, prompt_ids=rng.integers(3, 259, 200).tolist())]
    df = load.chunked_prefill_itl(model, tok, decodes, longs, [None, 32], engine=ENGINE,
                                  long_after_steps=[3]).set_index("chunk_size")
    assert list(df.index) == ["whole prompt", 32]
    assert (df["itl_samples"] == 3 * 11).all()  # every gap of every decode, EOS ignored
    assert (df["max_batch_tokens"] >= 200 + 3).all()  # the whole prompt fits one step
    assert df.loc["whole prompt", "long_prefill_steps"] == 1
    assert df.loc[32, "long_prefill_steps"] == math.ceil(200 / 32)  # one chunk per step, beside the decodes
    assert (df["itl_max_s"] >= df["itl_p99_s"]).all() and (df["itl_p99_s"] >= df["itl_p50_s"]).all()
    assert (df["long_ttft_p50_s"] > 0).all()
    with pytest.raises(StudylibError, match="max_new_tokens"):
        load.chunked_prefill_itl(model, tok, decodes, longs, [None], engine=ENGINE, long_after_steps=[12])
