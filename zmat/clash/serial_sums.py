"""``clash_loss(pairs=)`` on the CPU without a parallel region (see :mod:`zmat._serial`).

The training path's twin of the pipeline (given pairs -> penalty -> per-structure
sum) for eager CPU calls with several threads: one input, one output
(:class:`~zmat.clash.atoms.Atoms` as given, unflattened, and the pair list in;
``(size,)`` float64 totals out). It works on chunks of pairs whose every tensor
stays below torch's grain (1-D columns of ``SERIAL_CHUNK`` elements; square
roots by numpy), prepares the per-atom arrays (padding, radii) with numpy, and
has an analytic per-pair backward (:func:`zmat.clash.penalty.penalty_grad`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from .._geometry import tiny
from .._serial import SERIAL_CHUNK, host_zeros
from .atoms import Atoms, Layout
from .exclusions import is_excluded
from .penalty import Penalty, penalty, penalty_grad
from .sums import pair_sum, structure_of

__all__ = ["serial_sum"]


def _host_rows(t: torch.Tensor, full) -> np.ndarray:
    """``t`` broadcast to ``full`` and flattened, as a numpy array (no torch op)."""
    return np.array(np.broadcast_to(t.detach().numpy(), tuple(full))).reshape(-1)  # a writable copy


class _SerialInputs(NamedTuple):
    """Host-prepared inputs of :class:`_SerialPairSum`: padding zeroed by numpy."""

    cols: tuple  # x, y, z: (M,) contiguous coordinate columns
    radii: torch.Tensor  # (M,)
    radii_mod: int  # radii gradient rows: atom % radii_mod (0: the atom)
    keep_atom: torch.Tensor | None  # (M,) bool, the mask
    i: torch.Tensor
    j: torch.Tensor
    excl: torch.Tensor | None
    layout: Layout
    pen: Penalty


def _chunk_terms(inp: _SerialInputs, lo: int, hi: int):
    """Per pair of chunk ``[lo, hi)``: ``(dx, dy, dz, c, keep, i, j)``: separation,
    contact distance, kept flag, atoms (no graph)."""
    i, j = inp.i[lo:hi], inp.j[lo:hi]
    dx, dy, dz = (col.index_select(0, i) - col.index_select(0, j) for col in inp.cols)
    c = inp.radii.index_select(0, i) + inp.radii.index_select(0, j) - inp.pen.tolerance
    keep = i != j
    if inp.keep_atom is not None:
        keep = keep & inp.keep_atom.index_select(0, i) & inp.keep_atom.index_select(0, j)
    if inp.excl is not None:
        keep = keep & ~is_excluded(i, j, inp.layout.period, inp.excl)
    return dx, dy, dz, c, keep, i, j


def _distance(dx, dy, dz):
    sq = dx * dx + dy * dy + dz * dz
    ok = ~(sq <= tiny(sq.dtype))  # as safe_norm: coincident atoms, value 0 and gradient 0
    # numpy's sqrt (no graph here): torch's sqrt kernel goes parallel from 2,048 elements
    root = torch.from_numpy(np.sqrt(torch.where(ok, sq, 1.0).numpy()))
    return torch.where(ok, root, 0.0), ok


class _SerialPairSum(torch.autograd.Function):
    """Sum of penalties over a pair list, chunk by chunk, analytic per-pair backward
    (double backward: a differentiable recomputation, which may use threads)."""

    @staticmethod
    def forward(xyz_f, radii, inp: _SerialInputs):
        out = host_zeros(inp.layout.size, torch.float64)
        for lo in range(0, len(inp.i), SERIAL_CHUNK):
            dx, dy, dz, c, keep, i, _ = _chunk_terms(inp, lo, lo + SERIAL_CHUNK)
            p = torch.where(keep, penalty(inp.pen, _distance(dx, dy, dz)[0], c), 0.0)
            out.index_add_(0, structure_of(inp.layout, i), p.to(torch.float64))
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        xyz_f, radii, ctx.inp = inputs
        ctx.save_for_backward(xyz_f, radii)

    @staticmethod
    def backward(ctx, grad):
        xyz_f, radii = ctx.saved_tensors
        inp, (need_x, need_r) = ctx.inp, ctx.needs_input_grad[:2]
        if torch.is_grad_enabled():  # double backward: the differentiable torch path
            gx, gr = _SerialPairSumBackward.apply(xyz_f, radii, grad, inp)
            return gx if need_x else None, gr if need_r else None, None
        return _serial_grad(inp, grad, xyz_f, radii, need_x, need_r) + (None,)


def _serial_grad(inp: _SerialInputs, grad, xyz_f, radii, need_x: bool, need_r: bool):
    """First derivatives of :class:`_SerialPairSum`, chunk by chunk (no graph)."""
    gx = host_zeros(tuple(xyz_f.shape), xyz_f.dtype) if need_x else None
    gr = host_zeros(radii.shape[0], radii.dtype) if need_r else None
    cols = None if gx is None else gx.unbind(1)  # strided views: written in place
    for lo in range(0, len(inp.i), SERIAL_CHUNK):
        dx, dy, dz, c, keep, i, j = _chunk_terms(inp, lo, lo + SERIAL_CHUNK)
        d, ok = _distance(dx, dy, dz)
        g_d, g_c = penalty_grad(inp.pen, d, c)
        w = torch.where(keep, grad.index_select(0, structure_of(inp.layout, i)).to(d.dtype), 0.0)
        if need_x:
            s = torch.where(ok, w * g_d / torch.where(ok, d, 1.0), 0.0)  # d|dx|/d(dx) = dx / d
            for col, v in zip(cols, (dx, dy, dz), strict=True):
                f = s * v
                col.index_add_(0, i, f).index_add_(0, j, -f)
        if need_r:
            f = w * g_c
            ri, rj = (t if inp.radii_mod == 0 else torch.remainder(t, inp.radii_mod) for t in (i, j))
            gr.index_add_(0, ri, f).index_add_(0, rj, f)
    return gx, gr


class _SerialPairSumBackward(torch.autograd.Function):
    """Double backward of :class:`_SerialPairSum`: the same sum recomputed by plain torch
    ops with a graph, differentiated with ``create_graph``."""

    @staticmethod
    def forward(xyz_f, radii, grad, inp):
        return _serial_grad(inp, grad, xyz_f, radii, True, True)

    @staticmethod
    def setup_context(ctx, inputs, output):
        xyz_f, radii, grad, ctx.inp = inputs
        ctx.save_for_backward(xyz_f, radii, grad)

    @staticmethod
    def backward(ctx, gg_x, gg_r):
        xyz_f, radii, grad = ctx.saved_tensors
        inp = ctx.inp
        with torch.enable_grad():
            x = xyz_f.detach().requires_grad_(True)
            r = radii.detach().requires_grad_(True)
            g = grad.detach().requires_grad_(True)
            keep = None if inp.keep_atom is None else inp.keep_atom
            x_f = x if keep is None else torch.where(keep[:, None], x, 0.0)
            r_f = _radii_rows(r, inp, len(x))
            pk = inp.i != inp.j
            if keep is not None:
                pk = pk & keep[inp.i] & keep[inp.j]
            if inp.excl is not None:
                pk = pk & ~is_excluded(inp.i, inp.j, inp.layout.period, inp.excl)
            s = (pair_sum(x_f, r_f, inp.i, inp.j, pk, inp.layout, inp.pen) * g).sum()
            first = torch.autograd.grad(s, [x, r], create_graph=True)
            total = sum((o * gg).sum() for o, gg in zip(first, (gg_x, gg_r), strict=True) if gg is not None)
            if not torch.is_tensor(total):
                return None, None, None, None
            grads = torch.autograd.grad(total, [x, r, g], allow_unused=True)
        return grads[0], grads[1], grads[2], None


def _radii_rows(r, inp: _SerialInputs, m: int):
    """Per-atom radii (M,) from the differentiable radii ``r`` (its own rows or N)."""
    rows = r if inp.radii_mod == 0 else r.repeat(m // inp.radii_mod)
    return rows if inp.keep_atom is None else torch.where(inp.keep_atom, rows, 0.0)


def serial_sum(atoms: Atoms, pairs: torch.Tensor, pen: Penalty) -> torch.Tensor:
    """``clash_loss(pairs=)`` on the CPU, without a parallel region: ``(size,)`` float64
    (``atoms`` unflattened: ``prepare(flatten=False)``)."""
    xyz, radii, mask, layout, excl = atoms
    full = xyz.shape[:-1]
    xyz_f = xyz.reshape(-1, 3)
    x = xyz_f.detach().numpy()
    r = _host_rows(radii, full)
    keep = None if mask is None else _host_rows(mask, full)
    # NaN policy, read on the host: a non-finite unmasked coordinate or radius makes
    # its structure NaN; padding is zeroed (it may hold anything)
    bad = ~(np.isfinite(x).all(1) & np.isfinite(r))
    if keep is not None:
        bad &= keep
        x, r = np.where(keep[:, None], x, 0), np.where(keep, r, 0)
    cols = tuple(torch.from_numpy(np.ascontiguousarray(x[:, k])) for k in range(3))
    radii_mod = 0 if tuple(radii.shape) == tuple(full) else (full[-1] if radii.numel() == full[-1] else -1)
    if radii_mod == -1:  # an unusual broadcast: differentiate through rows made by torch
        radii = radii.expand(full).reshape(-1)
        radii_mod = 0
    ij = pairs.numpy().astype(np.int64, copy=False)
    i, j = (torch.from_numpy(np.ascontiguousarray(ij[:, k])) for k in range(2))  # numpy copies: no torch op
    keep_t = None if keep is None else torch.from_numpy(keep)
    inp = _SerialInputs(cols, torch.from_numpy(r), radii_mod, keep_t, i, j, excl, layout, pen)
    out = _SerialPairSum.apply(xyz_f, radii.reshape(-1), inp)
    if bad.any():
        rows = torch.from_numpy(np.nonzero(bad)[0])
        out = out.index_put((structure_of(layout, rows),), torch.tensor(math.nan, dtype=out.dtype))
    return out
