"""The flows' inverse with fixed atoms on its compiled path (zmat/csrc/fixed.cpp: the rows and
the log-determinant in one pass, the log-determinant handed to ``T.inv.log_abs_det_jacobian``)."""

import pickle

import numpy as np
import pytest
import torch

from zmat.flows import InternalCoordinateTransform
from zmat.testing import DispatchAudit

DATA = __import__("pathlib").Path(__file__).parent / "data"

#: a fixed backbone (atoms 0-2, 4) with a group anchored on it, and a free tree of its own
#: (root 8) that refers to fixed atom 4 (its frame carried by its third atom)
TABLE = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [2, 1, 0], [4, 2, 1], [5, 4, 2], [3, 2, 1]]
TABLE += [[-1, -1, -1], [8, -1, -1], [9, 8, -1], [10, 9, 8], [11, 10, 4]]
FIXED = [0, 1, 2, 4]


def _positions(dtype, batch=(3,), seed=4, degenerate=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, len(TABLE), 3, generator=gen, dtype=torch.float64) * 1.5
    if not degenerate:
        return x.to(dtype)
    x[..., 0, 3, :] = x[..., 0, 2, :]  # coincident bonded atoms: r = 0 (log-det floored), no angle
    x[..., 1, 4:7, :] = torch.tensor([[0.5, 1, -1], [1.5, 2, 0], [2.5, 3, 1]])  # straight (exactly)
    return x.to(dtype)


def _inverse_with_log_det(T, x):
    q = T.inv(x)
    return q, T.inv.log_abs_det_jacobian(x, q)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("normalize", [False, True])
def test_fixed_inverse_is_the_torch_one(spy, monkeypatch, dtype, normalize):
    """q, T.inv's log-det and the gradient of a loss of both against the torch path (the kernel
    off), with degenerate rows, a free tree referring to a fixed atom, two batch dimensions."""
    T = InternalCoordinateTransform(TABLE, fixed_atoms=FIXED, normalize_angles=normalize)
    x = _positions(dtype, batch=(2, 3)).requires_grad_(True)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(2, 3, 3 * len(TABLE), generator=gen, dtype=torch.float64).to(dtype)

    def loss(q, ld):
        return (q * w).sum() + (ld * torch.arange(1.0, 7.0, dtype=dtype).view(2, 3)).sum()

    q, ld = _inverse_with_log_det(T, x)
    assert spy.calls["fixed_inverse"] == 1 and spy.calls["log_det"] == 0  # one pass, forward
    (g,) = torch.autograd.grad(loss(q, ld), x)
    monkeypatch.setenv("ZMAT_NO_KERNEL", "1")
    q_ref, ld_ref = _inverse_with_log_det(T, x)
    (g_ref,) = torch.autograd.grad(loss(q_ref, ld_ref), x)
    assert spy.calls["fixed_inverse"] == 1 and spy.calls["internal_forward"] == 0
    tol = 1e-12 if dtype == torch.float64 else 3e-5
    for a, b in ((q, q_ref), (ld, ld_ref), (g, g_ref)):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_inverse_log_det_is_the_log_det_of_q(spy, dtype):
    """T.inv's log-det from the inverse's pass is minus T's log-det of the same q (to rounding:
    sin theta from the geometry, not from theta), and its gradient hangs off q (``grad(ld, q)``, as
    torch's inverse transforms): that of ``-T.log_abs_det_jacobian(q)`` (cot theta from the geometry
    too)."""
    T = InternalCoordinateTransform(TABLE, fixed_atoms=FIXED)
    x = _positions(dtype).requires_grad_(True)
    q, ld = _inverse_with_log_det(T, x)
    assert spy.calls["log_det"] == 0
    (g,) = torch.autograd.grad(ld.sum(), q, retain_graph=True)
    q2 = q.detach().requires_grad_(True)
    ref = -T.log_abs_det_jacobian(q2)
    (g_ref,) = torch.autograd.grad(ref.sum(), q2)
    tol = 1e-13 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(ld.detach(), ref.detach(), atol=tol, rtol=tol)
    torch.testing.assert_close(g, g_ref, atol=tol, rtol=tol)


def test_inverse_log_det_follows_q(spy):
    """The inverse's log-det is given only for the q it returned, unchanged, and once: a q changed
    in place, another q, or a second call are computed from q."""
    T = InternalCoordinateTransform(TABLE, fixed_atoms=FIXED)
    x = _positions(torch.float64)
    q = T.inv(x)
    q[:, 3 * 3] *= 2  # atom 3's bond
    torch.testing.assert_close(T.inv.log_abs_det_jacobian(x, q), -T.log_abs_det_jacobian(q), rtol=0, atol=0)
    q_other, q = T.inv(x), T.inv(x)
    calls = spy.calls["log_det"]
    ld = T.inv.log_abs_det_jacobian(x, q_other)  # not the last output
    assert spy.calls["log_det"] == calls + 1
    torch.testing.assert_close(ld, -T.log_abs_det_jacobian(q_other), rtol=0, atol=0)
    first, second = (T.inv.log_abs_det_jacobian(x, q) for _ in range(2))
    assert first is not second and torch.equal(first, second)
    q = T.inv(x).requires_grad_(True)  # made to require grad after the inverse: from q
    (g,) = torch.autograd.grad(T.inv.log_abs_det_jacobian(x, q).sum(), q)
    torch.testing.assert_close(g, torch.autograd.grad(-T.log_abs_det_jacobian(q).sum(), q)[0])
    pickle.loads(pickle.dumps(T)).inv(x)  # the kept log-det (a weak reference) is not pickled
    q = T.inv(x.requires_grad_(True))
    kept = T._last[2]
    assert len(kept) == 2 and kept[1].shape == q.shape
    del q  # never asked for its log-det: what was kept goes with it
    assert kept == []


