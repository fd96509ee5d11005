"""The all-atom tables stamped from residue templates (zmat/structure/templates.py) equal the
ones grown atom by atom, on real files (every piece stamped: chains with modified and partially
resolved residues, ligands, ions); each residue type and variant is compiled once."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import zmat
from zmat.protein.frames import superpose_on_atoms
from zmat.protein.io import parse_atoms, read_atoms
from zmat.protein.topology import TORSION_NAMES
from zmat.structure import allatom, templates
from zmat.structure.allatom import parse_complex

pytest.importorskip("biotite")

DATA = os.path.join(os.path.dirname(__file__), "data")
FIELDS = ("refs", "bonds", "bond_orders", "quads", "key", "ligand_rows", "ligand_quads", "atom_names", "xyz")


def _parse(name, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_complex(read_atoms(os.path.join(DATA, name)), **kw)


def _check_equal_and_exact(name, monkeypatch, **kw):
    grows = []
    grow = allatom._grow
    monkeypatch.setattr(allatom, "_grow", lambda root, *a: grows.append(root) or grow(root, *a))
    stamped = _parse(name, **kw)
    assert not grows, f"{name} {kw}: {len(grows)} pieces grown atom by atom"  # every piece stamped
    grown = _parse(name, stamped=False, **kw)
    assert grows
    for f in FIELDS:
        a, b = getattr(stamped, f), getattr(grown, f)
        assert a.shape == b.shape and np.array_equal(a, b), f"{name} {kw}: {f} differs"
    table = zmat.ConstructionTable(stamped.refs)
    xyz = torch.from_numpy(stamped.xyz)
    x = zmat.to_xyz(zmat.to_internal(xyz, table), table)
    frame = tuple(int(np.flatnonzero(table.kind == k)[0]) for k in (zmat.table.ROOT, zmat.table.BOND))
    frame += (int(np.flatnonzero(table.kind == zmat.table.PLANAR)[0]),)
    err = (superpose_on_atoms(x, xyz, frame) - xyz).norm(dim=-1).max()
    assert err < 1e-10, f"{name} {kw}: rebuild error {float(err):.1e} A"
    return stamped


@pytest.mark.parametrize(
    "name, kw",
    [
        ("1l2y.pdb", {"hydrogens": True}),  # NMR, every H in the file
        ("1bna.cif", {"hydrogens": True}),  # DNA, two strands
        ("3o5r.cif", {"ligands": True, "hydrogens": True}),  # protein + FK506
        ("4gxy.pdb", {"ligands": True, "hydrogens": True}),  # RNA: partial nucleotides, CCC in-chain
    ],
)
def test_stamped_tables_equal_the_grown_ones(name, kw, monkeypatch):
    _check_equal_and_exact(name, monkeypatch, **kw)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, kw",
    [
        ("1igy.pdb", {"ligands": True}),  # 4 chains joined by disulfides, glycans
        ("4p5j.cif", {"ligands": True}),  # RNA with an in-chain modified residue (A23) and ligands
        ("5ugo.cif", {"ligands": True, "hydrogens": True}),
        ("3wip.pdb", {"ligands": True, "hydrogens": True}),
    ],
)
def test_stamped_tables_equal_the_grown_ones_large(name, kw, monkeypatch):
    _check_equal_and_exact(name, monkeypatch, **kw)


def test_each_residue_variant_is_compiled_once(monkeypatch):
    """A second structure with the same residue variants compiles nothing; a residue with
    extra atoms (bonded by distance) is compiled for itself, uncached (the fallback)."""
    compiled = []
    compile_residue = templates.compile_residue

    def counting(name, *args, res=None):
        compiled.append((name, res is not None))
        return compile_residue(name, *args, res=res)

    monkeypatch.setattr(templates, "compile_residue", counting)
    templates._cached.cache_clear()
    p = _parse("1bna.cif", hydrogens=True)
    assert 0 < len(compiled) < 12 < len(p.res_names)  # 24 nucleotides: 5'/3' ends, inner, per base
    assert not any(own for _, own in compiled)
    before = len(compiled)
    _parse("1bna.cif", hydrogens=True)
    assert len(compiled) == before
    # DA 5 renamed DC: its N9, C8, N7, N6 are extra atoms, its template its own
    atoms = read_atoms(os.path.join(DATA, "1bna.cif"))
    atoms.res_name[(atoms.res_id == 5) & (atoms.chain_id == "A")] = "DC"
    del compiled[:]
    with pytest.warns(UserWarning, match="extra atoms"):
        s = parse_complex(atoms)
    assert [c for c in compiled if c[1]] == [("DC", True)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = parse_complex(atoms, stamped=False)
    for f in FIELDS:
        assert np.array_equal(getattr(s, f), getattr(g, f)), f


@pytest.mark.parametrize("name", ["1l2y.pdb", "1igy.pdb"])  # 1igy: four chains, inter-chain disulfides
def test_protein_is_the_heavy_atom_view_with_the_continue_rule(name):
    """One model: the all-atom structure of a protein file (heavy atoms, no ligands) stamped
    with the break rule "continue" is ``Protein``'s layout (atoms, rows, bonds, torsion atoms);
    with "pieces" only the rows of a later chain's first N, CA, C differ (off the frame)."""
    atoms = read_atoms(os.path.join(DATA, name))
    lay = parse_atoms(atoms).layout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = parse_complex(atoms, breaks="continue")
        pieces = parse_complex(atoms)
    assert np.array_equal(c.atom_names, lay.atom_names) and np.array_equal(c.residue, lay.residue_index)
    assert np.array_equal(c.refs, lay.refs)
    assert {tuple(b) for b in np.sort(c.bonds, 1).tolist()} == {
        tuple(b) for b in np.sort(lay.bonds, 1).tolist()
    }
    assert np.array_equal(c.quads[:, : len(TORSION_NAMES)], lay.torsion_atoms)
    new_piece = np.flatnonzero(
        ~c.linked[c.residue] & (c.residue > 0) & np.isin(c.atom_names, ["N", "CA", "C"])
    )
    assert np.array_equal(np.flatnonzero((pieces.refs != lay.refs).any(1)), new_piece)
    assert (name == "1igy.pdb") == (len(new_piece) == 9)
    with pytest.raises(ValueError, match="breaks must be"):
        parse_complex(atoms, breaks="chains")


