"""The arrays of a torsion space, and batching them: one generic concatenate and take.

A torsion space (:class:`zmat.rdkit.TorsionSpace`) of ``M`` molecules with
``N`` atoms and ``K`` rotatable bonds in all holds arrays of three kinds of
rows: one row per atom, per torsion or per molecule, the molecules back to
back. Every field of :class:`TorsionArrays` declares its rows and what its
values index (atoms, torsions, nothing), so that batching is one operation
for every field (PyTorch Geometric's ``Batch`` with ``__inc__``, declared):

* :meth:`TorsionArrays.concatenate` puts the rows of several spaces one after
  the other, and a value that indexes atoms (torsions) of space ``s`` is
  increased by the number of atoms (torsions) of the spaces before ``s``;
* :meth:`TorsionArrays.take` gathers the rows of molecules ``index`` of a
  batch, and shifts every indexing value by its molecule's new minus old
  first row of the indexed kind.

``-1`` ("none") stays ``-1``. Concatenating works on each space's fields
packed once into one flat array (:attr:`TorsionArrays.packed`), so a batch of
many spaces is one concatenation and one gather whatever their number.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from ._segments import per_row, ptr, ranges, starts

__all__ = ["ATOMS", "KINDS", "MOLECULES", "TORSIONS", "TorsionArrays"]

ATOMS, TORSIONS, MOLECULES = "atoms", "torsions", "molecules"
KINDS = (ATOMS, TORSIONS, MOLECULES)
_F, _I = np.dtype(np.float64), np.dtype(np.int64)


def _field(rows: str, dtype: np.dtype, shape: tuple = (), index: str | None = None):
    """A field with one ``shape`` value of ``dtype`` per row of ``rows``,
    whose values index ``index`` (atoms, torsions; None: nothing)."""
    return field(metadata={"rows": rows, "dtype": dtype, "shape": shape, "index": index})


@dataclass(frozen=True, eq=False)
class TorsionArrays:
    """A torsion space's plain arrays (numpy, host), rows of molecules back to back.

    Indices are flat over the space (atom ``i`` of the second molecule is
    ``n_atoms[0] + i``); ``-1`` means none.
    """

    # per atom
    positions: np.ndarray = _field(ATOMS, _F, (3,))  # the conformers
    internal: np.ndarray = _field(ATOMS, _F, (3,))  # frozen internal coordinates on the table
    owner: np.ndarray = _field(ATOMS, _I, index=TORSIONS)  # innermost torsion moving the atom
    # per torsion
    quads: np.ndarray = _field(TORSIONS, _I, (4,), ATOMS)  # (a, b, c, d); c's side moves
    dof: np.ndarray = _field(TORSIONS, _I, index=ATOMS)  # the table row whose dihedral it is
    torsions: np.ndarray = _field(TORSIONS, _F)  # the conformer's dihedral of the quad
    delta: np.ndarray = _field(TORSIONS, _F)  # torsion minus the phi of its row (constant)
    bond_parent: np.ndarray = _field(TORSIONS, _I, index=TORSIONS)  # innermost torsion moving its bond
    level: np.ndarray = _field(TORSIONS, _I)  # nesting depth (bond_parent ancestors)
    # per molecule
    rotation: np.ndarray = _field(MOLECULES, _F, (3, 3))  # canonical frame -> Mol frame: x R^T + shift
    shift: np.ndarray = _field(MOLECULES, _F, (3,))
    n_atoms: np.ndarray = _field(MOLECULES, _I)
    n_torsions: np.ndarray = _field(MOLECULES, _I)

    def check(self) -> TorsionArrays:
        """This, after checking every field's dtype and shape (rows as ``n_atoms``
        and ``n_torsions`` say); batches of checked arrays need no check."""
        count = {ATOMS: int(self.n_atoms.sum()), TORSIONS: int(self.n_torsions.sum())}
        count[MOLECULES] = len(self.n_atoms)
        for f in _FIELDS:
            a, m = getattr(self, f.name), f.metadata
            if a.dtype != m["dtype"] or a.shape != (count[m["rows"]], *m["shape"]):
                raise ValueError(
                    f"TorsionArrays.{f.name}: expected {m['dtype']} of shape "
                    f"{(count[m['rows']], *m['shape'])}, got {a.dtype} {a.shape}"
                )
        return self

    def __getstate__(self) -> dict:
        return {f.name: getattr(self, f.name) for f in _FIELDS}  # not the packed copy

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def sizes(self, rows: str) -> np.ndarray:
        """``(M,)`` rows of kind ``rows`` of every molecule."""
        if rows == MOLECULES:
            return np.ones(len(self.n_atoms), np.int64)
        return self.n_atoms if rows == ATOMS else self.n_torsions

    @functools.cached_property
    def packed(self) -> tuple[np.ndarray, tuple[int, int, int]]:
        """This space's values, made once and kept: one flat int64 array of the
        fields one after the other (float64 values by their bits), and its
        rows of each kind (:data:`KINDS`). One array per space: a batch of many
        spaces reads few objects (their headers cost most when the caches are
        cold)."""
        flat = np.concatenate([getattr(self, f.name).reshape(-1).view(np.int64) for f in _FIELDS])
        return flat, tuple(int(self.sizes(kind).sum()) for kind in KINDS)

    @classmethod
    def concatenate(cls, items: Sequence[TorsionArrays]) -> TorsionArrays:
        """The spaces ``items`` as one: rows one after the other, indices offset.

        One concatenation of their :attr:`packed` arrays and one gather that
        puts every field's values of all spaces together, so each field is a
        contiguous slice of it."""
        packs = [a.packed for a in items]
        counts = np.fromiter(
            itertools.chain.from_iterable(p[1] for p in packs), np.int64, len(KINDS) * len(packs)
        )
        counts = counts.reshape(-1, len(KINDS))  # (S, kinds): rows of each kind in each space
        size = counts[:, _ROWS] * _WIDTHS  # (S, fields): values of each field of each space
        first = starts(size.reshape(-1)).reshape(size.shape)
        flat = np.concatenate([p[0] for p in packs])
        by_field = flat.take(ranges(first.T.reshape(-1), size.T.reshape(-1)))
        bounds = ptr(size.sum(0))
        values = {}
        for j, f in enumerate(_FIELDS):
            part = by_field[bounds[j] : bounds[j + 1]].view(f.metadata["dtype"])
            values[f.name] = part.reshape(-1, *f.metadata["shape"])
        sizes = {kind: counts[:, i] for i, kind in enumerate(KINDS)}
        return _shifted(values, sizes, {kind: starts(s) for kind, s in sizes.items()})

    def take(self, index: np.ndarray) -> TorsionArrays:
        """Molecules ``index`` (``(B,)`` int64 in ``[0, M)``, in that order,
        repeats allowed) as a new batch: gathers of whole molecules' rows."""
        sizes, shift, rows_of = {}, {}, {}
        for rows in KINDS:
            first = ptr(self.sizes(rows))[index]
            sizes[rows] = self.sizes(rows)[index]
            shift[rows] = starts(sizes[rows]) - first  # new - old first row of each molecule
            rows_of[rows] = ranges(first, sizes[rows])
        values = {f.name: getattr(self, f.name).take(rows_of[f.metadata["rows"]], axis=0) for f in _FIELDS}
        return _shifted(values, sizes, shift)


def _shifted(values: dict, sizes: dict, shift: dict) -> TorsionArrays:
    """The arrays ``values`` (components' rows one after the other) with every
    value that indexes a kind of rows increased by ``shift[kind]`` of its
    component (``sizes[rows]`` rows of each); -1 stays -1."""
    moved = {}
    for f in _INDEXING:
        m, a = f.metadata, values[f.name]
        key = (m["index"], m["rows"])
        if key not in moved:
            moved[key] = per_row(shift[m["index"]], sizes[m["rows"]])
        by = moved[key].reshape(-1, *(1,) * len(m["shape"]))
        a = np.ascontiguousarray(a)  # (fresh gathers: shifted in place)
        a += by * (a >= 0)
        values[f.name] = a
    return TorsionArrays(**values)


_FIELDS = fields(TorsionArrays)
_INDEXING = [f for f in _FIELDS if f.metadata["index"] is not None]
#: per field: the kind of its rows (an index into KINDS) and its values per row
_ROWS = np.array([KINDS.index(f.metadata["rows"]) for f in _FIELDS])
_WIDTHS = np.array([int(np.prod(f.metadata["shape"], dtype=np.int64)) for f in _FIELDS])
