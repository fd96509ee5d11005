"""Plans whose columns are atoms: one generic concatenate and take.

A plan of a table (:class:`zmat.table.TablePlan`, the compiled kernel's
``zmat._kernel.KernelArrays``) is a frozen dataclass of int64 arrays with one
column per atom (or depth-first position: a batch table keeps each
component's atoms and positions in one range). Each field declares, with
:func:`column`, what its values index (atoms, positions, nothing), how many
values per indexed item (``scale``: 3 for flat indices into ``C``), and what a
missing index becomes. Packed as one ``(rows, N)`` matrix (:func:`pack`),
concatenating plans is their columns side by side with every indexing row
increased by ``scale`` times its component's first atom, and taking
components is a gather of whole components' columns with the same shift: as
PyTorch Geometric's ``Batch.__inc__``, for every field at once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import field, fields

import numpy as np

from ._segments import per_row, starts, take_shift

__all__ = [
    "ATOMS",
    "POSITIONS",
    "column",
    "concatenate",
    "decode",
    "encode",
    "joined",
    "pack",
    "rows",
    "take",
    "taken",
    "unpack",
]

ATOMS, POSITIONS = "atoms", "positions"
#: a missing index while packed: negative after any shift
NONE = -(1 << 40)


def column(
    index: str | None = None, width: int | None = 1, scale: int = 1, none: str = "-1", by_rows: bool = False
):
    """A plan field. ``index``: what its values index (``ATOMS``,
    ``POSITIONS``, None); ``width``: values per atom (None: as many as the
    plan needs, padded with missing values where plans of different widths
    are joined); ``scale``: values per indexed item; ``none``: a missing
    index (negative) reads ``"-1"``, ``"n"`` (the number of atoms: a zero
    slot) or ``"clip"`` (0: an unused entry, in range); ``by_rows``: stored
    as ``(width, N)`` (else ``(N, width)``, or ``(N,)`` for width 1)."""
    return field(metadata={"index": index, "width": width, "scale": scale, "none": none, "by_rows": by_rows})


def rows(cls) -> tuple:
    """``cls``' fields as ``(name, width, scale, none, by_rows)``, indexing
    fields last (a scale of 0: indexes nothing), cached on ``cls``."""
    layout = cls.__dict__.get("_column_layout")
    if layout is None:
        spec = [(f.name, f.metadata) for f in fields(cls)]
        order = sorted(spec, key=lambda s: s[1]["index"] is not None)  # (stable)
        if [s[1]["width"] is None for s in order].count(True) > 1:
            raise TypeError(f"{cls.__name__}: at most one field of free width")
        layout = tuple(
            (n, m["width"], m["scale"] if m["index"] else 0, m["none"], m["by_rows"]) for n, m in order
        )
        cls._column_layout = layout
    return layout


def pack(plan, dtype=np.int64) -> np.ndarray:
    """``(rows, N)`` (int64, or ``dtype`` for a plan that indexes nothing),
    C-ordered: the fields one after the other (a row per value of an atom),
    missing indices ``NONE``."""
    out = []
    for name, _, scale, none, by_rows in rows(type(plan)):
        a = np.asarray(getattr(plan, name))
        a = a[None] if a.ndim == 1 else a if by_rows else a.T
        if scale:
            missing = (a < 0) | (a >= a.shape[1]) if none == "n" else a < 0
            a = np.where(missing, NONE, a)
        out.append(a)
    return np.concatenate(out).astype(dtype, order="C")


def unpack(cls, packed: np.ndarray):
    """The plan of a packed (and shifted) matrix; ``packed`` is modified
    (:func:`decode`) and kept (the fields are views of it)."""
    decode(cls, packed)
    values = {}
    for name, first, end, declared, by_rows in _layout(cls, packed.shape[0])[0]:
        a = packed[first:end]
        if not by_rows:  # atom-major: the free-width field a view (it is read per atom)
            a = a[0] if declared == 1 else a.T if declared is None else np.ascontiguousarray(a.T)
        values[name] = a
    return cls(**values)


def encode(cls, matrix: np.ndarray) -> np.ndarray:
    """A copy of a decoded matrix (as :func:`unpack` leaves it) packed again:
    its missing indices ``NONE``."""
    out = matrix.astype(np.int64, copy=True)
    n = out.shape[1]
    for first, end, none, _ in _layout(cls, out.shape[0])[2]:
        block = out[first:end]
        if none != "clip":
            np.putmask(block, (block < 0) | (block >= n) if none == "n" else block < 0, NONE)
    return out


def decode(cls, packed: np.ndarray) -> np.ndarray:
    """``packed`` with its missing indices (negative) as the fields declare, in place."""
    n = packed.shape[1]
    for first, end, none, scale in _layout(cls, packed.shape[0])[2]:
        block = packed[first:end]
        if none == "-1":
            np.maximum(block, -1, out=block)
        else:
            np.putmask(block, block < 0, n if none == "n" else 0)
            if none == "clip":
                np.minimum(block, scale * n - 1, out=block)
    return packed


@functools.lru_cache(maxsize=64)
def _layout(cls, height: int) -> tuple:
    """Where the fields of ``cls`` lie in a packed matrix of ``height`` rows:
    ``(name, first, end, declared width, by rows)`` per field, then runs of
    indexing rows ``(first, end, scale)`` (one shift each), then runs
    ``(first, end, none, scale)`` (one decoding of missing values each)."""
    free = height - sum(w or 0 for _, w, *_ in rows(cls))
    slices, shift, missing, at = [], [], [], 0
    for name, declared, scale, none, by_rows in rows(cls):
        end = at + (free if declared is None else declared)
        slices.append((name, at, end, declared, by_rows))
        if scale and end > at:
            if shift and shift[-1][1] == at and shift[-1][2] == scale:
                shift[-1] = (shift[-1][0], end, scale)
            else:
                shift.append((at, end, scale))
            if missing and missing[-1][1] == at and missing[-1][2:] == (none, scale):
                missing[-1] = (missing[-1][0], end, none, scale)
            else:
                missing.append((at, end, none, scale))
        at = end
    return tuple(slices), tuple(shift), tuple(missing)


def concatenate(cls, packed: Sequence[np.ndarray]):
    """The plan of the plans ``packed`` (their :func:`pack`), the atoms of
    each after those before (:func:`joined`)."""
    return unpack(cls, joined(cls, packed))


def take(cls, packed: np.ndarray, ptr: np.ndarray, index: np.ndarray):
    """Components ``index`` (in that order) of the plan ``packed`` whose
    component ``k`` is atoms and positions ``ptr[k]:ptr[k + 1]`` (:func:`taken`)."""
    return unpack(cls, taken(cls, packed, ptr, index))


def joined(cls, packed: Sequence[np.ndarray]) -> np.ndarray:
    """The packed plans ``packed`` side by side (a narrower free-width field
    padded with missing values, or zeros in a plan that indexes nothing),
    indices shifted by each plan's first atom."""
    size = np.fromiter((a.shape[1] for a in packed), np.int64, len(packed))
    height = max(a.shape[0] for a in packed)
    if all(a.shape[0] == height for a in packed):
        out = np.concatenate(packed, 1)
    else:  # the free-width field: missing values below a narrower plan's rows
        top, bottom = _around_free(cls)
        dtype = packed[0].dtype
        out = np.full((height, int(size.sum())), NONE if dtype == np.int64 else 0, dtype)
        at = 0
        for a in packed:
            cols, free = slice(at, at + a.shape[1]), a.shape[0] - bottom
            out[:free, cols] = a[:free]
            if bottom:
                out[-bottom:, cols] = a[free:]
            at += a.shape[1]
    _add(cls, out, per_row(starts(size), size))
    return out


