"""zmat.flows: the bijection q <-> xyz and its log-determinant, against autograd's full Jacobian."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import internal_coordinates, tables
from torch.distributions import Independent, Normal, TransformedDistribution

import zmat
from zmat.flows import InternalCoordinateTransform
from zmat.testing import DispatchAudit

DATA = __import__("pathlib").Path(__file__).parent / "data"


def _rotation(gen, dtype=torch.float64):
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    return (q * torch.linalg.det(q)).to(dtype)  # proper


def _structure(table, C, seed=0):
    """Positions of ``C`` placed by to_xyz, each tree moved by its own random rigid motion."""
    xyz = zmat.to_xyz(C, table)
    gen = torch.Generator().manual_seed(seed)
    tree = _tree_of(np.asarray(table))
    out = torch.empty_like(xyz)
    for t in np.unique(tree).tolist():
        sel = torch.as_tensor(tree == t)
        R = _rotation(gen)
        out[..., sel, :] = xyz[..., sel, :] @ R.T + 3 * torch.randn(3, generator=gen, dtype=torch.float64)
    return out


def _tree_of(refs):
    """Root of every atom (following bond references)."""
    root = np.arange(len(refs))
    for _ in range(len(refs)):
        b = refs[root, 0]
        root = np.where(b >= 0, b, root)
    return root


def _anchored_fixed(refs, draw_bools):
    """Fixed atoms for a forest: the first three atoms of some trees and some later atoms of
    those (groups anchored on fixed atoms); some later atoms of the other trees (free trees that
    refer to fixed atoms)."""
    refs = np.asarray(refs)
    tree = _tree_of(refs)
    nref = (refs >= 0).sum(1)
    fixed = []
    for t, anchor in zip(np.unique(tree).tolist(), draw_bools, strict=False):
        members = np.nonzero(tree == t)[0]
        first = members[nref[members] < 3]
        rest = members[nref[members] == 3]
        if anchor and len(members) >= 4:
            fixed += first.tolist() + rest[: len(rest) // 3].tolist()
        elif not anchor:
            fixed += rest[1::3].tolist()
    return np.array(sorted(fixed), np.int64)


def _jacobian_logdet(T, q):
    J = torch.autograd.functional.jacobian(lambda v: T(v).reshape(-1), q)
    sign, logabs = torch.linalg.slogdet(J)
    return logabs


# ---------------------------------------------------------------- log-determinant
@settings(max_examples=30, deadline=None)
@given(data=st.data(), normalize=st.booleans(), with_fixed=st.booleans())
def test_log_det_matches_slogdet_of_the_full_jacobian(data, normalize, with_fixed):
    refs = data.draw(tables(min_atoms=1, max_atoms=9))
    n = len(refs)
    C = data.draw(internal_coordinates(n))
    fixed = (
        _anchored_fixed(refs, data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        if with_fixed
        else None
    )
    T = InternalCoordinateTransform(refs, fixed_atoms=fixed, normalize_angles=normalize)
    xyz = _structure(refs, C, seed=data.draw(st.integers(0, 100)))
    q = T.inv(xyz)
    assert q.shape == (3 * n,)
    torch.testing.assert_close(T(q), xyz, atol=1e-11, rtol=0)
    ladj = T.log_abs_det_jacobian(q, xyz)
    torch.testing.assert_close(ladj, _jacobian_logdet(T, q), atol=1e-8, rtol=1e-10)
    torch.testing.assert_close(T.inv.log_abs_det_jacobian(xyz, q), -ladj)
    if not normalize and fixed is None:  # the contract's identity
        torch.testing.assert_close(ladj, zmat.log_det_jacobian(zmat.to_internal(xyz, refs), refs))
        full = (np.asarray(refs) >= 0).all(1)  # their q rows are to_internal's, dihedral sign and all
        C = zmat.to_internal(xyz, refs)
        torch.testing.assert_close(q.reshape(n, 3)[full], C[full], atol=1e-12, rtol=0)


@pytest.mark.parametrize("third", [[1, 0, -1], [0, 1, -1]])
@pytest.mark.parametrize("fixed", [[9], [9, 4], [7, 8, 9]])
def test_free_tree_referring_to_fixed_atoms(third, fixed):
    """Atom 5 of the free tree rooted at 0 refers to atom 9 (fixed; its own tree's third atom,
    or a lone fixed atom) and, with 4 fixed, to a fixed atom of its own tree."""
    table = [[-1, -1, -1], [0, -1, -1], third, [2, 1, 0], [3, 2, 1], [4, 3, 9], [5, 4, 3]]
    table += [[-1, -1, -1], [7, -1, -1], [8, 7, -1]]
    T = InternalCoordinateTransform(table, fixed_atoms=fixed)
    xyz = torch.randn(3, 10, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2
    q = T.inv(xyz)
    assert (T(q) - xyz).abs().max() < 1e-12
    torch.testing.assert_close(T.log_abs_det_jacobian(q[0]), _jacobian_logdet(T, q[0]), atol=1e-10, rtol=0)


def test_log_det_jacobian_closed_form_and_clamp():
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]]
    C = torch.tensor([[5.0, 5, 5], [1.5, 9, 9], [1.2, 2.0, 9], [1.1, 1.9, 0.3]], dtype=torch.float64)
    want = 2 * math.log(1.5) + 2 * math.log(1.2) + math.log(math.sin(2.0)) + 2 * math.log(1.1)
    want += math.log(math.sin(1.9))
    assert abs(zmat.log_det_jacobian(C, table).item() - want) < 1e-14
    # batched, and the clamp: zero bond, straight and zero angles give finite values, zero gradients
    Cb = C.expand(2, 3, 4, 3).clone()
    Cb[0, 0, 3] = torch.tensor([0.0, math.pi, 0.0], dtype=torch.float64)
    Cb[1, 2, 2, 1] = 0.0
    Cb.requires_grad_(True)
    ld = zmat.log_det_jacobian(Cb, table)
    assert ld.shape == (2, 3) and torch.isfinite(ld).all()
    assert (
        abs(ld[0, 0].item() - (want - 2 * math.log(1.1) - math.log(math.sin(1.9)) + 3 * math.log(1e-12)))
        < 1e-9
    )
    (g,) = torch.autograd.grad(ld.sum(), Cb)
    assert torch.isfinite(g).all() and (g[0, 0, 3] == 0).all()
    with pytest.raises(ValueError, match=r"\(\.\.\., 4, 3\)"):
        zmat.log_det_jacobian(C[:3], table)


# ---------------------------------------------------------------- the Transform
def test_transformed_distribution_log_prob_is_base_minus_ladj():
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [2, 1, 3], [-1, -1, -1], [5, -1, -1]]
    T = InternalCoordinateTransform(table, normalize_angles=True)
    assert isinstance(T, torch.distributions.Transform) and T.bijective
    assert T.domain.event_dim == 1 and T.codomain.event_dim == 2
    base = Independent(Normal(torch.full((21,), 0.5, dtype=torch.float64), 0.2), 1)
    flow = TransformedDistribution(base, [T])
    assert (
        flow.event_shape == (7, 3)
        and T.forward_shape((4, 21)) == (4, 7, 3)
        and T.inverse_shape((4, 7, 3)) == (4, 21)
    )
    xyz = flow.sample((2, 3))
    assert xyz.shape == (2, 3, 7, 3)
    q = T.inv(xyz)
    torch.testing.assert_close(flow.log_prob(xyz), base.log_prob(q) - T.log_abs_det_jacobian(q, xyz))
    xyz2, ladj = T.call_and_ladj(q)
    torch.testing.assert_close(xyz2, xyz, atol=1e-12, rtol=0)
    torch.testing.assert_close(ladj, T.log_abs_det_jacobian(q, xyz))
    # metadata: every periodic entry in [0, 1], bounds of the rest
    kinds = T.kind.reshape(7, 3)
    assert T.circular.shape == (21,) and T.circular.reshape(7, 3)[:, 2].tolist() == [0, 1, 1, 1, 1, 0, 1]
    assert (kinds[1] == torch.tensor([zmat.flows.BOND, zmat.flows.COS_BETA, zmat.flows.PERIODIC])).all()
    inside = (q >= T.lower) & (q <= T.upper)
    assert inside.all()
    assert T.upper[T.circular].eq(1).all() and T.lower[3 + 1] == -1 and T.upper[2 * 3 + 1] == 1


def test_works_as_a_zuko_normalizing_flow():
    zuko = pytest.importorskip("zuko")
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [-1, -1, -1]]
    T = InternalCoordinateTransform(table, normalize_angles=True)
    base = zuko.distributions.DiagNormal(
        torch.zeros(15, dtype=torch.float64), torch.ones(15, dtype=torch.float64)
    )
    flow = zuko.distributions.NormalizingFlow(T.inv, base)  # zuko's transforms map data -> base
    xyz = torch.randn(5, 5, 3, dtype=torch.float64)
    q = T.inv(xyz)
    torch.testing.assert_close(flow.log_prob(xyz), base.log_prob(q) - T.log_abs_det_jacobian(q, xyz))
    assert flow.rsample((2,)).shape == (2, 5, 3)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("fixed", [None, [0, 1, 2, 5], [5]])  # none; anchored groups; a free tree on one
def test_gradcheck_call_and_ladj(normalize, fixed):
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [2, 1, 3], [5, 2, 1], [6, 5, 2]]
    T = InternalCoordinateTransform(table, fixed_atoms=fixed, normalize_angles=normalize)
    gen = torch.Generator().manual_seed(1)
    xyz = _structure(
        table, zmat.to_internal(torch.randn(8, 3, generator=gen, dtype=torch.float64) * 1.5, table)
    )
    q = T.inv(xyz).detach().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: T.call_and_ladj(v), (q,))
    assert torch.autograd.gradgradcheck(lambda v: T.call_and_ladj(v), (q,))
    x = xyz.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: T.inv(v), (x,))
    if fixed is None and not normalize:  # the inverse's double backward (tree poses: the reference's)
        assert torch.autograd.gradgradcheck(lambda v: T.inv(v), (x,))


def test_batch_dims_dtypes_and_no_host_sync():
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [-1, -1, -1]]
    T = InternalCoordinateTransform(table)
    xyz = torch.randn(2, 3, 5, 3, dtype=torch.float64)
    q = T.inv(xyz)
    assert q.shape == (2, 3, 15) and T.log_abs_det_jacobian(q, xyz).shape == (2, 3)
    torch.testing.assert_close(T(q), xyz, atol=1e-12, rtol=0)
    q32 = T.inv(xyz.float())
    assert q32.dtype == torch.float32 and T(q32).dtype == torch.float32
    torch.testing.assert_close(T(q32), xyz.float(), atol=1e-5, rtol=0)
    for Tk in (T, InternalCoordinateTransform(table, fixed_atoms=[0, 1, 2], normalize_angles=True)):
        qg = Tk.inv(xyz).requires_grad_(True)
        with DispatchAudit() as audit:
            x, ladj = Tk.call_and_ladj(qg)
            (x.sum() + ladj.sum()).backward()
            Tk.inv(x.detach())
        assert audit.syncs == []


#: dispatched ops per call at batch 1 beyond to_xyz's, alanine dipeptide (22 atoms): the per-call
#: floor of a small batch is the dispatch of every op (the global forward includes the 5 of the
#: check of cos beta, _in_chart; main before the fused path, without that check: forward with
#: log-det 68 / 254, inverse 246 / 246, global / fixed; before the compiled rows and motions
#: 54 / 145, 167 / 64; the global inverse measures dihedrals against the axes to_xyz carries
#: through straight angles since issue 31, in torch ops: 103 -> 247; in the compiled kernel: 109)
#: with fixed atoms the forward is one compiled call since (zmat/csrc/world.cpp): 60 -> 3
#: the log-determinant one compiled call (world.cpp's log_det): global forward 49 -> 42
#: the global inverse's tree poses one compiled call (internal.cpp's pose): 108 -> 12, inverse and
#: its backward 308 -> 32 (the third number; with fixed atoms 10)
#: with fixed atoms the inverse's rows and log-det one compiled call, q flat (zmat/csrc/fixed.cpp):
#: inverse 3 -> 2, and its backward 10 -> 8 (with the allocation of the log-det's gradient in q)
OPS_PER_CALL = {"global": (7, 12, 32), "fixed": (3, 2, 8)}


@pytest.mark.parametrize("mode", ["global", "fixed"])
def test_ops_per_call_at_batch_one(spy, mode):  # the pins are the compiled path's
    with np.load(DATA / "bgflow_reference.npz") as f:
        table, xyz, fixed = f["ala2/table"], torch.as_tensor(f["ala2/xyz"][:1]), f["ala2/fixed"]
    T = InternalCoordinateTransform(table, fixed_atoms=fixed if mode == "fixed" else None)
    q = T.inv(xyz)
    C = torch.zeros(1, T._plan.placement.n_atoms, 3, dtype=q.dtype)
    T.call_and_ladj(q), zmat.to_xyz(C, T._plan.placement)  # plans made once, outside the count
    with DispatchAudit() as place:
        zmat.to_xyz(C, T._plan.placement)
    with DispatchAudit() as forward:
        T.call_and_ladj(q)
    with DispatchAudit() as inverse:
        T.inv(xyz)
    x = xyz.clone().requires_grad_(True)
    T.inv(x).sum().backward()
    with DispatchAudit() as inverse_backward:
        T.inv(x).sum().backward()
    most_forward, most_inverse, most_inverse_backward = OPS_PER_CALL[mode]
    assert forward.count - place.count <= most_forward, forward.histogram().most_common()
    assert inverse.count <= most_inverse, inverse.histogram().most_common()
    assert inverse_backward.count <= most_inverse_backward, inverse_backward.histogram().most_common()


def test_every_device_and_dtype_agrees_with_cpu_float64(device, dtype):
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [2, 1, 3], [5, 2, 1]]
    table += [[-1, -1, -1], [7, -1, -1], [8, 7, -1], [9, 8, 7]]
    gen = torch.Generator().manual_seed(3)
    xyz64 = torch.randn(2, 5, 11, 3, generator=gen, dtype=torch.float64) * 2
    for fixed in (None, [0, 1, 2]):
        T = InternalCoordinateTransform(table, fixed_atoms=fixed, normalize_angles=True)
        q64 = T.inv(xyz64)
        xyz = xyz64.to(device, dtype)
        q = T.inv(xyz)
        assert q.device.type == device.type and q.dtype == dtype
        x, ladj = T.call_and_ladj(q)
        tol = 1e-10 if dtype == torch.float64 else 1e-4
        torch.testing.assert_close(x.cpu().double(), xyz64, atol=tol, rtol=0)
        torch.testing.assert_close(ladj.cpu().double(), T.log_abs_det_jacobian(q64), atol=tol * 10, rtol=tol)
        base = Independent(Normal(torch.full((33,), 0.5, device=device, dtype=dtype), 0.1), 1)
        assert TransformedDistribution(base, [T]).sample((3,)).shape == (3, 11, 3)


# ---------------------------------------------------------------- degenerate input
def test_degenerate_input_gives_finite_values_and_gradients():
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1]]
    T = InternalCoordinateTransform(table)
    q = T.inv(torch.randn(5, 3, dtype=torch.float64)).expand(4, 15).clone()
    q[0, 4] = 1.0  # cos beta = +1
    q[1, 4] = -1.0  # cos beta = -1
    q[2, 7] = math.pi  # straight third atom: collinear first atoms
    q[2, 10] = 0.0  # and a zero angle
    q[3, 3] = 0.0  # zero bond
    q[3, 12] = 0.0
    q.requires_grad_(True)
    x, ladj = T.call_and_ladj(q)
    (g,) = torch.autograd.grad(x.square().sum() + ladj.sum(), q)
    assert torch.isfinite(x).all() and torch.isfinite(ladj).all() and torch.isfinite(g).all()
    # inverse of collinear, coincident and z-aligned first atoms
    xyz = torch.randn(4, 5, 3, dtype=torch.float64)
    xyz[0, 2] = 2 * xyz[0, 1] - xyz[0, 0]  # collinear
    xyz[1, 1] = xyz[1, 0]  # coincident
    xyz[2, :3] = torch.tensor([[0.0, 0, 0], [0, 0, 1.5], [1, 0, 2]])  # first bond along +z: beta = 0
    xyz[3, :3] = torch.tensor([[0.0, 0, 0], [0, 0, -1.5], [1, 1, -2]])  # beta = pi
    xyz.requires_grad_(True)
    q = T.inv(xyz)
    (g,) = torch.autograd.grad(q.sum() + T.log_abs_det_jacobian(q).sum(), xyz)
    assert torch.isfinite(q).all() and torch.isfinite(g).all()
    # cos beta = +-1 exactly is a chart singularity of the angles, not of the positions
    torch.testing.assert_close(T(q[2:]), xyz[2:].detach(), atol=1e-13, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_rows_are_the_torch_rows(spy, dtype):
    """The inverse's rows in the compiled kernel (zmat/csrc/internal.cpp) against their torch
    reference (zmat.flows._rows_torch), values and gradients, on rows with coincident,
    collinear and straight references and Cartesian (fixed) rows; the double backward
    differentiates the reference."""
    from zmat import flows

    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [2, 1, 3], [5, 2, 1], [6, 5, 2]]
    T = InternalCoordinateTransform(table, fixed_atoms=[4])
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 8, 3, generator=gen, dtype=torch.float64)
    x[1, 3] = x[1, 2]  # coincident bonded atoms: r = 0, no angle, no dihedral
    x[2, 3] = 2 * x[2, 2] - x[2, 1]  # straight angle: no dihedral
    x[3, 1] = x[3, 0]  # coincident angle references
    x[4, 6] = x[4, 5] + 0.5 * (x[4, 5] - x[4, 2])  # straight angle of the last rows
    x = x.to(dtype).requires_grad_(True)
    t = T._tensors(x.device, dtype)
    g = torch.randn(6, 8, 3, generator=gen, dtype=torch.float64).to(dtype)
    with torch.no_grad():  # the kernel's forward (a plain call) and its gradient (the Function)
        fast = flows._rows(x, t, "")
    (fast_g,) = torch.autograd.grad(flows._rows(x, t, ""), x, g)
    ref = flows._rows_torch(x, t, "")
    (ref_g,) = torch.autograd.grad(ref, x, g)
    assert spy.calls["internal_forward"] == 2 and spy.calls["internal_backward"] == 1
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(fast, ref.detach(), atol=tol, rtol=0)
    torch.testing.assert_close(fast_g, ref_g, atol=tol, rtol=tol)
    if dtype == torch.float64:
        x0 = x[:1].detach().requires_grad_(True)
        assert torch.autograd.gradgradcheck(lambda v: flows._rows(v, t, ""), (x0,))


@pytest.mark.parametrize("fixed", [None, [0, 1, 2, 5]])
def test_compiled_rigid_motions_are_the_torch_ones(spy, fixed):
    """The forward's rigid motions in the compiled kernel (zmat/csrc/move.cpp) against their
    torch reference (zmat.flows._moved_torch): one frame, and one per anchored group with
    Cartesian atoms; values and every input's gradient; the double backward differentiates
    the reference."""
    from zmat import flows

    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [2, 1, 3], [5, 2, 1], [6, 5, 2]]
    T = InternalCoordinateTransform(table, fixed_atoms=fixed)
    t = T._tensors(torch.device("cpu"), torch.float64)
    gen = torch.Generator().manual_seed(6)
    B, F, M = 3, T._plan.n_frames, T._plan.placement.n_atoms
    R = torch.linalg.qr(torch.randn(B, F, 3, 3, generator=gen, dtype=torch.float64))[0]
    args = [R, *(torch.randn(B, k, 3, generator=gen, dtype=torch.float64) for k in (F, M, 8))]
    args = [a.requires_grad_(True) for a in args]
    g = torch.randn(B, 8, 3, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        fast = flows._moved(*args, t, fixed is not None)
    fast_g = torch.autograd.grad(flows._moved(*args, t, fixed is not None), args, g)
    ref = flows._moved_torch(*args, t, fixed is not None)
    ref_g = torch.autograd.grad(ref, args, g, allow_unused=True, materialize_grads=True)
    assert spy.calls["move_forward"] == 2 and spy.calls["move_backward"] == 1
    torch.testing.assert_close(fast, ref.detach(), atol=1e-13, rtol=0)
    for a, b in zip(fast_g, ref_g, strict=True):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=0)
    small = [a[:1].detach().requires_grad_(True) for a in args]
    assert torch.autograd.gradgradcheck(lambda *v: flows._moved(*v, t, fixed is not None), small)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_world_forward_is_the_torch_forward(spy, dtype):
    """The forward with fixed atoms in the compiled kernel (zmat/csrc/world.cpp: every atom placed
    in world coordinates, the log-determinant in the same pass) against its torch reference
    (frames, to_xyz, rigid motions; T._reference): an anchored group and a free tree whose third
    atom is on its root and whose last atoms refer to fixed atoms, angles plain and normalised;
    values and gradients of both outputs."""
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [2, 1, 3], [5, 2, 1]]
    table += [[-1, -1, -1], [7, -1, -1], [7, 8, -1], [9, 7, 2], [4, 3, 2], [11, 4, 3], [10, 9, 0]]
    gen = torch.Generator().manual_seed(7)
    xyz = torch.randn(5, 14, 3, generator=gen, dtype=torch.float64) * 2
    for normalize in (False, True):
        T = InternalCoordinateTransform(table, fixed_atoms=[0, 1, 2, 4], normalize_angles=normalize)
        q = T.inv(xyz).to(dtype).requires_grad_(True)
        gx, gl = torch.randn(5, 14, 3, generator=gen, dtype=torch.float64).to(dtype), torch.randn(5).to(dtype)
        before = dict(spy.calls)
        fast = T.call_and_ladj(q)
        (fast_g,) = torch.autograd.grad((fast[0] * gx).sum() + (fast[1] * gl).sum(), q)
        assert spy.calls["world_forward"] - before.get("world_forward", 0) == 1
        assert spy.calls["world_backward"] - before.get("world_backward", 0) == 1
        ref = T._reference(q.reshape(5, 14, 3))
        (ref_g,) = torch.autograd.grad((ref[0] * gx).sum() + (ref[1] * gl).sum(), q)
        tol = 1e-12 if dtype == torch.float64 else 2e-5
        torch.testing.assert_close(fast[0], ref[0], atol=tol, rtol=0)
        torch.testing.assert_close(fast[1], ref[1] + T._constant, atol=tol, rtol=tol)
        torch.testing.assert_close(fast_g, ref_g, atol=tol * 10, rtol=tol)
    # gradcheck / gradgradcheck through the kernel: test_gradcheck_call_and_ladj


def test_compiled_world_log_det_is_the_jacobians_near_straight_angles(spy):
    """The compiled forward's log-determinant against the slogdet of its own autograd Jacobian,
    at angles 1e-3 and 1e-6 from straight (a dihedral then barely moves its atom) and at a tree's
    pole; exactly straight angles and zero bonds give finite values and gradients."""
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [4, 3, 2], [4, 3, 5]]
    table += [[-1, -1, -1], [7, -1, -1], [7, 8, -1], [9, 7, 5]]
    T = InternalCoordinateTransform(table, fixed_atoms=[0, 1, 2])
    xyz = torch.randn(11, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 2
    q = T.inv(xyz).detach()
    for gap in (1e-3, 1e-6):
        qs = q.clone()
        qs[3 * 4 + 1] = math.pi - gap  # atom 4: the reference angle of atoms 5 and 6
        qs[3 * 5 + 1] = gap
        qs[3 * 8 + 1] = 1 - gap**2 / 2  # cos beta of the free tree: near its pole
        J = torch.autograd.functional.jacobian(lambda v: T(v).reshape(-1), qs)
        torch.testing.assert_close(T.call_and_ladj(qs)[1], torch.linalg.slogdet(J)[1], atol=1e-7, rtol=0)
    qd = q.clone()
    qd[3 * 4 + 1], qd[3 * 5] = math.pi, 0.0  # a straight angle, then a zero bond
    qd = qd.requires_grad_(True)
    x, ld = T.call_and_ladj(qd)
    (g,) = torch.autograd.grad(x.sum() + ld, qd)
    assert torch.isfinite(x).all() and torch.isfinite(ld) and torch.isfinite(g).all()
    assert spy.calls["world_backward"] >= 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_log_det_is_the_torch_one(spy, dtype):
    """T.log_abs_det_jacobian in the compiled kernel (zmat/csrc/world.cpp's log_det) against
    zmat.flows._log_det, values and gradients, plain and normalised, with bonds and angles at the
    clamp (a zero bond, a straight and a zero angle: their terms floored, zero gradient)."""
    from zmat import flows

    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [2, 1, 3]]
    gen = torch.Generator().manual_seed(9)
    for normalize in (False, True):
        T = InternalCoordinateTransform(table, fixed_atoms=[5], normalize_angles=normalize)
        q = torch.rand(4, 18, generator=gen, dtype=torch.float64).to(dtype)
        q[1, 9], q[2, 10], q[3, 13] = 0.0, 1.0 if normalize else math.pi, 0.0
        q.requires_grad_(True)
        t = T._tensors(q.device, dtype)
        (fast_g,) = torch.autograd.grad(T.log_abs_det_jacobian(q).sum(), q)
        ref = flows._log_det(T._scale(q.reshape(4, 6, 3), t), t["ld_weights"]) + T._constant
        (ref_g,) = torch.autograd.grad(ref.sum(), q)
        assert spy.calls["log_det"] >= 2
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(T.log_abs_det_jacobian(q), ref, atol=tol, rtol=tol)
        torch.testing.assert_close(fast_g, ref_g, atol=tol, rtol=tol)


def test_compiled_forward_at_extreme_bonds_and_angles_is_the_torch_one(spy):
    """world.cpp's inline sin/cos and its log-det as the log of a product, rescaled by powers of
    two, against the torch reference (float64): dihedrals far from [-pi, pi] (past the inline
    reduction's range too) and at multiples of pi/2, angles near 0 and pi, bonds from 0 to 1e70
    (the product leaves [2^-400, 2^400] and comes back)."""
    from zmat import flows

    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]] + [[i - 1, i - 2, i - 3] for i in range(3, 15)]
    T = InternalCoordinateTransform(table, fixed_atoms=[0, 1, 2])
    gen = torch.Generator().manual_seed(12)
    q = T.inv(torch.randn(15, 3, generator=gen, dtype=torch.float64) * 2).reshape(15, 3).repeat(3, 1, 1)
    q[0, 3:, 1] = torch.tensor([math.pi / 2, 1e-3, math.pi - 1e-3, 2.0, 0.5, 3.0] * 2)  # in (0, pi)
    q[0, 3:, 2] = torch.tensor([-1e3, 3.5 * math.pi, 1e-300, -1e6, 823549.7, -8e5, 1e3, 2.5, -250.5, 5, 0, 1])
    q[1, 3:9, 0] = torch.tensor([1e30, 1e30, 1e30, 1e70, 2e70, 1.0])
    q[2, 3:, 0] = torch.tensor([0.0, 1e-30] * 6)
    q = q.reshape(3, 45)
    x, ld = T.call_and_ladj(q)
    torch.testing.assert_close(x[0], T._place(q, (3, 15, 3))[0], atol=1e-10, rtol=0)
    ref = flows._log_det(q.reshape(3, 15, 3), T._tensors(q.device, q.dtype)["ld_weights"])  # torch ops
    torch.testing.assert_close(ld, ref, atol=1e-11, rtol=1e-14)
    torch.testing.assert_close(T.log_abs_det_jacobian(q), ref, atol=1e-11, rtol=1e-14)
    assert spy.calls["world_forward"] == 1 and spy.calls["log_det"] == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_tree_pose_is_the_torch_one(spy, dtype):
    """The global inverse's tree poses in the compiled kernel (internal.cpp's pose) against
    zmat.flows._tree_pose_torch, values and gradients of the axes and the chart, where the
    fallbacks are active: a zero first bond, a first bond along +z and -z (v's fallback from
    +x), the third atom on the first bond's line (v's fallback), and both at once."""
    from zmat import flows

    tree = np.array([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
    T = InternalCoordinateTransform(np.concatenate([np.where(tree < 0, -1, tree + 3 * k) for k in range(5)]))
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 15, 3, generator=gen, dtype=torch.float64)
    x[0, 4] = x[0, 3]  # zero first bond
    x[0, 7] = x[0, 6] + torch.tensor([0.0, 0.0, 1.3], dtype=torch.float64)  # along +z
    x[0, 11] = x[0, 9] + 0.7 * (x[0, 10] - x[0, 9])  # third atom on the first bond's line
    x[1, 13] = x[1, 12] - torch.tensor([0.0, 0.0, 0.9], dtype=torch.float64)  # along -z, straight
    x[1, 14] = x[1, 12] + torch.tensor([0.0, 0.0, 2.0], dtype=torch.float64)
    x = x.to(dtype).requires_grad_(True)
    t = T._tensors(x.device, dtype)
    fast, ref = flows._tree_pose(x, t), flows._tree_pose_torch(x, t)
    assert spy.calls["pose_forward"] == 1
    gR, gE = (torch.randn(r.shape, generator=gen).to(dtype) for r in ref)
    grads = [torch.autograd.grad((out[0] * gR).sum() + (out[1] * gE).sum(), x)[0] for out in (fast, ref)]
    assert spy.calls["pose_backward"] == 1
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip([*fast, grads[0]], [*ref, grads[1]], strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    assert fast[1][0, 1, 2] == 1 and fast[1][1, 1, 4] == -1  # cos beta exactly at the poles


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_tree_frames_are_the_torch_ones(spy, dtype):
    """The global forward's tree rotations and origins in the compiled kernel (euler.cpp)
    against zmat.flows' torch path (_in_chart, _scale, _euler_to_matrix), values and gradients,
    normalised or not: cos beta outside the chart (clamped, no gradient), at the poles (sin beta
    0, no gradient through it), inside; a tree of one atom and one of two atoms (their unread
    entries are Cartesian: not clamped)."""
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [-1, -1, -1], [-1, -1, -1], [5, -1, -1]]
    gen = torch.Generator().manual_seed(5)
    for normalize in (False, True):
        T = InternalCoordinateTransform(table, normalize_angles=normalize)
        q = torch.randn(5, 21, generator=gen, dtype=torch.float64) * 2
        q[:, 4] = torch.tensor([1.3, -1.0, 1.0, -1.7, 0.4])  # tree 0's cos beta
        q[:, 19] = torch.tensor([0.2, 1.5, -1.0, 0.9, -2.0])  # tree 2's
        q[:, 13] = 4.0  # the lone root's y (the slot of a cos beta it does not have)
        q = q.to(dtype).requires_grad_(True)
        t = T._tensors(q.device, dtype)
        q3 = q.view(5, 7, 3)
        fast, ref = T._tree_frames(q3, t), T._tree_frames_torch(q3)
        gR, go = (torch.randn(r.shape, generator=gen, dtype=torch.float64).to(dtype) for r in ref)
        grads = [torch.autograd.grad((R * gR).sum() + (o * go).sum(), q)[0] for R, o in (fast, ref)]
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        for a, b in zip([*fast, grads[0]], [*ref, grads[1]], strict=True):
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)
        assert (grads[0][[0, 3], 4] == 0).all() and (grads[0][[1, 4], 19] == 0).all()  # clamped
    assert spy.calls["euler_forward"] == 2 and spy.calls["euler_backward"] == 2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_global_forward_is_the_torch_one(spy, dtype):
    """The global forward + log-det on its compiled path (one kernel check: euler, the placement,
    move, log_det) against the torch path (T._place, zmat.flows._log_det), values and gradients,
    normalised or not: three trees (of four, one and two atoms), cos beta out of the chart too."""
    from zmat import flows

    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [-1, -1, -1], [-1, -1, -1], [5, -1, -1]]
    gen = torch.Generator().manual_seed(7)
    for normalize in (False, True):
        T = InternalCoordinateTransform(table, normalize_angles=normalize)
        q = T.inv(torch.randn(4, 7, 3, generator=gen, dtype=torch.float64) * 2)
        q[0, 4] = 1.3  # cos beta out of the chart: clamped
        q = q.to(dtype).requires_grad_(True)
        t = T._tensors(q.device, dtype)
        before = spy.of("euler_forward", "forward", "move_forward", "log_det")
        fast = T.call_and_ladj(q)
        assert spy.of("euler_forward", "forward", "move_forward", "log_det") == tuple(n + 1 for n in before)
        ld = flows._log_det(T._scale(q.view(4, 7, 3), t), t["ld_weights"]) + T._constant
        ref = T._place(q, (4, 7, 3)), ld
        gx, gl = (torch.randn(r.shape, generator=gen, dtype=torch.float64).to(dtype) for r in ref)
        grads = [torch.autograd.grad((x * gx).sum() + (d * gl).sum(), q)[0] for x, d in (fast, ref)]
        tol = 1e-12 if dtype == torch.float64 else 2e-5
        for a, b in zip([*fast, grads[0]], [*ref, grads[1]], strict=True):
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_fused_global_inverse_is_the_three_calls(spy):
    """The global inverse in one Function (zmat._kernel.global_inverse) gives the same bits as
    its three calls apart (poses, carried rows, orientations), values and gradients, normalised
    or not, float64 and float32, on two trees (each chain end on its own tree's +z)."""
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [2, 1, 3]]
    table += [[-1, -1, -1], [6, -1, -1], [7, 6, -1], [8, 7, 6]]
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(3, 10, 3, generator=gen, dtype=torch.float64) * 2
    w = torch.randn(3, 30, generator=gen, dtype=torch.float64)
    for normalize in (False, True):
        T = InternalCoordinateTransform(table, normalize_angles=normalize)
        for dtype in (torch.float64, torch.float32):
            v = x.to(dtype).requires_grad_(True)
            before = spy.of("global_forward", "global_backward", "carried_forward", "carried_backward")
            outs = [T._inverse(v, fuse=fuse) for fuse in (True, False)]
            grads = [torch.autograd.grad((q * w.to(dtype)).sum(), v)[0] for q in outs]
            assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])
            after = spy.of("global_forward", "global_backward", "carried_forward", "carried_backward")
            assert after == tuple(n + 1 for n in before)  # one call each way, fused and apart
    assert T._fused_inverse(x, T._tensors(x.device, x.dtype)) is not None


