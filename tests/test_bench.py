"""The harness's statistics and roofline model (numbers, not timings)."""

from __future__ import annotations

from studylib.bench.roofline import decode_bytes_per_step, roofline_tokens_per_s
from studylib.bench.stats import estimate, ratio_estimate
from studylib.models.presets import preset_config


def test_estimate_median_and_ci_bracket():
    e = estimate([1.0, 2.0, 3.0, 4.0, 100.0])
    assert e.value == 3.0 and e.ci_low <= 3.0 <= e.ci_high and e.n == 5


def test_ratio_estimate_is_paired():
    base = [2.0, 4.0, 6.0, 8.0]
    treated = [1.0, 2.0, 3.0, 4.0]  # exactly 2x on every pair, despite the spread across pairs
    r = ratio_estimate(base, treated)
    assert r.value == 2.0 and r.ci_low == 2.0 and r.ci_high == 2.0


def test_roofline_bytes_and_limit():
    cfg = preset_config("smollm2-135m")
    b0 = decode_bytes_per_step(cfg, 0, 2)
    assert b0 == cfg.num_params * 2 + cfg.kv_bytes_per_token(2)
    assert decode_bytes_per_step(cfg, 1000, 2) - b0 == 1000 * cfg.kv_bytes_per_token(2)
    # 10 GB/s over ~270 MB of bf16 weights -> about 37 tokens/s
    tps = roofline_tokens_per_s(cfg, 0, "bfloat16", 10.0)
    assert abs(tps - 10e9 / b0) < 1e-6
    assert roofline_tokens_per_s(cfg, 0, "bfloat16", 10.0, batch=8) > 7 * tps  # weights shared by the batch
