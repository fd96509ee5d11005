"""The file's chemistry kept (docs/allatom.md, "What is kept"): the file's protonation and
hydrogen names, leaving atoms of linked residues dropped, in-chain modified residues kept
with the defaults, partially resolved nucleotides read, completed hydrogens finite."""

import os
import warnings

import numpy as np
import pytest
import torch

import zmat
from zmat._align import superpose
from zmat.protein import Complex, Protonation, from_pdb, from_structure
from zmat.structure.ccd import ccd_residue

pytest.importorskip("biotite")
from biotite.structure.io import pdb, pdbx  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
pytestmark = pytest.mark.filterwarnings("ignore:The coordinates are missing")


def _pdb(name):
    return pdb.PDBFile.read(os.path.join(DATA, name)).get_structure(model=1, extra_fields=["b_factor"])


def _1bna():
    a = pdbx.get_structure(pdbx.CIFFile.read(os.path.join(DATA, "1bna.cif")), model=1)
    return a[a.res_name != "HOH"]


def _residue(c, chain, res_id) -> dict:
    """Atom name -> (index, added) of one residue of a Complex."""
    k = int(np.flatnonzero((c.res_chain_ids == chain) & (c.res_ids == res_id))[0])
    idx = np.flatnonzero(c.parsed.residue == k)
    return {str(c.atom_names[i]): (int(i), bool(c.added[i])) for i in idx}


def _neighbours(c) -> list[list[int]]:
    nb = [[] for _ in range(c.n_atoms)]
    for i, j in c.parsed.bonds.tolist():
        nb[i].append(j)
        nb[j].append(i)
    return nb


def _over_bonded(c) -> list[str]:
    """Atoms with more bonds than in their residue's CCD entry (the free component, its
    leaving atoms included), one more on a chain's charged N-terminal N."""
    nb = _neighbours(c)
    out = []
    for i in range(c.n_atoms):
        k = int(c.parsed.residue[i])
        name = str(c.atom_names[i])
        ccd = ccd_residue(str(c.res_names[k]))
        allowed = len(ccd.neighbors().get(name, [])) + (name == "N" and not c.parsed.linked[k])
        if name.startswith("H") and name not in ccd.neighbors():  # H1, H3, HO5': one bond
            allowed = 1
        if len(nb[i]) > allowed:
            out.append(f"{c.res_chain_ids[k]}{c.res_ids[k]} {c.res_names[k]} {name}: {len(nb[i])} bonds")
    return out


def test_openmm_n_terminal_names_read_as_pdb_v3():
    # OpenMM's PDB writer names a charged N-terminus H, H2, H3 (PDB v3: H1, H2, H3)
    atoms = _pdb("1l2y.pdb")
    first = (atoms.res_id == 1) & (atoms.atom_name == "H1")
    atoms.atom_name[first] = "H"
    c = from_structure(atoms, hydrogens=True)
    res = _residue(c, "A", 1)
    on_n = [n for n in res if n in ("H", "H1", "H2", "H3")]
    assert sorted(on_n) == ["H1", "H2", "H3"] and not c.added.any()
    np.testing.assert_array_equal(c.xyz[res["H1"][0]].numpy(), atoms.coord[first][0].astype(np.float64))
    assert not _over_bonded(c)


def test_file_protonation_kept():
    """1igy has its polar hydrogens (every HIS doubly protonated, charged termini and
    lysines); a HID, a HIE, a neutral N-terminus and a neutral lysine made from it keep
    their protonation whatever ``Protonation`` says; the rest is completed."""
    atoms = _pdb("1igy.pdb")
    atoms = atoms[atoms.chain_id == "A"]
    drop = (
        ((atoms.res_id == 5) & (atoms.atom_name == "HE2"))  # HIS 5 -> HID
        | ((atoms.res_id == 87) & (atoms.atom_name == "HD1"))  # HIS 87 -> HIE
        | ((atoms.res_id == 2) & (atoms.atom_name == "H3"))  # LYS 2 (first): neutral N-terminus
        | ((atoms.res_id == 2) & (atoms.atom_name == "HZ3"))  # and neutral NZ
    )
    atoms = atoms[~drop]
    c = from_structure(atoms, hydrogens=Protonation(his="HIP"))
    assert isinstance(c, Complex)
    file_h = int((atoms.element == "H").sum())
    assert int((~np.asarray(c.added) & (c.elements == "H")).sum()) == file_h  # every one kept
    his5, his87, his189, lys1 = (_residue(c, "A", r) for r in (5, 87, 189, 2))
    assert "HD1" in his5 and "HE2" not in his5
    assert "HE2" in his87 and "HD1" not in his87
    assert "HD1" in his189 and "HE2" in his189  # as in the file
    assert {"H1", "H2"} <= set(lys1) and "H3" not in lys1
    assert {"HZ1", "HZ2"} <= set(lys1) and "HZ3" not in lys1
    # hydrogens were added, but only on heavy atoms without hydrogens in the file
    nb = _neighbours(c)
    added = np.flatnonzero(np.asarray(c.added))
    assert len(added) > 1000
    for h in added:
        x = nb[h][0]
        assert not any(c.elements[y] == "H" and not c.added[y] for y in nb[x]), c.atom_names[x]
    assert not _over_bonded(c)


def _mse_1aki():
    """1aki with its Met 12 made a selenomethionine (MSE), linked in the chain."""
    atoms = _pdb("1aki.pdb")
    atoms = atoms[~atoms.hetero]
    m = atoms.res_id == 12
    atoms.res_name[m] = "MSE"
    atoms.atom_name[m & (atoms.atom_name == "SD")] = "SE"
    atoms.element[m & (atoms.element == "S")] = "SE"
    return atoms


