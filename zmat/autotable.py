"""Automatic construction tables from Cartesian coordinates.

:func:`construction_table` chooses, for every atom, the bond, angle and
dihedral references from which a z-matrix places it. The result is
deterministic (it depends only on the positions, the elements and the
options) and follows these rules:

1. **Connectivity.** Atoms ``i`` and ``j`` are bonded when
   ``|x_i - x_j| < mult (r_i + r_j) + 2 skin``, with ``r`` ASE's covalent radii
   (``ase.neighborlist.natural_cutoffs``) and ``skin = 0.3`` A: the pairs ASE's
   ``NeighborList(natural_cutoffs(atoms))`` reports. Periodic images are
   ignored. You may pass your own ``bonds`` instead.
2. **Construction order.** The first atom is ``start`` (atom 0 by default).
   From there the bond graph is walked breadth first, neighbours in
   increasing index; an atom's **bond reference** ``b`` is its nearest bonded
   neighbour among the atoms built before it (ties: lowest index). When a
   fragment is exhausted, the unbuilt atom nearest to any built atom (ties:
   lowest index) is next; its bond reference is that nearest built atom. So
   disconnected molecules (the water dimer, ions, solvent) are attached to
   what is already built, and the table is a single tree.
3. **Number of references.** The k-th atom in construction order gets
   ``min(k, 3)`` references: the first is a root ``(-1, -1, -1)``, the second
   ``(b, -1, -1)`` (placed along ``+x``), the third ``(b, a, -1)`` (in the
   ``xy``-plane), every other atom a full row. If the third atom would be
   collinear with the first two (e.g. the second ligand of an octahedral
   complex is trans to the first), the first atom waiting in the
   breadth-first queue that is not collinear is built third instead, so the
   fourth atom has a dihedral plane.
4. **Angle and dihedral references.** Candidate pairs ``(a, d)`` are tried in
   this order, and the first *well-conditioned* one is taken:

   a. ``b``'s own bond and angle references (the *proper* row of
      :mod:`zmat.table`: frames propagate along the tree, the fast and
      linear-robust path);
   b. ``a`` from ``b``'s bond reference, then ``b``'s built bonded neighbours
      (increasing index); ``d`` from ``a``'s bond and angle references, then
      ``a``'s and ``b``'s built bonded neighbours;
   c. only if (a) and (b) give nothing well-conditioned: the ``n_nearest``
      built atoms nearest to ``b`` (for ``a``) and to ``a`` (for ``d``),
      bonded or not.

   A pair is well-conditioned when both the angle ``i-b-a`` and the angle
   ``d-a-b`` (which spans the dihedral plane) lie in
   ``[min_angle, 180 - min_angle]`` degrees. If no candidate is, the one with
   the largest ``min(sin(i-b-a), sin(d-a-b))`` is taken (first on ties): for a
   truly linear molecule (CO2, HCN, C2H2) every choice is collinear, the
   angles are exactly 180 degrees and the dihedrals are 0, which
   ``zmat.to_xyz`` places exactly. For the third atom only ``a`` is chosen,
   by the same test on ``i-b-a``.

The references only ever point to atoms built earlier, so the table is
acyclic; the rows stay in the input atom order (references may point to later
rows), so ``ZMatrix.from_atoms(atoms).to_atoms()`` keeps the atom order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .table import ConstructionTable

__all__ = ["connectivity", "construction_table"]


def _positions_and_symbols(atoms, symbols):
    if hasattr(atoms, "get_positions"):
        return np.asarray(atoms.get_positions(), np.float64), list(atoms.get_chemical_symbols())
    pos = np.asarray(atoms, np.float64)
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ValueError(f"positions must have shape (N, 3), got {pos.shape}")
    return pos, None if symbols is None else elements(symbols)


def elements(symbols) -> list[str]:
    """Element symbols as ASE spells them: deuterium and tritium are hydrogen (neutron
    structures name them D and T); a symbol ASE does not know is an error naming the atom."""
    from ase.data import atomic_numbers

    out = []
    for i, symbol in enumerate(symbols):
        s = str(symbol).strip().capitalize()  # PDB files spell CL, FE
        s = {"D": "H", "T": "H"}.get(s, s)
        if s not in atomic_numbers:
            raise ValueError(f"atom {i}: unknown element symbol {symbols[i]!r} (no covalent radius)")
        out.append(s)
    return out


def connectivity(
    atoms, mult: float = 1.0, *, skin: float = 0.3, symbols: Sequence[str] | None = None
) -> list[np.ndarray]:
    """Covalent bonds from ASE's natural cutoffs, as ASE's ``NeighborList`` finds them.

    Atoms ``i`` and ``j`` are bonded when
    ``|x_i - x_j| < (mult r_i + skin) + (mult r_j + skin)``, with ``r`` the
    covalent radii of ``ase.neighborlist.natural_cutoffs``: exactly the pairs of
    ``NeighborList(natural_cutoffs(atoms, mult), skin=skin)`` (ASE's default
    skin is 0.3 A; without it a 1.54 A C-C bond exceeds ``2 * 0.76``).

    Args:
        atoms: an :class:`ase.Atoms`, or an ``(N, 3)`` array of positions
            together with ``symbols``.
        mult: factor on the covalent radii.
        skin: added to every radius, in Angstrom.
        symbols: element symbols when ``atoms`` is an array.

    Returns:
        list of ``N`` sorted integer arrays: the bonded neighbours of each atom.
        Periodic images are ignored.
    """
    from ase import Atoms
    from ase.neighborlist import natural_cutoffs

    pos, syms = _positions_and_symbols(atoms, symbols)
    if syms is None:
        raise ValueError("element symbols are needed for covalent radii: pass symbols=")
    radii = np.asarray(natural_cutoffs(Atoms(syms, positions=pos), mult=mult), np.float64) + skin
    n = len(pos)
    out: list[list[int]] = [[] for _ in range(n)]
    if n > 1:
        from scipy.spatial import cKDTree  # imported when used: it is slow to import

        pairs = cKDTree(pos).query_pairs(2.0 * float(radii.max()), output_type="ndarray")
        i, j = pairs[:, 0], pairs[:, 1]
        keep = np.linalg.norm(pos[i] - pos[j], axis=1) < radii[i] + radii[j]
        for a, b in zip(i[keep].tolist(), j[keep].tolist(), strict=True):
            out[a].append(b)
            out[b].append(a)
    return [np.unique(np.asarray(x, np.int64)) for x in out]


def angle(p: np.ndarray, q: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Angle ``p-q-r`` in radians, ``atan2(|u x v|, u . v)`` with ``u = p - q``, ``v = r - q``.

    Args:
        p, q, r: ``(..., 3)`` NumPy positions (broadcast against each other).

    Returns:
        ``(...)`` angles in ``[0, pi]``; 0 where a vector is zero.

    Example:
        >>> float(angle(np.array([1.0, 0, 0]), np.zeros(3), np.array([0, 2.0, 0])))  # doctest: +ELLIPSIS
        1.5707963...
    """
    u, v = p - q, r - q
    u, v = np.broadcast_arrays(u, v)
    cx = u[..., 1] * v[..., 2] - u[..., 2] * v[..., 1]
    cy = u[..., 2] * v[..., 0] - u[..., 0] * v[..., 2]
    cz = u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]
    return np.arctan2(np.sqrt(cx * cx + cy * cy + cz * cz), (u * v).sum(-1))


