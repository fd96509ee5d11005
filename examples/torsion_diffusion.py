"""A FoldingDiff-style diffusion model over backbone angles, trained with zmat's clash loss.

FoldingDiff (Wu et al. 2022, "Protein structure generation via folding diffusion")
denoises the six angles of each residue of a protein window (phi, psi, omega and the
three backbone bond angles, ``zmat.protein.FOLDINGDIFF_ANGLES``) with a transformer, and
builds the backbone from them with fixed bond lengths (NeRF). Here:

* data: windows of real chains, six angles per residue, from
  ``benchmarks/data/backbone_angles.npz`` (60 PDB entries; how it was made is in
  ``benchmarks/make_torsion_data.py``), split train / held out by entry;
* model: a small transformer predicts the noise ``eps`` of the wrapped angles (cosine
  schedule, FoldingDiff's wrapped smooth-L1 loss on ``eps``);
* decoding: ``zmat.protein.internal_from_six_angles`` + an ideal carbonyl O per residue
  + ``zmat.to_xyz`` give N, CA, C, O atoms, differentiably;
* the extra loss (``--clash-weight``): on the predicted clean angles
  ``x0 = (x_t - sqrt(1 - abar_t) eps_hat) / sqrt(abar_t)``, decoded to atoms,
  ``zmat.clash_loss`` (AlphaFold's flat-bottom between-residue clash: radii C 1.7,
  N 1.55, O 1.52, tolerance 1.5 A, pairs within a residue and the peptide C-N bond
  excluded) per residue, plus the peptide-bond terms of
  ``zmat.protein.structural_violations``, weighted so that its push on the network's
  output ``eps_hat`` is ``abar_t`` times its gradient in ``x0`` (:func:`extra_weight`):
  full near ``t = 0``, where ``x0`` is a sharp structure and sampling commits to it, none
  at high noise, where ``x0`` is a blurred average whose clashes say nothing about a sample.

The default is tiny (seconds; CI runs it). ``python -m benchmarks --suite train`` trains
two models that differ only in the extra loss and compares their samples.

    python examples/torsion_diffusion.py                       # tiny, with the clash term
    python examples/torsion_diffusion.py --clash-weight 0      # FoldingDiff's own loss only
    python examples/torsion_diffusion.py --steps 2000 --length 32 --diffusion-steps 200
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import zmat
from zmat.clash import alphafold_radii, clash_loss
from zmat.protein import internal_from_six_angles, structural_violations
from zmat.protein.atom37 import ATOM_ORDER, RESTYPES
from zmat.protein.violations import between_residue_bond_loss

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "backbone_angles.npz"
# Ideal carbonyl O (Engh & Huber): C=O 1.231 A, CA-C-O 120.8 deg, trans to N(i+1).
O_BOND, O_ANGLE = 1.231, math.radians(120.8)


def wrap(x: torch.Tensor) -> torch.Tensor:
    """Angles to [-pi, pi); gradient 1 everywhere."""
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


def load_windows(length: int, stride: int, held_out: bool, path: Path = DATA) -> torch.Tensor:
    """Windows of ``length`` residues, every ``stride`` residues, of the train or held-out entries.

    Returns a ``(n, length, 6)`` float32 tensor of FoldingDiff's six angles (radians). The first
    and last residue of each segment are left out (phi or the step angles are undefined there).
    """
    d = np.load(path)
    angles, ptr, entry = d["angles"], d["segment_ptr"], d["segment_entry"]
    out = []
    for s in np.flatnonzero(d["held_out"][entry] == held_out):
        lo, hi = ptr[s] + 1, ptr[s + 1] - 1
        out += [angles[i : i + length] for i in range(lo, hi - length + 1, stride)]
    if not out:
        raise ValueError(f"no window of {length} residues in {path} (held_out={held_out})")
    return torch.from_numpy(np.stack(out))


class Schedule:
    """Cosine noise schedule (Nichol and Dhariwal 2021), FoldingDiff's choice, ``T`` steps."""

    def __init__(self, T: int) -> None:
        s = torch.linspace(0, 1, T + 1, dtype=torch.float64)
        f = torch.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2
        self.abar = (f[1:] / f[0]).clamp(min=1e-5).float()  # abar[t], t = 0..T-1
        self.beta = (1 - self.abar / torch.cat([torch.ones(1), self.abar[:-1]])).clamp(max=0.999)
        self.T = T


