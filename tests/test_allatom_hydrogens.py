"""Hydrogens in zmat.protein: kept from the file, completed from CCD ideal coordinates,
every one a row on its heavy atom; exact rebuild; names and positions against the
deposited NMR hydrogens of 1l2y and against OpenMM's Modeller.addHydrogens (1l2y, 1bna).

Positions are compared per heavy atom up to a permutation of its hydrogens: tools name
prochiral pairs differently (HB2/HB3: the CCD's ideal coordinates, OpenMM and the 1l2y
deposition disagree residue by residue), so an exact-name RMSD would measure naming."""

import itertools
import os
import warnings

import numpy as np
import pytest
import torch

import zmat
from zmat._align import superpose
from zmat.protein import Protonation, from_structure

pytest.importorskip("biotite")
from biotite.structure.io import pdb, pdbx  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
pytestmark = pytest.mark.filterwarnings("ignore:The coordinates are missing")
#: RMSD bounds (A) per kind of hydrogen; rotors (methyl, hydroxyl, NH3+) take the CCD
#: conformer's dihedral (a free torsion: only bond length and angle are compared, a methyl
#: turned by 60 deg is 1.03 A off), the others are fixed by their heavy atoms.
TOLERANCE = {"fixed": 0.1, "amide": 0.15, "rotor": 1.2}


def _1l2y():
    return pdb.PDBFile.read(os.path.join(DATA, "1l2y.pdb")).get_structure(model=1)


def _1bna():
    a = pdbx.get_structure(pdbx.CIFFile.read(os.path.join(DATA, "1bna.cif")), model=1)
    return a[a.res_name != "HOH"]


def _keyed(p) -> dict:
    r = p.parsed.residue
    return {(p.res_chain_ids[r[i]], int(p.res_ids[r[i]]), str(p.atom_names[i])): i for i in range(p.n_atoms)}


def _groups(p) -> dict:
    """(kind, heavy atom) -> hydrogen keys."""
    keys = {v: k for k, v in _keyed(p).items()}
    nb = [[] for _ in range(p.n_atoms)]
    for i, j in p.parsed.bonds.tolist():
        nb[i].append(j)
        nb[j].append(i)
    out = {}
    for h in np.flatnonzero(p.elements == "H"):
        x = nb[h][0]
        n_heavy = sum(p.elements[y] != "H" for y in nb[x])
        n_h = sum(p.elements[y] == "H" for y in nb[x])
        if p.atom_names[x] == "N" and p.atom_names[h] == "H":
            kind = "amide"
        elif n_heavy == 1 and (p.elements[x] in ("O", "S") or n_h == 3):
            kind = "rotor"
        else:
            kind = "fixed"
        out.setdefault((kind, x), []).append(keys[h])
    return out


def _rmsd_by_kind(groups, a: dict, b: dict) -> dict:
    """Per kind, RMSD between position dicts, best permutation within each heavy atom."""
    sq, n = {}, {}
    for (kind, _), keys in groups.items():
        best = min(
            sum(float(np.sum((a[k] - b[m]) ** 2)) for k, m in zip(keys, perm, strict=True))
            for perm in itertools.permutations(keys)
        )
        sq[kind] = sq.get(kind, 0.0) + best
        n[kind] = n.get(kind, 0) + len(keys)
    return {k: (sq[k] / n[k]) ** 0.5 for k in sq}


def _positions(p) -> dict:
    return {k: p.xyz[i].numpy() for k, i in _keyed(p).items()}


def test_file_hydrogens_kept_and_rebuilt_exactly():
    atoms = _1l2y()
    p = from_structure(atoms, hydrogens=True)
    assert p.n_atoms == atoms.array_length() and not p.added.any()
    np.testing.assert_array_equal(p.to_structure().coord, atoms.coord)
    x = zmat.to_xyz(p.internal, p.table)
    assert float((superpose(x, p.xyz) - p.xyz).abs().max()) < 1e-8
    # every hydrogen is a row on its own heavy atom, but the tree's root (the N-terminal H1:
    # a leaf, so the N-terminus keeps psi and every row is rigid), whose child is its N
    refs = p.parsed.refs
    h = np.flatnonzero((p.elements == "H") & (refs[:, 0] >= 0))
    bonded = {tuple(sorted(b)) for b in p.parsed.bonds.tolist()}
    assert all(tuple(sorted((int(i), int(refs[i, 0])))) in bonded for i in h)
    (root,) = np.flatnonzero(refs[:, 0] < 0)
    assert p.atom_names[root] == "H1" and p.atom_names[np.flatnonzero(refs[:, 0] == root)] == ["N"]
    # without hydrogens=True the same file is heavy atoms only
    assert (from_structure(atoms, ligands=True).elements != "H").all()


def test_completed_hydrogens_match_the_deposited_ones():
    atoms = _1l2y()
    p = from_structure(atoms[atoms.element != "H"], hydrogens=True)
    observed = {
        (c, int(r), str(n)): x.astype(np.float64)
        for c, r, n, x in zip(atoms.chain_id, atoms.res_id, atoms.atom_name, atoms.coord, strict=True)
    }
    assert set(_keyed(p)) == set(observed)  # the same names in every residue
    assert int(p.added.sum()) == int((atoms.element == "H").sum())
    rmsd = _rmsd_by_kind(_groups(p), _positions(p), observed)
    for kind, value in rmsd.items():
        assert value < TOLERANCE[kind], (kind, value)
    x = zmat.to_xyz(p.internal, p.table)
    assert float((superpose(x, p.xyz) - p.xyz).abs().max()) < 1e-8