def _hard_global_case(dtype, near: bool):
    """Two trees of chains, eight copies each turned and shifted: straight angles (exactly pi;
    ``near``: also pi - 3e-11 and pi - 3e-6, a normal too short to be one in float64, resp.
    float32, but not zero), a sibling (OFFSET) row on the straight line, a tree whose first
    three atoms are on a line, bonds of 1e-4 and 3e-3, an angle near 0, dihedrals near +-pi."""
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [4, 3, 2], [5, 4, 3], [4, 3, 5]]
    table += [[-1, -1, -1], [8, -1, -1], [9, 8, -1], [10, 9, 8], [11, 10, 9], [12, 11, 10]]
    pi, (a, b) = math.pi, (3e-11, 3e-6) if near else (0.0, 0.0)
    C = [[0, 0, 0], [1.5, 0, 0], [1.4, 2.0, 0], [1.3, pi, 0.4], [1.2, pi - a, -1.0], [1.1, 1.9, 3.14]]
    C += [[1.5, pi - b, 2.1], [1.0, 2.2, -3.14], [0, 0, 0], [1e-4, 0, 0], [1.2, pi, 0]]
    C += [[3e-3, 2.0, 0.3], [1.1, 1e-3, -2.9], [1.3, 1.7, 1.0]]  # (atom 11 against its tree's +z)
    C = torch.tensor(C, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    x = torch.stack([_structure(table, C, seed=k) for k in range(8)])
    w = torch.randn(x.shape[0], 3 * len(table), generator=gen, dtype=torch.float64)
    return table, x.to(dtype), w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_global_inverse_is_the_torch_one_on_hard_input(spy, monkeypatch, dtype):
    """The fused global inverse (``zmat._kernel.global_inverse``: internal.cpp's global_forward
    and global_backward, T.inv's log-det from the same pass) equals the torch path
    (``ZMAT_NO_KERNEL``), q, the log-det and the gradient of a loss of both, normalised or not,
    through straight angles (carried axes), tiny bonds, angles near 0 and dihedrals near +-pi.
    Near-straight rows: a normal of length ~|b|^2 sin carries a relative
    error of eps / sin in either path, hence their looser bound (and no log-det in their loss: the
    torch path's sin of a theta rounded near pi is off by eps / sin too)."""
    f64 = dtype == torch.float64
    for near, tol in ((False, 1e-10 if f64 else 5e-4), (True, 1e-5 if f64 else 5e-2)):
        table, x, w = _hard_global_case(dtype, near)
        for normalize in (False, True):
            T, out = InternalCoordinateTransform(table, normalize_angles=normalize), []
            for off in ("", "1"):
                monkeypatch.setenv("ZMAT_NO_KERNEL", off)
                before = spy.of("global_forward", "global_backward", "log_det")
                v = x.clone().requires_grad_(True)
                q = T.inv(v)
                ld = T.inv.log_abs_det_jacobian(v, q)  # (kernel: from the inverse's pass)
                lw = torch.arange(1.0, 9.0, dtype=dtype) * (not near)  # (cot theta ~3e10 near pi)
                loss = (q * w).sum() + (ld * lw).sum()
                out.append((q, ld, *torch.autograd.grad(loss, v)))
                n = 1 if off == "" else 0  # the fused path, once each way, or not at all
                assert spy.of("global_forward", "global_backward", "log_det") == (
                    *(b + n for b in before[:2]),
                    0,
                )
            (q1, l1, g1), (q2, l2, g2) = out
            for a, b in ((q1, q2), (l1, l2), (g1, g2)):
                assert a.shape == b.shape and ((a - b).abs() / (1 + b.abs())).max() < tol


def test_first_bond_along_z_round_trips_exactly():
    """The chart's poles: molecules in a standard orientation (diatomics along z) round trip to
    rounding, because cos beta is +-1 exactly there (a rounded unit vector would lose sin beta
    to sqrt(2 eps), ~1e-8 A)."""
    T = InternalCoordinateTransform([[-1, -1, -1], [0, -1, -1], [1, 0, -1]])
    L = torch.linspace(0.5, 3.0, 200, dtype=torch.float64)
    sign = torch.where(torch.arange(200) % 2 == 0, 1.0, -1.0).double()
    xyz = torch.zeros(200, 3, 3, dtype=torch.float64)
    xyz[:, 1, 2] = sign * L
    xyz[:, 2] = torch.tensor([0.7, -0.4, 0.3], dtype=torch.float64)
    q = T.inv(xyz)
    assert q[:, 4].abs().eq(1).all()
    assert (T(q) - xyz).abs().max() < 1e-14


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "table,fixed,match",
    [
        ([[-1, -1, -1], [0, -1, -1], [1, -1, -1]], None, "atom 2: row \\(1, -1, -1\\)"),
        ([[-1, -1, -1], [0, -1, -1], [0, -1, -1]], None, "atom 2: a second row"),
        ([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, -1]], None, "atom 3: row \\(2, 1, -1\\)"),
        ([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]], [0], "atom 1: row \\(0, -1, -1\\)"),
        ([[-1, -1, -1], [0, -1, -1], [1, 0, 3], [-1, -1, -1]], [3], "atom 2 refers to fixed atom 3 but"),
        ([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]], [7], "atom 7 is out of range"),
        ([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]], [1, 1], "atom 1 is listed more than once"),
        ([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]], [[0, 1]], "1-D array"),
        ([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [-1, -1, -1], [3, -1, -1], [4, 3, -1], [2, 1, 5]], None,
         "atoms 0 and 3 are roots of one connected group"),
    ],
)  # fmt: skip
def test_bad_input_names_the_atom(table, fixed, match):
    with pytest.raises(ValueError, match=match):
        InternalCoordinateTransform(table, fixed_atoms=fixed)


