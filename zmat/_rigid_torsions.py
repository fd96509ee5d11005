"""The ``"rigid"`` route of :meth:`zmat.rdkit.TorsionSpace.to_xyz`: torsions -> positions.

Each rotatable bond's moving side is a rigid body: the rotations by
``t - t0`` about the conformer's bond axes ``b -> c`` (Rodrigues,
``R = I + sin(d) [u]x + (1 - cos(d)) [u]x^2``, through ``b``) are composed
from the root outwards, one vectorised step per nesting level of rotatable
bonds, and every atom takes its innermost torsion's motion ``x = R x0 + t``.
The compiled CPU kernel (``zmat._kernel.torsions``) does the same where it is
usable; the torch ops are the fallback, the reference and the double backward.
Plain arrays in (no RDKit): :class:`zmat.rdkit.TorsionSpace` holds one.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _kernel
from .table import index_tensor

__all__ = ["RigidTorsions"]


def _apply(rot: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``rot @ v`` for ``(..., 3, 3)`` and ``(..., 3)``, written out (no tiny bmm)."""
    return (rot * v.unsqueeze(-2)).sum(-1)


class RigidTorsions:
    """The rigid-body placement of a torsion space's atoms, planned once per dtype and device.

    Args:
        positions: ``(N, 3)`` float64 conformer positions.
        quads: ``(K, 4)`` int64 tensor, flat atom indices ``(a, b, c, d)``; ``c``'s side moves.
        torsions: ``(K,)`` the conformer's dihedrals of ``quads``.
        owner: ``(N,)`` innermost torsion moving each atom, -1: none.
        bond_parent: ``(K,)`` innermost torsion moving bond ``k``, -1: none.
        level: ``(K,)`` nesting depth of every torsion.
    """

    def __init__(self, positions, quads, torsions, owner, bond_parent, level) -> None:
        self.positions, self.quads, self.torsions = positions, quads, torsions
        self.owner, self.bond_parent, self.level = owner, bond_parent, level
        self._cache: dict = {}

    def _cached(self, name: str, dtype: torch.dtype, device: torch.device, build):
        key = (name, dtype, device)
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def plan(self, dtype, device):
        """Torsions sorted by nesting level; slot 0 of the transform stack is the identity."""

        def build():
            k, parent, level = len(self.bond_parent), self.bond_parent, self.level
            perm = np.argsort(level, kind="stable")
            slot = np.zeros(k + 1, np.int64)  # slot[-1] = 0: "no torsion", the identity
            slot[perm] = np.arange(1, k + 1)
            sizes = np.bincount(level, minlength=1).tolist() if k else []
            parents = np.split(slot[parent][perm], np.cumsum(sizes)[:-1])[: len(sizes)]  # per level
            # the per-torsion geometry in numpy (float64, then cast): a fresh
            # batch's plan in a few vectorised calls instead of ~20 small ops
            x0 = self.positions.detach().cpu().numpy()
            q = self.quads.numpy()[perm]
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
                put(self.torsions.detach().cpu().numpy()[perm]),
                index_tensor(perm, device),
                [index_tensor(p, device) for p in parents],
                index_tensor(slot[self.owner], device),  # atom -> slot of its innermost torsion
                sizes,
            )

        return self._cached("rigid", dtype, device, build)

    def kernel_plan(self):
        """The rigid route's arrays for the compiled kernel (``zmat._kernel.torsions``), CPU float64."""

        def build():
            k, parent, level = len(self.bond_parent), self.bond_parent, self.level
            perm = np.argsort(level, kind="stable")  # nesting order: parents first
            pos = np.empty(k + 1, np.int64)  # pos[j]: where torsion j is in that order; pos[-1] = -1
            pos[perm], pos[k] = np.arange(k), -1
            x0 = self.positions.detach().cpu().numpy()
            q = self.quads.numpy()[perm]
            axis = x0[q[:, 2]] - x0[q[:, 1]]
            arrays = (
                perm,
                pos[parent[perm]],
                pos[self.owner],
                self.torsions.detach().cpu().numpy()[perm],
                axis / np.linalg.norm(axis, axis=-1, keepdims=True),
                x0[q[:, 1]],  # a point on each axis
                x0,
            )
            return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)

        return self._cached("kernel", torch.float64, torch.device("cpu"), build)

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
