"""The reference method: one atom at a time, in construction order.

Plain and readable on purpose; it is the ground truth the other methods are
tested against. Frames live in a Python list, so nothing is written in place.
Its depth (and its run time) grows with the number of atoms.
"""

from __future__ import annotations

import torch

from ._geometry import compose, effective_internal, identity_frame, local_transform, segment_anchor
from .table import ConstructionTable, index_tensor


def _lists(table: ConstructionTable, device) -> tuple:
    """Order, parents and refs as plain Python ints, cached with the device plan
    (so ``torch.compile`` reads them as constants)."""
    return table.cached(_build_lists, device)


def _build_lists(table: ConstructionTable, device: torch.device) -> tuple:
    plane = index_tensor(table.dihedral_plane, device)
    return table.topo_order.tolist(), table.parent.tolist(), table.refs.tolist(), plane


def place_reference(C: torch.Tensor, table: ConstructionTable) -> torch.Tensor:
    """Positions ``(..., N, 3)`` from internal coordinates ``(..., N, 3)``."""
    c_eff = effective_internal(C, table)
    batch = c_eff.shape[:-2]
    origin = identity_frame(batch, c_eff.dtype, c_eff.device)
    kind = table.plan(c_eff.device).kind
    frames: list = [None] * table.n_atoms

    def frame(j: int) -> torch.Tensor:
        return frames[j] if j >= 0 else origin

    order, parents, refs, plane = _lists(table, c_eff.device)
    for i in order:
        local = local_transform(c_eff[..., i, :])
        if parents[i] >= 0:
            anchor = frames[parents[i]]  # rigid child: b's propagated frame
        else:
            b, a, d = refs[i]
            anchor = segment_anchor(kind[i], plane[i], frame(d), frame(a), frame(b))
        frames[i] = compose(anchor, local)
    return torch.stack([f[..., 3] for f in frames], -2)
