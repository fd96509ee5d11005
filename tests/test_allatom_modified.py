"""In-chain modified residues are polymer residues of their CCD parent type
(``zmat/structure/modified.py``; docs/allatom.md, "Modified residues in a chain"):
real files, references measured with numpy from the file's own atoms."""

import os
import warnings

import numpy as np
import pytest
import torch

import zmat
from zmat.protein import from_pdb, from_structure
from zmat.protein.atom37 import ATOM_ORDER, RESTYPE_3
from zmat.structure import modified, templates

pytest.importorskip("biotite")
import biotite.structure as struc  # noqa: E402
from biotite.structure.io import pdbx  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
pytestmark = pytest.mark.filterwarnings("ignore:The coordinates are missing")
MSE_1A8O = os.path.join(DATA, "1a8o_modified.cif")  # HIV capsid domain, 4 selenomethionines
MSE_CHI = (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "SE"), ("CB", "CG", "SE", "CE"))


def _file(path):
    a = pdbx.get_structure(pdbx.CIFFile.read(path), model=1)
    return a[a.res_name != "HOH"]


def _dihedral(p0, p1, p2, p3) -> float:
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    b1 = b1 / np.linalg.norm(b1)
    v, w = b0 - b0 @ b1 * b1, b2 - b2 @ b1 * b1
    return float(np.arctan2(np.cross(b1, v) @ w, v @ w))


def _rotate(x, axis_from, axis_to, angle):
    """``x`` ``(n, 3)`` turned by ``angle`` about the axis ``axis_from -> axis_to`` (Rodrigues)."""
    k = (axis_to - axis_from) / np.linalg.norm(axis_to - axis_from)
    v = x - axis_to
    v = v * np.cos(angle) + np.cross(k, v) * np.sin(angle) + np.outer(v @ k, k) * (1 - np.cos(angle))
    return v + axis_to


def _polymer_row(c, res_name, res_id):
    k = int(np.flatnonzero((c.res_names == res_name) & (c.res_ids == res_id))[0])
    return k, int(c.parsed.polymer_index[k])


def test_selenomethionine_is_a_met_of_its_chain():
    """1a8o: every residue of the chain is a polymer residue, MSE's chi1..chi3 are MET's
    (SE in SD's place) as measured from the file, and the AlphaFold tensors are those of
    AlphaFold's data pipeline (``templates._get_atom_positions``), rebuilt here from the file."""
    atoms = _file(MSE_1A8O)
    c = from_pdb(MSE_1A8O)
    res = [(r.res_name[0], r.res_id[0], r) for r in struc.residue_iter(atoms)]
    assert len(c) == len(res) == 70 and c.res_types[c.res_names == "MSE"].tolist() == ["MET"] * 4
    for name, rid, r in res:
        if name != "MSE":
            continue
        x = {str(a): r.coord[i].astype(np.float64) for i, a in enumerate(r.atom_name)}
        _, l_ = _polymer_row(c, "MSE", rid)
        for j, quad in enumerate(MSE_CHI):
            got = float(c.torsions[f"chi{j + 1}"][l_])
            assert abs(got - _dihedral(*(x[a] for a in quad))) < 1e-9, (rid, j)
        assert torch.isnan(c.torsions["chi4"][l_])
        assert (c.torsion_rows()["chi3"][l_] >= 0) and not torch.isnan(c.torsions["psi"][l_])
    # AlphaFold: MSE -> M (residue_constants.CCD_NAME_TO_ONE_LETTER), SE in the SD column
    want_type = [RESTYPE_3.index("MET" if n == "MSE" else n) for n, _, _ in res]
    want_pos, want_mask = np.zeros((70, 37, 3)), np.zeros((70, 37), bool)
    for k, (name, _, r) in enumerate(res):
        for i, a in enumerate(r.atom_name):
            slot = ATOM_ORDER.get(str(a), ATOM_ORDER["SD"] if (a, name) == ("SE", "MSE") else None)
            if slot is not None:
                want_pos[k, slot], want_mask[k, slot] = r.coord[i], True
    pos, mask = c.to_atom37()
    assert c.aatype.tolist() == want_type
    np.testing.assert_array_equal(mask.numpy(), want_mask)
    np.testing.assert_array_equal(pos.numpy(), want_pos)


