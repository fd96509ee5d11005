"""Proline: its own ideal geometry (Engh & Huber's proline classes) and a closed ring in every path
that builds from torsions (issue 20); per-residue-type rebuild errors on real structures."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import zmat
import zmat.protein as zp
from zmat.protein.atom37 import ATOM14_NAMES, RESTYPE_3, atom37_to_atom14
from zmat.protein.build import PRO_CD_N, proline_cd_angle

DATA = Path(__file__).parent / "data"
F64 = torch.float64
FILES = ["1ubi", "1aki", "3wip", "7pfl", "1igy", "1l2y"]
PRO = RESTYPE_3.index("PRO")


@pytest.fixture(scope="module")
def rebuilt():
    """Per file: the structure's atom14, and atom14 from its frames and measured torsions."""
    out = {}
    for name in FILES:
        p = zp.from_pdb(DATA / f"{name}.pdb", altloc="occupancy")
        pos, mask = p.to_atom37()
        R, t = zp.backbone_frames(pos)
        got, _ = zp.atom14_from_frames(R, t, p.aatype, p.torsion_tensor())
        ref, ref_mask = atom37_to_atom14(pos, p.aatype, mask)
        out[name] = (p.aatype, got, ref, ref_mask)
    return out


def test_per_residue_type_rebuild_errors(rebuilt):
    """Side-chain atoms from backbone frames + measured torsions, RMSD per residue type and
    atom over six structures (1ubi, 1aki, 3wip, 7pfl, 1igy, 1l2y). Proline was 0.21 / 0.35 /
    0.38 A (CB / CG / CD) with the generic N-CA-CB angle and a free CD; OpenFold's ideal
    geometry gives about 0.05 / 0.13 / 0.22 A on similar structures."""
    sq = {}
    for aa, got, ref, m in rebuilt.values():
        err = (got - ref).norm(dim=-1)
        for r in range(20):
            sel = (aa == r)[:, None] & m
            for j in range(4, len(ATOM14_NAMES[RESTYPE_3[r]])):
                e = err[:, j][sel[:, j]]
                sq.setdefault((r, j), []).append(e[~torch.isnan(e)])
    rmsd = {k: float(torch.cat(v).square().mean().sqrt()) for k, v in sq.items() if len(torch.cat(v))}
    for r in range(20):
        name = RESTYPE_3[r]
        row = " ".join(f"{ATOM14_NAMES[name][j]} {v:.2f}" for (q, j), v in rmsd.items() if q == r)
        print(f"{name}: {row}")
    pro = [rmsd[PRO, j] for j in (4, 5, 6)]  # CB, CG, CD
    assert pro[0] < 0.08 and pro[1] < 0.16 and pro[2] < 0.2, pro
    assert max(rmsd[r, 4] for r in range(20) if (r, 4) in rmsd) < 0.1  # every CB
    assert max(rmsd.values()) < 0.8


def test_proline_ring_closes_from_frames(rebuilt):
    """CD-N of every proline built from frames + measured torsions is the ideal 1.473 A
    (it was 1.42-1.92 A, mean 1.73, before the ring was closed)."""
    d = []
    for aa, got, _, m in rebuilt.values():
        sel = (aa == PRO) & m[:, 6]
        d.append((got[sel, 6] - got[sel, 0]).norm(dim=-1))
    d = torch.cat(d)
    print(f"proline CD-N from frames: {len(d)} prolines, {float(d.min()):.4f}-{float(d.max()):.4f} A")
    assert len(d) > 200 and (d - PRO_CD_N).abs().max() < 1e-9


def _puckers(L, *batch, seed=0):
    """Torsions with prolines' chi1/chi2 of real puckers (endo and exo, +-15..38 deg)."""
    g = torch.Generator().manual_seed(seed)
    t = (torch.rand(*batch, L, 7, generator=g, dtype=F64) * 2 - 1) * math.pi
    chi1 = (torch.rand(*batch, L, generator=g, dtype=F64) * 23 + 15) * torch.where(
        torch.rand(*batch, L, generator=g) < 0.5, -1.0, 1.0
    )
    t[..., 3], t[..., 4] = torch.deg2rad(chi1), torch.deg2rad(-1.1 * chi1)
    return t


