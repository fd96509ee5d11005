"""The third axes ``to_xyz`` carries through straight angles, rebuilt from positions.

``to_xyz`` gives every atom ``i`` a frame whose third axis is the normal of the
plane ``(a, b, i)`` it was placed in; where that plane is undefined (``i`` on
the line ``a - b``) the axis is the anchor's, rotated by the row's effective
dihedral (``docs/conventions.md``, "Degenerate geometry"). A row's dihedral is
measured against its *reference axis* (the third axis of its anchor, or of its
sibling for an OFFSET row), so ``to_internal`` measures it against the axis
``to_xyz`` would carry: each atom's own normal where it is defined, else the
reference axis of its own row, resolved for all atoms at once by pointer
jumping (``rounds`` gathers, known on the host). With an undefined dihedral
reported as 0, that is exactly the axis ``to_xyz`` builds from the reported
values, so ``to_xyz(to_internal(x)) == x`` for every ``x = to_xyz(C)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from . import _kernel
from ._geometry import _COLLINEAR, any_perpendicular, axis, dot, safe_atan2, safe_sqrt, safe_unit, tiny
from .table import BOND, OFFSET, PLANAR, POSITIONAL, PROPER, ConstructionTable, index_tensor


@dataclass(frozen=True)
class CarriedPlan:
    """Per-device index tensors (``N`` atoms), built once per table.

    An atom's axis is indexed in ``[0, 2 N)``: ``j`` for ``+axis_j``, ``N + j`` for ``-axis_j``.
    ``ref[i]``: row ``i``'s reference axis, when its own normal is undefined its atom's
    axis: the rigid parent's (PROPER and rigid PLANAR rows), ``d``'s (OFFSET rows, and
    POSITIONAL rows whose plane is ``d``'s frame; negated for a cousin), else ``i``'s own.
    ``jump``: ``(2 N,)`` the same for both signs; ``fixed``: the rows whose own
    axis is the end of every chain (``ref[i] == i``); ``slots``: ``arange(2 N)``;
    ``rounds``: the doublings that reach the end of the longest chain.
    ``z_rows``: ROOT and BOND rows (axis ``+z``);
    ``planar_rows``: PLANAR rows with no rigid parent; ``nerf_rows``: POSITIONAL rows
    whose plane comes from positions.
    """

    ref: torch.Tensor
    jump: torch.Tensor
    fixed: torch.Tensor
    slots: torch.Tensor
    z_rows: torch.Tensor
    planar_rows: torch.Tensor
    nerf_rows: torch.Tensor
    rounds: int


def carried_plan(table: ConstructionTable, device: torch.device) -> CarriedPlan:
    kind, n = table.kind, table.n_atoms
    ar = np.arange(n)
    plane = table.dihedral_plane
    rigid = (table.parent >= 0) & np.isin(kind, (PLANAR, PROPER))
    atom = np.where(rigid, table.parent, ar)
    atom = np.where(kind == OFFSET, table.offset_of, atom)
    atom = np.where(plane != 0, table.refs[:, 2], atom)
    ptr, rounds = atom, 0  # the depth of the reference forest, in doublings
    while (ptr[ptr] != ptr).any():
        ptr, rounds = ptr[ptr], rounds + 1
    rounds += bool((atom != ar).any())
    ref = atom + n * (plane < 0)

    def rows(mask):
        return index_tensor(np.flatnonzero(mask), device)

    return CarriedPlan(
        ref=index_tensor(ref, device),
        jump=index_tensor(np.concatenate([ref, (ref + n) % (2 * n)]), device),
        fixed=torch.as_tensor(np.tile(atom == ar, 2), device=device),
        slots=index_tensor(np.arange(2 * n), device),
        z_rows=rows(kind <= BOND),
        planar_rows=rows((kind == PLANAR) & ~rigid),
        nerf_rows=rows((kind == POSITIONAL) & (plane == 0)),
        rounds=rounds,
    )


def _rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return x.index_select(-2, rows)


def _nerf_axis(b1: torch.Tensor, b2: torch.Tensor, axes) -> torch.Tensor:
    """The third axis of ``_geometry.nerf_anchor`` from positions (``b1 = x_a - x_d``,
    ``b2 = x_b - x_a``): ``b1 x e1``, or a fixed perpendicular of the axis ``e1`` where
    ``d, a, b`` are collinear (the same test)."""
    e1 = safe_unit(b2, _axis(0, b2, axes))
    n = torch.linalg.cross(b1, e1, dim=-1)
    sq = (n * n).sum(-1, keepdim=True)
    straight = sq <= _COLLINEAR.get(b1.dtype, 1e-10) * (b1 * b1).sum(-1, keepdim=True)
    straight = straight | (sq <= tiny(b1.dtype))
    return torch.where(straight, any_perpendicular(e1, axes), n)


def _planar_axis(b2: torch.Tensor, axes) -> torch.Tensor:
    """The third axis of ``_geometry.planar_anchor``: ``(-y) x e1``, ``+z`` where it vanishes."""
    e1 = safe_unit(b2, _axis(0, b2, axes))
    return safe_unit(torch.linalg.cross(-_axis(1, b2, axes).expand_as(e1), e1, dim=-1), _axis(2, b2, axes))


def _axis(k: int, like: torch.Tensor, axes) -> torch.Tensor:
    """The ``k``-th axis of the placement frame: of the world (``axes`` None) or ``axes[..., k]``."""
    return axis(k, 3, like) if axes is None else axes[..., k]


def _own_or(n: torch.Tensor, defined: torch.Tensor, rows: torch.Tensor, fallback: torch.Tensor):
    """``n`` with ``rows`` replaced by ``fallback`` where their own normal is undefined."""
    own = defined.index_select(-1, rows)[..., None]
    return n.index_copy(-2, rows, torch.where(own, _rows(n, rows), fallback))


def end_axes(b1_of, b2_of, like: torch.Tensor, plan: CarriedPlan, axes_of=None) -> tuple:
    """The fixed axes that end the chains, ``(z, planar, nerf)``, each ``(..., len(rows), 3)``
    (None where the plan has no such rows): ``+z`` of the ROOT/BOND rows' frame, the planar and
    nerf anchors' axes of those rows (used where their own normal is undefined, and the nerf
    rows' reference axis). ``b1_of``/``b2_of``: a row index tensor -> ``x_a - x_d`` / ``x_b - x_a``
    of those rows; ``like``: ``(..., N, 3)``, for the batch shape; ``axes_of`` as for
    :func:`carried_dihedral`."""

    def frame(rows):
        return None if axes_of is None else axes_of(rows)

    z = planar = nerf = None
    if len(p := plan.z_rows):
        z = _axis(2, like, frame(p)).expand(*like.shape[:-2], len(p), 3)
    if len(p := plan.planar_rows):
        planar = _planar_axis(b2_of(p), frame(p))
    if len(p := plan.nerf_rows):
        nerf = _nerf_axis(b1_of(p), b2_of(p), frame(p))
    return z, planar, nerf


def carried_dihedral(b1, b2, n, defined, norm_b2, plan: CarriedPlan, axes_of=None, ends=None) -> torch.Tensor:
    """Every row's dihedral ``(..., N)`` against the reference axis ``to_xyz`` carries.

    Args:
        b1, b2: ``x_a - x_d`` and ``x_b - x_a`` per row, ``(..., N, 3)``.
        n: ``unit(b2 x (x_i - x_b))``, each atom's own normal where defined, ``(..., N, 3)``.
        defined: ``(..., N)`` bool, where ``n`` is the normal (the angle at ``b`` is not straight).
        norm_b2: ``|b2|``, ``(..., N)``.
        plan: :func:`carried_plan` of the table.
        axes_of: ``None`` (``to_xyz``'s frame is the world's), or a function of a row index
            tensor giving the axes (columns, ``(..., len(rows), 3, 3)``) of the frame those
            rows were placed in (a flow's tree, placed by ``to_xyz`` and then rotated).
        ends: :func:`end_axes`, when given (then ``axes_of`` is not read).

    Returns 0 where the row's own normal is undefined (the axis then carries on unturned).
    """
    if ends is None:
        ends = end_axes(lambda p: _rows(b1, p), lambda p: _rows(b2, p), n, plan, axes_of)
    z, planar, nerf = ends
    axes = n  # each atom's axis where it ends a chain
    if planar is not None:
        axes = _own_or(axes, defined, plan.planar_rows, planar)
    if nerf is not None:
        axes = _own_or(axes, defined, plan.nerf_rows, nerf)
    if z is not None:
        axes = axes.index_copy(-2, plan.z_rows, z)
    # pointer jumping over signed axes: an atom whose own normal is undefined takes its reference's
    ends_ = torch.cat([defined, defined], -1) | plan.fixed
    ptr = torch.where(ends_, plan.slots, plan.jump)
    for _ in range(plan.rounds):
        ptr = ptr.gather(-1, ptr)
    ptr = ptr.index_select(-1, plan.ref)
    m = torch.cat([axes, -axes], -2).gather(-2, ptr[..., None].expand(*ptr.shape, 3))
    if nerf is not None:
        m = m.index_copy(-2, plan.nerf_rows, nerf)
    phi = safe_atan2(dot(torch.linalg.cross(b2, m, dim=-1), n), norm_b2 * dot(m, n))
    return torch.where(defined, phi, 0.0)


def internal_coordinates(
    xyz: torch.Tensor, table: ConstructionTable, axes_of=None, ends=None
) -> torch.Tensor:
    """``zmat.to_internal`` (``(..., N, 3)`` positions -> ``(r, theta, phi)``, 0 where a
    reference is missing); ``axes_of`` and ``ends`` as for :func:`carried_dihedral`."""
    plan = table.plan(xyz.device)
    padded = torch.cat([xyz, torch.zeros_like(xyz[..., :1, :])], -2)
    ref = padded.index_select(-2, plan.refs_or_origin.reshape(-1)).unflatten(-2, (table.n_atoms, 3))
    xb, xa, xd = ref.unbind(-2)
    b2, b3 = xb - xa, xyz - xb
    n = torch.linalg.cross(b2, b3, dim=-1)  # the normal of the plane (a, b, i)
    r, sin, norm_b2 = safe_sqrt(dot(b3, b3)), safe_sqrt(dot(n, n)), safe_sqrt(dot(b2, b2))
    theta = safe_atan2(sin, -dot(b2, b3))
    defined = sin > math.sqrt(_COLLINEAR.get(xyz.dtype, 1e-10)) * norm_b2 * r  # not straight at b
    n = n / torch.where(defined, sin, 1.0)[..., None]  # unit: atan2's zero test is absolute
    phi = carried_dihedral(
        xa - xd, b2, n, defined, norm_b2, table.cached(carried_plan, xyz.device), axes_of, ends
    )
    out = torch.stack([r, theta, phi], -1)
    return torch.where(plan.present, out, torch.zeros((), dtype=xyz.dtype, device=xyz.device))


@dataclass(frozen=True)
class CarriedKernel:
    """The arrays of ``zmat._kernel.carried`` (``zmat/csrc/internal.cpp``), CPU, contiguous:
    ``ab`` ``(2 N,)`` the references ``a``, ``b`` (-1 missing), ``ref`` ``(N,)`` signed slots,
    ``eslot`` ``(N,)`` each row's place in the ends ``cat(end_axes)`` (-1 none), ``mode`` ``(N,)``
    uint8: bit 0 the axis is an end, 1 an end where the own normal is undefined, 2 the row's
    reference axis is its end (nerf rows), 3 the atom ends every chain; ``order`` ``(N,)`` the
    table's placement order (every reference first)."""

    ab: torch.Tensor
    ref: torch.Tensor
    eslot: torch.Tensor
    mode: torch.Tensor
    order: torch.Tensor


def carried_kernel(table: ConstructionTable, device: torch.device) -> CarriedKernel | None:
    """:class:`CarriedKernel` of the table, or None where a reference axis would follow its row
    in the placement order (the kernel resolves the axes in one walk in that order)."""
    plan, n, order = table.cached(carried_plan, device), table.n_atoms, table.topo_order
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    if (pos[plan.ref.cpu().numpy() % n] > pos).any():
        return None
    mode, eslot, start = np.zeros(n, np.uint8), np.full(n, -1, np.int64), 0
    for rows, bits in ((plan.z_rows, 1), (plan.planar_rows, 2), (plan.nerf_rows, 6)):
        rows = rows.cpu().numpy()
        mode[rows] |= bits
        eslot[rows] = np.arange(start, start + len(rows))
        start += len(rows)
    mode |= 8 * plan.fixed[:n].cpu().numpy().astype(np.uint8)
    refs = table.refs
    return CarriedKernel(
        ab=index_tensor(np.concatenate([refs[:, 1], refs[:, 0]]), device),
        ref=plan.ref,
        eslot=index_tensor(eslot, device),
        mode=torch.as_tensor(mode, device=device),
        order=index_tensor(order, device),
    )


def kernel_rows(x: torch.Tensor, table: ConstructionTable, flags: torch.Tensor, axes_of=None):
    """:func:`internal_coordinates` of ``x`` ``(B, N, 3)`` (the position itself on the rows
    whose ``flags`` have bit 3, zeros where bits 0-2 say an entry is missing) in one call of the
    compiled kernel; None where it does not apply (:func:`carried_kernel`). The ends
    (:func:`end_axes`) in torch ops, so their gradient (through ``axes_of``) is autograd's."""
    kernel = table.cached(carried_kernel, x.device)
    if kernel is None:
        return None
    plan = table.cached(carried_plan, x.device)
    refs = None
    if len(plan.planar_rows) or len(plan.nerf_rows):
        padded = torch.cat([x, torch.zeros_like(x[..., :1, :])], -2)
        refs = table.plan(x.device).refs_or_origin

        def bond(p, k):  # x_{refs[k - 1]} - x_{refs[k]} of the rows p
            r = refs.index_select(0, p)
            return padded.index_select(-2, r[:, k - 1]) - padded.index_select(-2, r[:, k])

    ends = end_axes(lambda p: bond(p, 2), lambda p: bond(p, 1), x, plan, axes_of)
    given = [e for e in ends if e is not None]
    E = given[0] if len(given) == 1 else torch.cat(given, -2) if given else x.new_zeros(x.shape[0], 0, 3)

    def reference(x, E):  # the same in differentiable torch ops (double backward)
        parts = iter(E.split([e.shape[-2] for e in ends if e is not None], -2))
        q = internal_coordinates(x, table, ends=tuple(None if e is None else next(parts) for e in ends))
        return torch.where((flags & 8).bool()[:, None], x, q)

    return _kernel.carried(x, E, kernel, flags, reference)
