"""chemcoord import: Zmat frames and the raw (sentinel, degree, opposite-sign) arrays."""

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import zmat
from zmat import ZMatrix, rmsd
from zmat.chemcoord import ABSOLUTE_REFERENCES, from_chemcoord, from_chemcoord_arrays

cc = pytest.importorskip("chemcoord")
transformation = pytest.importorskip("chemcoord._zmat_internal_coordinates._zmat_transformation")

DATA = Path(__file__).parent / "data"
ORIGIN, E_X, E_Y, E_Z = (ABSOLUTE_REFERENCES[k] for k in ("origin", "e_x", "e_y", "e_z"))


MOLECULES = ["cyclohexane_chair", "ruthenium", "nasty_cube", "cis_platin", "water"]


@pytest.fixture(scope="module", params=MOLECULES)
def chemcoord_zmat(request):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zm = cc.Cartesian.read_xyz(DATA / f"{request.param}.xyz").get_zmat()
        xyz = zm.get_cartesian()._frame[["x", "y", "z"]].to_numpy(np.float64, copy=True)
    return zm, torch.as_tensor(xyz)


def test_sentinels_match_chemcoord():
    assert ABSOLUTE_REFERENCES == dict(cc.constants.int_label)
    assert E_X == -9223372036854775807  # the seed user's sentinel


def test_zmat_frame_reproduces_get_cartesian(chemcoord_zmat):
    zm, ref = chemcoord_zmat
    C, table = from_chemcoord(zm)
    assert C.shape == (len(zm), 3) and table.n_atoms == len(zm)
    assert rmsd(zmat.to_xyz(C, table), ref) < 1e-8
    # rows without absolute references keep chemcoord's values, dihedral negated
    frame = zm._frame
    plain = np.array([all(not isinstance(r, str) for r in row) for row in frame[["b", "a", "d"]].values])
    vals = torch.as_tensor(frame[["bond", "angle", "dihedral"]].to_numpy(np.float64, copy=True))
    torch.testing.assert_close(C[plain, 0], vals[plain, 0], rtol=0, atol=0)
    torch.testing.assert_close(C[plain, 2], -torch.deg2rad(vals[plain, 2]), rtol=0, atol=0)


def test_absolute_placement_is_exact(chemcoord_zmat):
    zm, ref = chemcoord_zmat
    C, table = from_chemcoord(zm, absolute=True)
    n = len(zm)
    assert table.n_atoms == n + 4
    xyz = zmat.to_xyz(C, table)
    torch.testing.assert_close(xyz[:n], ref, rtol=0, atol=1e-8)  # no superposition
    eye = torch.cat([torch.zeros(1, 3), torch.eye(3)]).double()
    torch.testing.assert_close(xyz[n:], eye, rtol=0, atol=1e-15)


def test_seed_user_raw_arrays(chemcoord_zmat):
    """(3, N) sentinel table + (3, N) degree values, as chemcoord's jitted code takes them."""
    zm, ref = chemcoord_zmat
    c_table = zm._extract_c_table()  # (3, N), sentinels, row positions
    assert (c_table < -(2**62)).any()
    values = zm._frame[["bond", "angle", "dihedral"]].to_numpy(np.float64).T
    C, table = from_chemcoord_arrays(c_table, values)
    assert rmsd(zmat.to_xyz(C, table), ref) < 1e-8
    C2, table2 = from_chemcoord_arrays(c_table.T, values.T)  # (N, 3) layout too
    assert torch.equal(C, C2) and table == table2
    radians = values.copy()
    radians[1:] = np.radians(radians[1:])  # what chemcoord's get_X(C, c_table) takes
    C3, table3 = from_chemcoord_arrays(c_table, radians, degrees=False)
    assert table3 == table
    torch.testing.assert_close(C3, C, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"above pi with degrees=False: the values look like degrees"):
        from_chemcoord_arrays(c_table, values, degrees=False)  # degrees where radians were promised


def test_zmatrix_from_chemcoord(chemcoord_zmat):
    zm, ref = chemcoord_zmat
    z = ZMatrix.from_chemcoord(zm)
    assert z.symbols == list(zm._frame["atom"])
    assert rmsd(z.to_xyz(), ref) < 1e-8