@pytest.mark.parametrize("chi, axis, moved", [(1, ("CA", "CB"), "CB"), (3, ("CG", "SE"), "SE")])
def test_selenomethionine_chi_edit_turns_only_its_side_chain(chi, axis, moved):
    """With hydrogens: MSE 185's chi1 / chi3 + 0.7 rad is the file's atoms beyond the bond
    turned rigidly about it (numpy), every other atom of the structure in place."""
    c = from_pdb(MSE_1A8O, hydrogens=True)
    k, l_ = _polymer_row(c, "MSE", 185)
    t = torch.full((len(c),), float("nan"), dtype=torch.float64)
    t[l_] = c.torsions[f"chi{chi}"][l_] + 0.7
    y = c.xyz_from_torsions({f"chi{chi}": t}).numpy()
    x = c.xyz.numpy()
    own = {str(c.atom_names[i]): int(i) for i in np.flatnonzero(c.parsed.residue == k)}
    beyond = {
        "CB": ["CG", "SE", "CE", "HB2", "HB3", "HG2", "HG3", "HE1", "HE2", "HE3"],
        "SE": ["CE", "HE1", "HE2", "HE3"],
    }[moved]
    idx = [own[a] for a in beyond]
    want = x.copy()
    want[idx] = _rotate(x[idx], x[own[axis[0]]], x[own[axis[1]]], 0.7)
    assert np.abs(y - want).max() < 1e-9
    assert abs(float(c.measure_torsions(torch.from_numpy(y))[f"chi{chi}"][l_] - t[l_])) < 1e-9


PURINE = ("C8", "N7", "C5", "C6", "N6", "N1", "C2", "N3", "C4")
PYRIMIDINE = ("C2", "O2", "N3", "C4", "N4", "C5", "C6")


@pytest.mark.parametrize(
    "path, name, res_id, glyco, base",
    [
        ("4p5j.cif", "A23", 84, ("O4'", "C1'", "N9", "C4"), PURINE),
        ("4gxy.pdb", "CCC", 172, ("O4'", "C1'", "N1", "C2"), PYRIMIDINE),
    ],
)
def test_modified_nucleotide_has_its_parents_torsions(path, name, res_id, glyco, base):
    """4p5j's A23 (parent A) and 4gxy's CCC (parent C), 2',3'-cyclic phosphates at a 3' end:
    alpha..delta, chi and the pucker as measured from the file; a chi edit turns only the base."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = from_pdb(os.path.join(DATA, path))
    k, l_ = _polymer_row(c, name, res_id)
    assert c.family[k] == "nucleic" and c.res_types[k] == name[0] and len(c) == int(c.polymer.sum())
    own = {str(c.atom_names[i]): int(i) for i in np.flatnonzero(c.parsed.residue == k)}
    prev = {str(c.atom_names[i]): int(i) for i in np.flatnonzero(c.parsed.residue == k - 1)}
    x = c.xyz.numpy()
    quads = {
        "alpha": (prev["O3'"], own["P"], own["O5'"], own["C5'"]),
        "beta": tuple(own[a] for a in ("P", "O5'", "C5'", "C4'")),
        "gamma": tuple(own[a] for a in ("O5'", "C5'", "C4'", "C3'")),
        "delta": tuple(own[a] for a in ("C5'", "C4'", "C3'", "O3'")),
        "chi": tuple(own[a] for a in glyco),
    }
    for tname, q in quads.items():
        assert abs(float(c.torsions[tname][l_]) - _dihedral(*x[list(q)])) < 1e-9, tname
        assert c.torsion_rows()[tname][l_] >= 0, tname
    ring = [own[a] for a in ("C4'", "O4'", "C1'", "C2'", "C3'")] * 2
    nu2 = _dihedral(*x[ring[2:6]])  # tau_m cos P = nu2 (Altona-Sundaralingam)
    amp, phase = c.torsions["pucker_amplitude"][l_], c.torsions["pucker_phase"][l_]
    assert abs(float(amp * torch.cos(phase)) - nu2) < 1e-9
    assert torch.isnan(c.torsions["epsilon"][l_])  # no next residue
    t = torch.full((len(c),), float("nan"), dtype=torch.float64)
    t[l_] = c.torsions["chi"][l_] - 0.5
    y = c.xyz_from_torsions({"chi": t}).numpy()
    base = [own[a] for a in base]
    want = x.copy()
    want[base] = _rotate(x[base], x[own["C1'"]], x[own[glyco[2]]], -0.5)
    assert np.abs(y - want).max() < 1e-9


def _pseudouridine():
    """4p5j with a U made a pseudouridine: its ring atoms renamed by their place (U's N1, bonded to
    C1', is PSU's C5...), so the file's geometry is that of a PSU (C1'-C5 bonded); and the U's index."""
    atoms = _file(os.path.join(DATA, "4p5j.cif"))
    u = sorted(set(atoms.res_id[atoms.res_name == "U"].tolist()))[5]
    sel = atoms.res_id == u
    atoms.res_name[sel], atoms.hetero[sel] = "PSU", True
    # U -> PSU names by bonds (each name's atom has the same neighbours; CCD entries of U and PSU)
    own = {"N1": "C5", "C2": "C4", "O2": "O4", "C4": "C2", "O4": "O2", "C5": "N1"}
    atoms.atom_name[sel] = [own.get(str(a), str(a)) for a in atoms.atom_name[sel]]
    return atoms, u


