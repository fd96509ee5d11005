"""zmat.protein at the edges: unusual but legal input that used to give silently wrong results,
bad input that used to give unclear errors (issue 20)."""

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import zmat
import zmat.protein as zp

DATA = Path(__file__).parent / "data"
F64 = torch.float64


def _rebuild_error(p) -> float:
    x = zmat.to_xyz(p.internal, p.table)
    return float((zmat.superpose(x, p.xyz) - p.xyz).abs().max())


def _pdb_lines(name, keep):
    return [ln for ln in open(DATA / name) if ln.startswith("ATOM") and keep(ln)]


# ------------------------------------------------------------ atom37 input
def test_from_atom37_unresolved_residue_keeps_every_residues_coordinates():
    """A fully masked row mid-chain is left out; the later residues keep their own
    coordinates (they used to take the next rows', 6.9 A off)."""
    p = zp.from_pdb(DATA / "1l2y.pdb")
    pos, mask = p.to_atom37()
    m = mask.clone()
    m[[3, 10]] = False
    q = zp.from_atom37(pos, p.aatype, m)
    keep = [k for k in range(len(p)) if k not in (3, 10)]
    assert q.sequence == "".join(p.sequence[k] for k in keep)
    p37, m37 = q.to_atom37()
    assert torch.equal(m37, m[keep])
    assert torch.equal(p37[m37], pos[keep][m37])
    assert q.res_ids.tolist() == [k + 1 for k in keep]


def test_from_atom37_equal_residue_index_keeps_every_row():
    """Equal consecutive residue numbers (insertion codes) stay separate residues."""
    p = zp.Protein.from_sequence("AAGAA")
    pos, mask = p.to_atom37()
    q = zp.from_atom37(pos, p.aatype, mask, residue_index=[5, 5, 6, 7, 7])
    assert len(q) == 5 and q.sequence == "AAGAA" and q.n_breaks == 0
    assert q.res_ids.tolist() == [5, 5, 6, 7, 7] and q.ins_codes.tolist() == ["", "A", "", "", "A"]
    assert torch.equal(q.to_atom37()[0], pos)


# ----------------------------------------------------------------- PDB input
@pytest.mark.parametrize("missing", [("N",), ("N", "CA"), ("N", "C")])
def test_first_residue_without_backbone_atoms_rebuilds_exactly(tmp_path, missing):
    """A chain whose first residue lacks N (or more): every atom after the tree's first three
    gets a full row (the later children of the root used to be BOND rows along +x: 2.1 A)."""
    lines = _pdb_lines("1ubi.pdb", lambda ln: int(ln[22:26]) <= 8)
    lines = [ln for ln in lines if not (int(ln[22:26]) == 1 and ln[12:16].strip() in missing)]
    (tmp_path / "x.pdb").write_text("".join(lines))
    p = zp.from_pdb(tmp_path / "x.pdb")
    refs = np.asarray(p.table.refs)
    assert (refs[3:] >= 0).all()  # only the first three rows lack references
    assert _rebuild_error(p) < 1e-9


def test_coincident_atoms_warn_name_the_atoms_and_rebuild(tmp_path):
    lines = _pdb_lines("1ubi.pdb", lambda ln: int(ln[22:26]) <= 12)
    lines = [ln[:30] + f"{1.0:8.3f}" * 3 + ln[54:] if int(ln[22:26]) == 6 else ln for ln in lines]
    (tmp_path / "x.pdb").write_text("".join(lines))
    with pytest.warns(UserWarning, match="coincide.*A LYS 6 N / A LYS 6 CA"):
        p = zp.from_pdb(tmp_path / "x.pdb")
    # the rows after the collapsed residue go around it: the rebuild is exact (it was 8.8 A off)
    assert _rebuild_error(p) < 1e-9
    assert (p.xyz_from_torsions() - p.xyz).abs().max() < 1e-9


