"""The harness's statistics and roofline model (numbers, not timings)."""

from __future__ import annotations

import pytest
import torch

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


def test_bench_steps_measures_v_of_k_and_labels_the_roofline_a_model(tmp_path):
    """``bench steps`` on a tiny block model with int8 activations: every row count measured, v(1) = 1,
    the ridge point from the measured peak and bandwidth, the kernel path named, the JSON written."""
    from studylib.bench.steps import parse_rows, run_steps, summary_lines

    assert parse_rows("4,2") == [1, 2, 4]
    res = run_steps("tiny-random", "q4_1", "int8", [1, 2, 4], context=8, repeats=2, threads=1, out_dir=tmp_path,
                    progress=False)
    steps = {s["rows"]: s for s in res["steps"]}
    assert sorted(steps) == [1, 2, 4] and steps[1]["v"] == 1.0 and all(s["n"] == 2 for s in steps.values())
    assert all(s["path"] == "fused" for s in steps.values())
    assert "int8" in res["kernel"] and res["provenance"]["int8_kernel"] in res["kernel"]
    curve = res["model_curve"]
    assert curve["ridge_rows"] > 0 and curve["v_model"]["1"] == 1.0
    assert (tmp_path / "steps_q4_1_int8.json").exists()
    assert any("not a measurement" in line for line in summary_lines(res))


def test_the_bench_on_a_loaded_base_shares_its_weights_and_matches_hf_token_for_token():
    """A random model's HF peer is built over our tensors (no copy) and still decodes what ours does."""
    from studylib.bench.ar_bench import run_ar_bench
    from studylib.models import hf_twin, load_model

    lm, tok = load_model("tiny-random", "cpu", "float32")
    hf = hf_twin(lm)
    assert hf.lm_head.weight.data_ptr() == lm.lm_head.weight.data_ptr()
    assert hf.model.layers[0].mlp.down_proj.weight.data_ptr() == lm.model.layers[0].mlp.down_proj.weight.data_ptr()
    probe = {"bandwidth_gbs": 10.0, "matmul_gflops_float32": 50.0}
    r = run_ar_bench("tiny-random", "float32", n_prompts=2, max_new_tokens=6, repeats=1, progress=False,
                     probe=probe, base=(lm, tok))
    assert r["identical_to_hf"] == 1.0 and r["model"] == "tiny-random"
    assert lm.weights_format == "dense" and not lm.fused_decode  # the base is left as it was


@pytest.mark.parametrize("text, size", [("491520K", 491520 << 10), ("32M", 32 << 20), ("1024", 1024), ("", 0), ("x", 0)])
def test_sysfs_cache_sizes_parse(text, size):
    from studylib.cpuinfo import parse_cache_size

    assert parse_cache_size(text) == size


def test_the_bandwidth_probe_reads_past_the_last_level_cache(monkeypatch):
    """The buffer is at least 4x the last-level cache whatever ``mbytes`` asks, so the cache cannot serve it."""
    from studylib import cpuinfo
    from studylib.bench import roofline

    seen = []
    real = torch.ones

    def spy(*shape, **kw):
        t = real(*shape, **kw)
        seen.append(t.numel() * 4)
        return t

    monkeypatch.setattr(cpuinfo, "last_level_cache_bytes", lambda: 8 << 20)
    monkeypatch.setattr(roofline.torch, "ones", spy)
    assert roofline.measure_bandwidth_gbs("cpu", mbytes=1, repeats=1) > 0
    assert max(seen) >= 4 * (8 << 20)


def test_the_last_level_cache_is_summed_over_its_instances(tmp_path):
    """Two L3 slices (two core complexes) count twice; the L2s below them do not count."""
    from studylib.cpuinfo import last_level_cache_bytes

    def cache(cpu, index, level, size, shared):
        d = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(size + "\n")
        (d / "shared_cpu_list").write_text(shared + "\n")

    for cpu in range(4):
        cache(cpu, 2, 2, "1024K", str(cpu))
        cache(cpu, 3, 3, "32768K", "0-1" if cpu < 2 else "2-3")
    assert last_level_cache_bytes.__wrapped__(str(tmp_path)) == 2 * 32 << 20
    assert last_level_cache_bytes.__wrapped__(str(tmp_path / "none")) == 0
