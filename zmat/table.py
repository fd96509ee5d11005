"""Construction tables: validation, and the plan every method executes.

A construction table has one row ``(b, a, d)`` per atom: its bond, angle and
dihedral reference atoms, ``-1`` where a reference is missing (only trailing
entries may be missing). Rows are in output order; references may point to
later rows as long as the dependencies are acyclic, and several roots (a
forest) are allowed.

Placement rule (shared by every method, see ``zmat/_geometry.py``): every atom
``i`` carries a frame ``F_i = (R_i, x_i)`` whose first axis is the bond
direction ``x_b -> x_i`` and whose third axis is the normal of the plane
``(x_a, x_b, x_i)``. An atom is placed from an *anchor* frame ``A_i`` by the
fixed-form local transform ``L(r, theta, phi)``: ``F_i = A_i . L``.

Rows are classified once, here, into

* ``ROOT``     ``(-1, -1, -1)``: at the origin, identity frame.
* ``BOND``     ``(b, -1, -1)``: at ``x_b + r * (+x)``.
* ``PLANAR``   ``(b, a, -1)``: in the plane through ``x_b`` and ``x_a`` that
  contains the direction ``+y``, on the ``+y`` side (the dihedral is taken as
  0 against the virtual reference point ``x_a + y``). For the usual start
  (atom 0 at the origin, atom 1 on ``+x``) that is the ``xy``-plane, ``y > 0``,
  exactly as ``ase.io.zmatrix`` places it. If ``x_b - x_a`` is parallel to
  ``y`` the plane normal falls back to ``+z``.
* ``PROPER``   ``(b, a, d)`` with ``a`` = bond reference of ``b`` and ``d`` =
  angle reference of ``b``: anchored on ``b``'s propagated frame. This is what
  makes chains robust at linear angles: no cross product of positions.
* ``OFFSET``   ``(b, a, d)`` with ``a`` = bond reference of ``b`` and ``d`` a
  sibling (``d`` is itself anchored on ``b`` with angle reference ``a``):
  anchored on ``b``'s frame with ``phi_eff = phi + phi_eff(d)``, since
  dihedrals about the same axis add.
* ``POSITIONAL`` any other full row: anchored on the textbook NeRF frame built
  from the positions ``x_d, x_a, x_b`` (safe-normalised, so collinear
  references give a finite, documented fallback instead of NaN).

``PROPER``/``OFFSET`` rows (and ``BOND`` rows on a root, ``PLANAR`` rows on such
a ``BOND`` atom) are *rigid children* of ``b``; the others start a *segment*
whose anchor is computed from positions. Within a segment every frame is a
product of local transforms along the tree of rigid parents.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

import numpy as np
import torch

from zmat import _columns
from zmat._columns import ATOMS, POSITIONS, column
from zmat._segments import ptr as segment_ptr
from zmat._segments import ranges, take_shift

__all__ = ["ConstructionTable", "as_table"]

ROOT, BOND, PLANAR, PROPER, OFFSET, POSITIONAL = range(6)
KIND_NAMES = ("root", "bond", "planar", "proper", "offset", "positional")
T = TypeVar("T")


@dataclass(frozen=True)
class TablePlan:
    """The plan arrays of a table (``ConstructionTable._classify``), ``(N,)``
    int64 each unless said, every field declaring what its values index
    (:func:`zmat._columns.column`), so that concatenating tables and taking
    components of a batch table are :mod:`zmat._columns`' generic operations
    on :meth:`pack`'s matrix. A missing index is ``-1``; in the offset chain,
    ``N`` (the zero slot).
    """

    kind: np.ndarray = column()
    dfs_depth: np.ndarray = column()  # per dfs position
    stage: np.ndarray = column()  # segment level of every atom
    refs: np.ndarray = column(ATOMS, 3)  # (N, 3)
    parent: np.ndarray = column(ATOMS)
    offset_of: np.ndarray = column(ATOMS)
    dfs_order: np.ndarray = column(ATOMS)  # per dfs position
    dfs_pos: np.ndarray = column(POSITIONS)
    subtree_end: np.ndarray = column(POSITIONS)  # per dfs position
    dfs_parent: np.ndarray = column(POSITIONS)  # per dfs position
    dfs_segment: np.ndarray = column(POSITIONS)  # per dfs position
    offset_chain: np.ndarray = column(ATOMS, None, none="n")  # (N, L)

    @classmethod
    def of(cls, table: ConstructionTable) -> TablePlan:
        """The plan of ``table``."""
        stage = np.empty(table.n_atoms, np.int64)
        for s, atoms in enumerate(table.stage_atoms):
            stage[atoms] = s
        return cls(**{f.name: getattr(table, f.name) for f in _FIELDS if f.name != "stage"}, stage=stage)

    def pack(self) -> np.ndarray:
        """``(rows, N)`` int64 (:func:`zmat._columns.pack`)."""
        return _columns.pack(self)

    @classmethod
    def unpack(cls, packed: np.ndarray) -> TablePlan:
        """The plan of a :meth:`pack`'d matrix (``packed`` is modified and kept)."""
        return _columns.unpack(cls, packed)

    @classmethod
    def concatenate(cls, packed: Sequence[np.ndarray]) -> TablePlan:
        """The plan of the tables of ``packed`` (their :meth:`pack`), the atoms
        of each after those before."""
        return _columns.concatenate(cls, packed)

    @classmethod
    def take(cls, packed: np.ndarray, ptr: np.ndarray, index: np.ndarray) -> TablePlan:
        """Components ``index`` (in that order) of the plan ``packed`` whose
        component ``k`` is atoms and dfs positions ``ptr[k]:ptr[k + 1]``."""
        return _columns.take(cls, packed, ptr, index)

    def arrays(self) -> dict:
        """The arrays of the table (``ConstructionTable._ARRAYS``)."""
        values = {f.name: getattr(self, f.name) for f in _FIELDS if f.name != "stage"}
        n = len(self.kind)
        values.update(
            max_depth=int(self.dfs_depth.max()),
            stage_atoms=_group(self.stage) if self.stage.any() else [np.arange(n)],
            constant_anchors=bool((self.kind[self.parent < 0] == ROOT).all()),
        )
        return values


