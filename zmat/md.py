"""Molecular-dynamics trajectories in: MDAnalysis topologies and trajectories -> z-matrices.

``import zmat.md`` needs MDAnalysis (the optional extra ``zmat[md]``);
``import zmat`` does not. MDAnalysis rather than mdtraj: it reads every
common topology and trajectory format with the topology's own bonds (PSF,
TPR, PRMTOP, PDB CONECT, ...), it is actively maintained with wheels for
current Pythons, and it ships the bond-angle-torsion analysis
(``MDAnalysis.analysis.bat``) that zmat's internal coordinates are checked
against (``tests/test_md.py``).

:func:`construction_table` builds a table from the topology's bonds (never
from distances), one tree per molecule (a *forest*; rows in the AtomGroup's
order, references may point to later rows):

1. **Molecules.** The connected components of the bonds inside the group,
   ordered by their lowest atom index.
2. **Root.** In each molecule the heaviest terminal atom (one bond), else
   its heaviest atom; the second atom is the root's heaviest neighbour, and
   the third the heaviest non-terminal neighbour of the second (else any);
   ties go to the highest index. This is the root
   ``MDAnalysis.analysis.bat.BAT`` chooses by default.
3. **Order.** Breadth first from the root along the bonds, heavier
   neighbours first (ties: lowest index). Each atom's bond reference ``b`` is
   the bonded atom it was reached from, so a hydrogen always sits on its
   heavy atom.
4. **Angle and dihedral references.** Atom ``i`` reached from ``b`` gets
   ``a = parent(b)`` and ``d = parent(a)``: a *proper* row of
   :mod:`zmat.table` (``d-a-b-i`` a chain of bonds), wherever the tree above
   ``b`` is deep enough. Near the root, where it is not, ``a`` (then ``d``) is
   the first built bonded neighbour of ``b`` (then of ``a``, then of ``b``)
   not yet in the row, heavier first.

:func:`positions` reads the frames into an ``(F, N, 3)`` tensor (Angstrom,
molecules made whole across periodic boundaries), and
:func:`flow_coordinates` turns them into the flat ``q`` of
:class:`zmat.flows.InternalCoordinateTransform`.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import torch

from .flows import InternalCoordinateTransform
from .table import ConstructionTable

__all__ = ["atom_group", "bonds", "construction_table", "flow_coordinates", "positions"]


def _mda():
    try:
        import MDAnalysis
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("zmat.md needs MDAnalysis: pip install 'zmat[md]'") from err
    return MDAnalysis


def atom_group(atoms):
    """An ``AtomGroup`` from an AtomGroup, a Universe, or topology (+ trajectory) file names.

    Args:
        atoms: an ``MDAnalysis`` ``AtomGroup`` or ``Universe``, a file name, or a
            sequence ``(topology, trajectory, ...)`` passed to ``MDAnalysis.Universe``.

    Raises:
        TypeError: anything else.
    """
    mda = _mda()
    if isinstance(atoms, (str, Path)):
        atoms = mda.Universe(str(atoms))
    elif isinstance(atoms, (list, tuple)) and atoms and all(isinstance(a, (str, Path)) for a in atoms):
        atoms = mda.Universe(*map(str, atoms))
    if isinstance(atoms, mda.Universe):
        return atoms.atoms
    if not isinstance(atoms, mda.AtomGroup):
        kind = type(atoms).__name__
        raise TypeError(f"expected an MDAnalysis AtomGroup, Universe or file names, got {kind}")
    return atoms


def bonds(atoms) -> list[list[int]]:
    """The topology's bonds inside the group: for each atom (group order) its bonded neighbours.

    Raises:
        ValueError: the topology has no bonds (guess them first:
            ``atoms.guess_bonds()``, or ``MDAnalysis.Universe(top, traj,
            to_guess=("bonds",))`` in MDAnalysis >= 2.8).
    """
    ag = atom_group(atoms)
    if not hasattr(ag, "bonds"):
        raise ValueError(
            "the topology has no bonds: load it with bonds (PSF, TPR, PRMTOP, PDB with CONECT) "
            "or guess them first (atoms.guess_bonds(), or MDAnalysis.Universe(..., to_guess=('bonds',)) "
            "in MDAnalysis >= 2.8)"
        )
    local = {int(g): k for k, g in enumerate(ag.indices)}
    out: list[set[int]] = [set() for _ in range(len(ag))]
    for i, j in ag.bonds.indices.tolist():
        if i in local and j in local:  # bonds leaving the group are ignored
            out[local[i]].add(local[j])
            out[local[j]].add(local[i])
    return [sorted(s) for s in out]


def construction_table(atoms) -> ConstructionTable:
    """A forest construction table from the topology's bonds (rules in the module docstring).

    Args:
        atoms: an AtomGroup, Universe or file names (see :func:`atom_group`).

    Returns:
        a :class:`~zmat.ConstructionTable` with one row per atom, in the group's order.

    Raises:
        ValueError: the topology has no bonds, or the group is empty.
    """
    ag = atom_group(atoms)
    if len(ag) == 0:
        raise ValueError("the AtomGroup is empty")
    nbrs = bonds(ag)
    mass = np.asarray(ag.masses, np.float64)
    refs = np.full((len(ag), 3), -1, np.int64)
    seen = np.zeros(len(ag), bool)
    for start in range(len(ag)):
        if not seen[start]:
            _tree(_component(nbrs, start), nbrs, mass, refs, seen)
    return ConstructionTable(refs)


def _component(nbrs: list[list[int]], start: int) -> list[int]:
    comp, stack, got = [], [start], {start}
    while stack:
        i = stack.pop()
        comp.append(i)
        for j in nbrs[i]:
            if j not in got:
                got.add(j)
                stack.append(j)
    return sorted(comp)


def _tree(comp: list[int], nbrs, mass: np.ndarray, refs: np.ndarray, seen: np.ndarray) -> None:
    """Rules 2-4 for one molecule: fill its rows of ``refs``."""

    def heavy_first(atoms):
        return sorted(atoms, key=lambda a: (-mass[a], a))

    def heaviest(atoms):  # BAT's order for the root atoms: ties go to the highest index
        return max(atoms, key=lambda a: (mass[a], a))

    terminal = [a for a in comp if len(nbrs[a]) == 1]
    root = heaviest(terminal or comp)
    parent = {root: -1}
    order = [root]
    seen[root] = True
    if nbrs[root]:
        second = heaviest(nbrs[root])
        rest = [a for a in nbrs[second] if a != root]
        inner = [a for a in rest if len(nbrs[a]) > 1]
        first_children = [second] + ([heaviest(inner or rest)] if rest else [])
        for a, p in zip(first_children, (root, second), strict=False):
            parent[a], seen[a] = p, True
            order.append(a)
    queue = deque(order)
    while queue:  # rule 3: breadth first, heavier neighbours first
        p = queue.popleft()
        for j in heavy_first(nbrs[p]):
            if not seen[j]:
                parent[j], seen[j] = p, True
                order.append(j)
                queue.append(j)
    built: set[int] = set()
    for i in order:
        _row(i, parent, nbrs, heavy_first, built, refs)
        built.add(i)


def _row(i: int, parent: dict, nbrs, heavy_first, built: set[int], refs: np.ndarray) -> None:
    """Rule 4: ``(b, a, d)`` for atom ``i`` from the atoms built before it."""
    b = parent[i]
    if b < 0:
        return
    row = [b]
    for _ in range(2):  # a, then d
        if len(built) <= len(row):  # the second atom has only b, the third only b and a
            break
        up = parent.get(row[-1], -1)
        if up >= 0 and up not in row:
            row.append(up)
            continue
        near = [row[-1], b] if len(row) == 2 else [b]
        cand = [c for x in near for c in heavy_first(nbrs[x]) if c in built and c not in row and c != i]
        if cand:
            row.append(cand[0])
    refs[i, : len(row)] = row


def positions(atoms, start=None, stop=None, step=None, *, dtype=torch.float64, unwrap: bool = True):
    """The group's positions over the trajectory frames ``[start:stop:step]``.

    Args:
        atoms: an AtomGroup, Universe or file names (see :func:`atom_group`).
        start, stop, step: the frame slice.
        dtype: the tensor's dtype.
        unwrap: with a periodic box, make every molecule whole first
            (``AtomGroup.unwrap(compound="fragments", inplace=False)``, which needs
            bonds; the Universe is left as it was).

    Returns:
        ``(F, N, 3)`` tensor in Angstrom (MDAnalysis' length unit).

    Raises:
        ValueError: ``unwrap`` with a periodic box but no bonds.
    """
    ag = atom_group(atoms)
    frames = ag.universe.trajectory[start:stop:step]
    if unwrap and ag.universe.trajectory.ts.dimensions is not None and not hasattr(ag, "bonds"):
        raise ValueError("unwrap=True needs bonds to make molecules whole: guess them, or pass unwrap=False")
    out = np.empty((len(frames), len(ag), 3), np.float64)
    for k, ts in enumerate(frames):
        whole = unwrap and ts.dimensions is not None
        out[k] = ag.unwrap(compound="fragments", inplace=False) if whole else ag.positions
    return torch.as_tensor(out, dtype=dtype)


def flow_coordinates(
    atoms,
    table=None,
    *,
    fixed_atoms=None,
    normalize_angles: bool = False,
    start=None,
    stop=None,
    step=None,
    dtype=torch.float64,
):
    """A trajectory as the flat flow coordinates ``q`` of :class:`zmat.flows.InternalCoordinateTransform`.

    Args:
        atoms: an AtomGroup, Universe or file names (see :func:`atom_group`).
        table: the construction table; default :func:`construction_table` of ``atoms``.
        fixed_atoms, normalize_angles: passed to the transform.
        start, stop, step, dtype: passed to :func:`positions`.

    Returns:
        ``(transform, q)``: the transform and the ``(F, 3 N)`` batch ``transform.inv(xyz)``.
    """
    ag = atom_group(atoms)
    table = construction_table(ag) if table is None else table
    transform = InternalCoordinateTransform(table, fixed_atoms=fixed_atoms, normalize_angles=normalize_angles)
    return transform, transform.inv(positions(ag, start, stop, step, dtype=dtype))
