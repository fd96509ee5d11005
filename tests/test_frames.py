"""Backbone frames: AlphaFold's convention and values, torsion-built frames, atoms from frames.

References: AlphaFold's own ``all_atom.atom37_to_frames`` output on the same
files (``tests/data/alphafold_reference.npz``, see ``make_alphafold_reference.py``),
AlphaFold's published ideal ALA coordinates in the backbone frame
(``residue_constants.rigid_group_atom_positions``), the convention's defining
properties (supplement Alg. 21), and zmat's full-chain builder for exactness.
"""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import zmat
import zmat.protein as zp
from zmat.protein.atom37 import atom37_to_atom14

DATA = Path(__file__).parent / "data"
REF = np.load(DATA / "alphafold_reference.npz")
F64 = torch.float64


@pytest.mark.parametrize("name", ["1ubi", "1aki", "3wip"])
def test_frames_match_alphafold(name):
    p = zp.from_pdb(DATA / f"{name}.pdb", altloc="occupancy")
    pos, _ = p.to_atom37()
    R, t = zp.backbone_frames(pos)
    keep = REF[f"{name}_aatype"] < 20
    np.testing.assert_allclose(R.numpy(), REF[f"{name}_frame_rot"][keep], atol=2e-6)  # AlphaFold: float32
    np.testing.assert_allclose(t.numpy(), REF[f"{name}_frame_trans"][keep], atol=1e-5)


def test_frame_convention():
    pos, _ = zp.from_pdb(DATA / "1ubi.pdb").to_atom37()
    R, t = zp.backbone_frames(pos)
    eye = torch.eye(3, dtype=F64).expand_as(R)
    assert torch.allclose(R.transpose(-1, -2) @ R, eye, atol=1e-12)
    assert torch.allclose(torch.linalg.det(R), torch.ones(len(R), dtype=F64))
    local = torch.einsum("lji,laj->lai", R, pos[:, :3] - t[:, None])  # N, CA, C in the frame
    assert torch.equal(t, pos[:, 1])  # origin at CA
    assert torch.allclose(local[:, 2, 1:], torch.zeros(len(R), 2, dtype=F64), atol=1e-12)  # C on the x axis
    assert (local[:, 2, 0] > 1.4).all()  # ... on +x
    assert torch.allclose(local[:, 0, 2], torch.zeros(len(R), dtype=F64), atol=1e-12)  # N in the xy plane
    assert (local[:, 0, 1] > 1.0).all()  # ... on +y
    assert torch.allclose(zp.apply_frames(R, t, local), pos[:, :3], atol=1e-12)


def test_ideal_residue_in_frame_matches_alphafold_literature_positions():
    """AlphaFold's ALA in its backbone frame: N (-0.525, 1.363, 0), C (1.526, 0, 0),
    CB (-0.529, -0.774, -1.205) (``rigid_group_atom_positions``). zmat's
    Engh & Huber geometry differs by a few thousandths of an Angstrom."""
    eye = torch.eye(3, dtype=F64)[None]
    local, mask = zp.atom14_from_frames(eye, torch.zeros(1, 3, dtype=F64), [0], torch.zeros(1, 7, dtype=F64))
    af = torch.tensor([[-0.525, 1.363, 0.0], [0, 0, 0], [1.526, 0, 0], [-0.529, -0.774, -1.205]], dtype=F64)
    assert torch.allclose(local[0, [0, 1, 2, 4]], af, atol=0.02)
    assert mask[0].tolist() == [True] * 5 + [False] * 9


def _ideal_protein(seq, torsions):
    xyz = zp.to_xyz_from_torsions(torsions, seq).detach()
    return zp.Protein(zp.Protein.from_sequence(seq).layout, xyz)


def test_atoms_from_frames_exact_on_ideal_geometry():
    """Frames of a chain built by zmat with ideal geometry, plus its torsions,
    give back every heavy atom (the same geometry, built residue by residue)."""
    seq = "MKWVHCFLIDERNQSTYPGA"
    tor = torch.randn(2, len(seq), 7, dtype=F64, generator=torch.Generator().manual_seed(0)) * 2
    proteins = [_ideal_protein(seq, tor[b]) for b in range(2)]
    ref = torch.stack([p.to_atom14()[0] for p in proteins])
    pos37 = torch.stack([p.to_atom37()[0] for p in proteins])
    R, t = zp.backbone_frames(pos37)
    aatype = zp.Protein.from_sequence(seq).aatype
    pos14, mask = zp.atom14_from_frames(R, t, aatype, tor)
    assert pos14.shape == (2, len(seq), 14, 3)
    assert (pos14 - ref).abs().max() < 1e-10
    p37, m37 = zp.atom37_from_frames(R, t, aatype, tor)
    assert torch.allclose(p37[m37], pos37[m37], atol=1e-10)