_FIELDS = fields(TablePlan)  # once: ``fields`` costs a microsecond or two a call


class ConstructionTable:
    """A validated construction table and its execution plan.

    Args:
        refs: integer array-like of shape ``(N, 3)`` (list, numpy array or
            tensor); row ``i`` is ``(b_i, a_i, d_i)``, ``-1`` for "no
            reference".

    Attributes:
        refs: ``(N, 3)`` int64 numpy array, the validated rows. A table's structure (``refs``,
            ``bonds``, ``construction_order``, ``topo_order``, ``dihedral_plane``) is numpy,
            on the host: it is planned once there; values on atoms (coordinates, masks,
            radii, a flow's ``circular``) are torch tensors. ``torch.as_tensor(table.refs)``
            gives a tensor (``docs/conventions.md``, "Types of attributes").
        n_atoms: ``N``.

    Raises:
        TypeError: ``refs`` is not an integer array.
        ValueError: wrong shape; a reference out of range; an atom referring
            to itself; a repeated reference in a row; a missing reference
            before a present one; a dependency cycle. The message names the row.

    Example:
        >>> t = ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]])
        >>> t.n_atoms, t.n_levels
        (4, 4)
    """

    def __init__(self, refs) -> None:
        if isinstance(refs, ConstructionTable):
            refs = refs.refs
        self.refs = _validate(refs)
        self.n_atoms = int(self.refs.shape[0])
        self._classify()

    @classmethod
    def concatenate(cls, tables: Sequence, index=None) -> ConstructionTable:
        """One forest table of several tables, the atoms of ``tables[k]`` after
        those of ``tables[:k]`` (a batch of different molecules or fragments);
        with ``index`` (1-D integers), of ``tables[index[0]], tables[index[1]],
        ...`` (a sequence of residues from one table per residue type, say)
        without a Python list as long as the batch.

        The fast path for batch builders: each piece is validated and planned
        once (pass the same :class:`ConstructionTable` objects again and again,
        e.g. one per molecule of a data set) and the batch's table is assembled
        by offsetting the pieces' arrays, with no validation or planning of its
        own: a disjoint union of valid, acyclic tables is valid and acyclic, and
        every row keeps its classification. The arrays are made on first use;
        the compiled kernel's plan is the pieces' plans offset. Raw arrays
        among ``tables`` are validated first, as by ``ConstructionTable(refs)``.

        Example:
            >>> water = ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
            >>> ConstructionTable.concatenate([water, water]).refs[3:].tolist()
            [[-1, -1, -1], [3, -1, -1], [3, 4, -1]]
            >>> ConstructionTable.concatenate([water], index=[0, 0]).n_atoms
            6
        """
        if isinstance(tables, (ConstructionTable, np.ndarray, torch.Tensor)) or len(tables) == 0:
            raise ValueError("concatenate needs a non-empty sequence of tables")
        pieces = [as_table(t) for t in tables]
        if index is not None:
            index = np.asarray(index)
            if index.ndim != 1 or index.dtype.kind not in "iu" or not len(index):
                raise ValueError(
                    f"concatenate: index must be a non-empty 1-D integer array, got {index!r:.60}"
                )
            if index.min() < 0 or index.max() >= len(pieces):
                raise ValueError(f"concatenate: index out of range for {len(pieces)} tables")
            # a gather of the pieces' table (planned once); its arrays made when read
            pool, ptr = _pool(tuple(pieces))
            return pool.take(ptr, index)
        # arrays made on first use: a fresh batch's kernel call reads none of
        # them (its plan is its pieces', ``_kernel_plan``)
        pieces = tuple(pieces)
        table = cls.from_plan(
            lambda: TablePlan.concatenate([t._packed for t in pieces]),
            sum(t.n_atoms for t in pieces),
            constant_anchors=all(t.constant_anchors for t in pieces),  # segment roots: the pieces'
        )
        table.pieces = pieces  # whose per-device plans make the batch's
        return table

    def take(self, ptr: np.ndarray, index: np.ndarray) -> ConstructionTable:
        """The components ``index`` (in that order) of a table whose component
        ``k`` is rows ``ptr[k]:ptr[k + 1]`` and dfs positions the same range (a
        table made by :meth:`concatenate`): gathers of the plan's arrays
        (:meth:`TablePlan.take`), trusted like :meth:`concatenate`
        (``zmat.rdkit.TorsionSpace.take``). The arrays are made on first use; a
        method's plan may be taken from this table's plan instead (``origin``)."""
        out = type(self).from_plan(
            lambda: TablePlan.take(self._packed, ptr, index),
            int(take_shift(ptr, index)[0].sum()),
            constant_anchors=True if self.constant_anchors else None,  # so are its components'
        )
        out.origin = (self, ptr, index)
        return out

    #: how a batch table was assembled, for plans made from its parts' plans:
    #: ``(source, ptr, index)`` of :meth:`take`, the tables of :meth:`concatenate`
    origin: tuple | None = None
    pieces: tuple | None = None
    #: a builder that stamps the compiled kernel's plan arrays itself
    #: (``zmat.protein.pieces.kernel_arrays``): a function of no arguments
    #: returning ``zmat._kernel.KernelPlan``'s ``(ints, flags)``
    kernel_arrays: Callable | None = None

    @functools.cached_property
    def _packed(self) -> np.ndarray:
        """This table's :meth:`TablePlan.pack` (cached: ``concatenate`` reads it on every batch)."""
        return TablePlan.of(self).pack()

    #: the arrays a table holds besides its cached properties (see ``_classify``):
    #: :class:`TablePlan`'s fields (the stage of every atom as ``stage_atoms``) and
    #: what follows from them
    _ARRAYS = (
        *(f.name for f in _FIELDS if f.name != "stage"),
        *("max_depth", "stage_atoms", "constant_anchors"),
    )

    @classmethod
    def from_plan(cls, plan, n_atoms: int, constant_anchors: bool | None = None) -> ConstructionTable:
        """A table from its :class:`TablePlan`, with no validation or planning:
        for builders that assemble tables from pieces already validated and
        classified (:meth:`concatenate`, :meth:`take`, ``zmat.protein.pieces``),
        whose tests compare every array with the general path's. ``plan`` may
        be a function of no arguments making it: then the arrays are made when
        one is first read (a fresh batch's kernel call reads none);
        ``constant_anchors``, if known, without them."""
        out = cls.__new__(cls)
        out.n_atoms = int(n_atoms)
        if constant_anchors is not None:
            out.constant_anchors = constant_anchors
        if callable(plan):
            out._make_plan = plan
        else:
            out.__dict__.update({k: v for k, v in plan.arrays().items() if k not in out.__dict__})
        return out

    def __getattr__(self, name: str):
        """An array of a table made by :meth:`from_plan` from a function, made
        on first access (only called for attributes the instance lacks)."""
        make = self.__dict__.get("_make_plan")
        if make is None or name not in _ARRAY_NAMES:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        # set, then forget the maker: a second thread either finds the arrays
        # or makes them again (the same), never a missing attribute
        for k, v in make().arrays().items():
            self.__dict__.setdefault(k, v)
        self.__dict__.pop("_make_plan", None)
        return self.__dict__[name]

    # ------------------------------------------------------------------ info
    def __getstate__(self) -> dict:
        """Pickled without its per-device plans (index tensors: rebuilt on use)
        and with its lazy arrays made."""
        if "_make_plan" in self.__dict__:
            self.refs  # noqa: B018 (makes the arrays)
        skip = ("_make_plan", "_packed", "origin", "pieces", "kernel_arrays")
        return {k: v for k, v in self.__dict__.items() if not k.startswith(_PLANS) and k not in skip}

    def __len__(self) -> int:
        return self.n_atoms

    def __repr__(self) -> str:
        counts = np.bincount(self.kind, minlength=6)
        parts = ", ".join(f"{n}={c}" for n, c in zip(KIND_NAMES, counts, strict=True) if c)
        return (
            f"ConstructionTable(n_atoms={self.n_atoms}, levels={self.n_levels}, "
            f"segment_levels={len(self.stage_atoms)}, {parts})"
        )

    def __eq__(self, other) -> bool:
        return isinstance(other, ConstructionTable) and np.array_equal(self.refs, other.refs)

    def __hash__(self) -> int:
        return hash(self.refs.tobytes())

    @property
    def n_levels(self) -> int:
        """Number of dependency levels (the depth of the level-by-level method)."""
        return len(self.level_atoms)

    @functools.cached_property
    def topo_order(self) -> np.ndarray:
        """Atom indices in an order where every reference comes first."""
        level = _longest_path_levels(self.refs, self.n_atoms)
        return np.argsort(level, kind="stable")

    @property
    def construction_order(self) -> np.ndarray:
        """Atom indices in an order where every reference comes first."""
        return self.topo_order

    @functools.cached_property
    def level_atoms(self) -> list[np.ndarray]:
        """Atoms grouped by dependency level: a rigid child needs only its
        parent's frame, a segment root the positions of its references."""
        deps = self.refs.copy()
        rigid = self.parent >= 0
        deps[rigid] = -1
        deps[rigid, 0] = self.parent[rigid]
        return _group(_longest_path_levels(deps, self.n_atoms))

    @functools.cached_property
    def dihedral_plane(self) -> np.ndarray:
        """``(N,)`` int64: where the anchor of a POSITIONAL row ``(b, a, d)``
        takes the plane ``(d, a, b)`` from (``_geometry.nerf_anchor``): ``+1``
        if ``d`` is a sibling (its references start ``(b, a)``), ``-1`` a
        cousin (``(a, b)``): ``d``'s frame, defined even where ``d`` lies on
        the axis ``a - b``; ``0`` the positions (every other row)."""
        b, a, d = self.refs.T
        rd = self.refs[np.maximum(d, 0), :2]
        positional = self.kind == POSITIONAL
        sibling = positional & (rd[:, 0] == b) & (rd[:, 1] == a)
        cousin = positional & (rd[:, 0] == a) & (rd[:, 1] == b)
        return sibling.astype(np.int64) - cousin.astype(np.int64)

    @property
    def bonds(self) -> np.ndarray:
        """``(E, 2)`` array of ``(i, b_i)`` pairs: the bonds the table implies."""
        i = np.nonzero(self.refs[:, 0] >= 0)[0]
        return np.stack([i, self.refs[i, 0]], axis=1)

    # -------------------------------------------------------------- the plan
    # Everything here is vectorised (numpy), so a table of 100k+ atoms is
    # planned in a fraction of a second: no Python loop over atoms or depth.
    def _classify(self) -> None:
        refs, n = self.refs, self.n_atoms
        ar = np.arange(n)
        nref = (refs >= 0).sum(1)
        b, a, d = refs.T
        bs = np.maximum(b, 0)
        bb, ab = refs[bs, 0], refs[bs, 1]
        full = nref == 3
        kind = np.choose(np.minimum(nref, 3), [ROOT, BOND, PLANAR, POSITIONAL])
        parent = np.full(n, -1, np.int64)
        rigid_bond = (nref == 1) & (nref[bs] == 0)
        rigid_planar = (nref == 2) & (nref[bs] == 1) & (a == bb)
        proper = full & (a == bb) & (d == ab)
        parent[rigid_bond | rigid_planar | proper] = b[rigid_bond | rigid_planar | proper]
        kind[proper] = PROPER
        # OFFSET: the dihedral reference d is a sibling anchored on b with the
        # same angle reference; siblings may themselves be offsets (fixpoint).
        ds = np.maximum(d, 0)
        candidate = full & ~proper & (a == bb) & (refs[ds, 0] == b) & (refs[ds, 1] == a)
        offset = np.zeros(n, bool)
        while True:
            anchored = (parent[ds] == b) & np.isin(kind[ds], (PLANAR, PROPER, OFFSET))
            new = candidate & ~offset & anchored
            if not new.any():
                break
            offset |= new
            kind[new], parent[new] = OFFSET, b[new]
        offset_of = np.where(offset, d, -1)
        self.kind, self.parent, self.offset_of = kind, parent, offset_of

        # Offset chains: phi_eff[i] = sum of masked phi over chain[i].
        cols = [ar]
        while (nxt := np.where(cols[-1] < n, offset_of[np.minimum(cols[-1], n - 1)], -1)).max() >= 0:
            cols.append(np.where(nxt >= 0, nxt, n))
        self.offset_chain = np.stack(cols, 1)  # n = "zero" slot

        # Forest of rigid parents: roots, depth, and a depth-first preorder in
        # which every subtree (hence every segment) is a contiguous range.
        root, depth = _roots_and_depths(parent)
        dfs, end = _preorder(parent)
        pos = np.empty(n, np.int64)
        pos[dfs] = ar
        self.dfs_order, self.dfs_pos = dfs, pos
        self.subtree_end = end[dfs]  # indexed by dfs position
        self.dfs_parent = np.where(parent[dfs] >= 0, pos[np.maximum(parent[dfs], 0)], -1)
        self.dfs_depth = depth[dfs]
        self.max_depth = int(depth.max())
        self.dfs_segment = pos[root[dfs]]  # segment root (dfs position) of each dfs position

        # Segments and their levels (stages of the analytic method): a segment
        # waits for the segments holding its root's references.
        seg_roots = np.nonzero(parent < 0)[0]
        seg_refs = np.where(refs[seg_roots] >= 0, root[np.maximum(refs[seg_roots], 0)], -1)
        local = np.full(n, -1, np.int64)
        local[seg_roots] = np.arange(len(seg_roots))
        seg_level = _longest_path_levels(
            np.where(seg_refs >= 0, local[np.maximum(seg_refs, 0)], -1), len(seg_roots)
        )
        self.stage_atoms = _group(seg_level[local[root]])  # global atom ids per stage
        self.constant_anchors = bool((kind[seg_roots] == ROOT).all())

    # --------------------------------------------------------- device cache
    def cached(self, build: Callable[[ConstructionTable, torch.device], T], device: torch.device | str) -> T:
        """``build(self, device)``, built once per builder and device and cached.

        Every method keeps its per-device plan (index tensors, Python lists)
        here: an attribute of the table per builder, a dict per device, which
        compiled code reads as a constant; a plan first needed while
        ``torch.compile`` traces is built then, for real, and becomes a
        constant of the graph.
        """
        if torch.compiler.is_compiling():  # built for real before the graph reads the cache
            _build_constant(self, build, device)
        plan = self.__dict__.get(_cache_name(build), {}).get(device)
        return _build(self, build, device) if plan is None else plan

    def plan(self, device: torch.device | str) -> _DevicePlan:
        """The index tensors of the table itself on ``device`` (built once, cached)."""
        return self.cached(_device_plan, device)


