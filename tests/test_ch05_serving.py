"""Chapter 5's saturation runs and what chapter 7 reads from them, on tiny-random (behaviour only)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from studylib.bench.stats import Estimate
from studylib.claims import HOLDS, INCONCLUSIVE
from studylib.errors import StudylibError
from studylib.experiments import ch05_batching as ch05
from studylib.experiments import ch05_load as load
from studylib.experiments import ch07_report as report
from studylib.experiments import ch07_system as sys7
from studylib.serving.workload import synthetic_workload

ENGINE = {"block_size": 4, "kv_budget_mib": 4, "max_running": 8}


def test_parse_arm_accepts_the_chapter_arms_and_names_the_fix():
    assert ch05.parse_arm("continuous+radix") == ("continuous", "radix", None)
    assert ch05.parse_arm("static") == ("static", "none", None)
    assert ch05.parse_arm("continuous+radix+lookup:8,3") == ("continuous", "radix", "prompt-lookup:8,3")
    assert ch05.parse_arm("sequential+lookup:4,2") == ("sequential", "none", "prompt-lookup:4,2")
    for name in ("continuous+radix+lookup:8,3", "sequential", "continuous+lookup:2,1"):
        assert ch05.arm_name(*ch05.parse_arm(name)) == name  # names round-trip
    assert ch05.base_arm("continuous+radix+lookup:8,3") == "continuous+radix"
    for bad in ("static+radix", "batched", "continuous+trie", "static+lookup:8,3", "continuous+lookup",
                "continuous+lookup:0,3", "continuous+lookup:8,3+radix", "continuous+radix+radix"):
        with pytest.raises(StudylibError, match="arm"):
            ch05.parse_arm(bad)


def test_the_lookup_interaction_is_its_gain_in_the_batch_over_its_gain_alone():
    from studylib.experiments import ch05_runs

    m = {"throughput:sequential": 10.0, "throughput:sequential+lookup:8,3": 12.0,
         "throughput:continuous+radix": 40.0, "throughput:continuous+radix+lookup:8,3": 36.0}
    assert ch05_runs.lookup_interactions(m) == {"interaction:continuous+radix+lookup:8,3": pytest.approx(0.9 / 1.2)}
    from studylib.bench.whole_runs import WholeRuns

    runs = WholeRuns("t:f", {}, [{"metrics": {**m, "gain:sequential+lookup:8,3/sequential": 1.2 + d,
                                              "gain:continuous+radix+lookup:8,3/continuous+radix": 0.9 + d,
                                              **ch05_runs.lookup_interactions(m)}} for d in (0, .01, -.01, .02, 0)])
    text = ch05_runs.lookup_text(runs)
    assert "1.20x" in text and "0.90x" in text and "took away part of the lookup's gain" in text
    assert "not measured" in ch05_runs.lookup_text(WholeRuns("t:f", {}, [{"metrics": {"throughput:sequential": 1.0}}]))
    # without the lookup alone (or the batch without the lookup) there is nothing to divide by
    assert ch05_runs.lookup_interactions({k: v for k, v in m.items() if "sequential+" not in k}) == {}
    assert ch05_runs.lookup_interactions({k: v for k, v in m.items() if k != "throughput:continuous+radix"}) == {}


def test_speculating_arms_serve_the_same_tokens_as_ar_and_their_runs_measure_the_interaction(tiny):
    """The forced stack's arm in chapter 5: prompt lookup inside the continuous + radix batch equals
    single-request AR (the equality table), and a whole run reports the lookup's gains and interaction."""
    from studylib.experiments import ch05_runs

    model, tok = tiny
    items = synthetic_workload(6, seed=3, output_len=(4, 8))
    arms = ["sequential", "sequential+lookup:4,2", "continuous+radix", "continuous+radix+lookup:4,2"]
    runs, _, outputs = ch05.saturation_runs(model, tok, items, arms, 2, engine=ENGINE)
    eq = ch05.equality(model, tok, items, outputs, 6)
    assert set(eq["arm"]) == set(arms) and (eq["identical"] == eq["requests"]).all()
    rec = ch05.c7_record(ch05.saturation_gains(runs), runs, "c")
    assert {a["arm"] for a in rec["arms"]} == set(arms)
    out = ch05_runs.timing_run("tiny-random", "dense", "fp32", 6, "chat", 0, 1, 0, 6, 2, arms, ENGINE,
                               run_index=1, run_count=2)
    for key in ("gain:continuous+radix+lookup:4,2/sequential", "gain:continuous+radix+lookup:4,2/continuous+radix",
                "gain:sequential+lookup:4,2/sequential", "interaction:continuous+radix+lookup:4,2"):
        assert out[key] > 0


