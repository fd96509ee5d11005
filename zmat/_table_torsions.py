"""The ``"table"`` route of :meth:`zmat.rdkit.TorsionSpace.to_xyz`: torsions -> positions.

A torsion space's table makes each rotatable bond ``k`` the dihedral of one
row, ``dof[k]``, and freezes every other internal coordinate. So the
positions for torsions ``t`` are one :func:`zmat.to_xyz` call on the frozen
internal coordinates with ``phi[dof[k]] = t[k] - delta[k]`` (``delta``: the
constant difference between the quad's dihedral and its row's, nonzero for
an offset row), placed in zmat's canonical frame, then mapped to each
molecule's frame by the rigid motion fitted once on its conformer:
``x_mol = R x + s``. Plain arrays in (:class:`zmat._torsion_arrays.TorsionArrays`,
no RDKit).
"""

from __future__ import annotations

import numpy as np
import torch

from ._device_plans import DevicePlans
from ._segments import segment_ids
from ._torsion_arrays import TorsionArrays
from .table import ConstructionTable, index_tensor
from .transform import to_xyz

__all__ = ["TableTorsions"]


class TableTorsions:
    """The table placement of a torsion space's atoms, planned once per dtype and device.

    Args:
        arrays: the space's arrays; this route reads ``internal``, ``dof``,
            ``delta``, ``rotation``, ``shift`` and ``n_atoms``.
        table: the space's table.
    """

    def __init__(self, arrays: TorsionArrays, table: ConstructionTable) -> None:
        self.arrays, self.table = arrays, table
        self._plans = DevicePlans()

    def frames(self, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-atom rigid motion (canonical -> Mol frame): ``(N, 3, 3)``, ``(N, 3)``."""

        def build():
            a = self.arrays
            mol_of_atom = index_tensor(segment_ids(a.n_atoms), device)
            rot = torch.as_tensor(a.rotation, dtype=dtype, device=device).index_select(0, mol_of_atom)
            return rot, torch.as_tensor(a.shift, dtype=dtype, device=device).index_select(0, mol_of_atom)

        return self._plans.get("frames", dtype, device, build)

    def scatter(self, dtype: torch.dtype, device: torch.device):
        """Frozen internal coordinates, torsion offsets, and where each atom's phi comes from."""

        def build():
            a = self.arrays
            n, k = len(a.internal), len(a.dof)
            src = np.arange(n) + k  # phi of atom i: its frozen value (slot k + i) ...
            src[a.dof] = np.arange(k)  # ... or torsion k's (slot k)
            internal = torch.as_tensor(a.internal, dtype=dtype, device=device)
            return internal, torch.as_tensor(a.delta, dtype=dtype, device=device), index_tensor(src, device)

        return self._plans.get("scatter", dtype, device, build)

    def place(self, internal: torch.Tensor) -> torch.Tensor:
        """Positions in the Mol frames of ``(..., N, 3)`` internal coordinates on the table."""
        rot, shift = self.frames(internal.dtype, internal.device)
        return (to_xyz(internal, self.table).unsqueeze(-2) * rot).sum(-1) + shift

    def __call__(self, torsions: torch.Tensor) -> torch.Tensor:
        internal, delta, src = self.scatter(torsions.dtype, torsions.device)
        frozen = internal.expand(*torsions.shape[:-1], -1, -1)
        phi = torch.cat([torsions - delta, frozen[..., 2]], -1).index_select(-1, src)
        return self.place(torch.stack([frozen[..., 0], frozen[..., 1], phi], -1))