def _partially_resolved(name, frac=0.03):
    """``name`` with a ``frac`` of its atoms dropped at random (its first residue kept whole):
    residues missing side-chain and backbone atoms, cut into pieces, and chain breaks."""
    atoms = read_atoms(os.path.join(DATA, name))
    keep = np.random.default_rng(0).random(atoms.array_length()) > frac
    keep[atoms.res_id == atoms.res_id[0]] = True
    return atoms[keep]


@pytest.mark.parametrize("name", ["1aki.pdb", "7pfl.pdb"])
def test_the_views_agree_row_for_row_on_partially_resolved_residues(name):
    """One rule for a missing template parent (the fallback of ``zmat.protein.layout``) and for
    OFFSET siblings: with "continue" the all-atom rows are ``Protein``'s on residues cut into
    pieces by missing atoms too (on the code before, they differed)."""
    atoms = _partially_resolved(name)
    lay = parse_atoms(atoms).layout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = parse_complex(atoms, breaks="continue")
    cut = ~lay.ideal_mask[:, 0] & (lay.atom_names != "N") & (lay.refs[:, 0] >= 0)
    assert cut.sum() > 10  # atoms whose template parent is missing: the case at stake
    assert np.array_equal(c.atom_names, lay.atom_names)
    assert np.array_equal(c.refs, lay.refs)
    assert np.array_equal(c.quads[:, : len(TORSION_NAMES)], lay.torsion_atoms)