def _cd_n(xyz, lay):
    names, pro = lay.atom_names, lay.res_names[lay.residue_index] == "PRO"
    cd, n = np.flatnonzero(pro & (names == "CD")), np.flatnonzero(pro & (names == "N"))
    return (xyz[..., cd, :] - xyz[..., n, :]).norm(dim=-1)


@pytest.mark.parametrize("nan", [False, True])
def test_proline_ring_closes_from_torsions(nan):
    """to_xyz_from_torsions (the compiled fill and the torch one) and ProteinBatch close
    every proline ring, also with NaN (default) torsions."""
    seq = "MPKPPGAPWP"
    t = _puckers(len(seq), 3, seed=1)
    if nan:
        t[..., 3:] = torch.nan
    lay = zp.protein_layout(seq)
    x = zp.to_xyz_from_torsions(t, seq)
    assert (_cd_n(x, lay) - PRO_CD_N).abs().max() < 1e-9
    x_torch = zp.to_xyz_from_torsions(t.to(torch.float32), seq)  # float32 too
    assert (_cd_n(x_torch, lay) - PRO_CD_N).abs().max() < 1e-4
    batch = zp.ProteinBatch([seq, "GP", seq[:4]])
    tb = torch.full((3, batch.L_max, 7), torch.nan, dtype=F64)
    tb[0], tb[1, :2], tb[2, :4] = t[0], t[1, :2], t[2, :4]
    xb = batch.to_xyz(tb)
    for b, s in enumerate(batch.sequences):
        lay_b = zp.protein_layout(s)
        assert (_cd_n(xb[b, : lay_b.n_atoms], lay_b) - PRO_CD_N).abs().max() < 1e-9
        want = zp.to_xyz_from_torsions(tb[b, : len(s)], s)
        assert (xb[b, : lay_b.n_atoms] - want).abs().max() < 1e-9


def test_proline_geometry_is_its_own():
    """Proline's template uses Engh & Huber's proline values (N-CA-CB 103.0, N-CA 1.466,
    C-N 1.341, CA-C-N 116.9), the other residues the generic ones."""
    pro, ala = zp.RESIDUES["PRO"], zp.RESIDUES["ALA"]
    assert math.degrees(pro.ideal[pro.index("CB"), 1]) == pytest.approx(103.0)
    assert math.degrees(ala.ideal[ala.index("CB"), 1]) == pytest.approx(110.5)
    assert pro.ideal[pro.index("CA"), 0] == pytest.approx(1.466)
    assert pro.ideal[pro.index("N"), 0] == pytest.approx(1.341)
    assert math.degrees(pro.ideal[pro.index("N"), 1]) == pytest.approx(116.9)


