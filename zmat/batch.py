"""Ragged batches: structures of different sizes in one flat tensor, one call.

The layout is the one PyTorch Geometric users know. ``B`` structures with
``n_0, ..., n_{B-1}`` atoms are stored back to back (``N = sum n_b`` flat
rows); ``ptr`` (``(B + 1,)``) holds the offsets, structure ``b`` is rows
``ptr[b]:ptr[b + 1]``, and ``batch`` (``(N,)``) says which structure each row
belongs to. :class:`Ragged` converts between that flat layout and a padded
``(B, n_max)`` layout with a mask, and splits it back (:meth:`Ragged.unbatch`).

Construction tables batch as a *forest*: the references of structure ``b``
are offset by ``ptr[b]`` (:func:`concatenate_tables`), so one ``zmat.to_xyz``
call places every structure, each in its own canonical frame. The same
mechanism serves :class:`ZMatrixBatch` (tables plus internal coordinates) and
``zmat.rdkit.TorsionSpace.batch`` (torsion spaces of different molecules).

Building a batch is vectorised numpy (no Python loop over atoms), so it can
be done afresh at every training step; ``benchmarks/torsions.py`` measures it
against the transform it serves.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ._segments import ptr, segment_ids, take_shift
from .table import ConstructionTable, as_table, index_tensor
from .transform import to_xyz

__all__ = ["Batchable", "Ragged", "ZMatrixBatch", "collate", "concatenate_tables"]


class Ragged:
    """Offsets of a ragged dimension: ``B`` segments of sizes ``sizes``, stored flat.

    Args:
        sizes: ``(B,)`` non-negative segment sizes.

    Attributes:
        ptr: ``(B + 1,)`` int64 numpy offsets; segment ``b`` is ``ptr[b]:ptr[b + 1]``.
        sizes: ``(B,)`` int64 numpy sizes.
        index: ``(N,)`` int64 numpy segment of each flat row (PyG's ``batch``).

    Example:
        >>> r = Ragged([2, 3])
        >>> r.ptr.tolist(), r.index.tolist()
        ([0, 2, 5], [0, 0, 1, 1, 1])
        >>> padded, mask = r.pad(torch.arange(5.0))
        >>> padded.tolist(), mask.tolist()
        ([[0.0, 1.0, 0.0], [2.0, 3.0, 4.0]], [[True, True, False], [True, True, True]])
    """

    def __init__(self, sizes) -> None:
        sizes = np.asarray(sizes, np.int64).reshape(-1)
        if (sizes < 0).any():
            raise ValueError(f"segment sizes must be non-negative, got {sizes.tolist()}")
        self.sizes = sizes
        self.ptr = ptr(sizes)
        self.index = segment_ids(sizes)
        self.n_max = int(sizes.max()) if len(sizes) else 0
        self._tensors: dict = {}

    @functools.cached_property
    def _slot(self) -> np.ndarray:
        """Flat row -> position in the padded ``(B * n_max)`` layout (made on first use)."""
        return self.index * self.n_max + (np.arange(self.total) - self.ptr[self.index])

    def __len__(self) -> int:
        return len(self.sizes)

    def __repr__(self) -> str:
        return f"Ragged(B={len(self)}, total={self.total}, n_max={self.n_max})"

    @property
    def total(self) -> int:
        return int(self.ptr[-1])

    def _tensor(self, name: str, device) -> torch.Tensor:
        key = (name, torch.device(device))
        if key not in self._tensors:
            self._tensors[key] = index_tensor(getattr(self, name), device)
        return self._tensors[key]

    def batch(self, device="cpu") -> torch.Tensor:
        """``(N,)`` int64 tensor: the segment of each flat row (PyG's ``batch``)."""
        return self._tensor("index", device)

    def mask(self, device="cpu") -> torch.Tensor:
        """``(B, n_max)`` bool tensor, True where the padded layout holds a row."""
        mask = torch.zeros(len(self) * self.n_max, dtype=torch.bool, device=device)
        mask[self._tensor("_slot", device)] = True
        return mask.view(len(self), self.n_max)

    def pad(self, x: torch.Tensor, dim: int = 0, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat ``x`` (size ``N`` along ``dim``) -> padded (``B, n_max`` there) and mask.

        Differentiable in ``x``; padding holds ``fill``.
        """
        dim = dim % x.ndim
        self._check(x, dim)
        shape = (*x.shape[:dim], len(self) * self.n_max, *x.shape[dim + 1 :])
        out = torch.full(shape, fill, dtype=x.dtype, device=x.device)
        out = out.index_copy(dim, self._tensor("_slot", x.device), x)
        return out.unflatten(dim, (len(self), self.n_max)), self.mask(x.device)

    def unpad(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Padded ``x`` (``B, n_max`` at ``dim, dim + 1``) -> flat (``N`` at ``dim``)."""
        dim = dim % x.ndim
        if x.shape[dim : dim + 2] != (len(self), self.n_max):
            raise ValueError(
                f"padded tensor must have ({len(self)}, {self.n_max}) at dims {dim}, {dim + 1}, "
                f"got shape {tuple(x.shape)}"
            )
        return x.flatten(dim, dim + 1).index_select(dim, self._tensor("_slot", x.device))

    def unbatch(self, x: torch.Tensor, dim: int = 0) -> list[torch.Tensor]:
        """Flat ``x`` split into its ``B`` segments along ``dim`` (views)."""
        dim = dim % x.ndim
        self._check(x, dim)
        return list(torch.split(x, self.sizes.tolist(), dim))

    def take(self, index: np.ndarray) -> tuple[Ragged, np.ndarray]:
        """Segments ``index`` (``(B',)`` int64, in that order) as a new
        :class:`Ragged`, and the ``(N',)`` flat rows they hold here (a gather,
        no loop over segments)."""
        out = Ragged(self.sizes[index])
        return out, np.arange(out.total) - take_shift(self.ptr, index)[1]

    def _check(self, x: torch.Tensor, dim: int) -> None:
        if x.shape[dim] != self.total:
            raise ValueError(
                f"flat tensor must have {self.total} rows along dim {dim}, got shape {tuple(x.shape)}"
            )


def concatenate_tables(tables: Sequence) -> tuple[ConstructionTable, Ragged]:
    """One forest table from several tables, references offset: ``(table, atoms)``.

    Args:
        tables: construction tables (or ``(n_b, 3)`` integer arrays).

    Returns:
        the concatenated :class:`~zmat.ConstructionTable` (``(N, 3)``, ``N = sum
        n_b``) and the :class:`Ragged` offsets of its atoms.

    The assembly is :meth:`ConstructionTable.concatenate`: each piece is
    validated and classified once (pass the same ``ConstructionTable`` objects
    on every step; raw arrays are validated first) and the batch's arrays are
    its pieces' offset, with no validation of their disjoint union.

    Example:
        >>> t, atoms = concatenate_tables([[[-1, -1, -1], [0, -1, -1]], [[-1, -1, -1]]])
        >>> t.refs.tolist(), atoms.ptr.tolist()
        ([[-1, -1, -1], [0, -1, -1], [-1, -1, -1]], [0, 2, 3])
    """
    if len(tables) == 0:
        raise ValueError("cannot batch an empty list of tables")
    pieces = [as_table(t) for t in tables]
    sizes = np.fromiter((t.n_atoms for t in pieces), np.int64, len(pieces))
    return ConstructionTable.concatenate(pieces), Ragged(sizes)


class ZMatrixBatch:
    """Z-matrices of different sizes in one forest: one ``to_xyz`` for all.

    Attributes:
        table: the forest :class:`~zmat.ConstructionTable` (``(N, 3)``).
        internal: ``(N, 3)`` float tensor, the z-matrices' rows back to back.
        atoms: :class:`Ragged` offsets of the atoms (``ptr``, ``batch``, padding).
        symbols: the ``N`` element symbols.
    """

    def __init__(self, zmatrices: Sequence) -> None:
        self.table, self.atoms = concatenate_tables([z.table for z in zmatrices])
        self.internal = torch.cat([torch.as_tensor(z.internal) for z in zmatrices], 0)
        self.symbols = [s for z in zmatrices for s in z.symbols]

    def __len__(self) -> int:
        return len(self.atoms)

    def to_xyz(self, internal: torch.Tensor | None = None, method: str = "auto") -> torch.Tensor:
        """``(..., N, 3)`` flat positions (each structure in its canonical frame)."""
        return to_xyz(self.internal if internal is None else internal, self.table, method=method)

    def unbatch(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Flat ``(..., N, 3)`` -> list of ``(..., n_b, 3)``."""
        return self.atoms.unbatch(x, dim=-2)


@runtime_checkable
class Batchable(Protocol):
    """What :func:`collate` dispatches on: a type whose instances batch themselves.

    ``type(items[0]).batch(items)`` returns the batch (:class:`~zmat.ZMatrix`
    gives a :class:`ZMatrixBatch`, ``zmat.rdkit.TorsionSpace`` a flat
    ``TorsionSpace``). A class joins by defining that classmethod.
    """

    @classmethod
    def batch(cls, items: Sequence) -> Any: ...


def collate(items: Sequence):
    """Batch construction tables, z-matrices or torsion spaces of different sizes.

    Items of a :class:`Batchable` type (all of the same type) give
    ``type(items[0]).batch(items)``: a :class:`ZMatrixBatch` for
    :class:`~zmat.ZMatrix` objects, ``TorsionSpace.batch(items)`` for
    ``zmat.rdkit.TorsionSpace`` objects. Anything else is a construction table
    (or ``(n, 3)`` array): ``(table, atoms)``, see :func:`concatenate_tables`.

    Raises:
        ValueError: ``items`` is empty.
        TypeError: ``items`` mixes a :class:`Batchable` type with others.
    """
    if len(items) == 0:
        raise ValueError("cannot batch an empty list")
    kind = type(items[0])
    if isinstance(items[0], Batchable):
        others = {type(x).__name__ for x in items if type(x) is not kind}
        if others:
            raise TypeError(f"cannot batch {kind.__name__} objects with {sorted(others)}")
        return kind.batch(items)
    return concatenate_tables(items)
