"""The compiled protein fill (``zmat._kernel.fill``: torsions -> internal
coordinates in one loop) against the torch ``fill_internal`` it replaces on the
CPU, and the dispatch budget of a ``ProteinBatch`` step that it buys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import zmat
from zmat.protein import ProteinBatch
from zmat.protein.build import fill_internal, internal_from_torsions, protein_layout, to_xyz_from_torsions
from zmat.protein.topology import TORSION_NAMES
from zmat.testing import DispatchAudit

DATA = Path(__file__).parent / "data"
AMINO = "ACDEFGHIKLMNPQRSTVWY"
# ops that only make, view or relabel tensors: no elementwise work, so no
# parallel region (each of which waits a time slice for a busy core)
METADATA_OPS = {"view", "empty", "new_empty", "permute", "slice", "select", "detach", "alias", "as_strided"}
METADATA_OPS |= {"expand", "empty_like"}


def _sequences() -> list[str]:
    """Real chains (1l2y, 1ubi) and random ones of different lengths."""
    pytest.importorskip("biotite")
    rng = np.random.default_rng(3)
    real = [zmat.protein.from_pdb(DATA / f"{n}.pdb").sequence for n in ("1l2y", "1ubi")]
    return real + ["".join(rng.choice(list(AMINO), n)) for n in (1, 2, 45)]


def _torsions(shape, dtype, seed=0, nan=0.2) -> torch.Tensor:
    """Uniform torsions in (-pi, pi) with a fraction ``nan`` of NaN (= default)."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(-np.pi, np.pi, shape)
    t[rng.random(shape) < nan] = np.nan
    return torch.from_numpy(t).to(dtype)


