"""The ``"rigid"`` route of :meth:`zmat.rdkit.TorsionSpace.to_xyz`: torsions -> positions.

Each rotatable bond's moving side is a rigid body: the rotations by
``t - t0`` about the conformer's bond axes ``b -> c`` (Rodrigues,
``R = I + sin(d) [u]x + (1 - cos(d)) [u]x^2``, through ``b``) are composed
from the root outwards, one vectorised step per nesting level of rotatable
bonds, and every atom takes its innermost torsion's motion ``x = R x0 + t``.
The compiled CPU kernel (``zmat._kernel.torsions``) does the same where it is
usable; the torch ops are the fallback, the reference and the double backward.
Plain arrays in (:class:`zmat._torsion_arrays.TorsionArrays`, no RDKit):
:class:`zmat.rdkit.TorsionSpace` holds one; :func:`moving_sides` makes the
nesting arrays it needs from a molecule's table.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _kernel
from ._device_plans import DevicePlans
from ._segments import ptr
from ._torsion_arrays import TorsionArrays
from .table import ConstructionTable, index_tensor

__all__ = ["RigidTorsions", "moving_sides"]


def moving_sides(table: ConstructionTable, quads: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How the rotatable bonds ``quads`` of a torsion-space table nest: ``(owner, bond_parent, level)``.

    ``owner[i]``: the innermost torsion whose moving side holds atom ``i``
    (the nearest ancestor ``c`` of a quad along the bond references; -1:
    none); ``bond_parent[k]``: the innermost torsion that moves bond ``k``
    (the owner of its ``b``); ``level[k]``: its depth, the number of
    ``bond_parent`` ancestors.
    """
    refs = table.refs
    owner = np.full(table.n_atoms, -1, np.int64)
    moves = {int(c): k for k, c in enumerate(quads[:, 2])}  # c (the moving atom) starts torsion k's side
    for i in table.topo_order.tolist():  # references first: a tree parent before its children
        owner[i] = moves.get(i, owner[refs[i, 0]] if refs[i, 0] >= 0 else -1)
    bond_parent = owner[quads[:, 1]] if len(quads) else np.zeros(0, np.int64)
    level, anc = np.zeros(len(quads), np.int64), bond_parent.copy()
    while (anc >= 0).any():  # depth of nested rotatable bonds: a handful of steps
        level += anc >= 0
        anc = np.where(anc >= 0, bond_parent[np.maximum(anc, 0)], -1)
    return owner, bond_parent, level


