"""TorsionSpace.from_mol at the edges (issue 20): rings closed by dative bonds (RDKit's ring
info leaves them out) and conformers whose bonded atoms coincide."""

import numpy as np
import pytest
import torch

pytest.importorskip("rdkit")
from rdkit import Chem, RDLogger  # noqa: E402
from rdkit.Chem import AllChem  # noqa: E402
from rdkit.Geometry import Point3D  # noqa: E402

import zmat.rdkit as zr  # noqa: E402
from zmat.rdkit import _bonds, _ring_bonds  # noqa: E402

RDLogger.DisableLog("rdApp.*")
CHELATES = {
    "Pt(en)Cl2": ("Cl[Pt]1(Cl)<-[NH2]CC[NH2]->1", 1),
    "Cu(acac)2": ("CC1=O->[Cu]2(<-O=C(C)C=C(C)O2)OC(C)=C1", 0),
    "Zn glycinate": ("NCC(=O)O[Zn]1<-NCC(=O)O1", 3),
}


def _embedded(smiles, seed):
    m = Chem.AddHs(Chem.MolFromSmiles(smiles))
    assert AllChem.EmbedMolecule(m, randomSeed=seed) == 0
    return m


def _bond_lengths(x, e):
    return (x[..., e[:, 0], :] - x[..., e[:, 1], :]).norm(dim=-1)


@pytest.mark.parametrize("name", list(CHELATES))
def test_chelate_rings_do_not_rotate(name):
    """Every torsion moves only what hangs off a bond that is in no ring: all bond lengths,
    dative bonds included, stay as they are (Pt(en)Cl2 used to change one by 0.45 A at
    +1 rad; Cu(acac)2 raised IndexError)."""
    m = _embedded(*CHELATES[name])
    ts = zr.TorsionSpace.from_mol(m)
    e = torch.as_tensor(_bonds(m))
    ring = _ring_bonds(m.GetNumAtoms(), _bonds(m))
    assert not any(tuple(sorted(q)) in ring for q in ts.quads[:, 1:3].tolist())
    g = torch.Generator().manual_seed(0)
    t = ts.torsions + torch.randn(4, len(ts.torsions), generator=g, dtype=torch.float64)
    for method in ("rigid", "table"):
        x = ts.to_xyz(t, method=method)
        assert (_bond_lengths(x, e) - _bond_lengths(ts.positions, e)).abs().max() < 1e-9


def test_a_dative_ring_bond_asked_for_is_refused():
    m = _embedded(*CHELATES["Pt(en)Cl2"])
    c = [a.GetIdx() for a in m.GetAtoms() if a.GetSymbol() == "C"]
    with pytest.raises(ValueError, match=r"ring bond \(rings closed by dative bonds count\)"):
        zr.TorsionSpace.from_mol(m, rotatable=[c[:2]])


@pytest.mark.parametrize(
    "smiles",
    ["CCCC", "c1ccccc1CCO", "C1CC2CCC1C2", "C1CCC2(CC1)CCCC2", "c1ccc2ccccc2c1", "C1CC1C1CC1", "O"],
)
def test_ring_bonds_equal_rdkits_without_dative_bonds(smiles):
    m = Chem.AddHs(Chem.MolFromSmiles(smiles))
    want = {tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx()))) for b in m.GetBonds() if b.IsInRing()}
    assert _ring_bonds(m.GetNumAtoms(), _bonds(m)) == want


@pytest.mark.parametrize("atoms", ["all", "two"])
def test_coincident_bonded_atoms_are_refused(atoms):
    """An all-zero conformer (or two bonded atoms on top of each other) has no bond
    directions: a clear ValueError (it used to be accepted, then to_xyz gave NaN)."""
    m = _embedded("CCCCO", 0)
    conf = m.GetConformer()
    for i in range(m.GetNumAtoms()) if atoms == "all" else (1,):
        p = conf.GetAtomPosition(0) if atoms == "two" else Point3D(0, 0, 0)
        conf.SetAtomPosition(i, Point3D(p.x, p.y, p.z))
    with pytest.raises(ValueError, match=r"atoms 0 and 1 coincide"):
        zr.TorsionSpace.from_mol(m)
    assert np.isfinite(m.GetConformer().GetPositions()).all()
