"""Plans and batches: one field declaration, one concatenate and one take.

A plan (:class:`zmat.table.TablePlan`, the compiled kernel's
``zmat._kernel.KernelArrays``, a torsion space's
``zmat._torsion_arrays.TorsionArrays``) is a frozen dataclass of arrays whose
first axis runs over rows of some kind: atoms (depth-first positions: a batch
table keeps each component's atoms and positions in one range, so they share
the atoms' counts), torsions, molecules, the components back to back. Each
field declares, with :func:`column`, its kind of rows, its values per row
(a fixed shape, or one free-width field as wide as the plan needs), its
dtype, what its values index (a kind of rows, or nothing), how many values
per indexed item (``scale``: 3 for flat indices into ``C``) and what a
missing index reads. Packed (:func:`pack`; int64, floats by their bits,
missing indices ``NONE``) as one ``(values, rows)`` matrix (a plan of one
kind: fields joined and trimmed along values), or one flat array of the
fields one after the other (a plan of several kinds, of fixed widths: a
batch of many is one concatenation and one gather whatever their number),
concatenating plans is their columns side by side with every indexing value
increased by ``scale`` times the number of indexed rows of the components
before, and taking components is a gather of whole components' columns with
the same shift: PyTorch Geometric's ``Batch.__inc__``, for every field at once.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import field, fields

import numpy as np

from ._segments import per_row, ranges, starts, take_shift

__all__ = [
    "ATOMS",
    "MOLECULES",
    "POSITIONS",
    "TORSIONS",
    "column",
    "concatenate",
    "decode",
    "encode",
    "joined",
    "kinds",
    "pack",
    "take",
    "taken",
    "unpack",
]

ATOMS, POSITIONS, TORSIONS, MOLECULES = "atoms", "positions", "torsions", "molecules"
#: kinds of rows counted as another (a batch table's positions are its atoms' ranges)
_SAME = {POSITIONS: ATOMS}
#: a missing index while packed: negative after any shift
NONE = -(1 << 40)


def column(
    index: str | None = None,
    width: int | tuple | None = 1,
    scale: int = 1,
    none: str = "-1",
    by_rows: bool = False,
    rows: str = ATOMS,
    dtype=np.int64,
):
    """A plan field of one value per row of kind ``rows`` (``width`` 1),
    ``(n, width)`` (an int), ``(n, *width)`` (a tuple) or ``(n, L)`` (None:
    as wide as the plan needs, padded with missing values where plans of
    different widths are joined; one such field per plan), of ``dtype``.
    ``index``: what its values index (a kind of rows, ``POSITIONS``, None);
    ``scale``: values per indexed item; ``none``: a missing index (negative)
    reads ``"-1"``, ``"n"`` (the number of indexed rows: a zero slot) or
    ``"clip"`` (0: an unused entry, in range); ``by_rows``: stored as
    ``(width, n)`` instead."""
    shape = () if width == 1 else (width,) if isinstance(width, int) or width is None else tuple(width)
    meta = {"index": index, "width": width, "shape": shape, "scale": scale, "none": none, "by_rows": by_rows}
    return field(metadata={**meta, "rows": rows, "dtype": np.dtype(dtype)})


@functools.cache
def _spec(cls) -> dict:
    """Per kind of rows (in order of first declaration): its fields as
    ``(name, values per row or None, shape, dtype, scale, indexed kind, none,
    by_rows)``, indexing fields last."""
    out = {}
    for f in fields(cls):
        m = f.metadata
        shape = m["shape"]
        size = None if m["width"] is None else int(np.prod(shape, dtype=np.int64))
        index = _SAME.get(m["index"], m["index"])
        row = (f.name, size, shape, m["dtype"], m["scale"] if index else 0, index, m["none"], m["by_rows"])
        out.setdefault(_SAME.get(m["rows"], m["rows"]), []).append(row)
    if sum(s[1] is None for rows in out.values() for s in rows) > 1:
        raise TypeError(f"{cls.__name__}: at most one field of free width")
    if len(out) > 1 and any(s[1] is None or s[7] or s[3].itemsize != 8 for r in out.values() for s in r):
        raise TypeError(f"{cls.__name__}: a plan of several kinds of rows has fixed-width 8-byte fields")
    return {kind: tuple(sorted(rows, key=lambda s: s[5] is not None)) for kind, rows in out.items()}


def kinds(cls) -> tuple[str, ...]:
    """The kinds of rows of ``cls``, in the order of :func:`pack`'s counts."""
    return tuple(_spec(cls))


