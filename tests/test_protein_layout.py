"""zmat.protein.layout: the vectorised layout equals the original per-atom
implementation (kept verbatim in tests/reference/protein_layout.py) on sequences, batches,
missing atoms, chain breaks, forests and real files."""

import dataclasses
import string
from pathlib import Path

import numpy as np
import pytest
import torch
from reference.protein_layout import reference_from_structure, reference_layout

import zmat
import zmat.protein as zp
from zmat import rmsd
from zmat.protein.layout import N_TORSIONS
from zmat.protein.topology import RESIDUES
from zmat.table import OFFSET, POSITIONAL, PROPER

DATA = Path(__file__).parent / "data"
ALL20 = "ARNDCQEGHILKMFPSTWYV"
FIELDS = "res_names atom_names elements residue_index refs bonds ideal ideal_mask torsion_slot torsion_atoms"
FIELDS = (FIELDS + " bonded").split()


# ------------------------------------------------------------------ tests
def assert_same_layout(got, want):
    for f in FIELDS:
        g, w = getattr(got, f), getattr(want, f)
        assert g.dtype == w.dtype, f
        assert g.shape == w.shape, f
        if g.dtype.kind == "f":
            assert np.array_equal(g, w, equal_nan=True), f
        else:
            assert np.array_equal(g, w), f


def _random_sequence(rng, n):
    return "".join(rng.choice(list(ALL20), n))


@pytest.mark.parametrize("seq", ["A", "G", "P", "GP", "PG", ALL20, ALL20[::-1] * 3, "W" * 7])
def test_sequences_equal_reference(seq):
    zp.protein_layout.cache_clear()
    got = zp.protein_layout(seq)
    assert_same_layout(got, reference_layout(zp.one_to_three(seq)))
    assert_same_layout(zp.layout_of(zp.one_to_three(seq)), got)
    assert_same_layout(zp.protein_layout(seq.lower()), got)


def test_empty_and_unknown():
    assert zp.layout_of([]).n_atoms == 0
    with pytest.raises(ValueError, match="'XYZ' is not one"):
        zp.layout_of(["ALA", "XYZ"])
    with pytest.raises(ValueError, match="'B' at position 1"):
        zp.protein_layout("AB")
    with pytest.raises(ValueError, match="position 1"):
        zp.protein_layout("Aé")