_PLANS = "_plans "
_ARRAY_NAMES = frozenset(ConstructionTable._ARRAYS)  # the arrays a plan gives (``from_plan``)


@functools.lru_cache(maxsize=8)
def _pool(pieces: tuple) -> tuple:
    """``ConstructionTable.concatenate(pieces)`` and its component bounds, for
    ``concatenate(pieces, index)``: planned once per set of pieces (kept
    alive here, a few per process: residue or molecule types)."""
    size = np.array([t.n_atoms for t in pieces])
    return ConstructionTable.concatenate(list(pieces)), segment_ptr(size)


def _take_columns(a: np.ndarray, column: np.ndarray) -> np.ndarray:
    """``a[:, column]`` of a 2-D array, a row at a time (numpy's gather along
    the second axis of a C-ordered array is several times slower)."""
    out = np.empty((a.shape[0], len(column)), a.dtype)
    for k in range(a.shape[0]):
        np.take(a[k], column, out=out[k])
    return out


def _cache_name(build) -> str:
    """One attribute per builder (its name for readability, its id for uniqueness)."""
    return f"{_PLANS}{getattr(build, '__qualname__', type(build).__name__)} {id(build):x}"


def _build(table: ConstructionTable, build, device: torch.device | str):
    """``build(table, device)``, cached on ``table`` (``ConstructionTable.cached``)."""
    plans = table.__dict__.setdefault(_cache_name(build), {})
    key = torch.device(device)  # "cpu" and torch.device("cpu") share one plan
    plan = plans.get(key)
    if plan is None:
        plan = build(table, key)
        if torch._guards.detect_fake_mode() is not None:  # never cache torch.export's fake tensors
            return plan
        plans[key] = plan
    plans[device] = plan  # the caller's spelling, for the next lookup
    return plan