def _value_and_grad(fill, t: torch.Tensor, w: torch.Tensor):
    t = t.detach().requires_grad_()
    out = fill(t)
    return out.detach(), torch.autograd.grad((out * w).sum(), t)[0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batch_fill_equals_fill_internal(spy, dtype):
    batch = ProteinBatch(_sequences())
    t = _torsions((2, len(batch), batch.L_max, 7), dtype)
    w = torch.randn(2, len(batch) * batch.N_max, 3, dtype=torch.float64).to(dtype)
    x, g = _value_and_grad(batch.internal_from_torsions, t, w)
    x_ref, g_ref = _value_and_grad(lambda t: fill_internal(batch._flat, t.flatten(-3, -2)), t, w)
    assert spy.of("fill_forward", "fill_backward") == (1, 1)
    assert torch.isfinite(x).all() and x.dtype == dtype
    torch.testing.assert_close(x, x_ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=0)
    assert (g[torch.isnan(t)] == 0).all() and (g.abs() > 0).any()


def test_dict_and_single_sequence(spy):
    seq = _sequences()[0]
    lay = protein_layout(seq)
    t = _torsions((3, len(seq), 7), torch.float64, seed=1)
    tors = {name: t[..., k] for k, name in enumerate(TORSION_NAMES) if name not in ("chi3", "omega")}
    x = internal_from_torsions(tors, seq)
    torch.testing.assert_close(x, fill_internal(lay, tors), atol=1e-12, rtol=0)
    assert spy.calls["fill_forward"] == 1
    # a strided view (every other residue of a longer tensor) and no leading batch
    wide = _torsions((2 * len(seq), 7), torch.float64, seed=2)
    x = internal_from_torsions(wide[::2], seq)
    torch.testing.assert_close(x, fill_internal(lay, wide[::2].contiguous()), atol=1e-12, rtol=0)


def test_to_xyz_matches_the_torch_path(spy, monkeypatch):
    batch = ProteinBatch(_sequences())
    t = _torsions((len(batch), batch.L_max, 7), torch.float64, seed=4)
    w = torch.randn(len(batch), batch.N_max, 3, dtype=torch.float64)
    x, g = _value_and_grad(batch.to_xyz, t, w)
    monkeypatch.setenv("ZMAT_NO_KERNEL", "1")
    x_ref, g_ref = _value_and_grad(batch.to_xyz, t, w)
    assert spy.of("fill_forward", "fill_backward") == (1, 1)
    torch.testing.assert_close(x, x_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(g, g_ref, atol=1e-9, rtol=0)


def test_gradcheck_and_gradgradcheck(spy):
    seq = "MKWGY"
    t = _torsions((2, len(seq), 7), torch.float64, seed=5, nan=0.3).requires_grad_()
    fill = lambda t: internal_from_torsions(t, seq)  # noqa: E731
    assert torch.autograd.gradcheck(fill, (t,), check_batched_grad=True)
    assert spy.calls["fill_backward"] > 0  # first order through the kernel
    # second order: a backward with create_graph differentiates fill_vjp (torch ops)
    assert torch.autograd.gradgradcheck(fill, (t,))
    assert torch.autograd.gradgradcheck(lambda t: to_xyz_from_torsions(t, seq), (t,))


def test_double_backward_matches_fill_internal(spy):
    batch = ProteinBatch(["MKV", "ACDEFG"])
    t = _torsions((len(batch), batch.L_max, 7), torch.float64, seed=6).requires_grad_()
    out = {}
    for name, fill in (
        ("kernel", batch.internal_from_torsions),
        ("torch", lambda t: fill_internal(batch._flat, t.flatten(-3, -2))),
    ):
        w = torch.linspace(-1, 1, 3 * len(batch) * batch.N_max, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad((fill(t) * w.view(-1, 3)).sum(), t, create_graph=True)
        out[name] = torch.autograd.grad(g.square().sum(), w)[0]
    torch.testing.assert_close(out["kernel"], out["torch"], atol=1e-12, rtol=0)


def test_disabled_by_environment_and_off_the_cpu_dtypes(spy, monkeypatch):
    batch = ProteinBatch(["MKV", "GP"])
    t = _torsions((len(batch), batch.L_max, 7), torch.float64, seed=7)
    expected = fill_internal(batch._flat, t.flatten(-3, -2))
    monkeypatch.setenv("ZMAT_NO_KERNEL", "1")
    torch.testing.assert_close(batch.internal_from_torsions(t), expected, atol=0, rtol=0)
    monkeypatch.delenv("ZMAT_NO_KERNEL")
    batch.internal_from_torsions(t.half())  # not a kernel dtype: the torch path
    torch.func.jacrev(batch.internal_from_torsions)(t)  # transforms: the torch path
    assert spy.calls["fill_forward"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_step_dispatches_a_handful_of_metadata_ops(spy, dtype):
    # A regression guard: ``ProteinBatch.to_xyz`` fwd+bwd on the CPU was ~60
    # aten ops, ~40 of them elementwise (each a parallel region at this size,
    # slowing the step ~35x while another process held one of two cores).
    # No proline here: closing proline rings adds elementwise ops on (S, prolines) tensors
    # (build.close_proline_rings; below the parallel grain size), see the next test.
    rng = np.random.default_rng(8)
    batch = ProteinBatch(["".join(rng.choice(list(AMINO.replace("P", "")), 64)) for _ in range(4)])
    t = _torsions((len(batch), batch.L_max, 7), dtype, seed=8).requires_grad_()
    x = batch.to_xyz(t)
    torch.autograd.grad(x, t, torch.ones_like(x))  # plans built, kernel loaded
    with DispatchAudit() as fwd:
        x = batch.to_xyz(t)
    g = torch.ones_like(x)
    with DispatchAudit() as bwd:
        torch.autograd.grad(x, t, g)
    assert fwd.count <= 16 and bwd.count <= 14, (fwd.ops, bwd.ops)
    assert set(fwd.ops) | set(bwd.ops) <= METADATA_OPS, (fwd.ops, bwd.ops)
    assert spy.of("fill_forward", "fill_backward") == (2, 2)


def test_proline_rings_add_a_fixed_number_of_ops():
    """Closing the proline rings costs the same ops whatever the batch size (they act on
    (S, P) tensors), next to the fill kernel's."""
    counts = []
    for n in (1, 8):
        batch = ProteinBatch(["MKPVPLGPW" * 4] * n)
        t = _torsions((len(batch), batch.L_max, 7), torch.float64, seed=9).requires_grad_()
        x = batch.to_xyz(t)
        torch.autograd.grad(x, t, torch.ones_like(x))
        with DispatchAudit() as fwd:
            x = batch.to_xyz(t)
        with DispatchAudit() as bwd:
            torch.autograd.grad(x, t, torch.ones_like(x))
        counts.append((fwd.count, bwd.count))
    assert counts[0] == counts[1], counts
