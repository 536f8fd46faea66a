"""Shared fixtures: tiny random models (milliseconds) and, for integration tests, the embedded model."""

from __future__ import annotations

import os

import pytest

# make test runs two pytest workers on two cores, and a chapter notebook's kernel beside the other worker:
# OpenMP threads that spin while waiting would take the core from the other process. Set before torch
# loads its OpenMP runtime; the notebook kernels inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# One thread by default: tests assert behaviour, not speed, and several pytest processes sharing two
# cores with multi-threaded OpenMP spin-waits slow each other down by orders of magnitude.
torch.set_num_threads(int(os.environ.get("STUDYLIB_TEST_THREADS", "1")))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny():
    from studylib.models import load_model

    return load_model("tiny-random")


@pytest.fixture(scope="session")
def smollm2():
    from studylib.models import load_model

    return load_model("smollm2-135m")
