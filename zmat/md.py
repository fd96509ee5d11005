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
   ``MDAnalysis.analysis.bat.BAT`` chooses by default, except that a third
   atom collinear with the first two in the current frame (within about 0.6
   degrees: the F trans to the root in octahedral SF6) is passed over for the
   next one in that order, since the flow's first three atoms must span a plane.
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

import warnings
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

    A topology that bonds only some atoms (PDB files whose CONECT records cover the
    hetero groups only, as OpenMM and the PDB write them) is completed: the atoms without
    a bond in residues of several atoms get the bonds MDAnalysis guesses from the current
    frame's distances (``DefaultGuesser.guess_bonds``, van der Waals radii), with a
    warning naming them; the topology's own bonds are kept as they are, and an atom
    alone in its residue (an ion) stays unbonded.

    Raises:
        ValueError: the topology has no bonds (guess them first:
            ``atoms.guess_bonds()``, or ``MDAnalysis.Universe(top, traj,
            to_guess=("bonds",))`` in MDAnalysis >= 2.8).
    """
    ag = atom_group(atoms)
    out = _topology_bonds(ag)
    for i, j in _guessed_bonds(ag, out):
        out[i].add(j)
        out[j].add(i)
    return [sorted(s) for s in out]


def _topology_bonds(ag) -> list[set[int]]:
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
    return out


def _guessed_bonds(ag, topology: list[set[int]]) -> list[tuple[int, int]]:
    """Bonds (group indices) guessed for the atoms the topology leaves unbonded in residues of
    several atoms: the guessed bonds with such an atom at one end (a warning names them)."""
    resindex = np.asarray(ag.resindices)
    _, inverse, counts = np.unique(resindex, return_inverse=True, return_counts=True)
    lone = np.array([not s for s in topology]) & (counts[inverse] > 1)
    if not lone.any():
        return []
    from MDAnalysis.guesser.default_guesser import DefaultGuesser

    box = ag.universe.trajectory.ts.dimensions
    pairs = DefaultGuesser(None, box=box).guess_bonds(ag, ag.positions)
    local = {int(g): k for k, g in enumerate(ag.indices)}
    guessed = [(local[int(i)], local[int(j)]) for i, j in pairs]  # atom indices of the Universe
    guessed = [(i, j) for i, j in guessed if lone[i] or lone[j]]
    names = [f"{a.resname}{a.resid}:{a.name}" for a in ag[np.flatnonzero(lone)[:5]]]
    more = f" and {int(lone.sum()) - 5} more" if lone.sum() > 5 else ""
    warnings.warn(
        f"zmat.md: the topology bonds only some atoms; {int(lone.sum())} atoms in residues of several atoms "
        f"have no bond ({', '.join(names)}{more}): {len(guessed)} bonds guessed from distances for them "
        "(load a topology with every bond to silence this)",
        stacklevel=3,
    )
    return guessed


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
    xyz = _current_positions(ag)
    for start in range(len(ag)):
        if not seen[start]:
            _tree(_component(nbrs, start), nbrs, mass, refs, seen, xyz)
    return ConstructionTable(refs)


def _current_positions(ag) -> np.ndarray | None:
    """The group's positions in the current frame, or None without coordinates."""
    try:
        return np.asarray(ag.positions, np.float64)
    except (AttributeError, ValueError):  # MDAnalysis' NoDataError is both
        return None


def _collinear(xyz: np.ndarray | None, i: int, j: int, k: int) -> bool:
    """Whether the angle ``i-j-k`` is within about 0.6 degrees of 0 or 180 (sin^2 < 1e-4)."""
    if xyz is None:
        return False
    u, v = xyz[i] - xyz[j], xyz[k] - xyz[j]
    cross = np.cross(u, v)
    return float(cross @ cross) < 1e-4 * float(u @ u) * float(v @ v)


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


def _tree(comp: list[int], nbrs, mass: np.ndarray, refs: np.ndarray, seen: np.ndarray, xyz=None) -> None:
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
        ranked = sorted(inner, key=lambda a: (mass[a], a), reverse=True)
        ranked += sorted([a for a in rest if a not in inner], key=lambda a: (mass[a], a), reverse=True)
        # BAT's third atom (ranked[0]), unless it is collinear with the first two in the current
        # frame (SF6: the F trans to the root), where the flow's first atoms would be singular
        bent = [a for a in ranked if not _collinear(xyz, root, second, a)]
        first_children = [second] + ((bent or ranked)[:1])
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
            bonds; the Universe is left as it was). Bonds missing from a partial
            topology are guessed as in :func:`bonds` (on a copy of the Universe).

    Returns:
        ``(F, N, 3)`` tensor in Angstrom (MDAnalysis' length unit).

    Raises:
        ValueError: ``unwrap`` with a periodic box but no bonds.
    """
    ag = atom_group(atoms)
    frames = ag.universe.trajectory[start:stop:step]
    if unwrap and ag.universe.trajectory.ts.dimensions is not None and not hasattr(ag, "bonds"):
        raise ValueError("unwrap=True needs bonds to make molecules whole: guess them, or pass unwrap=False")
    if unwrap and ag.universe.trajectory.ts.dimensions is not None:
        ag = _completed(ag)
        frames = ag.universe.trajectory[start:stop:step]
    out = np.empty((len(frames), len(ag), 3), np.float64)
    for k, ts in enumerate(frames):
        whole = unwrap and ts.dimensions is not None
        out[k] = ag.unwrap(compound="fragments", inplace=False) if whole else ag.positions
    return torch.as_tensor(out, dtype=dtype)


def _completed(ag):
    """``ag``, or the same atoms of a copy of its Universe with the bonds :func:`bonds` guesses
    added (so that ``unwrap`` sees whole molecules)."""
    guessed = _guessed_bonds(ag, _topology_bonds(ag))
    if not guessed:
        return ag
    u = ag.universe.copy()
    u.add_bonds([(int(ag.indices[i]), int(ag.indices[j])) for i, j in guessed])
    return u.atoms[ag.indices]


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
