"""Chapter 1 measurement code on the tiny random model, and its verdict rules on synthetic numbers."""

import numpy as np
import pandas as pd
import pytest

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


def steps_with(growth_at_4, repeats=6, noise=0.01):
    """Interleaved step timings whose batch-4 step costs ``growth_at_4`` batch-1 steps."""
    rng = np.random.default_rng(1)
    rows = []
    for r in range(1, repeats + 1):
        base = 0.03 * (1 + noise * rng.standard_normal())
        for b, g in ((1, 1.0), (4, growth_at_4), (16, 6.0)):
            rows.append({"batch": b, "repeat": r, "step_s": base * g * (1 + noise * rng.standard_normal())})
    return pd.DataFrame(rows)


def fit_with(r2, n=12, spread=0.0005):
    return {"r2_estimate": Estimate(r2, r2 - spread, min(r2 + spread, 1.0), n, [r2] * n)}


@pytest.mark.parametrize("r2,growth,expected", [(0.999, 1.2, HOLDS), (0.999, 3.9, FAILS), (0.9, 1.2, FAILS)])
def test_judge_c1_needs_both_parts(r2, growth, expected):
    rows = ch01.judge_c1(fit_with(r2), steps_with(growth), "synthetic")
    assert [v.role for v in rows] == ["decision", "part", "part"]
    assert rows[0].verdict == expected
    assert rows[2].n == 6 and rows[2].threshold == 2.0 and rows[2].direction == "at_most"
    with pytest.raises(StudylibError, match="batch size above 1"):
        ch01.judge_c1(fit_with(r2), steps_with(growth).query("batch == 1"), "synthetic")


def test_judge_c1_on_too_few_prompts_is_inconclusive():
    rows = ch01.judge_c1(fit_with(0.999, n=3), steps_with(1.2), "synthetic")
    assert rows[0].verdict == INCONCLUSIVE and rows[1].verdict == INCONCLUSIVE


@pytest.mark.parametrize("fraction,intensity,expected", [
    (Estimate(0.7, 0.6, 0.8, 10, [0.7] * 10), 0.5, HOLDS),
    (Estimate(0.2, 0.15, 0.25, 10, [0.2] * 10), 0.5, FAILS),
    (Estimate(0.7, 0.6, 0.8, 3, [0.6, 0.7, 0.8]), 0.5, INCONCLUSIVE),  # three repeats decide nothing
])
def test_judge_c2(fraction, intensity, expected):
    points = pd.DataFrame({"intensity": [intensity, 2.0]})
    kv = pd.DataFrame({"formula_bytes": [64e6, 256e6], "measured_over_formula": [1.01, 1.0]})
    rows = ch01.judge_c2(fraction, points, {"ridge_flop_per_byte": 3.0}, kv, "synthetic")
    assert rows[0].verdict == expected and rows[2].measured == fraction.value


def test_judge_c2_does_not_hold_when_nothing_points_at_memory():
    fraction = Estimate(0.1, 0.05, 0.15, 10, [0.1] * 10)
    kv = pd.DataFrame({"formula_bytes": [64e6], "measured_over_formula": [1.5]})
    rows = ch01.judge_c2(fraction, pd.DataFrame({"intensity": [8.0]}), {"ridge_flop_per_byte": 3.0}, kv, "synth")
    assert rows[0].verdict == FAILS and all(v.verdict == FAILS for v in rows[1:])