# While torch.compile traces, Dynamo calls this for real, ahead of the
# graph's first read of the cache (an attribute per builder, a dict per
# device): a plan built in numpy is never traced, nor read before it exists.
# ``torch.compiler.assume_constant_result`` sets the mark below; it imports
# torch._dynamo to do so (most of a second), so ``import zmat`` sets the mark
# itself and leaves the public call to when Dynamo is loaded anyway.
_build_constant = _build
_build_constant._dynamo_marked_constant = True
if "torch._dynamo" in sys.modules:
    torch.compiler.assume_constant_result(_build_constant)


def index_tensor(a, device: torch.device | str) -> torch.Tensor:
    """An index array as a contiguous int64 tensor on ``device``."""
    return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.long, device=device)


@dataclass(frozen=True)
class _DevicePlan:
    kind: torch.Tensor
    refs_or_origin: torch.Tensor  # (N, 3), missing refs -> N (the origin slot)
    present: torch.Tensor  # (N, 3) bool, reference given
    offset_chain: torch.Tensor


def _device_plan(table: ConstructionTable, device: torch.device) -> _DevicePlan:
    n = table.n_atoms
    return _DevicePlan(
        kind=index_tensor(table.kind, device),
        refs_or_origin=index_tensor(np.where(table.refs >= 0, table.refs, n), device),
        present=torch.as_tensor(table.refs >= 0, device=device),
        offset_chain=index_tensor(table.offset_chain, device),
    )