def test_bad_shapes():
    T = InternalCoordinateTransform([[-1, -1, -1], [0, -1, -1]])
    with pytest.raises(ValueError, match=r"\(\.\.\., 6\)"):
        T(torch.zeros(5))
    with pytest.raises(ValueError, match=r"\(\.\.\., 2, 3\)"):
        T.inv(torch.zeros(3, 3))
    with pytest.raises(TypeError, match="floating"):
        T(torch.zeros(6, dtype=torch.long))


# ---------------------------------------------------------------- real molecules
def _protein(name):
    p = zmat.protein.from_pdb(DATA / name)
    return p.table, torch.as_tensor(p.xyz, dtype=torch.float64), np.asarray(p.atom_names)


@pytest.mark.parametrize("name", ["1l2y.pdb", "1ubi.pdb"])
@pytest.mark.parametrize("backbone_fixed", [False, True])
def test_round_trip_on_proteins(name, backbone_fixed):
    table, xyz, names = _protein(name)
    fixed = np.nonzero(np.isin(names, ["N", "CA", "C"]))[0] if backbone_fixed else None
    T = InternalCoordinateTransform(table, fixed_atoms=fixed, normalize_angles=True)
    q = T.inv(xyz)
    assert (T(q) - xyz).abs().max() <= 1e-11
    x32 = T(T.inv(xyz.float()))
    assert (x32.double() - xyz).abs().max() <= 5e-4
    if backbone_fixed:  # Cartesian entries are the backbone's positions themselves
        assert torch.equal(q.reshape(-1, 3)[fixed], xyz[fixed])


