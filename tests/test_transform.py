"""to_xyz / to_internal: every method, against ASE, each other, finite differences."""

import contextlib
import functools
import math
import os

import numpy as np
import pytest
import torch
from ase.io.zmatrix import parse_zmatrix
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import chain_table, internal_coordinates, random_internal, straight_angles, tables

import zmat
from zmat.table import POSITIONAL
from zmat.testing import assert_methods_agree, assert_rigid_invariant

METHODS = zmat.METHODS
# check_batched_grad goes through torch internals that still call torch.jit.script
_JIT_DEPRECATED = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def _zmatrix_lines(rows, c):
    """Gaussian-style lines for ASE (rows in construction order, 1-based refs)."""
    lines = []
    for i, (b, a, d) in enumerate(rows):
        r, t, p = c[i].tolist()
        fields = ["C"]
        for ref, val in ((b, r), (a, math.degrees(t)), (d, math.degrees(p))):
            if ref >= 0:
                fields += [str(ref + 1), repr(val)]
        lines.append(" ".join(fields))
    return lines


def _standard_table(n, seed):
    """ASE-style z-matrix: atoms 0-2 as usual, then random earlier references."""
    rng = np.random.default_rng(seed)
    rows = chain_table(min(n, 3))
    for i in range(3, n):
        b, a, d = rng.choice(i, 3, replace=False)
        rows.append([int(b), int(a), int(d)])
    return rows


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", range(4))
def test_matches_ase_parse_zmatrix(method, seed):
    n = 14
    rows = _standard_table(n, seed) if seed else chain_table(n)
    c = random_internal(n, seed=seed)
    ase_xyz = torch.tensor(parse_zmatrix(_zmatrix_lines(rows, c)).positions)
    xyz = zmat.to_xyz(c, rows, method=method)
    assert torch.allclose(xyz, ase_xyz, atol=1e-10, rtol=0)


@pytest.mark.parametrize("a_first", [True, False])
def test_third_atom_on_plus_y_like_ase(a_first):
    # (b, a) = (1, 0) and (0, 1): both place atom 2 in the xy-plane with y > 0
    rows = [[-1, -1, -1], [0, -1, -1], [1, 0, -1] if a_first else [0, 1, -1]]
    c = torch.tensor([[0, 0, 0], [1.3, 0, 0], [1.1, 1.9, 0]], dtype=torch.float64)
    ref = torch.tensor(parse_zmatrix(_zmatrix_lines(rows, c)).positions)
    for method in METHODS:
        xyz = zmat.to_xyz(c, rows, method=method)
        assert torch.allclose(xyz, ref, atol=1e-12) and xyz[2, 1] > 0 and xyz[2, 2] == 0


@settings(max_examples=30)
@given(rows=tables(max_atoms=14), data=st.data())
def test_methods_agree(rows, data):
    n = len(rows)
    c = data.draw(internal_coordinates(n, batch=(2,)))
    assert torch.isfinite(zmat.to_xyz(c, rows, method="reference")).all()
    assert_methods_agree(c, rows, atol=1e-10)  # positions and a vector-Jacobian product


