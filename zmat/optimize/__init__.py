"""Geometry optimisation in redundant internal coordinates, for a batch of conformers at once.

::

    res = zmat.optimize.minimize(energy, xyz, fmax=0.05, numbers=numbers)
    res.xyz, res.energy, res.converged, res.steps

``energy`` is any differentiable torch callable ``(B, N, 3) -> (B,)``.
:func:`scan` is a relaxed scan; ``zmat.ase.InternalOptimizer`` runs the same
steps for an ASE calculator. The rooms: :mod:`.coordinates` (primitives and
the Wilson B matrix), :mod:`.steps` (model Hessian, BFGS, RFO / trust step,
line search, back-transformation), :mod:`.optimizer` (the state machine and
the loops). See ``docs/optimize.md``.
"""

from .coordinates import Primitives, build_primitives, values, wilson_b
from .forcefield import ToyForceField
from .optimizer import InternalStepper, Result, minimize, scan

__all__ = [
    "InternalStepper",
    "ToyForceField",
    "Primitives",
    "Result",
    "build_primitives",
    "minimize",
    "scan",
    "values",
    "wilson_b",
]