def _apply(rot: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``rot @ v`` for ``(..., 3, 3)`` and ``(..., 3)``, written out (no tiny bmm)."""
    return (rot * v.unsqueeze(-2)).sum(-1)


class RigidTorsions:
    """The rigid-body placement of a torsion space's atoms, planned once per dtype and device.

    Args:
        arrays: the space's arrays; this route reads ``positions`` (the
            conformers), ``quads`` (flat atom indices ``(a, b, c, d)``, ``c``'s
            side moves), ``torsions`` (their dihedrals in the conformers) and
            the nesting ``owner``, ``bond_parent``, ``level`` (:func:`moving_sides`).
    """

    def __init__(self, arrays: TorsionArrays) -> None:
        self.positions, self.quads, self.torsions = arrays.positions, arrays.quads, arrays.torsions
        self.owner, self.bond_parent, self.level = arrays.owner, arrays.bond_parent, arrays.level
        self._plans = DevicePlans()

    def plan(self, dtype, device):
        """Torsions sorted by nesting level; slot 0 of the transform stack is the identity."""

        def build():
            k, parent, level = len(self.bond_parent), self.bond_parent, self.level
            perm = np.argsort(level, kind="stable")
            slot = np.zeros(k + 1, np.int64)  # slot[-1] = 0: "no torsion", the identity
            slot[perm] = np.arange(1, k + 1)
            sizes = np.bincount(level, minlength=1).tolist() if k else []
            parents = np.split(slot[parent][perm], ptr(sizes)[1:-1]) if k else []  # per level
            # the per-torsion geometry in numpy (float64, then cast): a fresh
            # batch's plan in a few vectorised calls instead of ~20 small ops
            x0, q = self.positions, self.quads[perm]
            axis = x0[q[:, 2]] - x0[q[:, 1]]
            u = axis / np.linalg.norm(axis, axis=-1, keepdims=True)
            ux, uy, uz = u.T
            zero = np.zeros_like(ux)
            skew = np.stack([zero, -uz, uy, uz, zero, -ux, -uy, ux, zero], -1).reshape(-1, 3, 3)

            def put(a):
                return torch.as_tensor(a, dtype=dtype, device=device)

            return (
                put(x0),
                put(x0[q[:, 1]]),  # a point on each axis
                put(skew),
                put(u[:, :, None] * u[:, None, :] - np.eye(3)),  # skew @ skew, for a unit axis
                put(self.torsions[perm]),
                index_tensor(perm, device),
                [index_tensor(p, device) for p in parents],
                index_tensor(slot[self.owner], device),  # atom -> slot of its innermost torsion
                sizes,
            )

        return self._plans.get("rigid", dtype, device, build)

    def kernel_plan(self):
        """The rigid route's arrays for the compiled kernel (``zmat._kernel.torsions``), CPU float64."""

        def build():
            k, parent, level = len(self.bond_parent), self.bond_parent, self.level
            perm = np.argsort(level, kind="stable")  # nesting order: parents first
            pos = np.empty(k + 1, np.int64)  # pos[j]: where torsion j is in that order; pos[-1] = -1
            pos[perm], pos[k] = np.arange(k), -1
            x0, q = self.positions, self.quads[perm]
            axis = x0[q[:, 2]] - x0[q[:, 1]]
            arrays = (
                perm,
                pos[parent[perm]],
                pos[self.owner],
                self.torsions[perm],
                axis / np.linalg.norm(axis, axis=-1, keepdims=True),
                x0[q[:, 1]],  # a point on each axis
                x0,
            )
            return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)

        return self._plans.get("kernel", torch.float64, torch.device("cpu"), build)

    def __call__(self, torsions: torch.Tensor) -> torch.Tensor:
        k, n = len(self.bond_parent), len(self.positions)
        if k and _kernel.usable(torsions):
            t = torsions.reshape(-1, k)
            x = _kernel.torsions(t, self.kernel_plan(), self.vjp)
            return x.view(*torsions.shape[:-1], n, 3)
        return self.torch_path(torsions)

    def vjp(self, t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The kernel's gradient in torch ops (double backward): ``(B, K)``, ``(B, N, 3)`` -> ``(B, K)``."""
        with torch.enable_grad():
            return torch.autograd.grad(self.torch_path(t), t, g, create_graph=True)[0]

    def torch_path(self, torsions: torch.Tensor) -> torch.Tensor:
        x0, point, skew, skew2, t0, perm, parent_slots, atom_slot, sizes = self.plan(
            torsions.dtype, torsions.device
        )
        batch = torsions.shape[:-1]
        delta = torsions.index_select(-1, perm) - t0
        # Rodrigues: rotation by delta about the bond axis b -> c, through b
        eye = torch.eye(3, dtype=x0.dtype, device=x0.device)
        rot = eye + delta.sin()[..., None, None] * skew + (1 - delta.cos())[..., None, None] * skew2
        shift = point - _apply(rot, point)
        # compose outwards, one nesting level at a time (3x3 products written out: tiny bmm is slow)
        rots, shifts = [eye.expand(*batch, 1, 3, 3)], [torch.zeros_like(x0[:1]).expand(*batch, 1, 3)]
        for r, t, ps in zip(rot.split(sizes, -3), shift.split(sizes, -2), parent_slots, strict=True):
            pr = torch.cat(rots, -3).index_select(-3, ps)
            rots.append((pr.unsqueeze(-1) * r.unsqueeze(-3)).sum(-2))
            shifts.append(_apply(pr, t) + torch.cat(shifts, -2).index_select(-2, ps))
        # every atom takes its innermost torsion's motion: x = R x0 + t, R by columns, each
        # gathered from the small (..., S, 3) stack (slicing the gathered (..., N, 12) instead
        # makes the backward fill several (..., N, 12) zero tensors)
        r_all, t_all = torch.cat(rots, -3), torch.cat(shifts, -2)
        x = t_all.index_select(-2, atom_slot)
        for j in range(3):
            x = x + r_all[..., j].index_select(-2, atom_slot) * x0[:, j : j + 1]
        return x