@_JIT_DEPRECATED
@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=8)
@given(rows=tables(min_atoms=2, max_atoms=8), data=st.data())
def test_gradcheck_and_gradgradcheck(method, rows, data):
    c = data.draw(internal_coordinates(len(rows))).requires_grad_()

    def f(x):
        return zmat.to_xyz(x, rows, method=method)

    assert torch.autograd.gradcheck(f, c, check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(f, c)


@pytest.mark.parametrize("method", METHODS)
def test_forward_mode_ad_with_dual_tensors(method):
    rows = _standard_table(7, 3)
    c = random_internal(7, seed=3).requires_grad_()
    f = lambda x: zmat.to_xyz(x, rows, method=method)  # noqa: E731
    assert torch.autograd.gradcheck(f, c, check_forward_ad=True, check_batched_forward_grad=True)


@_JIT_DEPRECATED
@settings(max_examples=8)
@given(rows=tables(min_atoms=2, max_atoms=8), data=st.data())
def test_to_internal_gradcheck_and_gradgradcheck(rows, data):
    # away from the undefined dihedrals, where the value is pinned to 0
    xyz = zmat.to_xyz(data.draw(internal_coordinates(len(rows))), rows).requires_grad_()

    def f(x):
        return zmat.to_internal(x, rows)

    assert torch.autograd.gradcheck(f, xyz, check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(f, xyz)


@pytest.mark.parametrize("method", METHODS)
def test_gradcheck_at_straight_angles_in_a_chain(method):
    # proper rows propagate frames: exactly linear angles are smooth points
    c = random_internal(9)
    c[3, 1] = math.pi
    c[4, 1] = math.pi
    c[6, 1] = 0.0
    c.requires_grad_()

    def f(x):
        return zmat.to_xyz(x, chain_table(9), method=method)

    assert torch.autograd.gradcheck(f, c)
    assert torch.autograd.gradgradcheck(f, c)


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=10)
@given(rows=tables(min_atoms=3, max_atoms=12, proper_bias=0.2), data=st.data())
def test_linear_geometry_is_finite(method, rows, data):
    c = data.draw(internal_coordinates(len(rows), linear=True)).requires_grad_()
    xyz = zmat.to_xyz(c, rows, method=method)
    (grad,) = torch.autograd.grad(xyz.square().sum(), c)
    assert torch.isfinite(xyz).all() and torch.isfinite(grad).all()
    # moderate where frames propagate: no 1/sin(theta) blow-up (bounded by lever
    # arms ~ N * max bond length). A positional row anchored on nearly collinear
    # positions (an angle within 1e-7 of 0 or pi upstream) has a genuinely large
    # derivative: its reference plane turns by ~1/1e-7 per unit of motion.
    if not (zmat.ConstructionTable(rows).kind == POSITIONAL).any():
        assert grad.abs().max() < 1e4


def test_positional_row_on_nearly_collinear_references_has_its_true_large_gradient():
    # found by hypothesis: atoms 1 and 6 lie within 1e-7 rad of the line 4-2, so
    # atom 3's reference plane (1, 6, 4) is nearly undefined; the large gradient
    # is the true derivative (central differences agree), finite in every method.
    rows = [[-1, -1, -1], [4, 2, 0], [4, 0, -1], [4, 6, 1], [0, -1, -1], [0, 4, 2], [2, 4, 0]]
    c = torch.tensor(
        [
            [1.0984, 1e-7, -1.0377],
            [1.8248, 1e-7, 0.53157],
            [0.92992, 2.5042, -2.5270],
            [1.1778, 1.6552, 1.7621],
        ]
        + [[0.89033, 0.89691, 0.75750], [0.89999, 0.34222, 0.12563], [1.4945, math.pi - 1e-6, 2.6424]],
        dtype=torch.float64,
    )
    loss = lambda x, m: zmat.to_xyz(x, rows, method=m).square().sum()  # noqa: E731
    h = 1e-10
    step = torch.zeros_like(c)
    step[6, 1] = h
    fd = (loss(c + step, "reference") - loss(c - step, "reference")) / (2 * h)
    for method in METHODS:
        x = c.clone().requires_grad_()
        (g,) = torch.autograd.grad(loss(x, method), x)
        assert torch.isfinite(g).all() and abs(g[6, 1]) > 1e3
        torch.testing.assert_close(g[6, 1], fd, rtol=1e-3, atol=0)


def test_chain_dihedral_about_straight_angle_has_moderate_gradient():
    # the case where a NeRF built from cross products of positions divides by zero
    c = random_internal(6)
    c[3, 1] = math.pi  # atoms 1, 2, 3 collinear: phi of atom 4 is about a straight angle
    c.requires_grad_()
    for method in METHODS:
        xyz = zmat.to_xyz(c, chain_table(6), method=method)
        (g,) = torch.autograd.grad(xyz[5].sum(), c)
        assert torch.isfinite(g).all() and g.abs().max() < 20


def _defined(rows, c, xyz):
    """Mask of internal coordinates that to_internal can recover from xyz."""
    rows = np.asarray(rows)
    mask = torch.zeros_like(c, dtype=torch.bool)
    for i, (b, a, d) in enumerate(rows):
        if b >= 0:
            mask[..., i, 0] = True
        if a >= 0:
            mask[..., i, 1] = True
        if d >= 0:
            # dihedral defined when neither (d, a, b) nor (a, b, i) is near-linear
            ok = torch.ones(c.shape[:-2], dtype=torch.bool)
            for p, q, s in ((d, a, b), (a, b, i)):
                u, v = xyz[..., p, :] - xyz[..., q, :], xyz[..., s, :] - xyz[..., q, :]
                sin = torch.linalg.cross(u, v, dim=-1).norm(dim=-1) / (u.norm(dim=-1) * v.norm(dim=-1))
                ok &= sin > 1e-3
            mask[..., i, 2] = ok
    return mask


@settings(max_examples=30)
@given(rows=tables(max_atoms=14), data=st.data())
def test_round_trip(rows, data):
    c = data.draw(internal_coordinates(len(rows), batch=(2,)))
    xyz = zmat.to_xyz(c, rows)
    back = zmat.to_internal(xyz, rows)
    mask = _defined(rows, c, xyz)
    diff = back - c
    diff[..., 2] = torch.remainder(diff[..., 2] + math.pi, 2 * math.pi) - math.pi
    assert diff[mask].abs().max() < 1e-8 if mask.any() else True


@settings(max_examples=20)
@given(rows=tables(max_atoms=12), data=st.data())
def test_to_internal_invariant_under_rigid_motion(rows, data):
    c = data.draw(internal_coordinates(len(rows)))
    xyz = zmat.to_xyz(c, rows)
    q, _ = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64))
    q = q * torch.linalg.det(q)  # proper rotation
    shift = torch.randn(3, dtype=torch.float64)
    f = lambda x: zmat.to_internal(x, rows)  # noqa: E731
    assert_rigid_invariant(f, xyz, rotation=q, translation=shift, atol=1e-9, period=2 * math.pi)