def test_saturation_runs_split_sequential_serves_every_request_once(tiny):
    model, tok = tiny
    items = synthetic_workload(7, seed=2, output_len=(2, 4))
    runs, timelines, outputs = ch05.saturation_runs(model, tok, items, ["sequential", "continuous+radix"], 3,
                                                    engine=ENGINE)
    seq = runs[runs["arm"] == "sequential"].sort_values("repeat")
    assert seq["requests"].tolist() == [3, 2, 2]  # request i in repeat i mod 3
    # one at a time, the idle TTFT (queue taken out) is positive and below the queued median; batched arms have none
    assert (seq["idle_ttft_p50_s"] > 0).all() and (seq["idle_ttft_p50_s"] <= seq["ttft_p50_s"]).all()
    assert runs[runs["arm"] == "continuous+radix"]["idle_ttft_p50_s"].isna().all()
    assert ch05.scaled_slo(runs, 3.0)["ttft_s"] == pytest.approx(3 * seq["idle_ttft_p50_s"].median(), abs=1e-4)
    assert (runs[runs["arm"] == "continuous+radix"]["requests"] == 7).all()
    assert set(outputs["sequential"]) == set(outputs["continuous+radix"]) == {i.id for i in items}
    # Batch-invariant kernels: one request at a time and all at once give the same greedy tokens.
    assert outputs["sequential"] == outputs["continuous+radix"]
    assert set(timelines) == {("sequential", math.inf), ("continuous+radix", math.inf)}
    gains = ch05.saturation_gains(runs)
    assert set(gains["baseline"]) == {"sequential"} and (gains["repeats"] == 3).all()
    rec = ch05.c7_record(gains, runs, "conditions")
    arms = {a["arm"]: a for a in rec["arms"]}
    assert arms["sequential"]["gain"] == 1.0 and arms["continuous+radix"]["repeats"] == 3
    eq = ch05.equality(model, tok, items, outputs, 4)
    assert (eq["identical"] == eq["requests"]).all() and (eq["requests"] == 4).all()


def _sat(seq_rps=1.0, seq_tpot=0.05, seq_ttft=0.2):
    return pd.DataFrame([{"arm": "sequential", "rate": math.inf, "repeat": k, "requests_per_s": seq_rps,
                          "tpot_p50_s": seq_tpot, "idle_ttft_p50_s": seq_ttft, "throughput_tok_s": 10.0}
                         for k in range(3)])


def test_scaled_slo_tolerates_one_slowdown_on_both_idle_latencies():
    slo = ch05.scaled_slo(_sat(seq_tpot=0.04, seq_ttft=0.15), tpot_factor=3.0)
    assert slo["tpot_s"] == pytest.approx(0.12) and slo["ttft_s"] == pytest.approx(0.45)
    with pytest.raises(StudylibError, match="sequential"):
        ch05.scaled_slo(_sat().assign(arm="static"), 3.0)
    with pytest.raises(StudylibError, match="TTFT"):  # a run that recorded no idle TTFT cannot set the limit
        ch05.scaled_slo(_sat().assign(idle_ttft_p50_s=math.nan), 3.0)


