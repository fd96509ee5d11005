"""The public transforms: internal coordinates <-> Cartesian coordinates.

Conventions (``docs/conventions.md``): ``C[..., i, :] = (r_i, theta_i, phi_i)`` with
``r_i = |x_i - x_b|``, ``theta_i = angle(x_i, x_b, x_a)`` in radians and
``phi_i = dihedral(x_d, x_a, x_b, x_i)`` in radians with the IUPAC sign (the
sign of ASE, RDKit, Open Babel and every protein tool; chemcoord's is the
opposite). ``(b, a, d)`` is row ``i`` of the construction table.
"""

from __future__ import annotations

import torch

from ._amp import float32_under_autocast
from ._analytic import place_analytic, place_prefix
from ._carried import internal_coordinates
from ._geometry import dihedral_from_bonds
from ._levels import place_levels
from ._reference import place_reference
from .table import ConstructionTable, as_table

__all__ = ["METHODS", "dihedrals", "to_internal", "to_xyz"]

_PLACERS = {
    "reference": place_reference,
    "levels": place_levels,
    "prefix": place_prefix,
    "analytic": place_analytic,
}

#: Names accepted by ``to_xyz(..., method=...)`` (besides ``"auto"``):
#:
#: * ``"reference"``: sequential, one atom per step; readable ground truth.
#: * ``"levels"``: one vectorised step per dependency level.
#: * ``"prefix"``: pointer-jumping (log-depth) forward, plain autograd backward.
#: * ``"analytic"``: same forward, custom ``autograd.Function`` with an analytic,
#:   O(1)-depth backward that is itself differentiable; ``jvp`` and
#:   ``torch.func`` supported. What ``"auto"`` picks.
METHODS = tuple(_PLACERS)


def _check(values: torch.Tensor, table: ConstructionTable, name: str) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        if hasattr(values, "__array__"):
            values = torch.as_tensor(values)
        else:
            raise TypeError(f"{name} must be a torch.Tensor, got {type(values).__name__}")
    if not values.dtype.is_floating_point:
        raise TypeError(f"{name} must have a floating dtype, got {values.dtype}")
    n = table.n_atoms
    if values.ndim < 2 or values.shape[-1] != 3 or values.shape[-2] != n:
        hint = ""
        if values.ndim >= 2 and values.shape[-2] == 3 and values.shape[-1] == n:
            hint = f" (a (3, N) layout must be transposed: pass {name}.transpose(-1, -2))"
        raise ValueError(
            f"{name} must have shape (..., {n}, 3) to match the construction table "
            f"of {n} atoms, got shape {tuple(values.shape)}{hint}"
        )
    return values


@float32_under_autocast  # computes in float32 under torch.autocast (zmat/_amp.py)
def to_xyz(C: torch.Tensor, table, method: str = "auto") -> torch.Tensor:
    """Cartesian coordinates from internal coordinates.

    Args:
        C: ``(..., N, 3)`` float tensor of ``(r, theta, phi)`` per atom
            (length unit of the output, radians). Any leading batch dims.
        table: a :class:`ConstructionTable` or an integer array-like ``(N, 3)``.
        method: one of :data:`METHODS`, or ``"auto"`` (``"analytic"``).

    Returns:
        ``(..., N, 3)`` positions, differentiable in ``C`` (first and second
        derivatives), same dtype and device as ``C``.

    Raises:
        ValueError: bad table, shape mismatch, unknown method.
        TypeError: ``C`` not a float tensor.

    Example:
        >>> table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]]
        >>> C = torch.tensor([[0, 0, 0], [1.0, 0, 0], [1.0, torch.pi / 2, 0]])
        >>> xyz = to_xyz(C, table)  # atom 0 at the origin, 1 on +x, 2 in the xy-plane (+y)
        >>> torch.allclose(xyz, torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0]]), atol=1e-6)
        True
    """
    table = as_table(table)
    C = _check(C, table, "C")
    if method == "auto":
        method = "analytic"
    try:
        place = _PLACERS[method]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS} or 'auto'") from None
    return place(C, table)  # each method resolves missing references its own way


@float32_under_autocast
def to_internal(xyz: torch.Tensor, table) -> torch.Tensor:
    """Internal coordinates from Cartesian coordinates.

    Args:
        xyz: ``(..., N, 3)`` float tensor of positions.
        table: a :class:`ConstructionTable` or an integer array-like ``(N, 3)``.

    Returns:
        ``(..., N, 3)`` tensor of ``(r, theta, phi)``; ``theta`` in ``[0, pi]``,
        ``phi`` in ``(-pi, pi]``; 0 where the reference is missing. Where a
        dihedral is undefined (collinear ``d, a, b`` or ``a, b, i``, or
        coincident atoms) it is 0, and every value has a finite gradient.

    Example:
        >>> xyz = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0]])
        >>> to_internal(xyz, [[-1, -1, -1], [0, -1, -1], [1, 0, -1]])[2]
        tensor([1.0000, 1.5708, 0.0000])
    """
    table = as_table(table)
    xyz = _check(xyz, table, "xyz")
    return internal_coordinates(xyz, table)


def dihedrals(xyz: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
    """Dihedral angles (IUPAC sign, radians) of atom quadruples, NaN where undefined.

    Args:
        xyz: ``(..., N, 3)`` positions.
        quads: ``(..., 4)`` int64 atom indices ``(p0, p1, p2, p3)``; a row with
            any ``-1`` is undefined.

    Returns:
        ``xyz.shape[:-2] + quads.shape[:-1]``; differentiable in ``xyz`` (finite
        gradients; NaN only in the undefined entries' values, 0 where the
        points are collinear).

    Example:
        >>> xyz = torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 0, 0], [1, 0, 1]])
        >>> dihedrals(xyz, torch.tensor([0, 1, 2, 3]))
        tensor(1.5708)
    """
    valid = (quads >= 0).all(-1)
    idx = quads.clamp_min(0).reshape(-1)
    p = xyz.index_select(-2, idx).unflatten(-2, (*quads.shape[:-1], 4))
    p0, p1, p2, p3 = p.unbind(-2)
    return torch.where(valid, dihedral_from_bonds(p1 - p0, p2 - p1, p3 - p2), torch.nan)
