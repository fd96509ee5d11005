"""Automatic construction tables: robustness, conditioning, determinism, ASE formats."""

import math
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import molecule

import zmat
from zmat import ZMatrix, rmsd
from zmat.autotable import connectivity, construction_table
from zmat.table import BOND, PLANAR, PROPER, ROOT

DATA = Path(__file__).parent / "data"
MIN_ANGLE = 10.0


def t64(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def angle(p, q, r):
    u, v = p - q, r - q
    return math.degrees(math.atan2(np.linalg.norm(np.cross(u, v)), float(u @ v)))


def reference_angles(xyz, refs):
    """(angle i-b-a, angle d-a-b) in degrees for every full row."""
    out = []
    for i, (b, a, d) in enumerate(refs):
        if d >= 0:
            out.append((angle(xyz[i], xyz[b], xyz[a]), angle(xyz[d], xyz[a], xyz[b])))
    return np.array(out)


def well_conditioned(angles):
    return bool(((angles >= MIN_ANGLE) & (angles <= 180 - MIN_ANGLE)).all())


def octahedron():
    """SF6 with ligands listed trans pair by trans pair (the worst order)."""
    p = 1.56 * np.array([[0, 0, 0], [1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]])
    return Atoms("SF6", positions=p)


def n_fragments(bonded):
    seen, count = set(), 0
    for s in range(len(bonded)):
        if s in seen:
            continue
        count += 1
        stack = [s]
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                stack.extend(int(j) for j in bonded[i])
    return count


def check_roundtrip(atoms, tol=1e-8):
    zm = ZMatrix.from_atoms(atoms)
    assert torch.isfinite(zm.internal).all()
    assert rmsd(zm.to_xyz(), t64(atoms.positions)) < tol
    return zm


def jacobian_max(atoms, table):
    xyz = t64(atoms.positions).requires_grad_(True)
    jac = torch.autograd.functional.jacobian(lambda x: zmat.to_internal(x, table), xyz)
    assert torch.isfinite(jac).all()
    return jac.abs().max().item()


@pytest.mark.parametrize("name", ["CO2", "HCN", "C2H2"])
def test_linear_molecules_are_finite_and_exact(name):
    atoms = molecule(name)
    zm = check_roundtrip(atoms, tol=1e-12)
    refs = zm.table.refs
    has_angle = refs[:, 1] >= 0
    # every angle of a linear molecule is a straight one, every dihedral 0
    torch.testing.assert_close(
        zm.internal[has_angle, 1], torch.full((int(has_angle.sum()),), math.pi, dtype=torch.float64)
    )
    assert (zm.internal[:, 2] == 0).all()
    assert jacobian_max(atoms, zm.table) < 10


def test_linear_molecule_gradients_are_finite():
    zm = ZMatrix.from_atoms(molecule("C2H2"))
    C = zm.internal.clone().requires_grad_(True)
    zm.to_xyz(C).pow(2).sum().backward()
    assert torch.isfinite(C.grad).all()


@pytest.mark.parametrize("source", ["octahedron", "ruthenium", "cis_platin", "nasty_cube", "MIL53_middle"])
def test_hard_cases_are_well_conditioned(source):
    atoms = octahedron() if source == "octahedron" else ase.io.read(DATA / f"{source}.xyz")
    zm = check_roundtrip(atoms)
    angles = reference_angles(atoms.positions, zm.table.refs)
    assert well_conditioned(angles), angles.min(0)
    # internal coordinates move at most ~1/(r sin 10 deg) per Angstrom of atom motion
    assert jacobian_max(atoms, zm.table) < 8


def test_octahedral_collinear_start_is_avoided():
    refs = construction_table(octahedron()).refs
    # the trans partner of the second atom is not built third
    third = [i for i in range(7) if refs[i, 1] >= 0 and refs[i, 2] < 0]
    assert third != [2]


@pytest.mark.parametrize("name", ["cyclohexane_chair", "temp_lig", "MIL53_small", "Cd_lattice", "water"])
def test_table_structure_and_rules(name):
    atoms = ase.io.read(DATA / f"{name}.xyz")
    xyz = atoms.positions
    table = construction_table(atoms)
    refs, n = table.refs, len(atoms)
    kinds = np.bincount(table.kind, minlength=6)
    assert kinds[ROOT] == 1 and kinds[BOND] == 1 and kinds[PLANAR] == 1
    assert (refs[:, 2] >= 0).sum() == n - 3  # one tree: every other row is full
    assert refs[0].tolist() == [-1, -1, -1]  # atom 0 starts
    # bond references follow bonds, except where a fragment is attached
    bonded = connectivity(atoms)
    n_attached = sum(1 for i in range(n) if refs[i, 0] >= 0 and refs[i, 0] not in bonded[i])
    assert n_attached == n_fragments(bonded) - 1
    # the proper row is taken wherever it is well-conditioned
    order = table.construction_order
    for i in order:
        b = refs[i, 0]
        if refs[i, 2] < 0 or refs[b, 1] < 0:
            continue
        a, d = refs[b, 0], refs[b, 1]
        if well_conditioned(np.array([angle(xyz[i], xyz[b], xyz[a]), angle(xyz[d], xyz[a], xyz[b])])):
            assert table.kind[i] == PROPER, i
    assert well_conditioned(reference_angles(xyz, refs))


def test_water_dimer_fragment_attaches_to_nearest_atom():
    atoms = ase.io.read(DATA / "water.xyz")
    refs = construction_table(atoms).refs
    first = 3  # the second molecule's oxygen, reached by distance
    d = np.linalg.norm(atoms.positions[:3] - atoms.positions[first], axis=1)
    assert refs[first, 0] == int(np.argmin(d))
    assert all(refs[i, 0] == first for i in (4, 5))


def test_deterministic_and_options():
    atoms = ase.io.read(DATA / "nasty_cube.xyz")
    a = construction_table(atoms).refs
    b = construction_table(atoms.copy()).refs
    np.testing.assert_array_equal(a, b)
    # positions + symbols, start, explicit bonds
    c = construction_table(atoms.positions, symbols=atoms.get_chemical_symbols()).refs
    np.testing.assert_array_equal(a, c)
    s = construction_table(atoms, start=62).refs
    assert s[62].tolist() == [-1, -1, -1]
    chain = [[1], [0, 2], [1, 3], [2]]
    pos = np.array([[0, 0, 0], [1.5, 0, 0], [2, 1.4, 0], [3.5, 1.4, 0.3]])
    refs = construction_table(pos, bonds=chain).refs
    assert refs.tolist() == [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]]
    np.testing.assert_array_equal(refs, construction_table(pos, bonds=[(0, 1), (1, 2), (3, 2)]).refs)