def test_pseudouridine_has_its_parents_torsions():
    """PSU (parent U, a C-glycoside): chi is O4'-C1'-C5-C4, the U's O4'-C1'-N1-C2 before renaming;
    every torsion and the pucker the U's, and an exact rebuild."""
    atoms, u = _pseudouridine()
    c0 = from_pdb(os.path.join(DATA, "4p5j.cif"))
    c = from_structure(atoms)
    _, l_ = _polymer_row(c, "PSU", u)
    assert len(c) == len(c0) and c.res_types[c.res_names == "PSU"].tolist() == ["U"]
    for name in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "chi", "pucker_phase"):
        assert abs(float(c.torsions[name][l_] - c0.torsions[name][l_])) < 1e-12, name
        assert name == "pucker_phase" or c.torsion_rows()[name][l_] >= 0, name
    x = zmat.to_xyz(c.internal, c.table)
    assert float((zmat.superpose(x, c.xyz) - c.xyz).abs().max()) < 1e-10


def test_parent_atoms_bonded_otherwise_leave_their_torsions_out(monkeypatch):
    """Without PSU's renaming its parent U's chi atoms O4'-C1'-N1-C2 are not bonded so (C1' is
    bonded to C5): chi is NaN, not a dihedral about no bond; the rest is the U's."""
    atoms, u = _pseudouridine()
    c0 = from_pdb(os.path.join(DATA, "4p5j.cif"))
    monkeypatch.delitem(modified.ALIASES, "PSU")
    templates._cached.cache_clear()  # templates compiled with the renaming
    try:
        c = from_structure(atoms)
    finally:
        templates._cached.cache_clear()
    _, l_ = _polymer_row(c, "PSU", u)
    assert torch.isnan(c.torsions["chi"][l_])
    for name in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "pucker_phase"):
        assert abs(float(c.torsions[name][l_] - c0.torsions[name][l_])) < 1e-12, name
    x = zmat.to_xyz(c.internal, c.table)
    assert float((zmat.superpose(x, c.xyz) - c.xyz).abs().max()) < 1e-10


TRNA = os.path.join(DATA, "1ehz_trna.pdb")  # yeast tRNA-Phe, 76 nt, 14 modified ones of 11 kinds
TRNA_MODIFIED = {
    "2MG": "G", "H2U": "U", "M2G": "G", "OMC": "C", "OMG": "G", "YYG": "G",
    "PSU": "U", "5MC": "C", "7MG": "G", "5MU": "U", "1MA": "A",
}  # fmt: skip


@pytest.fixture(scope="module")
def trna():
    return from_pdb(TRNA, hydrogens=True)


