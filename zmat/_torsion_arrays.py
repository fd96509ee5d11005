"""The arrays of a torsion space: a plan of three kinds of rows.

A torsion space (:class:`zmat.rdkit.TorsionSpace`) of ``M`` molecules with
``N`` atoms and ``K`` rotatable bonds in all holds arrays of three kinds of
rows: one row per atom, per torsion or per molecule, the molecules back to
back. Every field of :class:`TorsionArrays` declares its rows and what its
values index (atoms, torsions, nothing) with :func:`zmat._columns.column`, so
that batching is :mod:`zmat._columns`' one generic concatenate and take for
every field (PyTorch Geometric's ``Batch`` with ``__inc__``, declared):

* :meth:`TorsionArrays.concatenate` puts the rows of several spaces one after
  the other, and a value that indexes atoms (torsions) of space ``s`` is
  increased by the number of atoms (torsions) of the spaces before ``s``;
* :meth:`TorsionArrays.take` gathers the rows of molecules ``index`` of a
  batch, and shifts every indexing value by its molecule's new minus old
  first row of the indexed kind.

``-1`` ("none") stays ``-1``. Each space packs its fields once
(:attr:`TorsionArrays.packed`: one flat array), so a batch of many spaces is
one concatenation and one gather whatever their number.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from . import _columns
from ._columns import ATOMS, MOLECULES, TORSIONS
from ._segments import ptr

__all__ = ["ATOMS", "KINDS", "MOLECULES", "TORSIONS", "TorsionArrays"]

KINDS = (ATOMS, TORSIONS, MOLECULES)
_F, _I = np.dtype(np.float64), np.dtype(np.int64)


def _field(rows: str, dtype: np.dtype, shape: tuple = (), index: str | None = None):
    """A field with one ``shape`` value of ``dtype`` per row of ``rows``,
    whose values index ``index`` (atoms, torsions; None: nothing)."""
    return _columns.column(index, shape or 1, rows=rows, dtype=dtype)


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
    def packed(self) -> tuple[np.ndarray, tuple[int, ...]]:
        """This space's values packed once and kept (:func:`zmat._columns.pack`:
        one flat int64 array of the fields, and the rows of each of :data:`KINDS`)."""
        return _columns.pack(self)

    @classmethod
    def concatenate(cls, items: Sequence[TorsionArrays]) -> TorsionArrays:
        """The spaces ``items`` as one: rows one after the other, indices offset
        (:func:`zmat._columns.concatenate` of their :attr:`packed`)."""
        return _columns.concatenate(cls, [a.packed for a in items])

    def take(self, index: np.ndarray) -> TorsionArrays:
        """Molecules ``index`` (``(B,)`` int64 in ``[0, M)``, in that order,
        repeats allowed) as a new batch: gathers of whole molecules' rows
        (:func:`zmat._columns.take`)."""
        bounds = {kind: ptr(self.sizes(kind)) for kind in KINDS}
        return _columns.take(type(self), self, bounds, index)


_FIELDS = fields(TorsionArrays)
assert _columns.kinds(TorsionArrays) == KINDS