def as_table(table) -> ConstructionTable:
    """Return ``table`` as a :class:`ConstructionTable` (validating it if needed).

    Validation is cached for numpy arrays and tensors of the same content, so
    passing the same raw array on every training step costs one hash.
    """
    if isinstance(table, ConstructionTable):
        return table
    if isinstance(table, torch.Tensor):
        if table.dtype.is_floating_point or table.dtype == torch.bool:
            raise TypeError(f"construction table must be an integer array, got dtype {table.dtype}")
        table = table.detach().cpu().numpy()
    arr = np.asarray(table)
    if arr.dtype.kind in "iu" and arr.ndim == 2:
        return _cached_table(arr.astype(np.int64).tobytes(), arr.shape)
    return ConstructionTable(arr)


@functools.lru_cache(maxsize=64)
def _cached_table(data: bytes, shape: tuple) -> ConstructionTable:
    return ConstructionTable(np.frombuffer(data, np.int64).reshape(shape))


# ---------------------------------------------------------------- validation
def _validate(refs) -> np.ndarray:
    if isinstance(refs, torch.Tensor):
        refs = refs.detach().cpu().numpy()
    if isinstance(refs, (str, bytes)):
        raise TypeError("construction table must be an integer array of shape (N, 3), got a string")
    if isinstance(refs, Sequence) and len(refs) == 0:
        raise ValueError("construction table is empty: it needs at least one row")
    try:
        arr = np.asarray(refs)
    except ValueError:
        arr = np.asarray(refs, dtype=object)
    if arr.dtype == object:
        raise ValueError("construction table rows must all have 3 entries (b, a, d)")
    if arr.dtype.kind not in "iu":
        hint = ""
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)):
            hint = "; convert it with .astype(int) if the values are whole numbers"
        raise TypeError(f"construction table must be an integer array, got dtype {arr.dtype}{hint}")
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(
            f"construction table must have shape (N, 3) with rows (b, a, d), got shape {arr.shape}"
        )
    if arr.shape[0] == 0:
        raise ValueError("construction table is empty: it needs at least one row")
    if arr.dtype == np.uint64 and (arr > np.iinfo(np.int64).max).any():
        raise ValueError("construction table has references too large for int64")
    arr = arr.astype(np.int64)
    n = arr.shape[0]
    bad = _row_problems(arr)
    if bad.any():
        i = int(np.argmax(bad))
        try:
            _raise_row_error(i, arr[i], n)
        except ValueError as e:
            if not _row_problems(np.where(arr > 0, arr - 1, -1)).any():  # valid once read as 1-based
                raise ValueError(
                    f"{e}. References are 0-based atom indices with -1 for none; this looks like a "
                    "1-based table (as in z-matrix text): use refs - 1, with 0 becoming -1"
                ) from None
            raise
    _check_acyclic(arr)
    return arr