def _dtype(specs) -> np.dtype:
    """A kind's matrix dtype: int64, or the one dtype of fields that index nothing (flags)."""
    dtypes = {s[3] for s in specs}
    one = dtypes.pop() if len(dtypes) == 1 else None
    return (
        one if one is not None and one.itemsize != 8 and not any(s[4] for s in specs) else np.dtype(np.int64)
    )


def _fields_of(cls, packed) -> dict:
    """A plan of several kinds: its fields' int64 ``(rows, *shape)`` views of
    the flat array ``(flat, rows of each kind)``, fields one after the other."""
    flat, counts = packed
    out, at = {}, 0
    for n, specs in zip(counts, _spec(cls).values(), strict=True):
        for s in specs:
            out[s[0]] = flat[at : at + n * s[1]].reshape(n, *s[2])
            at += n * s[1]
    return out


def pack(plan):
    """A plan of one kind: one C-ordered ``(values, rows)`` matrix, the fields
    one after the other (a matrix row per value of a row); of several:
    ``(flat, rows of each kind)``, the fields' values one after the other.
    Floats by their bits; missing indices ``NONE`` in a plan of one kind, -1
    (kept: shifted only where not missing) in a plan of several."""
    spec = _spec(type(plan))
    count = {k: _rows_of(getattr(plan, s[0][0]), s[0]) for k, s in spec.items()}
    out = []
    for specs in spec.values():
        dtype, parts = _dtype(specs), []
        for name, _, _, _, scale, index, none, by_rows in specs:
            a = np.asarray(getattr(plan, name))
            a = a[None] if a.ndim == 1 else a if by_rows else a.reshape(len(a), int(np.prod(a.shape[1:]))).T
            if a.dtype != dtype and a.dtype.itemsize == dtype.itemsize:
                a = a.view(dtype)  # floats by their bits
            if scale and len(spec) == 1:  # (several kinds: -1 kept, shifted where not missing)
                missing = (a < 0) | (a >= count[index]) if none == "n" else a < 0
                a = np.where(missing, NONE, a)
            parts.append(a)
        out.append(np.concatenate(parts).astype(dtype, order="C", copy=False))
    if len(out) == 1:
        return out[0]
    values = [
        np.ascontiguousarray(m[f:e].T).reshape(-1)
        for m, (k, specs) in zip(out, spec.items(), strict=True)
        for _, f, e, *_ in _layout(type(plan), k, m.shape[0])[0]
    ]
    return np.concatenate(values), tuple(count.values())


def _rows_of(a, spec) -> int:
    a = np.asarray(a)
    return a.shape[-1] if spec[7] and a.ndim > 1 else len(a)


def unpack(cls, packed):
    """The plan of packed (and shifted) matrices; they are modified
    (:func:`decode`) and kept (fields of one value per row are views of them)."""
    if len(_spec(cls)) > 1:  # (missing indices kept as -1: nothing to decode)
        return _plan_of(cls, _fields_of(cls, packed))
    packed = (decode(cls, packed),)
    values = {}
    for matrix, kind in zip(packed, _spec(cls), strict=True):
        for name, first, end, shape, dtype, by_rows in _layout(cls, kind, matrix.shape[0])[0]:
            a = matrix[first:end]
            if not by_rows:  # row-major: the free-width field a view (it is read per row)
                a = a.T if shape == (None,) else np.ascontiguousarray(a[0] if shape == () else a.T)
                a = a.reshape(len(a), *shape) if len(shape) > 1 else a
            values[name] = a.view(dtype) if a.dtype != dtype and a.dtype.itemsize == dtype.itemsize else a
    return cls(**values)


def _plan_of(cls, values: dict):
    """A plan of several kinds from its fields' int64 views (floats by their bits)."""
    return cls(**{s[0]: values[s[0]].view(s[3]) for specs in _spec(cls).values() for s in specs})


def encode(cls, matrix: np.ndarray) -> np.ndarray:
    """A copy of a decoded matrix of a plan of one kind (as :func:`unpack`
    leaves it) packed again: its missing indices ``NONE``."""
    out = matrix.astype(np.int64, copy=True)
    (kind,) = _spec(cls)
    n = out.shape[1]
    for first, end, none, _, _ in _layout(cls, kind, out.shape[0])[2]:
        block = out[first:end]
        if none != "clip":
            np.putmask(block, (block < 0) | (block >= n) if none == "n" else block < 0, NONE)
    return out