def construction_table(
    atoms,
    *,
    symbols: Sequence[str] | None = None,
    bonds: Sequence[Sequence[int]] | None = None,
    mult: float = 1.0,
    skin: float = 0.3,
    start: int = 0,
    min_angle: float = 10.0,
    n_nearest: int = 8,
) -> ConstructionTable:
    """A robust construction table for the given structure (rules in the module docstring).

    Args:
        atoms: an :class:`ase.Atoms`, or an ``(N, 3)`` array of positions (then
            give ``symbols`` or ``bonds``).
        symbols: element symbols, when ``atoms`` is an array.
        bonds: optional connectivity instead of covalent radii: for each atom
            the indices of its bonded neighbours (a list of ``N`` lists), or an
            ``(E, 2)`` list of pairs.
        mult, skin: covalent-radius factor and skin (Angstrom), see
            :func:`connectivity`.
        start: the atom built first (the root of the table).
        min_angle: degrees; angles closer than this to 0 or 180 count as
            near-linear.
        n_nearest: how many nearest built atoms rule 4c considers.

    Returns:
        a :class:`~zmat.ConstructionTable` with rows in the input atom order.

    Raises:
        ValueError: empty structure, ``start`` out of range, bad ``bonds``.

    Example:
        >>> from ase.build import molecule
        >>> construction_table(molecule("H2O")).refs.tolist()
        [[-1, -1, -1], [0, -1, -1], [0, 1, -1]]
    """
    pos, syms = _positions_and_symbols(atoms, symbols)
    n = len(pos)
    if n == 0:
        raise ValueError("cannot build a construction table for zero atoms")
    if not 0 <= start < n:
        raise ValueError(f"start={start} is out of range for {n} atoms")
    if not np.all(np.isfinite(pos)):
        raise ValueError("positions must be finite")
    nbrs = _neighbours(bonds, n) if bonds is not None else connectivity(pos, mult, skin=skin, symbols=syms)
    lo = math.sin(math.radians(min_angle))  # sin threshold: angle in [min, 180-min]
    return ConstructionTable(_Builder(pos, nbrs, lo, n_nearest).run(start))