def _row_problems(arr: np.ndarray) -> np.ndarray:
    """``(N,)`` bool: rows with a reference out of range, a gap, the atom
    itself, or a repeated reference (one mask per problem)."""
    n = arr.shape[0]
    present = arr >= 0
    rows = np.arange(n)[:, None]
    problems = (
        ((arr < -1) | (arr >= n)).any(1),
        (present[:, 1] & ~present[:, 0]) | (present[:, 2] & ~present[:, 1]),
        (arr == rows).any(1),
        (present[:, 1] & (arr[:, 0] == arr[:, 1]))
        | (present[:, 2] & ((arr[:, 0] == arr[:, 2]) | (arr[:, 1] == arr[:, 2]))),
    )
    return np.logical_or.reduce(problems)


def _raise_row_error(i: int, row: np.ndarray, n: int):
    names = ("bond", "angle", "dihedral")
    for c, v in enumerate(row):
        if v < -1:
            hint = ""
            if v < -(2**62):
                hint = (
                    " (this looks like chemcoord's sentinel for an absolute reference; "
                    "use zmat.chemcoord to import chemcoord tables)"
                )
            raise ValueError(
                f"row {i}: {names[c]} reference {v} is out of range; use -1 for a missing reference{hint}"
            )
        if v >= n:
            raise ValueError(f"row {i}: {names[c]} reference {v} is out of range for a table of {n} atoms")
    present = row >= 0
    for c in range(1, 3):
        if present[c] and not present[c - 1]:
            raise ValueError(
                f"row {i}: {names[c]} reference {row[c]} is given but the "
                f"{names[c - 1]} reference is missing (only trailing references may be -1)"
            )
    if (row == i).any():
        raise ValueError(f"row {i}: atom {i} refers to itself ({tuple(int(v) for v in row)})")
    raise ValueError(
        f"row {i}: repeated reference in ({', '.join(str(int(v)) for v in row)}); "
        "the bond, angle and dihedral references must be distinct atoms"
    )