@pytest.mark.parametrize("method", METHODS)
def test_batch_equals_loop(method):
    rows = _standard_table(10, 7)
    c = random_internal(10, batch=(2, 3), seed=3)
    out = zmat.to_xyz(c, rows, method=method)
    assert out.shape == (2, 3, 10, 3)
    for i in range(2):
        for j in range(3):
            assert torch.allclose(out[i, j], zmat.to_xyz(c[i, j], rows, method=method), atol=1e-12)
    inv = zmat.to_internal(out, rows)
    assert torch.allclose(inv[1, 2], zmat.to_internal(out[1, 2], rows), atol=1e-12)


def test_forest_of_different_molecules_equals_separate_builds():
    a, b = _standard_table(7, 1), chain_table(5)
    rows = a + [[r + 7 if r >= 0 else -1 for r in row] for row in b]
    ca, cb = random_internal(7, seed=1), random_internal(5, seed=2)
    both = zmat.to_xyz(torch.cat([ca, cb]), rows)
    assert torch.allclose(both[:7], zmat.to_xyz(ca, a), atol=1e-12)
    assert torch.allclose(both[7:], zmat.to_xyz(cb, b), atol=1e-12)


def test_missing_reference_columns_are_ignored_with_zero_gradient():
    rows = chain_table(5)
    c = random_internal(5).requires_grad_()
    xyz = zmat.to_xyz(c, rows)
    (g,) = torch.autograd.grad(xyz.sum(), c)
    assert (g[0] == 0).all() and (g[1, 1:] == 0).all() and g[2, 2] == 0
    c2 = c.detach().clone()
    c2[0] = 7.0
    c2[1, 1:] = 3.0
    c2[2, 2] = -1.0
    assert torch.equal(zmat.to_xyz(c2, rows), xyz.detach())


@pytest.mark.parametrize("method", ["analytic", "prefix", "levels"])
def test_float32_close_to_float64_on_a_10k_chain(method):
    # same (float32-representable) input, computed in float32 and in float64
    n = 10_000
    c = random_internal(n, seed=11, dtype=torch.float32)
    x32 = zmat.to_xyz(c, chain_table(n), method=method)
    x64 = zmat.to_xyz(c.double(), chain_table(n), method=method)
    err = (x32.double() - x64).norm(dim=-1).max().item()
    assert err < 1e-3, err  # documented tolerance: 1e-3 Angstrom


