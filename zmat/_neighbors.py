"""Candidate pairs of nearby points from a sorted cell list (pure torch).

Private helper of :mod:`zmat.clash`. Space is cut into cubic cells at least
``cutoff`` wide, so two points closer than ``cutoff`` lie in the same or in
adjacent cells. Each point gets an integer key (its group, then its cell, in
row-major order on a padded dense grid); sorting the keys puts the points of a
cell next to each other, and ``searchsorted`` finds the slice of every
neighbouring cell. Memory and time are O(M k) for M points with k candidates
each, instead of O(M^2).

Host synchronisation. Building the cell list (:func:`build_cell_list`) makes
none: the grid, the cell size and the keys stay on the device as tensors.
Expanding it into candidate rows needs their number on the host to size the
output: :meth:`CellList.chunks` makes **one** sync when the rows fit in one
chunk, **two** when they are split into several (the row count, then the
chunk boundaries). Candidate rows (:meth:`CellList.rows`) cost no sync;
filtering them by distance into a pair list costs one sync per chunk (in
:mod:`zmat.clash`), because the number of pairs depends on the data.

Memory. Rows are expanded chunk by chunk, at most ``max_rows`` at a time
(plus the rows of one point's cell, if a single cell holds more), so the
transient memory is bounded whatever the geometry, even when every point
sits in one cell (a collapsed structure).

Everything here runs without gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._segments import segment_arange_t, segment_ids_t

__all__ = ["CellList", "build_cell_list", "cell_list_pairs"]

# The cell itself plus the 13 neighbour offsets that are lexicographically
# positive: every unordered pair of distinct adjacent cells is visited once, so
# no pair is reported twice and no i < j filter is needed across cells. In its
# own cell a point only visits the points after it in sorted order.
# With offsets (d // 9 - 1, d // 3 % 3 - 1, d % 3 - 1), base-3 order is
# lexicographic order, so these are d = 13 (the cell itself) ... 26.
_SHELL = 14

# Cells are made this much wider than the cutoff (plus a few ulps of the span)
# so that float rounding in floor((x - lo) / cell) can never put two points
# closer than the cutoff two cells apart.
_CELL_INFLATION = 1.0 + 1e-3


@dataclass
class CellList:
    """Sorted cell list of M points: ``M * 14`` query slots (point, neighbour cell).

    Slot ``s`` asks for the points of cell ``s % 14`` (relative) of point
    ``s // 14``; they are ``order[start[s] : start[s] + count[s]]`` (in the
    point's own cell, only those after it in sorted order).
    ``cum`` is the inclusive running sum of ``count``.
    """

    order: torch.Tensor
    start: torch.Tensor
    count: torch.Tensor
    cum: torch.Tensor

    def chunks(self, max_rows: int | None = None) -> list[tuple[int, int, int]]:
        """Slot ranges ``(lo, hi, n_rows)`` of at most ``max_rows`` candidate rows each.

        A chunk holds more only when one slot alone does (at most M rows).
        Syncs with the device once (one chunk) or twice (several).
        """
        if self.cum.numel() == 0:
            return []
        total = int(self.cum[-1])  # sync: the number of candidate rows
        if total == 0:
            return []
        if max_rows is None or total <= max_rows:
            return [(0, self.cum.numel(), total)]
        k = -(-total // max_rows)
        # Cut where the running count crosses a multiple of max_rows.
        targets = torch.arange(1, k, device=self.cum.device) * max_rows
        cut = torch.searchsorted(self.cum, targets, right=True)
        before = torch.where(cut > 0, self.cum[(cut - 1).clamp_min(0)], 0)
        cuts = torch.stack([cut, before]).tolist()  # sync: the boundaries
        bounds = [(0, 0)] + list(zip(*cuts, strict=True)) + [(self.cum.numel(), total)]
        return [(a, b, rb - ra) for (a, ra), (b, rb) in zip(bounds, bounds[1:], strict=False) if rb > ra]

    def rows(self, lo: int, hi: int, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidate pairs ``(i, j)`` of slots ``[lo, hi)``, each of shape (n_rows,).

        Each unordered pair of points of neighbouring cells appears once,
        ``i != j``; some are farther apart than the cutoff, which the caller
        filters. No sync: ``n_rows`` is given.
        """
        count = self.count[lo:hi]
        local = segment_ids_t(count, n_rows)
        offset = segment_arange_t(count, n_rows, local)
        j = self.order[self.start[lo:hi][local] + offset]
        return torch.div(local + lo, _SHELL, rounding_mode="floor"), j


