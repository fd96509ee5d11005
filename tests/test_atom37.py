"""atom37 / atom14: AlphaFold's constants, its PDB parser, round trips, batches, gradients.

The reference is AlphaFold itself: ``tests/data/alphafold_reference.npz`` holds
the output of ``alphafold.common.protein.from_pdb_string`` and of
``residue_constants`` (written by ``tests/data/make_alphafold_reference.py``,
which needs AlphaFold and is not run here). Where AlphaFold cannot read a file
(several models), biotite is the independent reader.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from biotite.structure.io import pdb

import zmat.protein as zp
from zmat.protein import atom37 as a37
from zmat.testing import DispatchAudit, GrainAudit

DATA = Path(__file__).parent / "data"
REF = np.load(DATA / "alphafold_reference.npz")


def test_constants_are_alphafolds():
    assert a37.ATOM_TYPES == tuple(REF["const_atom_types"].tolist())
    assert a37.RESTYPES == "".join(REF["const_restypes"].tolist())
    for r, name in enumerate(a37.RESTYPE_3):
        names = [n for n in REF["const_atom14_names"][r].tolist() if n]
        assert a37.ATOM14_NAMES[name] == tuple(names), name
    assert [a37.VAN_DER_WAALS_RADIUS[e] for e in "CNOS"] == REF["const_vdw"].tolist()


# AlphaFold's parser takes the highest-occupancy altloc (Biopython); 1ubi and
# 1aki have none, 3wip and 7pfl do.
@pytest.mark.parametrize(
    "name, altloc", [("1ubi", "first"), ("1aki", "first"), ("3wip", "occupancy"), ("7pfl", "occupancy")]
)
def test_atom37_matches_alphafold_parser(name, altloc):
    p = zp.from_pdb(DATA / f"{name}.pdb", altloc=altloc)
    pos, mask = p.to_atom37()
    keep = REF[f"{name}_aatype"] < 20  # AlphaFold keeps waters and ligands as unknown residues
    assert pos.shape == (int(keep.sum()), 37, 3) and pos.dtype == torch.float64
    np.testing.assert_array_equal(p.aatype.numpy(), REF[f"{name}_aatype"][keep])
    np.testing.assert_array_equal(mask.numpy(), REF[f"{name}_mask"][keep] > 0)
    np.testing.assert_array_equal(pos.numpy(), REF[f"{name}_positions"][keep])  # exact: same file values


def test_atom37_matches_biotite_on_nmr_model():
    """1l2y has 38 models, which AlphaFold's parser refuses: check against biotite."""
    p = zp.from_pdb(DATA / "1l2y.pdb")
    pos, mask = p.to_atom37()
    arr = pdb.PDBFile.read(DATA / "1l2y.pdb").get_structure(model=1)
    arr = arr[(arr.element != "H") & ~arr.hetero]
    res = np.unique(arr.res_id, return_inverse=True)[1]
    col = [a37.ATOM_ORDER[n] for n in arr.atom_name]
    np.testing.assert_allclose(pos.numpy()[res, col], arr.coord, atol=0)
    assert mask.sum() == arr.array_length()


@pytest.mark.parametrize("name", ["1ubi", "1aki", "3wip"])
def test_round_trip_atom37_exact(name):
    p = zp.from_pdb(DATA / f"{name}.pdb")
    pos, mask = p.to_atom37()
    chain = np.unique(p.res_chain_ids, return_inverse=True)[1]
    q = zp.from_atom37(pos, p.aatype, mask, residue_index=p.res_ids, chain_index=chain)
    assert q.sequence == p.sequence
    np.testing.assert_array_equal(q.atom_names, p.atom_names)
    assert torch.equal(q.xyz, p.xyz)
    np.testing.assert_array_equal(q.layout.bonded, p.layout.bonded)  # same chain breaks
    pos2, mask2 = q.to_atom37()
    assert torch.equal(pos2, pos) and torch.equal(mask2, mask)


def test_round_trip_atom14_exact():
    p = zp.from_pdb(DATA / "1aki.pdb")
    pos14, mask14 = p.to_atom14()
    pos37, mask37 = p.to_atom37()
    assert mask14.sum() == mask37.sum() - 1  # the C-terminal OXT has no atom14 slot
    q = zp.from_atom14(pos14, p.aatype, mask14)
    assert torch.equal(q.to_atom14()[0], pos14)
    # atom14 <-> atom37 tensors
    back, m = zp.atom14_to_atom37(pos14, p.aatype, mask14)
    mask37[:, a37.ATOM_ORDER["OXT"]] = False
    assert torch.equal(m, mask37)
    assert torch.equal(back, torch.where(mask37[..., None], pos37, 0.0))
    again, m14 = zp.atom37_to_atom14(back, p.aatype, m)
    assert torch.equal(again, pos14) and torch.equal(m14, mask14)


