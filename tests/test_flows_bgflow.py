"""zmat.flows against bgflow's internal-coordinate transforms (stored outputs, float64).

tests/data/bgflow_reference.npz holds bgflow's ``GlobalInternalCoordinateTransformation``
(and, for alanine dipeptide, ``RelativeInternalCoordinateTransformation``)
run on three molecules by tests/data/make_bgflow_reference.py (how bgflow was
run is in its docstring). The conventions, mapped explicitly:

* bgflow's z-matrix row ``[i, b, a, d]`` is zmat's table row ``i: (b, a, d)``;
  its first three atoms ``fix[0..2]`` are the tree's root, second and third.
* Its outputs are ordered by its own ``bond_indices``/``angle_indices``/
  ``torsion_indices`` (column 0: the atom placed); zmat's ``q`` is one row per
  atom. Bonds of the first atoms: ``d01`` is the second atom's ``r``, ``d12``
  the third's; ``a012`` the third atom's ``theta``.
* Its torsion ``torsion(x_i, x_b, x_a, x_d)`` is the IUPAC dihedral, zmat's
  ``phi``; raw values in ``[-pi, pi]``, normalised ``(phi + pi) / (2 pi)`` in
  both libraries; normalised angles ``theta / pi`` in both.
* Its forward (Cartesian -> internal) ``dlogp`` is ``log|det d ic / d x|``:
  ``-T.log_abs_det_jacobian(q, xyz)`` (CONTRACT), normalisation constants
  included; its inverse's ``dlogp`` is ``+T.log_abs_det_jacobian``.
* Its orientation chart (x-y-z Euler angles of its own tripod) differs from
  zmat's ZYZ chart: not compared; the root position ``x0`` is.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

import zmat

flows = pytest.importorskip("zmat.flows")
DATA = Path(__file__).resolve().parent / "data"
MOLECULES = ("ala2", "trpcage", "ligand")


@pytest.fixture(scope="module")
def ref():
    with np.load(DATA / "bgflow_reference.npz") as f:
        return {k: f[k] for k in f.files}


def circ(a, b, period):
    """Largest circular difference (values of period ``period``)."""
    d = (np.asarray(a) - np.asarray(b)) % period
    return float(np.minimum(d, period - d).max())


def test_table_is_bgflow_z_matrix(ref):
    """The stored z-matrix is the table, and bgflow's output order maps onto its rows."""
    for m in MOLECULES:
        table, zm = ref[f"{m}/table"], ref[f"{m}/z_matrix"]
        assert (zm[:, 0] == np.arange(len(table))).all() and (zm[:, 1:] == table).all()
        for key, cols in (("bond_atoms", 1), ("angle_atoms", 2), ("torsion_atoms", 3)):
            idx = ref[f"{m}/{key}"]
            assert (idx[:, 1 : 1 + cols] == table[idx[:, 0], :cols]).all(), (m, key)
        assert len(np.unique(ref[f"{m}/bond_atoms"][:, 0])) == len(table) - 1


