"""Candidate pairs of nearby points from a sorted cell list (pure torch).

Private helper of :mod:`zmat.clash`. Space is cut into cubic cells at least
``cutoff`` wide, so two points closer than ``cutoff`` lie in the same or in
adjacent cells. Each point gets an integer key (its group, then its cell, in
row-major order on a padded dense grid); sorting the keys puts the points of a
cell next to each other, and ``searchsorted`` finds the slice of every
neighbouring cell. Memory and time are O(M k) for M points with k candidates
each, instead of O(M^2).

Everything here runs without gradient. The number of candidates depends on the
data, so building the list synchronises with the device once (to size the
output); callers keep the differentiable part separate.
"""

from __future__ import annotations

import itertools

import torch

__all__ = ["cell_list_pairs"]

# The cell itself plus the 13 neighbour offsets that are lexicographically
# positive: every unordered pair of distinct adjacent cells is visited once, so
# no pair is reported twice and no i < j filter is needed across cells.
_HALF_SHELL = [(0, 0, 0)] + [off for off in itertools.product((-1, 0, 1), repeat=3) if off > (0, 0, 0)]

# Cells are made this much wider than the cutoff (plus a few ulps of the span)
# so that float rounding in floor((x - lo) / cell) can never put two points
# closer than the cutoff two cells apart.
_CELL_INFLATION = 1.0 + 1e-3


@torch.no_grad()
def cell_list_pairs(
    pos: torch.Tensor, group: torch.Tensor, cutoff: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every unordered pair of points of one group that may be within ``cutoff``.

    Args:
        pos: float tensor of shape (M, 3), finite coordinates.
        group: int64 tensor of shape (M,), values >= 0; only points with the
            same group are paired (a batch member, for example).
        cutoff: positive distance; every pair closer than this is returned.

    Returns:
        ``(i, j)``, two int64 tensors of shape (P,) indexing ``pos``; each
        unordered pair appears once (``i != j``). The list is a superset: it
        also holds pairs from adjacent cells that are farther apart than
        ``cutoff``, which the caller filters.

    Raises:
        ValueError: if ``pos`` holds NaN or infinite values.
    """
    m = pos.shape[0]
    device = pos.device
    if m < 2 or not cutoff > 0:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return empty, empty.clone()
    if not bool(torch.isfinite(pos).all()):
        raise ValueError("clash: coordinates of unmasked atoms must be finite")

    # Cell indices in float64 where the device has it (MPS does not): float32
    # rounding in floor((x - lo) / cell) grows with the span of the points.
    if pos.device.type != "mps":
        pos = pos.double()
    lo = pos.min(0).values
    span = float((pos.max(0).values - lo).max())
    n_groups = int(group.max()) + 1
    # Keys must fit in int64: with n_groups * L^3 cells, L cells per axis at
    # most; if the points are spread too thin, wider cells keep it exact.
    per_axis = max(int((2.0**62 / n_groups) ** (1 / 3)) - 3, 1)
    cell = max(cutoff, span / per_axis) * _CELL_INFLATION + 4 * torch.finfo(pos.dtype).eps * span

    # +1 padding: the neighbours of border cells still have indices >= 0 and
    # never wrap around into another row of the grid.
    c = torch.floor((pos - lo) / cell).long() + 1
    nx, ny, nz = (int(v) + 2 for v in c.max(0).values)
    key = ((group * nx + c[:, 0]) * ny + c[:, 1]) * nz + c[:, 2]
    sorted_key, order = torch.sort(key)

    shifts = torch.tensor([dx * ny * nz + dy * nz + dz for dx, dy, dz in _HALF_SHELL], device=device)
    query = key[:, None] + shifts  # (M, 14) keys of the cells to visit
    start = torch.searchsorted(sorted_key, query).reshape(-1)
    count = torch.searchsorted(sorted_key, query, right=True).reshape(-1) - start

    # Expand each (point, cell) query into one row per point in that cell.
    total = int(count.sum())  # the one host sync: the size of the output
    slot = torch.repeat_interleave(torch.arange(count.numel(), device=device), count, output_size=total)
    first = torch.cumsum(count, 0) - count
    j = order[start[slot] + torch.arange(total, device=device) - first[slot]]
    i = slot // len(_HALF_SHELL)
    # Within one cell both orders are found: keep i < j (drops i == j too).
    keep = (slot % len(_HALF_SHELL) != 0) | (i < j)
    return i[keep], j[keep]
