"""The pieces of a quasi-Newton step in redundant internal coordinates, batched.

Units inside: bohr, radians, hartree (the model Hessian's constants are in
atomic units). Every function works on a batch of conformers at once
(leading dimension ``B``) without host synchronisation: choices per
conformer are ``torch.where`` selections, iterations have a fixed count (on
the CPU, where reading a tensor costs no device sync, the back-transformation
stops once converged and the trust-sphere iterations run only when needed).

* :func:`model_hessian`: a diagonal model Hessian, Schlegel's
  ``1.734 / (r - b)^3`` for covalent bonds, ``0.45 rho_ij`` (Lindh's ``rho``)
  for non-covalent ones, ``0.15 rho_ij rho_jk`` for
  angles with Swart and Bickelhaupt's ``rho_ij = exp(1 - r_ij / (r_i^cov +
  r_j^cov))`` (pyberny's), and ``0.005 rho_ij rho_jk rho_kl`` for dihedrals
  with Lindh's ``rho``.
* :func:`bfgs`: the BFGS update of the Hessian in primitive space.
* :func:`reduced_space`: the non-redundant (delocalised) space: eigenvectors
  of ``B^T B`` and ``U`` with ``B = U S V^T``; :func:`pinv_apply` applies the
  pseudo-inverse ``B^+ = V S^-1 U^T`` from them (never formed: a ``(3N, P)``
  product per conformer less).
* :func:`trust_step`: the rational-function (RFO) step (from the
  Hessian's eigenpairs by Newton on the secular equation: no second
  eigendecomposition), or, where it is longer than the trust radius, the
  minimum of the quadratic model on the sphere (Newton on
  ``1/|p(mu)| = 1/trust``).
* :func:`cubic_search`: pyberny's line search between the current and the
  best point (a cubic through two energies and two slopes).
* :func:`back_transform`: Cartesians for a step in internal coordinates,
  ``x <- x + B^+ (q_target - q(x))`` with ``B^+`` of the starting geometry,
  until the update is below a tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import _compiled, _rigid
from .coordinates import Primitives, kernel_layout, values, wilson_b

BOHR = 0.52917721092  # Angstrom
HARTREE = 27.211386245988  # eV

__all__ = [
    "back_transform",
    "bfgs",
    "cubic_search",
    "model_hessian",
    "period",
    "pinv_apply",
    "pinv_t_apply",
    "reduced_space",
    "trust_step",
    "wrap",
]


def wrap(dq: torch.Tensor, periodic: torch.Tensor) -> torch.Tensor:
    """Differences of ``q`` with the periodic (dihedral) entries wrapped into ``(-pi, pi]``."""
    return torch.where(periodic, torch.remainder(dq + math.pi, 2 * math.pi) - math.pi, dq)


#: Lindh's model Hessian (Chem. Phys. Lett. 241, 423 (1995)): ``alpha`` (bohr^-2) and ``r_ref`` (bohr)
#: by the periods of the two atoms (1: H-He, 2: Li-Ne, 3: Na and beyond)
_LINDH_ALPHA = ((1.0, 0.3949, 0.3949), (0.3949, 0.28, 0.28), (0.3949, 0.28, 0.28))
_LINDH_R = ((1.35, 2.10, 2.53), (2.10, 2.87, 3.40), (2.53, 3.40, 3.40))
#: Schlegel's bond stretch ``1.734 / (r - b)^3`` (Theor. Chim. Acta 66, 333 (1984); geomeTRIC's):
#: ``b`` (bohr) by the periods of the two atoms
_SCHLEGEL_B = ((-0.244, 0.352, 0.660), (0.352, 1.085, 1.522), (0.660, 1.522, 2.068))


def period(numbers) -> torch.Tensor:
    """``(N,)`` long: 0, 1, 2 for the first, second and later periods (the rows of Lindh's table)."""
    z = torch.as_tensor(numbers)
    return (z > 2).long() + (z > 10).long()


def model_hessian(
    prims: Primitives, xyz: torch.Tensor, radii: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """Diagonal model Hessian ``(B, P, P)`` (hartree / bohr^2, / rad^2) at ``xyz`` (bohr).

    Covalent bonds ``1.734 / (r - b)^3`` (Schlegel's, geomeTRIC's: ``b`` by
    the periods; it follows the bond order, which Swart's ``0.45 rho_ij``
    misses: half the curvature of acetylene's C-C, whose second step then
    overshot uphill); non-covalent bonds (hydrogen bonds and contacts between
    fragments) ``0.45 rho_ij`` with Lindh's ``rho`` (below; about 0.015 for an
    O-H...O at 1.9 A, near its curvature, where Swart's gave 0.17 and the
    stiff model held water clusters in their starting hydrogen-bond network);
    angles
    ``0.15 rho_ij rho_jk`` with Swart and Bickelhaupt's
    ``rho_ij = exp(1 - r_ij / (r_i + r_j))`` (pyberny's;
    ``radii`` ``(N,)`` covalent radii in bohr); dihedrals and out-of-plane
    angles ``0.005 rho_ij rho_jk rho_kl`` with Lindh's
    ``rho_ij = exp(alpha_ij (r_ref,ij^2 - r_ij^2))`` (``rows`` ``(N,)``:
    :func:`period`), whose slower decay stiffens torsions about long bonds
    (measured on the Baker set: fewer steps than either model alone).
    Linear bends count their phantom partner as ``rho = 1`` (pyberny's dummy
    atoms); frozen Cartesian components 0.5 (they are held).
    """
    alpha = torch.tensor(_LINDH_ALPHA, dtype=xyz.dtype, device=xyz.device)
    r_ref = torch.tensor(_LINDH_R, dtype=xyz.dtype, device=xyz.device)
    b_ref = torch.tensor(_SCHLEGEL_B, dtype=xyz.dtype, device=xyz.device)

    def rho(i, j):
        d = (xyz[:, i] - xyz[:, j]).norm(dim=-1)
        return torch.exp(1.0 - d / (radii[i] + radii[j]))

    def lindh(i, j):
        a, r = alpha[rows[i], rows[j]], r_ref[rows[i], rows[j]]
        return torch.exp(a * (r * r - ((xyz[:, i] - xyz[:, j]) ** 2).sum(-1)))

    parts = []
    if len(prims.bond):
        i, j = prims.bond.unbind(1)
        r = (xyz[:, i] - xyz[:, j]).norm(dim=-1)
        schlegel = 1.734 * (r - b_ref[rows[i], rows[j]]).clamp_min(0.5) ** -3
        weak = prims.weak[: len(prims.bond)].to(xyz.device) > 0
        parts.append(torch.where(weak, 0.45 * lindh(i, j), schlegel))
    if len(prims.angle):
        a = prims.angle
        parts.append(0.15 * rho(a[:, 0], a[:, 1]) * rho(a[:, 1], a[:, 2]))
    if len(prims.linear):
        a = prims.linear
        parts.append(0.15 * rho(a[:, 0], a[:, 1]))
    for dih in (prims.dihedral, prims.oop):
        if len(dih):
            i, j, k, l = dih.unbind(1)
            parts.append(0.005 * lindh(i, j) * lindh(j, k) * lindh(k, l))
    n_frag = len(prims.translation) + len(prims.rotation)
    if n_frag:  # fragments' translations and rotations (bohr): geomeTRIC's 0.05
        parts.append(xyz.new_full((xyz.shape[0], n_frag), 0.05))
    if len(prims.cartesian):
        parts.append(xyz.new_full((xyz.shape[0], len(prims.cartesian)), 0.5))
    return torch.diag_embed(torch.cat(parts, -1))


def bfgs(H: torch.Tensor, dq: torch.Tensor, dg: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """BFGS update ``H + dg dg^T / dq.dg - H dq dq^T H / dq.H dq`` where ``on`` ``(B,)``, in place
    (``H`` ``(B, P, P)`` is returned, updated).

    As pyberny, the update is made whatever the sign of ``dq . dg`` (the
    step's RFO shift copes with an indefinite Hessian); only a vanishing
    denominator skips it.
    """
    Hdq = (H @ dq[..., None])[..., 0]
    dq, dg, Hdq, on = _host(dq, dg, Hdq, on)  # (the vectors' arithmetic on numpy views on the CPU)
    xp = np if isinstance(dq, np.ndarray) else torch
    a = (dq * dg).sum(-1)
    b = (dq * Hdq).sum(-1)
    ok = (on & (abs(a) > 1e-14) & (abs(b) > 1e-14))[:, None]
    u = xp.where(ok, dg / xp.where(ok[:, 0], a, 1.0)[:, None], 0.0)
    v = xp.where(ok, Hdq / xp.where(ok[:, 0], b, 1.0)[:, None], 0.0)
    left, right = (
        torch.as_tensor(xp.stack(t, k), device=H.device) for t, k in (((u, v), 2), ((dg, -Hdq), 1))
    )
    # one rank-2 product, in place: a new (B, P, P) tensor is fresh memory to fault in (5x the update's
    # own time at B = 1024)
    return H.baddbmm_(left, right)


def reduced_space(Bm: torch.Tensor, rcond: float = 1e-6, rigid: tuple | None = None):
    """The non-redundant space of ``B`` ``(B, P, 3N)``.

    Returns ``(U, Vs, keep)``: ``U`` ``(B, P, 3N)`` orthonormal columns
    spanning the range of ``B`` (zero columns where ``B^T B`` has no
    eigenvalue above ``rcond`` times its largest: translations, rotations),
    ``Vs`` ``(B, 3N, 3N)`` the eigenvectors of ``B^T B`` scaled by
    ``s^-1/2`` (zero where dropped), so that ``U = B Vs`` and the
    pseudo-inverse ``(B^T B)^+ B^T`` is ``Vs U^T`` (applied as two
    products, never formed: :func:`pinv_apply`), and ``keep`` ``(B, 3N)``
    bool, the columns in use. ``rcond`` 1e-6 (``B^+`` amplifies at most
    1000-fold): with 1e-8 the soft direction of a loosely bound water dimer
    (one O-H...O contact) stayed in, and a 0.3 step in ``q`` moved atoms by 130 A.
    ``rigid``: ``(xyz, layout)``, the positions ``(B, N, 3)`` and :func:`.coordinates.kernel_layout`'s
    rows, given where B's rows are invariant under rigid motions
    (:attr:`.coordinates.Primitives.rigid_invariant`): on the CPU the same space then comes from a
    Cholesky factorisation (:mod:`._rigid`) where that is certified, in another orthonormal basis
    and without the six dropped columns (``U`` ``(B, P, 3N - 6)``, ``Vs`` ``(B, 3N, 3N - 6)``, every
    column kept): what follows works in any orthonormal basis of the space, of any width.
    """
    fast = None if rigid is None else _rigid.reduced_space(Bm, *rigid, rcond=rcond)
    if fast is not None:
        return fast
    s, V = torch.linalg.eigh(Bm.transpose(1, 2) @ Bm)
    keep = s > rcond * s[:, -1:].clamp_min(1e-300)
    Vs = V * torch.where(keep, torch.rsqrt(torch.where(keep, s, 1.0)), 0.0)[:, None, :]
    return Bm @ Vs, Vs, keep


def pinv_apply(U: torch.Tensor, Vs: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``B^+ r`` ``(B, 3N)`` for ``r`` ``(B, P)``, from :func:`reduced_space`'s factors."""
    return (Vs @ (U.transpose(1, 2) @ r[..., None]))[..., 0]


def pinv_t_apply(U: torch.Tensor, Vs: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``(B^+)^T g`` ``(B, P)`` for ``g`` ``(B, 3N)`` (a Cartesian gradient into internal
    coordinates), from :func:`reduced_space`'s factors."""
    return (U @ (Vs.transpose(1, 2) @ g[..., None]))[..., 0]


def _host(*xs):
    """What :func:`_rfo` and :func:`_sphere` run on: numpy views of CPU tensors (an elementwise numpy op
    on a small array costs about a microsecond, a dispatched torch op several, and their iterations
    were a third of a step's ops at batch 1), the tensors themselves elsewhere (no host sync)."""
    return [x.numpy() for x in xs] if xs[0].device.type == "cpu" else list(xs)


def _floor(x, c):
    """``max(x, c)`` (NaN stays NaN) of an array or a tensor (``np.clip`` costs 20 us a call)."""
    return np.maximum(x, c) if isinstance(x, np.ndarray) else x.clamp_min(c)


def _rfo(g, e, iterations: int = 16):
    """RFO step in the eigenbasis of H: ``g`` ``(B, r)`` components, ``e`` ascending eigenvalues
    (tensors, or numpy arrays: :func:`_host`).

    The lowest eigenvector ``(y, 1)`` of the augmented matrix ``[[diag(e), g], [g^T, 0]]``
    without its eigendecomposition: ``y = -g / (e - lambda)`` with ``lambda = e_0 - mu``
    the root ``mu > 0`` of the secular equation ``e_0 - mu + sum g^2 / (e - e_0 + mu) = 0``.
    Each iteration keeps the pole at ``mu = 0`` (the lowest modes) exact and the other
    terms, convex, by their tangent: the model's root is the one positive root of a
    quadratic and lies left of the true one, so from the second iterate on ``mu``
    rises monotonically to it (quadratically, in a few iterations). On numpy arrays the
    iterations stop once every change is below ``1e-14 mu``; tensors run all (no sync).
    """
    xp = np if isinstance(g, np.ndarray) else torch
    e0 = e[:, :1]
    g2 = g * g
    gap = e - e0
    pole = gap <= 1e-12 * xp.amax(abs(e), -1, keepdims=True)
    rest = g2 * ~pole
    p = (g2 - rest).sum(-1, keepdims=True)
    # a start right of the root, from mu^2 - e_0 mu <= |g|^2 (either sign of e_0 without cancellation)
    g2sum = g2.sum(-1, keepdims=True)
    root = xp.sqrt(e0 * e0 + 4 * g2sum)
    mu = xp.where(e0 > 0, 0.5 * (e0 + root), 2 * g2sum / _floor(root - e0, 1e-300))
    p2 = 2 * p
    for k in range(iterations):
        d = gap + mu
        w = rest / d
        slope = (w / d).sum(-1, keepdims=True)  # minus the tangent's slope
        b = e0 + w.sum(-1, keepdims=True) + slope * mu
        # the positive root of (1 + slope) mu^2 - b mu - p = 0, without cancellation
        t = xp.sqrt(b * b + (2 + 2 * slope) * p2) + abs(b)
        new = _floor(xp.where(b > 0, t / (2 + 2 * slope), p2 / t), 1e-300)
        done = abs(new - mu) <= 1e-14 * new
        mu = new
        if k >= 3 and xp is np and done.all():
            break
    return -g / (gap + mu)


def _sphere(g, e, trust, iterations: int = 12):
    """Minimum of ``g.y + e y^2 / 2`` on ``|y| = trust`` (``(B, 1)``): ``y = -g / (e - lambda)``,
    ``lambda < e_0`` (tensors, or numpy arrays: :func:`_host`).

    Newton on ``psi(mu) = 1 / |y(mu)| - 1 / trust`` in ``mu = e_0 - lambda > 0``,
    started left of the root, where ``psi`` (concave, increasing) has
    Newton converge monotonically. Where ``g`` has no component along the
    lowest mode and no root exists (the hard case) the step stays shorter.
    On numpy arrays the iterations stop once ``|y|`` is within ``1e-10`` of the
    trust radius everywhere; tensors run all (no sync).
    """
    xp = np if isinstance(g, np.ndarray) else torch
    g2 = g * g
    gap = e - e[:, :1]
    inv_trust = 1.0 / trust
    mu = xp.maximum(abs(g[:, :1]) * inv_trust, 1e-12 * (1 + xp.sqrt(g2.sum(-1, keepdims=True)))) * 0.9
    for _ in range(iterations):
        inv_d = 1 / (gap + mu)
        w = g2 * inv_d * inv_d  # (numpy's general power is slow on (B, r))
        p2 = w.sum(-1, keepdims=True)
        psi = 1 / xp.sqrt(p2) - inv_trust
        if xp is np and (abs(psi) < 1e-10 * inv_trust).all():
            break
        dpsi = (w * inv_d).sum(-1, keepdims=True) * p2**-1.5
        mu = xp.where(psi < 0, mu - psi / _floor(dpsi, 1e-300), mu)
    return -g / (gap + mu)


def trust_step(g: torch.Tensor, H: torch.Tensor, trust: torch.Tensor):
    """The step minimising the quadratic model ``g.s + s^T H s / 2`` within ``|s| <= trust``.

    Args:
        g: ``(B, r)`` gradient; H: ``(B, r, r)`` symmetric Hessian (its lower triangle is read);
            trust: ``(B,)``.

    Returns:
        ``(s, dE, on_sphere)``: step ``(B, r)``, predicted energy change
        ``(B,)`` and whether the step was cut to the sphere ``(B,)``.
    """
    e, W = torch.linalg.eigh(H)  # its lower triangle
    c = (W.transpose(1, 2) @ g[..., None])[..., 0]
    ch, eh, th = _host(c, e, trust[:, None])
    xp = np if isinstance(ch, np.ndarray) else torch
    y = _rfo(ch, eh)
    on_sphere = xp.sqrt((y * y).sum(-1)) > th[:, 0]
    # on the host, skip the sphere's Newton iterations when no conformer needs them
    if xp is torch or on_sphere.any():
        y = xp.where(on_sphere[:, None], _sphere(ch, eh, th), y)
    y = torch.as_tensor(y, device=g.device)
    dE = (c * y).sum(-1) + 0.5 * (e * y * y).sum(-1)
    return (W @ y[..., None])[..., 0], dE, torch.as_tensor(on_sphere, device=g.device)


def _polyval(p, t):
    out = t * 0
    for coef in p:
        out = out * t + coef
    return out


def cubic_search(E0, E1, g0, g1):
    """Minimum on ``[0, 1]`` of the cubic through ``(E0, g0)`` at 0 and ``(E1, g1)`` at 1.

    pyberny's rule: the cubic's minimum if it exists, is not beaten by a
    maximum inside ``(0, 1)`` nearer the middle, and lies in ``[0, 1]``;
    otherwise the lower end point. All ``(B,)``; returns ``(t, E)`` (on the CPU the
    arithmetic runs on numpy views, :func:`_host`).
    """
    device = E0.device
    E0, E1, g0, g1 = _host(E0, E1, g0, g1)
    xp = np if isinstance(E0, np.ndarray) else torch
    a = 2 * (E0 - E1) + g0 + g1
    b = -3 * (E0 - E1) - 2 * g0 - g1
    disc = b * b - 3 * a * g0
    ok = disc >= 0
    sq = xp.sqrt(xp.where(ok, disc, 0.0))
    cubic = abs(a) > 1e-12
    a_safe = xp.where(cubic, a, 1.0)
    r1, r2 = (-b + sq) / (3 * a_safe), (-b - sq) / (3 * a_safe)  # r1: where p'' = 2 sq > 0
    tmin = xp.where(cubic, r1, -g0 / xp.where(abs(b) > 1e-300, 2 * b, 1.0))
    tmax = xp.where(cubic, r2, math.inf)
    ok = ok & (cubic | (b > 0))
    ok = ok & ~((tmax > 0) & (tmax < 1) & (abs(tmin - 0.5) > abs(tmax - 0.5)))
    ok = ok & (tmin >= 0) & (tmin <= 1)
    Emin = _polyval((a, b, g0, E0), tmin)
    low = E0 <= E1
    t_end = xp.where(low, 0.0, 1.0)
    t_end = t_end if xp is np else t_end.to(E0.dtype)
    t, E = xp.where(ok, tmin, t_end), xp.where(ok, Emin, xp.where(low, E0, E1))
    return torch.as_tensor(t, device=device), torch.as_tensor(E, device=device)


def back_transform(
    prims: Primitives,
    xyz: torch.Tensor,
    q: torch.Tensor,
    dq: torch.Tensor,
    factors: tuple[torch.Tensor, torch.Tensor],
    periodic: torch.Tensor,
    iterations: int = 10,
    refresh: int = 0,
    tol: float = 1e-8,
    stall: float = 0.99,
):
    """Cartesians whose internal coordinates are ``q + dq``.

    Iterates ``x <- x + B^+ r`` on the residual ``r = q + dq - q(x)`` (wrapped),
    ``B^+`` of the starting geometry, given as :func:`reduced_space`'s ``(U, Vs)``
    (a fixed Jacobian: cheap, and linear convergence for the small steps of an
    optimisation).
    Keeps, per conformer, the iterate with the smallest residual (so a step
    that diverges falls back to the first, pyberny's rule). A conformer stops
    moving once its Cartesian update is below ``tol`` (bohr) everywhere or,
    in the first round, once its residual fails to shrink below ``stall``
    times its best (redundant coordinates leave a residual the fixed-Jacobian
    iteration cannot remove: further iterations only polish it); on
    the CPU the loop ends when every conformer has (reading a CPU tensor is
    no device sync), elsewhere it runs ``iterations`` (no host sync).
    ``refresh``: further rounds, each with ``B^+`` of the best iterate so far
    (Newton's method: constraints then hold to rounding).

    Returns ``(xyz, q)``: ``(B, N, 3)`` and its values ``(B, P)``.
    """
    bsz, n = xyz.shape[:2]
    target = q + dq
    if _compiled.usable(xyz) and factors[0].dtype == xyz.dtype and not _compiled.has_fragments(prims):
        return _back_compiled(prims, xyz, q, target, dq, factors, periodic, iterations, refresh, tol, stall)
    x, r = xyz, dq
    best_x, best_q = xyz, q
    best = torch.full((bsz,), float("inf"), dtype=xyz.dtype, device=xyz.device)
    host = xyz.device.type == "cpu"
    for round_ in range(1 + refresh):
        if round_:
            x, r = best_x, wrap(target - best_q, periodic)
            factors = reduced_space(wilson_b(prims, x))[:2]
        done = torch.zeros(bsz, dtype=torch.bool, device=xyz.device)
        for _ in range(iterations):
            dx = torch.where(done[:, None, None], 0.0, pinv_apply(*factors, r).reshape(bsz, n, 3))
            x = x + dx
            qx = values(prims, x)
            r = wrap(target - qx, periodic)
            size = r.abs().amax(-1) if r.shape[-1] else best.new_zeros(bsz)
            better = size < best
            if not round_:  # a fixed Jacobian: once the residual stalls, it has done what it can
                done = done | (size > stall * best)
            best = torch.where(better, size, best)
            best_x = torch.where(better[:, None, None], x, best_x)
            best_q = torch.where(better[:, None], qx, best_q)
            done = done | (dx.abs().flatten(1).amax(-1) < tol)
            if host and bool(done.all()):
                break
    return best_x, best_q


def _back_compiled(prims, xyz, q, target, dq, factors, periodic, iterations, refresh, tol, stall):
    """:func:`back_transform` in the compiled kernel: each round one call, every conformer iterated on its
    own until done (the torch loop's iterates: a conformer that is done no longer moves there)."""
    best = torch.full((xyz.shape[0],), float("inf"), dtype=xyz.dtype, device=xyz.device)
    best_x, best_q = xyz.clone(memory_format=torch.contiguous_format), q.contiguous().clone()
    periodic, x, r = periodic.contiguous(), xyz, dq
    for round_ in range(1 + refresh):
        if round_:  # (the kernel reads each conformer's x before it writes its best_x)
            x, r = best_x, wrap(target - best_q, periodic)
            factors = reduced_space(wilson_b(prims, x))[:2]
        args = (iterations, tol, stall, not round_, best, best_x, best_q)
        _compiled.back_round(kernel_layout(prims, x.dtype), x, r, target, *factors, periodic, *args)
    return best_x, best_q
