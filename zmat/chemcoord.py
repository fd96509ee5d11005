"""Import z-matrices from chemcoord (a chemcoord ``Zmat``, or its raw arrays).

What chemcoord 2.2 does (read from its source: ``constants.py``,
``_zmat_internal_coordinates/_zmat_transformation.py::get_X`` and
``_cartesian_coordinates/_cart_transformation.py::get_B``):

* A ``Zmat`` frame has the columns ``atom, b, bond, a, angle, d, dihedral``;
  its index holds atom labels, and ``b``, ``a``, ``d`` hold labels or one of
  the strings ``'origin'``, ``'e_x'``, ``'e_y'``, ``'e_z'`` (*absolute
  references*, used by the first rows). Angles are in degrees.
* Its jitted code works on ``(3, N)`` arrays: ``c_table[:, j]`` are the
  references of row ``j`` as row positions, absolute references replaced by
  integer sentinels ``origin = -2**63``, ``e_x = -2**63 + 1`` (the
  ``-9223372036854775807`` a user sees), ``e_y = -2**63 + 2``,
  ``e_z = -2**63 + 3``; every value below ``-2**63 + 101`` is absolute.
* Rows are built in order. Absolute references are fixed **points**
  (``0``, ``e_x``, ``e_y``, ``e_z``), not directions: a row
  ``(origin, e_z, e_x)`` places its atom at distance ``bond`` from the origin.
* The position is ``x_b + B S`` with ``B`` the NeRF frame of ``(b, a, d)`` and
  ``S = (r sin(alpha) cos(delta), -r sin(alpha) sin(delta), -r cos(alpha))``:
  the IUPAC dihedral is ``phi = -delta`` (chemcoord's sign is the opposite).
  An angle within ``numpy.isclose`` of 180 (or 0) degrees is snapped to it,
  whatever the dihedral; zmat does the same here so that positions agree.

The import
----------
:func:`from_chemcoord` and :func:`from_chemcoord_arrays` return ``(C, table)``
with one row per chemcoord row, **in the same order** as chemcoord's rows (and
as the rows of ``get_cartesian()``). A row without absolute references keeps
its references and values: ``C = (bond, radians(angle), -radians(dihedral))``.
A row with absolute references gets atom references instead: the first row
becomes the root, the second ``(b, -1, -1)``, the third ``(b, a, -1)``, and any
later row a full row whose missing references are the earlier atoms nearest to
its bond reference that do not make a near-linear angle; its values are
measured on the positions chemcoord builds. Then ``zmat.to_xyz(C, table)``
equals ``get_cartesian()`` up to a rigid motion (a proper rotation plus a
translation).

**The absolute placement** is reproduced with ``absolute=True``: the table
gets four more rows ``N..N+3``, dummy atoms at ``0``, ``e_x``, ``e_y`` and
``e_z`` (placed as root, ``(N, -1, -1)`` at ``r = 1``, ``(N, N+1, -1)`` at
``r = 1, theta = 90 deg``, and ``(N, N+1, N+2)`` at ``r = 1, theta = 90 deg,
phi = -90 deg``), the absolute references point to them and every value is
kept. Then ``zmat.to_xyz(C, table)[:N]`` *is* ``get_cartesian()``.

If the values are a tensor, ``C`` is differentiable in it (and keeps its
dtype and device), so chemcoord-style inputs from a network can be fed
straight to ``zmat.to_xyz``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .autotable import angle
from .table import ConstructionTable
from .transform import to_internal, to_xyz

__all__ = ["from_chemcoord", "from_chemcoord_arrays", "ABSOLUTE_REFERENCES"]

_MIN = -(2**63)
#: chemcoord's integer sentinels for absolute references (``chemcoord.constants.int_label``).
ABSOLUTE_REFERENCES = {"origin": _MIN, "e_x": _MIN + 1, "e_y": _MIN + 2, "e_z": _MIN + 3}
_KEYS_BELOW_ARE_ABS = _MIN + 101  # chemcoord.constants.keys_below_are_abs_refs
_ABS_ORDER = ("origin", "e_x", "e_y", "e_z")
_MIN_SIN = math.sin(math.radians(10.0))


class Imported(NamedTuple):
    """What :func:`import_zmat` returns: ``C`` and ``table`` as :func:`from_chemcoord`, and the
    element symbols of the rows (``None`` for raw arrays; four ``'X'`` added with ``absolute``)."""

    C: torch.Tensor
    table: ConstructionTable
    symbols: list[str] | None


def from_chemcoord(zmat, *, absolute: bool = False) -> tuple[torch.Tensor, ConstructionTable]:
    """``(C, table)`` from a chemcoord ``Zmat`` (or its pandas frame).

    Args:
        zmat: a ``chemcoord.Zmat``, or a ``pandas.DataFrame`` with the columns
            ``atom, b, bond, a, angle, d, dihedral`` (chemcoord's layout).
        absolute: add the four absolute-reference dummies so that the first
            ``N`` rows of ``to_xyz`` are chemcoord's positions exactly (see the
            module docstring); otherwise they agree up to a rigid motion.

    Returns:
        ``C``: ``(N, 3)`` float64 tensor (``(N + 4, 3)`` with ``absolute``);
        ``table``: the matching :class:`~zmat.ConstructionTable`. Row ``k`` is
        the ``k``-th row of ``zmat`` (``zmat.index[k]``).

    Raises:
        ValueError: missing columns, unknown references, references to later
            rows (chemcoord builds rows in order).

    Example:
        >>> import chemcoord as cc  # doctest: +SKIP
        >>> C, table = from_chemcoord(cc.Cartesian.read_xyz("mol.xyz").get_zmat())  # doctest: +SKIP
        >>> xyz = zmat.to_xyz(C, table)  # doctest: +SKIP
    """
    imp = import_zmat(zmat, absolute=absolute)
    return imp.C, imp.table


def from_chemcoord_arrays(
    c_table,
    values_deg,
    *,
    index: Sequence | None = None,
    absolute: bool = False,
    transposed: bool | None = None,
    degrees: bool = True,
) -> tuple[torch.Tensor, ConstructionTable]:
    """``(C, table)`` from chemcoord-style raw arrays.

    This is what a user of chemcoord's internals holds: a construction table
    with integer sentinels for the absolute references (``(3, N)``, as
    ``Zmat._extract_c_table()`` returns it, or ``(N, 3)``), and the values
    ``bond, angle, dihedral`` in Angstrom and degrees with chemcoord's dihedral
    sign.

    Args:
        c_table: integer array-like, ``(N, 3)`` rows ``(b, a, d)`` or
            ``(3, N)``; atom references are row positions (or labels, with
            ``index``); values below ``-2**63 + 101`` are absolute references
            (:data:`ABSOLUTE_REFERENCES`).
        values_deg: ``(N, 3)`` or ``(3, N)`` array-like or tensor of
            ``(bond, angle, dihedral)``, degrees, chemcoord's sign. A tensor
            keeps its dtype/device and the result is differentiable in it.
        index: optional row labels; then atom references are labels.
        absolute: see :func:`from_chemcoord`.
        transposed: whether the arrays are ``(3, N)``. ``None`` infers it from
            the shapes, and for ``N = 3`` from which layout has a first row of
            only absolute references.
        degrees: ``False`` when the angles are already in radians (the ``C``
            that chemcoord's jitted ``get_X(C, c_table)`` takes).

    Returns:
        ``(C, table)`` as :func:`from_chemcoord` (``C`` in radians, IUPAC sign).

    Raises:
        ValueError: bad shapes, an ambiguous layout, unknown sentinels,
            references out of range or to later rows.

    Example:
        A ``get_X``-style loop over chemcoord arrays (``C``: ``(3, N)``
        bonds, angles, dihedrals in radians; ``c_table``: ``(3, N)`` with
        sentinels) becomes one differentiable, batched call::

            C_zmat, table = from_chemcoord_arrays(c_table, C, degrees=False)
            xyz = zmat.to_xyz(C_zmat, table)  # (N, 3), same shape as get_X(...).T
    """
    refs = np.asarray(c_table.detach().cpu() if isinstance(c_table, torch.Tensor) else c_table)
    if refs.dtype.kind not in "iu":
        raise TypeError(f"c_table must be an integer array, got dtype {refs.dtype}")
    refs = refs.astype(np.int64)
    vals = values_deg if isinstance(values_deg, torch.Tensor) else torch.as_tensor(np.array(values_deg))
    if not vals.dtype.is_floating_point:
        vals = vals.to(torch.float64)
    if refs.ndim != 2 or vals.ndim != 2 or refs.shape != tuple(vals.shape) or 3 not in refs.shape:
        raise ValueError(
            "c_table and values must both have shape (N, 3) or (3, N), got "
            f"{refs.shape} and {tuple(vals.shape)}"
        )
    if transposed is None:
        transposed = _is_transposed(refs)
    if transposed:
        refs, vals = refs.T, vals.transpose(0, 1)
    table = _sentinel_table(refs, index)
    if not degrees:
        if vals.device.type == "cpu":  # host values: checking costs no sync
            _check_radians(vals.detach()[:, 1].numpy())
        vals = torch.cat([vals[:, :1], torch.rad2deg(vals[:, 1:])], 1)
    imp = _convert(table, vals, absolute, None)
    return imp.C, imp.table


def _check_radians(theta: np.ndarray) -> None:
    """Bond angles given with ``degrees=False`` must lie in ``[0, pi]``."""
    bad = np.nonzero(np.abs(theta) > math.pi + 1e-9)[0]
    if len(bad):
        raise ValueError(
            f"row {int(bad[0])}: bond angle {theta[bad[0]]:g} is above pi with degrees=False: "
            f"the values look like degrees (pass degrees=True); rows {bad[:10].tolist()}"
        )


def _is_transposed(refs: np.ndarray) -> bool:
    """Whether ``refs`` is ``(3, N)``: from the shape, or for ``(3, 3)`` from which layout
    has a first row of only absolute references."""
    if refs.shape[0] != refs.shape[1]:
        return refs.shape[0] == 3
    row0 = bool((refs[0] < _KEYS_BELOW_ARE_ABS).all())
    col0 = bool((refs[:, 0] < _KEYS_BELOW_ARE_ABS).all())
    if row0 == col0:
        raise ValueError("cannot tell whether the (3, 3) arrays are (N, 3) or (3, N): pass transposed=")
    return col0


def _sentinel_table(refs: np.ndarray, index) -> np.ndarray:
    """``(N, 3)`` rows with atom references as rows and absolute references -2 (origin) .. -5."""
    n = refs.shape[0]
    pos_of = None if index is None else {lab: k for k, lab in enumerate(index)}
    if index is not None and len(pos_of) != n:
        raise ValueError(f"index must have {n} distinct labels")
    sentinels = list(ABSOLUTE_REFERENCES.values())
    table = np.empty((n, 3), np.int64)
    for i in range(n):
        for c in range(3):
            v = int(refs[i, c])
            if v < _KEYS_BELOW_ARE_ABS:
                if v not in sentinels:
                    raise ValueError(f"row {i}: unknown absolute-reference sentinel {v}")
                table[i, c] = -2 - sentinels.index(v)  # -2 .. -5
            else:
                table[i, c] = _row_of(v, pos_of, i, n)
    return table


def _row_of(ref, pos_of, i: int, n: int) -> int:
    if pos_of is not None:
        if ref not in pos_of:
            raise ValueError(f"row {i}: reference {ref!r} is not a row label")
        r = pos_of[ref]
    else:
        r = int(ref)
        if not 0 <= r < n:
            raise ValueError(f"row {i}: reference {r} is out of range for {n} rows")
    if r >= i:
        raise ValueError(
            f"row {i}: reference {ref!r} is not an earlier row (chemcoord builds the rows in order)"
        )
    return r


def import_zmat(zmat, *, absolute: bool = False) -> Imported:
    """:func:`from_chemcoord`, with the element symbols too (what ``ZMatrix.from_chemcoord`` needs)."""
    frame = getattr(zmat, "_frame", zmat)
    cols = ["atom", "b", "bond", "a", "angle", "d", "dihedral"]
    missing = [c for c in cols if c not in getattr(frame, "columns", ())]
    if missing:
        raise ValueError(f"not a chemcoord Zmat frame: missing columns {missing}")
    labels = list(frame.index)
    pos_of = {lab: k for k, lab in enumerate(labels)}
    n = len(labels)
    table = np.empty((n, 3), np.int64)
    for i, (lab, row) in enumerate(zip(labels, frame[["b", "a", "d"]].itertuples(index=False), strict=True)):
        for c, ref in enumerate(row):
            if isinstance(ref, str) and ref in ABSOLUTE_REFERENCES:
                table[i, c] = -2 - _ABS_ORDER.index(ref)
            else:
                try:
                    table[i, c] = _row_of(ref, pos_of, i, n)
                except ValueError as err:
                    raise ValueError(f"{err} (atom {lab!r})") from None
    vals = torch.as_tensor(frame[["bond", "angle", "dihedral"]].to_numpy(np.float64, copy=True))
    symbols = [str(s) for s in frame["atom"]]
    return _convert(table, vals, absolute, symbols)


def _dummy_values(dtype, device) -> torch.Tensor:
    h = math.pi / 2
    return torch.tensor([[0, 0, 0], [1, 0, 0], [1, h, 0], [1, h, -h]], dtype=dtype, device=device)


def _convert(table: np.ndarray, vals: torch.Tensor, absolute: bool, symbols) -> Imported:
    """``table``: (N, 3) rows, atom refs >= 0, absolute refs -2 (origin) .. -5 (e_z)."""
    n = len(table)
    r, alpha, delta = vals.unbind(-1)
    alpha = torch.deg2rad(alpha)
    # chemcoord's get_S: np.isclose(alpha, pi) or np.isclose(alpha, 0) ignore the dihedral
    alpha = torch.where((alpha - math.pi).abs() <= 1e-8 + 1e-5 * math.pi, math.pi, alpha)
    alpha = torch.where(alpha.abs() <= 1e-8, 0.0, alpha)
    C = torch.stack([r, alpha, -torch.deg2rad(delta)], -1)

    is_abs = table < 0
    full = np.where(is_abs, n - 2 - table, table)  # -2 -> n (origin), ..., -5 -> n + 3 (e_z)
    dummies = np.array([[-1, -1, -1], [n, -1, -1], [n, n + 1, -1], [n, n + 1, n + 2]], np.int64)
    C_full = torch.cat([C, _dummy_values(C.dtype, C.device)], 0)
    table_full = ConstructionTable(np.concatenate([full, dummies], 0))
    if absolute:
        syms = None if symbols is None else list(symbols) + ["X"] * 4
        return Imported(C_full, table_full, syms)

    rows = np.nonzero(is_abs.any(1))[0]
    if len(rows) == 0:
        return Imported(C, ConstructionTable(table), symbols)
    X = to_xyz(C_full, table_full)[:n]
    xn = X.detach().cpu().double().numpy()
    new = table.copy()
    for i in rows:
        new[i] = _rereference(i, table[i], xn)
    new_table = ConstructionTable(new)
    measured = to_internal(X, new_table)
    mask = torch.zeros(n, 1, dtype=torch.bool, device=C.device)
    mask[torch.as_tensor(rows, device=C.device)] = True
    return Imported(torch.where(mask, measured, C), new_table, symbols)


def _rereference(i: int, row: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Atom references for row ``i``: its own atom refs first, then the nearest earlier rows."""
    want = min(i, 3)
    refs = [int(r) for r in row if r >= 0][:want]
    if len(refs) < want:
        earlier = np.arange(i)
        anchor = x[refs[0]] if refs else x[i]
        order = earlier[np.lexsort((earlier, np.linalg.norm(x[earlier] - anchor, axis=1)))]
        pool = [int(j) for j in order if j not in refs]
        while len(refs) < want:
            k = len(refs)  # slot to fill: 0 = b, 1 = a, 2 = d
            if k == 0:
                scores = [1.0] * len(pool)
            elif k == 1:  # angle i-b-a away from 0 and 180
                scores = [float(np.sin(angle(x[i], x[refs[0]], x[j]))) for j in pool]
            else:  # plane d-a-b well defined
                scores = [float(np.sin(angle(x[j], x[refs[1]], x[refs[0]]))) for j in pool]
            good = [j for j, s in zip(pool, scores, strict=True) if s >= _MIN_SIN]
            pick = good[0] if good else pool[int(np.argmax(scores))]
            refs.append(pick)
            pool.remove(pick)
    return np.asarray(refs + [-1] * (3 - len(refs)), np.int64)