def taken(cls, packed: np.ndarray, ptr: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Components ``index`` of the packed plan ``packed``: their columns,
    indices shifted, the free-width field as wide as they need."""
    _, shift = take_shift(ptr, index)  # new - old index of every atom and position
    cols = np.arange(len(shift)) - shift
    out = np.empty((packed.shape[0], len(cols)), packed.dtype)
    for k in range(packed.shape[0]):  # a row at a time: numpy's gather along axis 1 is slower
        np.take(packed[k], cols, out=out[k])
    _add(cls, out, shift)
    top, bottom = _around_free(cls)
    free = out.shape[0] - top - bottom
    if free > 1:  # the free-width field as wide as the components taken need
        used = 1 + int(np.flatnonzero((out[top + 1 : top + free] >= 0).any(1)).max(initial=-1)) + 1
        out = np.concatenate([out[: top + used], out[top + free :]]) if used < free else out
    return out


def _add(cls, out: np.ndarray, shift: np.ndarray) -> None:
    """Indexing rows of ``out`` increased by ``scale * shift`` (missing ones stay negative)."""
    for first, end, scale in _layout(cls, out.shape[0])[1]:
        out[first:end] += shift if scale == 1 else scale * shift


def _around_free(cls) -> tuple[int, int]:
    """Packed rows before and after the free-width field."""
    widths = [w for _, w, *_ in rows(cls)]
    if None not in widths:
        return sum(widths), 0
    k = widths.index(None)
    return sum(widths[:k]), sum(widths[k + 1 :])