def decode(cls, packed: np.ndarray) -> np.ndarray:
    """The packed matrix of a plan of one kind with its missing indices
    (negative) as the fields declare, in place."""
    (kind,) = _spec(cls)
    count = {kind: packed.shape[1]}
    blocks = [
        (packed[f:e], none, scale, index) for f, e, none, scale, index in _layout(cls, kind, len(packed))[2]
    ]
    for block, none, scale, index in blocks:
        n = count[index]
        if none == "-1":
            np.maximum(block, -1, out=block)
        elif none == "clip":
            np.clip(block, 0, scale * n - 1, out=block)
        else:
            np.copyto(block, n, where=block < 0)
    return packed


@functools.lru_cache(maxsize=64)
def _layout(cls, kind: str, height: int) -> tuple:
    """Where the fields of rows ``kind`` lie in its packed matrix of ``height``
    rows: ``(name, first, end, shape, dtype, by rows)`` per field, then runs of
    indexing rows ``(first, end, scale, indexed kind)`` (one shift each), then
    runs ``(first, end, none, scale, indexed kind)`` (one decoding each)."""
    specs = _spec(cls)[kind]
    free = height - sum(s[1] or 0 for s in specs)
    slices, shift, missing, at = [], [], [], 0
    for name, size, shape, dtype, scale, index, none, by_rows in specs:
        end = at + (free if size is None else size)
        slices.append((name, at, end, (None,) if size is None else shape, dtype, by_rows))
        if scale and end > at:
            if shift and shift[-1][1] == at and shift[-1][2:] == (scale, index):
                shift[-1] = (shift[-1][0], end, scale, index)
            else:
                shift.append((at, end, scale, index))
            if missing and missing[-1][1] == at and missing[-1][2:] == (none, scale, index):
                missing[-1] = (missing[-1][0], end, none, scale, index)
            else:
                missing.append((at, end, none, scale, index))
        at = end
    return tuple(slices), tuple(shift), tuple(missing)


def concatenate(cls, packed: Sequence):
    """The plan of the plans ``packed`` (their :func:`pack`), the rows of
    each after those before (:func:`joined`)."""
    if len(_spec(cls)) > 1:
        return _plan_of(cls, _joined_kinds(cls, packed)[1])
    return unpack(cls, joined(cls, packed))


def take(cls, packed, ptr, index: np.ndarray):
    """Components ``index`` (in that order) of the plan ``packed`` whose
    component ``k`` is rows ``ptr[kind][k]:ptr[kind][k + 1]`` of every kind
    (``ptr`` an array: the atoms' and positions' bounds, for a plan of one
    kind; a plan of several kinds is taken from the plan itself: ``packed``
    is the plan, ``ptr`` a dict per kind)."""
    if len(_spec(cls)) > 1:
        return _take_kinds(packed, ptr, index)
    return unpack(cls, taken(cls, packed, ptr, index))


def joined(cls, packed: Sequence):
    """The packed plans ``packed`` side by side, kind by kind (a narrower
    free-width field padded with missing values, or zeros in a plan that
    indexes nothing), indices shifted by the rows before of the kind they index."""
    if len(_spec(cls)) > 1:
        return _joined_kinds(cls, packed)[0]
    size = np.fromiter((a.shape[1] for a in packed), np.int64, len(packed))
    height = max(a.shape[0] for a in packed)
    if all(a.shape[0] == height for a in packed):
        out = np.concatenate(packed, 1)
    else:  # the free-width field: missing values below a narrower plan's rows
        out = _padded(cls, packed, height, int(size.sum()))
    (kind,) = _spec(cls)
    _add(cls, kind, out, lambda index: per_row(starts(size), size))
    return out


def _joined_kinds(cls, packed: Sequence) -> tuple:
    """:func:`joined` of plans of several kinds: one concatenation of their
    flat arrays and one gather that puts every field's values together."""
    spec, k = _spec(cls), len(_spec(cls))
    counts = np.fromiter(itertools.chain.from_iterable(p[1] for p in packed), np.int64, k * len(packed))
    counts = counts.reshape(-1, k)  # (plans, kinds): rows of each kind of each plan
    kind_of, width = zip(*((j, s[1]) for j, specs in enumerate(spec.values()) for s in specs), strict=True)
    size = counts[:, list(kind_of)] * np.array(width)  # (plans, fields): values of each field
    first = starts(size.reshape(-1)).reshape(size.shape)
    flat = np.concatenate([p[0] for p in packed]).take(ranges(first.T.reshape(-1), size.T.reshape(-1)))
    out = (flat, tuple(int(c) for c in counts.sum(0)))
    before = {kind: starts(counts[:, j]) for j, kind in enumerate(spec)}
    values = _shift_fields(
        cls,
        _fields_of(cls, out),
        lambda index, rows: per_row(before[index], counts[:, list(spec).index(rows)]),
    )
    return out, values