def _far_side(bonds: np.ndarray, b: int, c: int) -> set:
    """The atoms reached from ``c`` over ``bonds`` without crossing ``b-c`` (a bridge)."""
    adj: dict[int, list[int]] = {}
    for i, j in bonds.tolist():
        adj.setdefault(i, []).append(j)
        adj.setdefault(j, []).append(i)
    seen, todo = {c}, [c]
    while todo:
        for v in adj[todo.pop()]:
            if v not in seen and v != b:
                seen.add(v)
                todo.append(v)
    return seen


def test_trna_modified_nucleotides_are_their_parents(trna):
    """1ehz: the 14 modified nucleotides (11 kinds) are polymer residues of their CCD parent, every named
    torsion that exists is a row, and the structure rebuilds exactly."""
    c = trna
    assert len(c) == 76 and int(c.polymer.sum()) == 76
    got = {str(n): str(t) for n, t in zip(c.res_names, c.res_types, strict=True) if n != t}
    assert got == TRNA_MODIFIED
    rows = c.torsion_rows()
    for name, t in c.torsions.items():
        if name in rows:
            assert bool((rows[name][~torch.isnan(t)] >= 0).all()), name
    x = zmat.to_xyz(c.internal, c.table)
    assert float((zmat.superpose(x, c.xyz) - c.xyz).abs().max()) < 1e-10


def test_rotatable_bonds_beyond_the_parent_are_torsions_that_turn_their_far_side(trna):
    """1ehz with hydrogens: OMC's and OMG's 2'-O-methyl (C2'-O2') and wybutosine's side chain are
    torsions of their own (``ligand_torsions``); each + 0.6 rad is the file's atoms on the far side
    of its bond (found over the bonds here) turned rigidly about it, every other atom in place."""
    c = trna
    quads, owner = np.asarray(c.ligand_quads), np.asarray(c.ligand_residue)
    names = [
        (str(c.res_names[k]), tuple(str(c.atom_names[i]) for i in q))
        for q, k in zip(quads, owner, strict=True)
    ]
    assert ("OMC", ("C1'", "C2'", "O2'", "CM2")) in names and ("OMG", ("C1'", "C2'", "O2'", "CM2")) in names
    assert sum(n == "YYG" for n, _ in names) == 5 and len(names) == 7  # no other residue has one
    x, bonds = c.xyz.numpy(), np.asarray(c.parsed.bonds)
    for t in range(len(names)):
        v = torch.full((len(names),), float("nan"), dtype=torch.float64)
        v[t] = c.ligand_torsions[t] + 0.6
        y = c.xyz_from_torsions({"ligand": v}).numpy()
        b, cc = int(quads[t, 1]), int(quads[t, 2])
        idx = sorted(_far_side(bonds, b, cc) - {cc})
        want = x.copy()
        want[idx] = _rotate(x[idx], x[b], x[cc], 0.6)
        assert np.abs(y - want).max() < 1e-9, names[t]


def test_modified_nucleotides_in_the_rhofold_layout(trna):
    """``nucleotide_positions`` has all 76 nucleotides of 1ehz, a modified one in its parent's slots
    (pseudouridine's C5 in the glycosidic N1 slot) with the file's coordinates."""
    from zmat.structure.nucleic_frames import NUCLEIC_ATOM_NAMES, NUCLEIC_RESTYPES

    pos, mask, restype, residue = zmat.protein.nucleotide_positions(trna)
    assert residue.tolist() == list(range(76))
    x = trna.xyz
    for k in np.flatnonzero(trna.res_names != trna.res_types).tolist():
        parent = str(trna.res_types[k])
        assert NUCLEIC_RESTYPES[int(restype[k])] == parent
        own = {str(trna.atom_names[i]): int(i) for i in np.flatnonzero(trna.parsed.residue == k)}
        rename = modified.ALIASES.get(str(trna.res_names[k]), {})
        for s, a in enumerate(NUCLEIC_ATOM_NAMES[parent]):
            a = rename.get(a, a)
            assert bool(mask[k, s]) == (a in own), (k, a)
            if a in own:
                assert torch.equal(pos[k, s], x[own[a]]), (k, a)
    assert int(mask[trna.res_names == "PSU"].sum(1).min()) == len(NUCLEIC_ATOM_NAMES["U"])