def _neighbours(bonds, n: int) -> list[np.ndarray]:
    arr = None
    try:
        arr = np.asarray(bonds, np.int64)
    except (ValueError, TypeError):
        pass
    out: list[set[int]] = [set() for _ in range(n)]
    if arr is not None and arr.ndim == 2 and arr.shape[1] == 2 and len(bonds) != n:
        pairs = arr
    elif len(bonds) == n:
        pairs = [(i, int(j)) for i, js in enumerate(bonds) for j in js]
    else:
        raise ValueError(f"bonds must be a list of {n} neighbour lists or an (E, 2) list of pairs")
    for i, j in pairs:
        i, j = int(i), int(j)
        if not (0 <= i < n and 0 <= j < n) or i == j:
            raise ValueError(f"bad bond ({i}, {j}) for {n} atoms")
        out[i].add(j)
        out[j].add(i)
    return [np.asarray(sorted(s), np.int64) for s in out]


class _Builder:
    """The breadth-first construction of rules 2-4 (module docstring), one atom at a time."""

    def __init__(self, pos: np.ndarray, nbrs: list[np.ndarray], lo: float, n_nearest: int) -> None:
        n = len(pos)
        self.pos, self.nbrs, self.lo, self.n_nearest = pos, nbrs, lo, n_nearest
        self.refs = np.full((n, 3), -1, np.int64)
        self.built = np.zeros(n, bool)  # placed: may serve as a reference
        self.queued = np.zeros(n, bool)  # placed or waiting in the breadth-first queue
        self.n_built = 0
        # distance of every unbuilt atom to the nearest built one, updated lazily per fragment
        self.dmin = np.full(n, np.inf)
        self.pending: list[int] = []  # built atoms not yet folded into dmin

    def run(self, start: int) -> np.ndarray:
        """``(N, 3)`` references, rows in the input atom order."""
        while self.n_built < len(self.pos):
            seed, parent = (start, -1) if self.n_built == 0 else self._next_fragment()
            self._walk(seed, parent)
        return self.refs

    def _next_fragment(self) -> tuple[int, int]:
        """Rule 2: the unbuilt atom nearest to a built one, and that built atom."""
        pos = self.pos
        if self.pending:  # fold the atoms built since the last fragment into dmin
            from scipy.spatial import cKDTree

            idx = np.nonzero(~self.queued)[0]
            d, _ = cKDTree(pos[self.pending]).query(pos[idx], k=1)
            self.dmin[idx] = np.minimum(self.dmin[idx], d)
            self.pending.clear()
        cand = np.nonzero(~self.queued)[0]
        seed = int(cand[np.lexsort((cand, self.dmin[cand]))[0]])
        done = np.nonzero(self.built)[0]
        dist = np.linalg.norm(pos[done] - pos[seed], axis=1)
        return seed, int(done[np.lexsort((done, dist))[0]])

    def _walk(self, seed: int, parent: int) -> None:
        """Build, breadth first, the fragment that contains ``seed``."""
        queue = [(seed, parent)]
        self.queued[seed] = True
        head = 0
        while head < len(queue):
            if self.n_built == 2:
                self._avoid_collinear_start(queue, head)
            i, b = queue[head]
            head += 1
            self._choose(i, b)
            self.built[i] = True
            self.n_built += 1
            self.pending.append(i)
            for j in self.nbrs[i]:
                if not self.queued[j]:
                    self.queued[j] = True
                    queue.append((int(j), i))

    def _avoid_collinear_start(self, queue: list[tuple[int, int]], head: int) -> None:
        """Rule 3: build third the first queued atom not collinear with the first two
        (a collinear start leaves the 4th atom without a dihedral plane), if any."""
        for q in range(head, len(queue)):
            j, bj = queue[q]
            done = np.nonzero(self.built)[0]
            other = int(done[done != bj][0])
            if np.sin(angle(self.pos[j], self.pos[bj], self.pos[other])) >= self.lo:
                queue[head], queue[q] = queue[q], queue[head]
                return

    def _nearest_built(self, p: np.ndarray, exclude: tuple[int, ...]) -> list[int]:
        idx = np.nonzero(self.built)[0]
        idx = idx[~np.isin(idx, exclude)]
        d = np.linalg.norm(self.pos[idx] - p, axis=1)
        return idx[np.lexsort((idx, d))[: self.n_nearest]].tolist()

    def _choose(self, i: int, b: int) -> None:
        """The references of atom ``i``, reached from the built atom ``b``."""
        pos, refs = self.pos, self.refs
        k = self.n_built  # number of atoms built before i
        if k == 0:
            return
        nb_i = np.asarray([j for j in self.nbrs[i] if self.built[j]], np.int64)
        if len(nb_i):  # nearest bonded built neighbour (the atom i was reached from is one)
            b = int(nb_i[np.lexsort((nb_i, np.linalg.norm(pos[nb_i] - pos[i], axis=1)))[0]])
        refs[i, 0] = b
        if k == 1:
            return
        nb_b = [int(j) for j in self.nbrs[b] if self.built[j] and j != i]
        if k == 2:
            cands = [c for c in [refs[b, 0], *nb_b] if c >= 0 and c != b]
            cands += [c for c in self._nearest_built(pos[b], (b, i)) if c not in cands]
            s = np.sin(angle(pos[i], pos[b], pos[cands]))
            ok = np.nonzero(s >= self.lo)[0]
            refs[i, 1] = cands[ok[0] if len(ok) else int(np.argmax(s))]
            return
        refs[i, 1], refs[i, 2] = self._angle_and_dihedral(i, b, nb_b)

    def _pairs(self, i: int, b: int, nb_b: list[int], wide: bool) -> list[tuple[int, int]]:
        """Rule 4's candidate ``(a, d)`` pairs in order: (a) and (b), plus (c) when ``wide``."""
        refs, built = self.refs, self.built
        out: list[tuple[int, int]] = []
        if refs[b, 0] >= 0 and refs[b, 1] >= 0:
            out.append((int(refs[b, 0]), int(refs[b, 1])))
        a_list = [int(refs[b, 0])] + nb_b
        if wide:
            a_list += self._nearest_built(self.pos[b], (b, i))
        for a in a_list:
            if a < 0 or a == b:
                continue
            d_list = [int(refs[a, 0]), int(refs[a, 1])]
            d_list += [int(j) for j in self.nbrs[a] if built[j]] + nb_b
            if wide:
                d_list += self._nearest_built(self.pos[a], (a, b, i))
            out += [(a, d) for d in d_list if d >= 0 and d not in (a, b, i)]
        return list(dict.fromkeys(out))

    def _angle_and_dihedral(self, i: int, b: int, nb_b: list[int]) -> tuple[int, int]:
        """Rule 4: the first well-conditioned pair, else the best-conditioned one."""
        pos = self.pos
        best, best_score = None, -1.0
        for wide in (False, True):
            cand = self._pairs(i, b, nb_b, wide)
            if not cand:
                continue
            ca = np.asarray(cand)
            s1 = np.sin(angle(pos[i], pos[b], pos[ca[:, 0]]))
            s2 = np.sin(angle(pos[ca[:, 1]], pos[ca[:, 0]], pos[b]))
            score = np.minimum(s1, s2)
            ok = np.nonzero(score >= self.lo)[0]
            if len(ok):
                return cand[ok[0]]
            j = int(np.argmax(score))
            if score[j] > best_score:
                best, best_score = cand[j], score[j]
        return best
