"""Changing a structure's torsions in one call (its own or ideal geometry, breaks kept), and
batches made from Proteins (issue 24)."""

import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import zmat
import zmat.protein as zp

DATA = Path(__file__).parent / "data"
F64 = torch.float64


@pytest.fixture(scope="module", params=["1ubi", "3wip", "7pfl", "1l2y"])
def protein(request):
    return zp.from_pdb(DATA / f"{request.param}.pdb")


def test_own_geometry_round_trip(protein):
    """The structure's own torsions and geometry give its coordinates back, in its frame
    (the ideal rebuild of 1ubi is 2.1 A RMSD away; chains and breaks of 3wip included)."""
    p = protein
    for t in (None, p.torsion_tensor(), torch.full((len(p), 7), torch.nan, dtype=F64)):
        assert (p.xyz_from_torsions(t) - p.xyz).abs().max() < 1e-9
    assert torch.equal(p.internal_from_torsions(), p.internal)
    assert torch.equal(p.internal_from_torsions(geometry="ideal"), p.ideal_internal())


def test_one_torsion_changes_only_what_it_moves(protein):
    """A chi1 turned by 1 rad: only the side chain beyond CB moves, by a rigid rotation
    about CA-CB; every bond length and angle is the structure's own; chi1 reads back."""
    p = protein
    tor = p.torsion_tensor()
    k = int(np.flatnonzero(~torch.isnan(tor[:, 3]).numpy() & (p.layout.res_names != "PRO"))[len(p) // 3 % 5])
    t = tor.clone()
    t[k, 3] += 1.0
    x = p.xyz_from_torsions(t)
    names = p.atom_names
    moved = (p.residue_index.numpy() == k) & ~np.isin(names, ["N", "CA", "C", "O", "CB", "OXT"])
    assert (x[~moved] - p.xyz[~moved]).abs().max() < 1e-9
    assert (x[moved] - p.xyz[moved]).norm(dim=-1).min() > 0.1
    got = p.measure_torsions(x)
    d = torch.remainder(got - t + torch.pi, 2 * torch.pi) - torch.pi
    assert d[~torch.isnan(got)].abs().max() < 1e-9
    c = zmat.to_internal(x, p.table)
    assert (c[:, :2] - p.internal[:, :2]).abs().max() < 1e-9


def test_breaks_stay_breaks():
    """Backbone torsions changed everywhere: the gaps across 3wip's chain breaks (C-N
    distances) stay as in the file; ideal geometry too."""
    p = zp.from_pdb(DATA / "3wip.pdb")
    lay = p.layout
    same_chain = p.res_chain_ids[1:] == p.res_chain_ids[:-1]
    gap = np.flatnonzero(same_chain & ~lay.bonded[1:])  # residue k, k + 1 not bonded
    assert len(gap) >= 5
    atom = {
        (int(r), str(a)): i for i, (r, a) in enumerate(zip(lay.residue_index, lay.atom_names, strict=True))
    }
    pairs = [(atom[k, "C"], atom[k + 1, "N"]) for k in gap if (k, "C") in atom and (k + 1, "N") in atom]
    c, n = torch.tensor(pairs).T
    g = torch.Generator().manual_seed(0)
    t = p.torsion_tensor() + 0.3 * torch.randn(len(p), 7, generator=g, dtype=F64)
    for geometry in ("own", "ideal"):
        x = p.xyz_from_torsions(t, geometry=geometry)
        assert ((x[c] - x[n]).norm(dim=-1) - (p.xyz[c] - p.xyz[n]).norm(dim=-1)).abs().max() < 1e-9


def test_own_geometry_keeps_proline_rings_closed():
    p = zp.from_pdb(DATA / "7pfl.pdb")
    rows = p.layout.proline_rows
    n = p.layout.refs[rows[:, 0], 0]
    t = p.torsion_tensor().clone()
    res = p.layout.residue_index[rows[:, 2]]
    t[res, 3] = -t[res, 3]  # flip every pucker's chi1 (and chi2)
    t[res, 4] = -t[res, 4]
    x = p.xyz_from_torsions(t)
    own = (p.xyz[rows[:, 3]] - p.xyz[n]).norm(dim=-1)
    assert ((x[rows[:, 3]] - x[n]).norm(dim=-1) - own).abs().max() < 1e-9
    assert (x[rows[:, 3]] - p.xyz[rows[:, 3]]).norm(dim=-1).max() > 0.3  # they did move


def test_gradients_and_batches():
    p = zp.from_pdb(DATA / "1l2y.pdb")
    t = p.torsion_tensor()
    t = torch.where(torch.isnan(t), 0.0, t).requires_grad_()
    torch.autograd.gradcheck(lambda t: p.xyz_from_torsions(t)[::7], (t,))
    tb = torch.stack([t.detach(), t.detach() + 0.2])
    xb = p.xyz_from_torsions(tb)
    assert xb.shape == (2, p.n_atoms, 3)
    assert torch.allclose(xb[1], p.xyz_from_torsions(tb[1]), atol=1e-12)
    q = p.with_torsions(tb[1])
    assert isinstance(q, zp.Protein) and torch.equal(q.xyz, p.xyz_from_torsions(tb[1]))
    with pytest.raises(ValueError, match="geometry"):
        p.internal_from_torsions(geometry="measured")


# --------------------------------------------------------------- from_proteins
def test_batch_from_proteins():
    ps = [zp.from_pdb(DATA / f"{n}.pdb") for n in ("1ubi", "1l2y")] + [zp.Protein.from_sequence("GPW")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = zp.ProteinBatch.from_proteins(ps)
    assert batch.sequences == [p.sequence for p in ps]
    assert batch.torsions.shape == batch.torsion_mask.shape == (3, batch.L_max, 7)
    for b, p in enumerate(ps):
        assert torch.equal(batch.torsion_mask[b, : len(p)], ~torch.isnan(p.torsion_tensor()))
        assert torch.isnan(batch.torsions[b, len(p) :]).all()
        want = zp.to_xyz_from_torsions(p.torsion_tensor(), p.sequence)
        assert (batch.to_xyz(batch.torsions)[b, : want.shape[0]] - want).abs().max() < 1e-9
    copy = pickle.loads(pickle.dumps(batch))
    assert torch.equal(copy.torsion_mask, batch.torsion_mask)
    with pytest.raises(TypeError, match="item 1 is a str"):
        zp.ProteinBatch.from_proteins([ps[0], "MKV"])


def test_batch_from_proteins_warns_about_joined_breaks():
    p = zp.from_pdb(DATA / "3wip.pdb")
    with pytest.warns(UserWarning, match=r"protein 1 \(11 breaks, 10 chains\).*joined"):
        zp.ProteinBatch.from_proteins([zp.Protein.from_sequence("MKV"), p])