def test_to_internal_degenerate_is_finite():
    # coincident atoms, collinear triples, a straight dihedral
    xyz = torch.tensor(
        [[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0], [3, 0, 0], [3, 1, 0]], dtype=torch.float64
    ).requires_grad_()
    rows = chain_table(6)
    c = zmat.to_internal(xyz, rows)
    (g,) = torch.autograd.grad(c.sum(), xyz)
    assert torch.isfinite(c).all() and torch.isfinite(g).all()
    c = c.detach()
    assert c[3, 1].item() == pytest.approx(math.pi) and c[3, 2] == 0  # undefined dihedral -> 0
    assert c[4, 0] == 0


def test_dihedral_sign_is_iupac():
    # looking along a->b, d at 12 o'clock, i rotated clockwise by 90 degrees: +90
    xyz = torch.tensor([[0, 1, 0], [0, 0, 0], [0, 0, 1], [-1, 0, 1]], dtype=torch.float64)
    rows = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]]
    phi = zmat.to_internal(xyz, rows)[3, 2]
    from ase import Atoms

    assert phi == pytest.approx(math.radians(Atoms("H4", xyz.numpy()).get_dihedral(0, 1, 2, 3)))


@pytest.mark.parametrize(
    "shape, match",
    [((4, 3), r"shape \(\.\.\., 5, 3\).*got shape \(4, 3\)"), ((3, 5), r"transposed"), ((5,), "shape")],
)
def test_shape_mismatch_is_a_clear_error(shape, match):
    with pytest.raises(ValueError, match=match):
        zmat.to_xyz(torch.zeros(shape), chain_table(5))
    with pytest.raises(ValueError, match=match.replace("C", "xyz")):
        zmat.to_internal(torch.zeros(shape), chain_table(5))


def test_bad_types_and_methods():
    with pytest.raises(TypeError, match="floating"):
        zmat.to_xyz(torch.zeros(3, 3, dtype=torch.long), chain_table(3))
    with pytest.raises(TypeError, match="torch.Tensor"):
        zmat.to_xyz([[0.0] * 3] * 3, chain_table(3))
    with pytest.raises(ValueError, match="unknown method 'nerf'"):
        zmat.to_xyz(torch.zeros(3, 3), chain_table(3), method="nerf")


def test_numpy_input_is_accepted():
    c = random_internal(5)
    assert torch.allclose(zmat.to_xyz(c.numpy(), chain_table(5)), zmat.to_xyz(c, chain_table(5)))


@pytest.mark.parametrize("method", METHODS)
def test_devices_and_dtypes(method, device, dtype, tol):
    rows = _standard_table(9, 5)
    c = random_internal(9, batch=(3,), seed=5)
    ref = zmat.to_xyz(c, rows, method="reference")
    out = zmat.to_xyz(c.to(device, dtype).requires_grad_(), rows, method=method)
    assert out.device.type == device.type and out.dtype == dtype
    assert torch.allclose(out.double().cpu(), ref, atol=tol)
    out.sum().backward()


@pytest.mark.cuda
@pytest.mark.parametrize("method", METHODS)
def test_cuda_gradcheck(method):
    c = random_internal(7, seed=2).cuda().requires_grad_()
    rows = _standard_table(7, 2)
    assert torch.autograd.gradcheck(lambda x: zmat.to_xyz(x, rows, method=method), c)
    assert torch.autograd.gradgradcheck(lambda x: zmat.to_xyz(x, rows, method=method), c)


def test_positional_rows_exist_in_random_tables():
    # guard: the strategies exercise the position-dependent path too
    t = zmat.ConstructionTable(_standard_table(30, 0))
    assert (t.kind == POSITIONAL).sum() > 5


@pytest.mark.parametrize("half, atol", [(torch.float16, 0.05), (torch.bfloat16, 0.3)])
@pytest.mark.parametrize("method", METHODS)
def test_half_precision_runs_and_is_close(half, atol, method):
    c = random_internal(20, batch=(2,), seed=9)
    ref = zmat.to_xyz(c, chain_table(20))
    ch = c.to(half).requires_grad_()
    out = zmat.to_xyz(ch, chain_table(20), method=method)
    out.sum().backward()
    assert out.dtype == half and torch.isfinite(ch.grad).all()
    assert (out.double() - ref).abs().max() < atol


