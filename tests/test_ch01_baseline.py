"""Chapter 1 measurement code on the tiny random model, and its verdict rules on synthetic numbers."""

import numpy as np
import pandas as pd
import pytest
import torch

from studylib.bench.stats import Estimate
from studylib.claims import FAILS, HOLDS, INCONCLUSIVE
from studylib.errors import StudylibError
from studylib.experiments import ch01_baseline as ch01


@pytest.fixture
def model(tiny):
    return tiny[0]  # the shared tiny-random (model, tokenizer) from conftest


def test_latency_by_length_is_one_generation_per_point_in_rotating_order(model):
    curve = ch01.latency_by_length(model, [[1, 5, 9, 13], [2, 4, 6]], [2, 4, 6])
    assert len(curve) == 6 and sorted(curve["prompt"].unique()) == [0, 1]
    assert list(curve["new_tokens"]) == [2, 4, 6, 4, 6, 2]  # the second prompt starts elsewhere
    assert (curve["seconds"] > 0).all()
    with pytest.raises(StudylibError, match="three output lengths"):
        ch01.latency_by_length(model, [[1, 2]], [2, 4])


def test_fit_is_per_prompt_so_prefill_offsets_do_not_count_against_linearity():
    n = np.array([8, 16, 32, 64])
    rng = np.random.default_rng(0)
    # Linear prompts with very different prefill times: pooled R^2 would be poor; the fit is per prompt.
    rows = [{"prompt": p, "new_tokens": k, "seconds": 0.5 * p + 0.02 * k + 1e-4 * rng.standard_normal()}
            for p in range(12) for k in n]
    fit = ch01.fit_latency(pd.DataFrame(rows))
    assert fit["r2"] == pytest.approx(1.0, abs=1e-3) and fit["slope_ms_per_token"] == pytest.approx(20.0, rel=0.01)
    assert fit["r2_estimate"]["n"] == 12 and fit["prompts"] == 12
    bent = pd.DataFrame(rows).assign(seconds=lambda d: 0.5 + 1e-5 * d["new_tokens"] ** 3)
    assert ch01.fit_latency(bent)["r2"] < 0.99


def test_step_time_and_roofline_points(model):
    steps = ch01.step_time_vs_batch(model, [1, 2, 4], context=16, repeats=2)
    assert len(steps) == 6 and (steps["step_s"] > 0).all()
    scaling = ch01.batch_scaling(steps)
    assert list(scaling["batch"]) == [1, 2, 4] and scaling["time_vs_batch1"].iloc[0] == 1.0
    points = ch01.roofline_points(model.config, scaling, 16, "float32")
    # Batching reuses every weight byte: intensity must grow with the batch.
    assert points["intensity"].is_monotonic_increasing


def test_kv_memory_formula_matches_the_cache_tensors(model):
    kv = ch01.kv_memory(model.config, [64, 128], [1, 2], "float32")
    assert len(kv) == 4
    assert (kv["tensor_bytes"] == kv["formula_bytes"]).all()
    c = model.config
    assert kv["formula_bytes"].iloc[-1] == 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4 * 128 * 2


def fit_with(r2, n=12, spread=0.0005):
    return {"r2_estimate": Estimate(r2, r2 - spread, min(r2 + spread, 1.0), n, [r2] * n)}


def share_with(value, n=12, spread=0.05):
    return {"at": "gguf", "engines": ["dense fused", "q8_0", "gguf", "q4_0"],
            "estimate": Estimate(value, value - spread, value + spread, n, [])}


def runs_with(value, n=5, spread=0.03):
    """A CI over ``n`` whole runs (t on logs) around ``value``."""
    from studylib.bench.stats import run_estimate

    return run_estimate(list(np.linspace(value - spread, value + spread, n)))


@pytest.mark.parametrize("r2,share,expected", [(0.999, 0.8, HOLDS), (0.999, 0.2, FAILS), (0.9, 0.8, HOLDS),
                                               (0.999, 0.52, INCONCLUSIVE)])
