"""The all-atom tree: every chain and ligand its own tree off the structure's frame, every
existing torsion a degree of freedom (zmat/structure/allatom.py, docs/allatom.md)."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings

import numpy as np
import pytest
import torch

import zmat
from zmat.protein import Complex, from_pdb, from_structure
from zmat.protein.io import read_atoms
from zmat.table import POSITIONAL

pytest.importorskip("biotite")

DATA = os.path.join(os.path.dirname(__file__), "data")
DIHEDRALS = ("phi", "psi", "omega", "chi1", "chi2", "chi3", "chi4")
DIHEDRALS += ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "chi")


def _read(name, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_pdb(os.path.join(DATA, name), **kw)


@pytest.fixture(scope="module")
def igy():
    return _read("1igy.pdb", ligands=True)  # 4 chains joined by disulfides, glycans


@pytest.fixture(scope="module")
def ugo():
    return _read("5ugo.cif", ligands=True, hydrogens=True)  # protein + 2 DNA strands


def _tree_bonds(c):
    """Bonds within residues and polymer links (no disulfides or other cross-links)."""
    b = c.parsed.bonds
    ri = c.parsed.residue
    link = (ri[b[:, 0]] == ri[b[:, 1]]) | (np.abs(ri[b[:, 0]] - ri[b[:, 1]]) == 1)
    ss = (c.atom_names[b[:, 0]] == "SG") & (c.atom_names[b[:, 1]] == "SG")
    return torch.from_numpy(b[link & ~ss])


def _geometry(x, bonds):
    """Bond lengths and the angles between bonds sharing an atom."""
    lengths = (x[bonds[:, 0]] - x[bonds[:, 1]]).norm(dim=-1)
    u = torch.cat([bonds, bonds.flip(1)])  # (center, other) both ways
    order = torch.argsort(u[:, 0], stable=True)
    u = u[order]
    same = u[1:, 0] == u[:-1, 0]
    c, a, b = u[1:, 0][same], u[:-1, 1][same], u[1:, 1][same]
    v1, v2 = x[a] - x[c], x[b] - x[c]
    cos = (v1 * v2).sum(-1) / (v1.norm(dim=-1) * v2.norm(dim=-1))
    return lengths, cos


def _edit(c, residue: int, names, delta=0.5):
    t = {k: torch.full((len(c),), torch.nan, dtype=torch.float64) for k in names}
    for k in names:
        t[k][residue] = c.torsions[k][residue] + delta
    return t


def _chain_of_atoms(c):
    return c.res_chain_ids[c.parsed.residue]


def _check_local_edit(c, residue: int, names):
    """An edit moves no bond length or angle, no atom of another chain or ligand, and moves
    atoms of its own chain only downstream (later residues, or the residue's side)."""
    x = c.xyz_from_torsions(_edit(c, residue, names))
    t = c.measure_torsions(x)
    for k in names:
        d = t[k][residue] - c.torsions[k][residue] - 0.5
        assert abs(float(torch.remainder(d + 3, 2 * torch.pi)) - 3) < 1e-9
    bonds = _tree_bonds(c)
    (l0, a0), (l1, a1) = _geometry(c.xyz, bonds), _geometry(x, bonds)
    assert float((l1 - l0).abs().max()) < 1e-9 and float((a1 - a0).abs().max()) < 1e-9
    moved = ((x - c.xyz).norm(dim=-1) > 1e-6).numpy()
    k = int(np.flatnonzero(c.polymer)[residue])
    own = _chain_of_atoms(c) == c.res_chain_ids[k]
    assert moved.any() and not (moved & ~own).any()
    ri = c.parsed.residue
    assert not (moved & own & (ri < k)).any()  # upstream stays
    return moved


def test_phi_psi_edit_in_one_chain_moves_only_its_downstream(igy):
    chains = igy.res_chain_ids[igy.polymer]
    assert len(set(chains.tolist())) == 4
    for chain in ("A", "C", "D"):  # chains entered through disulfides before
        l = int(np.flatnonzero(chains == chain)[40])
        moved = _check_local_edit(igy, l, ("phi", "psi"))
        k = int(np.flatnonzero(igy.polymer)[l])
        later = (igy.parsed.residue > k) & (_chain_of_atoms(igy) == chain)
        later &= igy.polymer[igy.parsed.residue]
        assert moved[later].all()  # the whole chain downstream turns (up to its break)


def test_dna_strand_edit_does_not_move_partner_or_protein(ugo):
    chains = ugo.res_chain_ids[ugo.polymer]
    fam = ugo.family[ugo.polymer]
    nuc = np.flatnonzero(fam == "nucleic")
    strands = sorted(set(chains[nuc].tolist()))
    assert len(strands) >= 2
    for s in strands[:2]:
        l = int(nuc[chains[nuc] == s][3])
        _check_local_edit(ugo, l, ("alpha", "gamma", "chi"))
    l = int(np.flatnonzero(fam == "protein")[10])
    _check_local_edit(ugo, l, ("phi", "psi", "chi1"))


@pytest.mark.parametrize(
    "name, kw",
    [
        ("1l2y.pdb", {"hydrogens": True}),
        ("1bna.cif", {"hydrogens": True}),
        ("4p5j.cif", {"ligands": True}),
        ("3o5r.cif", {"ligands": True, "hydrogens": True}),
    ],
)
def test_every_existing_torsion_is_a_degree_of_freedom(name, kw):
    c = _read(name, **kw)
    rows = c.torsion_rows()
    t = {}
    for k in DIHEDRALS:
        defined = ~torch.isnan(c.torsions[k])
        assert (rows[k][defined] >= 0).all(), (name, k, torch.nonzero(defined & (rows[k] < 0))[:5])
        t[k] = c.torsions[k] + 0.3
    x = zmat.to_xyz(c.internal_with_torsions(t), c.table)
    got = c.measure_torsions(x)
    for k in DIHEDRALS:  # all set at once, residue 0's psi and the first gamma included
        d = torch.remainder(got[k] - t[k] + torch.pi, 2 * torch.pi) - torch.pi
        assert float(d.nan_to_num().abs().max()) < 1e-8, (name, k)
    # one tree, no position-anchored row: the rigid fast path
    assert (c.table.kind == POSITIONAL).sum() == 0 and (c.parsed.refs[:, 0] < 0).sum() == 1


def test_coincident_atoms_warn_and_rebuild_exactly():
    a = read_atoms(os.path.join(DATA, "1l2y.pdb"))
    a = a[a.element != "H"]
    m = a.res_id == 5
    a.coord[m] = a.coord[m][0]
    with pytest.warns(UserWarning, match=r"coincide.*A \w+ 5"):
        c = from_structure(a, ligands=True)
    x = zmat.to_xyz(c.internal, c.table)
    assert float((zmat.superpose(x, c.xyz) - c.xyz).norm(dim=-1).max()) < 1e-8
    # the torsions through them are NaN, every other one a degree of freedom
    rows = c.torsion_rows()
    assert all(((rows[k] >= 0) | torch.isnan(c.torsions[k])).all() for k in DIHEDRALS)


def test_setting_a_torsion_that_is_no_row_names_it():
    c = _read("1l2y.pdb", ligands=True)  # a Complex
    v = int(c.torsion_rows()["psi"][3])  # the next N, whose row is psi of residue 3
    ri, names = c.parsed.residue, c.atom_names
    cb = int(np.flatnonzero((ri == 3) & (names == "CB"))[0])
    refs = c.parsed.refs.copy()
    refs[v, 2] = cb  # (C, CA, CB): still exact, no longer psi
    c2 = Complex(dataclasses.replace(c.parsed, refs=refs))
    t = torch.full((len(c),), torch.nan, dtype=torch.float64)
    c2.internal_with_torsions({"psi": t})  # NaN: nothing set
    t[3] = 1.0
    msg = rf"'psi' of chain A residue {c.res_names[3]} 4 .*not a degree of freedom"
    with pytest.raises(ValueError, match=msg):
        c2.internal_with_torsions({"psi": t})
    with pytest.raises(ValueError, match="not a degree of freedom"):
        c2.xyz_from_torsions({"psi": t}, geometry="ideal")
    t[3] = torch.nan
    t[4] = 1.0
    x = c2.xyz_from_torsions({"psi": t})
    assert abs(float(c2.measure_torsions(x)["psi"][4]) - 1.0) < 1e-9


def test_long_chain_ids_and_same_numbered_residues_survive():
    import biotite.structure as struc

    a = read_atoms(os.path.join(DATA, "1bna.cif"))
    r5 = a[(a.res_id == 5) & (a.chain_id == "A")].copy()
    r5.coord += 8.0
    i = int(np.flatnonzero((a.res_id == 5) & (a.chain_id == "A"))[-1]) + 1
    twice = struc.concatenate([a[:i], r5, a[i:]])  # residue A5 twice, same name
    with pytest.warns(UserWarning, match=r"DA A5.*appears again"):
        from_structure(twice)
    r5.res_name[:] = "DC"  # the same number, another name (biotite's 1xnr has U129 / G129)
    with pytest.warns(UserWarning, match=r"chain A residue 5 DC: atoms \['N9', 'C8', 'N7', 'N6'\]"):
        c = from_structure(struc.concatenate([a[:i], r5, a[i:]]))
    c0 = from_structure(a)
    assert len(c.res_names) == len(c0.res_names) + 1 and c.n_atoms == c0.n_atoms + r5.array_length()
    assert list(c.res_names[4:6]) == ["DA", "DC"] and list(c.res_ids[4:6]) == [5, 5]
    a.chain_id = np.full(a.array_length(), "LONGCHAIN", dtype="U12")
    got = from_structure(a, hydrogens=True).to_structure().chain_id
    assert set(got.tolist()) == {"LONGCHAIN"}


def _check_extras(c, names):
    """The extra atoms are ``names`` (chain, residue number, atom), each bonded within its residue
    and hung off an atom of it; the rebuild is exact; to_structure writes them; no torsion has one."""
    p = c.parsed
    ri = p.residue
    got = {(str(c.chain_id[i]), int(c.res_ids[ri[i]]), str(p.atom_names[i])) for i in np.flatnonzero(p.extra)}
    assert got == set(names)
    b = p.bonds[p.extra[p.bonds].any(1)]
    assert (ri[b[:, 0]] == ri[b[:, 1]]).all() and set(np.flatnonzero(p.extra)) <= set(b.ravel().tolist())
    ex = np.flatnonzero(p.extra)
    assert (ri[p.refs[ex, 0]] == ri[ex]).all()
    x = zmat.to_xyz(c.internal, c.table)
    assert float((zmat.superpose(x, c.xyz) - c.xyz).norm(dim=-1).max()) < 1e-10
    s = c.to_structure()
    assert s.array_length() == c.n_atoms and (s.atom_name == p.atom_names).all()
    assert np.allclose(s.coord[ex], p.xyz[ex], atol=1e-4)
    assert not np.isin(c.parsed.quads, ex).any() and not np.isin(c.parsed.ligand_quads, ex).any()


def test_atoms_the_ccd_entry_lacks_are_kept():
    import biotite.structure as struc

    a = read_atoms(os.path.join(DATA, "1bna.cif"))
    m = (a.res_id == 5) & (a.chain_id == "A")
    r5 = a[m].copy()
    r5.res_name[:] = "DC"  # the repro's rename: N6, N7, C8, N9 of the DA are unknown to DC
    r5.coord += 8.0
    i = int(np.flatnonzero(m)[-1]) + 1
    with pytest.warns(UserWarning, match=r"chain A residue 5 DC: atoms \['N9', 'C8', 'N7', 'N6'\] are not"):
        c = from_structure(struc.concatenate([a[:i], r5, a[i:]]))
    _check_extras(c, [("A", 5, n) for n in ("N9", "C8", "N7", "N6")])
    p = c.parsed
    pair = {tuple(sorted(p.atom_names[list(e)].tolist())) for e in p.bonds if p.residue[e[0]] == 5}
    assert {("C1'", "N9"), ("C8", "N9"), ("C8", "N7"), ("C5", "N7"), ("C6", "N6")} <= pair


def test_extra_atoms_of_a_protein_residue_in_a_complex():
    a = read_atoms(os.path.join(DATA, "1l2y.pdb"))
    a.res_name[a.res_id == 8] = "ALA"  # LYS 8 read as ALA: CG, CD, CE, NZ (and their H) are extra
    m3 = (a.res_id == 3) & (a.atom_name == "H")
    a.atom_name[m3] = "HN"  # CHARMM's amide H name
    heavy = a[a.element != "H"]
    with pytest.warns(UserWarning, match=r"chain A residue 8 ALA: atoms \['CG', 'CD', 'CE', 'NZ'\]"):
        c = from_structure(heavy, ligands=True)  # a Complex
    _check_extras(c, [("A", 8, n) for n in ("CG", "CD", "CE", "NZ")])
    pos, mask = c.to_atom37()
    assert mask[7].sum() == 5 and not mask[7, 5]  # ALA: N CA C CB O; no CG in atom37
    t = {k: v + 0.3 for k, v in c.torsions.items() if k in ("phi", "psi", "omega")}
    x = c.xyz_from_torsions(t)
    b = c.parsed.bonds
    assert torch.allclose(_geometry(x, torch.from_numpy(b))[0], _geometry(c.xyz, torch.from_numpy(b))[0])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ch = from_structure(a, hydrogens=True)
    assert any("residue 3 TYR: atoms ['HN']" in str(x.message) for x in w)
    names = [str(x) for x in ch.atom_names[(ch.parsed.residue == 2)]]
    assert "HN" in names and "H" not in names  # the file's HN covers N: no H completed beside it
    hyd = ("HG2", "HG3", "HD2", "HD3", "HE2", "HE3", "HZ1", "HZ2", "HZ3")
    _check_extras(ch, [("A", 3, "HN")] + [("A", 8, n) for n in ("CG", "CD", "CE", "NZ") + hyd])


@pytest.mark.slow
def test_reading_is_linear_in_components():
    import biotite.structure as struc

    base = read_atoms(os.path.join(DATA, "1l2y.pdb"))
    base = base[base.element != "H"]
    times = []
    for n in (2000, 8000):
        ions = struc.AtomArray(n)
        ions.coord = (np.random.default_rng(0).random((n, 3)) * 200).astype(np.float32)
        ions.res_name[:] = "NA"
        ions.atom_name[:] = "NA"
        ions.element[:] = "NA"
        ions.chain_id[:] = "B"
        ions.res_id = np.arange(1, n + 1)
        ions.hetero[:] = True
        t0 = time.process_time()
        c = from_structure(struc.concatenate([base, ions]), ligands=True)
        times.append(time.process_time() - t0)
        refs = c.parsed.refs
        frame = refs[np.flatnonzero(c.atom_names == "NA")]
        assert (frame == frame[0]).all()  # every ion hangs off the same three frame atoms
    assert times[1] < 8 * times[0], times  # linear: 4x; the old quadratic read was ~16x


@pytest.mark.parametrize(
    "name, kw, chain", [("5ugo.cif", {"hydrogens": True}, "A"), ("3o5r.cif", {"ligands": True}, None)]
)
def test_alphafold_tensors_of_a_complex_are_its_proteins(name, kw, chain):
    from zmat.protein import backbone_frames, structural_violations

    atoms = read_atoms(os.path.join(DATA, name))
    c = _read(name, **kw)
    p = from_structure(atoms, chain=chain)  # the protein residues alone: a Protein
    assert type(p).__name__ == "Protein" and type(c).__name__ == "Complex"
    torch.testing.assert_close(c.aatype, p.aatype, rtol=0, atol=0)
    for width in (37, 14):
        (pc, mc), (pp, mp) = (getattr(o, f"to_atom{width}")() for o in (c, p))
        assert torch.equal(mc, mp) and torch.equal(pc, pp.to(pc))
    pos, mask = c.to_atom37()
    for a, b in zip(backbone_frames(pos), backbone_frames(p.to_atom37()[0].to(pos)), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    vc = structural_violations(pos, c.aatype, mask)
    vp = structural_violations(p.to_atom37()[0].to(pos), p.aatype, p.to_atom37()[1])
    for k in ("c_n_loss_mean", "per_residue_violation_mask"):
        torch.testing.assert_close(vc[k], vp[k], rtol=0, atol=0)
    # differentiable in the complex's coordinates
    x = c.xyz.clone().requires_grad_(True)
    c.to_atom37(x)[0].sum().backward()
    assert float(x.grad.abs().sum()) == float(mask.sum() * 3)


def test_extra_deuterium_bonds_as_hydrogen_and_an_unknown_element_is_named():
    """Neutron structures name hydrogens D: an extra D bonds to its nearest heavy atom like an H
    (ASE has no radius for "D": it was a KeyError); an element with no radius names its atom."""
    import biotite.structure as struc

    a = read_atoms(os.path.join(DATA, "1bna.cif"))
    m = (a.res_id == 5) & (a.chain_id == "A")
    i = int(np.flatnonzero(m)[-1]) + 1
    d = a[[int(np.flatnonzero(m & (a.atom_name == "C8"))[0])]].copy()
    d.atom_name[:], d.element[:] = "D8", "D"
    d.coord += np.array([0.0, 0.0, 1.08], np.float32)
    with pytest.warns(UserWarning, match=r"chain A residue 5 DA: atoms \['D8'\]"):
        c = from_structure(struc.concatenate([a[:i], d, a[i:]]), hydrogens=True)
    _check_extras(c, [("A", 5, "D8")])
    p = c.parsed
    (k,) = np.flatnonzero(p.extra)
    bonded = {int(j) for e in p.bonds if k in e for j in e if j != k}
    assert [str(p.atom_names[j]) for j in bonded] == ["C8"]
    d.element[:] = "QQ"
    with pytest.raises(ValueError, match=r"chain A residue 5 DA: atom D8 has element '(QQ|Qq)'"):
        from_structure(struc.concatenate([a[:i], d, a[i:]]), hydrogens=True)