def test_masks_are_residue_types_for_full_residues():
    p = zp.Protein.from_sequence("ACDEFGHIKLMNPQRSTVWY")
    _, mask = p.to_atom37()
    expect = a37.RESTYPE_ATOM37_MASK[p.aatype.numpy()].copy()
    expect[-1, a37.ATOM_ORDER["OXT"]] = True
    np.testing.assert_array_equal(mask.numpy(), expect)
    _, mask14 = p.to_atom14()
    np.testing.assert_array_equal(mask14.numpy(), a37.RESTYPE_ATOM14_MASK[p.aatype.numpy()])
    assert p.aatype.tolist() == ["ARNDCQEGHILKMFPSTWYV".index(c) for c in p.sequence]


def test_batched_and_differentiable():
    p = zp.Protein.from_sequence("MKWC")
    xyz = (p.xyz + 0.1 * torch.randn(2, 3, p.n_atoms, 3, dtype=torch.float64)).requires_grad_()
    pos, mask = p.to_atom37(xyz)
    assert pos.shape == (2, 3, 4, 37, 3)
    assert torch.equal(pos[1, 2], p.to_atom37(xyz[1, 2])[0])
    assert torch.autograd.gradcheck(lambda x: p.to_atom37(x)[0], (xyz[0, 0].detach().requires_grad_(),))
    assert torch.autograd.gradgradcheck(lambda x: p.to_atom14(x)[0], (xyz[0, 0].detach().requires_grad_(),))
    pos.sum().backward()
    assert torch.equal(xyz.grad, torch.ones_like(xyz) * (mask.sum() > 0))  # every atom lands once


def test_protein_batch():
    seqs = ["MKWVHC", "GA", "PYTRE"]
    batch = zp.ProteinBatch(seqs)
    xyz = batch.to_xyz(torch.randn(2, 3, batch.L_max, 7, dtype=torch.float64))
    pos, mask = a37.to_atom37(batch, xyz)
    aatype = a37.aatype_of(batch)
    assert aatype.shape == (3, batch.L_max) and (aatype[1, 2:] == a37.UNK).all()
    assert pos.shape == (2, 3, batch.L_max, 37, 3) and mask.shape == (3, batch.L_max, 37)
    for b, s in enumerate(seqs):
        lay = batch.layouts[b]
        q = zp.Protein(lay, xyz[1, b, : lay.n_atoms])
        ref, ref_mask = q.to_atom37()
        assert torch.equal(pos[1, b, : len(s)], ref) and torch.equal(mask[b, : len(s)], ref_mask)
        assert not mask[b, len(s) :].any()
        assert torch.equal(aatype[b, : len(s)], q.aatype)


def test_no_host_sync():
    p = zp.from_pdb(DATA / "1ubi.pdb")
    xyz = p.xyz.clone().requires_grad_()
    p.to_atom37(xyz)  # builds and caches the index plan
    with DispatchAudit() as audit:
        pos, _ = p.to_atom37(xyz)
        pos14, _ = zp.atom37_to_atom14(pos, p.aatype)
        pos14.sum().backward()
    assert audit.syncs == [], audit.syncs


def test_errors():
    p = zp.Protein.from_sequence("AC")
    pos, mask = p.to_atom37()
    with pytest.raises(ValueError, match="residue 1 has aatype 20"):
        zp.from_atom37(pos, torch.tensor([0, 20]), mask)
    bad = mask.clone()
    bad[0, a37.ATOM_ORDER["SG"]] = True
    with pytest.raises(ValueError, match=r"residue 0 \(ALA\) has no atom SG"):
        zp.from_atom37(pos, p.aatype, bad)
    with pytest.raises(ValueError, match=r"\(\.\.\., L, 37, 3\)"):
        zp.from_atom37(pos[:, :14], p.aatype, mask)
    with pytest.raises(ValueError, match="xyz must have shape"):
        p.to_atom37(torch.zeros(5, 3))
    with pytest.raises(TypeError, match="integer"):
        zp.atom37_to_atom14(pos, p.aatype.double())


