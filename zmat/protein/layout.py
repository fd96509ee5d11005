"""Atom layout of a protein: which atoms, in which order, with which construction rows.

:func:`layout_of` turns a list of residues (names, the atoms each has, and which
consecutive residues are joined by a peptide bond) into one construction table
and everything needed to read torsions off coordinates or to write torsions
into internal coordinates.

Atoms are in template order within each residue (``N, CA, C, O, CB, ...,
OXT``; PDB order), residues in the given order. Rows come from the residue
templates (``topology.py``) when the atoms they name are there, and otherwise
from a fallback that keeps every row ``PROPER`` or ``OFFSET``:

* bond reference (the tree parent): the template's if present; else another
  bonded atom placed earlier (ring closures count); else a *virtual* link to a
  nearby earlier atom (the residue's own, then the previous residue's
  ``C, CA, N``, then the closest earlier atom of depth >= 2);
* angle reference: the parent's parent; dihedral reference: the template's
  sibling when it is usable (``OFFSET``), else the parent's grandparent
  (``PROPER``). The first two atoms of a tree are ``BOND``/``PLANAR`` rows.

Residues flagged ``linked`` hang off the previous residue (through its ``C``
when present), so chain breaks and further chains continue the same tree: a
structure is one rigid tree and reproduced up to one rigid motion. Residues not
linked start a new tree (a forest, used for batches of separate proteins).
Rows across a chain break are exact but not chemical; ``ideal_mask`` marks the
columns whose value is a chemical bond length, bond angle or dihedral of the
canonical row (those :mod:`zmat.protein.build` may replace by ideal values).

Implementation: the residue types are compiled once, by the one template compiler
(``zmat.structure.templates.AMINO``, which the all-atom path's amino-acid templates read
too), into arrays over *atom slots* (template order), every reference being a
``(residue offset, slot)`` pair. A chain is then stamped with numpy (an ``(L, slots)``
atom-index map, fancy indexing), with no Python loop over atoms; only atoms
whose template bond reference is missing (tree roots, missing atoms in a file)
go through the per-atom fallback above.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from .._segments import starts as exclusive_cumsum
from ..structure.templates import (
    AMINO,
    AMINO_TYPE,
    N_SLOTS,
    SLOT_C,
    SLOT_CA,
    SLOT_N,
    SLOT_O,
    SLOTS_PER_RESIDUE,
    TYPES,
)
from ..table import ConstructionTable
from .topology import PRO_DEFAULT_CHI, TORSION_NAMES

__all__ = ["Layout", "layout_of"]

N_TORSIONS = len(TORSION_NAMES)

# ------------------------------------------------ the types' slot arrays
# One compiler: the amino-acid types are compiled once in zmat.structure.templates (AMINO),
# the same arrays every all-atom amino-acid template is read from; the layout stamps them.
# phi, psi, omega have the same (offset, slot) atoms in every type, the chis their own residue's
_BACKBONE_OFFSET, _BACKBONE_SLOT = AMINO.quad_offset[0, :3], AMINO.quad_slot[0, :3]
assert (AMINO.quad_offset[:, :3] == _BACKBONE_OFFSET).all() and (AMINO.quad_offset[:, 3:] == 1).all()
assert (AMINO.quad_slot[:, :3] == _BACKBONE_SLOT).all()
_RESIDUE_NAMES = np.array([t.name for t in TYPES], dtype="U3")  # type -> three-letter name
_LETTERS = np.frombuffer("".join(t.letter for t in TYPES).encode("ascii"), np.uint8)  # type -> code


def _type_of_code() -> np.ndarray:
    """``(256,)`` residue type of each ASCII one-letter code (either case), -1: none."""
    out = np.full(256, -1, np.int64)
    for i, t in enumerate(TYPES):
        out[ord(t.letter)] = out[ord(t.letter.lower())] = i
    return out


_TYPE_OF_CODE = _type_of_code()
_ALL_NAMES = np.array(sorted({a for t in TYPES for a in t.atoms}), dtype="U4")  # every atom name
# slot of each name of _ALL_NAMES in each type, -1 where the type has no such atom
_SLOT_OF_NAME = np.array(
    [[AMINO.slot_of[i].get(str(a), -1) for a in _ALL_NAMES] for i in range(len(TYPES))], np.int64
)


# ------------------------------------------------------------------ Layout
class SharedTensors:
    """Mixin: :meth:`tensor` turns a numpy field into a tensor once per device."""

    def tensor(self, name: str, device: torch.device | str | None = None) -> torch.Tensor:
        """Field ``name`` as a tensor on ``device`` (default CPU), made on the
        first call and then shared by every caller: read it, never write into it."""
        device = torch.device("cpu") if device is None else torch.device(device)
        cache = self.__dict__.setdefault("_tensors", {})  # not a field: frozen dataclasses allow this
        t = cache.get((name, device))
        if t is None:
            t = cache[name, device] = torch.tensor(getattr(self, name), device=device)
        return t


class ProlineRing:
    """Mixin over ``proline_rows`` (``(P, 4)`` atoms CA, CB, CG, CD) and ``torsion_slot``:
    where the prolines' chi1 and chi2 are, and their defaults."""

    @functools.cached_property
    def proline_chi(self) -> np.ndarray:
        """``(2 P,)`` int64 flat torsion indices ``k * 7 + column``: the chi1s, then the chi2s."""
        slot = self.torsion_slot
        return np.concatenate([slot[self.proline_rows[:, 2]], slot[self.proline_rows[:, 3]]])

    @functools.cached_property
    def proline_ring_chi(self) -> np.ndarray:
        """``(2 P,)`` int64 entries ``atom * 3 + 2`` of internal coordinates: the dihedrals
        of CG (chi1), then of CD (chi2)."""
        return np.concatenate([self.proline_rows[:, 2], self.proline_rows[:, 3]]) * 3 + 2

    @functools.cached_property
    def proline_cd_angle(self) -> np.ndarray:
        """``(P,)`` int64 entries ``atom * 3 + 1``: the bond angles CB-CG-CD."""
        return self.proline_rows[:, 3] * 3 + 1

    @functools.cached_property
    def proline_chi_default(self) -> np.ndarray:
        """``(2 P,)`` float64 ``PRO_DEFAULT_CHI`` at ``proline_chi``."""
        return np.repeat(np.array(PRO_DEFAULT_CHI), len(self.proline_rows))


