"""Last stage of :func:`zmat.clash_loss`: the penalties of the pairs summed per structure.

One input, one output: :class:`~zmat.clash.atoms.Atoms` and the
:class:`~zmat.clash.pairs.Pairs` (or :class:`~zmat.clash.pairs.Chunks`) in,
``(size,)`` totals out (float64; on MPS the input dtype), one per structure,
NaN where a structure has a non-finite unmasked coordinate or radius. Each
pair's penalty comes from :func:`zmat.clash.penalty.pair_penalties`.
"""

from __future__ import annotations

import torch

from .atoms import Atoms, Layout
from .pairs import Chunks, Pairs
from .penalty import Penalty, pair_penalties

__all__ = ["acc_dtype", "pair_sum", "per_structure", "structure_of"]


def per_structure(atoms: Atoms, pairs: Pairs | Chunks, pen: Penalty) -> torch.Tensor:
    """Sum of the pairs' penalties per structure, ``(size,)``, with the NaN policy."""
    if isinstance(pairs, Chunks):
        out = _ChunkedPairSum.apply(atoms.xyz, atoms.radii, pairs.rows, atoms.layout, pen)
    else:
        out = pair_sum(atoms.xyz, atoms.radii, *pairs, atoms.layout, pen)
    return _propagate_nan(out, atoms)


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Sums accumulate in float64 (exact to the result's rounding in float32), where
    the device has it (MPS does not)."""
    return t.dtype if t.device.type == "mps" else torch.float64


def structure_of(layout: Layout, i: torch.Tensor) -> torch.Tensor:
    """Result index (structure) of flat rows ``i``."""
    if layout.seg is not None:
        return layout.seg.index_select(0, i)
    return torch.div(i, layout.n, rounding_mode="floor")


def pair_sum(xyz_f, radii_f, i, j, keep, layout: Layout, pen: Penalty):
    """Sum of penalties over pairs (i, j) per structure: shape (size,), float64."""
    p = pair_penalties(xyz_f, radii_f, i, j, keep, pen)
    out = torch.zeros(layout.size, dtype=acc_dtype(p), device=p.device)
    return out.index_add(0, structure_of(layout, i), p.to(out.dtype))


class _ChunkedPairSum(torch.autograd.Function):
    """:func:`pair_sum` over the candidate rows of a cell list, chunk by chunk.

    No per-pair tensor outlives its chunk: backward recomputes the rows and
    the penalties of each chunk, so memory stays within the budget however
    many pairs clash. Double backward works (the recomputation is then
    recorded, chunk by chunk, in the graph).
    """

    @staticmethod
    def forward(xyz_f, radii_f, rows, layout, pen):
        out = torch.zeros(layout.size, dtype=acc_dtype(xyz_f), device=xyz_f.device)
        for i, j, keep in rows():
            out = out + pair_sum(xyz_f, radii_f, i, j, keep, layout, pen)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        xyz_f, radii_f, ctx.rows, ctx.layout, ctx.pen = inputs
        ctx.save_for_backward(xyz_f, radii_f)

    @staticmethod
    def backward(ctx, grad):
        xyz_f, radii_f = ctx.saved_tensors
        need = ctx.needs_input_grad[:2]
        create = torch.is_grad_enabled()  # double backward: record the recomputation
        grads = [None, None]
        for i, j, keep in ctx.rows():
            with torch.enable_grad():
                x = xyz_f if create else xyz_f.detach().requires_grad_(need[0])
                r = radii_f if create else radii_f.detach().requires_grad_(need[1])
                s = (pair_sum(x, r, i, j, keep, ctx.layout, ctx.pen) * grad).sum()
                wrt = [t for t, k in zip((x, r), need, strict=True) if k]
                got = iter(torch.autograd.grad(s, wrt, create_graph=create))
            for k in range(2):
                if need[k]:
                    g = next(got)
                    grads[k] = g if grads[k] is None else grads[k] + g
        return grads[0], grads[1], None, None, None


def _propagate_nan(out, atoms: Atoms):
    """NaN policy: the loss of a structure with a non-finite (unmasked) coordinate or
    radius is NaN, whatever the method; ``0 * x`` is NaN exactly there (no sync)."""
    layout = atoms.layout
    bad = ((atoms.xyz * 0).sum(-1) + atoms.radii * 0).to(out.dtype)
    if layout.seg is not None:
        return out.index_add(0, layout.seg, bad)
    return out + bad.view(layout.size, layout.n).sum(-1)