def test_fixed_inverse_gradcheck(spy):
    """Finite differences of q and of T.inv's log-det (float64), and the double backward (the torch
    reference's)."""
    T = InternalCoordinateTransform(TABLE, fixed_atoms=FIXED, normalize_angles=True)
    x = _positions(torch.float64, batch=(2,), seed=8, degenerate=False).requires_grad_(True)

    def both(v):
        q, ld = _inverse_with_log_det(T, v)
        return q, ld

    assert torch.autograd.gradcheck(both, (x,))
    assert torch.autograd.gradgradcheck(both, (x,))
    assert spy.calls["fixed_inverse"] > 0


#: dispatched ops of one alanine dipeptide's inverse with its log-det and their backward, fixed
#: backbone, less the two ones_like of the gradients given: the allocations of q, the log-det, its
#: gradient in q and the positions' gradient, the product of the log-det's gradient, and the engine's
#: sum of q's two gradients. The rows, T.inv's log-det and its gradient in q in one pass, no views,
#: no negation: 15 -> 6
OPS_INVERSE_LOG_DET_BACKWARD = 6


def test_ops_of_the_inverse_with_log_det_and_backward(spy):
    with np.load(DATA / "bgflow_reference.npz") as f:
        table, xyz, fixed = f["ala2/table"], torch.as_tensor(f["ala2/xyz"][:1]), f["ala2/fixed"]
    T = InternalCoordinateTransform(table, fixed_atoms=fixed)
    for _ in range(2):  # the second call counted (plans made in the first)
        x = xyz.detach().requires_grad_(True)
        with DispatchAudit() as audit:
            q = T.inv(x)
            ld = T.inv.log_abs_det_jacobian(x, q)
            g_q, g_ld = torch.ones_like(q), torch.ones_like(ld)
            torch.autograd.grad((q, ld), x, (g_q, g_ld))
    ops = audit.count - 2  # less the two ones_like
    assert ops <= OPS_INVERSE_LOG_DET_BACKWARD, audit.histogram().most_common()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fixed_forward_is_the_torch_one_on_hard_rows(spy, dtype):
    """The compiled forward (zmat/csrc/world.cpp: sines and cosines first, one vectorised pass per
    chunk of 256 atoms, then the placement, two structures in turn) against its torch reference, on
    a chain of 300 atoms past the first chunk, three structures (a pair and one alone), with a
    straight angle, a zero bond, angles and dihedrals far outside +-pi (1e3 and past 2^19 pi/2,
    where the sines come from the library); values and gradients of both outputs."""
    table = TABLE + [[12, 11, 10]] + [[j - 1, j - 2, j - 3] for j in range(14, 300)]
    T = InternalCoordinateTransform(table, fixed_atoms=FIXED)
    gen = torch.Generator().manual_seed(5)
    xyz = torch.randn(3, 300, 3, generator=gen, dtype=torch.float64)
    q = T.inv(xyz).detach().reshape(3, 300, 3).clone()
    # a straight angle and a zero bond on the last atom (log-det floored; the frames they would make
    # degenerate follow rules of their own in the kernel, world.cpp's header)
    q[0, 299, 1], q[0, 299, 0] = np.pi, 0.0
    q[1, 280, 1], q[1, 281, 2] = 1e3 + 0.3, -1e3 - 2.0  # past the first chunk
    q[2, 100, 2], q[2, 101, 1], q[2, 290, 2] = 3e6 + 0.5, -2e6 + 1.0, 1e6  # the library's range
    q = q.reshape(3, 900).to(dtype).requires_grad_(True)
    gx = torch.randn(3, 300, 3, generator=gen, dtype=torch.float64).to(dtype)
    gl = torch.tensor([1.0, -2.0, 0.5], dtype=dtype)
    before = spy.calls.get("world_forward", 0)
    x, ld = T.call_and_ladj(q)
    (g,) = torch.autograd.grad((x * gx).sum() + (ld * gl).sum(), q)
    assert spy.calls["world_forward"] - before == 1
    x_ref, ld_ref = T._reference(q.reshape(3, 300, 3))
    (g_ref,) = torch.autograd.grad((x_ref * gx).sum() + (ld_ref * gl).sum(), q)
    tol = 1e-10 if dtype == torch.float64 else 2e-3  # (300 atoms in a chain: errors add up along it)
    assert torch.isfinite(x).all() and torch.isfinite(g).all()
    torch.testing.assert_close(x, x_ref, atol=tol, rtol=0)
    torch.testing.assert_close(ld, ld_ref + T._constant, atol=tol, rtol=tol)
    torch.testing.assert_close(g, g_ref, atol=tol * 10, rtol=tol)