@dataclass(frozen=True, eq=False)
class Layout(SharedTensors, ProlineRing):
    """Atoms, construction table and torsion bookkeeping of a protein.

    Immutable: layouts are cached and shared (``protein_layout``), so the
    fields cannot be reassigned, their numpy arrays are read-only, and the
    tensors of :meth:`tensor` are shared (do not write into them). Use
    ``dataclasses.replace`` for a changed copy.

    Attributes (N atoms, L residues):
        res_names: ``(L,)`` three-letter residue names.
        atom_names, elements: ``(N,)`` string arrays.
        residue_index: ``(N,)`` int64, index of each atom's residue.
        refs: ``(N, 3)`` int64 construction rows; ``table`` the validated table.
        bonds: ``(E, 2)`` int64 covalent bonds: intra-residue (ring closures
            included), peptide bonds, and any ``extra_bonds`` given.
        ideal: ``(N, 3)`` float64 ideal ``(r, theta, phi)`` of each atom's
            canonical row (``phi`` NaN where a torsion goes).
        ideal_mask: ``(N, 3)`` bool, True where the row's column is the
            canonical one (same references, real bonds), so the ideal value or
            a torsion applies.
        torsion_slot: ``(N,)`` int64, ``k * 7 + t`` for the torsion ``t`` of
            residue ``k`` that is atom's dihedral, -1 for none.
        torsion_atoms: ``(L, 7, 4)`` int64 atoms of each torsion (IUPAC order,
            ``TORSION_NAMES`` order), -1 where undefined.
        bonded: ``(L,)`` bool, True where residue ``k`` has a peptide bond to
            residue ``k - 1``.
    """

    res_names: np.ndarray
    atom_names: np.ndarray
    elements: np.ndarray
    residue_index: np.ndarray
    refs: np.ndarray
    bonds: np.ndarray
    ideal: np.ndarray
    ideal_mask: np.ndarray
    torsion_slot: np.ndarray
    torsion_atoms: np.ndarray
    bonded: np.ndarray

    def __post_init__(self) -> None:
        for f in fields(self):
            getattr(self, f.name).flags.writeable = False

    @property
    def n_atoms(self) -> int:
        return len(self.atom_names)

    @property
    def n_residues(self) -> int:
        return len(self.res_names)

    @functools.cached_property
    def table(self) -> ConstructionTable:
        return ConstructionTable(self.refs)

    @functools.cached_property
    def proline_rows(self) -> np.ndarray:
        """``(P, 4)`` int64 atoms CA, CB, CG, CD of the prolines whose ring rows are the
        canonical ones (CA's bond to N, CB's length and angle, CG's chi1 row, CD's chi2
        row): where ``zmat.protein.build`` closes the ring."""
        cg, cd = ring_atoms(self.torsion_slot, self.res_names == "PRO")
        cb, ca = self.refs[cg, 0], self.refs[cg, 1]
        ok = self.ideal_mask[ca, 0] & self.ideal_mask[cb, 1]
        return np.stack([ca, cb, cg, cd], 1)[ok]