def test_round_trip_on_ase_g2_molecules():
    """In their standard orientation (many along +-z: the chart's poles) and rotated at random."""
    from ase.collections import g2

    worst, degenerate, tested = 0.0, [], 0
    gen = torch.Generator().manual_seed(0)
    for atoms in g2:
        table = zmat.ZMatrix.from_atoms(atoms).table
        T = InternalCoordinateTransform(table)
        xyz = torch.as_tensor(atoms.positions, dtype=torch.float64)
        for x in (xyz, xyz @ _rotation(gen).T + torch.randn(3, generator=gen, dtype=torch.float64)):
            third = (table.refs >= 0).sum(1) == 2
            if (torch.sin(zmat.to_internal(x, table)[third, 1]).abs() < 1e-6).any():
                # the first three atoms collinear (linear molecules, propyne): the Jacobian is singular
                # there (sin theta_2 = 0) and the turn about the axis is not in the first atoms
                degenerate.append(atoms.get_chemical_formula())
                continue
            tested += 1
            worst = max(worst, float((T(T.inv(x)) - x).abs().max()))
    assert worst <= 1e-11 and len(set(degenerate)) <= 9, (worst, sorted(set(degenerate)))
    assert tested >= 2 * (len(g2) - 9)  # 8 linear molecules and propyne left out
