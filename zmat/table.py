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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ConstructionTable", "as_table"]

ROOT, BOND, PLANAR, PROPER, OFFSET, POSITIONAL = range(6)
KIND_NAMES = ("root", "bond", "planar", "proper", "offset", "positional")


class ConstructionTable:
    """A validated construction table and its execution plan.

    Args:
        refs: integer array-like of shape ``(N, 3)`` (list, numpy array or
            tensor); row ``i`` is ``(b_i, a_i, d_i)``, ``-1`` for "no
            reference".

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

    # ------------------------------------------------------------------ info
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

    @property
    def construction_order(self) -> np.ndarray:
        """Atom indices in an order where every reference comes first."""
        return self.topo_order

    @property
    def bonds(self) -> np.ndarray:
        """``(E, 2)`` array of ``(i, b_i)`` pairs: the bonds the table implies."""
        i = np.nonzero(self.refs[:, 0] >= 0)[0]
        return np.stack([i, self.refs[i, 0]], axis=1)

    # -------------------------------------------------------------- the plan
    def _classify(self) -> None:
        refs, n = self.refs, self.n_atoms
        nref = (refs >= 0).sum(1)
        order = _topological_order(refs)
        self.topo_order = order

        kind = np.zeros(n, np.int64)
        parent = np.full(n, -1, np.int64)  # rigid (frame) parent, -1 = segment root
        offset_of = np.full(n, -1, np.int64)  # sibling whose phi_eff is added
        for i in order:
            b, a, d = refs[i]
            if nref[i] == 0:
                kind[i] = ROOT
            elif nref[i] == 1:
                kind[i] = BOND
                if kind[b] == ROOT:
                    parent[i] = b
            elif nref[i] == 2:
                kind[i] = PLANAR
                if kind[b] == BOND and a == refs[b, 0]:
                    parent[i] = b
            else:
                bb, ab = refs[b, 0], refs[b, 1]
                if a == bb and d == ab:
                    kind[i], parent[i] = PROPER, b
                elif a == bb and parent[d] == b and refs[d, 1] == a and kind[d] in (PLANAR, PROPER, OFFSET):
                    kind[i], parent[i], offset_of[i] = OFFSET, b, d
                else:
                    kind[i] = POSITIONAL
        self.kind, self.parent, self.offset_of = kind, parent, offset_of

        # Dependency levels for the level-by-level method: a rigid child needs
        # only its parent's frame, a segment root the positions of its refs.
        level = np.zeros(n, np.int64)
        for i in order:
            if parent[i] >= 0:
                level[i] = level[parent[i]] + 1
            elif nref[i] > 0:
                level[i] = 1 + level[refs[i, : nref[i]]].max()
        self.level = level
        self.level_atoms = _group(level)

        # Offset chains: phi_eff[i] = sum of masked phi over chain[i].
        chains = []
        for i in range(n):
            chain, j = [i], offset_of[i]
            while j >= 0:
                chain.append(j)
                j = offset_of[j]
            chains.append(chain)
        width = max(len(c) for c in chains)
        self.offset_chain = np.full((n, width), n, np.int64)  # n = "zero" slot
        for i, c in enumerate(chains):
            self.offset_chain[i, : len(c)] = c

        # Depth-first preorder of the forest of rigid parents: every subtree
        # (hence every segment) is a contiguous range [pos, end).
        children: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            if parent[i] >= 0:
                children[parent[i]].append(i)
        dfs, end = np.empty(n, np.int64), np.empty(n, np.int64)
        k = 0
        for s in np.nonzero(parent < 0)[0]:
            stack = [(int(s), False)]
            while stack:
                i, done = stack.pop()
                if done:
                    end[i] = k
                    continue
                dfs[k] = i
                k += 1
                stack.append((i, True))
                stack.extend((c, False) for c in reversed(children[i]))
        pos = np.empty(n, np.int64)
        pos[dfs] = np.arange(n)
        self.dfs_order, self.dfs_pos = dfs, pos
        self.subtree_end = end[dfs]  # indexed by dfs position
        # rigid parent in dfs positions, -1 for segment roots
        self.dfs_parent = np.where(parent[dfs] >= 0, pos[np.maximum(parent[dfs], 0)], -1)
        depth = np.zeros(n, np.int64)
        for p in range(n):  # parents precede children in preorder
            q = self.dfs_parent[p]
            depth[p] = 0 if q < 0 else depth[q] + 1
        self.max_depth = int(depth.max()) if n else 0

        # Segments and their levels (stages of the analytic method).
        segment = np.empty(n, np.int64)
        for p in range(n):
            q = self.dfs_parent[p]
            segment[p] = p if q < 0 else segment[q]
        self.dfs_segment = segment  # segment root (dfs position) of each dfs position
        seg_level = np.zeros(n, np.int64)
        for i in order:
            if parent[i] < 0 and nref[i] > 0:
                src = pos[refs[i, : nref[i]]]
                seg_level[pos[i]] = 1 + seg_level[segment[src]].max()
        atom_stage = seg_level[segment]
        self.stage_atoms = _group(atom_stage[pos])  # global atom ids per stage
        self.constant_anchors = bool((kind[parent < 0] == ROOT).all())

    # --------------------------------------------------------- device cache
    def plan(self, device: torch.device | str) -> _DevicePlan:
        """The index tensors of the plan on ``device`` (built once, cached).

        The cache is a plain dict on the table, so code compiled with
        ``torch.compile`` after a first eager call reads it as a constant.
        """
        plans = self.__dict__.setdefault("_plans", {})
        plan = plans.get(device)
        if plan is None:
            plan = plans[device] = _device_plan(self, torch.device(device))
        return plan


@dataclass
class _DevicePlan:
    kind: torch.Tensor
    refs_or_origin: torch.Tensor  # (N, 3), missing refs -> N (the origin slot)
    offset_chain: torch.Tensor
    tensors: dict


@torch.compiler.disable
def _device_plan(table: ConstructionTable, device: torch.device) -> _DevicePlan:
    def t(x):
        return torch.as_tensor(np.ascontiguousarray(x), dtype=torch.long, device=device)

    n = table.n_atoms
    return _DevicePlan(
        kind=t(table.kind),
        refs_or_origin=t(np.where(table.refs >= 0, table.refs, n)),
        offset_chain=t(table.offset_chain),
        tensors={},
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
    arr = np.asarray(refs)
    if isinstance(refs, Sequence) and len(refs) == 0:
        arr = np.zeros((0, 3), np.int64)
    if arr.dtype == object:
        raise ValueError("construction table rows must all have 3 entries (b, a, d)")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "b" or arr.dtype.kind != "f" or not np.all(np.isfinite(arr)):
            raise TypeError(f"construction table must be an integer array, got dtype {arr.dtype}")
        raise TypeError(
            f"construction table must be an integer array, got dtype {arr.dtype}; "
            "convert it with .astype(int) if the values are whole numbers"
        )
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(
            f"construction table must have shape (N, 3) with rows (b, a, d), got shape {arr.shape}"
        )
    if arr.shape[0] == 0:
        raise ValueError("construction table is empty: it needs at least one row")
    arr = arr.astype(np.int64)
    n = arr.shape[0]
    for i, row in enumerate(arr):
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
                raise ValueError(
                    f"row {i}: {names[c]} reference {v} is out of range for a table of {n} atoms"
                )
        present = row >= 0
        for c in range(1, 3):
            if present[c] and not present[c - 1]:
                raise ValueError(
                    f"row {i}: {names[c]} reference {row[c]} is given but the "
                    f"{names[c - 1]} reference is missing (only trailing references may be -1)"
                )
        if (row == i).any():
            raise ValueError(f"row {i}: atom {i} refers to itself ({tuple(int(v) for v in row)})")
        p = row[present]
        if len(set(p.tolist())) != len(p):
            raise ValueError(
                f"row {i}: repeated reference in ({', '.join(str(int(v)) for v in row)}); "
                "the bond, angle and dihedral references must be distinct atoms"
            )
    return arr


def _topological_order(refs: np.ndarray) -> np.ndarray:
    """Kahn's algorithm; raise ValueError naming a cycle if there is one."""
    n = len(refs)
    indeg = (refs >= 0).sum(1)
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, row in enumerate(refs):
        for r in row[row >= 0]:
            dependents[r].append(i)
    ready = list(np.nonzero(indeg == 0)[0][::-1])
    order = []
    indeg = indeg.copy()
    while ready:
        i = ready.pop()
        order.append(i)
        for j in dependents[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(order) < n:
        left = set(np.nonzero(indeg > 0)[0].tolist())
        # walk references inside the unresolved set until an atom repeats
        i = min(left)
        seen: dict[int, int] = {}
        path = []
        while i not in seen:
            seen[i] = len(path)
            path.append(i)
            i = next(int(r) for r in refs[i] if r >= 0 and int(r) in left)
        cycle = path[seen[i] :]
        raise ValueError(
            "construction table has a dependency cycle through atoms "
            + " -> ".join(str(c) for c in cycle + [cycle[0]])
            + " (each refers to the next); a table must be acyclic"
        )
    return np.asarray(order, np.int64)


def _group(label: np.ndarray) -> list[np.ndarray]:
    """Indices grouped by integer label, labels in increasing order."""
    if len(label) == 0:
        return []
    order = np.argsort(label, kind="stable")
    bounds = np.searchsorted(label[order], np.arange(label.max() + 2))
    return [order[bounds[k] : bounds[k + 1]] for k in range(label.max() + 1)]
