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

import torch
from torch.autograd.function import once_differentiable

from .zmatrix import ZMatrix

__all__ = ["InternalEnergy", "potential_energy"]


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
