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


def carried_dihedral(b1, b2, n, defined, norm_b2, plan: CarriedPlan, axes_of=None) -> torch.Tensor:
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

    Returns 0 where the row's own normal is undefined (the axis then carries on unturned).
    """

    def frame(rows):
        return None if axes_of is None else axes_of(rows)

    axes, nerf = n, None  # each atom's axis where it ends a chain
    if len(p := plan.planar_rows):
        axes = _own_or(axes, defined, p, _planar_axis(_rows(b2, p), frame(p)))
    if len(p := plan.nerf_rows):
        nerf = _nerf_axis(_rows(b1, p), _rows(b2, p), frame(p))
        axes = _own_or(axes, defined, p, nerf)
    if len(p := plan.z_rows):
        axes = axes.index_copy(-2, p, _axis(2, n, frame(p)).expand(*n.shape[:-2], len(p), 3))
    # pointer jumping over signed axes: an atom whose own normal is undefined takes its reference's
    ends = torch.cat([defined, defined], -1) | plan.fixed
    ptr = torch.where(ends, plan.slots, plan.jump)
    for _ in range(plan.rounds):
        ptr = ptr.gather(-1, ptr)
    ptr = ptr.index_select(-1, plan.ref)
    m = torch.cat([axes, -axes], -2).gather(-2, ptr[..., None].expand(*ptr.shape, 3))
    if nerf is not None:
        m = m.index_copy(-2, plan.nerf_rows, nerf)
    phi = safe_atan2(dot(torch.linalg.cross(b2, m, dim=-1), n), norm_b2 * dot(m, n))
    return torch.where(defined, phi, 0.0)


def internal_coordinates(xyz: torch.Tensor, table: ConstructionTable, axes_of=None) -> torch.Tensor:
    """``zmat.to_internal`` (``(..., N, 3)`` positions -> ``(r, theta, phi)``, 0 where a
    reference is missing); ``axes_of`` as for :func:`carried_dihedral`."""
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
    phi = carried_dihedral(xa - xd, b2, n, defined, norm_b2, table.cached(carried_plan, xyz.device), axes_of)
    out = torch.stack([r, theta, phi], -1)
    return torch.where(plan.present, out, torch.zeros((), dtype=xyz.dtype, device=xyz.device))
