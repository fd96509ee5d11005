"""The optimiser's speed paths against their references: the reduced space by Cholesky on the rigid motions'
complement (zmat/optimize/_rigid.py) against the eigendecomposition, the numpy views of the host against the
tensor path, the linear check in the kernel against torch's."""

import math
from dataclasses import replace
from pathlib import Path

import ase.io
import pytest
import torch

from zmat.optimize import ToyForceField, _compiled, _rigid, build_primitives, minimize, steps
from zmat.optimize import optimizer as opt_mod
from zmat.optimize.coordinates import kernel_layout, values_and_b
from zmat.optimize.steps import back_transform, reduced_space, wrap


def baker(name):
    berny = pytest.importorskip("berny")
    return ase.io.read(Path(berny.__file__).parent / "benchmarks" / "baker_shajan_2023" / f"{name}.xyz")


def rattled(m, bsz=3, seed=0, scale=0.05):
    x = torch.tensor(m.positions)[None].expand(bsz, -1, -1).clone() / 0.529177
    x[1:] += scale * torch.randn(x[1:].shape, generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    return x


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", ["water", "benzene", "caffeine", "histidine", "trisilacyclohexane_135"])
def test_the_rigid_basis_spans_the_space_the_eigendecomposition_keeps(name, sparse):
    m = baker(name)
    prims = build_primitives(m.positions, m.numbers)
    assert prims.rigid_invariant
    x = rattled(m)
    _, Bm = values_and_b(prims, x)
    U0, V0, k0 = reduced_space(Bm)
    fast = _rigid.reduced_space(Bm, x, kernel_layout(prims, x.dtype) if sparse else None)
    assert fast is not None
    U1, V1, k1 = fast
    n3 = Bm.shape[-1]
    assert U1.shape == (*Bm.shape[:2], n3 - 6) and V1.shape == (3, n3, n3 - 6) and k1.all()
    assert ((~k0).sum(-1) == 6).all()  # the eigenvalue rule drops exactly the six rigid motions
    assert (Bm @ _rigid.rigid_motions(x)).abs().max() < 1e-12  # which are B's null space
    eye = torch.eye(n3 - 6, dtype=U1.dtype)
    torch.testing.assert_close(U1.mT @ U1, eye.expand(3, -1, -1), atol=1e-12, rtol=0)
    torch.testing.assert_close(Bm @ V1, U1, atol=1e-12, rtol=0)
    torch.testing.assert_close(U1 @ U1.mT, U0 @ U0.mT, atol=1e-12, rtol=0)  # the range of B
    pinv = torch.linalg.pinv(Bm, rtol=1e-6)
    torch.testing.assert_close(V1 @ U1.mT, pinv, atol=1e-10, rtol=1e-10)  # B^+
    torch.testing.assert_close(V0 @ U0.mT, pinv, atol=1e-10, rtol=1e-10)


def test_the_kernels_sparse_products_equal_the_dense_ones():
    """``B^T B`` and ``B W`` from each row's nonzero columns: padded rows (a bond repeats its last atom)
    and frozen atoms' Cartesian rows included."""
    m = baker("histidine")
    prims = build_primitives(m.positions, m.numbers, frozen=(1, 4))
    x = rattled(m)
    _, Bm = values_and_b(prims, x)
    lay = kernel_layout(prims, x.dtype)
    assert len(lay[3]) == 6
    W = torch.randn(3, Bm.shape[-1], 17, generator=torch.Generator().manual_seed(5), dtype=x.dtype)
    torch.testing.assert_close(_compiled.gram(lay, Bm), Bm.mT @ Bm, atol=1e-13, rtol=0)
    torch.testing.assert_close(_compiled.times(lay, Bm, W), Bm @ W, atol=1e-13, rtol=0)


def test_the_rigid_basis_declines_what_it_cannot_certify():
    m = baker("histidine")
    prims = build_primitives(m.positions, m.numbers)
    x = rattled(m)
    # bonds and angles only: more null directions than the rigid motions (the eigenvalue rule drops them)
    few = replace(prims, dihedral=prims.dihedral[:0], oop=prims.oop[:0], weak=prims.weak[: prims.counts[0]])
    _, Bm = values_and_b(few, x)
    assert ((~reduced_space(Bm)[2]).sum(-1) > 6).all()
    assert _rigid.reduced_space(Bm, x) is None
    # one conformer with a soft direction is enough to decline the batch
    _, Bm = values_and_b(prims, x)
    soft = Bm.clone()
    u = _rigid.reduced_space(Bm, x)[0][1]  # conformer 1's basis
    soft[1] -= (1 - 1e-4) * u[:, :1] @ (u[:, :1].mT @ Bm[1])  # its first direction shrunk 1e4-fold
    assert ((~reduced_space(soft)[2]).sum(-1) == torch.tensor([6, 7, 6])).all()
    assert _rigid.reduced_space(soft, x) is None
    assert _rigid.reduced_space(Bm[:, :1, :6], x[:, :2]) is None  # two atoms: five rigid motions


def test_minimize_in_the_rigid_basis_takes_the_eigendecompositions_steps(monkeypatch):
    m = baker("histidine")
    ff = ToyForceField(m.numbers, m.positions)
    x0 = torch.tensor(m.positions)[None] + 0.1 * torch.randn(
        4, len(m), 3, generator=torch.Generator().manual_seed(3)
    )
    calls = []
    real = _rigid.reduced_space

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(_rigid, "reduced_space", counted)
    fast = minimize(ff, x0, fmax=1e-3, numbers=m.numbers)
    assert calls and all(calls)
    monkeypatch.setattr(_rigid, "reduced_space", lambda *args, **kwargs: None)
    ref = minimize(ff, x0, fmax=1e-3, numbers=m.numbers)
    assert ref.converged.all() and torch.equal(fast.steps, ref.steps)
    torch.testing.assert_close(fast.xyz, ref.xyz, atol=1e-7, rtol=0)
    torch.testing.assert_close(fast.energy, ref.energy, atol=1e-10, rtol=0)


def test_the_kernel_back_transformation_takes_a_narrower_basis(monkeypatch):
    """The rigid basis has 3N - 6 columns: the compiled iteration equals the torch loop with it."""
    m = baker("histidine")
    prims = build_primitives(m.positions, m.numbers)
    x = rattled(m, 4, seed=1)
    q, Bm = values_and_b(prims, x)
    U, Vs, _ = _rigid.reduced_space(Bm, x)
    periodic = prims.periodic()
    dq = U @ (0.3 * torch.randn(4, U.shape[-1], 1, generator=torch.Generator().manual_seed(2), dtype=x.dtype))
    dq = wrap(dq[..., 0], periodic)

    def run():
        return back_transform(prims, x, q, dq, (U, Vs), periodic)

    monkeypatch.setenv("ZMAT_NO_KERNEL", "1")
    x0, q0 = run()
    monkeypatch.setenv("ZMAT_NO_KERNEL", "0")
    x1, q1 = run()
    torch.testing.assert_close(x1, x0, atol=1e-12, rtol=0)
    torch.testing.assert_close(q1, q0, atol=1e-12, rtol=0)
    assert (x1 != x).any(-1).any(-1).all()


def _tensor_path(monkeypatch):
    """Run the host helpers on tensors (their GPU path) on the CPU."""
    monkeypatch.setattr(steps, "_host", lambda *xs: list(xs))


def test_the_host_arithmetic_equals_the_tensor_path(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    # the line search: a cubic minimum inside, one outside, no real extremum, a quadratic, equal ends
    E0 = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, math.nan], dtype=torch.float64)
    E1 = torch.tensor([-0.1, 0.5, 0.2, 0.1, 1.0, -1.0, 0.0], dtype=torch.float64)
    g0 = torch.tensor([-1.0, 2.0, -0.1, -1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    g1 = torch.tensor([0.5, 3.0, 0.3, 1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    H = torch.randn(3, 7, 7, generator=gen, dtype=torch.float64)
    H = H @ H.mT
    dq, dg = (
        torch.randn(3, 7, generator=gen, dtype=torch.float64),
        torch.randn(3, 7, generator=gen, dtype=torch.float64),
    )
    on = torch.tensor([True, False, True])
    dg[2] = 0  # a vanishing denominator: no update

    def run():
        return (
            *steps.cubic_search(E0, E1, g0, g1),
            steps.bfgs(H.clone(), dq, dg, on),
        )

    host = run()
    _tensor_path(monkeypatch)
    ref = run()
    for a, b in zip(host, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-15, rtol=1e-15, equal_nan=True)
    t, E, Hn = host
    assert ((t >= 0) & (t <= 1)).all() and 0 < t[0] < 1 and t[6] == 1 and E[6] == E1[6]
    torch.testing.assert_close(Hn[2], H[2], atol=0, rtol=0)


def test_the_linear_check_in_the_kernel_equals_the_torch_path(monkeypatch):
    m = baker("acetylene")  # linear bends
    prims = build_primitives(m.positions, m.numbers)
    assert len(prims.linear)
    x = torch.tensor(m.positions)[None].expand(3, -1, -1).clone() / 0.529177
    x[1, 2] += torch.tensor([0.0, 0.4, 0.0], dtype=x.dtype)  # an H bent well below 170 deg
    x[2, 2] += torch.tensor([0.0, 0.02, 0.0], dtype=x.dtype)  # barely bent
    w = baker("water")
    wprims = build_primitives(w.positions, w.numbers)
    y = torch.tensor(w.positions)[None].expand(2, -1, -1).clone() / 0.529177
    h1, o, h2 = wprims.angle[0].tolist()  # (vertex in the middle)
    y[1, h2] = 2 * y[1, o] - y[1, h1]  # H-O-H straightened: 180 deg

    def run():
        return [prims.linear_check(x[k : k + 1]).item() for k in range(3)] + [
            wprims.linear_check(y[:1]).item(),
            wprims.linear_check(y).item(),
        ]

    monkeypatch.setenv("ZMAT_NO_KERNEL", "1")
    ref = run()
    monkeypatch.setenv("ZMAT_NO_KERNEL", "0")
    assert run() == ref == [False, True, False, False, True]


def test_a_step_on_a_molecule_makes_one_eigendecomposition():
    """Histidine (bonds, angles, dihedrals, out-of-plane): the rigid basis replaces B^T B's
    eigendecomposition; the reduced Hessian's is the one left; the step's bookkeeping on numpy views: a step
    within 75 ops (71 measured, 81 before the host views of the periodic mask and fragments were made once a
    rebuild; ~270 with the bookkeeping on tensors, ~400 with two eighs)."""
    from zmat.testing import DispatchAudit

    m = baker("histidine")
    x = torch.tensor(m.positions)[None] + 0.05
    stepper, ff, eighs, ops = (
        opt_mod.InternalStepper(x, m.numbers),
        ToyForceField(m.numbers, m.positions),
        [],
        [],
    )
    for _ in range(3):
        e, g = opt_mod._evaluate(ff, x)
        with DispatchAudit() as s:
            x = stepper.step(x, e, g)[1]
            stepper.needs_rebuild(x)
        eighs.append(s.ops.count("_linalg_eigh"))
        ops.append(s.count)
    assert eighs == [1] * 3 and max(ops) <= 75, (eighs, ops)


@pytest.mark.parametrize("name", ["histidine", "allene", "constrained"])
def test_the_steps_bookkeeping_on_the_host_equals_the_tensor_path(monkeypatch, name):
    """InternalStepper.step's per-conformer arithmetic (trust radius, line search, best points, the
    Cartesian trust, convergence) on numpy views = the same on tensors (the GPU path): the same energies
    at every evaluation, the same step counts. A batch whose conformers stop at different steps (the
    inactive ones kept); histidine in the rigid basis, allene with linear bends (the eigh path), and
    histidine with a fixed bond and a frozen atom."""
    m = baker("allene" if name == "allene" else "histidine")
    kwargs = {"constraints": {(0, 1): None, "frozen": [5]}} if name == "constrained" else {}
    ff = ToyForceField(m.numbers, m.positions)
    x0 = torch.tensor(m.positions)[None] + 0.1 * torch.randn(
        3, len(m), 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )

    def run():
        calls = []

        def energy(x):
            e = ff(x)
            calls.append(e.detach())
            return e

        res = minimize(energy, x0, fmax=1e-3, numbers=m.numbers, max_steps=40, **kwargs)
        return res, torch.stack(calls)

    host, host_E = run()
    _tensor_path(monkeypatch)
    ref, ref_E = run()
    assert len(set(ref.steps.tolist())) > 1  # (some conformers stop before others)
    assert torch.equal(host.steps, ref.steps), (host.steps, ref.steps)
    # (numpy's and torch's products round differently: 1e-15 at first, grown along allene's path to ~1e-9: its
    # linear bends)
    torch.testing.assert_close(host_E[:4], ref_E[:4], atol=1e-10, rtol=0)  # 2.3e-12 seen once
    torch.testing.assert_close(host_E, ref_E, atol=1e-7, rtol=0)
    torch.testing.assert_close(host.energy, ref.energy, atol=1e-10, rtol=0)
    torch.testing.assert_close(host.fmax, ref.fmax, atol=1e-6, rtol=0)


def test_minimize_runs_an_iteration_in_few_ops():
    """:func:`minimize` at batch 1 on the CPU: an iteration (the step, the bookkeeping, the one host sync),
    the potential's evaluation left out, within 58 ops (52 measured: the bookkeeping on numpy views,
    the host views of the periodic mask and the fragments made once per rebuild; 76 with it on tensors)."""
    from zmat.testing import DispatchAudit

    m = baker("histidine")
    ff = ToyForceField(m.numbers, m.positions)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.tensor(m.positions)[None]
    x0 = x0 + 0.05 * torch.randn(x0.shape, generator=gen, dtype=x0.dtype)

    def ops(max_steps):
        with DispatchAudit() as s:
            res = minimize(ff, x0, fmax=1e-9, max_steps=max_steps, numbers=m.numbers)
        assert res.steps.tolist() == [max_steps]  # (it did not stop)
        return s.count

    with DispatchAudit() as evaluation:
        opt_mod._evaluate(ff, x0)
    per_iteration = (ops(12) - ops(4)) / 8 - evaluation.count
    assert per_iteration <= 58, per_iteration
