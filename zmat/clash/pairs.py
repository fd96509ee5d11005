"""Second stage of :func:`zmat.clash_loss`: the pairs to score, from one of three sources.

One input, one output: :class:`~zmat.clash.atoms.Atoms` in, :class:`Pairs` out
(rows ``i``, ``j`` of the flat atoms and a ``keep`` mask, or None), or, where
the candidates exceed the memory budget, :class:`Chunks` (the candidates chunk
by chunk, recomputed in the backward pass). The sources:

- :func:`given`: a pair list the caller made (``pairs=``), no sync; self pairs,
  exclusions and padding become the mask;
- :func:`every`: every pair of a structure (a size known from N: no sync);
- :func:`near`: a cell list (:mod:`zmat._neighbors`) without gradient, the
  candidates filtered by distance: two host syncs (sizing, then compacting).

:func:`within` is the pair list of :func:`zmat.clash.candidate_pairs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

from .._neighbors import CellList, build_cell_list
from .atoms import Atoms
from .exclusions import is_excluded

__all__ = [
    "BYTES_PER_PAIR",
    "BYTES_PER_ROW",
    "Chunks",
    "Pairs",
    "every",
    "given",
    "near",
    "within",
]

# Slack on the no-grad distance filter, so that float rounding there can never
# drop a pair whose (differentiable) penalty is nonzero.
_FILTER_SLACK = 1e-3

# Bytes a candidate row costs at the peak of a chunk (indices, gathered
# positions, distances, penalty and their gradients): a 512 MiB budget took
# 480-590 MB, 64 MiB took 120 MB (benchmarks/clash.py --collapsed, N = 5000).
BYTES_PER_ROW = 200
# Bytes a pair of a returned pair list takes (two int64 indices).
BYTES_PER_PAIR = 16


class Pairs(NamedTuple):
    """Pairs ``(i, j)`` of rows of the flat atoms, ``(P,)`` int64 each; ``keep``: ``(P,)``
    bool (False: the pair counts zero), or None (every pair counts)."""

    i: torch.Tensor
    j: torch.Tensor
    keep: torch.Tensor | None


class Chunks(NamedTuple):
    """Candidate pairs too many to hold at once: ``rows()`` yields :class:`Pairs` chunk by
    chunk (integer tensors, no graph, no sync), and may be called again (the backward)."""

    rows: Callable[[], Iterable[Pairs]]


def given(atoms: Atoms, pairs: torch.Tensor) -> Pairs:
    """A given (P, 2) pair list: no sync; self pairs, exclusions and padding become a mask."""
    i, j = pairs[:, 0], pairs[:, 1]
    keep = i != j  # a self pair is no pair (no sync: a mask, not a filter)
    if atoms.mask is not None:
        keep = keep & atoms.mask[i] & atoms.mask[j]
    if atoms.excl is not None:
        keep = keep & ~is_excluded(i, j, atoms.layout.period, atoms.excl)
    return Pairs(i, j, keep)


def every(atoms: Atoms) -> Pairs:
    """Every pair: a fixed-size list (shape known from N alone: no sync), O(B N^2) memory.
    In a ragged batch, every pair of a block's N rows, pairs of two structures masked."""
    layout, excl, mask = atoms.layout, atoms.excl, atoms.mask
    n, dev = layout.n, atoms.xyz.device
    n_block = atoms.xyz.shape[0] // max(n, 1)
    li, lj = torch.triu_indices(n, n, 1, device=dev)
    offset = (torch.arange(n_block, device=dev) * n)[:, None]
    i, j = (li + offset).reshape(-1), (lj + offset).reshape(-1)
    keep = None
    if layout.seg is not None:  # the same structure (the blocks' structures repeat)
        keep = (layout.seg[li] == layout.seg[lj]).expand(n_block, -1).reshape(-1)
    if excl is not None:
        if layout.period == n:
            out = (~is_excluded(li, lj, n, excl)).expand(n_block, -1).reshape(-1)
        else:
            out = ~is_excluded(i, j, layout.period, excl)
        keep = out if keep is None else keep & out
    if mask is not None:
        both = mask[i] & mask[j]
        keep = both if keep is None else keep & both
    return Pairs(i, j, keep)