def test_errors():
    with pytest.raises(ValueError, match="start"):
        construction_table(molecule("H2O"), start=3)
    with pytest.raises(ValueError, match="symbols"):
        construction_table(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="bad bond"):
        construction_table(np.eye(3), bonds=[[1], [0, 5], []])
    with pytest.raises(ValueError, match="shape"):
        construction_table(np.zeros((2, 2)), symbols=["H", "H"])


def test_single_atoms_and_ions():
    zm = check_roundtrip(Atoms("Na"))
    assert zm.table.refs.tolist() == [[-1, -1, -1]]
    ions = Atoms("NaCl", positions=[[0, 0, 0], [5.0, 0, 0]])  # not bonded: still one tree
    assert check_roundtrip(ions).table.refs.tolist() == [[-1, -1, -1], [0, -1, -1]]


def test_any_ase_format(tmp_path):
    protein = ase.io.read(DATA / "1aki.pdb")  # PDB
    zm = ZMatrix.from_atoms(protein)
    assert rmsd(zm.to_xyz(), t64(protein.positions)) < 1e-8
    assert zm.to_atoms().get_chemical_symbols() == protein.get_chemical_symbols()
    mol = ase.io.read(DATA / "temp_lig.xyz")
    mol.cell, mol.pbc = [20.0, 20.0, 20.0], True
    mol.center()  # periodic images are ignored: keep the molecule whole inside the cell
    for fmt, name in [("cif", "m.cif"), ("extxyz", "m.extxyz"), ("proteindatabank", "m.pdb")]:
        ase.io.write(tmp_path / name, mol, format=fmt)
        back = ase.io.read(tmp_path / name)
        zm = ZMatrix.from_atoms(back)
        assert rmsd(zm.to_xyz(), t64(back.positions)) < 1e-8, fmt
        assert zm.symbols == mol.get_chemical_symbols()
        assert rmsd(zm.to_xyz(), t64(mol.positions)) < 2e-3, fmt  # file precision