def _check_acyclic(refs: np.ndarray) -> None:
    """Raise ValueError naming a dependency cycle, if there is one."""
    n = len(refs)
    if (refs < np.arange(n)[:, None]).all():
        return  # rows in construction order
    from scipy.sparse import coo_matrix  # here: scipy.sparse costs a few tenths of a second to import
    from scipy.sparse.csgraph import connected_components

    i, c = np.nonzero(refs >= 0)
    graph = coo_matrix((np.ones(len(i)), (i, refs[i, c])), shape=(n, n))
    n_comp, label = connected_components(graph, directed=True, connection="strong")
    if n_comp == n:
        return  # every strongly connected component is one atom: a DAG
    sizes = np.bincount(label)
    inside = set(np.nonzero(sizes[label] > 1)[0].tolist())
    # walk references inside the cycle's component until an atom repeats
    start = min(inside)
    comp = label[start]
    seen: dict[int, int] = {}
    path = []
    atom = start
    while atom not in seen:
        seen[atom] = len(path)
        path.append(atom)
        atom = next(int(r) for r in refs[atom] if r >= 0 and label[r] == comp)
    cycle = path[seen[atom] :]
    raise ValueError(
        "construction table has a dependency cycle through atoms "
        + " -> ".join(str(c) for c in cycle + [cycle[0]])
        + " (each refers to the next); a table must be acyclic"
    )


