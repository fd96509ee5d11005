"""Nucleotide frames and atoms from frames + torsions (RhoFold's convention), on real files."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import zmat
from zmat.structure import nucleic_frames as nf

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module", params=["4p5j.cif", "1bna.cif", "5ugo.cif"])
def nucleotides(request):
    pos, mask, restype, residue = nf.nucleotide_positions(zmat.protein.from_pdb(DATA / request.param))
    return request.param, pos, mask, restype


def _wrap(x):
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


def test_matches_rhofold_own_atoms():
    """RhoFold's ``RNAConverter.build_cords`` on 4p5j's frames and random torsions
    (``make_rhofold_reference.py``); its float32 and 1e-4 norm epsilon bound the agreement."""
    ref = np.load(DATA / "rhofold_reference.npz")
    restype = torch.tensor([nf.NUCLEIC_RESTYPES.index(s) for s in str(ref["seq"])])
    pos, mask = nf.nucleotide_atoms_from_frames(
        torch.from_numpy(ref["R"]), torch.from_numpy(ref["t"]), restype, torch.from_numpy(ref["torsions"])
    )
    assert torch.equal(mask, torch.from_numpy(ref["mask"]))
    err = (pos - torch.from_numpy(ref["atoms"])).norm(dim=-1)[mask]
    assert len(err) == int(ref["mask"].sum()) > 1500
    assert err.max() < 5e-3


def test_frames_and_torsions_round_trip(nucleotides):
    """Atoms built from the file's frames and random torsions give back those frames and torsions
    (to RhoFold's tables' rounding: its N9 at y = -1e-6, its quads' fourth atoms up to 1.7e-4 A
    off their groups' xy plane)."""
    _, pos, _, restype = nucleotides
    R, t = nf.nucleotide_frames(pos)
    tor = torch.empty(len(restype), 4, dtype=torch.float64).uniform_(-math.pi, math.pi)
    built, mask = nf.nucleotide_atoms_from_frames(R, t, restype, tor)
    R2, t2 = nf.nucleotide_frames(built)
    assert torch.allclose(R2, R, atol=1e-5) and torch.allclose(t2, t, atol=1e-10)
    assert _wrap(nf.nucleotide_torsions(built, restype, mask) - tor).abs().max() < 3e-4


# per atom group, the largest rebuild error (A) measured on 4p5j / 1bna / 5ugo, with a margin
_TOL = {"frame": 1.0, "base": 0.6, "sugar": 3.0, "O5'": 2.3, "phosphate": 4.0}
# measured 0.551 (with its modified A23, whose OP1/OP2 are named the other way round; 0.534 without),
# 0.715, 0.734
_RMSD = {"4p5j.cif": 0.57, "1bna.cif": 0.73, "5ugo.cif": 0.75}


def test_rebuild_from_file_frames_and_torsions(nucleotides):
    """The file's frames and torsions rebuild every nucleotide heavy atom it has (RhoFold's rigid
    ideal groups: the error is the file's departure from them)."""
    name, pos, mask, restype = nucleotides
    R, t = nf.nucleotide_frames(pos)
    built, has = nf.nucleotide_atoms_from_frames(R, t, restype, nf.nucleotide_torsions(pos, restype, mask))
    assert not (mask & ~has).any()  # every atom of the file has a slot that is built
    err = (built - pos).norm(dim=-1)
    group = nf._tensors(torch.float64, torch.device("cpu"))[1][restype]
    assert err[:, 1][mask[:, 1]].max() < 1e-12  # C1' is the origin
    for g, key in enumerate(_TOL):
        assert err[mask & (group == g)].max() < _TOL[key], key
    assert err[mask].square().mean().sqrt() < _RMSD[name]


def test_gradcheck_small():
    pos, mask, restype, _ = nf.nucleotide_positions(zmat.protein.from_pdb(DATA / "1bna.cif"))
    R, t = nf.nucleotide_frames(pos[:3])
    tor = nf.nucleotide_torsions(pos[:3], restype[:3], mask[:3]).nan_to_num(0.3)

    def f(R, t, tor):
        return nf.nucleotide_atoms_from_frames(R, t, restype[:3], tor)[0]

    args = [x.clone().requires_grad_() for x in (R, t, tor)]
    assert torch.autograd.gradcheck(f, args)
    pos_in = pos[:2].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda p: nf.nucleotide_torsions(p, restype[:2]), (pos_in,))