def test_in_chain_modified_residue_kept_with_the_defaults_and_linked():
    c = from_structure(_mse_1aki())
    assert isinstance(c, Complex)
    mse, before, after = _residue(c, "A", 12), _residue(c, "A", 11), _residue(c, "A", 13)
    assert {"N", "CA", "C", "O", "SE"} <= set(mse)
    bonds = {tuple(sorted(b)) for b in c.parsed.bonds.tolist()}
    assert tuple(sorted((before["C"][0], mse["N"][0]))) in bonds
    assert tuple(sorted((mse["C"][0], after["N"][0]))) in bonds
    x = zmat.to_xyz(c.internal.double(), c.table)
    assert float((superpose(x, c.xyz) - c.xyz).norm(dim=-1).max()) < 1e-8
    # with hydrogens: its N carries the amide H only (H2, a leaving atom, goes with the link)
    h = from_structure(_mse_1aki(), hydrogens=True)
    mse = _residue(h, "A", 12)
    assert "H" in mse and not {"H2", "HXT", "OXT"} & set(mse)
    assert not _over_bonded(h)


def test_real_rna_in_chain_modified_residue_and_partial_nucleotide():
    """4gxy: the 3' cyclic phosphate CCC172 belongs to the chain; C113 is resolved as
    its phosphate only (P, OP1, O5'), read as such, its torsions NaN."""
    c = from_pdb(os.path.join(DATA, "4gxy.pdb"))
    ccc, c171 = _residue(c, "A", 172), _residue(c, "A", 171)
    assert tuple(sorted((c171["O3'"][0], ccc["P"][0]))) in {tuple(sorted(b)) for b in c.parsed.bonds.tolist()}
    poly = {int(c.res_ids[k]): int(c.parsed.polymer_index[k]) for k in np.flatnonzero(c.polymer)}
    assert not torch.isnan(c.torsions["epsilon"][poly[171]])  # to CCC's P
    part = _residue(c, "A", 113)
    assert sorted(part) == sorted(["P", "OP1", "O5'"])
    for name in ("beta", "gamma", "delta", "epsilon", "zeta", "chi", "pucker_phase", "pucker_amplitude"):
        assert torch.isnan(c.torsions[name][poly[113]]), name
    assert not torch.isnan(c.torsions["zeta"][poly[112]])  # C113's P and O5' are there
    for p in (c, from_pdb(os.path.join(DATA, "4gxy.pdb"), hydrogens=True, ligands=True)):
        x = zmat.to_xyz(p.internal.double(), p.table)
        assert float((superpose(x, p.xyz) - p.xyz).norm(dim=-1).max()) < 1e-8
        assert torch.isfinite(zmat.to_xyz(p.ideal_internal(), p.table)).all()
        assert not _over_bonded(p)


def test_o3_linked_to_a_hetatm_nucleotide_has_no_ho3():
    atoms = _1bna()
    sel = (atoms.chain_id == "A") & (atoms.res_id == 9)  # DC 9 of strand A: a HETATM 5-methyl-dC
    atoms.hetero[sel] = True
    atoms.res_name[sel] = "5CM"
    for ligands in (False, True):
        c = from_structure(atoms, hydrogens=True, ligands=ligands)
        capped = sorted(int(c.res_ids[c.parsed.residue[i]]) for i in np.flatnonzero(c.atom_names == "HO3'"))
        assert capped == [12, 24], (ligands, capped)  # the 3' ends of strands A and B
        assert "HO3'" not in _residue(c, "A", 9) and "HOP2" not in _residue(c, "A", 9)
        assert not _over_bonded(c)


def test_isolated_heavy_atom_error_names_chain_residue_and_atom():
    atoms = _pdb("1l2y.pdb")
    atoms = atoms[(atoms.element != "H") & ~((atoms.res_id == 7) & (atoms.atom_name != "CA"))]
    with pytest.raises(ValueError, match=r"chain A residue LEU 7: .*HA on CA"):
        from_structure(atoms, hydrogens=True)


def test_coincident_heavy_atoms_give_finite_hydrogens_and_a_warning():
    atoms = _pdb("1l2y.pdb")
    atoms = atoms[atoms.element != "H"]
    m = atoms.res_id == 5
    atoms.coord[m] = atoms.coord[m][0]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = from_structure(atoms, hydrogens=True)
    assert torch.isfinite(c.xyz).all()
    msg = [str(x.message) for x in w if "coincident or collinear" in str(x.message)]
    assert msg and "A GLN 5" in msg[0]
    h = _residue(c, "A", 5)
    d = (c.xyz[h["HA"][0]] - c.xyz[h["CA"][0]]).norm()
    assert 0.9 < float(d) < 1.2  # at its bond length


@pytest.mark.parametrize(
    ("lost", "nan"),
    [
        (["C1'", "C2'", "O4'"], {"chi", "pucker_phase"}),
        (["C3'", "O3'"], {"gamma", "delta", "epsilon", "zeta", "pucker_phase"}),
        (["P", "OP1", "OP2", "O5'", "C5'"], {"alpha", "beta", "gamma", "delta"}),
    ],
)
def test_nucleotide_missing_backbone_or_sugar_atoms(lost, nan):
    atoms = _1bna()
    drop = (atoms.chain_id == "A") & (atoms.res_id == 5) & np.isin(atoms.atom_name, lost)
    c = from_structure(atoms[~drop], hydrogens=True)
    names = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "chi", "pucker_phase")
    assert {n for n in names if torch.isnan(c.torsions[n][4])} == nan
    x = zmat.to_xyz(c.internal.double(), c.table)
    assert float((superpose(x, c.xyz) - c.xyz).norm(dim=-1).max()) < 1e-8
    assert torch.isfinite(zmat.to_xyz(c.ideal_internal(), c.table)).all()
    assert not _over_bonded(c)