def test_a_residue_cut_by_missing_atoms_moves_as_one_with_its_chain():
    """A side-chain piece cut off its residue by a missing atom hangs off its own residue (not
    off the frame as a rigid body of its own): turning the previous residue's psi turns the
    whole residue rigidly, the piece included (on the code before, the piece stayed put)."""
    atoms = _partially_resolved("1aki.pdb")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = parse_complex(atoms)
    lay = parse_atoms(atoms).layout
    cut = np.flatnonzero(~lay.ideal_mask[:, 0] & ~np.isin(lay.atom_names, ["N", "CA", "C", "O"]))
    psi = c.quads[:, TORSION_NAMES.index("psi"), 3]  # the next residue's N
    res = [r for r in np.unique(lay.residue_index[cut]) if r > 0 and psi[r - 1] >= 0]
    assert len(res) >= 3
    table = zmat.ConstructionTable(c.refs)
    xyz = torch.from_numpy(c.xyz)
    internal = zmat.to_internal(xyz, table)
    for r in res:
        moved = internal.clone()
        moved[psi[r - 1], 2] += 0.5
        x = zmat.to_xyz(moved, table)
        own = c.residue == r
        assert (x[own] - xyz[own]).norm(dim=-1).min() > 0.1  # all of the residue moves
        d0, d1 = torch.cdist(xyz[own], xyz[own]), torch.cdist(x[own], x[own])
        assert (d1 - d0).abs().max() < 1e-9, f"residue {r}: its pieces moved apart"


def test_every_torsion_stays_a_row_beside_a_residue_cut_by_missing_atoms():
    """1a8o with 5% of its atoms dropped: GLU 213 loses CG, so its CD hangs off its C beside
    the psi atom, MSE 214's N; psi stays that N's own row (not OFFSET on CD), as does every
    torsion that exists."""
    atoms = read_atoms(os.path.join(DATA, "1a8o_modified.cif"))
    atoms = atoms[np.random.default_rng(0).random(atoms.array_length()) > 0.05]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = parse_complex(atoms)
    q = c.quads[:, : templates.N_DIHEDRALS]
    exists = q[..., 3] >= 0
    is_row = exists & (c.refs[np.maximum(q[..., 3], 0)] == q[..., 2::-1]).all(-1)
    assert exists.sum() > 250 and np.array_equal(is_row, exists)


def _first_residue_without(name, atoms_out, frac=0.0, seed=0):
    """``name`` with its first residue's ``atoms_out`` removed (and a ``frac`` of all atoms)."""
    atoms = read_atoms(os.path.join(DATA, name))
    drop = (atoms.res_id == atoms.res_id[0]) & np.isin(atoms.atom_name, atoms_out)
    drop |= np.random.default_rng(seed).random(atoms.array_length()) < frac
    return atoms[~drop]


@pytest.mark.parametrize(
    "name, frac, seed",
    [
        ("1aki.pdb", 0.0, 0),
        ("3o5r.cif", 0.0, 0),
        ("7pfl.pdb", 0.0, 0),
        ("1aki.pdb", 0.3, 1),
        ("1l2y.pdb", 0.3, 2),
    ],
)
def test_the_views_agree_when_the_first_residue_lacks_n_and_ca(name, frac, seed):
    """``Protein`` roots its tree at the first atom (1aki's LYS 1 without N, CA: its C, with
    children O and the next N; 3o5r's first residue: C and O only); the "continue" view keeps
    that root and ``Protein``'s frame rows instead of moving the root to a leaf (on the code
    before, 2-11 rows of the frame differed), and rebuilds the structure exactly."""
    atoms = _first_residue_without(name, ["N", "CA"], frac, seed)
    lay = parse_atoms(atoms).layout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = parse_complex(atoms, breaks="continue")
    assert lay.atom_names[0] != "N" and np.array_equal(c.atom_names, lay.atom_names)
    assert np.array_equal(c.refs, lay.refs)
    assert np.array_equal(c.quads[:, : len(TORSION_NAMES)], lay.torsion_atoms)
    table = zmat.ConstructionTable(c.refs)
    xyz = torch.from_numpy(c.xyz)
    x = zmat.to_xyz(zmat.to_internal(xyz, table), table)
    err = (superpose_on_atoms(x, xyz, (0, 1, 2)) - xyz).norm(dim=-1).max()
    assert err < 1e-10, f"rebuild error {float(err):.1e} A"