def _shift_fields(cls, values: dict, shift_of) -> dict:
    """``values`` (a plan of several kinds) with every indexing field increased
    by ``scale * shift_of(indexed kind, kind of rows)`` where not missing (-1),
    in place; each shift made once."""
    shifts = {}
    for rows, specs in _spec(cls).items():
        for name, _, shape, _, scale, index, *_ in specs:
            if scale:
                if (index, rows) not in shifts:
                    shifts[index, rows] = shift_of(index, rows)
                by = shifts[index, rows].reshape(-1, *(1,) * len(shape))
                a = values[name]
                a += (by if scale == 1 else scale * by) * (a >= 0)
    return values


def _padded(cls, mats, height: int, width: int) -> np.ndarray:
    bottom = _around_free(cls, ATOMS)[1]
    dtype = mats[0].dtype
    out = np.full((height, width), NONE if dtype == np.int64 else 0, dtype)
    at = 0
    for a in mats:
        cols, free = slice(at, at + a.shape[1]), a.shape[0] - bottom
        out[:free, cols] = a[:free]
        if bottom:
            out[-bottom:, cols] = a[free:]
        at += a.shape[1]
    return out


def taken(cls, packed, ptr, index: np.ndarray, shift: np.ndarray | None = None):
    """Components ``index`` of the packed plan ``packed``: their columns of
    every kind, indices shifted, the free-width field as wide as they need
    (``shift``: ``take_shift(ptr, index)[1]`` if known)."""
    if len(_spec(cls)) > 1:
        raise TypeError(f"{cls.__name__}: a plan of several kinds is taken whole (take)")
    if shift is None:
        _, shift = take_shift(ptr, index)  # new - old index of every atom and position
    out = np.take(packed, np.arange(len(shift)) - shift, axis=1)
    (kind,) = _spec(cls)
    _add(cls, kind, out, lambda index: shift)
    return _trimmed(cls, kind, out)


def _take_kinds(plan, ptr: dict, index: np.ndarray):
    """:func:`take` of a plan of several kinds: a gather of whole rows per
    field of the plan itself, indexing fields shifted where not missing (-1)."""
    cls, sizes, moved, rows_of = type(plan), {}, {}, {}
    for kind in _spec(cls):
        b = ptr[kind]
        sizes[kind] = (b[1:] - b[:-1])[index]
        moved[kind] = starts(sizes[kind]) - b[index]  # new - old first row of each component
        rows_of[kind] = ranges(b[index], sizes[kind])
    values = {
        s[0]: np.asarray(getattr(plan, s[0])).take(rows_of[k], axis=0)
        for k, sp in _spec(cls).items()
        for s in sp
    }
    return cls(**_shift_fields(cls, values, lambda index, rows: per_row(moved[index], sizes[rows])))


def _trimmed(cls, kind: str, out: np.ndarray) -> np.ndarray:
    """``out`` with its free-width field as wide as its columns need."""
    top, bottom = _around_free(cls, kind)
    free = out.shape[0] - top - bottom
    if free > 1 and _free_none(cls, kind) not in (None, "clip"):  # (unused entries are never missing)
        used = 1 + int(np.flatnonzero((out[top + 1 : top + free] >= 0).any(1)).max(initial=-1)) + 1
        out = np.concatenate([out[: top + used], out[top + free :]]) if used < free else out
    return out


def _free_none(cls, kind: str) -> str | None:
    """What a missing index of the free-width field of rows ``kind`` reads
    (None: no such field, or one that indexes nothing)."""
    return next((sp[6] for sp in _spec(cls)[kind] if sp[1] is None and sp[4]), None)


def _add(cls, kind: str, out: np.ndarray, shift_of) -> None:
    """Indexing rows of ``out`` (rows ``kind``) increased by ``scale *
    shift_of(indexed kind)`` (missing ones stay negative)."""
    cache = {}
    for first, end, scale, index in _layout(cls, kind, out.shape[0])[1]:
        if index not in cache:
            cache[index] = shift_of(index)
        out[first:end] += cache[index] if scale == 1 else scale * cache[index]


def _around_free(cls, kind: str) -> tuple[int, int]:
    """Packed rows of ``kind`` before and after the free-width field (all, 0: none)."""
    widths = [s[1] for s in _spec(cls)[kind]]
    if None not in widths:
        return sum(widths), 0
    k = widths.index(None)
    return sum(widths[:k]), sum(widths[k + 1 :])
