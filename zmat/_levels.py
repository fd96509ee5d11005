"""The level-by-level method: all atoms of a dependency level at once.

An atom's level is one more than the level of what it needs (its rigid
parent's frame, or the positions of its references). Each level is one
vectorised NeRF step: gather the anchors, compose with the local transforms.
Levels are as many as the longest chain of dependencies, so a linear chain of
N atoms still takes N steps; wide tables (batches of molecules as a forest,
side chains) gain the most.
"""

from __future__ import annotations

import numpy as np
import torch

from ._geometry import compose, effective_internal, identity_frame, local_transform, segment_anchor
from ._stages import Staging
from .table import ConstructionTable, index_tensor


def _level_plan(table: ConstructionTable, device: torch.device) -> dict:
    return table.cached(_build_level_plan, device)


def _build_level_plan(table: ConstructionTable, device: torch.device) -> dict:
    n = table.n_atoms
    stage_atoms, steps = [], []
    for atoms in table.level_atoms:
        rigid = atoms[table.parent[atoms] >= 0]
        roots = atoms[table.parent[atoms] < 0]
        stage_atoms.append(np.concatenate([rigid, roots]))
        refs = np.where(table.refs[roots] >= 0, table.refs[roots], n)
        steps.append((rigid, roots, np.concatenate([table.parent[rigid], refs.reshape(-1)])))
    staging = Staging(stage_atoms, n)

    return {
        "steps": [
            (
                len(rigid),
                len(roots),
                index_tensor(np.concatenate([rigid, roots]), device),
                index_tensor(table.kind[roots], device),
                index_tensor(table.dihedral_plane[roots], device),
                Staging.to_device(staging.gather_plan(ids), device),
            )
            for rigid, roots, ids in steps
        ],
        "final": staging.final_index(device),
    }


def place_levels(C: torch.Tensor, table: ConstructionTable) -> torch.Tensor:
    """Positions ``(..., N, 3)`` from internal coordinates ``(..., N, 3)``."""
    c_eff = effective_internal(C, table)
    plan = _level_plan(table, c_eff.device)
    batch = c_eff.shape[:-2]
    origin = identity_frame((*batch, 1), c_eff.dtype, c_eff.device)
    outputs: list[torch.Tensor] = []
    for n_rigid, n_roots, atoms, root_kind, root_plane, gather in plan["steps"]:
        local = local_transform(c_eff.index_select(-2, atoms))
        src = Staging.gather(outputs, origin, gather) if len(atoms) else None
        anchors = []
        if n_rigid:
            anchors.append(src[..., :n_rigid, :, :])
        if n_roots:
            f = src[..., n_rigid:, :, :].unflatten(-3, (n_roots, 3))  # frames of (b, a, d)
            fd, fa, fb = f[..., 2, :, :], f[..., 1, :, :], f[..., 0, :, :]
            anchors.append(segment_anchor(root_kind, root_plane, fd, fa, fb))
        anchor = anchors[0] if len(anchors) == 1 else torch.cat(anchors, -3)
        outputs.append(compose(anchor, local))
    frames = outputs[0] if len(outputs) == 1 else torch.cat(outputs, -3)
    return frames[..., 3].index_select(-2, plan["final"])
