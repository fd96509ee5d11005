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
import weakref

import numpy as np
import torch
from torch.distributions import Transform, constraints
from torch.distributions.transforms import _InverseTransform

from . import _kernel
from ._analytic import _kernel_plan
from ._carried import carried_kernel, carried_plan, internal_coordinates, kernel_rows
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


def _log_det(C: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_i w_i log|r_i| + w'_i log|sin theta_i|``, ``(...)``: ``weights`` ``(2 N,)`` in
    ``C``'s dtype, ``(w_0, w'_0, w_1, ...)``: ``w`` is 2 for the atoms with a bond reference,
    ``w'`` 1 for those with an angle reference, else 0 (weights, not masks: one matrix-vector
    product, forward and backward; every column read must be finite)."""
    v = torch.stack([C[..., 0], torch.sin(C[..., 1])], -1)
    return torch.log(v.abs().clamp_min(_clamp(C.dtype))).flatten(-2) @ weights


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
    return _log_det(C, (present[:, :2] * torch.tensor([2, 1], device=C.device)).flatten().to(C.dtype))


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
    (outside ``T.lower``, ``T.upper``) is clamped to it (the pole's rotation,
    zero gradient; no error, which would sync the device): ``T`` is a bijection
    only on its bounds, so a flow keeps ``cos beta`` in range with a bounded
    transform (a ``tanh``, a spline on ``[-1, 1]``).

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
        self._last = None  # the fixed inverse's last: (weakref to q, its version, [log-det, its gradient])

    def __getstate__(self):
        return {**super().__getstate__(), "_last": None}

    @property
    def inv(self) -> Transform:
        """The inverse transform (``T.inv.inv is T``), whose log-determinant is one call (no
        negation; with fixed atoms, the value the inverse computed)."""
        if self._inv is None:
            self._inv = _Inverse(self)
        return self._inv

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
    # Few dispatched ops per call: at small batches each op's dispatch, not its arithmetic, is
    # the cost (``tests/test_flows.py`` pins the count per call).
    def _tensors(self, device: torch.device, dtype: torch.dtype) -> dict:
        out = self._devices.get((device, dtype))
        if out is None:
            out = self._devices[device, dtype] = self._plan.tensors(device, dtype)
            out["fixed_inverse"] = out["path"], out["flags"], out["ld_weights"]  # the kernel's plan
        return out

    def _scale(self, q3: torch.Tensor, t: dict) -> torch.Tensor:
        """Normalised entries -> radians."""
        if not self.normalize_angles:
            return q3
        return torch.addcmul(t["shift"], q3, t["scale"])

    def _call(self, q: torch.Tensor) -> torch.Tensor:
        return self._forward(q, False)[0]

    def _forward(self, q: torch.Tensor, log_det: bool):
        """``(T(q), log|det| or None)``. On eager CPU float calls, one check of the kernel for all:
        with fixed atoms, one call of the compiled kernel placing every atom in world coordinates,
        the log-determinant in the same pass (``zmat._kernel.world``); without, :meth:`_placed`
        and one call for the log-determinant. :meth:`_place` and :meth:`log_abs_det_jacobian` are
        their reference."""
        _check_tensor(q, "q")
        shape = self.forward_shape(q.shape)  # before the chart's select: a bad shape names itself
        if not _kernel.usable(q) or torch.compiler.is_compiling():
            return self._place(q, shape), self.log_abs_det_jacobian(q) if log_det else None
        # the compiled path, checked once here: each call below is one kernel call
        t = self._tensors(q.device, q.dtype)
        q3 = q.reshape(-1, self.n_atoms, 3)
        scaled = (t["scale"], t["shift"]) if self.normalize_angles else (None, None)
        if self._plan.world is None:  # global: the trees' frames, to_xyz in them, the move
            x, ld = self._placed(q3, t), self._compiled_log_det(q3, t) if log_det else None
        else:
            x, ld = _kernel.world(q3, t["world"], t["world_kind"], *scaled, self._reference)
        if not log_det:
            return x.reshape(shape), None
        ld = ld.reshape(shape[:-2])
        return x.reshape(shape), ld + self._constant if self._constant else ld

    def _reference(self, q3: torch.Tensor):
        """:meth:`_forward`'s kernel in torch ops: ``q3`` ``(B, N, 3)`` -> ``(B, N, 3)``, ``(B,)``."""
        q = q3.reshape(q3.shape[0], -1)
        return self._place(q, q3.shape), self.log_abs_det_jacobian(q) - self._constant

    def _place(self, q: torch.Tensor, shape) -> torch.Tensor:
        """``T(q)``: each tree and anchored group placed by ``to_xyz`` in its frame, then moved, in
        torch ops (the reference of :meth:`_forward`'s compiled path)."""
        if self._plan.n_trees:  # (no tree, no cos beta)
            q = _in_chart(self, q)
        t = self._tensors(q.device, q.dtype)
        c = self._scale(q.reshape(-1, self.n_atoms, 3), t)  # (B, N, 3)
        p = self._plan
        if p.n_frames == 0:  # every atom fixed
            return c.reshape(shape)
        R, origin = self._frames(c, t)
        C = c
        if p.n_copies or p.n_tree_copies:  # the fixed atoms groups and trees refer to, in their frames
            C = torch.cat([c, *self._copies(c, R, origin, t)], 1)
        return _moved(R, origin, to_xyz(C, p.placement), c, t, len(self.fixed_atoms) > 0).reshape(shape)

    def _placed(self, q3: torch.Tensor, t: dict) -> torch.Tensor:
        """:meth:`_place` without fixed atoms, ``q3`` ``(B, N, 3)`` -> ``(B, N, 3)``, for eager CPU
        float calls (checked by the caller): the trees' frames, ``to_xyz`` in them and the move,
        each one compiled call."""
        R, origin = self._tree_frames(q3, t)  # the chart's clamp and the scale in the kernel
        c = self._scale(q3, t)
        placement = self._plan.placement
        if placement.constant_anchors:  # to_xyz's kernel call without its checks, made above
            if "placement_kernel" not in t:
                t["placement_kernel"] = placement.cached(_kernel_plan, q3.device)
            y = _kernel.positions(c, t["placement_kernel"], placement)
        else:
            y = to_xyz(c, placement)
        reference = lambda *v: _moved_torch(*v, t, False)  # noqa: E731
        return _kernel.move(R, origin, y, c, t["frame_all"], t["no_cartesian_atoms"], reference)

    def _frames(self, c: torch.Tensor, t: dict):
        """Rotations ``(B, F, 3, 3)`` and origins ``(B, F, 3)`` of the free trees, then of the
        groups anchored on fixed atoms, from ``c`` ``(B, N, 3)``."""
        p, B = self._plan, c.shape[0]
        Rs, origins = [], []
        if p.n_trees:  # per tree: root position, alpha, gamma, cos beta
            pose = c.reshape(B, -1).index_select(1, t["pose_index"]).view(B, p.n_trees, 6)
            Rs.append(_euler_to_matrix(pose[..., 3:5], pose[..., 5], t))
            origins.append(pose[..., :3])
        if p.n_anchored:
            xo, xa, xb = _components(c.index_select(1, t["anchor_atoms"])).chunk(3, 1)
            Rs.append(torch.stack(_frame(xo, xa, xb, t["axes"]), 1).permute(3, 2, 0, 1))
            origins.append(xo.permute(2, 1, 0))
        if len(Rs) == 1:
            return Rs[0], origins[0]
        return torch.cat(Rs, 1), torch.cat(origins, 1)

    def _tree_frames(self, q3: torch.Tensor, t: dict):
        """The free trees' rotations ``(B, T, 3, 3)`` and origins ``(B, T, 3)`` from ``q3``
        ``(B, N, 3)`` before the chart's clamp and the scale, in one call of the compiled kernel
        (``zmat._kernel.euler``; :meth:`_tree_frames_torch` its reference). Global mode only."""
        scaled = (t["scale"], t["shift"]) if self.normalize_angles else (None, None)
        return _kernel.euler(q3, t["pose_index"], t["tree_chart"], *scaled, self._tree_frames_torch)

    def _tree_frames_torch(self, q3: torch.Tensor):
        """:meth:`_tree_frames` in torch ops."""
        t = self._tensors(q3.device, q3.dtype)
        c = self._scale(_in_chart(self, q3.reshape(q3.shape[0], -1)).view_as(q3), t)
        return self._frames(c, t)

    def _copies(self, c: torch.Tensor, R: torch.Tensor, origin: torch.Tensor, t: dict) -> list:
        """Internal coordinates ``(B, M, 3)`` of the copies of fixed atoms in the placement table:
        those groups refer to (against their copied anchors), then those free trees refer to."""
        p, out = self._plan, []
        if p.n_copies:
            out.append(_rows(c.index_select(1, t["copy_src"]), t, "copy_"))
        if p.n_tree_copies:
            out.append(self._tree_copies(c, R, origin, t).permute(2, 1, 0))
        return out

    def _tree_copies(self, c: torch.Tensor, R: torch.Tensor, origin: torch.Tensor, t: dict) -> torch.Tensor:
        """Internal coordinates ``(3, M, B)`` of the fixed atoms free trees refer to, against each
        tree's first three atoms, from their positions in the tree's placement frame
        ``y = R^T (x - x_root)``."""
        second, third = c.index_select(1, t["tree_second_third"]).permute(2, 1, 0).chunk(2, 1)
        r1, r2, theta = second[0], third[0], third[1]
        zero = torch.zeros_like(r1)
        x3 = torch.where(t["third_on_second"], r1 - r2 * torch.cos(theta), r2 * torch.cos(theta))
        y_second = torch.stack([r1, zero, zero])  # as to_xyz places them
        y_third = torch.stack([x3, r2 * torch.sin(theta), zero])
        k = t["tree_copy_tree"]
        d = c.index_select(1, t["tree_copy_src"]) - origin.index_select(1, k)  # (B, M, 3)
        y = (R.index_select(1, k) * d.unsqueeze(-1)).sum(-2).permute(2, 1, 0)  # R^T d, (3, M, B)
        P = torch.cat([torch.zeros_like(y), y_second.index_select(1, k), y_third.index_select(1, k), y], 1)
        m = y.shape[1]
        return _internal(P, t["tree_copy_path"])[:, 3 * m : 4 * m]

    def _inverse(self, xyz: torch.Tensor, fuse: bool = True) -> torch.Tensor:
        """``q`` from ``xyz``; ``fuse``: in one Function where it applies (:meth:`_fused_inverse`)."""
        _check_tensor(xyz, "xyz")
        self.inverse_shape(xyz.shape)
        t = self._tensors(xyz.device, xyz.dtype)
        if len(self.fixed_atoms) and fuse and _kernel.usable(xyz) and not torch.compiler.is_compiling():
            return self._fixed_inverse(xyz, t)
        x = xyz.reshape(-1, self.n_atoms, 3)
        fused = self._fused_inverse(x, t) if fuse else None
        if fused is not None:
            return self._kept(*fused, xyz.shape[:-2], t)
        euler = None
        if self._plan.n_trees:  # (B, T, 3, 3) axes as columns, (B, 3, T) alpha, cos beta, gamma
            R, euler = _tree_pose(x, t)
        if len(self.fixed_atoms) == 0:  # zmat.to_internal in the trees' placement frames
            frame_of = t.get("frame_of")

            def axes_of(rows):  # each row's tree's axes, (B, len(rows), 3, 3)
                if frame_of is None:  # one tree
                    return R.expand(-1, len(rows), 3, 3)
                return R.index_select(1, frame_of.index_select(0, rows))

            q = None
            if _kernel.usable(x) and not torch.compiler.is_compiling():
                q = kernel_rows(x, self.table, t["flags"], axes_of)
            if q is None:
                q = torch.where(t["cartesian"], x, internal_coordinates(x, self.table, axes_of))
        else:
            q = _rows(x, t, "")  # (B, N, 3): as zmat.to_internal, positions where Cartesian
        return self._oriented(q, euler, t).reshape(*xyz.shape[:-2], 3 * self.n_atoms)

    def _oriented(self, q: torch.Tensor, euler, t: dict) -> torch.Tensor:
        """Rows ``q`` ``(B, N, 3)`` with the trees' orientations ``euler`` ``(B, 3, T)`` in the
        second and third atoms' rows, normalised."""
        if euler is not None:
            orient = euler.flatten(1).index_select(1, t["euler_index"]).view_as(q)
            q = torch.where(t["orientation"], orient, q)
        if self.normalize_angles:
            q = (q - t["shift"]) / t["scale"]
        return q

    def _fixed_inverse(self, xyz: torch.Tensor, t: dict) -> torch.Tensor:
        """:meth:`_inverse` with fixed atoms on eager CPU float calls (checked by the caller): the
        rows and ``T.inv``'s log-determinant in one compiled pass (``zmat._kernel.fixed_inverse``),
        the log-determinant kept for :meth:`_inverse_log_det` of the ``q`` returned. Its reference
        is :meth:`_inverse`'s path with ``fuse=False``."""
        n = self.n_atoms
        reference = lambda v: _rows_torch(v.reshape(-1, n, 3), t, "").reshape(*v.shape[:-2], 3 * n)  # noqa: E731
        q, ld, grad = _kernel.fixed_inverse(xyz, t["fixed_inverse"], reference)
        if self._plan.n_trees or self.normalize_angles:
            euler = _tree_pose(xyz.reshape(-1, n, 3), t)[1] if self._plan.n_trees else None
            q = self._oriented(q.view(-1, n, 3), euler, t).view_as(q)
        return self._keep(q, ld, grad, t)

    def _inverse_log_det(self, q: torch.Tensor) -> torch.Tensor:
        """``T.inv.log_abs_det_jacobian(xyz, q)``, minus :meth:`log_abs_det_jacobian`: where ``q`` is
        :meth:`_fixed_inverse`'s last output, unchanged, the value it computed (with its gradient in
        ``q``, computed there too: the backward is one product), else computed from ``q``."""
        last, self._last = self._last, None
        if last is None or last[0]() is not q or last[1] != q._version or torch.compiler.is_compiling():
            return -self.log_abs_det_jacobian(q)
        ld, grad = last[2]
        if grad is None and q.requires_grad and torch.is_grad_enabled():  # q made to require it since
            return -self.log_abs_det_jacobian(q)
        return _kernel.inverse_log_det(q, ld, grad, lambda v: -self.log_abs_det_jacobian(v))

    def _fused_inverse(self, x: torch.Tensor, t: dict):
        """The global inverse's rows ``(B, N, 3)`` in one Function
        (``zmat._kernel.global_inverse``: poses, carried rows and orientations, forward and backward),
        where the chains end on the trees' ``+z`` only; else ``None``. Its reference is
        :meth:`_inverse`'s path of three calls."""
        if len(self.fixed_atoms) or not self._plan.n_trees or not _kernel.usable(x):
            return None
        if torch.compiler.is_compiling():
            return None
        k = self.table.cached(carried_kernel, x.device)
        plan = self.table.cached(carried_plan, x.device)
        if k is None or len(plan.planar_rows) or len(plan.nerf_rows):
            return None
        if "global_plan" not in t:
            t["global_plan"] = self._global_plan(k, plan.z_rows, t)
        reference = lambda v: self._inverse(v, fuse=False).view_as(v)  # noqa: E731
        return _kernel.global_inverse(x, t["global_plan"], reference)

    def _kept(self, q: torch.Tensor, ld: torch.Tensor, grad, batch, t: dict) -> torch.Tensor:
        """:meth:`_fused_inverse`'s rows ``q`` ``(B, N, 3)`` as ``(*batch, 3 N)``, its log-determinant
        ``ld`` and gradient ``grad`` (radians) kept for :meth:`_inverse_log_det` of that ``q``."""
        q, ld = q.view(*batch, 3 * self.n_atoms), ld.view(batch)
        grad = None if grad is None else grad.view_as(q)
        return self._keep(q, ld, grad, t)

    def _keep(self, q: torch.Tensor, ld: torch.Tensor, grad, t: dict) -> torch.Tensor:
        """``q``, its log-determinant ``ld`` and gradient ``grad`` (radians, normalised here) kept
        for :meth:`_inverse_log_det` of that ``q``, until it is changed or freed."""
        if self.normalize_angles:  # radians -> q
            ld, grad = ld - self._constant, None if grad is None else grad * t["scale"].view(-1)
        kept = [ld, grad]  # freed with q (the callback holds no reference to self)
        self._last = weakref.ref(q, lambda _, kept=kept: kept.clear()), q._version, kept
        return q

    def _global_plan(self, k, z_rows: torch.Tensor, t: dict) -> _kernel.GlobalPlan:
        """:meth:`_fused_inverse`'s arrays (``zmat._kernel.GlobalPlan``), once per device and dtype."""
        frame_of = t.get("frame_of")
        z_frames = torch.zeros_like(z_rows) if frame_of is None else frame_of[z_rows]
        orientation = t["orientation"]
        slots = torch.full((3 * self._plan.n_trees,), -1, dtype=torch.int64, device=z_rows.device)
        entries = orientation.flatten().nonzero().flatten()
        slots[t["euler_index"][entries]] = entries  # each orientation entry's place in the (3, T) stack
        scale, shift = (t["scale"], t["shift"]) if self.normalize_angles else (None, None)
        arrays = (t["flags"], t["tree_atoms"], z_frames, slots, orientation, scale, shift, t["ld_weights"])
        return _kernel.GlobalPlan(k, *arrays)

    def log_abs_det_jacobian(self, q: torch.Tensor, xyz: torch.Tensor | None = None) -> torch.Tensor:
        """``log|det d xyz / d q|``, ``(...)``, from ``q`` (``xyz`` is not read)."""
        shape = self.forward_shape(q.shape)
        t = self._tensors(q.device, q.dtype)
        if _kernel.usable(q) and not torch.compiler.is_compiling():  # one compiled call
            out = self._compiled_log_det(q.reshape(-1, self.n_atoms, 3), t).reshape(shape[:-2])
        else:
            out = _log_det(self._scale(q.unflatten(-1, shape[-2:]), t), t["ld_weights"])
        return out + self._constant if self._constant else out

    def _compiled_log_det(self, q3: torch.Tensor, t: dict) -> torch.Tensor:
        """:meth:`log_abs_det_jacobian` less its constant, ``(B,)`` from ``q3`` ``(B, N, 3)``, in one
        call of the compiled kernel (``zmat._kernel.log_det``)."""
        w = t["ld_weights"]
        scaled = (t["scale"], t["shift"]) if self.normalize_angles else (None, None)
        return _kernel.log_det(q3, w, *scaled, lambda v: _log_det(self._scale(v, t), w))

    def call_and_ladj(self, q: torch.Tensor):
        """``(T(q), T.log_abs_det_jacobian(q, T(q)))`` in one call (as zuko's transforms)."""
        if self._cache_size and self._cached_x_y[0] is q:
            xyz = self._cached_x_y[1]
            return xyz, self.log_abs_det_jacobian(q, xyz)
        xyz, ld = self._forward(q, True)
        if self._cache_size:
            self._cached_x_y = q, xyz
        return xyz, ld