# ---------------------------------------------------------------- straight angles
# The rule for collinear references (docs/conventions.md, "Degenerate geometry"):
# a sibling or cousin dihedral reference gives its own frame's plane; any other
# collinear (d, a, b) a fixed perpendicular chosen with a tolerance for rounding.


@contextlib.contextmanager
def _kernel_off():
    """The torch path instead of the compiled kernel (read at every call)."""
    old = os.environ.get("ZMAT_NO_KERNEL")
    os.environ["ZMAT_NO_KERNEL"] = "1"
    try:
        yield
    finally:
        os.environ.pop("ZMAT_NO_KERNEL") if old is None else os.environ.__setitem__("ZMAT_NO_KERNEL", old)


@settings(max_examples=40)
@given(rows=tables(min_atoms=3, max_atoms=12, proper_bias=0.3, plane_bias=0.7), data=st.data())
def test_methods_agree_at_exactly_straight_angles(rows, data):
    c = data.draw(straight_angles(rows, batch=(2,)))
    assert_methods_agree(c, rows, atol=1e-10)  # the CPU kernel serves "analytic" where it is built
    with _kernel_off():  # and the torch path
        assert_methods_agree(c, rows, atol=1e-10, methods=("reference", "analytic"))
    x = c.clone().requires_grad_()
    xyz = zmat.to_xyz(x, rows)
    (g,) = torch.autograd.grad(xyz.square().sum(), x)
    assert torch.isfinite(xyz).all() and torch.isfinite(g).all()


@settings(max_examples=20)
@given(rows=tables(min_atoms=4, max_atoms=12, forest=False, permute=False, proper_bias=0.2, plane_bias=0.8))
def test_sibling_and_cousin_planes_match_ase_off_the_axis(rows):
    # away from straight angles the frame rule is the cross product of positions
    c = random_internal(len(rows), seed=len(rows))
    ase_xyz = torch.tensor(parse_zmatrix(_zmatrix_lines(rows, c)).positions)
    for method in METHODS:
        assert torch.allclose(zmat.to_xyz(c, rows, method=method), ase_xyz, atol=1e-10, rtol=0)


_ALLENE_TABLE = [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [1, 0, 2], [1, 0, 3], [2, 0, 3], [2, 0, 3]]


def test_allene_issue_example_every_method_agrees():
    # issue 20: atom 3's dihedral reference (atom 2, a cousin) lies on the axis 0-1;
    # reference/levels and prefix/analytic differed by 0.93-1.0 A
    p = math.pi
    c = torch.tensor(
        [[0, 0, 0], [1.31119, 0, 0], [1.31119, p, 0], [1.08566, 2.11863, 0], [1.08566, 2.11863, p]]
        + [[1.08566, 2.11863, p / 2], [1.08566, 2.11863, -p / 2]],
        dtype=torch.float64,
    )
    assert_methods_agree(c, _ALLENE_TABLE, atol=1e-10)
    with _kernel_off():
        assert_methods_agree(c, _ALLENE_TABLE, atol=1e-10, methods=("reference", "analytic"))
    xyz = zmat.to_xyz(c, _ALLENE_TABLE)
    # the cousin's plane: atom 3 at phi = 0 lies in the plane of atoms 2, 0, 1 (the xy-plane
    # of atom 2's placement), on the +y side, as ASE places it
    ase = torch.tensor(parse_zmatrix(_zmatrix_lines(_ALLENE_TABLE, c)).positions)
    torch.testing.assert_close(xyz, ase, atol=1e-9, rtol=0)
    # the cousin's own frame varies smoothly through the straight angle: exact derivatives there
    x = c.clone().requires_grad_()
    for method in METHODS:
        f = functools.partial(zmat.to_xyz, table=_ALLENE_TABLE, method=method)
        assert torch.autograd.gradcheck(f, x) and torch.autograd.gradgradcheck(f, x)


