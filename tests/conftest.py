"""Shared test configuration: Hypothesis profiles, seeded RNGs, device/dtype/tolerance fixtures,
the compiled kernel's call counter."""

import collections
import os
import random
import warnings

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


class KernelSpy:
    """Counts the compiled kernel's calls by function name (and delegates)."""

    def __init__(self, module):
        self.module, self.calls = module, collections.Counter()

    def __getattr__(self, name):
        function = getattr(self.module, name)

        def counted(*args):
            self.calls[name] += 1
            return function(*args)

        return counted

    def of(self, *names) -> tuple:
        """The calls of ``names``, in that order."""
        return tuple(self.calls[n] for n in names)


@pytest.fixture
def spy(monkeypatch):
    """The compiled kernel (``zmat._kernel``) enabled and its calls counted;
    skips where it cannot be built."""
    from zmat import _kernel

    monkeypatch.delenv("ZMAT_NO_KERNEL", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = _kernel.load()
    if module is None:
        why = "; ".join(str(w.message) for w in caught) or "it failed to build earlier in this run"
        pytest.skip(f"the compiled CPU kernel cannot be built here, so this kernel test did not run ({why})")
    counter = KernelSpy(module)
    monkeypatch.setitem(_kernel._state, "module", counter)
    return counter