def test_batch_shapes_match_single():
    pos, mask, restype, _ = nf.nucleotide_positions(zmat.protein.from_pdb(DATA / "4p5j.cif"))
    pos = pos[:7]
    R, t = nf.nucleotide_frames(pos)
    tor = torch.randn(2, 3, 7, 4, dtype=torch.float64)
    out, m = nf.nucleotide_atoms_from_frames(R.expand(2, 3, 7, 3, 3), t.expand(2, 3, 7, 3), restype[:7], tor)
    assert out.shape == (2, 3, 7, 23, 3) and m.shape == (2, 3, 7, 23)
    one, _ = nf.nucleotide_atoms_from_frames(R, t, restype[:7], tor[1, 2])
    assert torch.allclose(out[1, 2], one, atol=1e-12)
    assert nf.nucleotide_torsions(out, restype[:7]).shape == (2, 3, 7, 4)


def test_terminal_nucleotide_without_phosphate_is_finite():
    """1bna's 5' ends have no P: torsion 3 is NaN, the default is used, values and gradients finite."""
    pos, mask, restype, _ = nf.nucleotide_positions(zmat.protein.from_pdb(DATA / "1bna.cif"))
    tor = nf.nucleotide_torsions(pos, restype, mask)
    assert torch.isnan(tor[0, 3]) and not mask[0, nf.NUCLEIC_ATOM_NAMES["DC"].index("P")]
    tor = tor.clone().requires_grad_()
    R, t = nf.nucleotide_frames(pos)
    out, has = nf.nucleotide_atoms_from_frames(R, t, restype, tor)
    assert torch.isfinite(out).all() and has[0, nf.NUCLEIC_ATOM_NAMES["DC"].index("P")]
    out.sum().backward()
    assert torch.isfinite(tor.grad).all() and tor.grad[0, 3] == 0
    # a degenerate frame (all atoms absent) is finite too
    zero = torch.zeros(1, 23, 3, dtype=torch.float64, requires_grad=True)
    R0, t0 = nf.nucleotide_frames(zero)
    out0, _ = nf.nucleotide_atoms_from_frames(R0, t0, restype[:1], torch.zeros(1, 4, dtype=torch.float64))
    out0.sum().backward()
    assert torch.isfinite(out0).all() and torch.isfinite(zero.grad).all()


def test_positions_keep_only_standard_nucleotides():
    c = zmat.protein.from_pdb(DATA / "5ugo.cif")
    pos, mask, restype, residue = nf.nucleotide_positions(c)
    names = [str(c.res_names[i]) for i in residue.tolist()]
    assert len(names) == sum(str(n) in nf.NUCLEIC_RESTYPES for n in c.res_names) > 0
    assert names == [nf.NUCLEIC_RESTYPES[k] for k in restype.tolist()]
    keep = np.isin(c.residue_index.numpy(), residue.numpy())
    op3 = int((c.atom_names[keep] == "OP3").sum())  # a 5' phosphate's third O: not in RhoFold's layout
    assert op3 == 1 and int(mask.sum()) == int(keep.sum()) - op3


def test_bad_input():
    R, t = torch.eye(3).expand(2, 3, 3), torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"\(\.\.\., L, 4\)"):
        nf.nucleotide_atoms_from_frames(R, t, [0, 1], torch.zeros(2, 3))
    with pytest.raises(ValueError, match="restype"):
        nf.nucleotide_atoms_from_frames(R, t, [0, 1, 2], torch.zeros(2, 4))
    with pytest.raises(ValueError, match="23, 3"):
        nf.nucleotide_frames(torch.zeros(2, 22, 3))
    with pytest.raises(TypeError):
        nf.nucleotide_frames(np.zeros((2, 23, 3)))