def _breadth_first_table(atoms):
    """A plain breadth-first table from ASE's bonds, atoms relabelled in construction
    order: b the parent, a and d the nearest placed atoms up the tree (or placed
    neighbours of b); no attempt to avoid collinear references."""
    from ase.neighborlist import natural_cutoffs, neighbor_list

    i, j = neighbor_list("ij", atoms, natural_cutoffs(atoms))
    nbrs = [sorted(j[i == k].tolist()) for k in range(len(atoms))]
    order, parent = [0], {0: -1}
    for k in order:
        for m in nbrs[k]:
            if m not in parent:
                parent[m] = k
                order.append(m)
    placed, rows = [], []
    for k in order:
        refs = []
        up = parent[k]
        while up >= 0 and len(refs) < 3:
            refs.append(up)
            up = parent[up]
        for m in placed:  # fill from placed atoms next to the references
            if len(refs) >= min(3, len(placed)):
                break
            if m not in refs and any(m in nbrs[r] or parent[m] == r for r in refs):
                refs.append(m)
        for m in placed:
            if len(refs) >= min(3, len(placed)):
                break
            if m not in refs:
                refs.append(m)
        rows.append([order.index(r) for r in refs] + [-1] * (3 - len(refs)))
        placed.append(k)
    return rows, atoms.positions[order]


@pytest.mark.parametrize("name", ["C3H4_D2d", "2-butyne", "CO2", "C2H2"])
def test_real_linear_molecules_rebuild_and_agree(name):
    from ase.collections import g2

    rows, pos = _breadth_first_table(g2[name])
    x = torch.tensor(pos, dtype=torch.float64)
    c = zmat.to_internal(x, rows)
    assert_methods_agree(c, rows, atol=1e-10)
    with _kernel_off():
        assert_methods_agree(c, rows, atol=1e-10, methods=("reference", "analytic"))
    rebuilt = zmat.to_xyz(c, rows)
    # every internal coordinate that is defined comes back
    mask = _defined(rows, c, x)
    back = zmat.to_internal(rebuilt, rows)
    assert ((back - c).abs()[mask] < 1e-9).all()
    if name != "2-butyne":  # (its methyls' relative twist is a dihedral about the C4 axis: not in the table)
        assert float(zmat.rmsd(rebuilt, x)) < 1e-8
        ase = torch.tensor(parse_zmatrix(_zmatrix_lines(rows, c)).positions)
        if torch.isfinite(ase).all():  # ASE normalises a zero vector where references are collinear
            assert float(zmat.rmsd(ase, x)) < 1e-8


def test_strategies_draw_sibling_and_cousin_rows_on_the_axis():
    # guard: the straight-angle tests see both kinds of plane rows, with d exactly on the axis
    seen = set()

    @settings(max_examples=150, derandomize=True, database=None)
    @given(rows=tables(min_atoms=3, max_atoms=12, proper_bias=0.3, plane_bias=0.7), data=st.data())
    def draw(rows, data):
        c = data.draw(straight_angles(rows))
        plane = zmat.ConstructionTable(rows).dihedral_plane
        for i in np.nonzero(plane)[0]:
            if float(c[rows[i][2], 1]) in (0.0, math.pi):
                seen.add(int(plane[i]))

    draw()
    assert seen == {1, -1}


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("method", METHODS)
def test_empty_batch_every_method(method, kernel):
    # issue 20: "prefix" (and the torch path's backward) failed to reshape 0 elements
    rows = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [0, 1, 2]]
    c = torch.zeros(0, 5, 3, dtype=torch.float64, requires_grad=True)
    with contextlib.nullcontext() if kernel else _kernel_off():
        xyz = zmat.to_xyz(c, rows, method=method)
        (g,) = torch.autograd.grad(xyz.sum(), c, create_graph=True)
    assert xyz.shape == (0, 5, 3) and g.shape == (0, 5, 3)
    assert zmat.to_internal(xyz.detach(), rows).shape == (0, 5, 3)


@pytest.mark.parametrize("method", METHODS)
def test_meta_device_gives_shapes(method):
    # issue 20: the autocast wrapper asked autocast about "meta", which it does not know
    rows = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [0, 1, 2], [3, 0, 1]]
    c = torch.zeros(2, 5, 3, device="meta", requires_grad=True)
    xyz = zmat.to_xyz(c, rows, method=method)
    xyz.sum().backward()
    assert xyz.shape == (2, 5, 3) and xyz.device.type == "meta" and c.grad.shape == (2, 5, 3)
    assert zmat.to_internal(xyz.detach(), rows).device.type == "meta"
