"""The optimiser: quasi-Newton steps in redundant internal coordinates for a batch of conformers.

:class:`InternalStepper` holds the state of ``B`` optimisations of one
molecule (same atoms, one coordinate system) and turns each evaluated
geometry (energy, gradient) into the next one. Each step, per conformer
(pyberny's algorithm, batched):

1. Wilson B at the new geometry; the internal gradient ``g_q = (B^+)^T g_x``.
2. BFGS update of the primitive Hessian with the change since the best point.
3. Trust radius from the ratio of actual to predicted energy change, both
   measured from the interpolated point the last step started from
   (Fletcher: below 1/4 shrink to a quarter of the last step, above 3/4 on
   the sphere double). The radius is Cartesian (geomeTRIC's): the largest
   RMS displacement of a fragment's atoms in the step's linear image.
4. A cubic line search between the new point and the best one.
5. From the interpolated point, the RFO step in the non-redundant space,
   scaled down to the trust radius (with constraints: the constrained
   coordinates move exactly to their targets, the rest minimises the model
   in the remaining space).
6. Back-transformation to Cartesians.

Everything is a tensor operation over the batch: no host synchronisation
inside a step on a GPU (on the CPU, where reading a tensor is free, the
back-transformation and the trust-sphere iterations stop once every conformer
has converged). :func:`minimize` adds one per iteration (are all conformers
done; did an angle become linear, which rebuilds the coordinates).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from ase.data import covalent_radii
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from . import steps as _steps
from .coordinates import build_primitives, kernel_layout, values, values_and_b
from .steps import (
    BOHR,
    HARTREE,
    _ceil,
    _floor,
    back_transform,
    bfgs,
    cubic_search,
    model_hessian,
    period,
    pinv_t_apply,
    reduced_space,
    trust_step,
    wrap,
)

__all__ = ["InternalStepper", "Result", "minimize", "scan"]

_UNITS = {"eV/A": (HARTREE, BOHR), "hartree/bohr": (1.0, 1.0), "kcal/mol/A": (627.509474, BOHR)}


@dataclass
class Result:
    """What :func:`minimize` returns (``B`` conformers).

    Attributes:
        xyz: ``(B, N, 3)`` final positions (the last evaluated geometry).
        energy: ``(B,)`` its energy.
        converged: ``(B,)`` bool, largest per-atom force norm below ``fmax``.
        steps: ``(B,)`` long, energy (and gradient) evaluations of each conformer.
        fmax: ``(B,)`` largest per-atom force norm at ``xyz`` (constraint forces removed).
    """

    xyz: torch.Tensor
    energy: torch.Tensor
    converged: torch.Tensor
    steps: torch.Tensor
    fmax: torch.Tensor


def _parse_constraints(constraints, n: int, bsz: int) -> tuple[dict, tuple[int, ...]]:
    """``{atoms: value or None}`` for bonds / angles / dihedrals and the frozen atoms, checked."""
    if constraints is None:
        return {}, ()
    if not isinstance(constraints, dict):
        raise TypeError(f"constraints must be a dict, got {type(constraints).__name__}")
    fixed, frozen = {}, ()
    for key, value in constraints.items():
        if key == "frozen":
            frozen = tuple(int(a) for a in np.atleast_1d(np.asarray(value)))
            bad = [a for a in frozen if not 0 <= a < n]
            if bad:
                raise ValueError(f"constraints['frozen']: atoms {bad} out of range for {n} atoms")
            continue
        if not isinstance(key, tuple) or len(key) not in (2, 3, 4):
            raise ValueError(
                f"constraint key {key!r}: give a bond (i, j), an angle (i, j, k), a dihedral (i, j, k, l) "
                "or 'frozen'"
            )
        atoms = tuple(int(a) for a in key)
        if len(set(atoms)) != len(atoms) or not all(0 <= a < n for a in atoms):
            raise ValueError(f"constraint {key!r}: atoms must be distinct and in range for {n} atoms")
        if value is not None:
            value = torch.as_tensor(value, dtype=torch.float64).reshape(-1)
            if value.numel() not in (1, bsz):
                raise ValueError(
                    f"constraint {key!r}: one value or one per conformer ({bsz}), got {value.numel()}"
                )
        fixed[atoms] = value
    return fixed, frozen


class InternalStepper:
    """The optimiser's state for ``B`` conformers of one molecule.

    Args:
        xyz: ``(B, N, 3)`` starting positions (Angstrom, or ``units``'s length).
        numbers: ``(N,)`` atomic numbers (for bonds and the model Hessian).
        constraints: see :func:`minimize`.
        trust: initial trust radius (Angstrom, geomeTRIC's 0.1): the largest RMS displacement of the
            atoms of one fragment in a step (at most :data:`TRUST_MAX`).
        units: ``"eV/A"`` (ASE's), ``"hartree/bohr"`` or ``"kcal/mol/A"``.
        out_of_plane: include out-of-plane angles.
        back_iterations: most iterations of the back-transformation per step.
        coords: ``"redundant"`` or ``"tric"`` (see :func:`minimize`).

    Call :meth:`step` with each evaluated geometry; it returns the largest
    per-atom force norm there and the next geometry.
    """

    def __init__(
        self,
        xyz: torch.Tensor,
        numbers,
        constraints=None,
        trust: float = 0.1,
        units: str = "eV/A",
        out_of_plane: bool = True,
        back_iterations: int = 10,
        coords: str = "redundant",
    ) -> None:
        if units not in _UNITS:
            raise ValueError(f"units must be one of {sorted(_UNITS)}, got {units!r}")
        self.energy_unit, self.length_unit = _UNITS[units]
        bsz, n = xyz.shape[:2]
        self.numbers = np.asarray(numbers, dtype=np.int64)
        if self.numbers.shape != (n,):
            raise ValueError(f"numbers must have shape ({n},) for {n} atoms, got {self.numbers.shape}")
        self.device = xyz.device
        self.fixed, self.frozen = _parse_constraints(constraints, n, bsz)
        self.trust0 = trust
        self.out_of_plane = out_of_plane
        self.back_iterations = back_iterations
        self.coords = coords
        self.radii = torch.as_tensor(covalent_radii[self.numbers] / BOHR, device=self.device)
        self.rows = period(self.numbers).to(self.device)
        x = self._internal(xyz)
        self.x0 = x
        self.rebuild(x)
        self.trust = torch.full((bsz,), min(trust, TRUST_MAX) / BOHR, dtype=torch.float64, device=self.device)
        # constraint targets: given values, or the starting values
        q0 = values(self.prims, x)
        targets = []
        for atoms, value in self.fixed.items():
            k = self.prims.find(atoms)
            if value is None:
                targets.append(q0[:, k])
            else:
                scale = 1.0 / self.length_unit if len(atoms) == 2 else 1.0
                targets.append((value.to(self.device) * scale).expand(bsz))
        for a in self.frozen:
            targets += [x[:, a, c] for c in range(3)]
        self.targets = torch.stack(targets, -1) if targets else x.new_zeros(bsz, 0)

    # -- units: inside, bohr and hartree
    def _internal(self, xyz: torch.Tensor) -> torch.Tensor:
        return (xyz.detach() if xyz.requires_grad else xyz).to(torch.float64) / self.length_unit

    @property
    def constrained(self) -> bool:
        return bool(self.fixed or self.frozen)

    def rebuild(self, x: torch.Tensor) -> None:
        """New primitives at ``x`` (bohr), a fresh model Hessian, no history."""
        was = self.prims.linear_triples() if hasattr(self, "prims") else frozenset()
        self.prims = build_primitives(
            x * BOHR,
            self.numbers,
            extra=tuple(self.fixed),
            frozen=self.frozen,
            out_of_plane=self.out_of_plane,
            linear=was,
            coords=self.coords,
        ).to(self.device)
        idx = [self.prims.find(a) for a in self.fixed]
        idx += [self.prims.kind_slice("cartesian").start + k for k in range(3 * len(self.frozen))]
        self.cidx = torch.tensor(idx, dtype=torch.long, device=self.device)
        self.periodic = self.prims.periodic(self.device)
        self.fragment = _fragments(self.prims, len(self.numbers)).to(self.device, x.dtype)
        self._periodic_h, self._fragment_h = _steps._host(self.periodic, self.fragment)  # (views, once)
        self.H = model_hessian(self.prims, x, self.radii, self.rows)
        bsz, p = x.shape[0], len(self.prims)
        zeros = x.new_zeros(bsz)
        self.first = torch.ones(bsz, dtype=torch.bool, device=self.device)
        self.best_q, self.best_g, self.best_E = x.new_zeros(bsz, p), x.new_zeros(bsz, p), zeros
        self.pred_E, self.interp_E = zeros, zeros
        self.on_sphere = torch.zeros(bsz, dtype=torch.bool, device=self.device)
        self.best_off = torch.zeros(bsz, dtype=torch.bool, device=self.device)  # best point off target
        self.step_norm = zeros

    def _rigid(self, x: torch.Tensor) -> tuple | None:
        """``(x, layout)`` where B's null space is the rigid motions (:func:`.steps.reduced_space` then
        factorises instead of decomposing), else None."""
        return (x, kernel_layout(self.prims, x.dtype)) if self.prims.rigid_invariant else None

    def needs_rebuild(self, xyz: torch.Tensor, host: bool = False) -> torch.Tensor:
        """0-d bool tensor: an angle became linear or a linear bend bent (no host sync); ``host``: a
        Python bool where reading it costs no sync (the CPU kernel's)."""
        return self.prims.linear_check(self._internal(xyz), host)

    def _free_projector(self, U: torch.Tensor) -> torch.Tensor:
        """``(B, r, r)`` projector onto the non-redundant directions that keep the constraints."""
        Uc = U[:, self.cidx, :]
        A = Uc @ Uc.transpose(1, 2) + 1e-12 * torch.eye(len(self.cidx), dtype=U.dtype, device=U.device)
        eye = torch.eye(U.shape[-1], dtype=U.dtype, device=U.device)
        return eye - Uc.transpose(1, 2) @ torch.linalg.solve(A, Uc)

    def _to_targets(self, U: torch.Tensor, iq: torch.Tensor) -> torch.Tensor:
        """``(B, r)``: the least step that moves the constrained coordinates from ``iq`` to their targets
        (at most 0.3 bohr or radian each per step)."""
        Uc = U[:, self.cidx, :]
        A = Uc @ Uc.transpose(1, 2) + 1e-12 * torch.eye(len(self.cidx), dtype=U.dtype, device=U.device)
        delta = wrap(self.targets - iq[:, self.cidx], self.periodic[self.cidx])
        delta = delta.clamp(-0.3, 0.3)  # far targets in steps: the back-transformation stays near-linear
        return (Uc.transpose(1, 2) @ torch.linalg.solve(A, delta[..., None]))[..., 0]

    def _off_target(self, q):
        """``(B,)`` bool: some constrained coordinate is more than 1e-9 from its target (``q`` a tensor, or
        a numpy array: :func:`.steps._host`)."""
        xp = np if isinstance(q, np.ndarray) else torch
        if not self.constrained:
            return (
                np.zeros(q.shape[0], bool)
                if xp is np
                else torch.zeros(q.shape[0], dtype=torch.bool, device=q.device)
            )
        targets, periodic = (torch.as_tensor(t) for t in _steps._host(self.targets, self.periodic[self.cidx]))
        off = wrap(targets - torch.as_tensor(q)[:, self.cidx], periodic).abs().amax(-1) > 1e-9
        return off.numpy() if xp is np else off

    def _cartesian(self, xyz, grad):
        bsz, n = xyz.shape[:2]
        x = self._internal(xyz)
        gx = grad.detach().to(torch.float64).reshape(bsz, 3 * n) * (self.length_unit / self.energy_unit)
        return x, gx

    def _fmax(self, Bm, U, Pz, gq, gx, q):
        """Largest per-atom norm of the gradient left once the constraint forces are removed (user
        units); infinite while a constraint is off its target (not converged yet). Tensors, or numpy
        arrays (:func:`.steps._host`)."""
        xp = np if isinstance(gq, np.ndarray) else torch
        if self.constrained:
            gq = (U @ (Pz @ (U.swapaxes(1, 2) @ gq[..., None])))[..., 0]
            gx = (Bm.swapaxes(1, 2) @ gq[..., None])[..., 0]
        g = gx.reshape(gx.shape[0], -1, 3)
        force = xp.sqrt((g * g).sum(-1)) * (self.energy_unit / self.length_unit)
        return xp.where(self._off_target(q), float("inf"), xp.amax(force, -1))

    def fmax(self, xyz: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """``(B,)`` largest per-atom force norm at ``xyz`` (constraint forces removed), as :meth:`step`'s."""
        if not self.constrained:
            return grad.detach().norm(dim=-1).amax(-1)
        x, gx = self._cartesian(xyz, grad)
        q, Bm = values_and_b(self.prims, x)
        U, Vs, _ = reduced_space(Bm, rigid=self._rigid(x))
        gq = pinv_t_apply(U, Vs, gx)
        return self._fmax(Bm, U, self._free_projector(U), gq, gx, q).to(grad.dtype)

    def step(
        self, xyz: torch.Tensor, energy: torch.Tensor, grad: torch.Tensor, active: torch.Tensor | None = None
    ):
        """One step from an evaluated geometry.

        Args:
            xyz: ``(B, N, 3)`` positions; energy: ``(B,)``; grad: ``(B, N, 3)``
                ``dE/dx`` (the user's units); active: ``(B,)`` bool, the
                conformers to move (default all).

        Returns:
            ``(fmax, xyz_next)``: ``(B,)`` largest per-atom force norm at
            ``xyz`` (with constraints: of the force left after removing the
            constraint forces), and ``(B, N, 3)`` the next positions (``xyz``
            where not active), in ``xyz``'s dtype.
        """
        active = torch.ones(xyz.shape[0], dtype=torch.bool, device=xyz.device) if active is None else active
        fmax, x_new = self._step(xyz, energy, grad, active)
        return torch.as_tensor(fmax, device=self.device).to(grad.dtype), x_new

    def _step(self, xyz, energy, grad, active):
        """:meth:`step`, with ``active`` and the returned ``fmax`` (float64) numpy arrays on the CPU."""
        bsz, n = xyz.shape[:2]
        x = self._internal(xyz)
        # the per-conformer arithmetic on numpy views on the CPU (a numpy op on a small array costs about a
        # microsecond, a dispatched torch op 5-10 at batch 1), on the tensors elsewhere
        E, gx = _steps._host(*(t.detach().to(torch.float64) if t.requires_grad else t.to(torch.float64)
                               for t in (energy, grad)))  # fmt: skip
        E, gx = E / self.energy_unit, gx.reshape(bsz, 3 * n) * (self.length_unit / self.energy_unit)
        q_t, Bm = values_and_b(self.prims, x)
        U_t, Vs_t, keep = reduced_space(Bm, rigid=self._rigid(x))
        U, Vs, q, active, keep = _steps._host(U_t, Vs_t, q_t, active, keep)
        periodic = self._periodic_h
        first, best_q, best_g, best_E, pred_E, interp_E, trust, was_on, step_norm, best_off = _steps._host(
            self.first, self.best_q, self.best_g, self.best_E, self.pred_E, self.interp_E, self.trust,
            self.on_sphere, self.step_norm, self.best_off
        )  # fmt: skip
        xp = np if isinstance(U, np.ndarray) else torch
        gq = pinv_t_apply(U, Vs, gx)
        upd = active & ~first

        H = bfgs(self.H, wrap(q - best_q, periodic), gq - best_g, upd)
        # the actual change is measured from the interpolated point the prediction started from (pyberny
        # measures it from the previous point: after a line search back towards the best point the ratio
        # then mixes two starts, and the trust radius collapses; 4 fewer Baker steps)
        predicted = pred_E - interp_E
        r = xp.where(predicted != 0, (E - interp_E) / xp.where(predicted != 0, predicted, 1.0), 1.0)
        grow = xp.where(was_on, 2 * trust, trust)
        new = xp.where(r < 0.25, step_norm / 4, xp.where(r > 0.75, grow, trust))
        new = _ceil(xp.where(abs(predicted) < 2e-7, grow, new), TRUST_MAX / BOHR)  # (noise: grow)
        trust = xp.where(upd, new, trust)

        d = wrap(best_q - q, periodic)
        t, Ei = cubic_search(E, best_E, (gq * d).sum(-1), (best_g * d).sum(-1))
        # while constraints are still on their way to their targets, energies of different points are
        # not comparable: no line search, and the current point counts as the best; so does the first
        # point on target (the best so far was off it: lower, but not a point of the constrained problem)
        moving = self._off_target(q)
        fresh = first | moving | best_off
        t, Ei = xp.where(fresh, 0.0, t), xp.where(fresh, E, Ei)
        iq = q + t[:, None] * d
        ig = gq + t[:, None] * (best_g - gq)

        Hr = torch.bmm(torch.bmm(U_t.mT, H), U_t)
        if xp is torch or not keep.all():  # the dropped directions (none in the rigid basis)
            Hr.diagonal(dim1=1, dim2=2).add_(torch.as_tensor(xp.where(keep, 0.0, 1000.0), device=Hr.device))
        Hrh = _steps._host(Hr)[0]
        gr = (U.swapaxes(1, 2) @ ig[..., None])[..., 0]
        Pz, s0 = None, 0.0
        unbounded = xp.full_like(trust, float("inf"))  # the RFO step; the trust radius is Cartesian
        if self.constrained:  # the constrained coordinates go to their targets; the rest is free
            Pz, s0 = self._free_projector(U_t), self._to_targets(U_t, torch.as_tensor(iq, device=self.device))
            eye = torch.eye(Pz.shape[-1], dtype=Pz.dtype, device=Pz.device)
            g_free = (Pz @ (torch.as_tensor(gr) + (Hr @ s0[..., None])[..., 0])[..., None])[..., 0]
            y, _, _ = trust_step(g_free, Pz @ Hr @ Pz + 1000 * (eye - Pz), torch.as_tensor(unbounded))
            y, Pz, s0 = _steps._host(y, Pz, s0)
        else:
            y, _, _ = trust_step(gr, Hr, unbounded)
        y, on_sphere, size = _cartesian_trust(y, Vs, trust, self._fragment_h)
        s = s0 + y
        dE = (gr * s).sum(-1) + 0.5 * (s * (Hrh @ s[..., None])[..., 0]).sum(-1)
        pred_q = iq + (U @ s[..., None])[..., 0]
        x_new, _ = back_transform(
            self.prims,
            x,
            q_t,
            torch.as_tensor(wrap(pred_q - q, periodic), device=self.device),
            (U_t, Vs_t),
            self.periodic,
            self.back_iterations,
            refresh=int(self.constrained),
        )
        if self.frozen:
            x_new[:, list(self.frozen)] = self.x0[:, list(self.frozen)]

        everyone = xp is np and bool(active.all())  # (on the host: no sync)

        def keep_old(new, old):
            return new if everyone else xp.where(active.reshape(-1, *[1] * (new.ndim - 1)), new, old)

        better = (fresh | (E < best_E))[:, None]
        self.best_off = keep_old(moving, best_off)
        self.H, self.trust = H, trust  # bfgs leaves H as it was where not upd (a subset of active)
        self.best_q = keep_old(xp.where(better, q, best_q), best_q)
        self.best_g = keep_old(xp.where(better, gq, best_g), best_g)
        self.best_E = keep_old(xp.where(better[:, 0], E, best_E), best_E)
        self.pred_E, self.interp_E = keep_old(Ei + dE, pred_E), keep_old(Ei, interp_E)
        self.on_sphere = keep_old(on_sphere, was_on)
        self.step_norm = keep_old(size, step_norm)
        self.first = first & ~active
        fmax = self._fmax(_steps._host(Bm)[0], U, Pz, gq, gx, q)
        if not everyone:
            x_new = torch.where(torch.as_tensor(active, device=self.device)[:, None, None], x_new, x)
        return fmax, (x_new * self.length_unit).to(xyz.dtype)


#: the largest trust radius (Angstrom): geomeTRIC's
TRUST_MAX = 0.3


def _fragments(prims, n: int) -> torch.Tensor:
    """``(F, N)``: row ``f`` averages over fragment ``f``'s atoms (the connected pieces of the
    covalent bonds), so that ``d2 @ M.T`` is each fragment's mean square displacement."""
    i, j = prims.bond[prims.weak[: len(prims.bond)] == 0].cpu().numpy().T
    graph = coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n))
    label = connected_components(graph, directed=False)[1]
    mean = (label[None, :] == np.arange(label.max() + 1)[:, None]).astype(float)
    return torch.as_tensor(mean / mean.sum(1, keepdims=True))


def _cartesian_trust(y: torch.Tensor, Vs: torch.Tensor, trust: torch.Tensor, fragment_mean: torch.Tensor):
    """``y`` ``(B, r)`` scaled so that the step's linear Cartesian image ``B^+ U y = Vs y`` (``Vs``:
    :func:`.steps.reduced_space`'s) moves no fragment's atoms more than ``trust`` (bohr) RMS.

    Returns ``(y, on_sphere, size)``: the step, whether it was scaled, and its size (the largest
    fragment RMS displacement) ``(B,)``.

    A trust radius in internal coordinates (bohr and radians alike, pyberny's) says little about how
    far atoms move: a torsion's step swings distant atoms, and a soft direction between fragments
    turns a small internal step into a jump of many Angstrom (a water trimer whose two O-H...O had
    turned linear moved 50 A in one step). geomeTRIC measures its radius in Cartesians; per fragment
    here, so that in a cluster one molecule cannot travel far while the others stay.
    """
    xp = np if isinstance(y, np.ndarray) else torch
    d = (Vs @ y[..., None])[..., 0].reshape(y.shape[0], -1, 3)
    rms = xp.amax(xp.sqrt((d * d).sum(-1) @ fragment_mean.T), -1)
    on_sphere = rms > trust
    y = y * xp.where(on_sphere, trust / _floor(rms, 1e-300), 1.0)[:, None]
    return y, on_sphere, xp.minimum(rms, trust)


def _evaluate(energy, xyz: torch.Tensor):
    x = xyz.detach().requires_grad_(True)
    with torch.enable_grad():
        e = energy(x)
        if not isinstance(e, torch.Tensor) or e.shape != (xyz.shape[0],):
            got = tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__
            raise ValueError(
                f"energy(xyz) must return a tensor of shape ({xyz.shape[0]},), one per conformer, got {got}"
            )
        (g,) = torch.autograd.grad(e.sum(), x)
    return e.detach(), g


def _check_xyz(xyz) -> torch.Tensor:
    if not isinstance(xyz, torch.Tensor):
        xyz = torch.as_tensor(np.asarray(xyz), dtype=torch.float64)
    if not xyz.dtype.is_floating_point:
        raise TypeError(f"xyz must have a floating dtype, got {xyz.dtype}")
    if xyz.ndim == 2:
        xyz = xyz[None]
    if xyz.ndim != 3 or xyz.shape[-1] != 3:
        raise ValueError(f"xyz must have shape (N, 3) or (B, N, 3), got {tuple(xyz.shape)}")
    return xyz


def minimize(
    energy,
    xyz,
    fmax: float = 0.05,
    max_steps: int = 200,
    constraints=None,
    *,
    numbers=None,
    trust: float = 0.1,
    units: str = "eV/A",
    coords: str = "redundant",
) -> Result:
    """Minimise ``energy`` over positions in redundant internal coordinates, for every conformer at once.

    Args:
        energy: callable ``(B, N, 3) -> (B,)`` torch tensor, differentiable
            (a torch potential; its gradient comes from autograd).
        xyz: ``(N, 3)`` or ``(B, N, 3)`` starting positions (Angstrom); the
            conformers of one molecule, each optimised on its own (own trust
            radius, own stopping), all in one batch of tensor operations.
        fmax: stop a conformer at the first geometry whose largest per-atom
            force norm ``|dE/dx_i|`` is below this (eV/A; ASE's rule).
        max_steps: most energy evaluations per conformer.
        constraints: ``None`` or a dict ``{(i, j): r, (i, j, k): theta,
            (i, j, k, l): phi, "frozen": atoms}``: bonds (Angstrom), angles at
            ``j`` and dihedrals (IUPAC sign) in radians held at the value
            (``None``: the starting value; a ``(B,)`` tensor: one per
            conformer, see :func:`scan`), frozen atoms kept in place.
        numbers: ``(N,)`` atomic numbers (bonds come from covalent radii);
            default all carbon, which suits carbon skeletons only; pass them.
        trust: initial trust radius (Angstrom): the largest RMS displacement of one fragment's atoms
            in a step (geomeTRIC's 0.1; grown to at most :data:`TRUST_MAX`).
        units: units of ``energy`` and ``xyz``: ``"eV/A"``, ``"hartree/bohr"``,
            ``"kcal/mol/A"`` (the model Hessian is in atomic units).
        coords: ``"redundant"``: fragments (molecules of a cluster, a ligand
            and its pocket) joined by contact bonds; ``"tric"``: each
            fragment's translation and rotation instead (geomeTRIC's TRIC,
            :mod:`zmat.optimize.fragments`).

    Returns:
        :class:`Result` (``xyz`` ``(B, N, 3)``, ``energy``, ``converged``,
        ``steps``, ``fmax`` ``(B,)``).

    Raises:
        ValueError: bad shapes or constraints, or ``energy`` not returning ``(B,)``.
        TypeError: ``xyz`` not floating point, ``constraints`` not a dict.

    Example:
        >>> def energy(x):  # a harmonic O-H bond pair and H-O-H angle, eV
        ...     r1, r2 = (x[:, 1] - x[:, 0]).norm(dim=-1), (x[:, 2] - x[:, 0]).norm(dim=-1)
        ...     cos = ((x[:, 1] - x[:, 0]) * (x[:, 2] - x[:, 0])).sum(-1) / (r1 * r2)
        ...     return 20 * ((r1 - 0.96) ** 2 + (r2 - 0.96) ** 2) + 2 * (cos + 0.247) ** 2
        >>> xyz = torch.tensor([[0.0, 0, 0], [1.0, 0, 0], [-0.3, 0.9, 0]], dtype=torch.float64)
        >>> res = zmat.optimize.minimize(energy, xyz, fmax=1e-4, numbers=[8, 1, 1])
        >>> bool(res.converged[0]), round(float((res.xyz[0, 1] - res.xyz[0, 0]).norm()), 3)
        (True, 0.96)
    """
    xyz = _check_xyz(xyz)
    bsz, n = xyz.shape[:2]
    numbers = np.full(n, 6) if numbers is None else np.asarray(numbers)
    stepper = InternalStepper(xyz, numbers, constraints, trust=trust, units=units, coords=coords)
    x = xyz.detach().clone()
    # the bookkeeping on numpy views on the CPU (as the step's), on the tensors elsewhere
    view = _steps._host if xyz.dtype in (torch.float32, torch.float64) else lambda *xs: list(xs)
    active, steps, E_out, f_out = view(
        torch.ones(bsz, dtype=torch.bool, device=xyz.device),
        torch.zeros(bsz, dtype=torch.long, device=xyz.device),
        xyz.new_zeros(bsz),
        xyz.new_full((bsz,), float("inf")),
    )
    xp = np if isinstance(active, np.ndarray) else torch
    for _ in range(max_steps):
        E, g = _evaluate(energy, x)
        steps = steps + active
        f, x_next = stepper._step(x, E, g, active)
        E = view(E.to(x.dtype))[0]
        f = f.astype(E.dtype) if xp is np else torch.as_tensor(f, device=x.device).to(x.dtype)
        E_out, f_out = xp.where(active, E, E_out), xp.where(active, f, f_out)
        active = active & ~(f < fmax)
        if xp is torch or not active.all():
            x = torch.where(torch.as_tensor(active, device=x.device)[:, None, None], x_next, x)
        else:
            x = x_next
        # the one host sync per iteration: is anything left, and must the coordinates be rebuilt
        if xp is np:
            going, rebuild = bool(active.any()), bool(stepper.needs_rebuild(x, host=True))
        else:
            going, rebuild = torch.stack([active.any(), stepper.needs_rebuild(x)]).tolist()
        if not going:
            break
        if rebuild:
            stepper.rebuild(stepper._internal(x))
    E_out, f_out, steps = (torch.as_tensor(t, device=x.device) for t in (E_out, f_out, steps))
    return Result(xyz=x, energy=E_out, converged=f_out < fmax, steps=steps, fmax=f_out)


def scan(energy, xyz, coordinate: tuple[int, ...], values, constraints=None, **kwargs) -> Result:
    """Relaxed scan: minimise with ``coordinate`` held at each of ``values``, all points at once.

    Args:
        energy, xyz: as :func:`minimize` (``xyz`` ``(N, 3)``: every scan
            point starts from it; ``(S, N, 3)``: one start per point).
        coordinate: a bond ``(i, j)``, angle ``(i, j, k)`` or dihedral
            ``(i, j, k, l)``.
        values: ``(S,)`` values (Angstrom or radians).
        constraints: further constraints, held at every point.
        kwargs: :func:`minimize`'s.

    Returns:
        :class:`Result` over the ``S`` scan points.
    """
    values = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    xyz = _check_xyz(xyz)
    if xyz.shape[0] == 1:
        xyz = xyz.expand(len(values), -1, -1).clone()
    if xyz.shape[0] != len(values):
        raise ValueError(f"xyz has {xyz.shape[0]} conformers for {len(values)} scan values")
    return minimize(energy, xyz, constraints={**(constraints or {}), tuple(coordinate): values}, **kwargs)