class Denoiser(nn.Module):
    """``(B, L, 6)`` noisy angles + ``(B,)`` step -> ``(B, L, 6)`` predicted noise; a transformer."""

    def __init__(self, length: int, width: int = 64, depth: int = 3, heads: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(12, width)  # sin and cos of the six angles
        self.pos = nn.Parameter(0.02 * torch.randn(length, width))
        self.time = nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Linear(width, width))
        layer = nn.TransformerEncoderLayer(
            width, heads, 2 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.body = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.out = nn.Linear(width, 6)

    def forward(self, x: torch.Tensor, t: torch.Tensor, T: int) -> torch.Tensor:
        freq = torch.exp(torch.arange(8, device=x.device) * -math.log(1000.0) / 8)
        arg = (t.float() / T * 1000)[:, None] * freq
        h = self.inp(torch.cat([x.sin(), x.cos()], -1)) + self.pos
        h = h + self.time(torch.cat([arg.sin(), arg.cos()], -1))[:, None]
        return self.out(self.body(h))


class Backbone:
    """Decode six angles to N, CA, C, O atoms (``4 L`` per window) and the AlphaFold tensors."""

    def __init__(self, length: int, mean: torch.Tensor) -> None:
        self.L, self.mean = length, mean
        L = length
        refs = np.full((4 * L, 3), -1, np.int64)
        old = zmat.protein.backbone_table(L).refs  # (3 L, 3): N, CA, C per residue
        new = lambda o: np.where(o < 0, -1, 4 * (o // 3) + o % 3)  # noqa: E731
        keep = np.arange(3 * L)
        refs[new(keep)] = new(old)
        i = np.arange(L)
        refs[4 * i + 3] = np.stack([4 * i + 2, 4 * i + 1, np.minimum(4 * i + 4, 4 * L - 4)], -1)
        refs[4 * L - 1, 2] = 4 * L - 4  # the last O: dihedral about N of its own residue
        self.table = zmat.ConstructionTable(refs)
        self.radii = alphafold_radii("NCCO" * L)
        res = np.repeat(i, 4)
        same = res[:, None] == res[None]
        peptide = np.zeros_like(same)
        peptide[4 * i[:-1] + 2, 4 * i[:-1] + 4] = True
        excluded = same | peptide | peptide.T
        self.exclude = torch.from_numpy(np.stack(np.nonzero(np.triu(excluded, 1)), -1))  # AlphaFold's
        self.allowed = torch.from_numpy(np.triu(~excluded, 1))  # (4 L, 4 L) pairs that may clash
        self.reach = 2 * float(self.radii.max()) - 1.5  # no pair farther apart can clash
        self.mask37 = torch.zeros(L, 37, dtype=torch.bool)
        self.cols37 = [ATOM_ORDER[n] for n in ("N", "CA", "C", "O")]
        self.mask37[:, self.cols37] = True
        self.mask4 = torch.ones(L, 4, dtype=torch.bool)
        self.aatype = torch.full((L,), RESTYPES.index("G"))  # backbone only: glycine

    def xyz(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, L, 6)`` normalised angles -> ``(B, 4 L, 3)`` atoms, differentiable."""
        C = internal_from_six_angles(wrap(x + self.mean)).unflatten(-2, (self.L, 3))
        o = torch.tensor([O_BOND, O_ANGLE, math.pi], dtype=x.dtype).expand(*C.shape[:-2], 1, 3)
        return zmat.to_xyz(torch.cat([C, o], -2).flatten(-3, -2), self.table)

    def atom37(self, xyz: torch.Tensor) -> torch.Tensor:
        pos = xyz.new_zeros(*xyz.shape[:-2], self.L, 37, 3)
        pos[..., self.cols37, :] = xyz.unflatten(-2, (self.L, 4))
        return pos

    def pairs(self, xyz: torch.Tensor) -> torch.Tensor:
        """Pair list of ``(B, 4 L, 3)`` for ``clash_loss(pairs=)``: allowed pairs within reach.

        At a few hundred atoms per window, one batched distance matrix without gradient is
        cheaper than a cell list (``zmat.clash.candidate_pairs``); it syncs once (the count).
        """
        with torch.no_grad():
            near = (torch.cdist(xyz, xyz) < self.reach + 1e-3) & self.allowed
            b, i, j = torch.nonzero(near, as_tuple=True)
        n = xyz.shape[-2]
        return torch.stack([b * n + i, b * n + j], -1)

    def clash(self, xyz: torch.Tensor) -> torch.Tensor:
        """``(B,)`` AlphaFold's between-residue clash amount (A, sum of overlaps)."""
        return clash_loss(xyz, self.radii, pairs=self.pairs(xyz))

    def violation_loss(self, xyz: torch.Tensor) -> torch.Tensor:
        """``(B,)`` AlphaFold's peptide-bond length and angle losses (12 sigma tolerance): the
        ``between_residue_bond_loss`` part of ``structural_violations``, on the backbone atoms."""
        pos = xyz.unflatten(-2, (self.L, 4))
        v = between_residue_bond_loss(pos, self.mask4, torch.arange(self.L), self.aatype)
        return v["c_n_loss_mean"] + v["ca_c_n_loss_mean"] + v["c_n_ca_loss_mean"]

    def violations(self, xyz: torch.Tensor) -> dict[str, torch.Tensor]:
        """AlphaFold's ``structural_violations`` of ``(B, 4 L, 3)`` (metrics, no gradient needed)."""
        return structural_violations(self.atom37(xyz), self.aatype, self.mask37)


def circular_mean(windows: torch.Tensor) -> torch.Tensor:
    """``(6,)`` circular mean of each angle column (FoldingDiff centres the angles on it)."""
    return torch.atan2(windows.sin().mean((0, 1)), windows.cos().mean((0, 1)))


@dataclass
class Losses:
    total: torch.Tensor
    eps: torch.Tensor
    extra: torch.Tensor


def extra_weight(ab: torch.Tensor) -> torch.Tensor:
    """Weight of the extra loss at noise level ``abar_t``: ``abar_t * sqrt(abar_t / (1 - abar_t))``.

    The network outputs ``eps_hat``; ``d x0 / d eps_hat = -sqrt((1 - abar) / abar)``, so the term
    pushes ``eps_hat`` with ``weight * sqrt((1 - abar) / abar) * d loss / d x0 = abar * d loss / d x0``:
    the full push at low noise, where ``x0`` is a sharp structure near the data (real windows do
    not clash, so there the term agrees with the own loss), none at high noise, where ``x0`` is a
    blurred average whose clashes say nothing about a sample. (A weight ``abar`` alone pushes
    ``eps_hat`` by ``sqrt(abar (1 - abar))``: most at mid noise and not at all near ``t = 0``; it
    distorted the samples in our measurements, see docs/training.md.)
    """
    return ab * (ab / (1 - ab)).sqrt()


def losses(model, x0, sched: Schedule, bb: Backbone, clash_weight: float, gen: torch.Generator) -> Losses:
    """FoldingDiff's loss on a batch of normalised windows ``x0`` (B, L, 6), plus the extra term."""
    t = torch.randint(0, sched.T, (x0.shape[0],), generator=gen)
    eps = torch.randn(x0.shape, generator=gen)
    ab = sched.abar[t][:, None, None]
    xt = wrap(ab.sqrt() * x0 + (1 - ab).sqrt() * eps)
    eps_hat = model(xt, t, sched.T)
    own = F.smooth_l1_loss(wrap(eps_hat - eps), torch.zeros_like(eps), beta=0.1 * math.pi)
    extra = own.new_zeros(())
    if clash_weight > 0:
        xyz = bb.xyz((xt - (1 - ab).sqrt() * eps_hat) / ab.sqrt())  # decoded predicted x0
        per = bb.clash(xyz) / bb.L + bb.violation_loss(xyz)
        extra = (extra_weight(ab.flatten()) * per).mean()
    return Losses(own + clash_weight * extra, own.detach(), extra.detach())


@torch.no_grad()
def sample(model, sched: Schedule, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """DDPM ancestral sampling on the torus: ``(n, length, 6)`` normalised angles."""
    x = wrap(torch.randn(n, length, 6, generator=gen))
    for t in range(sched.T - 1, -1, -1):
        tt = torch.full((n,), t)
        ab, b = sched.abar[t], sched.beta[t]
        mean = (x - b / (1 - ab).sqrt() * model(x, tt, sched.T)) / (1 - b).sqrt()
        x = wrap(mean + (b.sqrt() * torch.randn(x.shape, generator=gen) if t > 0 else 0))
    return x


def trainer(model, data, sched, bb, *, steps, batch, clash_weight, seed, lr=1e-3):
    """A closure making one training step of ``model`` on normalised windows ``data`` (n, L, 6)
    per call; returns its :class:`Losses` and its wall time (s). Batches, steps and noise come
    from its own generator: two trainers with the same seed see the same data."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 10)  # linear warm-up, then cosine decay
    decay = lambda k: min(1.0, (k + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(k, steps) / steps))  # noqa: E731
    sch = torch.optim.lr_scheduler.LambdaLR(opt, decay)

    def step() -> tuple[Losses, float]:
        t0 = time.perf_counter()
        x0 = data[torch.randint(0, len(data), (batch,), generator=gen)]
        ls = losses(model, x0, sched, bb, clash_weight, gen)
        opt.zero_grad(set_to_none=True)
        ls.total.backward()
        opt.step()
        sch.step()
        return ls, time.perf_counter() - t0

    return step


def train(model, data, sched, bb, *, steps, log=None, **kw) -> float:
    """Train ``model`` for ``steps`` steps (keywords as :func:`trainer`); median seconds per step."""
    step, times = trainer(model, data, sched, bb, steps=steps, **kw), []
    for k in range(steps):
        ls, sec = step()
        times.append(sec)
        if log and (k % log == 0 or k == steps - 1):
            print(f"step {k:5d}  eps loss {float(ls.eps):.4f}  extra {float(ls.extra):.4f}")
    return float(np.median(times))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=16, help="residues per window (FoldingDiff: up to 128)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--diffusion-steps", type=int, default=50, help="T (FoldingDiff: 1000)")
    p.add_argument("--clash-weight", type=float, default=0.2, help="0: FoldingDiff's own loss only")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    data = load_windows(a.length, 4, held_out=False)
    mean = circular_mean(data)
    bb, sched = Backbone(a.length, mean), Schedule(a.diffusion_steps)
    model = Denoiser(a.length)
    print(f"{len(data)} training windows of {a.length} residues")
    kw = dict(steps=a.steps, batch=a.batch, clash_weight=a.clash_weight, seed=a.seed)
    sec = train(model, wrap(data - mean), sched, bb, log=max(1, a.steps // 5), **kw)
    x = sample(model, sched, a.samples, a.length, torch.Generator().manual_seed(a.seed + 1))
    clash = bb.clash(bb.xyz(x))
    print(f"{1000 * sec:.1f} ms per training step")
    frac, amount = float((clash > 0).float().mean()), float(clash.mean())
    print(f"samples with a clash: {frac:.3f}; clash per sample {amount:.3f} A")


if __name__ == "__main__":
    main()