def test_altloc_letter(tmp_path):
    """``altloc="B"`` takes the B conformers (and a residue's first where it has no B)."""
    from biotite.structure.io import pdb

    arr = pdb.PDBFile.read(DATA / "7pfl.pdb").get_structure(model=1, altloc="all", extra_fields=[])
    for letter in "AB":
        p = zp.from_pdb(DATA / "7pfl.pdb", altloc=letter)
        sel = (arr.res_id == 26) & (arr.atom_name == "OG1") & (arr.altloc_id == letter)
        k = np.flatnonzero((p.res_ids[p.layout.residue_index] == 26) & (p.atom_names == "OG1"))
        assert sel.sum() == 1 and len(k) == 1
        assert np.allclose(p.xyz[k[0]].numpy(), arr.coord[sel][0], atol=1e-3)
    assert torch.equal(zp.from_pdb(DATA / "7pfl.pdb", altloc="A").xyz, zp.from_pdb(DATA / "7pfl.pdb").xyz)
    with pytest.raises(ValueError, match="altloc"):
        zp.from_pdb(DATA / "7pfl.pdb", altloc="AB")


# --------------------------------------------------------- batches, pickling
class _Sequences(torch.utils.data.Dataset):
    def __init__(self, seqs):
        self.seqs = seqs

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i]


@pytest.mark.parametrize("seqs", [["MKV", "ACDEFGHIKL", "W"], ["MKV", "", "ACDEFGHIKL"]])
def test_protein_batch_pickles(seqs):
    """Both paths (stamped, and general with an empty sequence) pickle."""
    batch = zp.ProteinBatch(seqs)
    tor = torch.randn(3, batch.L_max, 7, dtype=F64, generator=torch.Generator().manual_seed(0))
    want = batch.to_xyz(tor)  # its lazy arrays and table made
    copy = pickle.loads(pickle.dumps(batch))
    assert copy.sequences == batch.sequences and torch.equal(copy.to_xyz(tor), want)


def test_protein_batch_as_collate_fn_with_a_worker():
    """``DataLoader(collate_fn=ProteinBatch, num_workers=1)`` (it used to hang: the worker could
    not pickle the batch). ``timeout`` turns a hang into an error."""
    seqs = ["MKV", "ACDEF", "GW", "PPG"]
    loader = torch.utils.data.DataLoader(
        _Sequences(seqs), batch_size=2, collate_fn=zp.ProteinBatch, num_workers=1, timeout=120
    )
    got = [b.sequences for b in loader]
    assert got == [seqs[:2], seqs[2:]]


# ------------------------------------------------------------- clear errors
@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: zp.ProteinBatch([b"ACD"]), TypeError, "sequence 0 is a bytes"),
        (lambda: zp.ProteinBatch("ACD"), TypeError, "list of sequences"),
        (lambda: zp.ProteinBatch([]), ValueError, "non-empty"),
        (lambda: zp.ProteinBatch([""]), ValueError, "every sequence is empty"),
        (lambda: zp.ProteinBatch(["", ""]), ValueError, "every sequence is empty"),
        (lambda: zp.from_structure(None), TypeError, "AtomArray, got NoneType"),
        (lambda: zp.Protein.from_batch(zp.ProteinBatch(["MK"]), 5), ValueError, "b=5"),
        (lambda: zp.Protein.from_batch(zp.ProteinBatch(["MK"]), 0.0), ValueError, "b=0.0"),
        (lambda: zp.Protein.from_batch(["MK"], 0), TypeError, "ProteinBatch"),
        (lambda: zp.backbone_frames(np.zeros((4, 37, 3))), TypeError, "torch.Tensor, got ndarray"),
        (lambda: zp.backbone_frames(torch.zeros(4, 3)), ValueError, "shape"),
    ],
)
def test_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_from_structure_of_a_stack_says_take_a_model():
    from biotite.structure.io import pdb

    stack = pdb.PDBFile.read(DATA / "1l2y.pdb").get_structure()
    with pytest.raises(TypeError, match=r"stack\[0\]"):
        zp.from_structure(stack)
    assert len(zp.from_structure(stack[0])) == 20
    assert len(zp.Protein.from_batch(zp.ProteinBatch(["MK", "ACD"]), -1)) == 3