class _Inverse(_InverseTransform):
    """``T.inv``: torch's inverse transform, its log-determinant
    :meth:`InternalCoordinateTransform._inverse_log_det`."""

    def log_abs_det_jacobian(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._inv._inverse_log_det(y)


# ---------------------------------------------------------------- geometry
# Vectors are (3, ...) tensors, the components first and the batch last: on the CPU gathers
# along atoms then copy contiguous rows, and every product is one elementwise kernel over long
# rows (a cross product over (..., 3) is many times slower at scale).
#: elements per component below which a cross product is one ``torch.linalg.cross`` (one
#: dispatch: the cost at small sizes) rather than six products (faster on long rows)
SMALL = 4096


def _components(x: torch.Tensor) -> torch.Tensor:
    """``(..., N, 3)`` -> ``(3, N, B)``, ``B`` the flattened batch (contiguous: gathers along
    atoms then copy whole rows)."""
    return x.reshape(-1, *x.shape[-2:]).permute(2, 1, 0).contiguous()


def _dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (u * v).sum(0)


def _cross(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u x v`` over the first dimension (broadcasting)."""
    if u.numel() <= 3 * SMALL and v.numel() <= 3 * SMALL:
        return torch.linalg.cross(u, v, dim=0)
    u0, u1, u2 = u.unbind(0)
    v0, v1, v2 = v.unbind(0)
    return torch.stack([u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0])


def _unit(v: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``v / |v|``, or ``fallback`` where ``v`` is ~0 (``zmat._geometry.safe_unit``, components first)."""
    sq = (v * v).sum(0, keepdim=True)
    ok = ~(sq <= tiny(v.dtype))
    return torch.where(ok, v * torch.rsqrt(torch.where(ok, sq, 1.0)), fallback)


def _internal(P: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """``zmat.to_internal``'s ``(r, theta, phi)`` (same formulas and degenerate values) of
    ``M`` rows, ``(3, M, B)``, from positions ``P`` ``(3, *, B)``, before masking the missing
    references.

    ``path`` ``(4 M,)``: the columns ``d, a, b, i`` of every row, block by block (from
    :func:`_path`; a missing reference is the atom itself: finite, masked by the caller), so
    that the bonds ``b1 = a - d``, ``b2 = b - a``, ``b3 = i - b`` are one difference.
    ``theta = atan2(|b2 x b3|, -b2 . b3)``, ``phi = atan2(|b2| b1 . n2, n1 . n2)``,
    ``n1 = b1 x b2``, ``n2 = b2 x b3``."""
    x = P.index_select(1, path).unflatten(1, (4, -1))
    b = x[:, 1:] - x[:, :3]  # b1, b2, b3
    n = _cross(b[:, :2], b[:, 1:])  # n1, n2
    sq = torch.cat([_dot(b[:, 1:], b[:, 1:]), _dot(n[:, 1:], n[:, 1:])])  # |b2|^2, |b3|^2, |n2|^2
    ok = ~(sq <= tiny(P.dtype))
    norm = torch.where(ok, torch.sqrt(torch.where(ok, sq, 1.0)), 0.0)  # zmat._geometry.safe_norm
    y = torch.stack([norm[2], norm[0] * _dot(b[:, 0], n[:, 1])])
    x = torch.stack([-_dot(b[:, 1], b[:, 2]), _dot(n[:, 0], n[:, 1])])
    return torch.cat([norm[1:2], safe_atan2(y, x)])


def _rows(x: torch.Tensor, t: dict, key: str) -> torch.Tensor:
    """Rows ``(B, M, 3)`` of internal coordinates (0 where the reference is missing; the
    position itself where Cartesian) from positions ``x`` ``(B, K, 3)``: the plan's rows
    ``key + "path"`` (``""``: the table's, ``"copy_"``: the copies'). On the CPU one call of
    the compiled kernel (``zmat._kernel.internal``), else :func:`_internal` in torch ops."""
    path, flags = t[key + "path"], t[key + "flags"]
    if _kernel.usable(x) and not torch.compiler.is_compiling():
        return _kernel.internal(x, path, flags, lambda v: _rows_torch(v, t, key))
    return _rows_torch(x, t, key)


def _rows_torch(x: torch.Tensor, t: dict, key: str) -> torch.Tensor:
    """:func:`_rows` in torch ops (the kernel's reference)."""
    P = _components(x)
    Q = torch.where(t[key + "present"], _internal(P, t[key + "path"]), 0.0)
    if key + "cm_cartesian" in t:
        Q = torch.where(t[key + "cm_cartesian"], P, Q)
    return Q.permute(2, 1, 0)


def _frame(xo: torch.Tensor, xa: torch.Tensor, xb: torch.Tensor, axes: torch.Tensor):
    """The axes ``u, v, u x v`` of the placement frame of three points: ``u`` along ``xa - xo``,
    ``v`` the unit part of ``xb - xo`` normal to ``u`` (as ``to_xyz`` places a tree's first three
    atoms: root at the origin, the second on ``+x``, the third in the ``xy``-plane, ``y > 0``).
    Degenerate points fall back to fixed axes (``axes``: ``(2, 3, 1, 1)``, ``+x`` and ``+z``):
    finite, differentiable."""
    ex, ez = axes
    u = _unit(xa - xo, ex)
    w = xb - xo
    # fallback for v: u x e, e = +z unless u is nearly along z, then +x
    perp = _cross(u, torch.where(u[2:].abs() > 0.9, ex, ez))
    perp = perp * torch.rsqrt((perp * perp).sum(0, keepdim=True).clamp_min(tiny(u.dtype)))
    v = _unit(w - _dot(w, u) * u, perp)
    return u, v, _cross(u, v)


def _tree_pose(x: torch.Tensor, t: dict):
    """The free trees' placement axes ``(B, T, 3, 3)`` (columns) and orientations ``(B, 3, T)``
    (``alpha, cos beta, gamma``) from positions ``x`` ``(B, N, 3)``. On the CPU one call of the
    compiled kernel (``zmat._kernel.pose``), else :func:`_tree_pose_torch`."""
    if _kernel.usable(x) and not torch.compiler.is_compiling():
        return _kernel.pose(x, t["tree_atoms"], lambda v: _tree_pose_torch(v, t))
    return _tree_pose_torch(x, t)


def _tree_pose_torch(x: torch.Tensor, t: dict):
    """:func:`_tree_pose` in torch ops (the kernel's reference and gradient)."""
    root, first, second = _components(x.index_select(1, t["tree_atoms"])).chunk(3, 1)
    u, v, w = _frame(root, first, second, t["axes"])
    R = torch.stack([u, v, w], 1).permute(3, 2, 0, 1)
    return R, torch.stack(_matrix_to_euler(u, v, w, first - root)).permute(2, 0, 1)


def _move(R: torch.Tensor, origin: torch.Tensor, Y: torch.Tensor, frame_of) -> torch.Tensor:
    """``x = o + R y`` for every atom: ``R`` ``(B, F, 3, 3)``, ``origin`` ``(B, F, 3)``, ``Y``
    ``(B, N, 3)``; ``frame_of`` ``(N,)`` the frame of every atom, or ``None`` (one frame)."""
    if frame_of is None:
        return torch.baddbmm(origin, Y, R[:, 0].transpose(1, 2))
    # one frame per atom, components first: R[k, j] y_j summed over j is one product and a
    # reduction over long rows (a sum over a trailing 3 is many times slower)
    R = R.permute(2, 3, 1, 0).index_select(2, frame_of)  # (3, 3, N, B)
    origin = origin.permute(2, 1, 0).index_select(1, frame_of)  # (3, N, B)
    return (origin + (R * _components(Y)).sum(1)).permute(2, 1, 0)


def _moved(R: torch.Tensor, origin: torch.Tensor, Y: torch.Tensor, c: torch.Tensor, t: dict, fixed: bool):
    """Positions ``(B, N, 3)``: the atoms placed by ``to_xyz`` (``Y`` ``(B, M, 3)``, ``M >= N``)
    moved by their frames (:func:`_move`), the Cartesian ones ``c`` ``(B, N, 3)`` as given
    (``fixed``: there are fixed atoms). On the CPU one call of the compiled kernel
    (``zmat._kernel.move``)."""
    if _kernel.usable(c) and not torch.compiler.is_compiling():
        reference = lambda *v: _moved_torch(*v, t, fixed)  # noqa: E731
        cartesian = t["cartesian_atoms" if fixed else "no_cartesian_atoms"]
        return _kernel.move(R, origin, Y, c, t["frame_all"], cartesian, reference)
    return _moved_torch(R, origin, Y, c, t, fixed)


def _moved_torch(R: torch.Tensor, origin: torch.Tensor, Y: torch.Tensor, c: torch.Tensor, t: dict, fixed):
    """:func:`_moved` in torch ops (the kernel's reference). A free root needs no select:
    ``o + R 0`` is ``o``, its position, exactly."""
    X = _move(R, origin, Y[:, : c.shape[1]], t.get("frame_of"))
    return torch.where(t["cartesian"], c, X) if fixed else X


def _sin_from_cos(c: torch.Tensor) -> torch.Tensor:
    """``sqrt(1 - c^2)``, 0 with a zero gradient at ``|c| >= 1``."""
    s2 = (1 - c) * (1 + c)
    ok = s2 > tiny(c.dtype)
    return torch.where(ok, torch.sqrt(torch.where(ok, s2, 1.0)), 0.0)


#: ``Rz(alpha)``, ``Ry(beta)``, ``Rz(gamma) P`` as entries of :func:`_euler_to_matrix`'s values
#: ``ca, sa, cg, sg, cb, sb, 0, 1`` (then their negatives, + 8)
_EULER_ENTRIES = [0, 9, 6, 1, 0, 6, 6, 6, 7] + [4, 6, 5, 6, 7, 6, 13, 6, 4] + [6, 2, 11, 6, 3, 2, 7, 6, 6]


def _euler_to_matrix(ag: torch.Tensor, cos_beta: torch.Tensor, t: dict) -> torch.Tensor:
    """``R = Rz(alpha) Ry(beta) Rz(gamma) P`` with ``P e_x = e_z, P e_y = e_x, P e_z = e_y``,
    ``(..., 3, 3)``, from ``ag`` ``(..., 2)`` (alpha, gamma) and ``cos_beta`` ``(...)``: the
    columns of ``R`` are ``M e_z`` (the first bond's direction), ``M e_x``, ``M e_y``, ``M =
    Rz(alpha) Ry(beta) Rz(gamma)``. One gather of the values builds the three factors."""
    cs = torch.stack([torch.cos(ag), torch.sin(ag)], -1).flatten(-2)  # ca, sa, cg, sg
    v = torch.cat(
        [cs, cos_beta[..., None], _sin_from_cos(cos_beta)[..., None], t["zero_one"].expand_as(cs[..., :2])],
        -1,
    )
    v = torch.cat([v, -v], -1).index_select(-1, t["euler_entries"]).view(-1, 3, 3, 3)
    return torch.bmm(torch.bmm(v[:, 0], v[:, 1]), v[:, 2]).view(*cos_beta.shape, 3, 3)


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
    vw = torch.stack([v, w], 1)  # (3, 2, ...)
    g = ca * vw[1] - sa * vw[0]  # (ca v1 - sa v0, ca w1 - sa w0)
    gamma = safe_atan2(g[0], g[1])
    norm = safe_norm(bond, dim=0)
    ok = norm > 0
    cos_beta = torch.where(ok, bond[2] / torch.where(ok, norm, 1.0), u[2])
    return alpha, cos_beta, gamma


# ---------------------------------------------------------------- the orientation chart
def _in_chart(T: InternalCoordinateTransform, q: torch.Tensor) -> torch.Tensor:
    """``q`` with its ``cos beta`` entries clamped to ``[-1, 1]``: a proper rotation (the nearest
    pole's), not a non-orthonormal "rotation". No error: a check would sync the device in every
    step, and a flow with an unbounded base (docs/flows.md) would fail at random (test it yourself:
    ``((q < T.lower) | (q > T.upper)).any()``). A select, no sync; the mask is copied to each device
    once."""
    masks = T.__dict__.setdefault("_cos_beta", {})
    mask = masks.get(q.device)
    if mask is None:
        mask = masks[q.device] = (T.kind == COS_BETA).to(q.device)
    return torch.where(mask, q.clamp(-1.0, 1.0), q)


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
        self.n_anchored, self.n_trees = len(anchor_atoms), n_trees
        self.n_frames = n_trees + len(anchor_atoms)
        self.placement = ConstructionTable(placement) if len(placement) > n or len(fixed) else table
        # _internal's columns for the trees' copies: roots, second, third atoms, copies
        m2 = self.n_tree_copies
        local = np.full((4 * m2, 3), -1, np.int64)
        local[3 * m2 :] = np.arange(m2)[:, None] + np.array([2 * m2, m2, 0])

        self.kind = kind = _entry_kinds(free, nref)
        self.world = None  # with fixed atoms: zmat._kernel.world's placement rows, in topological order
        if len(fixed):
            order = table.topo_order
            kinds, rows = _world_rows(refs, nref, free, tree_atoms, tree_of_label[label])
            self.world = np.concatenate([order[None], rows[order].T])  # (4, N): atom, b, a, d
        euler_index, orientation = _orientation_slots(tree_atoms, n)
        own = np.where(tree_atoms < n, tree_atoms, tree_atoms[:, :1])  # a missing atom: the root
        pose = np.stack([3 * own[:, 0] + k for k in range(3)] + [3 * own[:, 1] + 2, 3 * own[:, 2] + 2])
        cm = lambda a: a.T[:, :, None]  # noqa: E731 (per-atom (N, 3) -> components first, (3, N, 1))
        self.arrays = {  # flat index arrays
            "tree_atoms": own.T.ravel(),
            # per tree: the root's position, alpha, gamma, cos beta
            "pose_index": np.concatenate([pose, 3 * own[None, :, 1] + 1]).T.ravel(),
            "anchor_atoms": anchor_atoms.T.ravel(),
            "copy_src": copy_src,
            "euler_index": euler_index.ravel(),
            "path": _path(refs),
            "tree_second_third": own[:, 1:].T.ravel(),
            "tree_copy_src": tree_copy_src,
            "tree_copy_tree": tree_copy_tree,
            "tree_copy_path": _path(local),
            "copy_path": _path(np.where(copy_refs >= 0, copy_refs - n, -1)),
            "euler_entries": np.asarray(_EULER_ENTRIES, np.int64),
        }
        if self.world is not None:
            self.arrays["world"] = self.world
        if self.n_frames > 1:
            self.arrays["frame_of"] = frame_of
        self.arrays["frame_all"] = frame_of
        cartesian = np.repeat(~free | (nref == 0), 3).reshape(n, 3)
        third_on_second = refs[np.minimum(tree_atoms[:, 2], n - 1), 0] == tree_atoms[:, 1]
        self.masks = {
            "cartesian": cartesian,
            "cartesian_atoms": cartesian[:, 0].astype(np.uint8),
            "no_cartesian_atoms": np.zeros(n, np.uint8),
            "cm_cartesian": cm(cartesian),
            "orientation": orientation,
            "present": cm(refs >= 0),
            "copy_present": cm(copy_refs >= 0),
            "flags": _row_flags(refs, cartesian[:, 0]),
            "copy_flags": _row_flags(copy_refs, np.zeros(len(copy_refs), bool)),
            "tree_chart": (tree_atoms[:, 1] < n).astype(np.uint8),  # cos beta is a chart entry
            "third_on_second": third_on_second[:, None],  # row (second, root), else (root, second)
        }
        if self.world is not None:
            self.masks["world_kind"] = kinds[order]
        scale, shift = np.ones((n, 3)), np.zeros((n, 3))
        scale[kind == ANGLE] = math.pi
        scale[kind == PERIODIC] = 2 * math.pi
        shift[kind == PERIODIC] = -math.pi
        self.floats = {"scale": scale, "shift": shift}
        weights = np.stack([2.0 * (free & (nref >= 1)), 1.0 * (free & (nref >= 2))], 1)
        self.floats["ld_weights"] = weights.ravel()  # the log-det's, (bond, angle) per atom
        self.floats["zero_one"] = np.array([0.0, 1.0])
        self.floats["axes"] = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])[..., None, None]

    def tensors(self, device, dtype) -> dict:
        """The arrays on ``device``, the floats in ``dtype``."""
        out = {k: index_tensor(v, device) for k, v in self.arrays.items()}
        out.update({k: torch.as_tensor(v, device=device) for k, v in self.masks.items()})
        floats = {k: np.ascontiguousarray(v) for k, v in self.floats.items()}
        out.update({k: torch.as_tensor(v, dtype=dtype, device=device) for k, v in floats.items()})
        return out


def _row_flags(refs: np.ndarray, cartesian: np.ndarray) -> np.ndarray:
    """``(M,)`` uint8 of ``zmat._kernel.internal``: bits 0-2 the references present, bit 3 Cartesian."""
    bits = (refs >= 0) @ np.array([1, 2, 4]) + 8 * cartesian
    return bits.astype(np.uint8)


def _path(refs: np.ndarray) -> np.ndarray:
    """``(4 M,)`` for :func:`_internal`: the columns ``d, a, b, i`` of every row ``i: (b, a, d)``
    of ``refs`` ``(M, 3)``, block by block; a missing reference is ``i`` itself."""
    i = np.arange(len(refs))[:, None]
    return np.concatenate([np.where(refs >= 0, refs, i)[:, ::-1], i], 1).T.ravel()


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


#: the kinds of rows of ``zmat/csrc/world.cpp``
WORLD_CART, WORLD_SECOND, WORLD_THIRD_ON_SECOND, WORLD_THIRD_ON_ROOT, WORLD_NERF = range(5)


def _world_rows(refs, nref, free, tree_atoms, tree_of):
    """Every atom's kind in ``zmat/csrc/world.cpp`` (``(N,)`` uint8) and its references ``(N, 3)``
    ``(b, a, d)``: a tree's third atom has its tree's second atom as ``d``; a Cartesian atom (fixed,
    or a root) refers to itself (unread)."""
    n = len(refs)
    kinds = np.full(n, WORLD_NERF, np.uint8)
    kinds[~free | (nref == 0)] = WORLD_CART
    kinds[free & (nref == 1)] = WORLD_SECOND
    third = np.nonzero(free & (nref == 2))[0]
    second = tree_atoms[tree_of[third], 1]
    kinds[third] = np.where(refs[third, 0] == second, WORLD_THIRD_ON_SECOND, WORLD_THIRD_ON_ROOT)
    rows = np.where(refs >= 0, refs, np.arange(n)[:, None])
    rows[third, 2] = second
    rows[kinds == WORLD_CART] = np.arange(n)[kinds == WORLD_CART, None]
    return kinds, rows


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
    ``(3 T,)`` stack; other entries 0, masked) go in ``q``: the second atom's ``(cos beta, alpha)``, the
    third atom's ``gamma``; and the mask of those entries."""
    n_trees = len(tree_atoms)
    euler_index = np.zeros((n, 3), np.int64)
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