# per kind: its renamings (parent -> own) and the rotatable bonds its parent does not have
KINDS = {
    "MSE": ({"SD": "SE"}, []),
    "SEP": ({}, [("CB", "OG"), ("OG", "P")]),
    "TPO": ({}, [("CB", "OG1"), ("OG1", "P")]),
    "PTR": ({}, [("CZ", "OH"), ("OH", "P")]),
    "MLY": ({}, [("CE", "NZ")]),
    "M3L": ({}, [("CE", "NZ")]),
    "ALY": ({}, [("CE", "NZ")]),
    "KCX": ({}, [("CE", "NZ")]),  # NZ-CX: a carbamate, amide-like
    "LLP": ({}, [("CE", "NZ"), ("C4", "C4'"), ("C5", "C5'"), ("C5'", "OP4"), ("OP4", "P")]),  # NZ=C4'
    "CSO": ({}, [("CB", "SG")]),
    "CSD": ({}, [("CB", "SG")]),
    "CME": ({}, [("CB", "SG"), ("SG", "SD"), ("SD", "CE"), ("CE", "CZ")]),
    "HYP": ({}, []),
    "PCA": ({"OE1": "OE"}, []),
    "5MU": ({}, []),
    "PSU": (modified.ALIASES["PSU"], []),
    "H2U": ({}, []),
    "OMC": ({}, [("C2'", "O2'")]),
    "OMG": ({}, [("C2'", "O2'")]),
    "1MA": ({}, []),
    "2MG": ({}, []),
    "M2G": ({}, []),
    "7MG": ({}, []),
}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_atoms_matched_to_the_parent_by_the_ccd(name):
    """Each common kind on its own CCD entry: the renamings the graphs give, every parent heavy atom
    (but leaving ones, and pyroglutamate's NE2, its ring N) matched and bonded as in the parent, and
    the residue's own torsions (``beyond_parent``)."""
    import biotite.structure.info as info

    rename, own_bonds = KINDS[name]
    assert modified.aliases(name) == rename
    parent = modified.parent_type(name)
    mine, theirs = info.residue(name), info.residue(parent)

    def heavy_bonds(r, key):
        names, heavy = r.atom_name, r.element != "H"
        return {frozenset(key(str(names[i])) for i in b) for b in r.bonds.as_array()[:, :2] if heavy[b].all()}

    flags = info.get_from_ccd("chem_comp_atom", parent, "pdbx_leaving_atom_flag").as_array(str)
    leaving = {str(a) for a, f in zip(theirs.atom_name, flags, strict=True) if f == "Y"}
    want = {str(a) for a, e in zip(theirs.atom_name, theirs.element, strict=True) if e != "H"} - leaving
    have = {modified.parent_name(name, a) for a in modified.parent_atoms(name)}
    assert want - have == ({"NE2"} if name == "PCA" else set())
    inside = {b for b in heavy_bonds(theirs, str) if b <= want & have}
    assert inside <= heavy_bonds(mine, lambda a: modified.parent_name(name, a))
    atoms = np.arange(mine.array_length())
    bonds = mine.bonds.as_array()
    rot = modified.beyond_parent(name, atoms, mine.atom_name, bonds[:, :2], bonds[:, 2], mine.element)
    got = {frozenset(str(mine.atom_name[i]) for i in b) for b in rot}
    assert got == {frozenset(b) for b in own_bonds}