def test_judge_c1_is_decided_by_the_share_over_whole_runs(r2, share, expected):
    # the R² part is shown, never counted (a loop of equal steps is linear by construction): a poor R²
    # does not sink C1, and a share near the bar over runs that spread reads inconclusive
    rows = ch01.judge_c1(fit_with(r2), share_with(share), "synthetic", runs_with(share), "5 whole runs")
    assert [v.role for v in rows] == ["decision", "part", "part"]
    assert rows[0].verdict == expected and rows[1].by_construction and not rows[2].by_construction
    assert rows[2].n == 5 and rows[2].unit == "whole runs" and rows[2].threshold == 0.5
    assert rows[2].ci_method.startswith("t on the log") and "shown, not deciding" in rows[2].conditions
    # the bars are the declared ones: the rows pass the declaration check
    from studylib.decisions import stamp
    assert len(stamp(rows, 1)) == 3


def test_judge_c1_without_whole_runs_cannot_decide():
    # a CI over the prompts of one run is no CI over runs: the row counts prompts where repeats are declared
    rows = ch01.judge_c1(fit_with(0.999), share_with(0.8, n=12), "synthetic")
    assert rows[0].verdict == INCONCLUSIVE and rows[2].verdict == INCONCLUSIVE


def _runs(fixed_s, gbs, prompts=12, noise=0.01, seed=0):
    """Synthetic per-prompt step times: fixed_s + bytes / bandwidth, for four formats on one path."""
    rng = np.random.default_rng(seed)
    mb = {"dense per-op": 540.0, "dense fused": 540.0, "q8_0": 150.0, "gguf": 90.0, "q4_0": 80.0, "gguf int8": 90.0,
          "gguf bf16": 90.0, "q4_1": 90.0, "q4_1 int8": 90.0, "q4_1 bf16": 90.0}
    rows = []
    for p in range(prompts):
        for e, m in mb.items():
            t = (fixed_s + m * 1e6 / (gbs * 1e9)) * (1 + noise * rng.standard_normal())
            rows.append({"engine": e, "prompt": p, "step_s": t, "mbytes_per_step": m, "tokens": [1, 2]})
    return pd.DataFrame(rows)


def test_bytes_share_tells_memory_bound_from_overhead_bound():
    from studylib.experiments import ch01_formats as fm

    bound = fm.bytes_share(_runs(fixed_s=0.0005, gbs=20.0))
    assert bound["estimate"].value > 0.8 and bound["estimate"].ci_low > 0.5 and bound["r2"] > 0.99
    assert bound["implied_gbs"] == pytest.approx(20.0, rel=0.05) and bound["estimate"].n == 12
    # the same bytes with a large fixed cost per step: time barely follows bytes at 4-bit
    overhead = fm.bytes_share(_runs(fixed_s=0.02, gbs=20.0))
    assert overhead["estimate"].ci_high < 0.5


def test_fastest_faithful_engine_decides_c2_and_never_a_lossy_one():
    from studylib.experiments import ch01_formats as fm

    by = fm.fraction_by_engine(_runs(fixed_s=0.001, gbs=20.0), bandwidth_gbs=40.0)
    assert set(by.engine) == set(fm.ENGINES)
    # q4_0 is the fastest, but it changes the weights: the decisive engine is gguf
    assert by.sort_values("tok_s").iloc[-1].engine == "q4_0" and fm.fastest_faithful(by).engine == "gguf"


def _kv(measured_over=(0.0, 0.0, 0.0)):
    formula = np.array([11.8e6, 47.2e6, 189e6])
    overhead = 0.25e6
    return pd.DataFrame({"batch": [1, 4, 8], "context": [256, 256, 512], "formula_bytes": formula,
                         "measured_bytes": formula + overhead + np.array(measured_over) * formula,
                         "formula_mb": formula / 1e6,
                         "measured_mb": (formula + overhead + np.array(measured_over) * formula) / 1e6})