def random_chemcoord_table(n, seed):
    """A chemcoord-style table with absolute references in the first rows and elsewhere."""
    rng = np.random.default_rng(seed)
    rows = [[ORIGIN, E_Z, E_X], [0, E_Z, E_X], [1, 0, E_X]]
    for i in range(3, n):
        b, a, d = (int(v) for v in rng.choice(i, 3, replace=False))
        kind = i % 4
        if kind == 1:
            d = E_Y
        elif kind == 2:
            a, d = E_X, E_Z
        rows.append([b, a, d])
    values = np.column_stack(
        [rng.uniform(1.0, 2.0, n), rng.uniform(30.0, 150.0, n), rng.uniform(-180.0, 180.0, n)]
    )
    return np.array(rows, np.int64), values


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_tables_against_chemcoord_get_X(seed):
    refs, values = random_chemcoord_table(12, seed)
    values[5, 1] = 179.9999  # within numpy.isclose of 180: chemcoord ignores the dihedral
    C = values.T.copy()
    C[1:] = np.radians(C[1:])
    err, _, X = transformation.get_X(C, refs.T.copy())
    assert err == 0
    ref = torch.as_tensor(X.T)
    Ca, ta = from_chemcoord_arrays(refs, values, absolute=True)
    torch.testing.assert_close(zmat.to_xyz(Ca, ta)[:12], ref, rtol=0, atol=1e-10)
    Cr, tr = from_chemcoord_arrays(refs, values)
    assert rmsd(zmat.to_xyz(Cr, tr), ref) < 1e-10
    assert (tr.refs >= -1).all() and tr.n_atoms == 12


def test_tensor_values_are_differentiable():
    refs, values = random_chemcoord_table(8, 3)
    vals = torch.tensor(values, requires_grad=True)
    C, table = from_chemcoord_arrays(refs, vals)
    zmat.to_xyz(C, table).pow(2).sum().backward()
    assert torch.isfinite(vals.grad).all() and vals.grad.abs().sum() > 0
    # the values of rows without absolute references pass straight through
    assert vals.grad[7].abs().sum() > 0
    vals32 = torch.tensor(values, dtype=torch.float32)
    assert from_chemcoord_arrays(refs, vals32)[0].dtype == torch.float32


def test_errors():
    refs, values = random_chemcoord_table(5, 0)
    bad = refs.copy()
    bad[4, 0] = 4
    with pytest.raises(ValueError, match="row 4"):
        from_chemcoord_arrays(bad, values)
    bad[4, 0] = ORIGIN + 50
    with pytest.raises(ValueError, match="sentinel"):
        from_chemcoord_arrays(bad, values)
    with pytest.raises(ValueError, match="shape"):
        from_chemcoord_arrays(refs, values[:4])
    square = np.array([[ORIGIN, E_Z, E_X], [ORIGIN, E_Z, E_X], [ORIGIN, E_Z, E_X]])
    with pytest.raises(ValueError, match="transposed"):
        from_chemcoord_arrays(square, np.ones((3, 3)))
    with pytest.raises(ValueError, match="missing columns"):
        from_chemcoord(object())
    # zmat's own validation points chemcoord users here
    with pytest.raises(ValueError, match="zmat.chemcoord"):
        zmat.to_xyz(torch.zeros(2, 3), [[E_X, E_X, E_X], [0, E_X, E_X]])


def test_three_atom_layout_is_inferred():
    refs = np.array([[ORIGIN, E_Z, E_X], [0, E_Z, E_X], [1, 0, E_X]])
    values = np.array([[0.0, 0.0, 0.0], [1.0, 90.0, 0.0], [1.2, 104.5, 0.0]])
    C, table = from_chemcoord_arrays(refs, values)
    C2, table2 = from_chemcoord_arrays(refs.T, values.T)
    assert torch.equal(C, C2) and table == table2
    assert table.refs.tolist() == [[-1, -1, -1], [0, -1, -1], [1, 0, -1]]
    assert C[2, 1].item() == pytest.approx(math.radians(104.5))
