"""ASE calculators in internal coordinates: the energy of a :class:`~zmat.ZMatrix` and its gradient.

An ASE calculator gives the energy ``E`` and the Cartesian forces
``F = -dE/dx`` of an ``ase.Atoms``. :func:`potential_energy` wraps one call as
a differentiable function of the positions (its backward is ``-F`` times the
incoming gradient), so composed with :func:`zmat.to_xyz` autograd gives the
gradient in internal coordinates in one vector-Jacobian product::

    dE/dC = (dx/dC)^T dE/dx = -(dx/dC)^T F

:class:`InternalEnergy` does that for a z-matrix: ``energy(C)`` is a 0-d
tensor whose backward fills ``C.grad``; ``energy.of_variables(v)`` is the
energy as a function of the z-matrix's Gaussian variables
(:meth:`zmat.ZMatrix.internal_from_variables`), so a shared variable gets the
sum of its uses' gradients. Any torch optimiser then works on bond lengths,
angles and dihedrals (``examples/geometry_optimisation.py``).

Conventions: lengths in Angstrom, angles in radians, energies in the
calculator's unit (eV for ASE's calculators). Dummy atoms (``'X'``) are not
passed to the calculator; their rows get the gradient of the real atoms they
place. ASE constraints on ``atoms`` (``FixAtoms``, ...) are not applied: the
energy and its gradient are the calculator's own (freeze rows of ``C`` to
constrain internal coordinates). One structure per call (a calculator is not batched); the positions go
to the host, so this is interop code, not a hot path. The backward uses the
forces of the forward call: first derivatives only.
"""

from __future__ import annotations

import numpy as np
import torch
from ase.optimize.optimize import Optimizer as _AseOptimizer
from torch.autograd.function import once_differentiable

from .optimize import InternalStepper
from .zmatrix import ZMatrix

__all__ = ["InternalEnergy", "InternalOptimizer", "potential_energy"]


class _CalculatorEnergy(torch.autograd.Function):
    """``E(x)`` from an ASE calculator; backward ``-F``."""

    @staticmethod
    def forward(ctx, xyz: torch.Tensor, atoms) -> torch.Tensor:
        atoms.positions = xyz.detach().to("cpu", torch.float64).numpy()
        # the calculator's own energy and forces: an ASE constraint (FixAtoms zeroes forces) would make
        # -F differ from dE/dx, and constraints in internal coordinates are the caller's to impose
        energy = float(atoms.get_potential_energy(apply_constraint=False))
        forces = torch.as_tensor(atoms.get_forces(apply_constraint=False), dtype=xyz.dtype).to(xyz.device)
        ctx.save_for_backward(forces)
        return torch.tensor(energy, dtype=xyz.dtype, device=xyz.device)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (forces,) = ctx.saved_tensors
        return -grad * forces, None


def potential_energy(xyz: torch.Tensor, atoms) -> torch.Tensor:
    """Energy of ``atoms`` (an ``ase.Atoms`` with a calculator) at positions ``xyz``.

    Args:
        xyz: ``(n_atoms, 3)`` float tensor, Angstrom; the positions are set on
            ``atoms``.
        atoms: the ``ase.Atoms`` whose calculator is called.

    Returns:
        a 0-d tensor (``xyz``'s dtype and device), differentiable in ``xyz``
        (``dE/dx = -F``, first order).

    Raises:
        ValueError: ``xyz`` is not ``(len(atoms), 3)``, or ``atoms`` has no
            calculator.
    """
    if atoms.calc is None:
        raise ValueError("atoms has no calculator: set atoms.calc first")
    if tuple(xyz.shape) != (len(atoms), 3):
        raise ValueError(f"xyz must have shape ({len(atoms)}, 3) for these atoms, got {tuple(xyz.shape)}")
    return _CalculatorEnergy.apply(xyz, atoms)