@pytest.mark.parametrize("fraction,intensity,expected", [
    ([0.7, 0.72, 0.69, 0.71, 0.7], 0.5, HOLDS),
    ([0.2, 0.22, 0.19, 0.21, 0.2], 0.5, FAILS),
    ([0.46, 0.55, 0.48, 0.50, 0.47], 0.5, INCONCLUSIVE),  # runs that straddle the bar (issue 43's five runs)
    ([0.7, 0.72, 0.69], 0.5, INCONCLUSIVE),  # three runs decide nothing
    ([0.7, 0.72, 0.69, 0.71, 0.7], 5.0, HOLDS),  # the intensity is analytic: shown, never counted
])
def test_judge_c2_over_whole_runs(fraction, intensity, expected):
    from studylib.bench.stats import run_estimate

    points = pd.DataFrame({"intensity": [intensity, 2.0]})
    prompt_level = Estimate(0.7, 0.69, 0.71, 10, [0.7] * 10)
    row = pd.Series({"engine": "gguf", "estimate": prompt_level})
    runs = run_estimate(fraction)
    rows = ch01.judge_c2(row, points, {"ridge_flop_per_byte": 3.0}, _kv(), "synthetic", runs, "runs", "gguf")
    assert rows[0].verdict == expected and rows[2].measured == pytest.approx(runs.value) and "gguf" in rows[2].metric
    assert rows[1].by_construction and rows[3].by_construction and rows[2].unit == "whole runs"
    from studylib.decisions import stamp
    assert len(stamp(rows, 1)) == 4


def test_kv_check_keeps_every_row_and_fails_on_one_that_is_off():
    ok = ch01.kv_check(_kv())
    assert len(ok["rows"]) == 3 and all(ok["rows"].values()) and ok["overhead_mb"] == pytest.approx(0.25)
    bad = ch01.kv_check(_kv((0.0, 0.0, 0.3)))
    assert list(bad["rows"].values()) == [True, True, False]


def test_judge_c2_does_not_hold_when_nothing_points_at_memory():
    from studylib.bench.stats import run_estimate

    fraction = Estimate(0.1, 0.05, 0.15, 10, [0.1] * 10)
    row = pd.Series({"engine": "gguf", "estimate": fraction})
    rows = ch01.judge_c2(row, pd.DataFrame({"intensity": [8.0]}), {"ridge_flop_per_byte": 3.0}, _kv((0, 0, 0.5)),
                         "synth", run_estimate([0.1, 0.11, 0.09, 0.1, 0.1]), "runs", "gguf")
    assert rows[0].verdict == FAILS and all(v.verdict == FAILS for v in rows[1:])


def test_engines_made_from_a_loaded_model_are_the_engines_loaded_afresh_and_leave_it_alone():
    from studylib.decoding import ar
    from studylib.experiments import ch01_formats as formats
    from studylib.models import load_model

    base, _ = load_model("tiny-random", "cpu", "float32")
    before = {k: v.clone() for k, v in base.state_dict().items()}
    names = ["dense fused", "q8_0", "q4_1", "q4_1 int8"]
    shared = formats.load_engines("tiny-random", names, "cpu", progress=False, base=base)
    fresh = formats.load_engines("tiny-random", names, "cpu", progress=False)
    prompt = [1, 5, 9, 200, 31, 7]
    for name in names:
        assert shared[name].weights_format == fresh[name].weights_format
        assert shared[name].act == fresh[name].act
        assert ar.generate(shared[name], prompt, 12).token_ids == ar.generate(fresh[name], prompt, 12).token_ids, name
    # The dense sibling shares the base's storage (no second fp32 copy) and only it runs fused decode.
    assert shared["dense fused"].lm_head.weight.data_ptr() == base.lm_head.weight.data_ptr()
    assert shared["dense fused"].fused_decode and not base.fused_decode
    assert base.weights_format == "dense" and base.act == "fp32"
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())


def test_the_bench_sentence_formats_its_byte_ratio_from_the_rooflines():
    """It once said '5.6x fewer bytes per token' as a fixed string, beside rooflines that gave 5.35x."""
    from studylib.experiments.ch01_report import explain_bench

    def bench(roof):
        return {"speedup_vs_hf": {"value": 1.2, "ci_low": 1.1, "ci_high": 1.3}, "identical_to_hf": 1.0,
                "prompts": 10, "repeats": 1, "max_new_tokens": 64, "fraction_of_roofline": {"value": 0.5},
                "roofline_tok_s": roof}

    text = explain_bench({"dense": bench(54.84), "gguf": bench(293.34)})
    assert "5.3x fewer bytes per token" in text and "1 repeat of" in text and "`" not in text
