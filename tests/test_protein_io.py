"""zmat.protein.io: reading PDB / mmCIF (models, altlocs, insertion codes,
chains, breaks, disulfides) and writing them back."""

from pathlib import Path

import numpy as np
import pytest
import torch
from biotite.structure.io import pdb
from reference.protein_layout import reference_disulfides

import zmat
import zmat.protein as zp
from zmat import rmsd

DATA = Path(__file__).parent / "data"


def test_pdb_and_cif_agree():
    a, b = zp.from_pdb(DATA / "1aki.pdb"), zp.from_pdb(DATA / "1aki.cif")
    assert a.sequence == b.sequence and (a.atom_names == b.atom_names).all()
    assert torch.equal(a.xyz, b.xyz)
    assert a.table == b.table


def test_nmr_models_and_hydrogens():
    f = DATA / "1l2y.pdb"
    p1, p5 = zp.from_pdb(f), zp.from_pdb(f, model=5)
    assert p1.sequence == "NLYIQWLKDGGPSSGRPPPS" and p1.n_atoms == 304 - 150
    assert p1.table == p5.table and not torch.equal(p1.xyz, p5.xyz)
    stack = pdb.PDBFile.read(f).get_structure()
    assert stack.stack_depth() == 38
    for m in (1, 20, 38):
        p = zp.from_pdb(f, model=m)
        assert rmsd(zmat.to_xyz(p.internal, p.table), p.xyz) < 1e-6


def test_altlocs_and_truncated_side_chains():
    p = zp.from_pdb(DATA / "7pfl.pdb")
    assert len(p) == 305 and "OXT" not in p.atom_names
    for resid, name in ((47, "GLU"), (154, "TYR")):
        k = int(np.nonzero(p.res_ids == resid)[0][0])
        assert p.res_names[k] == name
        names = p.atom_names[(p.residue_index == k).numpy()].tolist()
        assert names == ["N", "CA", "C", "O", "CB"]
        assert torch.isnan(p.torsions["chi1"][k])
    # first altloc: the coordinates of the "A" conformers
    arr = pdb.PDBFile.read(DATA / "7pfl.pdb").get_structure(model=1, altloc="all", extra_fields=[])
    sel = (arr.res_id == 26) & (arr.atom_name == "OG1") & (arr.altloc_id == "A")
    j = int(np.nonzero((p.atom_names == "OG1") & (p.res_ids[p.residue_index.numpy()] == 26))[0][0])
    assert np.allclose(p.xyz[j].numpy(), arr.coord[sel][0], atol=1e-4)
    assert zp.from_pdb(DATA / "7pfl.pdb", altloc="occupancy").n_atoms == p.n_atoms


def test_insertion_codes_and_chains():
    p = zp.from_pdb(DATA / "1igy.pdb")
    assert len(p) == 1294 and "".join(dict.fromkeys(p.res_chain_ids.tolist())) == "ABCD"
    assert p.n_breaks == 0 and (p.atom_names == "OXT").sum() == 4
    icodes = {(c, r, i) for c, r, i in zip(p.res_chain_ids, p.res_ids, p.ins_codes, strict=True) if i}
    assert ("B", 82, "C") in icodes and ("D", 52, "A") in icodes
    b = zp.from_pdb(DATA / "1igy.pdb", chain="B")
    assert len(b) == 434 and set(b.chain_id) == {"B"}
    with pytest.raises(ValueError, match="not in the structure"):
        zp.from_pdb(DATA / "1igy.pdb", chain="Q")


def test_chain_breaks():
    p = zp.from_pdb(DATA / "3wip.pdb")
    assert p.n_breaks == 11 and len(set(p.res_chain_ids)) == 10
    inside = p.res_chain_ids[1:] == p.res_chain_ids[:-1]
    brk = np.nonzero(inside & ~p.layout.bonded[1:])[0] + 1  # first residue after each break
    assert torch.isnan(p.torsions["phi"][brk]).all()
    assert torch.isnan(p.torsions["psi"][brk - 1]).all() and torch.isnan(p.torsions["omega"][brk - 1]).all()
    # no peptide bond across a break
    bonds = {tuple(sorted(b)) for b in p.layout.bonds.tolist()}
    for k in brk:
        c = np.nonzero((p.residue_index == k - 1).numpy() & (p.atom_names == "C"))[0][0]
        n = np.nonzero((p.residue_index == k).numpy() & (p.atom_names == "N"))[0][0]
        assert (min(c, n), max(c, n)) not in bonds


@pytest.mark.parametrize("suffix", [".pdb", ".cif"])
def test_to_pdb_round_trip(tmp_path, suffix):
    p = zp.from_pdb(DATA / "7pfl.pdb")
    out = tmp_path / f"out{suffix}"
    x = zmat.to_xyz(p.ideal_internal(), p.table)
    p.to_pdb(out, xyz=x)
    q = zp.from_pdb(out)
    assert q.sequence == p.sequence and (q.atom_names == p.atom_names).all()
    assert torch.allclose(q.xyz, x, atol=1e-3)
    assert q.table == p.table
    arr = pdb.PDBFile.read(out).get_structure(model=1) if suffix == ".pdb" else None
    if arr is not None:
        assert arr.array_length() == p.n_atoms


def test_disulfides_equal_reference():
    """SG-SG pairs from the k-d tree equal the all-pairs reference, ties at the cutoff included."""
    rng = np.random.default_rng(3)
    lay = zp.protein_layout("C" * 300)
    sg = np.nonzero(lay.atom_names == "SG")[0]
    xyz = np.zeros((lay.n_atoms, 3))
    xyz[sg] = rng.random((len(sg), 3)) * 12.0
    xyz[sg[1]] = xyz[sg[0]] + (zp.io.DISULFIDE_MAX, 0, 0)  # exactly at the cutoff: not bonded
    got, want = zp.io.disulfide_bonds(xyz, lay), reference_disulfides(xyz, lay)
    assert len(want) > 10 and got.dtype == want.dtype
    assert np.array_equal(got, want)
    for n_sg in (0, 1, 2):
        small = zp.protein_layout("C" * n_sg + "A")
        x = np.zeros((small.n_atoms, 3))
        assert np.array_equal(zp.io.disulfide_bonds(x, small), reference_disulfides(x, small))