def test_modified_cysteine_makes_its_disulfide():
    """1aki (hen lysozyme, 4 disulfides) with CYS 30 written as S-hydroxycysteine (CSO, parent CYS; no
    real file at hand, and its OD left unresolved): its SG-SG bond to CYS 115 is kept, as the
    CYS's is, a bond and not a tree edge (the rebuild stays exact)."""
    atoms = pdbx.get_structure(pdbx.CIFFile.read(os.path.join(DATA, "1aki.cif")), model=1)
    atoms = atoms[atoms.res_name != "HOH"]
    sel = atoms.res_id == 30
    atoms.res_name[sel], atoms.hetero[sel] = "CSO", True

    def disulfides(c):
        sg = np.flatnonzero(c.atom_names == "SG")
        res = np.asarray(c.parsed.residue)
        bonds = np.asarray(c.parsed.bonds)
        pairs = bonds[np.isin(bonds, sg).all(1)]
        return sorted(tuple(sorted(int(c.res_ids[res[i]]) for i in p)) for p in pairs)

    c = from_structure(atoms)
    assert c.res_types[c.res_names == "CSO"].tolist() == ["CYS"]
    assert disulfides(c) == [(6, 127), (30, 115), (64, 80), (76, 94)]  # hen lysozyme's four
    x = zmat.to_xyz(c.internal, c.table)
    assert float((zmat.superpose(x, c.xyz) - c.xyz).abs().max()) < 1e-10


def _phosphoserine():
    """1aki with SER 36 phosphorylated: SEP's CCD phosphate (P, O1P, O2P, O3P) put on the file's
    N, CA, CB, OG by superposing the CCD's ideal coordinates (no real SEP file at hand)."""
    import biotite.structure.info as info

    atoms = pdbx.get_structure(pdbx.CIFFile.read(os.path.join(DATA, "1aki.cif")), model=1)
    atoms = atoms[(atoms.res_name != "HOH") & (atoms.element != "H")]
    sel = np.flatnonzero(atoms.res_id == 36)
    ideal = info.residue("SEP")
    fit = ["N", "CA", "CB", "OG"]
    pick = [int(np.flatnonzero(ideal.atom_name == a)[0]) for a in fit]
    mine = [int(sel[np.flatnonzero(atoms.atom_name[sel] == a)[0]]) for a in fit]
    _, move = struc.superimpose(atoms.coord[mine], ideal.coord[pick])
    atoms.res_name[sel], atoms.hetero[sel] = "SEP", True
    phosphate = ideal[np.isin(ideal.atom_name, ["P", "O1P", "O2P", "O3P"])]
    new = atoms[np.repeat(sel[-1], len(phosphate))].copy()  # the residue's annotations
    new.atom_name, new.element = phosphate.atom_name, phosphate.element
    new.coord = move.apply(phosphate.coord)
    return atoms[: sel[-1] + 1] + new + atoms[sel[-1] + 1 :]


def test_phosphoserine_phosphate_torsions_turn_only_the_phosphate():
    """A SEP in a real chain (1aki, its phosphate from the CCD), with hydrogens: chi1 is SER's,
    CB-OG and OG-P are its own torsions; each edit is the atoms beyond the bond turned rigidly
    about it (numpy), every other atom in place; the rebuild is exact."""
    atoms = _phosphoserine()
    c = from_structure(atoms, hydrogens=True)
    k, l_ = _polymer_row(c, "SEP", 36)
    assert c.res_types[k] == "SER" and c.torsion_rows()["chi1"][l_] >= 0
    quads, owner = np.asarray(c.ligand_quads), np.asarray(c.ligand_residue)
    names = [tuple(str(c.atom_names[i]) for i in q) for q in quads[owner == k]]
    assert names == [("CA", "CB", "OG", "P"), ("CB", "OG", "P", "O1P")]
    x, bonds = c.xyz.numpy(), np.asarray(c.parsed.bonds)
    for t in np.flatnonzero(owner == k).tolist():
        v = torch.full((len(quads),), float("nan"), dtype=torch.float64)
        v[t] = c.ligand_torsions[t] - 0.8
        y = c.xyz_from_torsions({"ligand": v}).numpy()
        b, cc = int(quads[t, 1]), int(quads[t, 2])
        idx = sorted(_far_side(bonds, b, cc) - {cc})
        assert {str(c.atom_names[i]) for i in idx} >= {"O1P", "O2P", "O3P"}
        want = x.copy()
        want[idx] = _rotate(x[idx], x[b], x[cc], -0.8)
        assert np.abs(y - want).max() < 1e-9, names
    xr = zmat.to_xyz(c.internal, c.table)
    assert float((zmat.superpose(xr, c.xyz) - c.xyz).abs().max()) < 1e-10
