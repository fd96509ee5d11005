"""The protein fill (``zmat._kernel.fill``) over threads: ranges of atoms
forward, ranges of atoms that share no torsion backward (else one thread), so
the same bits on one thread or two, and the gradient still the torch one's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zmat import _kernel
from zmat.protein import ProteinBatch

AMINO = "ACDEFGHIKLMNPQRSTVWY"


@pytest.fixture
def threaded(spy, monkeypatch):
    """Every fill call threaded (small inputs above the threshold); restores the thread count."""
    monkeypatch.setattr(_kernel, "PARALLEL_ATOMS", 1)
    before = torch.get_num_threads()
    yield spy
    torch.set_num_threads(before)


def _on(threads: int, f, *args):
    torch.set_num_threads(threads)
    return f(*args)


def _value_and_grad(fill, t: torch.Tensor, w: torch.Tensor):
    t = t.detach().requires_grad_()
    out = fill(t)
    return out.detach(), torch.autograd.grad(out, t, w)[0]


def _torsions(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    t = rng.uniform(-np.pi, np.pi, shape)
    t[rng.random(shape) < 0.1] = np.nan  # (the default torsion, no gradient)
    return torch.from_numpy(t).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_step_same_bits_on_one_and_two_threads(threaded, dtype):
    rng = np.random.default_rng(1)
    batch = ProteinBatch(["".join(rng.choice(list(AMINO), n)) for n in (700, 650, 720)])
    assert batch.N_max * len(batch) >= 2 * 8192  # several ranges of atoms (FILL_ATOMS in the C source)
    t = _torsions((2, len(batch), batch.L_max, 7), dtype)
    w = torch.from_numpy(rng.standard_normal((2, len(batch) * batch.N_max, 3))).to(dtype)
    x1, g1 = _on(1, _value_and_grad, batch.internal_from_torsions, t, w)
    x2, g2 = _on(2, _value_and_grad, batch.internal_from_torsions, t, w)
    assert threaded.of("fill_forward", "fill_backward") == (2, 2)
    assert torch.equal(x1, x2) and torch.equal(g1, g2)
    assert g1.abs().sum() > 0


def _slots(kind: str, n: int, size: int) -> torch.Tensor:
    """Slots of ``n`` atoms into ``size`` torsions, a quarter none: ``sorted`` (short runs of
    atoms share a torsion: ranges that share none exist), ``far`` (atoms half the batch apart
    share one: none exist, one thread) or ``mixed`` (sorted, a few far ones)."""
    rng = np.random.default_rng(2)
    slot = np.arange(n) * size // n
    if kind == "far":
        slot = np.concatenate([slot[::2], slot[1::2]])
    if kind == "mixed":
        slot[rng.choice(n, 5, replace=False)] = rng.choice(size, 5)
    slot[rng.random(n) < 0.25] = -1
    return torch.from_numpy(slot)


@pytest.mark.parametrize("kind", ["sorted", "far", "mixed"])
def test_shared_torsions_same_bits_and_the_torch_gradient(threaded, kind):
    n, L = 40_000, 2_000  # runs of about 3 atoms
    slot = _slots(kind, n, L * 7)
    ideal = torch.randn(n, 3, dtype=torch.float64)
    defaults = torch.randn(7, dtype=torch.float64)
    t = _torsions((2, L, 7), torch.float64)
    g = torch.randn(2, n, 3, dtype=torch.float64)
    fill = _kernel._lib().fill_forward
    bwd = _kernel._lib().fill_backward
    assert torch.equal(_on(1, fill, t, ideal, slot, defaults), _on(2, fill, t, ideal, slot, defaults))
    g1, g2 = _on(1, bwd, g, t, slot), _on(2, bwd, g, t, slot)
    assert torch.equal(g1, g2)
    torch.testing.assert_close(g2, _kernel.fill_vjp(g, t, slot), rtol=1e-12, atol=1e-12)


def test_gradcheck_threaded(threaded):
    """First order through the threaded kernel (shared torsions: runs of atoms) on two threads."""
    torch.set_num_threads(2)
    n, L = 20_000, 1_000
    slot = _slots("sorted", n, L * 7)
    ideal = torch.randn(n, 3, dtype=torch.float64)
    defaults = torch.randn(7, dtype=torch.float64)
    t = _torsions((1, L, 7), torch.float64).requires_grad_()
    fill = lambda t: _kernel.fill(t, ideal, slot, defaults)  # noqa: E731
    assert torch.autograd.gradcheck(fill, (t,), fast_mode=True)  # (60,000 outputs: projected)
    assert threaded.calls["fill_backward"] > 0
