"""Shared fixtures: tiny random models (milliseconds) and, for integration tests, the embedded model."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


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
