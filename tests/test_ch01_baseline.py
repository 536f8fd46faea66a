"""Chapter 1 measurement code on the tiny random model, and its verdict rules on synthetic numbers."""

import numpy as np
import pandas as pd
import pytest

from studylib.bench.stats import Estimate
from studylib.claims import CONDITIONAL, FAILS, HOLDS
from studylib.errors import StudylibError
from studylib.experiments import ch01_baseline as ch01


@pytest.fixture
def model(tiny):
    return tiny[0]  # the shared tiny-random (model, tokenizer) from conftest


def test_latency_curve_has_every_token_of_every_repeat(model):
    curve = ch01.latency_curve(model, [1, 5, 9, 13], max_new_tokens=6, repeats=2)
    assert len(curve) == 12 and sorted(curve["repeat"].unique()) == [1, 2]
    for _, g in curve.groupby("repeat"):
        assert list(g["new_tokens"]) == [1, 2, 3, 4, 5, 6]
        assert g["seconds"].is_monotonic_increasing


def test_fit_is_per_repeat_so_prefill_offsets_do_not_count_against_linearity():
    n = np.arange(1, 33)
    # Two perfectly linear repeats with very different prefill times: pooled R^2 would be poor.
    curve = pd.DataFrame({"new_tokens": np.r_[n, n], "seconds": np.r_[0.5 + 0.02 * n, 3.0 + 0.02 * n],
                          "repeat": [1] * 32 + [2] * 32})
    fit = ch01.fit_latency(curve)
    assert fit["r2"] == pytest.approx(1.0) and fit["slope_ms_per_token"] == pytest.approx(20.0)
    bent = curve.assign(seconds=0.5 + 0.0005 * curve["new_tokens"] ** 3)
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


def scaling_with(growth_at_4):
    return pd.DataFrame({"batch": [1, 4, 16], "time_vs_batch1": [1.0, growth_at_4, 6.0]})


@pytest.mark.parametrize("r2,growth,expected", [(0.999, 1.2, HOLDS), (0.999, 3.9, CONDITIONAL),
                                                (0.9, 3.9, FAILS)])
def test_judge_c1(r2, growth, expected):
    fit = {"r2": r2}
    assert ch01.judge_c1(fit, scaling_with(growth), "synthetic").verdict == expected
    with pytest.raises(StudylibError, match="batch size above 1"):
        ch01.judge_c1(fit, pd.DataFrame({"batch": [1], "time_vs_batch1": [1.0]}), "synthetic")


@pytest.mark.parametrize("fraction,intensity,expected", [
    (Estimate(0.7, 0.6, 0.8, 3, [0.6, 0.7, 0.8]), 0.5, HOLDS),
    (Estimate(0.2, 0.15, 0.25, 3, [0.15, 0.2, 0.25]), 0.5, CONDITIONAL),
])
def test_judge_c2(fraction, intensity, expected):
    points = pd.DataFrame({"intensity": [intensity, 2.0]})
    kv = pd.DataFrame({"formula_bytes": [64e6, 256e6], "measured_over_formula": [1.01, 1.0]})
    v = ch01.judge_c2(fraction, points, {"ridge_flop_per_byte": 3.0}, kv, "synthetic")
    assert v.verdict == expected and v.measured == fraction.value


def test_judge_c2_does_not_hold_when_nothing_points_at_memory():
    fraction = Estimate(0.1, 0.05, 0.15, 3, [0.05, 0.1, 0.15])
    kv = pd.DataFrame({"formula_bytes": [64e6], "measured_over_formula": [1.5]})
    v = ch01.judge_c2(fraction, pd.DataFrame({"intensity": [8.0]}), {"ridge_flop_per_byte": 3.0}, kv, "synthetic")
    assert v.verdict == FAILS
