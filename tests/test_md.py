"""zmat.md: construction tables from MD topologies, checked against MDAnalysis' BAT analysis.

The trajectory is tests/data/alanine_dipeptide.{pdb,dcd} (OpenMM, see SOURCES.md).
BAT chooses its own tree; the comparison maps it explicitly: BAT's root gives
rows 2 and 3 of a zmat table, each of its torsions ``(a0, a1, a2, a3)`` the
row ``a0: (a1, a2, a3)``, and its *improper* torsions (all but the first with
the same central bond) are differences to that primary torsion, undone here.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

import zmat

mda = pytest.importorskip("MDAnalysis")
md = pytest.importorskip("zmat.md")
from MDAnalysis.analysis.bat import BAT  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
PDB, DCD = DATA / "alanine_dipeptide.pdb", DATA / "alanine_dipeptide.dcd"


@pytest.fixture(scope="module")
def universe():
    return mda.Universe(str(PDB), str(DCD))


def bat_table(bat: BAT, n: int) -> np.ndarray:
    """BAT's tree as a zmat construction table (atom indices of ``bat``'s AtomGroup = Universe here)."""
    refs = np.full((n, 3), -1, np.int64)
    r0, r1, r2 = (int(a.index) for a in bat._root)
    refs[r1] = (r0, -1, -1)
    refs[r2] = (r1, r0, -1)
    for t in bat._torsions:
        a0, a1, a2, a3 = (int(a.index) for a in t)
        refs[a0] = (a1, a2, a3)
    return refs


def bat_internal(bat: BAT) -> dict:
    """BAT's output per atom: bond, angle, and the *raw* torsion (impropers undone)."""
    v = bat.results.bat
    m = len(bat._torsions)
    bonds, angles, tors = v[:, 9 : 9 + m], v[:, 9 + m : 9 + 2 * m], v[:, 9 + 2 * m :].copy()
    primary = np.asarray(bat._primary_torsion_indices)
    improper = primary != np.arange(m)
    tors[:, improper] = tors[:, improper] + tors[:, primary[improper]]
    tors = (tors + np.pi) % (2 * np.pi) - np.pi
    r0, r1, r2 = (int(a.index) for a in bat._root)
    out = {"atoms": [int(t[0].index) for t in bat._torsions], "bonds": bonds, "angles": angles}
    out.update(torsions=tors, r01=v[:, 6], r12=v[:, 7], a012=v[:, 8], root=(r0, r1, r2))
    return out


def wrapped_diff(a, b):
    return np.abs((a - b + np.pi) % (2 * np.pi) - np.pi)


def test_bat_agrees_on_its_own_tree(universe):
    """zmat.to_internal on BAT's tree reproduces every BAT bond, angle and torsion of the trajectory."""
    ag = universe.atoms
    bat = BAT(ag).run()
    ref = bat_internal(bat)
    C = zmat.to_internal(md.positions(ag), bat_table(bat, len(ag))).numpy()
    assert C.shape == (len(universe.trajectory), 22, 3) == (1000, 22, 3)
    at = ref["atoms"]
    err_b = np.abs(C[:, at, 0] - ref["bonds"]).max()
    err_a = np.abs(C[:, at, 1] - ref["angles"]).max()
    err_t = wrapped_diff(C[:, at, 2], ref["torsions"]).max()
    r0, r1, r2 = ref["root"]
    err_root = max(
        np.abs(C[:, r1, 0] - ref["r01"]).max(),
        np.abs(C[:, r2, 0] - ref["r12"]).max(),
        np.abs(C[:, r2, 1] - ref["a012"]).max(),
    )
    print(f"zmat vs BAT on BAT's tree: bonds {err_b:.1e} A, angles {err_a:.1e}, torsions {err_t:.1e} rad")
    print(f"root bonds and angle {err_root:.1e}")
    # DCD stores float32 positions and both read the same numbers: BAT's bonds,
    # angles and torsions are float64 arithmetic on them, as ours ...
    assert err_b < 1e-12 and err_a < 1e-12 and err_t < 1e-12
    # ... but its root terms (r01, r12, a012) are computed in float32 (np.einsum on float32 positions)
    assert err_root < 2e-6


def test_table_from_bonds(universe):
    """Rows: b is bonded to i, hydrogens sit on heavy atoms, proper rows where the tree allows;
    the root is BAT's, and the rows BAT chose alike give BAT's values."""
    ag = universe.atoms
    table = md.construction_table(ag)
    refs = table.refs
    nbrs = md.bonds(ag)
    heavy = np.asarray([e != "H" for e in ag.elements])
    roots = np.nonzero(refs[:, 0] < 0)[0]
    assert len(roots) == 1
    for i, b in enumerate(refs[:, 0].tolist()):
        if b >= 0:
            assert b in nbrs[i], f"atom {i}: bond reference {b} is not bonded"
            assert heavy[b] or len(ag) < 4, f"hydrogen {i} placed on hydrogen {b}"
    proper = sum(d >= 0 and a in nbrs[b] and d in nbrs[a] for b, a, d in refs.tolist())
    assert proper >= len(ag) - 4  # all but the few rows next to the root
    bat = BAT(ag).run()
    want = bat_table(bat, len(ag))
    r0, r1, r2 = (int(a.index) for a in bat._root)
    assert refs[r0].tolist() == [-1, -1, -1] and refs[r1, 0] == r0 and refs[r2, :2].tolist() == [r1, r0]
    same = np.nonzero((refs == want).all(1) & (want[:, 2] >= 0))[0]
    ref = bat_internal(bat)
    at = np.asarray(ref["atoms"])
    C = zmat.to_internal(md.positions(ag), table).numpy()
    k = np.searchsorted(at, same, sorter=np.argsort(at))
    cols = np.argsort(at)[k]
    # BAT takes the *lightest* built neighbours as angle and dihedral references
    # (often a hydrogen), zmat.md the tree parents (proper rows): few rows coincide
    print(f"{len(same)} of {len(at)} BAT rows equal to zmat.md's")
    assert len(same) >= 4
    assert np.abs(C[:, same, 0] - ref["bonds"][:, cols]).max() < 1e-9
    assert np.abs(C[:, same, 1] - ref["angles"][:, cols]).max() < 1e-9
    assert wrapped_diff(C[:, same, 2], ref["torsions"][:, cols]).max() < 1e-9


