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
* the clash term (``--clash-weight``): ``zmat.clash_loss`` (AlphaFold's flat-bottom
  between-residue clash: radii C 1.7, N 1.55, O 1.52, tolerance 1.5 A, pairs within a residue
  and the peptide C-N bond excluded) plus the peptide-bond terms of
  ``zmat.protein.structural_violations``, on the decoded predicted clean angles
  ``x0_hat = (x_t - sqrt(1 - abar_t) eps_hat) / sqrt(abar_t)`` in the last 20% of the noise
  levels of the states the sampler visits (which clash far more often than noised training
  windows). ``--term states`` (the default): added to the loss on reverse-diffusion chains run
  alongside training (:class:`SamplerChains`, :func:`chain_clash`), differentiable in the
  network; ``--term unroll``: the same states run ``--unroll`` more sampler steps with their
  graph kept and the clash of the state reached is the loss (reward fine-tuning, DRaFT-K style,
  :func:`unroll_steps`); ``--term target``: it moves the noise target to the clash-guided one
  (:func:`losses`, :class:`Chains`); ``--term distill``: FoldingDiff's loss on the states of
  clash-guided sampler chains against the noise that leads each to its chain's guided sample
  (:class:`GuidedChains`: training on the guided sampler's own outputs);
* sampling-time clash guidance (``--guidance``): the same gradient on the DDPM mean.

The default is tiny (seconds; CI runs it). ``python -m benchmarks --suite train`` trains
two models that differ only in the extra loss and compares their samples.

    python examples/torsion_diffusion.py                       # tiny, with the clash term
    python examples/torsion_diffusion.py --clash-weight 0      # FoldingDiff's own loss only
    python examples/torsion_diffusion.py --term target --clash-weight 3 --chains 8   # last session's term
    python examples/torsion_diffusion.py --term unroll --clash-weight 0.1   # through 4 sampler steps
    python examples/torsion_diffusion.py --term distill --clash-weight 0.125 --steps 300   # guided outputs
    python examples/torsion_diffusion.py --guidance 0          # no clash guidance at sampling
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
        self.reach = 2 * float(self.radii.max())  # minus the tolerance: no pair farther apart can clash
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

    def pairs(self, xyz: torch.Tensor, tolerance: float = 1.5) -> torch.Tensor:
        """Pair list of ``(B, 4 L, 3)`` for ``clash_loss(pairs=)``: allowed pairs within reach.

        At a few hundred atoms per window, one batched distance matrix without gradient is
        cheaper than a cell list (``zmat.clash.candidate_pairs``); it syncs once (the count).
        """
        with torch.no_grad():
            near = (torch.cdist(xyz, xyz) < self.reach - tolerance + 1e-3) & self.allowed
            b, i, j = torch.nonzero(near, as_tuple=True)
        n = xyz.shape[-2]
        return torch.stack([b * n + i, b * n + j], -1)

    def clash(self, xyz: torch.Tensor, tolerance: float = 1.5) -> torch.Tensor:
        """``(B,)`` AlphaFold's between-residue clash amount (A, sum of overlaps); a smaller
        ``tolerance`` counts overlaps that start closer to contact (a margin for a loss)."""
        return clash_loss(xyz, self.radii, pairs=self.pairs(xyz, tolerance), tolerance=tolerance)

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


class Chains:
    """``k`` reverse-diffusion chains advanced one DDPM step per training step: the states the
    sampler visits in its last ``t0`` steps, for the clash term. Each starts from a training window
    noised to ``t0 - 1`` and restarts there after ``t = 0``; staggered, so all low steps are present."""

    def __init__(self, data: torch.Tensor, sched: Schedule, k: int, t0: int, gen: torch.Generator) -> None:
        self.data, self.sched, self.t0, self.gen = data, sched, t0, gen
        self.t = (t0 - 1 - torch.arange(k) * t0 // k).long()
        self.x = self._start(self.t)

    def _start(self, t: torch.Tensor) -> torch.Tensor:
        x0 = self.data[torch.randint(0, len(self.data), (len(t),), generator=self.gen)]
        ab = self.sched.abar[t][:, None, None]
        return wrap(ab.sqrt() * x0 + (1 - ab).sqrt() * torch.randn(x0.shape, generator=self.gen))

    def advance(self, eps_hat: torch.Tensor) -> None:
        ab, b = (v[self.t][:, None, None] for v in (self.sched.abar, self.sched.beta))
        z = torch.randn(self.x.shape, generator=self.gen) * (self.t > 0)[:, None, None]
        x = wrap((self.x - b / (1 - ab).sqrt() * eps_hat) / (1 - b).sqrt() + b.sqrt() * z)
        done = self.t == 0
        self.t = torch.where(done, self.t0 - 1, self.t - 1)
        self.x = torch.where(done[:, None, None], self._start(self.t), x)


class SamplerChains(Chains):
    """``k`` reverse-diffusion chains from pure noise, staggered over all ``T`` steps (the states
    the sampler visits, from its first step), restarting from fresh noise after ``t = 0``."""

    def __init__(self, k: int, length: int, sched: Schedule, gen: torch.Generator) -> None:
        self.length = length
        super().__init__(None, sched, k, sched.T, gen)

    def _start(self, t: torch.Tensor) -> torch.Tensor:
        return wrap(torch.randn(len(t), self.length, 6, generator=self.gen))


class GuidedChains(SamplerChains):
    """:class:`SamplerChains` stepped as :func:`sample` with clash guidance ``guidance`` (at
    ``t < guide_frac T``): the teacher of the ``"distill"`` term. Each chain's states at ``t < t0``
    are recorded; when a chain that started from noise at ``T - 1`` ends, its states and its sample
    become training pairs (those of the last ``keep`` chains are kept)."""

    def __init__(self, k, length, sched, gen, bb, guidance, t0, keep=16, guide_frac=0.2) -> None:
        super().__init__(k, length, sched, gen)
        self.bb, self.guidance, self.t_rec, self.keep, self.guide_frac = bb, guidance, t0, keep, guide_frac
        self.seen = torch.zeros(k, t0, length, 6)  # each chain's state at each t < t0
        self.whole = self.t == sched.T - 1  # the others started mid-way from noise: not the sampler's
        self.states, self.ends = torch.zeros(0, t0, length, 6), torch.zeros(0, length, 6)

    def advance(self, eps_hat: torch.Tensor) -> None:
        x, t, s = self.x, self.t, self.sched
        rec = t < self.t_rec
        self.seen[rec, t[rec]] = x[rec]
        ab, b = (v[t][:, None, None] for v in (s.abar, s.beta))
        mean = guided_mean(x, eps_hat, ab, b, None, 0.0)
        g = t < self.guide_frac * s.T
        if g.any():
            mean[g] = guided_mean(x[g], eps_hat[g], ab[g], b[g], self.bb, self.guidance)
        z = torch.randn(x.shape, generator=self.gen) * (t > 0)[:, None, None]
        x = wrap(mean + b.sqrt() * z)
        done = t == 0
        end = done & self.whole
        self.states = torch.cat([self.states, self.seen[end]])[-self.keep :]
        self.ends = torch.cat([self.ends, x[end]])[-self.keep :]
        self.whole = self.whole | done
        self.t = torch.where(done, s.T - 1, t - 1)
        self.x = torch.where(done[:, None, None], self._start(self.t), x)

    def draw(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``n`` recorded (state, step, noise target) triples: the noise target is the one that
        leads the state to its chain's guided sample, ``wrap(x_t - sqrt(abar) x0) / sqrt(1 - abar)``."""
        c = torch.randint(0, len(self.ends), (n,), generator=self.gen)
        t = torch.randint(0, self.t_rec, (n,), generator=self.gen)
        x, x0, ab = self.states[c, t], self.ends[c], self.sched.abar[t][:, None, None]
        return x, t, wrap(x - ab.sqrt() * x0) / (1 - ab).sqrt()


def chain_clash(
    model, chains: SamplerChains, bb: Backbone, t0: int, tolerance: float = 1.5, unroll: int = 0
) -> torch.Tensor:
    """Advance ``chains`` one step; return the ``(n,)`` penalty (clash amount with ``tolerance``,
    A, + peptide-bond loss) of the decoded predicted clean angles of its states at ``t < t0``,
    differentiable in the network through ``x0_hat = (x_t - sqrt(1 - abar) eps_hat) / sqrt(abar)``.

    ``unroll = k > 0``: the penalty of the ``x0_hat`` reached after ``k`` more of the sampler's
    steps from each such state (:func:`unroll_steps`; the final sample where ``t < k``),
    differentiated through every step, as DRaFT-K (Clark et al. 2024) does for a reward."""
    x, t, T = chains.x, chains.t, chains.sched.T
    low = t < t0
    eps = torch.zeros_like(x)
    with torch.no_grad():
        eps[~low] = model(x[~low], t[~low], T)
    e = model(x[low], t[low], T)
    eps[low] = e.detach()
    chains.advance(eps)
    xs, s, e = unroll_steps(model, chains.sched, x[low], t[low], e, unroll, chains.gen)
    a = chains.sched.abar[s][:, None, None]
    xyz = bb.xyz((xs - (1 - a).sqrt() * e) / a.sqrt())
    return bb.clash(xyz, tolerance) + bb.violation_loss(xyz)


def unroll_steps(model, sched: Schedule, x, t, eps, k: int, gen: torch.Generator):
    """``k`` DDPM steps of the sampler from states ``x`` (B, L, 6) at steps ``t`` (B,) with
    predicted noise ``eps``, keeping the graph; a state at ``t = 0`` stays (its ``x0_hat`` is
    the sample). Returns the states reached, their steps and their predicted noise."""
    for _ in range(k):
        go = t > 0
        ab, b = (v[t][:, None, None] for v in (sched.abar, sched.beta))
        z = torch.randn(x.shape, generator=gen)
        nxt = wrap((x - b / (1 - ab).sqrt() * eps) / (1 - b).sqrt() + b.sqrt() * z)
        x, t = torch.where(go[:, None, None], nxt, x), torch.where(go, t - 1, t)
        eps = torch.where(go[:, None, None], model(x, t, sched.T), eps)
    return x, t, eps


def losses(
    model, x0, sched: Schedule, bb: Backbone, clash_weight: float, gen: torch.Generator, *,
    chains: Chains | None = None, guide_frac: float = 0.2, pairs=None, pair_weight: float = 0.0,
) -> Losses:  # fmt: skip
    """FoldingDiff's loss on a batch of normalised windows ``x0`` (B, L, 6), with the clash term.

    The clash term (``clash_weight > 0``) changes the noise target of every state at
    ``t < guide_frac T`` (the batch's, and ``chains``' sampler states, whose own target is the
    network's current output) to the clash-guided one, ``eps + clash_weight sqrt((1 - abar) / abar)
    d penalty / d x0_hat``: the loss is still FoldingDiff's, so it cannot outweigh it.

    ``pairs``: (states, steps, noise targets) of the ``"distill"`` term (:meth:`GuidedChains.draw`),
    FoldingDiff's loss on them added with ``pair_weight``; they share the batch's network call.
    """
    t = torch.randint(0, sched.T, (x0.shape[0],), generator=gen)
    eps = torch.randn(x0.shape, generator=gen)
    ab = sched.abar[t][:, None, None]
    xt = wrap(ab.sqrt() * x0 + (1 - ab).sqrt() * eps)
    target, extra = eps, eps.new_zeros(())
    if chains is not None:
        xt, t = torch.cat([xt, chains.x]), torch.cat([t, chains.t])
        ab = sched.abar[t][:, None, None]
    m = len(xt)
    if pairs is not None:
        out = model(torch.cat([xt, pairs[0]]), torch.cat([t, pairs[1]]), sched.T)
        eps_hat, eps_pairs = out[:m], out[m:]
    else:
        eps_hat = model(xt, t, sched.T)
    if chains is not None:
        target = torch.cat([eps, eps_hat[len(eps) :].detach()])
        chains.advance(eps_hat[len(eps) :].detach())
    if clash_weight > 0:
        low = torch.nonzero(t < guide_frac * sched.T).squeeze(-1)
        a = ab[low]
        g, per = penalty_grad(bb, (xt[low] - (1 - a).sqrt() * eps_hat[low].detach()) / a.sqrt())
        target = target.index_add(0, low, clash_weight * ((1 - a) / a).sqrt() * g)
        extra = per.sum() / len(t)
    own = F.smooth_l1_loss(wrap(eps_hat - target), torch.zeros_like(eps_hat), beta=0.1 * math.pi)
    if pairs is None:
        return Losses(own, own.detach(), extra)
    d = F.smooth_l1_loss(wrap(eps_pairs - pairs[2]), torch.zeros_like(eps_pairs), beta=0.1 * math.pi)
    return Losses(own + pair_weight * d, own.detach(), d.detach())


def penalty_grad(bb: Backbone, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, L, 6)`` gradient in ``x0`` of each window's penalty (clash amount in A + peptide-bond
    loss), and the ``(B,)`` penalty."""
    with torch.enable_grad():
        x0 = x0.detach().requires_grad_()
        xyz = bb.xyz(x0)
        per = bb.clash(xyz) + bb.violation_loss(xyz)
        return torch.autograd.grad(per.sum(), x0)[0], per.detach()


def clash_grad(bb: Backbone, x0: torch.Tensor) -> torch.Tensor:
    """``(B, L, 6)`` gradient of each window's AlphaFold clash amount (A) in its angles ``x0``."""
    with torch.enable_grad():
        x0 = x0.detach().requires_grad_()
        return torch.autograd.grad(bb.clash(bb.xyz(x0)).sum(), x0)[0]


def guided_mean(x, eps, ab, b, bb: Backbone | None, guidance: float) -> torch.Tensor:
    """The DDPM mean of states ``x`` given their predicted noise ``eps`` (``ab``, ``b``: abar_t and
    beta_t, broadcastable), moved by clash guidance ``-guidance * beta_t / sqrt(abar_t) d clash /
    d x0_hat`` when ``guidance > 0`` (:func:`sample`'s step)."""
    mean = (x - b / (1 - ab).sqrt() * eps) / (1 - b).sqrt()
    if guidance > 0:
        x0_hat = (x - (1 - ab).sqrt() * eps) / ab.sqrt()
        mean = mean - guidance * b / ab.sqrt() * clash_grad(bb, x0_hat)
    return mean


@torch.no_grad()
def sample(
    model, sched: Schedule, n: int, length: int, gen: torch.Generator, *,
    bb: Backbone | None = None, guidance: float = 0.0, guide_frac: float = 0.2,
) -> torch.Tensor:  # fmt: skip
    """DDPM ancestral sampling on the torus: ``(n, length, 6)`` normalised angles.

    ``guidance > 0`` (needs ``bb``): clash guidance in the last ``guide_frac`` of the steps, a
    classifier-guidance step with ``log p = -guidance * clash``: the mean moves by
    ``-guidance * beta_t * d clash / d x_t``, where ``d x_t ~ sqrt(abar_t) d x0`` (the network's
    Jacobian ignored) and ``clash`` is zmat.clash_loss of the decoded predicted clean angles
    ``x0_hat``: the step shrinks with the noise variance ``beta_t`` and is off at high noise,
    where ``x0_hat`` is a blurred average whose clashes say nothing about the sample.
    """
    if guidance > 0 and bb is None:
        raise ValueError("sample: guidance > 0 needs the decoder bb")
    x = wrap(torch.randn(n, length, 6, generator=gen))
    for t in range(sched.T - 1, -1, -1):
        tt = torch.full((n,), t)
        ab, b = sched.abar[t], sched.beta[t]
        eps = model(x, tt, sched.T)
        mean = guided_mean(x, eps, ab, b, bb, guidance if t < guide_frac * sched.T else 0.0)
        x = wrap(mean + (b.sqrt() * torch.randn(x.shape, generator=gen) if t > 0 else 0))
    return x


TERMS = ("states", "target", "unroll", "distill")


def trainer(
    model, data, sched, bb, *, steps, batch, clash_weight, seed, lr=1e-3, chains=0, term="states",
    every=2, start=1 / 3, margin=0.2, unroll=4, low=0.2, guided=3.0, pairs=4, keep=16,
):  # fmt: skip
    """A closure making one training step of ``model`` on normalised windows ``data`` (n, L, 6)
    per call; returns its :class:`Losses` and its wall time (s). Batches, steps and noise come
    from its own generator: two trainers with the same seed see the same data.

    The clash term (``clash_weight > 0``), ``term``:

    * ``"states"``: ``clash_weight`` x the mean :func:`chain_clash` penalty of ``chains``
      reverse-diffusion chains (:class:`SamplerChains`), every ``every`` steps from step
      ``start * steps`` on (before that the network's samples are noise), with the clash counted
      from ``margin`` A before AlphaFold's tolerance, so that the push carries states past it;
      the states at ``t < low T`` (the last steps, where the fold is chosen);
    * ``"unroll"``: the same, but the penalty of the state reached ``unroll`` sampler steps later,
      differentiated through those steps (:func:`chain_clash`'s ``unroll``, reward fine-tuning
      as DRaFT-K, with the denoising loss kept as the regulariser);
    * ``"target"``: the clash-guided noise target of :func:`losses` on the batch and on ``chains``
      (:class:`Chains`) at every step;
    * ``"distill"``: guidance distilled into the network: ``chains`` sampler chains stepped with
      clash guidance ``guided`` (:class:`GuidedChains`, every ``every`` steps, from ``T every``
      steps before ``start * steps``, so that whole chains have ended by then) record their states
      at ``t < low T``; from ``start * steps`` on, ``clash_weight`` x FoldingDiff's loss of
      ``pairs`` such states (of the last ``keep`` chains) against the noise that leads each to its
      chain's guided sample is added. Its minimiser is the guided sampler's own denoiser.
    """
    if term not in TERMS:
        raise ValueError(f"trainer: term must be one of {TERMS}, not {term!r}")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 10)  # linear warm-up, then cosine decay
    decay = lambda k: min(1.0, (k + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(k, steps) / steps))  # noqa: E731
    sch = torch.optim.lr_scheduler.LambdaLR(opt, decay)
    on = clash_weight > 0 and chains > 0
    chain_gen = torch.Generator().manual_seed(seed + 7)  # its own: both trainings see the same data
    ch = (
        Chains(data, sched, chains, max(1, int(0.2 * sched.T)), chain_gen)
        if on and term == "target"
        else None
    )
    sc = (
        SamplerChains(chains, data.shape[1], sched, chain_gen)
        if on and term in ("states", "unroll")
        else None
    )
    t_low = max(1, int(low * sched.T))
    gc = (
        GuidedChains(chains, data.shape[1], sched, chain_gen, bb, guided, t_low, keep)
        if on and term == "distill"
        else None
    )
    chain_from = max(0, start * steps - every * sched.T)
    n_unroll = unroll if term == "unroll" else 0
    count = iter(range(1 << 62))

    def step() -> tuple[Losses, float]:
        t0, k = time.perf_counter(), next(count)
        x0 = data[torch.randint(0, len(data), (batch,), generator=gen)]
        pr = None
        if gc is not None:
            if k >= chain_from and k % every == 0:
                with torch.no_grad():
                    gc.advance(model(gc.x, gc.t, sched.T))
            pr = gc.draw(pairs) if k >= start * steps and len(gc.ends) else None
        cw = clash_weight if term == "target" else 0.0
        ls = losses(model, x0, sched, bb, cw, gen, chains=ch, pairs=pr, pair_weight=clash_weight)
        total = ls.total
        if sc is not None and k >= start * steps and k % every == 0:
            per = chain_clash(model, sc, bb, t_low, 1.5 - margin, n_unroll)
            total = total + clash_weight * per.mean()
            ls.extra = per.detach().mean()
        opt.zero_grad(set_to_none=True)
        total.backward()
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
    p.add_argument("--clash-weight", type=float, default=0.03, help="0: FoldingDiff's own loss only")
    p.add_argument("--term", choices=TERMS, default="states", help="the clash term (trainer)")
    p.add_argument("--unroll", type=int, default=4, help="sampler steps the 'unroll' term differentiates")
    p.add_argument("--chains", type=int, default=16, help="sampler chains the clash term sees")
    p.add_argument("--guidance", type=float, default=3.0, help="clash guidance at sampling; 0: none")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    data = load_windows(a.length, 4, held_out=False)
    mean = circular_mean(data)
    bb, sched = Backbone(a.length, mean), Schedule(a.diffusion_steps)
    model = Denoiser(a.length)
    print(f"{len(data)} training windows of {a.length} residues")
    kw = dict(steps=a.steps, batch=a.batch, seed=a.seed, clash_weight=a.clash_weight, chains=a.chains)
    kw.update(term=a.term, unroll=a.unroll)
    sec = train(model, wrap(data - mean), sched, bb, log=max(1, a.steps // 5), **kw)
    print(f"{1000 * sec:.1f} ms per training step")
    for g in sorted({0.0, a.guidance}):  # the same noise with and without guidance
        gen = torch.Generator().manual_seed(a.seed + 1)
        clash = bb.clash(bb.xyz(sample(model, sched, a.samples, a.length, gen, bb=bb, guidance=g)))
        frac, amount = float((clash > 0).float().mean()), float(clash.mean())
        print(f"guidance {g:g}: samples with a clash: {frac:.3f}; clash per sample {amount:.3f} A")


if __name__ == "__main__":
    main()
