"""Ligands in zmat.protein (ligands=True): HETATM residues with CCD bonds and bond orders in
the same tree as the polymer; exact rebuild; bonds against biotite's own CCD perception;
rotatable ligand torsions move the ligand with RDKit's stereo perception unchanged (FK506 in
3o5r: 14 stereocentres, 2 E/Z bonds); one clash loss over protein and ligand."""

import os

import numpy as np
import pytest
import torch

import zmat
from zmat._align import superpose
from zmat.protein import from_pdb, from_structure

pytest.importorskip("biotite")
import biotite.structure as struc  # noqa: E402
from biotite.structure.io import pdbx  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
pytestmark = pytest.mark.filterwarnings("ignore:The coordinates are missing")
FILES = {"3o5r": ["FK5"], "5ugo": ["2PN", "CA"], "4p5j": ["IRI", "MG", "SPM"]}  # 4p5j's A23: a polymer A


def _atoms(name):
    return pdbx.get_structure(pdbx.CIFFile.read(os.path.join(DATA, f"{name}.cif")), model=1)


@pytest.mark.parametrize("name", sorted(FILES))
def test_ligands_kept_bonded_and_rebuilt_exactly(name):
    atoms = _atoms(name)
    atoms = atoms[(atoms.res_name != "HOH") & (atoms.element != "H")]
    p = from_structure(atoms, ligands=True)
    assert p.n_atoms == atoms.array_length()  # every non-water heavy atom
    assert sorted(set(p.res_names[p.family == "ligand"].tolist())) == FILES[name]
    arr = p.to_structure()
    np.testing.assert_array_equal(arr.coord, atoms.coord)
    assert (arr.hetero == atoms.hetero).all() and (arr.atom_name == atoms.atom_name).all()
    x = zmat.to_xyz(p.internal, p.table)
    assert float((superpose(x, p.xyz) - p.xyz).abs().max()) < 1e-8
    # intra-residue bonds and orders of the ligands and modified residues: biotite's own CCD perception
    ref = struc.connect_via_residue_names(atoms).as_array()
    lig = np.isin(np.arange(p.n_atoms), np.flatnonzero((p.res_names != p.res_types)[p.parsed.residue]))
    same_res = p.parsed.residue[ref[:, 0]] == p.parsed.residue[ref[:, 1]]
    want = {(min(i, j), max(i, j), o) for i, j, o in ref[same_res & lig[ref[:, 0]]].tolist()}
    b, o = p.parsed.bonds, p.bond_orders
    inside = (p.parsed.residue[b[:, 0]] == p.parsed.residue[b[:, 1]]) & lig[b[:, 0]]
    got = {
        (min(i, j), max(i, j), k) for (i, j), k in zip(b[inside].tolist(), o[inside].tolist(), strict=True)
    }
    assert got == want and len(got) > 0


def test_modified_nucleotide_links_into_the_strand():
    p = from_pdb(os.path.join(DATA, "4p5j.cif"), ligands=True)
    a23 = int(np.flatnonzero(p.res_names == "A23")[0])
    prev = a23 - 1
    names = p.atom_names
    res = p.parsed.residue
    o3 = int(np.flatnonzero((res == prev) & (names == "O3'"))[0])
    ph = int(np.flatnonzero((res == a23) & (names == "P"))[0])
    assert {o3, ph} in [set(x) for x in p.parsed.bonds.tolist()]


def _mol(p, xyz, res_name):
    """RDKit Mol of one ligand (biotite's interface, bonds with orders from the CCD)."""
    Chem = pytest.importorskip("rdkit.Chem")
    from biotite.interface import rdkit as brd

    arr = p.to_structure(xyz)
    mol = brd.to_mol(arr[arr.res_name == res_name])
    Chem.SanitizeMol(mol)
    Chem.AssignStereochemistryFrom3D(mol)
    return Chem.MolToSmiles(Chem.RemoveHs(mol))


