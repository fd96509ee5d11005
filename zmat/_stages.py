"""Out-of-place assembly of frames computed in stages.

The level-by-level and the analytic methods produce frames stage by stage
(one dependency level, or one level of segments, at a time). Instead of
writing into one buffer (``X[:, j] = ...``, the in-place write autograd trips
on) or re-concatenating everything after every stage (quadratic), each
stage's output stays its own tensor. A later stage reads the frames it needs
with one ``index_select`` per source stage, planned once per table.
"""

from __future__ import annotations

import numpy as np
import torch

from .table import index_tensor


class Staging:
    """Where every atom's frame lives: ``(stage, position within the stage)``.

    Args:
        stage_atoms: global atom ids of each stage, in the order the stage
            produces them.
        n_atoms: ``N``; the id ``N`` denotes the origin slot (identity frame).
    """

    def __init__(self, stage_atoms: list[np.ndarray], n_atoms: int) -> None:
        self.stage_atoms = [np.asarray(a, np.int64) for a in stage_atoms]
        self.n_atoms = n_atoms
        self.stage_of = np.full(n_atoms + 1, -1, np.int64)
        self.pos_in = np.zeros(n_atoms + 1, np.int64)
        for s, atoms in enumerate(self.stage_atoms):
            self.stage_of[atoms] = s
            self.pos_in[atoms] = np.arange(len(atoms))
        flat = np.concatenate(self.stage_atoms) if self.stage_atoms else np.zeros(0, np.int64)
        self._final = np.empty(n_atoms, np.int64)
        self._final[flat] = np.arange(n_atoms)

    def gather_plan(self, ids: np.ndarray) -> list:
        """Plan reading the frames of ``ids`` (numpy, may contain the origin id)."""
        ids = np.asarray(ids, np.int64)
        stages = self.stage_of[ids]
        pieces, order = [], []
        for s in np.unique(stages):
            sel = np.nonzero(stages == s)[0]
            pieces.append((int(s), self.pos_in[ids[sel]]))
            order.append(sel)
        order = np.concatenate(order) if order else np.zeros(0, np.int64)
        perm = np.empty(len(ids), np.int64)
        perm[order] = np.arange(len(ids))
        identity = bool(np.array_equal(perm, np.arange(len(ids))))
        return [pieces, None if identity else perm]

    @staticmethod
    def to_device(plan: list, device) -> list:
        pieces, perm = plan
        return [
            [(s, index_tensor(p, device)) for s, p in pieces],
            None if perm is None else index_tensor(perm, device),
        ]

    @staticmethod
    def gather(outputs: list[torch.Tensor], origin: torch.Tensor, plan: list) -> torch.Tensor:
        """Frames of the planned ids, ``(..., len(ids), 3, 4)``."""
        pieces, perm = plan
        parts = [(outputs[s] if s >= 0 else origin).index_select(-3, pos) for s, pos in pieces]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, -3)
        return out if perm is None else out.index_select(-3, perm)

    def final_index(self, device) -> torch.Tensor:
        """Index that reorders the concatenated stage outputs into atom order."""
        return index_tensor(self._final, device)