def test_batch_to_atom37_with_two_threads_opens_no_parallel_region():
    # the gather by numpy on the CPU with several threads (each op over the batch was a
    # parallel region, waiting for a busy core); the same values and gradients as the
    # torch path (one thread), double backward by torch
    rng = np.random.default_rng(2)
    batch = zp.ProteinBatch(["".join(rng.choice(list(a37.RESTYPES[:20]), 40)) for _ in range(8)])
    xyz = torch.from_numpy(rng.standard_normal((len(batch), batch.N_max, 3)))
    g37 = torch.from_numpy(rng.standard_normal((len(batch), batch.L_max, 37, 3)))
    old = torch.get_num_threads()
    got = {}
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            x = xyz.clone().requires_grad_()
            with GrainAudit() as big:
                pos, mask = zp.atom37.to_atom37(batch, x)
                (g,) = torch.autograd.grad(pos, x, g37)
            got[threads] = (pos, g, big.ops)
        torch.set_num_threads(2)
        small = zp.ProteinBatch(["GP", "MK"])
        f = lambda x: zp.atom37.to_atom37(small, x)[0]  # noqa: E731
        x = torch.rand(2, small.N_max, 3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(f, (x,)) and torch.autograd.gradgradcheck(f, (x,))
    finally:
        torch.set_num_threads(old)
    assert got[2][2] == [] and len(got[1][2]) > 0, (got[2][2], got[1][2])
    torch.testing.assert_close(got[2][0], got[1][0], rtol=0, atol=0)
    torch.testing.assert_close(got[2][1], got[1][1], rtol=0, atol=0)
    assert pos.numel() > GrainAudit.GRAIN and bool((got[2][1] != 0).any())


def test_ambiguous_atoms_are_alphafolds():
    """AlphaFold's ``residue_atom_renaming_swaps`` (alphafold/common/residue_constants.py, the same
    in OpenFold's openfold/np/residue_constants.py), hand-checked in atom14 slots: ASP OD1/OD2 (6, 7),
    GLU OE1/OE2 (7, 8), PHE and TYR CD1/CD2 (6, 7) and CE1/CE2 (8, 9); 12 ambiguous slots in all
    (``restype_atom14_is_ambiguous.sum()``); ARG is not among them."""
    assert a37.RENAMING_SWAPS == {
        "ASP": {"OD1": "OD2"},
        "GLU": {"OE1": "OE2"},
        "PHE": {"CD1": "CD2", "CE1": "CE2"},
        "TYR": {"CD1": "CD2", "CE1": "CE2"},
    }
    swapped = {"ASP": [(6, 7)], "GLU": [(7, 8)], "PHE": [(6, 7), (8, 9)], "TYR": [(6, 7), (8, 9)]}
    expected = np.tile(np.arange(14), (21, 1))
    for name, pairs in swapped.items():
        for i, j in pairs:
            expected[a37.RESTYPE_3.index(name), [i, j]] = j, i
    assert np.array_equal(a37.RESTYPE_ATOM14_ALT, expected)
    assert np.array_equal(a37.RESTYPE_ATOM14_IS_AMBIGUOUS, expected != np.arange(14))
    assert a37.RESTYPE_ATOM14_IS_AMBIGUOUS.sum() == 12


def _naive_alt_is_better(pred, gt, alt, exists, ambiguous, eps=1e-10):
    """AlphaFold's Algorithm 26 one residue at a time (numpy): the twin of the batched version."""
    L = len(gt)
    out = np.zeros(L)
    other = [(m, j) for m in range(L) for j in range(14) if exists[m, j] and not ambiguous[m, j]]
    for i in range(L):
        err = alt_err = 0.0
        for a in np.nonzero(exists[i] & ambiguous[i])[0]:
            for m, j in other:
                dp = np.sqrt(eps + ((pred[i, a] - pred[m, j]) ** 2).sum())
                err += np.sqrt(eps + (dp - np.sqrt(eps + ((gt[i, a] - gt[m, j]) ** 2).sum())) ** 2)
                alt_err += np.sqrt(eps + (dp - np.sqrt(eps + ((alt[i, a] - alt[m, j]) ** 2).sum())) ** 2)
        out[i] = float(alt_err < err)
    return out


def test_renamed_ground_truth_takes_the_prediction_naming():
    """A prediction that names one residue of each ambiguous type the other way (1ubi): exactly those
    residues are renamed, the renamed truth equals the prediction there; on a noisy prediction the
    choice matches a per-residue twin of AlphaFold's algorithm; batched as one by one."""
    p = zp.from_pdb(DATA / "1ubi.pdb")
    gt, mask = p.to_atom14()
    aatype = p.aatype
    alt, alt_mask = zp.atom14_alt_positions(gt, aatype, mask)
    assert torch.equal(alt_mask, mask)
    flip = torch.zeros(len(aatype), dtype=torch.bool)
    for name in ("ASP", "GLU", "PHE", "TYR"):
        flip[int(torch.nonzero(aatype == a37.RESTYPE_3.index(name))[0])] = True
    pred = torch.where(flip[:, None, None], alt, gt)
    out = zp.compute_renamed_ground_truth(pred, gt, aatype, mask)
    assert torch.equal(out["alt_naming_is_better"], flip.double())
    torch.testing.assert_close(out["renamed_atom14_gt_positions"], pred, atol=0, rtol=0)
    assert torch.equal(out["renamed_atom14_gt_exists"], mask.double())
    g = torch.Generator().manual_seed(0)
    noisy = pred + 0.3 * torch.randn(pred.shape, generator=g, dtype=pred.dtype) * mask[..., None]
    got = zp.compute_renamed_ground_truth(noisy, gt, aatype, mask)["alt_naming_is_better"]
    ambiguous = a37.RESTYPE_ATOM14_IS_AMBIGUOUS[aatype.numpy()]
    naive = _naive_alt_is_better(noisy.numpy(), gt.numpy(), alt.numpy(), mask.numpy(), ambiguous)
    assert np.array_equal(got.numpy(), naive) and naive[flip.numpy()].all()
    both = zp.compute_renamed_ground_truth(torch.stack([noisy, gt]), gt.expand(2, -1, -1, -1), aatype, mask)
    assert torch.equal(both["alt_naming_is_better"][0], got) and not both["alt_naming_is_better"][1].any()
