"""Normalizing flows: a bijection between Cartesian and internal coordinates, and its log-determinant.

:func:`log_det_jacobian` is the closed-form ``log|det d xyz / d C|`` of the
placement (:func:`zmat.to_xyz`). :class:`InternalCoordinateTransform` is the
bijection a flow is built on: a :class:`torch.distributions.Transform` from a
flat vector ``q`` of ``3 N`` numbers per structure to ``(N, 3)`` positions,
with the six external degrees of freedom of every free tree (the position of
its root and its orientation) among the ``3 N`` numbers.

Volume element (why the log-determinant has this closed form). An atom placed
at distance ``r`` and angle ``theta`` from its references, with dihedral
``phi``, sweeps ``dx = r^2 sin(theta) dr dtheta dphi``: spherical coordinates
about its bond reference, whose polar axis (the bond ``b -> a``) does not
depend on the atom itself. Placing atoms one after the other makes the
Jacobian block triangular, so ``log|det| = sum_i 2 log r_i + log sin theta_i``
over the atoms that have a bond (resp. angle) reference. A free tree's root
position is a translation (no term); its orientation is a rotation ``R`` in
the ZYZ Euler chart ``(alpha, cos beta, gamma)``, whose volume element
``d alpha d(cos beta) d gamma`` is the Haar measure: it carries exactly the
``r_1^2 d Omega`` of the second atom's direction and the azimuth of the third
atom, so it adds nothing either (``docs/flows.md`` has the derivation).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.distributions import Transform, constraints

from ._geometry import safe_atan2, safe_norm, tiny
from .table import ConstructionTable, as_table, index_tensor
from .transform import to_xyz

__all__ = [
    "BoxTransform",
    "InternalCoordinateTransform",
    "MaskedCircularShift",
    "log_det_jacobian",
    "mixed_spline",
    "zuko_flow",
]

# What each entry of q (viewed as (N, 3)) holds; angles and periodic entries are normalised.
CARTESIAN, BOND, ANGLE, PERIODIC, COS_BETA = range(5)


def _clamp(dtype: torch.dtype) -> float:
    """The floor of ``r`` and ``sin(theta)`` in the log-determinant: ``1e-12`` in float64, ``1e-6``
    in float32 (the square root of the squared-norm threshold of ``zmat._geometry``)."""
    return math.sqrt(tiny(dtype))


def _log_det(C: torch.Tensor, bond: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """``sum_i bond_i log|r_i| + angle_i log|sin theta_i|``, ``(...)``: ``bond`` ``(N,)`` is 2 for
    the atoms with a bond reference, ``angle`` 1 for those with an angle reference, else 0
    (weights, not masks: a product is cheaper than a select, forward and backward; every
    column read must be finite)."""
    eps = _clamp(C.dtype)
    lr = torch.log(C[..., 0].abs().clamp_min(eps)) * bond.to(C.dtype)
    ls = torch.log(torch.sin(C[..., 1]).abs().clamp_min(eps)) * angle.to(C.dtype)
    return (lr + ls).sum(-1)


def log_det_jacobian(C: torch.Tensor, table) -> torch.Tensor:
    """``log|det d xyz / d C|`` of the placement :func:`zmat.to_xyz`, in closed form.

    ``sum_i 2 log r_i`` over the atoms with a bond reference ``+ sum_i log sin
    theta_i`` over those with an angle reference (the Jacobian of placing atoms
    one after another is block triangular; each block is the ``r^2 sin(theta)``
    of spherical coordinates about the atom's bond reference). Only the
    columns ``to_xyz`` reads count: this is the determinant of the map from a
    tree's internal coordinates to its positions in ``to_xyz``'s placement
    frame (root at the origin, second atom on ``+x``, third in the
    ``xy``-plane); :class:`InternalCoordinateTransform` adds each tree's
    position and orientation, which contribute nothing.

    Clamp: ``|r|`` and ``|sin theta|`` are floored at ``1e-12`` (float64) or
    ``1e-6`` (float32 and narrower) before the logarithm, so zero bonds and
    straight or zero angles give a finite value (``2 log 1e-12`` resp.
    ``log 1e-12`` per such atom) with a zero gradient; every other value is
    exact. A negative ``r`` counts by its absolute value.

    Args:
        C: ``(..., N, 3)`` internal coordinates ``(r, theta, phi)``, as for :func:`zmat.to_xyz`.
        table: a :class:`zmat.ConstructionTable` or an integer array-like ``(N, 3)``.

    Returns:
        ``(...)``: one value per structure, differentiable in ``C``; no host sync.

    Example:
        >>> C = torch.tensor([[0.0, 0, 0], [1.5, 0, 0], [1.2, torch.pi / 2, 0]], dtype=torch.float64)
        >>> float(log_det_jacobian(C, [[-1, -1, -1], [0, -1, -1], [1, 0, -1]]))  # 2 log 1.5 + 2 log 1.2
        1.175573329804238
    """
    table = as_table(table)
    if not isinstance(C, torch.Tensor) or not C.dtype.is_floating_point:
        raise TypeError(f"C must be a float tensor, got {type(C).__name__}")
    if C.ndim < 2 or tuple(C.shape[-2:]) != (table.n_atoms, 3):
        raise ValueError(f"C must have shape (..., {table.n_atoms}, 3), got {tuple(C.shape)}")
    present = table.plan(C.device).present
    C = torch.where(present, C, 1.0)  # the columns to_xyz ignores may hold anything
    return _log_det(C, 2 * present[:, 0], present[:, 1])


class InternalCoordinateTransform(Transform):
    """A bijection ``q -> xyz`` between a flat vector of ``3 N`` numbers and ``(N, 3)`` positions.

    The layout of ``q`` (view it as ``q.unflatten(-1, (N, 3))``: one row per
    atom, in the table's row order):

    | row of the table | ``q`` row |
    |---|---|
    | fixed atom (any row) | its position ``(x, y, z)`` |
    | root ``(-1, -1, -1)`` | its position ``(x, y, z)`` (the tree's translation) |
    | ``(b, -1, -1)``, ``b`` a root | ``(r, cos beta, alpha)`` |
    | ``(b, a, -1)``, ``{a, b}`` = root and its bond atom | ``(r, theta, gamma)`` |
    | ``(b, a, d)`` | ``(r, theta, phi)`` |

    ``(alpha, cos beta, gamma)`` are ZYZ Euler angles of the tree's orientation
    ``R = Rz(alpha) Ry(beta) Rz(gamma) P``, ``P`` the fixed rotation taking the
    placement frame of :func:`zmat.to_xyz` (first bond along ``+x``, third atom
    in the ``xy``-plane) to the Euler chart's (first bond along ``+z``): the
    world position of atom ``i`` of a tree is ``x_root + R y_i``, ``y`` the
    tree placed by :func:`zmat.to_xyz`. The first bond points along
    ``(sin beta cos alpha, sin beta sin alpha, cos beta)``; ``gamma`` turns
    the tree about it. A tree of two atoms has no ``gamma``; one of one atom
    is just its position. In the ``cos beta`` chart the orientation's volume
    element is the Haar measure, so it adds nothing to the log-determinant.

    Fixed atoms (``fixed_atoms``) are given in Cartesian coordinates; their
    rows of the table are ignored and other atoms may refer to them. A group
    of atoms that refers to fixed atoms (bgflow's "relative" and "mixed"
    transforms: e.g. side chains in internal coordinates on a Cartesian
    backbone) is placed by :func:`zmat.to_xyz` in the frame of its first
    atom's three fixed references, then moved rigidly onto their given
    positions; a free tree's references to fixed atoms are rebuilt in the
    tree's own placement frame. The whole forward is one ``to_xyz`` call and
    one rigid motion per atom, with no Python loop over atoms or levels.

    Args:
        table: a :class:`zmat.ConstructionTable` or an integer array-like ``(N, 3)``.
        fixed_atoms: 1-D atom indices kept in Cartesian coordinates, or ``None``.
        normalize_angles: map angles and periodic entries to ``[0, 1]`` (below).
        cache_size: as for every ``torch.distributions.Transform`` (0 or 1).

    A bijection needs each of the ``3 N`` numbers to move an atom in its own
    direction, hence the rules (a ``ValueError`` naming the atom otherwise): a
    row ``(b, -1, -1)`` only on a free root (one per tree), a row
    ``(b, a, -1)`` only on a root and its bond atom (one per tree), one root
    per connected set of free atoms, and a third atom in every free tree that
    refers to fixed atoms (the fixed atoms it refers to are rebuilt in the
    tree's placement frame from its first three atoms).

    ``normalize_angles=True`` maps bond angles to ``theta / pi`` in ``[0, 1]``
    and the periodic entries (dihedrals, ``alpha``, ``gamma``) to
    ``(phi + pi) / (2 pi)`` in ``[0, 1]``; ``cos beta`` stays in ``[-1, 1]``.
    The log-determinant then includes ``log pi`` per angle and ``log 2 pi`` per
    periodic entry.

    Attributes:
        circular: ``(3 N,)`` bool, the periodic entries (dihedrals, ``alpha``, ``gamma``).
        lower, upper: ``(3 N,)`` float64 bounds of every entry: bonds
            ``(0, inf)``, angles ``(0, pi)`` (``(0, 1)`` normalised), ``cos beta``
            ``[-1, 1]``, periodic entries ``[-pi, pi]`` (``[0, 1]``), positions
            ``(-inf, inf)``.
        kind: ``(3 N,)`` int64: what each entry is, one of ``CARTESIAN``,
            ``BOND``, ``ANGLE``, ``PERIODIC``, ``COS_BETA`` (module constants).
        n_atoms, table, normalize_angles: as given; fixed_atoms: sorted, int64.

    ``T(q)`` and ``T.inv(xyz)`` take any leading batch dimensions, float32 or
    float64, on any device; ``T.log_abs_det_jacobian(q, xyz)`` is
    ``log|det d xyz / d q|`` (computed from ``q``), ``T.inv``'s its negative.
    Degenerate input (zero bonds, straight angles, ``cos beta = +-1``,
    collinear first atoms) gives finite values and gradients (the log-det is
    clamped as in :func:`log_det_jacobian`). A ``cos beta`` outside ``[-1, 1]``
    (outside ``T.lower``, ``T.upper``) is no orientation: ``T(q)`` gives NaN
    positions for that tree (no error, which would sync the device; a flow keeps
    ``cos beta`` in range with a bounded transform, e.g. a ``tanh`` or a spline
    on ``[-1, 1]``).

    Example:
        >>> table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]]
        >>> T = InternalCoordinateTransform(table)
        >>> xyz = torch.randn(5, 4, 3, dtype=torch.float64)
        >>> q = T.inv(xyz)  # (5, 12)
        >>> bool(torch.allclose(T(q), xyz, atol=1e-12))
        True
    """

    bijective = True
    domain = constraints.independent(constraints.real, 1)
    codomain = constraints.independent(constraints.real, 2)

    def __init__(self, table, fixed_atoms=None, normalize_angles: bool = False, cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        self.table = as_table(table)
        self.n_atoms = n = self.table.n_atoms
        self.fixed_atoms = _check_fixed(fixed_atoms, n)
        self.normalize_angles = bool(normalize_angles)
        self._plan = _Plan(self.table, self.fixed_atoms)
        kind = self._plan.kind.reshape(-1)
        self.kind = torch.as_tensor(kind)
        self.circular = self.kind == PERIODIC
        lo = {CARTESIAN: -math.inf, BOND: 0.0, ANGLE: 0.0, PERIODIC: -math.pi, COS_BETA: -1.0}
        hi = {CARTESIAN: math.inf, BOND: math.inf, ANGLE: math.pi, PERIODIC: math.pi, COS_BETA: 1.0}
        if self.normalize_angles:
            lo.update({ANGLE: 0.0, PERIODIC: 0.0})
            hi.update({ANGLE: 1.0, PERIODIC: 1.0})
        self.lower = torch.tensor([lo[k] for k in range(5)], dtype=torch.float64)[self.kind]
        self.upper = torch.tensor([hi[k] for k in range(5)], dtype=torch.float64)[self.kind]
        n_angle, n_periodic = int((kind == ANGLE).sum()), int((kind == PERIODIC).sum())
        self._constant = 0.0  # d theta / d theta' = pi, d phi / d phi' = 2 pi
        if self.normalize_angles:
            self._constant = n_angle * math.log(math.pi) + n_periodic * math.log(2 * math.pi)
        self._devices: dict = {}

    def with_cache(self, cache_size: int = 1) -> InternalCoordinateTransform:
        if self._cache_size == cache_size:
            return self
        return type(self)(self.table, self.fixed_atoms, self.normalize_angles, cache_size=cache_size)

    def __repr__(self) -> str:
        fixed = f", {len(self.fixed_atoms)} fixed" if len(self.fixed_atoms) else ""
        return f"{type(self).__name__}({self.n_atoms} atoms{fixed}, normalize_angles={self.normalize_angles})"

    # ------------------------------------------------------------------ shapes
    def forward_shape(self, shape):
        if len(shape) < 1 or shape[-1] != 3 * self.n_atoms:
            raise ValueError(f"q must have shape (..., {3 * self.n_atoms}), got {tuple(shape)}")
        return torch.Size((*shape[:-1], self.n_atoms, 3))

    def inverse_shape(self, shape):
        if len(shape) < 2 or tuple(shape[-2:]) != (self.n_atoms, 3):
            raise ValueError(f"xyz must have shape (..., {self.n_atoms}, 3), got {tuple(shape)}")
        return torch.Size((*shape[:-2], 3 * self.n_atoms))

    # ---------------------------------------------------------------- the maps
    def _tensors(self, device: torch.device) -> dict:
        out = self._devices.get(device)
        if out is None:
            out = self._devices[device] = self._plan.tensors(device)
        return out

    def _scale(self, q3: torch.Tensor, t: dict, inverse: bool) -> torch.Tensor:
        """Normalised entries -> radians (``inverse=True``: radians -> normalised)."""
        if not self.normalize_angles:
            return q3
        scale, shift = t["scale"].to(q3.dtype), t["shift"].to(q3.dtype)
        return (q3 - shift) / scale if inverse else q3 * scale + shift

    def _call(self, q: torch.Tensor) -> torch.Tensor:
        _check_tensor(q, "q")
        q = _in_chart(self, q)
        shape = self.forward_shape(q.shape)
        t = self._tensors(q.device)
        c = self._scale(q.unflatten(-1, shape[-2:]), t, inverse=False)
        p = self._plan
        if p.n_frames == 0:  # every atom fixed
            return c
        R, origin = self._frames(c, t)
        C = [c]
        if p.n_copies:  # the fixed atoms a group refers to, rebuilt in that group's frame
            P = _components(c.index_select(-2, t["copy_src"]))
            P = torch.cat([P, torch.zeros_like(P[:, :1])], 1)
            C.append(_atoms(torch.where(t["copy_present"], _internal(P, t["copy_refs"]), 0.0), shape[:-2]))
        if p.n_tree_copies:  # the fixed atoms a free tree refers to, in the tree's frame
            C.append(_atoms(self._tree_copies(c, R, origin, t), shape[:-2]))
        C = torch.cat(C, -2) if len(C) > 1 else c
        Y = _components(to_xyz(C, p.placement)[..., : self.n_atoms, :])
        if p.n_frames > 1:  # one frame per atom; a single frame broadcasts
            R, origin = R.index_select(2, t["frame_of"]), origin.index_select(1, t["frame_of"])
        X = origin + (R * Y).sum(1)  # x = o + R y per atom: R[k, j] y[j] summed over j
        return torch.where(t["cartesian"], c, _atoms(X, shape[:-2]))

    def _tree_copies(self, c: torch.Tensor, R: torch.Tensor, origin: torch.Tensor, t: dict) -> torch.Tensor:
        """Internal coordinates ``(3, M, B)`` of the fixed atoms free trees refer to, against each
        tree's first three atoms, from their positions in the tree's placement frame
        ``y = R^T (x - x_root)``."""
        padded = torch.cat([c, torch.zeros_like(c[..., :1, :])], -2)
        _, second, third = _components(padded.index_select(-2, t["tree_atoms"])).chunk(3, 1)
        r1, r2, theta = second[0], third[0], third[1]
        zero = torch.zeros_like(r1)
        x3 = torch.where(t["third_on_second"][0], r1 - r2 * torch.cos(theta), r2 * torch.cos(theta))
        y_second = torch.stack([r1, zero, zero])  # as to_xyz places them
        y_third = torch.stack([x3, r2 * torch.sin(theta), zero])
        k = t["tree_copy_tree"]
        d = _components(c.index_select(-2, t["tree_copy_src"])) - origin.index_select(1, k)
        y = (R.index_select(2, k) * d[:, None]).sum(0)  # R^T d
        P = [torch.zeros_like(y), y_second.index_select(1, k), y_third.index_select(1, k), y]
        P = torch.cat([*P, torch.zeros_like(y[:, :1])], 1)
        return _internal(P, t["tree_copy_refs"])[:, 3 * y.shape[1] :]

    def _frames(self, c: torch.Tensor, t: dict):
        """Rotations ``(3, 3, F, B)`` and origins ``(3, F, B)`` of the free trees, then of the
        groups anchored on fixed atoms (``B`` the flattened batch)."""
        padded = torch.cat([c, torch.zeros_like(c[..., :1, :])], -2)  # row N: zeros
        root, first, second = _components(padded.index_select(-2, t["tree_atoms"])).chunk(3, 1)
        Rs, origins = [_euler_to_matrix(first[2], first[1], second[2])], [root]
        if self._plan.n_anchored:
            xo, xa, xb = _components(c.index_select(-2, t["anchor_atoms"])).chunk(3, 1)
            Rs.append(torch.stack(_frame(xo, xa, xb), 1))
            origins.append(xo)
        return torch.cat(Rs, 2), torch.cat(origins, 1)

    def _inverse(self, xyz: torch.Tensor) -> torch.Tensor:
        _check_tensor(xyz, "xyz")
        self.inverse_shape(xyz.shape)
        t = self._tensors(xyz.device)
        P = _components(xyz)
        P = torch.cat([P, torch.zeros_like(P[:, :1])], 1)  # column N: the origin
        C = torch.where(t["present"], _internal(P, t["refs"]), 0.0)  # as zmat.to_internal
        root, first, second = P.index_select(1, t["tree_atoms"]).chunk(3, 1)
        u, v, w = _frame(root, first, second)
        euler = torch.stack(_matrix_to_euler(u, v, w, first - root))  # (3, T, B)
        euler = torch.cat([euler.flatten(0, 1), torch.zeros_like(P[0, :1])])  # row 3 T: a zero
        orient = euler.index_select(0, t["euler_index"]).unflatten(0, (3, self.n_atoms))
        Q = torch.where(t["cm_cartesian"], P[:, : self.n_atoms], torch.where(t["orientation"], orient, C))
        if self.normalize_angles:
            Q = (Q - t["cm_shift"].to(Q.dtype)) / t["cm_scale"].to(Q.dtype)
        return _atoms(Q, xyz.shape[:-2]).flatten(-2)

    def log_abs_det_jacobian(self, q: torch.Tensor, xyz: torch.Tensor | None = None) -> torch.Tensor:
        """``log|det d xyz / d q|``, ``(...)``, from ``q`` (``xyz`` is not read)."""
        q3 = q.unflatten(-1, self.forward_shape(q.shape)[-2:])
        t = self._tensors(q.device)
        out = _log_det(self._scale(q3, t, inverse=False), t["ld_bond"], t["ld_angle"])
        return out + self._constant if self._constant else out

    def call_and_ladj(self, q: torch.Tensor):
        """``(T(q), T.log_abs_det_jacobian(q, T(q)))`` in one call (as zuko's transforms)."""
        xyz = self(q)
        return xyz, self.log_abs_det_jacobian(q, xyz)


# ---------------------------------------------------------------- geometry, component-major
# Vectors here are (3, ...) tensors, the components first and the batch last: on the CPU
# gathers along atoms then copy contiguous rows, and every product is one elementwise
# kernel over long rows (a cross product or a 3x3 matmul over (..., 3) is many times slower).
def _components(x: torch.Tensor) -> torch.Tensor:
    """``(..., N, 3)`` -> ``(3, N, B)``, ``B`` the flattened batch."""
    return x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:]).permute(2, 1, 0).contiguous()


def _atoms(X: torch.Tensor, batch) -> torch.Tensor:
    """``(3, N, B)`` -> ``(*batch, N, 3)``."""
    return X.permute(2, 1, 0).reshape(*batch, X.shape[1], 3)


def _dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (u * v).sum(0)


def _cross(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    u0, u1, u2 = u.unbind(0)
    v0, v1, v2 = v.unbind(0)
    return torch.stack([u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0])


def _unit(v: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``v / |v|``, or ``fallback`` where ``v`` is ~0 (``zmat._geometry.safe_unit``, components first)."""
    sq = (v * v).sum(0, keepdim=True)
    ok = ~(sq <= tiny(v.dtype))
    return torch.where(ok, v * torch.rsqrt(torch.where(ok, sq, 1.0)), fallback)


def _internal(P: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
    """``zmat.to_internal``'s ``(r, theta, phi)`` (same formulas and degenerate values),
    ``(3, N, B)`` from positions ``(3, N + 1, B)`` (column ``N`` the origin) and the table's
    references (``(3 N,)``, missing -> ``N``), before masking the missing columns."""
    n = P.shape[1] - 1
    xb, xa, xd = P.index_select(1, refs).chunk(3, 1)
    b3 = P[:, :n] - xb
    u = xa - xb
    theta = safe_atan2(safe_norm(_cross(u, b3), dim=0), _dot(u, b3))
    b1, b2 = xa - xd, xb - xa
    n1, n2 = _cross(b1, b2), _cross(b2, b3)
    phi = safe_atan2(safe_norm(b2, dim=0) * _dot(b1, n2), _dot(n1, n2))
    return torch.stack([safe_norm(b3, dim=0), theta, phi])


def _frame(xo: torch.Tensor, xa: torch.Tensor, xb: torch.Tensor):
    """The axes ``u, v, u x v`` of the placement frame of three points: ``u`` along ``xa - xo``,
    ``v`` the unit part of ``xb - xo`` normal to ``u`` (as ``to_xyz`` places a tree's first three
    atoms: root at the origin, the second on ``+x``, the third in the ``xy``-plane, ``y > 0``).
    Degenerate points fall back to fixed axes: finite, differentiable."""
    ex = torch.zeros_like(xo[:, :1, :1])
    ex[0] = 1
    u = _unit(xa - xo, ex)
    w = xb - xo
    # fallback for v: u x e, e = +z unless u is nearly along z, then +x
    along_z = u[2:].abs() > 0.9
    e = torch.cat([along_z, torch.zeros_like(along_z), ~along_z]).to(u.dtype)
    perp = _cross(u, e)
    perp = perp * torch.rsqrt((perp * perp).sum(0, keepdim=True).clamp_min(tiny(u.dtype)))
    v = _unit(w - _dot(w, u) * u, perp)
    return u, v, _cross(u, v)


def _sin_from_cos(c: torch.Tensor) -> torch.Tensor:
    """``sqrt(1 - c^2)``, 0 with a zero gradient at ``|c| >= 1``."""
    s2 = (1 - c) * (1 + c)
    ok = s2 > tiny(c.dtype)
    return torch.where(ok, torch.sqrt(torch.where(ok, s2, 1.0)), 0.0)


def _euler_to_matrix(alpha: torch.Tensor, cos_beta: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``Rz(alpha) Ry(beta) Rz(gamma) P`` with ``P e_x = e_z, P e_y = e_x, P e_z = e_y``, as
    ``(3, 3, ...)``: row, column, then the shape of the angles."""
    ca, sa, cg, sg = torch.cos(alpha), torch.sin(alpha), torch.cos(gamma), torch.sin(gamma)
    cb, sb = cos_beta, _sin_from_cos(cos_beta)
    a = torch.stack([ca * cb, sa * cb, -sb])  # Rz(alpha) Ry(beta) e_x
    b = torch.stack([-sa, ca, torch.zeros_like(ca)])  # Rz(alpha) Ry(beta) e_y
    m2 = torch.stack([ca * sb, sa * sb, cb])  # M e_z, the first bond's direction
    m0, m1 = cg * a + sg * b, cg * b - sg * a  # M e_x, M e_y: a and b turned by gamma
    return torch.stack([m2, m0, m1], 1)  # R = M P: columns M e_z, M e_x, M e_y


def _matrix_to_euler(u: torch.Tensor, v: torch.Tensor, w: torch.Tensor, bond: torch.Tensor):
    """The inverse of :func:`_euler_to_matrix` on the proper rotation ``[u, v, w]`` (columns):
    ``(alpha, cos beta, gamma)``.

    ``alpha`` from the first bond's direction (0 when it is along ``+-z``); ``gamma`` from
    ``Rz(-alpha) M = Ry(beta) Rz(gamma)``, whose second row is ``(sin gamma, cos gamma, 0)`` for
    every ``beta``: well conditioned even where ``alpha`` and ``gamma`` are not separately.
    ``cos beta = bond_z / |bond|`` with a correctly rounded norm and division, so a first bond
    exactly along ``+-z`` (molecules in a standard orientation) gives ``cos beta = +-1`` exactly:
    near the poles the chart resolves ``sin beta`` only to ``sqrt(2 eps)`` of ``cos beta``."""
    alpha = safe_atan2(u[1], u[0])  # M = [v, w, u]
    ca, sa = torch.cos(alpha), torch.sin(alpha)
    gamma = safe_atan2(ca * v[1] - sa * v[0], ca * w[1] - sa * w[0])
    norm = safe_norm(bond, dim=0)
    ok = norm > 0
    cos_beta = torch.where(ok, bond[2] / torch.where(ok, norm, 1.0), u[2])
    return alpha, cos_beta, gamma


# ---------------------------------------------------------------- the orientation chart
def _in_chart(T: InternalCoordinateTransform, q: torch.Tensor) -> torch.Tensor:
    """``q`` with NaN where a ``cos beta`` entry lies outside ``[-1, 1]``: that tree's positions are
    then NaN, not a silently non-orthonormal "rotation". No error: a check would sync the device
    in every step (test it yourself: ``((q < T.lower) | (q > T.upper)).any()``). A select, no sync;
    the mask is copied to each device once."""
    masks = T.__dict__.setdefault("_cos_beta", {})
    mask = masks.get(q.device)
    if mask is None:
        mask = masks[q.device] = (T.kind == COS_BETA).to(q.device)
    return torch.where(mask & (q.abs() > 1), torch.nan, q)


# ---------------------------------------------------------------- the plan
def _check_tensor(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")


def _check_fixed(fixed_atoms, n: int) -> np.ndarray:
    if fixed_atoms is None:
        return np.zeros(0, np.int64)
    if isinstance(fixed_atoms, torch.Tensor):
        fixed_atoms = fixed_atoms.detach().cpu().numpy()
    arr = np.asarray(fixed_atoms)
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise ValueError(
            f"fixed_atoms must be a 1-D array of atom indices, got {arr.dtype} of shape {arr.shape}"
        )
    bad = (arr < 0) | (arr >= n)
    if bad.any():
        raise ValueError(f"fixed_atoms: atom {int(arr[bad][0])} is out of range for a table of {n} atoms")
    uniq, counts = np.unique(arr, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"fixed_atoms: atom {int(uniq[counts > 1][0])} is listed more than once")
    return np.sort(arr.astype(np.int64))


class _Plan:
    """Index arrays of the bijection, built once (numpy, vectorised over atoms)."""

    def __init__(self, table: ConstructionTable, fixed: np.ndarray) -> None:
        refs, n = table.refs, table.n_atoms
        is_fixed = np.zeros(n, bool)
        is_fixed[fixed] = True
        free, nref = ~is_fixed, (refs >= 0).sum(1)
        label = _free_groups(refs, free)
        roots = np.nonzero(free & (nref == 0))[0]
        _check_rows(refs, nref, is_fixed, label, roots)
        on_fixed = free[:, None] & (refs >= 0) & is_fixed[np.maximum(refs, 0)]  # references to fixed atoms

        # free trees: (root, second atom, third atom), n = "none"
        n_trees = len(roots)
        tree_of_label = np.full(n, -1, np.int64)
        tree_of_label[label[roots]] = np.arange(n_trees)
        tree_atoms = np.full((n_trees, 3), n, np.int64)
        tree_atoms[:, 0] = roots
        for k in (1, 2):
            at = np.nonzero(free & (nref == k))[0]
            tree_atoms[tree_of_label[label[at]], k] = at
        # groups anchored on fixed atoms: the first atom (lowest index) whose references are all fixed
        anchored = free & (tree_of_label[label] < 0)
        cand = np.nonzero(anchored & (nref == 3) & is_fixed[np.maximum(refs, 0)].all(1))[0]
        group_labels, first = np.unique(label[cand], return_index=True)
        group_of_label = np.full(n, -1, np.int64)
        group_of_label[group_labels] = np.arange(len(group_labels))
        anchor_atoms = refs[cand[first]][:, ::-1].copy()  # (d, a, b): origin, +x, xy-plane
        # frame of every atom: trees first, then groups (fixed atoms: frame 0, unused)
        frame_of = np.where(anchored, n_trees + group_of_label[label], tree_of_label[label])
        frame_of = np.where(free, frame_of, 0)

        placement = np.where(free[:, None], refs, -1)
        on_group = on_fixed & anchored[:, None]
        copy_src, copy_refs = _group_copies(refs, placement, on_group, group_of_label[label], anchor_atoms)
        placement = np.concatenate([placement, copy_refs])
        on_tree = on_fixed & ~anchored[:, None]
        tree_copy_tree, tree_copy_src = _tree_copies(refs, placement, on_tree, tree_of_label[label], n)
        placement = np.concatenate([placement, tree_atoms[tree_copy_tree][:, ::-1]])
        self.n_copies, self.n_tree_copies = len(copy_src), len(tree_copy_src)
        self.n_anchored, self.n_frames = len(anchor_atoms), n_trees + len(anchor_atoms)
        self.placement = ConstructionTable(placement) if len(placement) > n or len(fixed) else table
        # _internal's columns for the trees' copies: roots, second, third atoms, copies (+ the origin)
        m2 = self.n_tree_copies
        local = np.full((4 * m2, 3), 4 * m2, np.int64)
        local[3 * m2 :] = np.arange(m2)[:, None] + np.array([2 * m2, m2, 0])
        copy_local = np.where(copy_refs >= 0, copy_refs - n, len(copy_refs))  # missing -> the origin

        self.kind = kind = _entry_kinds(free, nref)
        euler_index, orientation = _orientation_slots(tree_atoms, n)
        cm = lambda a: a.T[:, :, None]  # noqa: E731 (per-atom (N, 3) -> components first, (3, N, 1))
        self.arrays = {  # flat index arrays, component by component
            "tree_atoms": tree_atoms.T.ravel(),
            "anchor_atoms": anchor_atoms.T.ravel(),
            "frame_of": frame_of,
            "copy_src": copy_src,
            "euler_index": euler_index.T.ravel(),
            "refs": np.where(refs >= 0, refs, n).T.ravel(),
            "tree_copy_src": tree_copy_src,
            "tree_copy_tree": tree_copy_tree,
            "tree_copy_refs": local.T.ravel(),
            "copy_refs": copy_local.T.ravel(),
        }
        cartesian = np.repeat(~free | (nref == 0), 3).reshape(n, 3)
        third_on_second = refs[np.minimum(tree_atoms[:, 2], n - 1), 0] == tree_atoms[:, 1]
        self.masks = {
            "cartesian": cartesian,
            "cm_cartesian": cm(cartesian),
            "orientation": cm(orientation),
            "present": cm(refs >= 0),
            "copy_present": cm(copy_refs >= 0),
            "third_on_second": third_on_second[None, :, None],  # row (second, root), else (root, second)
        }
        scale, shift = np.ones((n, 3)), np.zeros((n, 3))
        scale[kind == ANGLE] = math.pi
        scale[kind == PERIODIC] = 2 * math.pi
        shift[kind == PERIODIC] = -math.pi
        self.floats = {"scale": scale, "shift": shift, "cm_scale": cm(scale), "cm_shift": cm(shift)}
        self.floats["ld_bond"] = 2.0 * (free & (nref >= 1))  # log-det weights
        self.floats["ld_angle"] = 1.0 * (free & (nref >= 2))

    def tensors(self, device) -> dict:
        out = {k: index_tensor(v, device) for k, v in self.arrays.items()}
        out.update({k: torch.as_tensor(v, device=device) for k, v in self.masks.items()})
        out.update(
            {k: torch.as_tensor(np.ascontiguousarray(v), device=device) for k, v in self.floats.items()}
        )
        return out


def _free_groups(refs: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Connected-component label of every atom in the graph of references between free atoms."""
    from scipy.sparse import coo_matrix  # here, not at import: `import zmat` stays light
    from scipy.sparse.csgraph import connected_components

    n = len(refs)
    i, col = np.nonzero((refs >= 0) & free[:, None])
    keep = free[refs[i, col]]
    graph = coo_matrix((np.ones(keep.sum()), (i[keep], refs[i[keep], col[keep]])), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def _group_copies(refs, placement, on_group, group_of, anchor_atoms):
    """Copies of the fixed atoms each anchored group refers to, one per (group, fixed atom), as
    atoms ``N + m``: the anchor's ``(d, a, b)`` as the root, second and third atom of the group's
    frame, the others on those three. Redirects ``placement`` (in place); returns the copies'
    source atoms and rows."""
    n, n_groups = len(refs), len(anchor_atoms)
    if n_groups == 0:
        return np.zeros(0, np.int64), np.zeros((0, 3), np.int64)
    i, col = np.nonzero(on_group)
    pairs = [group_of[i] * n + refs[i, col], (np.arange(n_groups)[:, None] * n + anchor_atoms).ravel()]
    key = np.unique(np.concatenate(pairs))  # sorted: copy m of (group, fixed) is atom n + m
    cg, cf = key // n, key % n
    role = np.full(len(key), 3, np.int64)
    for k in range(3):
        role[cf == anchor_atoms[cg, k]] = k
    anchor_copy = n + np.searchsorted(key, np.arange(n_groups)[:, None] * n + anchor_atoms)
    copy_refs = np.full((len(key), 3), -1, np.int64)
    ac = anchor_copy[cg]
    copy_refs[role == 1, 0] = ac[role == 1, 0]
    copy_refs[role == 2, :2] = ac[role == 2][:, [1, 0]]
    copy_refs[role == 3] = ac[role == 3][:, [2, 1, 0]]
    placement[i, col] = n + np.searchsorted(key, group_of[i] * n + refs[i, col])
    return cf, copy_refs


def _tree_copies(refs, placement, on_tree, tree_of, n):
    """Copies of the fixed atoms free trees refer to, one per (tree, fixed atom), as atoms
    ``len(placement) + m`` (rows: the tree's third atom, second atom, root). Redirects
    ``placement`` (in place); returns the copies' trees and source atoms."""
    i, col = np.nonzero(on_tree)
    key = np.unique(tree_of[i] * n + refs[i, col])
    placement[i, col] = len(placement) + np.searchsorted(key, tree_of[i] * n + refs[i, col])
    return key // n, key % n


def _entry_kinds(free: np.ndarray, nref: np.ndarray) -> np.ndarray:
    """What every entry of ``q`` (as ``(N, 3)``) holds: the module's CARTESIAN ... COS_BETA."""
    kind = np.full((len(free), 3), CARTESIAN, np.int64)
    kind[free & (nref >= 1), 0] = BOND
    kind[free & (nref >= 2), 1] = ANGLE
    kind[free & (nref >= 1), 2] = PERIODIC
    kind[free & (nref == 1), 1] = COS_BETA
    return kind


def _orientation_slots(tree_atoms: np.ndarray, n: int):
    """Where each tree's ``(alpha, cos beta, gamma)`` (rows ``0, T, 2 T`` + tree of the inverse's
    ``(3 T,)`` stack; ``3 T`` is a zero) go in ``q``: the second atom's ``(cos beta, alpha)``, the
    third atom's ``gamma``; and the mask of those entries."""
    n_trees = len(tree_atoms)
    euler_index = np.full((n, 3), 3 * n_trees, np.int64)
    orientation = np.zeros((n, 3), bool)
    t1 = np.nonzero(tree_atoms[:, 1] < n)[0]
    euler_index[tree_atoms[t1, 1], 1] = n_trees + t1
    euler_index[tree_atoms[t1, 1], 2] = t1
    orientation[tree_atoms[t1, 1], 1:] = True
    t2 = np.nonzero(tree_atoms[:, 2] < n)[0]
    euler_index[tree_atoms[t2, 2], 2] = 2 * n_trees + t2
    orientation[tree_atoms[t2, 2], 2] = True
    return euler_index, orientation


def _second_in_a_group(atoms: np.ndarray, label: np.ndarray) -> int | None:
    """The second of ``atoms`` whose group ``label`` an earlier one of them shares, or ``None``."""
    lab, counts = np.unique(label[atoms], return_counts=True)
    if not (counts > 1).any():
        return None
    return int(atoms[label[atoms] == lab[counts > 1][0]][1])


def _check_rows(refs, nref, is_fixed, label, roots) -> None:
    """ValueError naming the first atom on which no bijection can be built."""
    n = len(refs)
    free = ~is_fixed
    b, a = refs[:, 0], refs[:, 1]
    root_label = np.full(n, -1, np.int64)
    # one root per connected group of free atoms
    lab, first, counts = np.unique(label[roots], return_index=True, return_counts=True)
    if (counts > 1).any():
        two = roots[label[roots] == lab[counts > 1][0]][:2]
        raise ValueError(
            f"atoms {two[0]} and {two[1]} are roots of one connected group of atoms (references join "
            "their trees): a bijection needs one root per tree; fix the atoms that join them, or use "
            "separate trees"
        )
    root_label[lab] = roots[first]
    root_of = root_label[label]
    for i in np.nonzero(free & (nref == 1))[0]:
        if is_fixed[b[i]] or nref[b[i]] != 0:
            what = "a fixed atom" if is_fixed[b[i]] else "not a root"
            raise ValueError(
                f"atom {i}: row ({b[i]}, -1, -1) gives it a bond length only, and atom {b[i]} is {what}: "
                "a bijection allows a bond reference alone only on the second atom of a free tree"
            )
    bond_atoms = np.nonzero(free & (nref == 1))[0]
    i = _second_in_a_group(bond_atoms, label)
    if i is not None:
        raise ValueError(f"atom {i}: a second row (root, -1, -1) in the tree of root {b[i]}: not a bijection")
    bond_of_root = np.full(n, -1, np.int64)
    bond_of_root[b[bond_atoms]] = bond_atoms
    for i in np.nonzero(free & (nref == 2))[0]:
        pair = {int(b[i]), int(a[i])}
        r = root_of[i]
        if r < 0 or is_fixed[list(pair)].any() or pair != {int(r), int(bond_of_root[r])}:
            raise ValueError(
                f"atom {i}: row ({b[i]}, {a[i]}, -1) gives it a bond length and an angle only: a "
                "bijection allows that only on the third atom of a free tree, referring to its root "
                "and its second atom"
            )
    planar = np.nonzero(free & (nref == 2))[0]
    i = _second_in_a_group(planar, label)
    if i is not None:
        raise ValueError(f"atom {i}: a second row (b, a, -1) in one tree: not a bijection")
    hit = free[:, None] & (refs >= 0) & is_fixed[np.maximum(refs, 0)] & (root_of >= 0)[:, None]
    hit &= ~np.isin(label, label[planar])[:, None]
    if hit.any():
        i, c = np.argwhere(hit)[0]
        raise ValueError(
            f"atom {i} refers to fixed atom {refs[i, c]} but its free tree (root {root_of[i]}) has no "
            "third atom (b, a, -1) to carry the tree's frame: add one, or fix the tree's first atoms"
        )


# ------------------------------------------------- the pieces a flow puts around the transform


class BoxTransform(Transform):
    """The affine map of every entry of ``q`` onto ``[-bound, bound]``, and which entries are circular.

    ``z = (q - lower) / (upper - lower) * 2 bound - bound``, entry by entry: what a
    spline flow over a uniform (or uniform-on-the-circle) base needs between
    :class:`InternalCoordinateTransform`'s ``q`` and its splines. Made from data with
    :meth:`fit`; its tensors are what flow libraries take:

    - zuko: ``zuko.flows.UnconditionalTransform(BoxTransform, box.lower, box.upper,
      box.circular, buffer=True)`` as a flow's first layer (:func:`zuko_flow` builds the
      whole flow);
    - normflows: train on ``box(q)`` with ``CircularAutoregressiveRationalQuadraticSpline(d,
      ..., ind_circ=box.circular_indices.tolist(), tail_bound=box.bound)`` and add
      ``box.log_abs_det_jacobian(q, z)`` to the log-density.

    Args:
        lower, upper: ``(D,)`` finite bounds of the entries, ``lower < upper`` (checked by
            :meth:`fit`, not here: zuko rebuilds the transform at every call, and a check of
            values would wait for the device each time).
        circular: ``(D,)`` bool, the periodic entries (their bounds are one period).
        bound: half the width of the box.

    Attributes:
        lower, upper, circular, bound: as given; ``circular_indices``: ``(n_circular,)`` int64.

    ``log_abs_det_jacobian(q, z)`` is ``sum log(2 bound / (upper - lower))``, a constant, of
    shape ``q.shape[:-1]``. The inverse clamps onto ``[lower, upper]``, so samples on the
    box's edge stay inside ``T``'s chart. Any leading batch dimensions; the output has ``q``'s dtype.

    Example:
        >>> T = InternalCoordinateTransform([[-1, -1, -1], [0, -1, -1], [1, 0, -1]], normalize_angles=True)
        >>> q = T.inv(torch.randn(100, 3, 3, dtype=torch.float64))
        >>> box = BoxTransform.fit(T, q)
        >>> z = box(q)
        >>> bool(z.abs().max() <= math.pi) and bool(torch.allclose(box.inv(z), q))
        True
    """

    bijective = True
    domain = codomain = constraints.independent(constraints.real, 1)

    def __init__(self, lower, upper, circular, bound: float = math.pi, cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        self.lower, self.upper = torch.as_tensor(lower), torch.as_tensor(upper)
        self.circular = torch.as_tensor(circular, dtype=torch.bool, device=self.lower.device)
        shapes = {tuple(self.lower.shape), tuple(self.upper.shape), tuple(self.circular.shape)}
        if len(shapes) != 1 or self.lower.ndim != 1:
            raise ValueError(f"lower, upper and circular must have one shape (D,), got {sorted(shapes)}")
        self.bound = float(bound)
        self.scale = 2 * self.bound / (self.upper - self.lower)

    @classmethod
    def fit(
        cls, T: InternalCoordinateTransform, q: torch.Tensor, margin: float = 0.5, bound: float = math.pi
    ):
        """The box of ``T``'s entries for data ``q``: the periodic entries and ``cos beta`` by ``T``'s
        bounds, the others by the range of ``q`` widened by ``margin`` times its width on each side
        (kept inside ``T.lower``, ``T.upper``: bonds stay positive, angles in ``[0, pi]``).

        Args:
            T: the transform whose entries ``q`` holds.
            q: ``(B, 3 N)`` training data, ``T.inv(xyz)``.
            margin: the widening, a fraction of each entry's range in ``q`` (held-out data
                outside the box has zero density).
            bound: half the width of the box.
        """
        if q.ndim != 2 or q.shape[-1] != 3 * T.n_atoms:
            raise ValueError(f"q must have shape (B, {3 * T.n_atoms}), got {tuple(q.shape)}")
        bad = torch.nonzero(~torch.isfinite(q))
        if len(bad):
            raise ValueError(
                f"q[{int(bad[0, 0])}, {int(bad[0, 1])}] is not finite: the box needs finite data"
            )
        t_lo, t_hi = T.lower.to(q), T.upper.to(q)
        lo, hi = q.detach().amin(0), q.detach().amax(0)
        width = (hi - lo).clamp_min(1e-6)
        lo = torch.maximum(lo - margin * width, t_lo)
        hi = torch.minimum(hi + margin * width, t_hi)
        fixed = (T.circular | (T.kind == COS_BETA)).to(q.device)
        return cls(torch.where(fixed, t_lo, lo), torch.where(fixed, t_hi, hi), T.circular, bound)

    @property
    def circular_indices(self) -> torch.Tensor:
        return torch.nonzero(self.circular).flatten()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.lower)} entries, {int(self.circular.sum())} circular)"

    def _call(self, q: torch.Tensor) -> torch.Tensor:
        return (q - self.lower.to(q)) * self.scale.to(q) - self.bound

    def _inverse(self, z: torch.Tensor) -> torch.Tensor:
        # onto [lower, upper]: a base sample on the box's edge (or rounded past it) stays in T's
        # chart (``cos beta`` in [-1, 1], where T gives NaN outside); exact inside the box
        q = (z + self.bound) / self.scale.to(z) + self.lower.to(z)
        return torch.clamp(q, self.lower.to(q), self.upper.to(q))

    def log_abs_det_jacobian(self, q: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.scale.to(q).log().sum().expand(q.shape[:-1])


class MaskedCircularShift(Transform):
    """``x -> (x mod 2 bound) - bound`` on the entries where ``mask`` (identity elsewhere): zuko's
    circular shift (Rezende et al. 2020) on the periodic entries only. Before a spline pinned at
    ``+-bound`` it makes a circular spline; its own inverse on ``[-bound, bound]``; volume-preserving.

    Args:
        mask: ``(D,)`` bool, the circular entries; bound: half the period.
    """

    bijective = True
    domain = codomain = constraints.real

    def __init__(self, mask, bound: float = math.pi, cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        self.mask, self.bound = torch.as_tensor(mask, dtype=torch.bool), float(bound)

    def _call(self, x: torch.Tensor) -> torch.Tensor:
        shifted = torch.remainder(x, 2 * self.bound) - self.bound
        return torch.where(self.mask.to(x.device), shifted, x)

    _inverse = _call

    def log_abs_det_jacobian(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def mixed_spline(*phi, mask, bound: float = math.pi):
    """zuko's univariate transform of a mixed flow: a circular rational-quadratic spline where
    ``mask``, an ordinary one (on ``[-bound, bound]``) elsewhere. ``phi``: zuko's spline parameters."""
    from zuko.transforms import ComposedTransform, MonotonicRQSTransform

    return ComposedTransform(MaskedCircularShift(mask, bound), MonotonicRQSTransform(*phi, bound=bound))


def zuko_flow(
    T: InternalCoordinateTransform,
    q: torch.Tensor,
    transforms: int = 3,
    hidden: int = 64,
    bins: int = 8,
    margin: float = 0.5,
):
    """A zuko flow over ``T``'s ``q``: :class:`BoxTransform` fitted to ``q``, then masked
    autoregressive rational-quadratic splines (circular on ``T.circular``), over a uniform base.

    The flow models ``q`` (float32; its log-density includes the box's constant), so the
    density of positions is ``flow().log_prob(q.float()) - T.log_abs_det_jacobian(q)``, and
    ``T(flow().sample((n,)).double())`` samples structures (``examples/boltzmann_generator.py``).
    Needs zuko (the extra ``flows``).

    Args:
        T: the transform; q: ``(B, 3 N)`` training data ``T.inv(xyz)`` (sets the box).
        transforms, hidden, bins: autoregressive layers, hidden width (two layers), spline bins.
        margin: as for :meth:`BoxTransform.fit`.

    Returns:
        a ``zuko.flows.Flow``: ``flow()`` is the distribution over ``q``.
    """
    try:
        import zuko
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("zmat.flows.zuko_flow needs zuko: pip install 'zmat[flows]'") from err
    from functools import partial

    box = BoxTransform.fit(T, q.double(), margin)
    d, edge = len(box.lower), box.bound + 1e-5  # the base's edge: splines map [-pi, pi] onto itself
    maf = zuko.flows.MAF(
        d,
        transforms=transforms,
        hidden_features=(hidden, hidden),
        univariate=partial(mixed_spline, mask=box.circular, bound=box.bound),
        shapes=[(bins,), (bins,), (bins - 1,)],
    )
    first = zuko.flows.UnconditionalTransform(
        BoxTransform, box.lower.float(), box.upper.float(), box.circular, bound=box.bound, buffer=True
    )
    base = zuko.flows.UnconditionalDistribution(
        zuko.distributions.BoxUniform, torch.full((d,), -edge), torch.full((d,), edge), buffer=True
    )
    return zuko.flows.Flow([first, maf.transform], base)
