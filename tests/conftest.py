"""Shared test configuration: Hypothesis profiles, seeded RNGs, device/dtype/tolerance fixtures."""

import os
import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", deadline=None, max_examples=25, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_rngs():
    """Every test starts from the same torch, NumPy and ``random`` state (Hypothesis seeds its own)."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


@pytest.fixture(params=DEVICES)
def device(request):
    """Every device the machine has: CPU always, CUDA when present (else skipped)."""
    return torch.device(request.param)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["f32", "f64"])
def dtype(request):
    return request.param


@pytest.fixture
def tol(dtype):
    """Absolute tolerance (Angstrom) for comparing two methods in the ``dtype`` under test."""
    return 1e-10 if dtype == torch.float64 else 1e-4