@torch.no_grad()
def build_cell_list(
    pos: torch.Tensor, group: torch.Tensor, cutoff: torch.Tensor | float, valid: torch.Tensor | None = None
) -> CellList:
    """Cell list of the points ``pos`` (no host sync).

    Args:
        pos: float tensor of shape (M, 3).
        group: int64 tensor of shape (M,), values >= 0; only points with the
            same group are paired (a batch member, for example).
        cutoff: distance (float or 0-d tensor); every pair closer than this
            is among the candidates.
        valid: optional bool tensor of shape (M,); invalid points (padding,
            non-finite coordinates) take no part. Non-finite points are
            always invalid.

    Returns:
        A :class:`CellList`.
    """
    device = pos.device
    if pos.shape[0] < 2:  # no pair at all
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return CellList(empty, empty, empty, empty)
    # Cell indices in float64 where the device has it (MPS does not): float32
    # rounding in floor((x - lo) / cell) grows with the span of the points.
    if device.type != "mps":
        pos = pos.double()
    ok = torch.isfinite(pos).all(-1)
    if valid is not None:
        ok = ok & valid
    inf = torch.tensor(torch.inf, dtype=pos.dtype, device=device)
    lo = torch.where(ok[:, None], pos, inf).amin(0)
    hi = torch.where(ok[:, None], pos, -inf).amax(0)
    lo = torch.where(torch.isfinite(lo), lo, 0.0)  # no valid point at all
    span = torch.where(torch.isfinite(hi), hi - lo, 0.0).amax()
    n_groups = (torch.where(ok, group, 0).amax() + 1).to(pos.dtype)
    # Keys must fit in int64: with n_groups * L^3 cells, L cells per axis at
    # most; if the points are spread too thin, wider cells keep it exact.
    per_axis = (torch.floor((2.0**62 / n_groups) ** (1 / 3)) - 3).clamp_min(1)
    cutoff = torch.as_tensor(cutoff, dtype=pos.dtype, device=device)
    cell = torch.maximum(cutoff, span / per_axis) * _CELL_INFLATION + 4 * torch.finfo(pos.dtype).eps * span
    cell = cell.clamp_min(torch.finfo(pos.dtype).tiny)  # cutoff <= 0 and one point

    # +1 padding: the neighbours of border cells still have indices >= 0 and
    # never wrap around into another row of the grid.
    c = torch.where(ok[:, None], torch.floor((pos - lo) / cell), 0.0).long() + 1
    nx, ny, nz = (c.amax(0) + 2).unbind()
    key = ((group * nx + c[:, 0]) * ny + c[:, 1]) * nz + c[:, 2]
    # Invalid points get distinct negative keys, which no query (>= 0) meets.
    key = torch.where(ok, key, -1 - torch.arange(len(key), device=device))
    sorted_key, order = torch.sort(key)

    d = torch.arange(13, 13 + _SHELL, device=device)
    shifts = ((d // 9 - 1) * ny + (d // 3 % 3 - 1)) * nz + (d % 3 - 1)
    query = key[:, None] + shifts  # (M, 14) keys of the cells to visit
    start = torch.searchsorted(sorted_key, query)
    end = torch.searchsorted(sorted_key, query, right=True)
    # Own cell (column 0): only the points after this one in sorted order, so
    # each pair in a cell is found once (half the rows of a crowded cell).
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=device))
    start = torch.cat([rank[:, None] + 1, start[:, 1:]], 1)
    count = torch.where(ok[:, None], end - start, 0).reshape(-1)
    return CellList(order, start.reshape(-1), count, torch.cumsum(count, 0))


@torch.no_grad()
def cell_list_pairs(
    pos: torch.Tensor,
    group: torch.Tensor,
    cutoff: torch.Tensor | float,
    valid: torch.Tensor | None = None,
    max_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every unordered pair of valid points of one group that may be within ``cutoff``.

    Args:
        pos, group, cutoff, valid: as :func:`build_cell_list`.
        max_rows: candidate rows expanded at a time (None: all at once).

    Returns:
        ``(i, j)``, two int64 tensors of shape (P,) indexing ``pos``; each
        unordered pair appears once (``i != j``). The list is a superset: it
        also holds pairs from adjacent cells that are farther apart than
        ``cutoff``, which the caller filters. Syncs: see the module docstring
        (sizing only: no compaction here).
    """
    cells = build_cell_list(pos, group, cutoff, valid)
    out_i, out_j = [], []
    for lo, hi, n_rows in cells.chunks(max_rows):
        i, j = cells.rows(lo, hi, n_rows)
        out_i.append(i)
        out_j.append(j)
    if not out_i:
        empty = torch.zeros(0, dtype=torch.long, device=pos.device)
        return empty, empty.clone()
    return torch.cat(out_i), torch.cat(out_j)