def test_atoms_from_frames_on_real_structure():
    """1ubi's frames and torsions rebuild its side chains within ideal-geometry error."""
    p = zp.from_pdb(DATA / "1ubi.pdb")
    pos, mask = p.to_atom37()
    R, t = zp.backbone_frames(pos)
    tor = p.torsion_tensor().clone()
    tor[-1, 1] = (
        zmat.dihedrals(pos[-1], torch.tensor([[0, 1, 2, 4]]))[0] - torch.pi
    )  # psi of the C-terminus, from O
    pos14, m14 = zp.atom14_from_frames(R, t, p.aatype, tor)
    ref14, ref_mask = atom37_to_atom14(pos, p.aatype, mask)
    assert torch.equal(m14 & ref_mask, ref_mask)
    err = (pos14 - ref14).norm(dim=-1)[ref_mask]
    rmsd = err.pow(2).mean().sqrt()
    print(f"1ubi from frames + torsions: RMSD {rmsd:.3f} A, max {err.max():.2f} A")
    assert rmsd < 0.25 and err.max() < 1.5
    assert (pos14[:, 1] - pos[:, 1]).abs().max() < 1e-12  # CA is the origin


def test_nan_torsions_take_the_defaults():
    """Issue 31: the measured C-terminal psi is NaN, so the last O was NaN and structural_violations
    NaN; NaN means "not given" (psi -45 deg, chis the builder's defaults), with a zero gradient."""
    import math

    p = zp.from_pdb(DATA / "1l2y.pdb")
    pos, _ = p.to_atom37()
    R, t = zp.backbone_frames(pos)
    tor = p.torsion_tensor().clone().requires_grad_(True)
    assert torch.isnan(tor[-1, 1])
    pos37, m37 = zp.atom37_from_frames(R, t, p.aatype, tor)
    v = zp.structural_violations(pos37, p.aatype, m37)
    assert torch.isfinite(pos37).all() and torch.isfinite(v["loss"])
    given = torch.nan_to_num(tor.detach(), nan=0.0)
    given[-1, 1] = math.radians(-45.0)
    nan_chi = torch.isnan(tor.detach()[:, 3:])
    given[:, 3:] = torch.where(nan_chi, torch.tensor([-60.0, 180, 180, 180]).deg2rad().double(), given[:, 3:])
    assert torch.equal(pos37, zp.atom37_from_frames(R, t, p.aatype, given)[0])
    (g,) = torch.autograd.grad(pos37.square().sum(), tor)
    assert torch.isfinite(g).all() and g[-1, 1] == 0 and g.abs().sum() > 0
    pro = zp.Protein.from_sequence("GPG")  # proline: NaN chi1, chi2 close the ring (PRO_DEFAULT_CHI)
    x, _ = zp.atom14_from_frames(
        *zp.backbone_frames(pro.to_atom37()[0]), pro.aatype, torch.full((3, 7), torch.nan)
    )
    n_cd = (x[1, 6] - x[1, 0]).norm()
    assert abs(float(n_cd) - 1.47) < 0.05


def test_backbone_frames_from_torsions_exact():
    seq = "ACDEFGHIKL"
    tor = torch.randn(len(seq), 7, dtype=F64, generator=torch.Generator().manual_seed(1)) * 2
    pos, _ = _ideal_protein(seq, tor).to_atom37()
    R, t = zp.backbone_frames(pos)
    R2, t2 = zp.backbone_frames_from_torsions(tor[:, :3], frame0=(R[0], t[0]))
    assert torch.allclose(R2, R, atol=1e-10) and torch.allclose(t2, t, atol=1e-10)
    R3, t3 = zp.backbone_frames_from_torsions(tor)  # default: residue 0 at the identity
    assert torch.allclose(R3[0], torch.eye(3, dtype=F64), atol=1e-12) and t3[0].abs().max() < 1e-12
    rel = R[0].T @ R
    assert torch.allclose(R3, rel, atol=1e-10)
    batch = torch.stack([tor, tor.flip(0)])
    Rb, _ = zp.backbone_frames_from_torsions(batch)
    assert Rb.shape == (2, len(seq), 3, 3) and torch.allclose(Rb[0], R3, atol=1e-12)