@pytest.mark.parametrize("norm", ["raw", "norm"])
@pytest.mark.parametrize("m", MOLECULES)
def test_global_transform(ref, m, norm):
    """Bonds, angles, torsions, root position and log-det of zmat's transform equal bgflow's."""
    xyz = torch.as_tensor(ref[f"{m}/xyz"])
    T = flows.InternalCoordinateTransform(ref[f"{m}/table"], normalize_angles=norm == "norm")
    q = T.inv(xyz)
    q3 = q.unflatten(-1, (-1, 3)).numpy()
    out = {k: ref[f"{m}/{norm}/{k}"] for k in ("bonds", "angles", "torsions", "x0", "dlogp", "dlogp_inv")}
    b_at, a_at, t_at = (ref[f"{m}/{k}"][:, 0] for k in ("bond_atoms", "angle_atoms", "torsion_atoms"))
    period = 1.0 if norm == "norm" else 2 * np.pi
    err = {
        "bond": np.abs(q3[:, b_at, 0] - out["bonds"]).max(),
        "angle": np.abs(q3[:, a_at, 1] - out["angles"]).max(),
        "torsion": circ(q3[:, t_at, 2], out["torsions"], period),
        "x0": np.abs(q3[:, ref[f"{m}/table"][:, 0] < 0] - out["x0"]).max(),
    }
    ladj = T.log_abs_det_jacobian(q, xyz).numpy()
    err["dlogp"] = np.abs(out["dlogp"][:, 0] + ladj).max()
    err["dlogp_inv"] = np.abs(out["dlogp_inv"][:, 0] - ladj).max()
    # the closed form without normalisation: the CONTRACT's identity
    ld = zmat.log_det_jacobian(zmat.to_internal(xyz, T.table), T.table).numpy()
    err["contract"] = np.abs(out["dlogp"][:, 0] + ld).max() if norm == "raw" else 0.0
    # zmat's forward from bgflow's bonds, angles and torsions (the orientation, in another chart
    # in bgflow, and the root position from zmat's own q)
    qb = q.clone().unflatten(-1, (-1, 3))
    for col, (key, atoms) in enumerate(zip(("bonds", "angles", "torsions"), (b_at, a_at, t_at), strict=True)):
        qb[:, atoms, col] = torch.as_tensor(out[key])
    err["from_bgflow_xyz"] = float((T(qb.flatten(-2)) - xyz).abs().max())
    print(f"{m} {norm}: " + ", ".join(f"{k} {v:.1e}" for k, v in err.items()))
    print(f"  |dlogp| up to {np.abs(out['dlogp']).max():.1f}; bgflow round trip {out_rt(ref, m, norm):.1e} A")
    assert max(err.values()) < 1e-9, err
    assert (T(q) - xyz).abs().max() < 1e-10


def out_rt(ref, m, norm):
    return float(ref[f"{m}/{norm}/roundtrip"].max())


@pytest.mark.parametrize("norm", ["raw", "norm"])
def test_relative_transform(ref, norm):
    """bgflow's relative transform (fixed atoms Cartesian) == zmat's ``fixed_atoms``."""
    m = "ala2"
    xyz = torch.as_tensor(ref[f"{m}/xyz"])
    fixed, rel = ref[f"{m}/fixed"], ref[f"{m}/rel_z_matrix"]
    table = ref[f"{m}/table"]
    T = flows.InternalCoordinateTransform(table, fixed_atoms=fixed, normalize_angles=norm == "norm")
    q = T.inv(xyz)
    q3 = q.unflatten(-1, (-1, 3)).numpy()
    out = {k: ref[f"{m}/rel/{norm}/{k}"] for k in ("bonds", "angles", "torsions", "x_fixed", "dlogp")}
    at = rel[:, 0]  # bgflow's rows are the z-matrix rows, in order
    period = 1.0 if norm == "norm" else 2 * np.pi
    err = {
        "bond": np.abs(q3[:, at, 0] - out["bonds"]).max(),
        "angle": np.abs(q3[:, at, 1] - out["angles"]).max(),
        "torsion": circ(q3[:, at, 2], out["torsions"], period),
        "fixed": np.abs(q3[:, fixed].reshape(len(q3), -1) - out["x_fixed"]).max(),
        "dlogp": np.abs(out["dlogp"][:, 0] + T.log_abs_det_jacobian(q, xyz).numpy()).max(),
    }
    # and the other way: zmat's forward from bgflow's numbers (no orientation chart in between)
    qb = torch.zeros_like(q).unflatten(-1, (-1, 3))
    qb[:, fixed] = torch.as_tensor(out["x_fixed"]).unflatten(-1, (-1, 3))
    for col, key in enumerate(("bonds", "angles", "torsions")):
        qb[:, at, col] = torch.as_tensor(out[key])
    xyz_b, ladj_b = T.call_and_ladj(qb.flatten(-2))
    err["from_bgflow_xyz"] = float((xyz_b - xyz).abs().max())
    err["from_bgflow_dlogp"] = float((ladj_b + torch.as_tensor(out["dlogp"][:, 0])).abs().max())
    print(f"{m} relative {norm}: " + ", ".join(f"{k} {v:.1e}" for k, v in err.items()))
    assert max(err.values()) < 1e-9, err
    assert (T(q) - xyz).abs().max() < 1e-10