def _args(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    chi1 = torch.deg2rad(torch.linspace(-35, 35, n, dtype=F64))
    chi2 = -1.1 * chi1 + 0.05 * torch.randn(n, generator=g, dtype=F64)
    geo = torch.tensor([1.466, 1.53, math.radians(103), 1.50, math.radians(104.8), 1.51, math.radians(106)])
    return chi1, chi2, *(geo.to(F64)[:, None] + 0.01 * torch.randn(7, n, generator=g, dtype=F64))


def test_proline_cd_angle_gradients():
    args = tuple(a.clone().requires_grad_() for a in _args())
    torch.autograd.gradcheck(proline_cd_angle, args)
    torch.autograd.gradgradcheck(proline_cd_angle, args)
    # out of reach (chi1 = -90, chi2 = 180: no pucker): finite value and gradients
    far = list(_args(3))
    far[0], far[1] = torch.full((3,), -math.pi / 2, dtype=F64), torch.full((3,), math.pi, dtype=F64)
    far = [a.requires_grad_() for a in far]
    out = proline_cd_angle(*far)
    g = torch.autograd.grad(out.sum(), far, allow_unused=True, materialize_grads=True)
    assert torch.isfinite(out).all() and all(torch.isfinite(x).all() for x in g)


def test_ideal_fast_form_equals_the_general_one():
    """The hot path's folded, hand-differentiated form (numpy on the CPU) is the general
    function at proline's ideal geometry: values and gradients over every chi1, chi2
    (unreachable ones included), and twice differentiable (torch ops)."""
    from zmat.protein.build import ideal_cd_angle

    pro = zp.RESIDUES["PRO"]
    row = {a: pro.ideal[pro.index(a)] for a in ("CA", "CB", "CG", "CD")}
    geo = (row["CA"][0], row["CB"][0], row["CB"][1], row["CG"][0], row["CG"][1], row["CD"][0], row["CD"][1])
    g = torch.Generator().manual_seed(3)
    c1, c2 = ((torch.rand(500, generator=g, dtype=F64) * 2 - 1) * math.pi for _ in range(2))
    c1, c2 = c1.requires_grad_(), c2.requires_grad_()
    want, got = proline_cd_angle(c1, c2, *geo), ideal_cd_angle(c1, c2)
    assert (want - got).abs().max() < 1e-11
    grads = torch.autograd.grad(want.sum(), (c1, c2)), torch.autograd.grad(got.sum(), (c1, c2))
    for a, b in zip(*grads, strict=True):
        assert (a - b).abs().max() < 1e-10
    args = (c1[:20].detach().requires_grad_(), c2[:20].detach().requires_grad_())
    torch.autograd.gradcheck(ideal_cd_angle, args)
    torch.autograd.gradgradcheck(ideal_cd_angle, args)
    assert ideal_cd_angle(c1[:3].float(), c2[:3].float()).dtype == torch.float32


def test_kernel_path_closes_rings_in_place_like_the_torch_path():
    """The compiled fill's ring closure (numpy, in place) gives the torch path's values and
    gradients, is twice differentiable, and dispatches no op over the whole output (each
    would enter a parallel region that waits for a busy core)."""
    from zmat.protein import build

    lay = zp.ProteinBatch(["MPKPVLPGP", "APPGK"])._flat
    t = torch.randn(18, 7, dtype=F64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    fast, torch_path = build._fill(lay, t), build.fill_internal(lay, t)
    assert torch.equal(fast, torch_path)
    g = torch.randn_like(fast)
    assert torch.equal(*(torch.autograd.grad(x, t, g)[0] for x in (fast, torch_path)))
    # the overwritten angles take no gradient of their own: through a function of the output
    w = torch.randn_like(fast)
    grads = [
        torch.autograd.grad((x * w).sum(), t)[0] for x in (build._fill(lay, t), build.fill_internal(lay, t))
    ]
    assert torch.allclose(*grads, rtol=0, atol=1e-12)
    torch.autograd.gradcheck(lambda x: build._fill(lay, x), (t,))
    torch.autograd.gradgradcheck(lambda x: build._fill(lay, x), (t,))
    size = fast.numel()
    with _LargeOps(size) as large:
        out = build._fill(lay, t.detach().float().requires_grad_())
        out.backward(torch.ones_like(out))
    assert large.ops <= {"ones_like"}, large.ops  # ones_like: the test's own gradient


class _LargeOps(TorchDispatchMode):
    """Records the ops (other than allocations and views) whose output has >= ``size`` elements."""

    def __init__(self, size):
        super().__init__()
        self.size, self.ops = size, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        free = func.is_view or name.startswith(("empty", "new_empty")) or name in ("detach", "lift_fresh")
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not free and any(isinstance(o, torch.Tensor) and o.numel() >= self.size for o in outs):
            self.ops.add(name)
        return out


@pytest.mark.parametrize(
    ("name", "options"), [("1ubi.pdb", {}), ("1ubi.pdb", {"hydrogens": True}), ("5ugo.cif", {})]
)
def test_proline_ring_closes_in_a_complex(name, options):
    """``Complex.ideal_internal`` (the all-atom tree, ligands and hydrogens
    included) closes every proline ring as the protein paths do, with new
    torsions too; differentiable in them."""
    p = zp.from_pdb(DATA / name, ligands=True, **options)
    res, names = p.parsed.residue, p.atom_names
    pro = np.flatnonzero(p.res_names == "PRO")
    n, cd = (np.array([np.flatnonzero((res == k) & (names == a))[0] for k in pro]) for a in ("N", "CD"))
    chi1 = (p.torsions["chi1"] + 0.3).requires_grad_(True)
    for torsions in ({}, {"chi1": chi1}):
        x = zmat.to_xyz(p.ideal_internal(torsions), p.table)
        d = (x[cd] - x[n]).norm(dim=-1)
        assert len(d) >= 3 and (d - PRO_CD_N).abs().max() < 1e-9, d
    (g,) = torch.autograd.grad(d.sum(), chi1)
    assert torch.isfinite(g).all() and g[pro].abs().max() < 1e-6  # the ring stays closed as chi1 moves
