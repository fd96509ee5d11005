"""Atom layout of a protein: which atoms, in which order, with which construction rows.

:func:`layout` turns a list of residues (names, the atoms each has, and which
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

Implementation: per residue type, the templates are compiled once into arrays
over *atom slots* (template order), every reference being a ``(residue
offset, slot)`` pair. A chain is then stamped with numpy (an ``(L, slots)``
atom-index map, fancy indexing), with no Python loop over atoms; only atoms
whose template bond reference is missing (tree roots, missing atoms in a file)
go through the per-atom fallback above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..table import ConstructionTable
from .topology import AA3, CHI_ATOMS, OMEGA, PHI, PSI, RESIDUES, TORSION_NAMES

__all__ = ["Layout", "layout"]

N_TORSIONS = len(TORSION_NAMES)


# ------------------------------------------------ templates compiled to slots
def _sibling_type(template) -> set[str]:
    """Atoms whose canonical dihedral reference is a sibling (OFFSET rows)."""
    rows = dict(zip(template.atoms, template.rows, strict=True))
    out = {"O", "CB"}
    for at, (b, _, d) in rows.items():
        if at in ("N", "CA", "C", "O", "CB", "OXT"):
            continue
        if rows[b][1] != d:
            out.add(at)
    return out


#: Residue types in ``AA3`` order; ``_TYPE`` maps a three-letter name to its type.
_TYPES = tuple(RESIDUES[name] for name in AA3)
_TYPE = {t.name: i for i, t in enumerate(_TYPES)}
_N_TYPES = len(_TYPES)
_N_SLOTS = max(len(t.atoms) for t in _TYPES)
#: Slots per residue in the atom maps: one more, ``_NONE``, that never holds an atom.
_W = _N_SLOTS + 1
_NONE = _N_SLOTS
_SN, _SCA, _SC, _SO = 0, 1, 2, 3  # every template starts N, CA, C, O
assert all(t.atoms[:4] == ("N", "CA", "C", "O") and t.atoms[-1] == "OXT" for t in _TYPES)

_RES_NAMES = np.array(AA3, dtype="U3")
_OXT = np.array([len(t.atoms) - 1 for t in _TYPES], np.int64)  # slot of OXT
_HAS = np.zeros((_N_TYPES, _W), bool)  # slot exists in the template
# Per template slot, flat index ``type * _W + slot``:
_NAMES = np.full(_N_TYPES * _W, "", "U4")
_ELEMENTS = np.full(_N_TYPES * _W, "", "U2")
_OFF1 = np.ones((_N_TYPES * _W, 3), np.int64)  # canonical row: residue offset + 1
_SL = np.full((_N_TYPES * _W, 3), _NONE, np.int64)  # ... and slot
_IDEAL = np.full((_N_TYPES * _W, 3), np.nan)
_TORS = np.full(_N_TYPES * _W, -1, np.int64)  # (offset + 1) * 7 + torsion of the dihedral, -1: none
_SIB = np.zeros(_N_TYPES * _W, bool)  # canonical dihedral reference is a sibling
_CHI = np.full((_N_TYPES, 4, 4), _NONE, np.int64)  # slots of chi1..chi4
# intra-residue bonds, then the peptide bond to the previous residue, as (offset + 1, slot)
_N_BONDS = max(len(t.bonds) for t in _TYPES) + 1
_BOND_OFF1 = np.ones((_N_TYPES, _N_BONDS, 2), np.int64)
_BOND_SL = np.full((_N_TYPES, _N_BONDS, 2), _NONE, np.int64)
_SLOT: list[dict[str, int]] = []  # name -> slot, per type
#: Fallback bond references (other bonded atoms) as (offset, slot), per type and slot.
_NEIGHBORS: list[list[list[tuple[int, int]]]] = []


def _spec(t, spec: str) -> tuple[int, int]:
    """``"-C"`` -> ``(-1, slot of C)``; ``""`` -> ``(0, _NONE)``."""
    if not spec:
        return 0, _NONE
    off = {"-": -1, "+": 1}.get(spec[0], 0)
    return off, t.index(spec[1:] if off else spec)


for _i, _t in enumerate(_TYPES):
    _n, _f = len(_t.atoms), _i * _W
    _SLOT.append({a: j for j, a in enumerate(_t.atoms)})
    _NAMES[_f : _f + _n] = _t.atoms
    _ELEMENTS[_f : _f + _n] = _t.elements
    _HAS[_i, :_n] = True
    _IDEAL[_f : _f + _n] = _t.ideal
    _sib = _sibling_type(_t)
    for _j, _a in enumerate(_t.atoms):
        for _c, _s in enumerate(_t.rows[_j]):
            _o, _SL[_f + _j, _c] = _spec(_t, _s)
            _OFF1[_f + _j, _c] = _o + 1
        if _t.torsion[_j] is not None:
            _TORS[_f + _j] = (_t.torsion[_j][1] + 1) * N_TORSIONS + _t.torsion[_j][0]
        _SIB[_f + _j] = _a in _sib
    for _c, _quad in enumerate(CHI_ATOMS[_t.name]):
        _CHI[_i, _c] = [_t.index(x) for x in _quad]
    for _j, (_x, _y) in enumerate(_t.bonds):
        _BOND_SL[_i, _j] = (_t.index(_x), _t.index(_y))
    _BOND_OFF1[_i, -1], _BOND_SL[_i, -1] = (0, 1), (_SC, _SN)  # -C, N
    _nb: dict[str, list[str]] = {a: [] for a in _t.atoms}
    for _x, _y in _t.bonds:
        _nb[_x].append(_y)
        _nb[_y].append(_x)
    _nb["N"].insert(0, "-C")
    _nb["C"].append("+N")
    _NEIGHBORS.append([[_spec(_t, s) for s in _nb[a]] for a in _t.atoms])

_ALL_NAMES = np.array(sorted({a for t in _TYPES for a in t.atoms}), dtype="U4")
#: Slot of each name of ``_ALL_NAMES`` in each type, -1 where the type has no such atom.
_SLOT_OF_NAME = np.array([[_SLOT[i].get(str(a), -1) for a in _ALL_NAMES] for i in range(_N_TYPES)], np.int64)
_SEQ_TYPE = np.full(256, -1, np.int64)  # ASCII one-letter code -> type
_LETTERS = np.frombuffer("".join(t.letter for t in _TYPES).encode("ascii"), np.uint8)  # type -> code
for _i, _t in enumerate(_TYPES):
    _SEQ_TYPE[ord(_t.letter)] = _SEQ_TYPE[ord(_t.letter.lower())] = _i


@dataclass
class Layout:
    """Atoms, construction table and torsion bookkeeping of a protein.

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
    _table: ConstructionTable | None = field(default=None, repr=False)

    @property
    def n_atoms(self) -> int:
        return len(self.atom_names)

    @property
    def n_residues(self) -> int:
        return len(self.res_names)

    @property
    def table(self) -> ConstructionTable:
        if self._table is None:
            self._table = ConstructionTable(self.refs)
        return self._table