def _longest_path_levels(deps: np.ndarray, n: int) -> np.ndarray:
    """``level[i] = 0`` without dependencies, else ``1 + max(level[deps[i]])``.

    ``deps`` is ``(n, k)`` with ``-1`` for none; the graph must be acyclic.
    Kahn's algorithm one frontier at a time, each frontier one numpy step.
    """
    i, c = np.nonzero(deps >= 0)
    src, dst = deps[i, c], i
    indeg = np.bincount(dst, minlength=n)
    order = np.argsort(src, kind="stable")
    dst_by_src = dst[order]
    ptr = np.searchsorted(src[order], np.arange(n + 1))
    level = np.zeros(n, np.int64)
    frontier = np.nonzero(indeg == 0)[0]
    k = 0
    while frontier.size:
        level[frontier] = k
        first, counts = ptr[frontier], ptr[frontier + 1] - ptr[frontier]
        if counts.sum() == 0:
            break
        touched, hits = np.unique(dst_by_src[ranges(first, counts)], return_counts=True)
        indeg[touched] -= hits
        frontier = touched[indeg[touched] == 0]
        k += 1
    return level


def _roots_and_depths(parent: np.ndarray):
    """Root and depth of every node of a forest given by parent pointers
    (pointer jumping: ceil(log2(depth)) vectorised rounds)."""
    n = len(parent)
    anc = np.where(parent >= 0, parent, np.arange(n))
    depth = (parent >= 0).astype(np.int64)
    while True:
        nxt = anc[anc]
        moved = nxt != anc
        if not moved.any():
            return anc, depth
        depth = depth + np.where(moved, depth[anc], 0)
        anc = nxt


def _preorder(parent: np.ndarray):
    """Depth-first preorder of a forest, children in index order; returns
    ``(order, end)`` with ``end[i]`` one past the last position of ``i``'s
    subtree.

    The Euler tour of the forest (a virtual root above the roots) as a linked
    list: every node is entered (``down``, weight 1) and left (``up``, weight
    0); after ``down i`` comes ``down`` of its first child, else ``up i``;
    after ``up i`` the ``down`` of its next sibling, else ``up`` of its
    parent. Weighted list ranking by pointer jumping (``ceil(log2(2 N))``
    vectorised rounds) counts the ``down`` steps from every step to the end:
    ``i``'s preorder position is ``N`` minus that count at ``down i``, and its
    subtree ends where ``up i`` is. O(N log N) numpy work, whatever the shape
    (a million roots, a star, a chain): no search, no loop over atoms."""
    n = len(parent)
    src = np.where(parent >= 0, parent, n)  # n: the virtual root
    kids = np.argsort(src, kind="stable")  # children grouped by parent, in index order
    ptr = np.searchsorted(src[kids], np.arange(n + 2))
    has_kids = ptr[1 : n + 1] > ptr[:n]
    end_of_tour = 2 * n
    nxt = np.empty(2 * n + 1, np.int64)  # steps: down i = i, up i = n + i, the end = 2 n
    nxt[:n] = np.where(has_kids, kids[np.minimum(ptr[:n], n - 1)], np.arange(n) + n)
    sibling = np.empty(n, np.int64)
    last = np.append(src[kids][1:] != src[kids][:-1], True)  # the last child of its parent
    sibling[kids] = np.where(last, -1, np.append(kids[1:], -1))
    nxt[n : 2 * n] = np.where(sibling >= 0, sibling, np.where(parent >= 0, parent + n, end_of_tour))
    nxt[end_of_tour] = end_of_tour
    count = np.zeros(2 * n + 1, np.int64)
    count[:n] = 1
    while True:  # count[e] = downs from e up to (not including) nxt[e]; then nxt[e] jumps
        count += count[nxt]
        step = nxt[nxt]
        if (step == end_of_tour).all():
            break
        nxt = step
    pos = n - count[:n]
    order = np.empty(n, np.int64)
    order[pos] = np.arange(n)
    return order, n - count[n : 2 * n]


def _group(label: np.ndarray) -> list[np.ndarray]:
    """Indices grouped by integer label, labels in increasing order."""
    if len(label) == 0:
        return []
    order = np.argsort(label, kind="stable")
    bounds = np.searchsorted(label[order], np.arange(label.max() + 2))
    return [order[bounds[k] : bounds[k + 1]] for k in range(label.max() + 1)]