def ring_atoms(torsion_slot: np.ndarray, is_pro: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CG and CD (the atoms whose dihedrals are chi1 and chi2) of the residues flagged
    ``is_pro`` ``(L,)`` that have both, from a layout's ``torsion_slot``."""
    atom_of = np.full(len(is_pro) * N_TORSIONS, -1, np.int64)
    has = np.flatnonzero(torsion_slot >= 0)
    atom_of[torsion_slot[has]] = has
    pro = np.flatnonzero(is_pro) * N_TORSIONS
    cg, cd = atom_of[pro + TORSION_NAMES.index("chi1")], atom_of[pro + TORSION_NAMES.index("chi2")]
    ok = (cg >= 0) & (cd >= 0)
    return cg[ok], cd[ok]


# ------------------------------------------------------- residue names, codes
def residue_types(res_names: Sequence[str]) -> np.ndarray:
    """``(L,)`` int64 residue types (``AA3`` indices) of three-letter names.

    Raises:
        ValueError: for an unknown residue name.
    """
    types = np.fromiter((AMINO_TYPE.get(r, -1) for r in res_names), np.int64, len(res_names))
    if (types < 0).any():
        k = int(np.argmax(types < 0))
        raise ValueError(f"residue {k}: {res_names[k]!r} is not one of the 20 standard amino acids")
    return types


def sequence_types(sequence: str) -> np.ndarray | None:
    """``(L,)`` residue types of a one-letter sequence, None if it has a letter
    that is not one of the 20 standard amino acids (or is not ASCII)."""
    try:
        codes = np.frombuffer(sequence.encode("ascii"), np.uint8)
    except UnicodeEncodeError:
        return None
    types = _TYPE_OF_CODE[codes]
    return None if (types < 0).any() else types


def sequence_of(types: np.ndarray) -> str:
    """The one-letter sequence (upper case) of residue types."""
    return _LETTERS[types].tobytes().decode("ascii")


def template_slots(types: np.ndarray, names: np.ndarray) -> np.ndarray:
    """``(n,)`` slot of each atom name in its residue's template (``types``:
    the residue type of each atom), -1 where the template has no such atom."""
    nid = np.minimum(np.searchsorted(_ALL_NAMES, names), len(_ALL_NAMES) - 1)
    return np.where(_ALL_NAMES[nid] == names, _SLOT_OF_NAME[types, nid], -1)


# ------------------------------------------------------------------ layouts
def layout_of(
    res_names: Sequence[str],
    present: Sequence[Sequence[str]] | None = None,
    bonded: Sequence[bool] | None = None,
    linked: Sequence[bool] | None = None,
    extra_bonds: np.ndarray | None = None,
) -> Layout:
    """Build the :class:`Layout` of a list of residues.

    Args:
        res_names: ``L`` three-letter names of standard residues.
        present: per residue, the heavy-atom names it has (any order; names
            not in the template are ignored). Default: every template atom,
            with ``OXT`` only on the last residue of each peptide-bonded run.
        bonded: ``(L,)`` bools, residue ``k`` peptide-bonded to ``k - 1``
            (``bonded[0]`` is ignored). Default: all True.
        linked: ``(L,)`` bools, residue ``k`` continues the tree of ``k - 1``.
            Default: all True (one tree); batches pass False at each protein's
            start (a forest).
        extra_bonds: optional ``(E, 2)`` atom-index pairs added to ``bonds``
            (disulfides).

    Raises:
        ValueError: for an unknown residue name.

    Example:
        >>> lay = layout_of(["GLY", "ALA"])
        >>> lay.atom_names.tolist()
        ['N', 'CA', 'C', 'O', 'N', 'CA', 'C', 'O', 'CB', 'OXT']
    """
    types = residue_types(res_names)
    have = None
    if present is not None:
        if len(present) != len(types):
            raise ValueError(f"present has {len(present)} entries for {len(types)} residues")
        have = np.zeros((len(types), N_SLOTS), bool)
        for k, names in enumerate(present):
            slots = AMINO.slot_of[types[k]]
            have[k, [slots[x] for x in names if x in slots]] = True
    return layout_from_types(types, have, bonded, linked, extra_bonds)


def layout_from_types(
    types: np.ndarray,
    present: np.ndarray | None = None,
    bonded: Sequence[bool] | None = None,
    linked: Sequence[bool] | None = None,
    extra_bonds: np.ndarray | None = None,
) -> Layout:
    """:func:`layout_of` of residue types (:func:`residue_types`), with ``present``
    an optional ``(L, slots)`` bool array over template slots (atoms in
    template order)."""
    types = np.asarray(types, np.int64)
    bonded, linked = _links(len(types), bonded, linked)
    next_bonded = np.append(bonded[1:], False)
    t = amino_tree(types, present, linked, next_bonded)
    atoms, ref, o, oxt = t.atoms, t.ref, t.o, t.oxt
    same = bool((bonded == linked).all())
    starts_bonded = t.starts_linked if same else _neighbor_starts(bonded, next_bonded)
    # canonical rows resolved over peptide-bonded residues (the chemistry)
    can = ref.copy() if same else _resolve_rows(atoms, starts_bonded)
    refs = t.refs
    can[o, 2] = oxt
    ideal_mask, torsion_slot = _canonical_columns(atoms, refs, can)
    return Layout(
        res_names=_RESIDUE_NAMES[types],
        atom_names=np.take(AMINO.atom_name, atoms.tslot),
        elements=np.take(AMINO.element, atoms.tslot),
        residue_index=atoms.res_of,
        refs=refs,
        bonds=_bonds(atoms, starts_bonded, extra_bonds),
        ideal=np.take(AMINO.ideal, atoms.tslot, 0),
        ideal_mask=ideal_mask,
        torsion_slot=torsion_slot,
        torsion_atoms=_torsion_atoms(atoms, starts_bonded),
        bonded=bonded,
    )


@dataclass(frozen=True)
class AminoTree:
    """The amino-acid rows of one chain of residues, the one rule both views stamp
    (``Protein``'s layout and ``zmat.structure.allatom``'s amino acids): ``atoms``
    (:class:`_Atoms`), ``ref`` ``(n, 3)`` the canonical rows resolved over linked residues,
    ``parent`` ``(n,)`` the tree parents (the template's, else the module docstring's
    fallback), ``refs`` ``(n, 3)`` the construction rows, ``o`` / ``oxt`` the ``O`` atoms with
    an ``OXT`` and those, ``starts_linked`` (:func:`_neighbor_starts` over ``linked``)."""

    atoms: _Atoms
    starts_linked: np.ndarray
    ref: np.ndarray
    parent: np.ndarray
    refs: np.ndarray
    o: np.ndarray
    oxt: np.ndarray


def amino_tree(types: np.ndarray, present, linked: np.ndarray, next_bonded: np.ndarray) -> AminoTree:
    """:class:`AminoTree` of residue ``types`` ``(L,)`` with ``present`` (``(L, slots)`` bool or
    None: every atom, ``OXT`` where ``next_bonded`` is False) and ``linked`` ``(L,)`` (residue
    ``k`` continues the tree of ``k - 1``; ``linked[0]`` False)."""
    next_linked = np.append(linked[1:], False)
    atoms = _place_atoms(types, present, next_bonded)
    starts_linked = _neighbor_starts(linked, next_linked)
    ref = _resolve_rows(atoms, starts_linked)
    parent = _tree_parents(atoms, ref[:, 0], linked, next_linked)
    o, oxt = _o_with_oxt(atoms)
    refs = _construction_rows(atoms, parent, ref, o, oxt)
    return AminoTree(atoms, starts_linked, ref, parent, refs, o, oxt)


@dataclass(frozen=True)
class _Atoms:
    """Which slots of a chain of residue ``types`` hold atoms.

    ``have`` ``(L, W)`` bool; ``amap`` ``((L + 1) W,)``: entry ``k * W + slot``
    is the atom index of residue ``k``'s slot, -1 for none (residue ``L`` is a
    residue that never has atoms); per atom, its residue ``res_of``, ``slot``
    and template slot ``tslot = type * W + slot``.
    """

    types: np.ndarray
    have: np.ndarray
    amap: np.ndarray
    res_of: np.ndarray
    slot: np.ndarray
    tslot: np.ndarray

    @property
    def n(self) -> int:
        return len(self.res_of)

    @property
    def L(self) -> int:
        return len(self.types)


def _links(L: int, bonded, linked) -> tuple[np.ndarray, np.ndarray]:
    """``(L,)`` peptide-bonded and linked flags (defaults: all True); residue 0
    is neither, and a peptide bond implies the same tree."""
    bonded = np.ones(L, bool) if bonded is None else np.asarray(bonded, bool).copy()
    linked = np.ones(L, bool) if linked is None else np.asarray(linked, bool).copy()
    if L:
        bonded[0] = False
        linked[0] = False
    bonded &= linked
    return bonded, linked


def _place_atoms(types: np.ndarray, present, next_bonded: np.ndarray) -> _Atoms:
    """Atoms in template order within each residue; default: every template
    atom, ``OXT`` only where no peptide bond follows."""
    L, W = len(types), SLOTS_PER_RESIDUE
    have = np.take(AMINO.has_slot, types, 0)
    if present is None:
        have[np.arange(L), AMINO.oxt_slot[types]] = ~next_bonded
    else:
        have[:, :N_SLOTS] &= np.asarray(present, bool)[:, :N_SLOTS]
    flat = np.flatnonzero(have)  # residues in order, template order within
    res_of = flat // W
    tslot = flat + ((types - np.arange(L)) * W)[res_of]
    amap = np.full((L + 1) * W, -1, np.int64)
    amap[flat] = np.arange(len(flat))
    return _Atoms(types, have, amap, res_of, flat - res_of * W, tslot)


def _neighbor_starts(link: np.ndarray, next_link: np.ndarray) -> np.ndarray:
    """``(3 L,)``: entry ``k * 3 + offset + 1`` is where the slots of the residue
    at ``offset`` (-1, 0, +1) from ``k`` start in the atom map, residue ``L``'s
    (no atoms) where that neighbour is not joined to ``k``."""
    L = len(link)
    ar = np.arange(L)
    r = np.empty((L, 3), np.int64)
    r[:, 0] = np.where(link, ar - 1, L)
    r[:, 1] = ar
    r[:, 2] = np.where(next_link, ar + 1, L)
    return r.ravel() * SLOTS_PER_RESIDUE


def _resolve_rows(atoms: _Atoms, starts: np.ndarray) -> np.ndarray:
    """``(n, 3)`` atoms of every atom's canonical row, -1 where absent or in a
    residue not joined (``starts``: :func:`_neighbor_starts`)."""
    at_row = np.take(AMINO.ref_offset, atoms.tslot, 0) + (atoms.res_of * 3)[:, None]
    return atoms.amap[starts[at_row] + np.take(AMINO.ref_slot, atoms.tslot, 0)]


def _tree_parents(atoms: _Atoms, template_parent: np.ndarray, linked, next_linked) -> np.ndarray:
    """``(n,)`` bond reference of every atom: the template's when present, else
    the fallback of the module docstring (every parent precedes its child)."""
    parent = template_parent.copy()
    orphans = np.flatnonzero(parent < 0)
    if len(orphans) > 1 or len(orphans) == 1 and orphans[0] > 0:
        counts = atoms.have.sum(1)
        first = exclusive_cumsum(counts)
        group_start = np.maximum.accumulate(np.where(~linked & (counts > 0), first, 0))
        _fallback_parents(orphans, parent, atoms, linked, next_linked, group_start)
    return parent


def _fallback_parents(orphans, parent, atoms: _Atoms, linked, next_linked, group_start) -> None:
    """Bond references of the atoms whose template reference is missing, in
    atom order (``parent`` is updated in place): another bonded atom placed
    earlier, else a virtual link (see the module docstring)."""
    L, W = atoms.L, SLOTS_PER_RESIDUE

    def depth(q: int) -> int:  # capped at 2, all the virtual links need
        d = 0
        while d < 2 and parent[q] >= 0:
            q, d = parent[q], d + 1
        return d

    def at(k: int, off: int, sl: int) -> int:
        if off < 0 and not linked[k] or off > 0 and not next_linked[k]:
            return -1
        return int(atoms.amap[(k + off) * W + sl]) if 0 <= k + off < L else -1

    for v in orphans.tolist():
        k, (t, j) = int(atoms.res_of[v]), divmod(int(atoms.tslot[v]), W)
        p = -1
        for off, sl in AMINO.neighbors[t][j]:
            q = at(k, off, sl)
            if 0 <= q < v:
                p = q
                break
        gs = int(group_start[k])
        if p < 0 and v > gs:
            cands = [at(k, 0, x) for x in (SLOT_C, SLOT_CA, SLOT_N)]
            if k > 0 and linked[k]:
                cands += [at(k, -1, x) for x in (SLOT_C, SLOT_CA, SLOT_N)]
            for q in cands:
                if gs <= q < v and depth(q) >= 2:
                    p = q
                    break
            else:
                for q in range(v - 1, gs - 1, -1):
                    if depth(q) >= 2:
                        p = q
                        break
                else:
                    p = v - 1
        parent[v] = p


def _o_with_oxt(atoms: _Atoms) -> tuple[np.ndarray, np.ndarray]:
    """The ``O`` atoms whose residue has ``OXT``, and those ``OXT`` (the
    dihedral reference of such an ``O``)."""
    o = np.flatnonzero(atoms.slot == SLOT_O)
    k = atoms.res_of[o]
    oxt = atoms.amap[k * SLOTS_PER_RESIDUE + AMINO.oxt_slot[atoms.types[k]]]
    return o[oxt >= 0], oxt[oxt >= 0]


def _construction_rows(atoms: _Atoms, parent, ref, o, oxt) -> np.ndarray:
    """``(n, 3)`` rows: parent, grandparent and dihedral reference, the
    parent's grandparent (PROPER) or a usable sibling (OFFSET)."""
    par = np.append(parent, -1)  # par[-1] == -1
    grand = par[parent]
    great = par[grand]
    depth = (parent >= 0).astype(np.int64) + (grand >= 0) + (great >= 0)  # capped at 3
    d = great.copy()
    # depth 2: one PLANAR child, its siblings OFFSET on it
    two = np.flatnonzero((grand >= 0) & (great < 0))
    planar_child = np.full(atoms.n, -1, np.int64)
    firsts, at = np.unique(parent[two], return_index=True)
    planar_child[firsts] = two[at]
    pc = planar_child[parent[two]]
    d[two] = np.where(pc == two, -1, pc)
    grand = _root_siblings(parent, grand, d, two, planar_child)
    # OFFSET on the template's sibling when usable (O: on OXT when present)
    oxt_of = np.full(atoms.n, -1, np.int64)
    oxt_of[o] = oxt
    sibling = AMINO.sibling_dihedral[atoms.tslot]
    cand = np.flatnonzero(sibling & (great >= 0))
    s = np.where(oxt_of[cand] >= 0, oxt_of[cand], ref[cand, 2])
    p = parent[cand]
    ok = (s >= 0) & (par[s] == p) & ~sibling[s] & ((depth[s] >= 3) | (planar_child[p] == s))
    d[cand[ok]] = s[ok]
    return np.column_stack([parent, grand, d])


def _root_siblings(parent, grand, d, two, planar_child) -> np.ndarray:
    """Rows under a root with several children (a residue without ``N`` starting a tree).
    Only the first child ``c1`` is a ``BOND`` row and only its first child a ``PLANAR``
    one: a later child of the root gets ``(root, c1, PLANAR child of c1)`` (or, when ``c1``
    has none, the second child ``(root, c1, -1)`` and the later ones ``d`` = that second
    child); a child of a later child gets ``(b, root, c1)``. ``two``: the atoms of depth 2.
    Updates ``d``; returns the angle column."""
    one = np.flatnonzero((parent >= 0) & (grand < 0))
    if len(one) == len(np.unique(parent[one])):
        return grand  # every root has one child: nothing to do
    grand = grand.copy()
    roots, first = np.unique(parent[one], return_index=True)
    c1 = np.full(len(parent), -1, np.int64)
    c1[roots] = one[first]
    two = two[parent[two] != c1[grand[two]]]  # under a later child of the root
    later = one[c1[parent[one]] != one]
    a = c1[parent[later]]
    grand[later] = a
    pc = planar_child[a]
    second = np.full(len(parent), -1, np.int64)  # per root, its second child (used where pc < 0)
    r2, i2 = np.unique(parent[later], return_index=True)
    second[r2] = later[i2]
    s2 = second[parent[later]]
    d[later] = np.where(pc >= 0, pc, np.where(s2 == later, -1, s2))
    d[two] = c1[grand[two]]
    return grand


def _canonical_columns(atoms: _Atoms, refs, can) -> tuple[np.ndarray, np.ndarray]:
    """``ideal_mask`` (the row's columns that are the canonical ones) and
    ``torsion_slot`` (see :class:`Layout`)."""
    ideal_mask = (can >= 0) & (refs == can)
    ideal_mask[:, 1] &= ideal_mask[:, 0]
    ideal_mask[:, 2] &= ideal_mask[:, 1]
    tors = AMINO.torsion_code[atoms.tslot]
    torsion_slot = np.where((tors >= 0) & ideal_mask[:, 2], (atoms.res_of - 1) * N_TORSIONS + tors, -1)
    return ideal_mask, torsion_slot


def _torsion_atoms(atoms: _Atoms, starts_bonded: np.ndarray) -> np.ndarray:
    """``(L, 7, 4)`` atoms of each torsion, -1 where some atom is missing or the
    residues are not peptide-bonded."""
    near = starts_bonded.reshape(-1, 3)  # where the previous, own and next residue's slots start
    tat = np.empty((atoms.L, N_TORSIONS, 4), np.int64)
    tat[:, :3] = atoms.amap[near[:, _BACKBONE_OFFSET] + _BACKBONE_SLOT]
    tat[:, 3:] = atoms.amap[near[:, 1, None, None] + np.take(AMINO.quad_slot[:, 3:], atoms.types, 0)]
    undefined = (tat[..., 0] | tat[..., 1] | tat[..., 2] | tat[..., 3]) < 0  # some atom is -1
    tat[undefined] = -1
    return tat


def _bonds(atoms: _Atoms, starts_bonded: np.ndarray, extra_bonds) -> np.ndarray:
    """``(E, 2)`` per residue the template's bonds (both atoms present), then
    the peptide bond; then ``extra_bonds``."""
    at3 = (np.arange(atoms.L) * 3)[:, None, None]
    off = np.take(AMINO.bond_offset, atoms.types, 0)
    pairs = atoms.amap[starts_bonded[at3 + off] + np.take(AMINO.bond_slot, atoms.types, 0)]
    pairs = pairs.reshape(-1, 2)
    bonds = np.compress((pairs[:, 0] >= 0) & (pairs[:, 1] >= 0), pairs, axis=0)
    if extra_bonds is not None and len(extra_bonds):
        bonds = np.concatenate([bonds, np.asarray(extra_bonds, np.int64).reshape(-1, 2)])
    return bonds