def layout(
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
    """
    types = residue_types(res_names)
    have = None
    if present is not None:
        if len(present) != len(types):
            raise ValueError(f"present has {len(present)} entries for {len(types)} residues")
        have = np.zeros((len(types), _N_SLOTS), bool)
        for k, names in enumerate(present):
            slots = _SLOT[types[k]]
            have[k, [slots[x] for x in names if x in slots]] = True
    return layout_from_types(types, have, bonded, linked, extra_bonds)


def residue_types(res_names: Sequence[str]) -> np.ndarray:
    """``(L,)`` int64 residue types (``AA3`` indices) of three-letter names.

    Raises:
        ValueError: for an unknown residue name.
    """
    types = np.fromiter((_TYPE.get(r, -1) for r in res_names), np.int64, len(res_names))
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
    types = _SEQ_TYPE[codes]
    return None if (types < 0).any() else types


def layout_from_types(
    types: np.ndarray,
    present: np.ndarray | None = None,
    bonded: Sequence[bool] | None = None,
    linked: Sequence[bool] | None = None,
    extra_bonds: np.ndarray | None = None,
) -> Layout:
    """:func:`layout` of residue types (:func:`residue_types`), with ``present``
    an optional ``(L, slots)`` bool array over template slots (atoms in
    template order)."""
    types = np.asarray(types, np.int64)
    L = len(types)
    ar_L = np.arange(L)
    bonded_ = np.ones(L, bool) if bonded is None else np.asarray(bonded, bool).copy()
    linked_ = np.ones(L, bool) if linked is None else np.asarray(linked, bool).copy()
    if L:
        bonded_[0] = False
        linked_[0] = False
    bonded_ &= linked_  # a peptide bond implies the same tree
    nxt_bonded = np.append(bonded_[1:], False)  # residue k + 1 bonded to k
    nxt_linked = np.append(linked_[1:], False)

    # ---- atoms, in template order: amap[k * _W + slot] is the atom index or -1
    have = np.take(_HAS, types, 0)
    if present is None:
        have[ar_L, _OXT[types]] = ~nxt_bonded
    else:
        have[:, :_N_SLOTS] &= np.asarray(present, bool)[:, :_N_SLOTS]
    flat = np.flatnonzero(have)  # residues in order, template order within
    n = len(flat)
    res_of = flat // _W
    slot = flat - res_of * _W
    ts = flat + ((types - ar_L) * _W)[res_of]  # template slot: type * _W + slot
    amap = np.full((L + 1) * _W, -1, np.int64)  # residue L: none
    amap[flat] = np.arange(n)
    res3 = res_of * 3

    def rows(link: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """``[k * 3 + offset + 1]``: where the slots of the residue at ``offset``
        from ``k`` start in ``amap`` (residue L's, none, if not linked)."""
        r = np.empty((L, 3), np.int64)
        r[:, 0] = np.where(link, ar_L - 1, L)
        r[:, 1] = ar_L
        r[:, 2] = np.where(nxt, ar_L + 1, L)
        return r.ravel() * _W

    rows_link = rows(linked_, nxt_linked)
    same = bool((bonded_ == linked_).all())
    rows_bond = rows_link if same else rows(bonded_, nxt_bonded)
    # canonical rows as (offset + 1, slot) -> their atoms, resolved over linked
    # residues (``ref``) and over peptide-bonded ones (``can``)
    at_row = np.take(_OFF1, ts, 0) + res3[:, None]
    sl = np.take(_SL, ts, 0)
    ref = amap[rows_link[at_row] + sl]
    can = ref.copy() if same else amap[rows_bond[at_row] + sl]

    # ---- tree parents (every parent precedes its child)
    parent = ref[:, 0].copy()
    orphans = np.flatnonzero(parent < 0)
    if len(orphans) > 1 or len(orphans) == 1 and orphans[0] > 0:
        counts = have.sum(1)
        first = np.cumsum(counts) - counts
        group_start = np.maximum.accumulate(np.where(~linked_ & (counts > 0), first, 0))
        _fallback_parents(orphans, parent, res_of, ts, amap, linked_, nxt_linked, group_start, L)

    # ---- rows
    par = np.append(parent, -1)  # par[-1] == -1
    grand = par[parent]
    great = par[grand]
    depth = (parent >= 0).astype(np.int64) + (grand >= 0) + (great >= 0)  # capped at 3
    d = great.copy()
    # depth 2: one PLANAR child, its siblings OFFSET on it
    two = np.flatnonzero((grand >= 0) & (great < 0))
    planar_child = np.full(n, -1, np.int64)
    firsts, at = np.unique(parent[two], return_index=True)
    planar_child[firsts] = two[at]
    pc = planar_child[parent[two]]
    d[two] = np.where(pc == two, -1, pc)
    # OFFSET on the template's sibling when usable (O: on OXT when present)
    o = np.flatnonzero(slot == _SO)
    oxt = amap[res_of[o] * _W + _OXT[types[res_of[o]]]]
    o, oxt = o[oxt >= 0], oxt[oxt >= 0]
    oxt_of = np.full(n, -1, np.int64)
    oxt_of[o] = oxt
    cand = np.flatnonzero(_SIB[ts] & (great >= 0))
    s = ref[cand, 2]
    s = np.where(oxt_of[cand] >= 0, oxt_of[cand], s)
    p = parent[cand]
    ok = (s >= 0) & (par[s] == p) & ~_SIB[ts[s]] & ((depth[s] >= 3) | (planar_child[p] == s))
    d[cand[ok]] = s[ok]
    refs = np.column_stack([parent, grand, d])

    # ---- canonical rows, ideal values, torsion slots
    can[o, 2] = oxt
    ideal_mask = (can >= 0) & (refs == can)
    ideal_mask[:, 1] &= ideal_mask[:, 0]
    ideal_mask[:, 2] &= ideal_mask[:, 1]
    tors = _TORS[ts]
    torsion_slot = np.where((tors >= 0) & ideal_mask[:, 2], (res_of - 1) * N_TORSIONS + tors, -1)

    # ---- torsion atoms
    A = amap.reshape(L + 1, _W)
    prv = rows_bond[0::3] // _W  # previous residue if peptide-bonded, else L
    nx = rows_bond[2::3] // _W
    tat = np.empty((L, N_TORSIONS, 4), np.int64)
    tat[:, PHI, 0] = A[prv, _SC]
    tat[:, PHI, 1:] = tat[:, PSI, :3] = A[:L, :3]
    tat[:, PSI, 3] = tat[:, OMEGA, 2] = A[nx, _SN]
    tat[:, OMEGA, :2] = A[:L, 1:3]
    tat[:, OMEGA, 3] = A[nx, _SCA]
    tat[:, 3:] = amap[(ar_L * _W)[:, None, None] + np.take(_CHI, types, 0)]
    undefined = (tat[..., 0] | tat[..., 1] | tat[..., 2] | tat[..., 3]) < 0  # some atom is -1
    tat[undefined] = -1

    # ---- bonds: per residue, the template's (both atoms present), then the peptide bond
    at3 = (ar_L * 3)[:, None, None]
    pairs = amap[rows_bond[at3 + np.take(_BOND_OFF1, types, 0)] + np.take(_BOND_SL, types, 0)]
    pairs = pairs.reshape(-1, 2)
    bonds_arr = np.compress((pairs[:, 0] >= 0) & (pairs[:, 1] >= 0), pairs, axis=0)
    if extra_bonds is not None and len(extra_bonds):
        bonds_arr = np.concatenate([bonds_arr, np.asarray(extra_bonds, np.int64).reshape(-1, 2)])

    return Layout(
        res_names=_RES_NAMES[types],
        atom_names=np.take(_NAMES, ts),
        elements=np.take(_ELEMENTS, ts),
        residue_index=res_of,
        refs=refs,
        bonds=bonds_arr,
        ideal=np.take(_IDEAL, ts, 0),
        ideal_mask=ideal_mask,
        torsion_slot=torsion_slot,
        torsion_atoms=tat,
        bonded=bonded_,
    )


def _fallback_parents(orphans, parent, res_of, ts, amap, linked, nxt_linked, group_start, L) -> None:
    """Bond references of the atoms whose template reference is missing, in
    atom order (``parent`` is updated in place): another bonded atom placed
    earlier, else a virtual link (see the module docstring)."""

    def depth(q: int) -> int:  # capped at 2, all the virtual links need
        d = 0
        while d < 2 and parent[q] >= 0:
            q, d = parent[q], d + 1
        return d

    def at(k: int, off: int, sl: int) -> int:
        if off < 0 and not linked[k] or off > 0 and not nxt_linked[k]:
            return -1
        return int(amap[(k + off) * _W + sl]) if 0 <= k + off < L else -1

    for v in orphans.tolist():
        k, (t, j) = int(res_of[v]), divmod(int(ts[v]), _W)
        p = -1
        for off, sl in _NEIGHBORS[t][j]:
            q = at(k, off, sl)
            if 0 <= q < v:
                p = q
                break
        gs = int(group_start[k])
        if p < 0 and v > gs:
            cands = [at(k, 0, x) for x in (_SC, _SCA, _SN)]
            if k > 0 and linked[k]:
                cands += [at(k, -1, x) for x in (_SC, _SCA, _SN)]
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