def test_the_idle_ttft_takes_the_queue_out_of_one_at_a_time_serving():
    from types import SimpleNamespace

    def req(arrival, first, finished):
        return SimpleNamespace(arrival_s=arrival, token_times=[first, finished], finished_s=finished)

    # all queued at 0: service starts when the previous request finishes; a late arrival starts on arrival
    reqs = [req(0.0, 0.3, 1.0), req(0.0, 1.2, 2.0), req(5.0, 5.1, 6.0), req(0.0, 2.4, 3.0)]
    assert ch05.unqueued_ttfts(reqs) == pytest.approx([0.3, 0.2, 0.4, 0.1])
    # their TTFTs from arrival (0.3, 1.2, 2.4, 0.1) carry the queue
    assert ch05.unqueued_ttfts([req(0.0, 0.3, 1.0), SimpleNamespace(arrival_s=0.0, token_times=[],
                                                                   finished_s=None)]) == pytest.approx([0.3])


def test_capacity_is_bounded_against_sequentials_service_rate():
    probes = pd.DataFrame([{"arm": "continuous+radix", "probe": k, "rate": r, "met": r < 5, "requests": 200,
                            "completed": 200, "ttft_p99_s": 0.5, "tpot_p99_s": tp, "throughput_tok_s": 80.0,
                            "requests_per_s": rps} for k, (r, tp, rps) in enumerate([(4.0, 0.05, 3.6), (6.0, 0.2, 5.0)])])
    cap = load.Capacity("continuous+radix", 4.0, (4.0, 6.0), probes, {"ttft_s": 1.0, "tpot_s": 0.1})
    t = load.capacity_vs_sequential(cap, _sat(seq_rps=0.5)).iloc[0]
    assert t.capacity_gain_at_least == pytest.approx(8.0) and t.sequential_service_rate_req_s == 0.5
    text = load.explain_capacity(cap, _sat(seq_rps=0.5), {"ttft_s": 1.0, "tpot_s": 0.1}, 3.0)
    assert "at least 8.00x" in text and "completed 3.60 requests/s" in text and "7.20x counted on completed" in text
    # the rate that failed missed TPOT; TTFT was met there, so the text names TPOT as the binding limit
    assert "At 6.00 requests/s it missed the TPOT limit; the TTFT limit still held there." in text


def test_a_capacity_below_every_probe_says_what_bounds_it():
    slo = {"ttft_s": 0.23, "tpot_s": 0.02}
    probes = pd.DataFrame([{"arm": "continuous+radix", "probe": k, "rate": r, "met": False, "requests": 200,
                            "completed": 200, "ttft_p99_s": t, "tpot_p99_s": 0.015, "throughput_tok_s": 80.0}
                           for k, (r, t) in enumerate([(4.0, 0.40), (2.0, 0.30)])])
    cap = load.Capacity("continuous+radix", None, (None, 2.0), probes, slo)
    text = load.explain_capacity(cap, _sat(seq_rps=0.5), slo, 3.0)
    assert "down to 2.00 requests/s, 4.00x sequential" in text and "2 probes" in text
    assert "p99 TTFT 0.3 s against 0.23 s (1.30x the limit)" in text and "TPOT" not in text.split("At that")[1]
    assert "capacity is below that" in text


def test_chapter7_reads_chapter5s_serving_rows(tmp_path):
    assert sys7.serving_from_chapter5(tmp_path) is None  # chapter 5 has not run here
    runs = pd.DataFrame([{"arm": a, "rate": math.inf, "repeat": k, "requests": 64,
                          "throughput_tok_s": t * (1 + 0.01 * k)}
                         for k in range(5) for a, t in (("sequential", 20.0), ("continuous+radix", 200.0))])
    gains = ch05.saturation_gains(runs)
    rec = ch05.c7_record(gains, runs, "64 requests")
    lat = pd.DataFrame([{"arm": a, "id": f"r{i}", "rate": 0.5, "status": "finished", "e2el_s": e * (1 + i / 10),
                         "ttft_s": 0.1, "tpot_s": 0.01} for i in range(12) for a, e in (("sequential", 30.0),
                                                                                     ("continuous+radix", 2.0))])
    est = load.e2e_ratio(lat, "continuous+radix", "sequential")
    record = {"measurements": {"serving_for_c7": rec, "runs": runs.to_dict("records"),
                               "latency_under_load": load.latency_record(lat, est, 0.5, 0.8)}}
    (tmp_path / "ch05.json").write_text(json.dumps(record))
    got = sys7.serving_from_chapter5(tmp_path)
    best = got["tsum"].set_index("policy").loc[sys7.BEST_POLICY]
    assert best.gain == pytest.approx(10.0) and best.repeats == 5
    assert got["under_load"]["n"] == 12 and "chapter 5" in got["serving"]
    row = report.judge_latency_under_load(got["under_load"], got["serving"])
    assert row.verdict == HOLDS and row.n == 12 and "0.50 req/s" in row.metric
    assert row.measured == pytest.approx(15.0)