class InternalEnergy:
    """Energy of a :class:`~zmat.ZMatrix` under an ASE calculator, as a function of its internal coordinates.

    Args:
        zm: the z-matrix (its table places the atoms; dummies allowed).
        calc: an ASE calculator; ``None`` to use ``atoms.calc``.
        atoms: the ``ase.Atoms`` the calculator sees (default
            ``zm.to_atoms()``); set a cell or other info here when the
            calculator needs it. Its atoms are the z-matrix's real atoms, in
            row order.

    Attributes:
        calls: number of calculator calls so far.

    Example:
        >>> from ase.calculators.emt import EMT
        >>> zm = zmat.ZMatrix.from_string("O\\nH 1 0.97\\nH 1 0.97 2 104.5")
        >>> energy = InternalEnergy(zm, EMT())
        >>> C = zm.internal.clone().requires_grad_(True)
        >>> energy(C).backward()  # C.grad: dE/dr (eV/A), dE/dtheta (eV/rad)
        >>> C.grad.shape
        torch.Size([3, 3])
    """

    def __init__(self, zm: ZMatrix, calc=None, atoms=None) -> None:
        self.zm = zm
        self.atoms = zm.to_atoms() if atoms is None else atoms
        if calc is not None:
            self.atoms.calc = calc
        if self.atoms.calc is None:
            raise ValueError("no calculator: pass calc= or atoms with atoms.calc set")
        self.real = torch.as_tensor(~zm.dummy_mask)
        if len(self.atoms) != int(self.real.sum()):
            raise ValueError(
                f"atoms has {len(self.atoms)} atoms, the z-matrix {int(self.real.sum())} real rows (not X)"
            )
        self.calls = 0

    def __call__(self, internal: torch.Tensor | None = None) -> torch.Tensor:
        """Energy at ``(N, 3)`` internal coordinates (default ``zm.internal``), differentiable in them."""
        internal = self.zm.internal if internal is None else internal
        if internal.shape != (len(self.zm), 3):
            raise ValueError(
                f"internal must have shape ({len(self.zm)}, 3) (one structure per call), "
                f"got {tuple(internal.shape)}"
            )
        xyz = self.zm.to_xyz(internal)[self.real.to(internal.device)]
        self.calls += 1
        return potential_energy(xyz, self.atoms)

    def energy_and_gradient(self, internal: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
        """``(E, dE/dC)``: the energy (a float) and its ``(N, 3)`` gradient (0 where no reference)."""
        c = (self.zm.internal if internal is None else internal).detach().requires_grad_(True)
        energy = self(c)
        (grad,) = torch.autograd.grad(energy, c)
        return float(energy.detach()), grad

    def of_variables(self, values: torch.Tensor) -> torch.Tensor:
        """Energy at the z-matrix variables ``values`` (``(V,)``, :attr:`ZMatrix.variable_uses` order),
        differentiable in them: a shared variable's gradient sums its uses (with their signs)."""
        return self(self.zm.internal_from_variables(values))


class InternalOptimizer(_AseOptimizer):
    """An ASE optimiser that steps in redundant internal coordinates (:mod:`zmat.optimize`).

    ``InternalOptimizer(atoms).run(fmax=0.05)`` works with any ASE calculator:
    bonds (ring closures, hydrogen bonds, contacts between fragments), angles,
    linear bends, dihedrals and out-of-plane angles, a model Hessian updated
    by BFGS, RFO / trust-radius steps (pyberny's algorithm). ASE's semantics:
    ``run`` returns whether the largest per-atom force norm fell below
    ``fmax``; ``nsteps`` counts steps (energy evaluations minus one);
    ``trajectory`` and ``logfile`` as every ASE optimiser.

    Args:
        atoms: an ``ase.Atoms`` with a calculator (no cell filters: the
            coordinates are the atoms' positions). A ``FixAtoms`` constraint
            on it freezes those atoms.
        logfile, trajectory, restart, append_trajectory: as ASE's optimisers
            (``restart`` files are not written: the state is tensors).
        constraints: :func:`zmat.optimize.minimize`'s (bonds, angles,
            dihedrals held; ``"frozen"`` atoms); then convergence is judged
            on the forces left after removing the constraint forces.
        trust: initial trust radius (Angstrom, geomeTRIC's 0.1): the largest RMS displacement of one
            fragment's atoms in a step.
        out_of_plane: include out-of-plane angles of three-coordinate centres.
        coords: ``"redundant"`` (fragments joined by contact bonds) or
            ``"tric"`` (each fragment's translation and rotation instead).

    Example:
        >>> from ase.build import molecule
        >>> from ase.calculators.emt import EMT
        >>> atoms = molecule("CH4"); atoms.rattle(0.05, seed=0); atoms.calc = EMT()
        >>> opt = InternalOptimizer(atoms, logfile=None)
        >>> opt.run(fmax=0.01)
        True
    """

    def __init__(
        self,
        atoms,
        restart=None,
        logfile="-",
        trajectory=None,
        append_trajectory: bool = False,
        *,
        constraints=None,
        trust: float = 0.1,
        out_of_plane: bool = True,
        coords: str = "redundant",
        **kwargs,
    ) -> None:
        from ase import Atoms

        if not isinstance(atoms, Atoms):
            raise TypeError(
                f"InternalOptimizer needs an ase.Atoms (no cell filters), got {type(atoms).__name__}"
            )
        self.zmat_constraints = dict(constraints or {})
        self.trust = trust
        self.out_of_plane = out_of_plane
        self.coords = coords
        self.stepper = None
        super().__init__(
            atoms,
            restart=restart,
            logfile=logfile,
            trajectory=trajectory,
            append_trajectory=append_trajectory,
            **kwargs,
        )

    def _constraints(self) -> dict:
        from ase.constraints import FixAtoms

        out = dict(self.zmat_constraints)
        frozen = [int(a) for a in np.atleast_1d(out.pop("frozen", []))]
        for c in self.atoms.constraints:
            if not isinstance(c, FixAtoms):
                raise ValueError(
                    f"InternalOptimizer: ASE constraint {type(c).__name__} is not supported; "
                    "use FixAtoms, or constraints={...} for bonds, angles and dihedrals"
                )
            frozen += [int(a) for a in c.get_indices()]
        if frozen:
            out["frozen"] = sorted(set(frozen))
        return out

    def _state(self):
        x = torch.as_tensor(self.atoms.get_positions(), dtype=torch.float64)[None]
        g = -torch.as_tensor(self.atoms.get_forces(), dtype=torch.float64)[None]
        if self.stepper is None:
            self.stepper = InternalStepper(
                x,
                self.atoms.numbers,
                self._constraints(),
                trust=self.trust,
                out_of_plane=self.out_of_plane,
                coords=self.coords,
            )
        return x, g

    def initialize(self) -> None:
        self.stepper = None

    def read(self):
        raise NotImplementedError("InternalOptimizer does not restart from a file")

    def step(self, *args, **kwargs) -> None:
        x, g = self._state()
        if self.stepper.needs_rebuild(x):
            self.stepper.rebuild(self.stepper._internal(x))
        e = torch.tensor([self.atoms.get_potential_energy()], dtype=torch.float64)
        _, x_new = self.stepper.step(x, e, g)
        self.atoms.set_positions(x_new[0].numpy())

    def _fmax(self) -> float:
        x, g = self._state()
        return float(self.stepper.fmax(x, g)[0])

    def converged(self, *args, **kwargs) -> bool:
        return self._fmax() < self.fmax

    def gradient_converged(self, gradient) -> bool:
        return self._fmax() < self.fmax