def _openmm(atoms, tmp_path):
    """OpenMM's hydrogens (amber14 templates, hydrogen positions minimised), keyed."""
    app = pytest.importorskip("openmm.app")
    unit = pytest.importorskip("openmm.unit")
    path = str(tmp_path / "heavy.pdb")
    f = pdb.PDBFile()
    f.set_structure(atoms[atoms.element != "H"])
    f.write(path)
    src = app.PDBFile(path)
    m = app.Modeller(src.topology, src.positions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.addHydrogens(app.ForceField("amber14-all.xml"), pH=7.0)
    pos = m.getPositions().value_in_unit(unit.angstrom)
    out = {}
    for at in m.topology.atoms():
        res = at.residue
        name = at.name
        first = res.index == next(iter(res.chain.residues())).index
        if name == "H" and first and res.name in zmat.protein.RESIDUES:
            name = "H1"  # OpenMM's charged N-terminus is H, H2, H3; PDB v3 says H1, H2, H3
        out[res.chain.id, int(res.id), name] = np.asarray(pos[at.index], np.float64)
    return out


@pytest.mark.parametrize("make", [_1l2y, _1bna], ids=["1l2y", "1bna"])
def test_hydrogens_agree_with_openmm(make, tmp_path):
    atoms = make()
    p = from_structure(atoms[atoms.element != "H"], hydrogens=True)
    ref = _openmm(atoms, tmp_path)
    assert set(_keyed(p)) == set(ref)
    rmsd = _rmsd_by_kind(_groups(p), _positions(p), ref)
    for kind, value in rmsd.items():
        assert value < TOLERANCE[kind], (kind, value)


def test_torsions_move_hydrogens_rigidly():
    p = from_structure(_1l2y(), hydrogens=True)
    keyed = _keyed(p)
    # a methyl rotor: the first H's dihedral column turns all three
    rows = {k[2]: i for k, i in keyed.items() if k[1] == 2}  # LEU 2
    hd = [rows[n] for n in ("HD11", "HD12", "HD13")]
    owner = [i for i in hd if p.parsed.refs[i, 2] not in hd]
    assert len(owner) == 1 and all(p.parsed.refs[i, 2] == owner[0] for i in hd if i != owner[0])
    c = p.internal.clone()
    c[owner[0], 2] += 1.0
    x = zmat.to_xyz(c, p.table)
    x0 = zmat.to_xyz(p.internal, p.table)
    moved = (x - x0).norm(dim=-1) > 1e-9
    assert set(np.flatnonzero(moved.numpy()).tolist()) == set(hd)
    # chi1 of Leu 2 moves its side chain's hydrogens with it, bond lengths kept
    t = {"chi1": p.torsions["chi1"].clone()}
    t["chi1"][1] += 0.7
    x = zmat.to_xyz(p.internal_with_torsions(t), p.table)
    b = p.bonds
    torch.testing.assert_close(
        (x[b[:, 0]] - x[b[:, 1]]).norm(dim=-1), (p.xyz[b[:, 0]] - p.xyz[b[:, 1]]).norm(dim=-1)
    )
    moved = set(np.flatnonzero(((x - x0).norm(dim=-1) > 1e-6).numpy()).tolist())
    assert {rows[n] for n in ("HB2", "HB3", "HG", "HD11", "CG", "CD1")} <= moved  # CB's substituents
    assert not moved & {rows[n] for n in ("HA", "CB", "CA", "N", "H")}


def test_protonation_options():
    atoms = _1bna()
    with pytest.raises(ValueError, match="his"):
        Protonation(his="HIX")
    p = from_structure(_1l2y()[_1l2y().element != "H"], hydrogens=Protonation(n_terminus="neutral"))
    names = set(p.atom_names[(p.parsed.residue == 0)].tolist())
    assert {"H1", "H2"} <= names and "H3" not in names
    q = from_structure(atoms[atoms.element != "H"], hydrogens=True)
    first = set(q.atom_names[q.parsed.residue == 0].tolist())
    assert "HO5'" in first and "HO3'" not in first  # 5' end without phosphate


@pytest.mark.parametrize(
    ("his", "want", "absent"),
    [("HIE", {"HE2"}, {"HD1"}), ("HID", {"HD1"}, {"HE2"}), ("HIP", {"HD1", "HE2"}, set())],
)
def test_histidine_tautomers_and_charged_groups(his, want, absent):
    a = pdbx.get_structure(pdbx.CIFFile.read(os.path.join(DATA, "5ugo.cif")), model=1)
    p = from_structure(a[a.chain_id == "A"], hydrogens=Protonation(his=his))
    res = p.parsed.residue
    for k in np.flatnonzero(p.res_names == "HIS"):
        names = set(p.atom_names[res == k].tolist())
        assert want <= names and not (absent & names), (his, k, names)
    for k in np.flatnonzero(p.res_names == "ASP"):
        assert "HD2" not in set(p.atom_names[res == k].tolist())  # carboxylate
    for k in np.flatnonzero(p.res_names == "LYS"):
        names = set(p.atom_names[res == k].tolist())
        assert "NZ" not in names or {"HZ1", "HZ2", "HZ3"} <= names  # ammonium (where NZ was modelled)


def test_disulfide_cysteines_have_no_hg():
    a = pdb.PDBFile.read(os.path.join(DATA, "1aki.pdb")).get_structure(model=1)
    p = from_structure(a, hydrogens=True)
    res = p.parsed.residue
    cys = np.flatnonzero(p.res_names == "CYS")
    assert len(cys) == 8
    assert all("HG" not in set(p.atom_names[res == k].tolist()) for k in cys)
    sg = np.flatnonzero(p.atom_names == "SG")
    ss = [b for b in p.parsed.bonds.tolist() if b[0] in sg and b[1] in sg]
    assert len(ss) == 4
