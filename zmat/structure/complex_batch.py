"""Batches of all-atom structures of different compositions: :class:`ComplexBatch`.

Each :class:`~zmat.protein.Complex` is one tree; a batch is their forest
(``zmat.batch.concatenate_tables``: each complex's table is validated and
planned once, when the complex is made, and the batch's arrays are those
pieces offset), its atoms stored flat (``atoms``: ``zmat.batch.Ragged``) and
padded on demand, its polymer torsions padded to ``(B, L_max)`` with NaN and
a residue mask. ``Complex.batch(items)`` (and so ``zmat.collate``) makes one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from ..batch import Ragged, concatenate_tables
from ..clash import clash_loss
from ..transform import to_xyz

__all__ = ["ComplexBatch"]


def _cat_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts, 0)``; CPU tensors outside autograd through numpy, one
    copy each with no parallel region (torch's cat of a batch is one, which
    stalls on a busy core for longer than the copies take)."""
    if all(p.device.type == "cpu" and not p.requires_grad for p in parts):
        return torch.from_numpy(np.concatenate([p.numpy() for p in parts], 0))
    return torch.cat(parts, 0)


class ComplexBatch:
    """``B`` complexes in one forest table: one ``to_xyz`` for all.

    Attributes:
        complexes: the ``B`` complexes.
        table: the forest ``ConstructionTable`` over all ``N = sum n_b`` atoms.
        atoms: ``Ragged`` offsets of the atoms; ``residues``: of the polymer residues.
        internal: ``(N, 3)`` float64, the complexes' internal coordinates back to back.
        torsions: dict of ``(B, L_max)`` tensors (``TORSION_KEYS``), NaN padding.
        residue_mask: ``(B, L_max)`` bool.
    """

    def __init__(self, complexes: Sequence) -> None:
        if len(complexes) == 0:
            raise ValueError("cannot batch an empty list of complexes")
        self.complexes = list(complexes)
        self.table, self.atoms = concatenate_tables([c.table for c in self.complexes])
        self.residues = Ragged([len(c) for c in self.complexes])
        self.internal = _cat_rows([c.internal for c in self.complexes])

    def __len__(self) -> int:
        return len(self.complexes)

    @functools.cached_property
    def torsions(self) -> dict[str, torch.Tensor]:
        keys = self.complexes[0].torsions.keys()
        return {
            k: self.residues.pad(torch.cat([c.torsions[k] for c in self.complexes]), fill=torch.nan)[0]
            for k in keys
        }

    @property
    def residue_mask(self) -> torch.Tensor:
        return self.residues.mask()

    def clash_loss(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        """``(B,)`` ``zmat.clash_loss`` of each complex (its radii and exclusions) on
        flat positions ``(N, 3)``; keyword arguments go to ``zmat.clash_loss``.
        (The complexes of a flat forest share one frame, so one call over the flat
        atoms would score pairs across complexes.)"""
        parts = self.atoms.unbatch(x, dim=-2)
        return torch.stack(
            [
                clash_loss(xk, c.radii, exclude=c.exclusions(), **kwargs)
                for c, xk in zip(self.complexes, parts, strict=True)
            ]
        )

    def internal_with_torsions(self, torsions: dict) -> torch.Tensor:
        """Flat ``(N, 3)`` internal coordinates with ``(B, L_max)`` torsions (and
        ``"ligand"``: a list of ``(T_b,)`` tensors) written into their rows
        (``Complex.internal_with_torsions``, NaN keeps the measured value)."""
        out = []
        for b, c in enumerate(self.complexes):
            t = {k: (v[b] if k == "ligand" else v[b, : len(c)]) for k, v in torsions.items()}
            out.append(c.internal_with_torsions(t))
        return torch.cat(out, 0)

    def to_xyz(self, internal: torch.Tensor | None = None, padded: bool = True, method: str = "auto"):
        """Positions: ``(B, n_max, 3)`` and the ``(B, n_max)`` atom mask when
        ``padded``, else flat ``(N, 3)`` (each complex in its own frame)."""
        x = to_xyz(self.internal if internal is None else internal, self.table, method=method)
        return self.atoms.pad(x, dim=-2) if padded else x

    def unbatch(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Flat ``(..., N, 3)`` -> the ``B`` complexes' ``(..., n_b, 3)``."""
        return self.atoms.unbatch(x, dim=-2)
