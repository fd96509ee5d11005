"""The furanose ring from its pucker (P, tau_m), closed exactly.

Given the ideal (CCD) geometry of the ring's fixed part, ``C5'``, ``C4'``,
``C3'``, ``O4'`` (the tetrahedral centre ``C4'``: its bond lengths, angles and
chirality), the ideal bond lengths ``O4'-C1'``, ``C1'-C2'``, ``C2'-C3'`` and
the ideal angle ``O4'-C1'-C2'``, the ring is placed by

    C1' = place(O4', C4', C5'; r(O4'-C1'), theta_O4', phi_1)
    C2' = place(C1', O4', C4'; r(C1'-C2'), theta(O4'-C1'-C2'), nu0)

and the three unknowns ``u = (theta_O4', phi_1, nu0)`` solve, by Newton's
method, the three equations

    |C2' - C3'| = r(C2'-C3'),   nu2 = tau_m cos P,   y = tau_m sin P,

with ``y = ((nu4 + nu1) - (nu3 + nu0)) / (2 (sin 36 + sin 72))``, so that the
measured Altona-Sundaralingam pucker of the ring (``nucleic.pucker``) is
exactly ``(P, tau_m)`` and every ring bond has exactly its ideal length, for
any ``P`` and any ``tau_m`` a furanose can take; the bond angles at ``O4'``,
``C2'`` and ``C3'`` absorb the pucker. The gradient with respect to ``(P,
tau_m)`` is the implicit one, ``du/dp = -(dF/du)^{-1} dF/dp``, at the solution
(Jacobians by central differences). Newton starts from the ideal ring's
``u`` (``u0``) and takes ``NEWTON_STEPS`` steps, no data-dependent stop.
"""

from __future__ import annotations

import math

import torch

from .._geometry import dihedral_from_bonds
from .nucleic import PUCKER_DENOMINATOR

__all__ = ["place", "ring_from_pucker"]

NEWTON_STEPS = 8


def place(xb, xa, xd, r, theta, phi):
    """NeRF placement (IUPAC dihedral), batched over leading dimensions."""
    bc = xb - xa
    bc = bc / bc.norm(dim=-1, keepdim=True)
    n = torch.linalg.cross(xa - xd, bc, dim=-1)
    n = n / n.norm(dim=-1, keepdim=True)
    m = torch.linalg.cross(n, bc, dim=-1)
    s = (r * torch.sin(theta))[..., None]
    return (
        xb
        - (r * torch.cos(theta))[..., None] * bc
        + s * torch.cos(phi)[..., None] * m
        + s * torch.sin(phi)[..., None] * n
    )


def _dihedral(p0, p1, p2, p3):
    return dihedral_from_bonds(p1 - p0, p2 - p1, p3 - p2)


def _ring(u, fixed, geom):
    """``C1', C2'`` from the unknowns; ``fixed`` ``(..., 4, 3)``: C5', C4', C3', O4'."""
    c5, c4, c3, o4 = fixed.unbind(-2)
    r01, r12, theta1 = geom[..., 0], geom[..., 1], geom[..., 3]
    c1 = place(o4, c4, c5, r01, u[..., 0], u[..., 1])
    c2 = place(c1, o4, c4, r12, theta1, u[..., 2])
    return c1, c2


def _residual(u, p, fixed, geom):
    """The three equations of the module doc, ``(..., 3)``."""
    c5, c4, c3, o4 = fixed.unbind(-2)
    c1, c2 = _ring(u, fixed, geom)
    ring = [c4, o4, c1, c2, c3]
    nu = [_dihedral(*[ring[(j + k) % 5] for k in range(4)]) for j in range(5)]
    y = ((nu[4] + nu[1]) - (nu[3] + nu[0])) / PUCKER_DENOMINATOR
    phase, amp = p[..., 0], p[..., 1]
    return torch.stack(
        [(c2 - c3).norm(dim=-1) - geom[..., 2], nu[2] - amp * torch.cos(phase), y - amp * torch.sin(phase)],
        -1,
    )


def _jacobians(u, p, fixed, geom, h: float = 1e-6):
    """``dF/du`` ``(..., 3, 3)`` and ``dF/dp`` ``(..., 3, 2)`` by central differences
    (batched; truncation error ~h^2, far below the tolerances that matter here)."""

    def d(x, k, f):
        e = torch.zeros_like(x)
        e[..., k] = h
        return (f(x + e) - f(x - e)) / (2 * h)

    ju = torch.stack([d(u, k, lambda v: _residual(v, p, fixed, geom)) for k in range(3)], -1)
    jp = torch.stack([d(p, k, lambda q: _residual(u, q, fixed, geom)) for k in range(2)], -1)
    return ju, jp


class _Solve(torch.autograd.Function):
    @staticmethod
    def forward(p, fixed, geom, u0):
        u = u0.clone()
        for _ in range(NEWTON_STEPS):
            ju, _ = _jacobians(u, p, fixed, geom)
            step = torch.linalg.solve(ju, _residual(u, p, fixed, geom)[..., None])[..., 0]
            u = u - step
        return u

    @staticmethod
    def setup_context(ctx, inputs, output):
        p, fixed, geom, _ = inputs
        ctx.save_for_backward(output, p, fixed, geom)

    @staticmethod
    def backward(ctx, grad_u):
        u, p, fixed, geom = ctx.saved_tensors
        ju, jp = _jacobians(u, p, fixed, geom)
        # du/dp = -ju^{-1} jp  =>  grad_p = -jp^T ju^{-T} grad_u
        w = torch.linalg.solve(ju.transpose(-1, -2), grad_u[..., None])[..., 0]
        return -(jp.transpose(-1, -2) @ w[..., None])[..., 0], None, None, None


def ring_from_pucker(phase, amplitude, fixed, geom, u0=None):
    """``C1'`` and ``C2'`` closing the ring with pucker ``(phase, amplitude)``.

    Args:
        phase, amplitude: ``(...)`` P and tau_m (radians).
        fixed: ``(..., 4, 3)`` positions of ``C5', C4', C3', O4'`` (ideal geometry).
        geom: ``(..., 4)`` ideal ``r(O4'-C1'), r(C1'-C2'), r(C2'-C3')`` and angle
            ``O4'-C1'-C2'`` (radians).
        u0: optional ``(..., 3)`` start ``(theta_O4', phi_1, nu0)``.

    Returns:
        ``(C1', C2', u)``; differentiable in ``phase`` and ``amplitude``.
    """
    p = torch.stack(torch.broadcast_tensors(phase, amplitude), -1).to(fixed.dtype)
    if u0 is None:
        nu0 = p[..., 1] * torch.cos(p[..., 0] - 8 * math.pi / 5)
        u0 = torch.stack([torch.full_like(nu0, math.radians(109.0)), torch.full_like(nu0, math.pi), nu0], -1)
    u = _Solve.apply(p, fixed.detach(), geom.detach(), u0.detach())
    c1, c2 = _ring(u, fixed, geom)
    return c1, c2, u