def test_forest_of_molecules(universe):
    """Two molecules in one group: one tree each, each equal to the table of the molecule alone."""
    two = mda.Merge(universe.atoms, universe.atoms)
    two.atoms[22:].positions += 20.0
    table = md.construction_table(two.atoms)
    one = md.construction_table(universe.atoms).refs
    assert (table.refs[:22] == one).all()
    assert (table.refs[22:] == np.where(one >= 0, one + 22, -1)).all()
    xyz = md.positions(two.atoms)
    assert xyz.shape == (1, 44, 3) and xyz.dtype == torch.float64
    back = zmat.to_xyz(zmat.to_internal(xyz, table), table)
    # each tree is rebuilt in its own frame: compare shapes after superposition, per molecule
    for sl in (slice(0, 22), slice(22, 44)):
        assert zmat.rmsd(back[:, sl], xyz[:, sl]).max() < 1e-9


def test_file_names_and_slices():
    ag = md.atom_group((PDB, DCD))
    assert md.positions(ag, 10, 20, 5).shape == (2, 22, 3)
    assert md.positions(ag, dtype=torch.float32).dtype == torch.float32


def test_no_bonds_is_a_clear_error(tmp_path):
    u = mda.Universe(str(PDB))
    plain = tmp_path / "nobonds.pdb"
    u.atoms.write(str(plain), bonds=None)
    with pytest.raises(ValueError, match="no bonds"):
        md.construction_table(mda.Universe(str(plain)).atoms)
    with pytest.raises(TypeError, match="AtomGroup"):
        md.construction_table(np.zeros((3, 3)))


def test_periodic_molecule_is_made_whole(universe):
    """A molecule split across a periodic boundary is read whole (same internal coordinates)."""
    u = mda.Universe(str(PDB), in_memory=True)  # edits persist when the frame is read again
    u.dimensions = [10.0, 10.0, 10.0, 90, 90, 90]
    u.atoms.positions -= u.atoms.center_of_geometry()  # the molecule straddles the box corner
    want = u.atoms.positions.astype(np.float64)
    u.atoms.positions = u.atoms.positions % 10.0  # wrap every atom into the box: bonds broken
    table = md.construction_table(u.atoms)
    got = zmat.to_internal(md.positions(u.atoms), table)
    ref = zmat.to_internal(torch.as_tensor(want)[None], table)
    assert (got[..., 0] - ref[..., 0]).abs().max() < 1e-4  # float32 positions
    broken = zmat.to_internal(md.positions(u.atoms, unwrap=False), table)
    assert (broken[..., 0] - ref[..., 0]).abs().max() > 1.0
    plain = mda.Universe(str(DATA / "water.xyz"))  # no bonds
    plain.dimensions = [10.0, 10.0, 10.0, 90, 90, 90]
    with pytest.raises(ValueError, match="unwrap=True needs bonds"):
        md.positions(plain.atoms)
    assert md.positions(plain.atoms, unwrap=False).shape == (1, 6, 3)


def test_flow_coordinates(universe):
    pytest.importorskip("zmat.flows")
    T, q = md.flow_coordinates(universe.atoms, stop=8)
    assert q.shape == (8, 66)
    xyz = md.positions(universe.atoms, stop=8)
    assert (T(q) - xyz).abs().max() < 1e-9


def test_solvated_forest_and_flow(universe):
    """Peptide + water dimer (tests/data/water.xyz, bonds guessed): three trees, hydrogens on
    oxygens, and a transform that round-trips the whole system."""
    w = mda.Universe(str(DATA / "water.xyz"))
    w.atoms.guess_bonds()
    u = mda.Merge(universe.atoms, w.atoms)
    u.atoms[22:].positions += 30.0
    table = md.construction_table(u.atoms)
    refs = table.refs
    # one root per molecule: the peptide's O, each water's last H (BAT's heaviest terminal atom,
    # ties to the highest index), then its O, then the other H on that O
    assert np.nonzero(refs[:, 0] < 0)[0].tolist() == [11, 24, 27]
    assert refs[22:28].tolist() == [
        [24, -1, -1],
        [22, 24, -1],
        [-1, -1, -1],
        [27, -1, -1],
        [25, 27, -1],
        [-1, -1, -1],
    ]
    pytest.importorskip("zmat.flows")
    T, q = md.flow_coordinates(u.atoms)
    assert q.shape == (1, 3 * 28)
    assert (T(q) - md.positions(u.atoms)).abs().max() < 1e-9