def test_gradients():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 3, 3, dtype=F64, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: zp.rigid_from_three_points(x[0], x[1], x[2])[0], (x,))
    assert torch.autograd.gradgradcheck(lambda x: zp.rigid_from_three_points(x[0], x[1], x[2])[0], (x,))
    tor = (torch.randn(4, 3, dtype=F64, generator=g)).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: zp.backbone_frames_from_torsions(t)[0], (tor,))
    assert torch.autograd.gradgradcheck(lambda t: zp.backbone_frames_from_torsions(t)[1], (tor,))
    R, t = zp.backbone_frames(torch.randn(3, 3, 3, dtype=F64, generator=g))
    chis = torch.randn(3, 7, dtype=F64, generator=g)
    args = (R.requires_grad_(), t.requires_grad_(), chis.requires_grad_())
    f = lambda R, t, c: zp.atom14_from_frames(R, t, [1, 13, 17], c)[0]  # noqa: E731  ARG, PHE, TRP
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def test_collinear_backbone_is_finite():
    x = torch.tensor([[-1.0, 0, 0], [0, 0, 0], [1.5, 0, 0]], dtype=F64, requires_grad=True)
    R, t = zp.rigid_from_three_points(x[0], x[1], x[2])
    assert torch.isfinite(R).all() and torch.allclose(R.T @ R, torch.eye(3, dtype=F64))
    R.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_errors():
    with pytest.raises(ValueError, match="backbone_frames"):
        zp.backbone_frames(torch.zeros(5, 3))
    with pytest.raises(ValueError, match="torsions must have shape"):
        zp.backbone_frames_from_torsions(torch.zeros(5, 4))
    R, t = torch.eye(3).expand(2, 3, 3), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="torsions must have shape"):
        zp.atom14_from_frames(R, t, [0, 0], torch.zeros(3, 7))


def test_frames_path_table_from_cached_pieces():
    # issue 23: a new sequence planned its table from scratch (ConstructionTable(refs) and
    # anchors from positions for N, O, CB of every residue); now the per-type tables,
    # validated once, are gathered, and every row is anchored on its parent's frame, so the
    # compiled kernel builds the whole forest
    from zmat.protein.atom37 import RESTYPE_ATOM14_MASK
    from zmat.protein.frames import _forest, _residue_rows

    rng = np.random.default_rng(3)
    aa = np.append(rng.integers(0, 21, 60), [20, 7, 14]).astype(np.int64)  # 20: unknown, no atoms
    table, cells, atom_of = _forest(aa.tobytes(), "cpu")
    refs = _residue_rows()[0][aa] + (np.arange(len(aa)) * 14)[:, None, None]
    compact = np.full(len(aa) * 14 + 1, -1)
    compact[np.flatnonzero(RESTYPE_ATOM14_MASK[aa])] = np.arange(table.n_atoms)
    want = np.where(_residue_rows()[0][aa] >= 0, compact[refs.clip(min=0)], -1).reshape(-1, 3)
    want = want[np.flatnonzero(RESTYPE_ATOM14_MASK[aa])]
    general = zmat.ConstructionTable(want)
    assert np.array_equal(table.refs, general.refs) and np.array_equal(table.kind, general.kind)
    assert table.constant_anchors and general.constant_anchors
    c = torch.rand(table.n_atoms, 3, dtype=F64) + 0.5
    torch.testing.assert_close(zmat.to_xyz(c, table), zmat.to_xyz(c, general, method="reference"))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_new_sequence_plans_nothing_and_keeps_the_forest_bits(dtype, monkeypatch):
    # issue 33: a new sequence planned its forest (ConstructionTable.concatenate, the
    # kernel's plan taken); where the kernel serves, each type's residues are now a batch of
    # its own cached table. Values and gradients equal the forest's (the other devices'
    # route, as before) bit for bit, with prolines, unknowns and NaN torsions.
    from zmat import _kernel
    from zmat.protein import frames

    if _kernel.load() is None:
        pytest.skip("the compiled CPU kernel cannot be built here")
    rng = np.random.default_rng(5)
    shape = (2, 70)
    aa = torch.from_numpy(rng.integers(0, 21, shape))  # 20: unknown
    aa[0, :3] = torch.tensor([14, 14, 20])  # prolines, an unknown
    R = torch.linalg.qr(torch.from_numpy(rng.normal(size=(*shape, 3, 3))))[0].to(dtype)
    t = torch.from_numpy(rng.normal(size=(*shape, 3)) * 10).to(dtype)
    c = torch.from_numpy(rng.uniform(-3, 3, (*shape, 7))).to(dtype)
    c[torch.from_numpy(rng.random(c.shape) < 0.1)] = torch.nan

    def run():
        ins = [x.clone().requires_grad_(True) for x in (R, t, c)]
        pos, mask = zp.atom14_from_frames(ins[0], ins[1], aa, ins[2])
        w = torch.linspace(-1, 1, pos.numel(), dtype=dtype).view(pos.shape)
        return pos, mask, *torch.autograd.grad((pos * w).sum(), ins)

    monkeypatch.setattr(frames, "GROUPED_RESIDUES", 100)
    with monkeypatch.context() as m:
        m.setattr(zmat.ConstructionTable, "concatenate", None)  # planning a forest would fail
        grouped = run()
    with monkeypatch.context() as m:
        m.setattr(frames, "_kernel", SimpleNamespace(usable=lambda x: False))  # the forest (kernel inside)
        forest = run()
    for a, b in zip(grouped, forest, strict=True):
        assert torch.equal(a, b)
