"""Writing all-atom structures back: PDB and mmCIF with every atom, names, elements and
bonds (mmCIF with bond orders), read back by biotite, RDKit and zmat itself."""

import os

import numpy as np
import pytest
import torch

import zmat
from zmat._align import superpose
from zmat.protein import from_pdb

pytest.importorskip("biotite")
from biotite.structure.io import pdb, pdbx  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
pytestmark = pytest.mark.filterwarnings("ignore:The coordinates are missing")


@pytest.fixture(scope="module")
def complex_():
    return from_pdb(os.path.join(DATA, "5ugo.cif"), ligands=True, hydrogens=True)


def _bond_set(arr, orders=True):
    rows = arr.bonds.as_array()
    return {(*sorted(r[:2]), r[2] if orders else 0) for r in rows.tolist()}


def test_mmcif_round_trip_keeps_atoms_and_bond_orders(complex_, tmp_path):
    p = complex_
    path = str(tmp_path / "out.cif")
    new = p.xyz + 0.25  # coordinates given are the ones written
    p.to_pdb(path, xyz=new)
    back = pdbx.get_structure(pdbx.CIFFile.read(path), model=1, include_bonds=True)
    arr = p.to_structure()
    for name in ("chain_id", "res_id", "res_name", "atom_name", "element", "hetero"):
        assert (getattr(back, name) == getattr(arr, name)).all(), name
    np.testing.assert_allclose(back.coord, new.numpy(), atol=1e-3)
    assert _bond_set(back) == _bond_set(arr) and len(_bond_set(arr)) == len(p.bonds)
    # zmat reads it again: the same atoms, none added, and the same exact tree rebuild
    q = from_pdb(path, ligands=True, hydrogens=True)
    assert q.n_atoms == p.n_atoms and not q.added.any()
    x = zmat.to_xyz(q.internal, q.table)
    assert float((superpose(x, q.xyz) - q.xyz).abs().max()) < 1e-8


def test_pdb_opens_in_biotite_and_rdkit(complex_, tmp_path):
    Chem = pytest.importorskip("rdkit.Chem")
    p = complex_
    path = str(tmp_path / "out.pdb")
    p.to_pdb(path)
    back = pdb.PDBFile.read(path).get_structure(model=1, include_bonds=True)
    assert back.array_length() == p.n_atoms
    assert (back.atom_name == p.atom_names).all() and (back.element == p.elements).all()
    mol = Chem.MolFromPDBFile(path, removeHs=False, sanitize=False)
    assert mol is not None and mol.GetNumAtoms() == p.n_atoms
    # the ligand's bonds are in the file (CONECT): RDKit sees them
    lig = np.flatnonzero((p.family == "ligand")[p.parsed.residue] & (p.elements != "Ca"))
    deg = np.array([mol.GetAtomWithIdx(int(i)).GetDegree() for i in lig])
    assert (deg > 0).all()


def test_written_coordinates_follow_a_rebuild(complex_, tmp_path):
    p = complex_
    x = zmat.to_xyz(p.internal, p.table)
    path = str(tmp_path / "rebuilt.cif")
    p.to_pdb(path, xyz=x.requires_grad_(True))  # a tensor with grad is fine
    back = pdbx.get_structure(pdbx.CIFFile.read(path), model=1)
    torch.testing.assert_close(torch.from_numpy(back.coord.astype(np.float64)), x.detach(), atol=1e-3, rtol=0)