def near(atoms: Atoms, tolerance: float, reach: float, max_rows: int) -> Pairs | Chunks:
    """Pairs closer than ``r_i + r_j - tolerance + reach`` by a cell list: 2 host syncs.
    Compacted when the candidates fit ``max_rows``, else :class:`Chunks` of candidates."""
    if atoms.xyz.shape[0] < 2:
        empty = atoms.xyz.new_zeros(0, dtype=torch.long)
        return Pairs(empty, empty, None)
    cells = _search(atoms, tolerance, reach)
    chunks = cells.chunks(max_rows)  # sync: sizing
    if len(chunks) <= 1:  # fits the budget: compact once
        i, j = _pair_list(cells, chunks, atoms, tolerance, reach)
        # pairs as (min, max) in that order, not the cells': each structure's sum then adds its
        # pairs in the same order whatever else is in the batch (ragged = the loop, bitwise, on the CPU)
        i, j = torch.minimum(i, j), torch.maximum(i, j)
        order = torch.sort(i * atoms.xyz.shape[0] + j).indices
        return Pairs(i.index_select(0, order), j.index_select(0, order), None)
    layout, excl = atoms.layout, atoms.excl

    def rows():  # candidate rows chunk by chunk; no compaction, hence no sync
        for lo, hi, n_rows in chunks:
            i, j = cells.rows(lo, hi, n_rows)  # integer tensors: no graph
            yield Pairs(i, j, None if excl is None else ~is_excluded(i, j, layout.period, excl))

    return Chunks(rows)


def within(atoms: Atoms, tolerance: float, reach: float, max_rows: int) -> torch.Tensor:
    """``(P, 2)`` pairs closer than ``r_i + r_j - tolerance + reach``, at most as many as
    ``max_rows`` rows' bytes hold (else ValueError): one sync to size, one per chunk."""
    if atoms.xyz.shape[0] < 2:
        return atoms.xyz.new_zeros(0, 2, dtype=torch.long)
    cells = _search(atoms, tolerance, reach)
    chunks = cells.chunks(max_rows)
    max_pairs = max_rows * BYTES_PER_ROW // BYTES_PER_PAIR
    i, j = _pair_list(cells, chunks, atoms, tolerance, reach, max_pairs)
    return torch.stack([i, j], dim=1)


@torch.no_grad()
def _search(atoms: Atoms, tolerance: float, reach: float) -> CellList:
    """Cell list of the flat batch for pairs closer than ``2 max(r) - tolerance + reach``."""
    x, r = atoms.xyz.detach(), atoms.radii.detach()
    valid = torch.isfinite(x).all(-1) & torch.isfinite(r)  # non-finite atoms: NaN loss, not a search
    if atoms.mask is not None:
        valid = valid & atoms.mask
    r_max = torch.where(valid, r, -torch.inf).amax()
    cutoff = (2 * r_max - tolerance + reach).nan_to_num(nan=0.0, neginf=0.0)
    layout = atoms.layout  # only pairs within one structure are searched
    group = (
        layout.seg
        if layout.seg is not None
        else torch.div(torch.arange(x.shape[0], device=x.device), layout.n, rounding_mode="floor")
    )
    return build_cell_list(x, group, cutoff, valid)


def _close(atoms: Atoms, i, j, tolerance: float, reach: float):
    """Pairs within ``r_i + r_j - tolerance + reach`` of each other, not excluded."""
    x, r = atoms.xyz.detach(), atoms.radii.detach()
    d2 = ((x[i] - x[j]) ** 2).sum(-1)
    lim = (r[i] + r[j] - tolerance + reach).clamp(min=0) + _FILTER_SLACK
    return (d2 < lim * lim) & ~is_excluded(i, j, atoms.layout.period, atoms.excl)


@torch.no_grad()
def _pair_list(cells: CellList, chunks, atoms: Atoms, tolerance, reach, max_pairs=None):
    """Compact (P,) lists ``i, j`` of the pairs within reach: one sync per chunk.
    Raises once the list would exceed ``max_pairs``."""
    empty = atoms.xyz.new_zeros(0, dtype=torch.long)
    out_i, out_j = [empty], [empty.clone()]
    total = 0
    for lo, hi, n_rows in chunks:
        i, j = cells.rows(lo, hi, n_rows)
        sel = _close(atoms, i, j, tolerance, reach).nonzero().squeeze(1)  # the sync: the number of pairs
        total += len(sel)
        if max_pairs is not None and total > max_pairs:
            raise ValueError(
                f"candidate_pairs: the pair list would exceed memory_budget (more than {max_pairs} "
                f"pairs at {BYTES_PER_PAIR} bytes each; atoms collapsed onto each other?): raise "
                "memory_budget, or call clash_loss without pairs=, whose neighbour method "
                "evaluates the pairs in chunks within its budget"
            )
        out_i.append(i.index_select(0, sel))
        out_j.append(j.index_select(0, sel))
    return torch.cat(out_i), torch.cat(out_j)
