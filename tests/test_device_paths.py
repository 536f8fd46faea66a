"""The model, caches, decoders and serving engine are device-agnostic: the same tests run on every device
this machine has. CPU always; CUDA only where a GPU is visible (the parameter is marked ``gpu``, which
conftest skips without one). Only the CUDA kernels themselves have tests of their own."""

from __future__ import annotations

import pytest
import torch

from studylib.attention import make_cache
from studylib.decoding import ar
from studylib.models import load_model

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
PROMPT = list(range(5, 70))


@pytest.fixture(scope="module")
def cpu_model():
    return load_model("tiny-random")[0]


@pytest.mark.parametrize("device", DEVICES)
def test_model_logits_agree_with_cpu(device, cpu_model):
    model = load_model("tiny-random", device, "float32")[0]
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        got = model(ids.to(device), make_cache("dense", model.config, 80, device).begin(len(PROMPT))).logits
        want = cpu_model(ids, make_cache("dense", cpu_model.config, 80).begin(len(PROMPT))).logits
    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attention", [None, "sinks:2,14", "window:16", "quest:budget=40,page=8,sinks=2,recent=6,dense=0"])
def test_greedy_generation_with_each_cache_matches_cpu(device, attention, cpu_model):
    model = load_model("tiny-random", device, "float32")[0]
    got = ar.generate(model, PROMPT, 12, attention=attention)
    want = ar.generate(cpu_model, PROMPT, 12, attention=attention)
    assert got.token_ids == want.token_ids


@pytest.mark.parametrize("device", DEVICES)
def test_serving_engine_runs_on_the_device(device):
    from studylib.serving.engine import Engine, EngineConfig
    from studylib.serving.request import RequestStatus
    from studylib.serving.workload import synthetic_workload, to_requests

    model = load_model("tiny-random", device, "float32")[0]
    reqs = to_requests(synthetic_workload(6, 0, prompt_len=(1, 16), output_len=(1, 8), shared_prefix=8), None)
    Engine(model, EngineConfig(scheduler="continuous", prefix_cache="radix", kv_budget_mib=4)).run(reqs)
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
