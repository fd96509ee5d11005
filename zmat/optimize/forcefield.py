"""A small force field written in torch, for examples, tests and benchmarks of the optimiser.

Not a chemistry model: a smooth, cheap, batched potential with the shape of
one (eV, Angstrom). Its topology comes from the starting geometry:

* Morse bonds between atoms closer than 1.2 times their covalent radii,
  ``D (1 - exp(-a (r - r0)))^2``, ``r0`` the sum of the covalent radii;
* angles ``k (cos theta - cos theta0)^2`` with ``theta0`` from the vertex's
  number of bonds (4: 109.47, 3: 120 degrees; 2: 180 for carbon, where the
  term is ``2 k (1 + cos theta)``, harmonic in the angle; N, O, S: 109.47);
* a threefold torsion ``v (1 + cos 3 phi)`` about every bond not at an sp centre;
* a soft repulsion ``eps (sigma / r)^12`` between atoms three or more bonds apart.
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import torch
from ase.data import covalent_radii, vdw_radii
from scipy.sparse.csgraph import shortest_path

from .._geometry import dihedral_from_bonds

__all__ = ["ToyForceField"]


class ToyForceField(torch.nn.Module):
    """``energy(xyz)``: ``(B, N, 3) -> (B,)`` eV, differentiable; topology fixed at construction.

    Args:
        numbers: ``(N,)`` atomic numbers.
        xyz: ``(N, 3)`` positions (Angstrom) whose bonds define the topology.
        morse: ``(D, a)`` in eV and 1/A; angle: ``k`` in eV; torsion: ``v`` in eV;
        repulsion: ``eps`` in eV (``sigma``: 0.7 times the sum of van der Waals radii).

    Example:
        >>> from ase.build import molecule
        >>> m = molecule("C2H6")
        >>> ff = ToyForceField(m.numbers, m.positions)
        >>> ff(torch.as_tensor(m.positions)[None]).shape
        torch.Size([1])
    """

    def __init__(self, numbers, xyz, morse=(4.0, 2.0), angle=2.0, torsion=0.02, repulsion=0.01) -> None:
        super().__init__()
        numbers = np.asarray(numbers)
        xyz = np.asarray(xyz, dtype=float)
        n = len(numbers)
        rc = covalent_radii[numbers]
        d = np.linalg.norm(xyz[:, None] - xyz[None], axis=-1)
        bonded = (d < 1.2 * (rc[:, None] + rc[None])) & ~np.eye(n, dtype=bool)
        bonds = np.argwhere(np.triu(bonded))
        angles, cos0, linear = [], [], set()
        for j in range(n):
            nb = np.flatnonzero(bonded[j])
            theta0 = {3: 2 * math.pi / 3, 2: math.pi}.get(len(nb), math.acos(-1 / 3))
            if numbers[j] in (7, 8, 15, 16):  # lone pairs: tetrahedral
                theta0 = math.acos(-1 / 3)
            if theta0 == math.pi:
                linear.add(j)
            for i, k in combinations(nb, 2):
                angles.append((i, j, k))
                cos0.append(math.cos(theta0))
        dihedrals = [
            (i, j, k, m)
            for j, k in bonds
            for i in np.flatnonzero(bonded[j])
            for m in np.flatnonzero(bonded[k])
            if i != k
            and m != j
            and i != m
            and j not in linear
            and k not in linear  # no torsion about sp atoms
        ]
        hops = shortest_path(bonded, unweighted=True)
        pairs = np.argwhere(np.triu(hops >= 3, 1))
        rv = np.nan_to_num(vdw_radii[numbers], nan=2.0)

        def buf(name, value, dtype=torch.long, shape=None):
            t = torch.as_tensor(np.asarray(value), dtype=dtype)
            self.register_buffer(name, t.reshape(shape) if shape else t)

        buf("bonds", bonds, shape=(-1, 2))
        buf("r0", rc[bonds[:, 0]] + rc[bonds[:, 1]] if len(bonds) else [], torch.float64)
        buf("angles", angles, shape=(-1, 3))
        buf("cos0", cos0, torch.float64)
        buf("dihedrals", dihedrals, shape=(-1, 4))
        buf("pairs", pairs, shape=(-1, 2))
        buf("sigma", 0.7 * (rv[pairs[:, 0]] + rv[pairs[:, 1]]) if len(pairs) else [], torch.float64)
        self.D, self.a = morse
        self.k, self.v, self.eps = angle, torsion, repulsion

    def forward(self, xyz: torch.Tensor) -> torch.Tensor:
        def dist(p):
            return (xyz[:, p[:, 0]] - xyz[:, p[:, 1]]).norm(dim=-1)

        r = dist(self.bonds)
        e = (self.D * (1 - torch.exp(-self.a * (r - self.r0.to(xyz.dtype)))) ** 2).sum(-1)
        i, j, k = self.angles.unbind(-1)
        u, w = xyz[:, i] - xyz[:, j], xyz[:, k] - xyz[:, j]
        cos = (u * w).sum(-1) / (u.norm(dim=-1) * w.norm(dim=-1))
        cos0 = self.cos0.to(xyz.dtype)
        linear = cos0 < -0.999  # (cos + 1)^2 is quartic in the angle at 180: use 1 + cos
        e = e + (self.k * torch.where(linear, 2 * (1 + cos), (cos - cos0) ** 2)).sum(-1)
        i, j, k, m = self.dihedrals.unbind(-1)
        phi = dihedral_from_bonds(xyz[:, j] - xyz[:, i], xyz[:, k] - xyz[:, j], xyz[:, m] - xyz[:, k])
        e = e + (self.v * (1 + torch.cos(3 * phi))).sum(-1)
        return e + (self.eps * (self.sigma.to(xyz.dtype) / dist(self.pairs)) ** 12).sum(-1)