def test_ligand_torsions_move_it_and_keep_its_stereo():
    p = from_pdb(os.path.join(DATA, "3o5r.cif"), ligands=True, hydrogens=True)
    T = len(p.ligand_torsions)
    assert T >= 5 and (p.res_names[p.ligand_residue] == "FK5").all()
    before = _mol(p, None, "FK5")
    assert before.count("@") >= 14 and before.count("/") + before.count("\\") >= 2
    g = torch.Generator().manual_seed(1)
    new = p.ligand_torsions + (torch.rand(T, generator=g, dtype=torch.float64) * 2 - 1) * 2.5
    x = zmat.to_xyz(p.internal_with_torsions({"ligand": new}), p.table)
    measured = zmat.transform.dihedrals(x, p.ligand_quads)
    torch.testing.assert_close(
        torch.remainder(measured - new + torch.pi, 2 * torch.pi) - torch.pi,
        torch.zeros(T, dtype=torch.float64),
        atol=1e-10,
        rtol=0,
    )
    lig = torch.from_numpy((p.family == "ligand")[p.parsed.residue])
    moved = (x - zmat.to_xyz(p.internal, p.table)).norm(dim=-1)  # same frame: the root is a protein atom
    assert moved[lig].max() > 2.0 and moved[~lig].max() < 1e-9  # the protein stays
    # every bond length is kept, so is every stereocentre and double bond
    b = p.bonds
    torch.testing.assert_close(
        (x[b[:, 0]] - x[b[:, 1]]).norm(dim=-1), (p.xyz[b[:, 0]] - p.xyz[b[:, 1]]).norm(dim=-1)
    )
    assert _mol(p, superpose(x, p.xyz), "FK5") == before
    # the protein's torsions stay as they are, and move independently
    assert torch.equal(torch.isnan(p.measure_torsions(x)["phi"]), torch.isnan(p.torsions["phi"]))


def test_one_clash_loss_over_protein_and_ligand():
    p = from_pdb(os.path.join(DATA, "3o5r.cif"), ligands=True)
    excl = p.exclusions()
    lig = torch.from_numpy((p.family == "ligand")[p.parsed.residue])
    total = zmat.clash_loss(p.xyz, p.radii, exclude=excl)
    only_protein = zmat.clash_loss(p.xyz, p.radii, exclude=excl, mask=~lig)
    only_ligand = zmat.clash_loss(p.xyz, p.radii, exclude=excl, mask=lig)
    i, j = torch.meshgrid(torch.nonzero(~lig)[:, 0], torch.nonzero(lig)[:, 0], indexing="ij")
    cross = zmat.clash_loss(
        p.xyz, p.radii, exclude=excl, pairs=torch.stack([i.reshape(-1), j.reshape(-1)], 1)
    )
    torch.testing.assert_close(total, only_protein + only_ligand + cross)
    # push the ligand into the protein: the cross term grows, and its gradient reaches both
    x = p.xyz.clone()
    centre = p.xyz[~lig].mean(0) - p.xyz[lig].mean(0)
    x[lig] += centre
    x.requires_grad_(True)
    loss = zmat.clash_loss(x, p.radii, exclude=excl)
    loss.backward()
    assert float(loss.detach()) > float(total) + 10
    assert x.grad[lig].abs().sum() > 0 and x.grad[~lig].abs().sum() > 0


def test_unknown_atom_name_is_kept_with_a_warning():
    atoms = _atoms("3o5r")
    atoms = atoms[atoms.res_name != "HOH"]
    k = int(np.flatnonzero(atoms.res_name == "FK5")[0])
    atoms.atom_name[k] = "QQ1"
    with pytest.warns(UserWarning, match=r"chain A residue \d+ FK5: atoms \['QQ1'\]"):
        p = from_structure(atoms, ligands=True)
    i = p.atom_names.tolist().index("QQ1")  # kept, as an extra atom bonded within FK5
    assert p.parsed.extra[i] and p.parsed.extra.sum() == 1
    assert (p.parsed.bonds == i).any() and not (p.ligand_quads == i).any()