@pytest.mark.parametrize("seed", range(12))
def test_random_layouts_equal_reference(seed):
    """Random residues, missing atoms, breaks, forests and extra bonds."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 40))
    names = zp.one_to_three(_random_sequence(rng, L))
    drop = [0.0, 0.05, 0.2, 0.6][seed % 4]
    present = None
    if drop:
        present = []
        for r in names:
            atoms = [a for a in RESIDUES[r].atoms if rng.random() > drop]
            if rng.random() < 0.3:
                atoms.append("XX")  # not a template atom: ignored
            rng.shuffle(atoms)
            present.append(atoms)
    bonded = rng.random(L) > [0.0, 0.1, 0.3][seed % 3] if seed % 5 else None
    linked = rng.random(L) > [0.0, 0.1, 0.5][seed % 3] if seed % 2 else None
    extra = rng.integers(0, 5, (3, 2)) if seed % 3 == 0 else None
    want = reference_layout(names, present, bonded, linked, extra)
    assert_same_layout(zp.layout_of(names, present, bonded, linked, extra), want)


def test_virtual_links_equal_reference():
    """Residues reduced to side chains: parents found by the virtual-link scan."""
    names = zp.one_to_three("WKRFYHEQMLIV")
    for keep in (["CB", "CG", "CD", "NE", "CZ"], ["CD1", "CE2", "CZ"], ["O", "NZ", "OH"]):
        present = [[a for a in RESIDUES[r].atoms if a in keep or a in ("N",)] for r in names]
        present[0] = ["CA"]
        for linked in (None, [k % 3 != 0 for k in range(len(names))]):
            want = reference_layout(names, present, None, linked)
            assert_same_layout(zp.layout_of(names, present, None, linked), want)
        nobb = [[a for a in RESIDUES[r].atoms if a not in ("N", "CA", "C")] for r in names]
        assert_same_layout(zp.layout_of(names, nobb), reference_layout(names, nobb))
    # the backward scan skips the depth-1 CB for the depth-2 O
    names, present = ["LYS", "ALA", "GLY"], [["CA", "C", "O", "CB"], ["CB"], ["O"]]
    got = zp.layout_of(names, present)
    assert_same_layout(got, reference_layout(names, present))
    assert got.refs[4, 0] == 2


@pytest.mark.parametrize("with_empty", [False, True])
def test_batch_equals_reference(with_empty):
    """ProteinBatch's layouts and padded arrays equal the original loop over
    the reference layouts."""
    rng = np.random.default_rng(7)
    seqs = [_random_sequence(rng, int(rng.integers(1, 60))) for _ in range(6)] + ["W"]
    if with_empty:
        seqs.insert(2, "")
    zp.protein_layout.cache_clear()
    batch = zp.ProteinBatch(seqs)
    layouts = [reference_layout(zp.one_to_three(s)) for s in seqs]
    for s, got, want in zip(seqs, batch.layouts, layouts, strict=True):
        assert_same_layout(got, want)
        assert_same_layout(zp.protein_layout(s), want)
    B, n, Lm = len(seqs), batch.N_max, batch.L_max
    assert n == max(lay.n_atoms for lay in layouts) and Lm == max(map(len, seqs))
    refs = np.full((B, n, 3), -1, np.int64)
    ideal = np.zeros((B, n, 3))
    mask = np.zeros((B, n, 3), bool)
    slot = np.full((B, n), -1, np.int64)
    atom_mask = torch.zeros(B, n, dtype=torch.bool)
    residue_mask = torch.zeros(B, Lm, dtype=torch.bool)
    atom_names = np.full((B, n), "", "U4")
    elements = np.full((B, n), "", "U2")
    residue_index = torch.full((B, n), -1, dtype=torch.long)
    for b, lay in enumerate(layouts):
        m = lay.n_atoms
        refs[b, :m] = np.where(lay.refs >= 0, lay.refs + b * n, -1)
        ideal[b, :m] = lay.ideal
        mask[b, :m] = lay.ideal_mask
        s = lay.torsion_slot
        k, t = s // N_TORSIONS, s % N_TORSIONS
        slot[b, :m] = np.where(s >= 0, ((b * Lm + k) * N_TORSIONS + t), -1)
        atom_mask[b, :m] = True
        residue_mask[b, : lay.n_residues] = True
        atom_names[b, :m] = lay.atom_names
        elements[b, :m] = lay.elements
        residue_index[b, :m] = lay.tensor("residue_index")
    assert np.array_equal(batch.table.refs, refs.reshape(-1, 3))
    assert np.array_equal(batch._flat.ideal, ideal.reshape(-1, 3), equal_nan=True)
    assert np.array_equal(batch._flat.ideal_mask, mask.reshape(-1, 3))
    assert np.array_equal(batch._flat.torsion_slot, slot.reshape(-1))
    assert batch._flat.n_residues == B * Lm
    assert torch.equal(batch.atom_mask, atom_mask) and torch.equal(batch.residue_mask, residue_mask)
    assert torch.equal(batch.residue_index, residue_index)
    assert np.array_equal(batch.atom_names, atom_names) and np.array_equal(batch.elements, elements)


def _assert_same_protein(got, want):
    assert_same_layout(got.layout, want.layout)
    assert np.array_equal(got.xyz.numpy(), want.xyz.numpy())
    for f in ("res_ids", "ins_codes", "res_chain_ids", "chain_id"):
        assert np.array_equal(getattr(got, f), getattr(want, f)), f
    assert got.sequence == want.sequence


@pytest.mark.parametrize("name", ["1l2y.pdb", "1aki.cif", "7pfl.pdb", "1igy.pdb", "3wip.pdb", "1ubi.pdb"])
def test_files_equal_reference(name):
    from biotite.structure.io import pdb, pdbx

    path = DATA / name
    if name.endswith(".cif"):
        arr = pdbx.get_structure(pdbx.CIFFile.read(path), model=1)
    else:
        arr = pdb.PDBFile.read(path).get_structure(model=1)
    _assert_same_protein(zp.from_structure(arr), reference_from_structure(arr))


@pytest.mark.parametrize("seed", range(6))
def test_damaged_structures_equal_reference(seed):
    """Dropped atoms, duplicated names, renamed and split chains."""
    import biotite.structure as struc

    arr = zp.from_pdb(DATA / "1ubi.pdb").to_structure()
    rng = np.random.default_rng(seed)
    keep = rng.random(arr.array_length()) > [0.02, 0.15, 0.5][seed % 3]
    keep[:3] = seed % 2 == 0
    arr = arr[keep]
    if seed >= 2:  # a duplicate of some atoms, placed right after their residue mates
        dup = arr[rng.random(arr.array_length()) < 0.05]
        dup.coord += 0.5
        arr = struc.concatenate([arr, dup])
        order = np.lexsort((np.arange(arr.array_length()), arr.res_id))
        arr = arr[order]
    if seed >= 4:  # second half in another chain, and a long C-N gap
        arr.chain_id[arr.res_id > 40] = "B"
        arr.coord[arr.res_id > 60] += 3.0
    _assert_same_protein(zp.from_structure(arr), reference_from_structure(arr))


def test_multichain_assembly_equals_reference():
    import biotite.structure as struc
    from biotite.structure.io import pdb

    arr = pdb.PDBFile.read(DATA / "1aki.pdb").get_structure(model=1)
    copies = []
    for i in range(5):
        a = arr.copy()
        a.chain_id[:] = string.ascii_uppercase[i]
        a.coord += 60.0 * i
        copies.append(a)
    arr = struc.concatenate(copies)
    _assert_same_protein(zp.from_structure(arr), reference_from_structure(arr))


def test_layout_all_rows_canonical():
    lay = zp.protein_layout(ALL20 * 3)
    t = lay.table
    assert not (t.kind == POSITIONAL).any()
    assert ((t.kind == PROPER) | (t.kind == OFFSET)).sum() == lay.n_atoms - 3
    assert lay.ideal_mask[3:].all()  # every row but the first three atoms' unused columns
    assert (lay.atom_names == "OXT").sum() == 1 and lay.atom_names[-1] == "OXT"
    # every torsion slot is used exactly once, except phi_0 and omega_{L-1}
    slots = np.sort(lay.torsion_slot[lay.torsion_slot >= 0])
    assert len(np.unique(slots)) == len(slots)


@pytest.mark.parametrize("seed", range(4))
def test_missing_atoms_fallbacks(seed):
    """Dropping random atoms (backbone included) keeps an exact, positional-free table."""
    p = zp.from_pdb(DATA / "1ubi.pdb")
    arr = p.to_structure()
    rng = np.random.default_rng(seed)
    keep = rng.random(arr.array_length()) > 0.15
    keep[:3] = seed % 2 == 0  # sometimes without the first N, CA, C
    q = zp.from_structure(arr[keep])
    assert not (q.table.kind == POSITIONAL).any()
    assert rmsd(zmat.to_xyz(q.internal, q.table), q.xyz) < 1e-6
    assert torch.isfinite(zmat.to_xyz(q.ideal_internal(), q.table)).all()


def test_layout_is_immutable_and_its_tensors_shared():
    """A cached layout cannot be changed through its fields or arrays."""
    lay = zp.protein_layout("MKCW")
    assert zp.protein_layout("MKCW") is lay
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.bonds = lay.bonds[:1]
    for f in FIELDS:
        arr = getattr(lay, f)
        with pytest.raises(ValueError, match="read-only"):
            arr[:1] = arr[:1]
    for lay_b in zp.ProteinBatch(["MKCW", "GA"]).layouts + [zp.from_pdb(DATA / "1aki.pdb").layout]:
        with pytest.raises(ValueError, match="read-only"):
            lay_b.refs[0, 0] = 1
    t = lay.tensor("torsion_atoms")
    assert lay.tensor("torsion_atoms") is t and lay.tensor("torsion_atoms", "cpu") is t
    assert t.dtype == torch.int64 and np.array_equal(t.numpy(), lay.torsion_atoms)
    assert lay.tensor("ideal").dtype == torch.float64 and lay.tensor("ideal_mask").dtype == torch.bool
    changed = dataclasses.replace(lay, bonds=lay.bonds[:2])
    assert len(changed.bonds) == 2 and len(lay.bonds) > 2 and not changed.bonds.flags.writeable


def test_layout_module_is_not_shadowed():
    import zmat.protein.layout as module

    assert zp.layout is module and module.layout_of is zp.layout_of