def test_latency_under_load_counts_seeded_traces_not_requests():
    """C7's latency under load: requests in one trace share its queue, so the trace is the unit. Ten traces
    of 12 requests give n = 10 traces, and chapter 7 judges the row in traces; three traces cannot decide."""
    lat = pd.DataFrame([{"arm": a, "id": f"r{i}", "trace": t, "rate": 0.5, "status": "finished",
                         "e2el_s": e * (1 + i / 10) * (1 + t / 50), "ttft_s": 0.1, "tpot_s": 0.01}
                        for t in range(10) for i in range(12)
                        for a, e in (("sequential", 30.0), ("continuous+radix", 2.0))])
    est = load.e2e_ratio_over_traces(lat, "continuous+radix", "sequential")
    assert est.n == 10 and est.value == pytest.approx(15.0) and est.ci_low <= 15.0 <= est.ci_high
    rec = load.latency_record(lat, est, 0.5, 0.8)
    assert rec["unit"] == "traces" and rec["n"] == 10
    row = report.judge_latency_under_load(rec, "s")
    assert row.unit == "traces" and row.n == 10 and row.verdict == HOLDS
    few = lat[lat.trace < 3]
    est3 = load.e2e_ratio_over_traces(few, "continuous+radix", "sequential")
    assert est3.n == 3
    assert report.judge_latency_under_load(load.latency_record(few, est3, 0.5, 0.8), "s").verdict == INCONCLUSIVE
    assert "independently seeded traces" in load.explain_latency(lat, est, 0.5, 0.8)


def test_e2e_ratio_is_a_paired_estimate():
    lat = pd.DataFrame([{"arm": a, "id": f"r{i}", "e2el_s": v} for i in range(10)
                        for a, v in (("sequential", 4.0 + i), ("continuous+radix", 2.0 + i / 2))])
    est = load.e2e_ratio(lat, "continuous+radix", "sequential")
    assert isinstance(est, Estimate) and est.n == 10 and est.value == pytest.approx(2.0)
    assert np.isfinite(est.ci_low) and est.ci_low <= est.value <= est.ci_high


def test_vllm_peer_from_another_machine_is_not_compared(tmp_path):
    import json

    from studylib.bench.provenance import cpu_model
    from studylib.experiments import ch05_interplay as inter

    (tmp_path / "peers").mkdir()
    f = tmp_path / "peers" / "vllm_cpu.json"
    f.write_text(json.dumps({"vllm_version": "0.32.0", "requests": 4, "cpu": "Some Other CPU"}))
    assert inter.vllm_peer(tmp_path) is None
    assert "not compared" in inter.vllm_status(None, tmp_path) and "Some Other CPU" in inter.vllm_status(None, tmp_path)
    f.write_text(json.dumps({"vllm_version": "0.32.0", "requests": 4}))  # machine unrecorded
    assert inter.vllm_peer(tmp_path) is None and "does not record" in inter.vllm_status(None, tmp_path)
    f.write_text(json.dumps({"vllm_version": "0.32.0", "requests": 4, "cpu": cpu_model()}))
    assert inter.vllm_peer(tmp_path)["requests"] == 4
