"""Residue templates, the one compiler: every residue type and variant compiled once.

The 20 amino-acid types are compiled once, at import, into arrays over *slots* (their
heavy atoms in ``zmat/protein/topology.py`` order): :data:`AMINO` (:class:`AminoSlots`),
with each atom's canonical row, torsion, ideal geometry, the bonds and the torsion atoms,
references into a neighbour as ``(offset, slot)``. ``Protein``'s layout
(``zmat.protein.layout``) stamps these arrays directly; the all-atom variants of an amino
acid below read their parents, key atoms and torsion atoms off them, so the two views
cannot disagree on a residue's chemistry.

A *variant* is everything a residue's own rows depend on: its name, the backbone it
links into, the atoms it has in their order (so the hydrogens it has or was given,
its terminal and protonation state, the atoms a partially resolved residue lacks)
with their elements, and whether it is linked to the previous residue of its chain.
:func:`compile_residue` turns one into a :class:`ResidueTemplate` over the residue's
*local* atom indices: its bonds with orders, each atom's template parent (the bond
reference of its row), which atoms represent their siblings (``key``), and the atoms
of every polymer torsion. References into a neighbour residue (the parent ``C`` /
``O3'`` of a linked ``N`` / ``P``, the ``-C`` of phi, the ``+N`` of psi) are kept by
atom name and resolved when a structure is stamped.

:func:`stamp` makes a structure's bonds, parents, keys and torsion atoms from its
residues' templates: local indices plus the residue's first atom, the link bonds and
link parents between residues, the disulfides; no loop over atoms. The tree and rows
are then stamped from the parents (``zmat.structure.allatom``). A residue with atoms
its CCD entry lacks (*extra* atoms, bonded by distance: geometry, not type) is
compiled for itself, uncached: the per-atom fallback.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import numpy as np

from .._segments import segment_arange, segment_ids, starts
from ..protein.topology import AA3, CHI_ATOMS, RESIDUES, TORSION_NAMES
from .ccd import ccd_residue
from .hydrogens import LINK_ATOMS, extra_names
from .modified import parent_name, residue_type
from .nucleic import NUCLEIC_TORSIONS, nucleic_parents, torsion_atoms

__all__ = ["AMINO", "QUAD_NAMES", "AminoSlots", "ResidueTemplate", "compile_residue", "stamp"]

#: The dihedral quads of every polymer residue: protein torsions, nucleotide
#: torsions (alpha..chi), then the five endocyclic nu0..nu4.
QUAD_NAMES = TORSION_NAMES + NUCLEIC_TORSIONS[:7] + tuple(f"nu{j}" for j in range(5))
#: QUAD_NAMES before nu0..nu4: a torsion's last atom represents its siblings.
N_DIHEDRALS = len(TORSION_NAMES) + 7

_BACKBONE_QUADS = (("-C", "N", "CA", "C"), ("N", "CA", "C", "+N"), ("CA", "C", "+N", "+CA"))  # phi psi omega
_NUCLEIC_KEYS = {"P", "O5'", "C5'", "C4'", "C3'", "O3'", "C2'", "C4", "C2"}  # torsion atoms


# ------------------------------------------- the 20 amino acids compiled to slots
#: The amino-acid types in ``AA3`` order; a residue's *type* is its index here.
TYPES = tuple(RESIDUES[name] for name in AA3)
AMINO_TYPE = {t.name: i for i, t in enumerate(TYPES)}
#: Most atoms in a type. A residue's heavy atoms are its *slots* ``0 .. N_SLOTS - 1`` (type order).
N_SLOTS = max(len(t.atoms) for t in TYPES)
#: Stride of the per-residue slot maps: one slot more, ``EMPTY_SLOT``, that never holds an
#: atom, so a missing reference indexes it instead of branching.
SLOTS_PER_RESIDUE = N_SLOTS + 1
EMPTY_SLOT = N_SLOTS
#: Slots of the backbone atoms: every type starts ``N, CA, C, O`` (so a neighbour's
#: backbone atom has the same slot whatever its type).
SLOT_N, SLOT_CA, SLOT_C, SLOT_O = 0, 1, 2, 3
assert all(t.atoms[:4] == ("N", "CA", "C", "O") and t.atoms[-1] == "OXT" for t in TYPES)


@dataclass(frozen=True)
class AminoSlots:
    """The 20 amino-acid types as arrays over slots, compiled once at import (``AMINO``):
    what every amino-acid template holds, the heavy-atom ``Protein`` view stamping them
    directly (``zmat.protein.layout``), the all-atom variants reading theirs off them
    (:func:`compile_residue`).

    Per *type slot* ``type * SLOTS_PER_RESIDUE + slot`` (flat, ``(20 W, ...)``):
    ``atom_name``, ``element``, ``ideal`` ``(r, theta, phi)`` of the canonical row; the
    canonical row itself as ``ref_offset`` (the residue offset of each reference plus one:
    0 previous residue, 1 same, 2 next) and ``ref_slot``; ``torsion_code``
    ``(offset + 1) * 7 + torsion`` of the torsion that is the atom's dihedral (-1: none);
    ``sibling_dihedral``, True where the canonical dihedral reference is a sibling (an
    ``OFFSET`` row).

    Per type: ``has_slot`` ``(20, W)``; ``oxt_slot`` ``(20,)``; ``quad_offset``,
    ``quad_slot`` ``(20, 7, 4)``: the atoms of each torsion (``TORSION_NAMES``) as residue
    offset plus one and slot (``EMPTY_SLOT`` where the type has no such chi);
    ``bond_offset``, ``bond_slot`` ``(20, B, 2)``: the intra-residue bonds, then the peptide
    bond to the previous residue; ``slot_of`` name -> slot; ``neighbors`` per slot, the
    bonded atoms as ``(offset, slot)`` (fallback bond references).
    """

    has_slot: np.ndarray
    oxt_slot: np.ndarray
    atom_name: np.ndarray
    element: np.ndarray
    ideal: np.ndarray
    ref_offset: np.ndarray
    ref_slot: np.ndarray
    torsion_code: np.ndarray
    sibling_dihedral: np.ndarray
    quad_offset: np.ndarray
    quad_slot: np.ndarray
    bond_offset: np.ndarray
    bond_slot: np.ndarray
    slot_of: tuple[dict[str, int], ...]
    neighbors: tuple[list[list[tuple[int, int]]], ...]

    def name(self, i: int, offset: int, slot: int) -> str:
        """The reference ``(offset, slot)`` of type ``i`` as a name: ``"-C"``, ``"CB"``,
        ``"+N"``; ``""`` for none."""
        if slot == EMPTY_SLOT:
            return ""
        return {-1: "-", 0: "", 1: "+"}[offset] + TYPES[i].atoms[slot]


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


def _spec(t, spec: str) -> tuple[int, int]:
    """``"-C"`` -> ``(-1, slot of C)``; ``""`` -> ``(0, EMPTY_SLOT)``."""
    if not spec:
        return 0, EMPTY_SLOT
    off = {"-": -1, "+": 1}.get(spec[0], 0)
    return off, t.index(spec[1:] if off else spec)


def _neighbors(t) -> list[list[tuple[int, int]]]:
    """Per slot of type ``t``, its bonded atoms as ``(offset, slot)``, the peptide bond
    included (``N`` first tries the previous ``C``)."""
    nb: dict[str, list[str]] = {a: [] for a in t.atoms}
    for x, y in t.bonds:
        nb[x].append(y)
        nb[y].append(x)
    nb["N"].insert(0, "-C")
    nb["C"].append("+N")
    return [[_spec(t, s) for s in nb[a]] for a in t.atoms]


def _compile_amino() -> AminoSlots:
    n_types, flat = len(TYPES), len(TYPES) * SLOTS_PER_RESIDUE
    n_bonds = max(len(t.bonds) for t in TYPES) + 1  # + the peptide bond
    out = AminoSlots(
        has_slot=np.zeros((n_types, SLOTS_PER_RESIDUE), bool),
        oxt_slot=np.array([len(t.atoms) - 1 for t in TYPES], np.int64),
        atom_name=np.full(flat, "", "U4"),
        element=np.full(flat, "", "U2"),
        ideal=np.full((flat, 3), np.nan),
        ref_offset=np.ones((flat, 3), np.int64),
        ref_slot=np.full((flat, 3), EMPTY_SLOT, np.int64),
        torsion_code=np.full(flat, -1, np.int64),
        sibling_dihedral=np.zeros(flat, bool),
        quad_offset=np.ones((n_types, len(TORSION_NAMES), 4), np.int64),
        quad_slot=np.full((n_types, len(TORSION_NAMES), 4), EMPTY_SLOT, np.int64),
        bond_offset=np.ones((n_types, n_bonds, 2), np.int64),
        bond_slot=np.full((n_types, n_bonds, 2), EMPTY_SLOT, np.int64),
        slot_of=tuple({a: j for j, a in enumerate(t.atoms)} for t in TYPES),
        neighbors=tuple(_neighbors(t) for t in TYPES),
    )
    for i, t in enumerate(TYPES):
        _compile_type(out, i, t)
    for f in fields(out):
        if isinstance(value := getattr(out, f.name), np.ndarray):
            value.flags.writeable = False
    return out


def _compile_type(out: AminoSlots, i: int, t) -> None:
    """Fill the entries of type ``i`` (``topology.RESIDUES`` template ``t``) in ``out``."""
    n, f = len(t.atoms), i * SLOTS_PER_RESIDUE
    out.has_slot[i, :n] = True
    out.atom_name[f : f + n] = t.atoms
    out.element[f : f + n] = t.elements
    out.ideal[f : f + n] = t.ideal
    siblings = _sibling_type(t)
    for j, atom in enumerate(t.atoms):
        for c, spec in enumerate(t.rows[j]):
            off, out.ref_slot[f + j, c] = _spec(t, spec)
            out.ref_offset[f + j, c] = off + 1
        if t.torsion[j] is not None:
            torsion, off = t.torsion[j]
            out.torsion_code[f + j] = (off + 1) * len(TORSION_NAMES) + torsion
        out.sibling_dihedral[f + j] = atom in siblings
    for q, quad in enumerate(_BACKBONE_QUADS + CHI_ATOMS[t.name]):
        for c, spec in enumerate(quad):
            off, out.quad_slot[i, q, c] = _spec(t, spec)
            out.quad_offset[i, q, c] = off + 1
    for j, (x, y) in enumerate(t.bonds):
        out.bond_slot[i, j] = (t.index(x), t.index(y))
    out.bond_offset[i, -1], out.bond_slot[i, -1] = (0, 1), (SLOT_C, SLOT_N)  # -C, N


#: The compiled amino-acid types (:class:`AminoSlots`).
AMINO = _compile_amino()


@dataclass(frozen=True)
class ResidueTemplate:
    """One residue type and variant over its ``n`` local atoms.

    Attributes:
        names: ``(n,)`` atom names; ``slot`` name -> local index.
        bonds: ``(E, 2)`` local bonds (CCD, terminal hydrogens, extra atoms' by
            distance), ``orders`` ``(E,)`` biotite ``BondType`` codes.
        parent: ``(n,)`` the template parent of each atom (local, -1: none or in the
            previous residue); ``link_parent``: ``(atom, name)`` pairs, the atoms whose
            parent is the previous residue's atom ``name`` (when linked).
        tree: ``(n,)`` the tree parents: ``parent``, and for the atoms without one (a
            ligand's, a modified residue's, those whose template parent is missing) the
            parents growth over the residue's bonds gives them (:func:`_local_growth`); a
            standard amino acid's heavy atoms are given ``Protein``'s instead when a structure
            is stamped (``allatom._amino_rule``).
        key: ``(n,)`` bool, the atoms a template torsion ends on.
        quads: ``(Q, 4)`` local atoms of each ``QUAD_NAMES`` dihedral (-1: a missing
            atom, the dihedral is undefined; ``-2``: in a neighbour), ``cross``:
            ``(q, j, offset, name)`` for each neighbour atom (``offset`` -1 / +1);
            ``None`` for a ligand.
        link: ``(atom in, atom out)`` local indices of the backbone link atoms
            (``N, C`` / ``P, O3'``), -1 where absent.
    """

    names: tuple
    slot: dict
    bonds: np.ndarray
    orders: np.ndarray
    parent: np.ndarray
    tree: np.ndarray
    link_parent: tuple
    key: np.ndarray
    quads: np.ndarray | None
    cross: tuple
    link: tuple


@functools.lru_cache(maxsize=4096)  # one entry per residue variant met; bounded
def _cached(
    name: str, family: str, kind: str, names: tuple, elements: tuple, linked: bool
) -> ResidueTemplate:
    return compile_residue(name, family, kind, names, elements, linked)


def template_of(res, linked: bool, cache: bool = True) -> ResidueTemplate:
    """The template of a residue (``allatom._Res``); cached unless it has extra atoms
    (or ``cache`` is False: the per-atom reference)."""
    if cache and not any(res.extra):
        return _cached(res.name, res.family, res.kind, tuple(res.names), tuple(res.elements), bool(linked))
    return compile_residue(
        res.name, res.family, res.kind, tuple(res.names), tuple(res.elements), bool(linked), res=res
    )


def compile_residue(name, family, kind, names, elements, linked, *, res=None) -> ResidueTemplate:
    """A :class:`ResidueTemplate` (module doc); ``res``: the residue itself, for its
    extra atoms (bonds by distance, parents by nearness)."""
    own = {a: j for j, a in enumerate(names)}
    bonds, orders = _local_bonds(name, kind, own, res)
    slot = own
    if family != "ligand" and name != residue_type(name, family):  # a modified residue: its
        # parent's atoms by name (MSE: SD -> SE), only where bonded as in the parent
        slot = _ParentSlots(own, name, bonds)
    parent, link_parent, key = _local_parents(name, family, kind, names, elements, slot, bonds, linked)
    if res is not None and any(res.extra):
        _prefer_nearest(res, parent)
    heavy = np.array([e != "H" for e in elements], bool)
    tree = _local_growth(parent, [a for a, _ in link_parent], bonds, heavy)
    quads, cross = _local_quads(name, family, slot) if family != "ligand" else (None, ())
    y, x = LINK_ATOMS.get(kind, ("", ""))
    return ResidueTemplate(
        names,
        own,
        bonds,
        orders,
        parent,
        tree,
        link_parent,
        key,
        quads,
        cross,
        (slot.get(y, -1), slot.get(x, -1)),
    )


def _local_bonds(name: str, kind: str, slot: dict, res) -> tuple[np.ndarray, np.ndarray]:
    """CCD bonds within the residue, terminal hydrogens' bonds, the extra atoms' bonds."""
    ccd = ccd_residue(name)
    cnames = ccd.atom_names
    pairs, orders = [], []
    for i, j, o in ccd.bonds.tolist():
        a, b = str(cnames[i]), str(cnames[j])
        if a in slot and b in slot:
            pairs.append((slot[a], slot[b]))
            orders.append(o)
    known = set(cnames.tolist())
    for h, x in extra_names(name, kind).items():
        if h in slot and x in slot and h not in known:
            pairs.append((slot[h], slot[x]))
            orders.append(1)
    for i, j in res.extra_bonds if res is not None else ():
        pairs.append((i, j))
        orders.append(0)  # BondType.ANY: bonded by distance, order unknown
    return np.array(pairs, np.int64).reshape(-1, 2), np.array(orders, np.int64)


def _local_parents(name, family, kind, names, elements, slot, bonds, linked):
    """Template parents (``"-X"``: the previous residue's X, when linked) and key atoms;
    every hydrogen on its first bonded atom."""
    n = len(names)
    parent = np.full(n, -1, np.int64)
    key = np.zeros(n, bool)
    link_parent = []

    def put(a: str, spec: str) -> None:
        if spec.startswith("-"):
            if linked:
                link_parent.append((slot[a], spec[1:]))
        else:
            parent[slot[a]] = slot.edge(a, spec) if isinstance(slot, _ParentSlots) else slot.get(spec, -1)

    if family == "protein":  # the type's compiled rows (AMINO), restricted to the atoms present
        i = AMINO_TYPE[residue_type(name, family)]
        for a, j in AMINO.slot_of[i].items():
            if a in slot:
                f = i * SLOTS_PER_RESIDUE + j
                put(a, AMINO.name(i, AMINO.ref_offset[f, 0] - 1, AMINO.ref_slot[f, 0]))
                key[slot[a]] = AMINO.torsion_code[f] >= 0
    elif family == "nucleic":
        for a, p in nucleic_parents(residue_type(name, family)).items():
            if a in slot:
                put(a, p)
                key[slot[a]] = a in _NUCLEIC_KEYS
    elif linked:  # a modified residue in a chain: entered through its link atom
        y, x = LINK_ATOMS[kind]
        put(y, "-" + x)
        key[slot[y]] = True
    partner: dict[int, int] = {}
    for i, j in bonds.tolist():
        partner.setdefault(i, j)
        partner.setdefault(j, i)
    for j, e in enumerate(elements):
        if e == "H":
            parent[j] = partner.get(j, -1)
    return parent, tuple(link_parent), key


def _local_growth(parent: np.ndarray, entry: list, bonds: np.ndarray, heavy: np.ndarray) -> np.ndarray:
    """Tree parents of a residue's atoms: ``allatom._grow`` run on the residue alone, from
    the atoms its previous residue places (``entry``: the linked link atom) or, for a residue
    that starts its piece, from its first heavy atom without a template parent (the piece's
    root). Growth only ever crosses a residue through its link, and a frontier atom's parent
    is its lowest placed neighbour, so this is what the growth of the whole structure gives:
    template children first, then the lowest unplaced bonded atom, those without a template
    parent first. Atoms it does not reach keep -1."""
    n = len(parent)
    tree = parent.copy()
    if not entry:
        free = np.flatnonzero((parent < 0) & heavy)
        entry = free[:1].tolist()
    if not entry or (parent >= 0).sum() + len(entry) == n:
        return tree
    kids = [[] for _ in range(n)]
    for v in np.flatnonzero(parent >= 0).tolist():
        kids[parent[v]].append(v)
    nbrs = [[] for _ in range(n)]
    for i, j in bonds.tolist():
        nbrs[i].append(j)
        nbrs[j].append(i)
    placed = np.zeros(n, bool)

    def place(v: int) -> None:
        todo = [v]
        while todo:
            u = todo.pop()
            placed[u] = True
            todo += [c for c in kids[u] if not placed[c]]

    for v in entry:
        place(v)
    while True:
        frontier = [
            (int(parent[c] >= 0), c, min(u for u in nbrs[c] if placed[u]))
            for c in range(n)
            if not placed[c] and any(placed[u] for u in nbrs[c])
        ]
        if not frontier:
            return tree
        _, c, u = min(frontier)
        tree[c] = u
        place(c)


def _prefer_nearest(res, parent: np.ndarray) -> None:
    """An extra heavy atom's parent: the nearest template atom it is bonded to (none: it is
    reached over its bonds)."""
    xyz = np.array(res.xyz, np.float64).reshape(-1, 3)
    for i in np.flatnonzero(np.array(res.extra, bool) & (np.array(res.elements) != "H")).tolist():
        nb = [j for p in res.extra_bonds if i in p for j in p if j != i and not res.extra[j]]
        if nb:
            parent[i] = min(nb, key=lambda j: float(np.linalg.norm(xyz[j] - xyz[i])))


def _local_quads(name: str, family: str, slot: dict):
    """``(Q, 4)`` local quads and the neighbour atoms of each (module doc)."""
    rtype = residue_type(name, family)
    if family == "protein":
        i = AMINO_TYPE[rtype]
        off, at = AMINO.quad_offset[i] - 1, AMINO.quad_slot[i]
        defs = {
            TORSION_NAMES[q]: tuple(AMINO.name(i, o, s) for o, s in zip(off[q], at[q], strict=True))
            for q in range(len(TORSION_NAMES))
            if at[q, 0] != EMPTY_SLOT
        }
    else:
        defs = torsion_atoms(rtype)
    quads = np.full((len(QUAD_NAMES), 4), -1, np.int64)
    cross = []
    for qname, quad in defs.items():
        q = QUAD_NAMES.index(qname)
        ids = []
        for j, spec in enumerate(quad):
            if spec[0] in "-+":
                ids.append(-2)
                cross.append((q, j, -1 if spec[0] == "-" else 1, spec[1:]))
            else:
                ids.append(slot.get(spec, -1))
        if -1 in ids or not _bonded_along(slot, quad):  # a missing own atom: undefined
            cross = [c for c in cross if c[0] != q]
        else:
            quads[q] = ids
    return quads, tuple(cross)


class _ParentSlots(dict):
    """A modified residue's local slots under its parent's atom names
    (``zmat/structure/modified.py``): ``slot["SD"]`` is MSE's ``SE``; a parent's tree edge
    or torsion bond counts only where the residue has that bond."""

    def __init__(self, slot: dict, name: str, bonds: np.ndarray) -> None:
        super().__init__({parent_name(name, a): j for a, j in slot.items()})
        self.bonded = {(i, j) for i, j in bonds.tolist()} | {(j, i) for i, j in bonds.tolist()}

    def edge(self, a: str, b: str) -> int:
        """``b``'s slot when ``a`` and ``b`` are bonded, else -1."""
        j = self.get(b, -1)
        return j if j >= 0 and (self[a], j) in self.bonded else -1


def _bonded_along(slot: dict, quad: tuple) -> bool:
    """Every pair of consecutive own atoms of a quad bonded (always, but in a modified residue)."""
    if not isinstance(slot, _ParentSlots):
        return True
    own = [slot.get(a, -1) if a[0] not in "-+" else -2 for a in quad]
    return all(i == -2 or j == -2 or (i, j) in slot.bonded for i, j in zip(own[:-1], own[1:], strict=True))


def stamp(residues, linked: np.ndarray, disulfides, cache: bool = True):
    """Bonds, orders, tree-followable bonds, parents, keys and quads of a structure
    stamped from its residues' templates (``allatom.ComplexAtoms``' arrays): each distinct
    template's local arrays laid end to end once (:class:`_Pieces`), gathered per residue and
    offset by the residue's first atom; no loop over atoms or bonds.

    Args:
        residues: the ``R`` residues (``allatom._Res``), ``linked`` ``(R,)`` bool.
        disulfides: ``(residue, residue)`` pairs (cross-links: bonds, not tree edges).
        cache: False compiles every residue anew (the per-atom reference).

    Returns:
        ``bonds`` ``(E, 2)``, ``orders`` ``(E,)``, ``tree_ok`` ``(E,)``,
        ``pref`` ``(N,)`` template parents (-1: none), ``tree`` ``(N,)`` tree parents
        (``ResidueTemplate.tree``), ``key`` ``(N,)``, ``quads`` ``(L, Q, 4)``.
    """
    linked = np.asarray(linked, bool)
    tmpl = [template_of(r, linked[k], cache) for k, r in enumerate(residues)]
    index: dict[int, int] = {}
    tid = np.array([index.setdefault(id(t), len(index)) for t in tmpl], np.int64)
    pc = _Pieces([t for t in {id(t): t for t in tmpl}.values()])
    first = starts(pc.n_atoms[tid])
    res_of = segment_ids(pc.n_atoms[tid])
    g = pc.atom_start[tid][res_of] + np.arange(len(res_of)) - first[res_of]  # each atom's template entry
    pref = np.where(pc.parent[g] >= 0, pc.parent[g] + first[res_of], -1)
    tree = np.where(pc.tree[g] >= 0, pc.tree[g] + first[res_of], -1)
    # the polymer link's parents: the previous residue's atom of that name
    k = np.repeat(np.flatnonzero(linked), pc.n_link[tid[linked]])
    e = pc.link_start[tid[k]] + segment_arange(pc.n_link[tid[linked]])
    at = pc.named[tid[k - 1], pc.link_name[e]]
    pref[first[k] + pc.link_atom[e]] = np.where(at >= 0, first[k - 1] + at, -1)
    tree[first[k] + pc.link_atom[e]] = pref[first[k] + pc.link_atom[e]]
    bonds, orders = _stamp_bonds(pc, tid, first, linked)
    n_tree = len(bonds)
    if disulfides:
        sg = np.array([[first[i] + tmpl[i].slot["SG"], first[j] + tmpl[j].slot["SG"]] for i, j in disulfides])
        bonds, orders = np.concatenate([bonds, sg]), np.concatenate([orders, np.ones(len(sg), np.int64)])
    quads = _stamp_quads(pc, tid, first, linked)
    return bonds, orders, np.arange(len(bonds)) < n_tree, pref, tree, pc.key[g], quads


class _Pieces:
    """The distinct templates of a structure, their local arrays end to end (``*_start``:
    each template's first entry); ``named`` ``(T, V)``: each template's local atom of every
    name a neighbour refers to (-1: none)."""

    def __init__(self, uniq: list) -> None:
        def flat(arrays, dtype, shape=()):
            sizes = np.array([len(a) for a in arrays], np.int64)
            a = np.concatenate([np.asarray(a, dtype).reshape(-1, *shape) for a in arrays]) if arrays else []
            return np.asarray(a, dtype).reshape(-1, *shape), sizes, starts(sizes)

        vocab: dict[str, int] = {}
        for t in uniq:
            for name in [x for _, x in t.link_parent] + [c[3] for c in t.cross]:
                vocab.setdefault(name, len(vocab))
        named = [[t.slot.get(v, -1) for v in vocab] for t in uniq]
        self.named = np.array(named, np.int64).reshape(len(uniq), len(vocab))
        self.parent, self.n_atoms, self.atom_start = flat([t.parent for t in uniq], np.int64)
        self.tree = flat([t.tree for t in uniq], np.int64)[0]
        self.key = flat([t.key for t in uniq], bool)[0]
        self.bonds, self.n_bonds, self.bond_start = flat([t.bonds for t in uniq], np.int64, (2,))
        self.orders = flat([t.orders for t in uniq], np.int64)[0]
        self.link = np.array([t.link for t in uniq], np.int64).reshape(-1, 2)
        lp = [[(a, vocab[x]) for a, x in t.link_parent] for t in uniq]
        pairs, self.n_link, self.link_start = flat(lp, np.int64, (2,))
        self.link_atom, self.link_name = pairs[:, 0], pairs[:, 1]
        self.poly = np.array([t.quads is not None for t in uniq], bool)
        none = np.full((len(QUAD_NAMES), 4), -1, np.int64)
        self.quads = np.stack([none if t.quads is None else t.quads for t in uniq])
        cross = [[(q, j, off, vocab[name]) for q, j, off, name in t.cross] for t in uniq]
        self.cross, self.n_cross, self.cross_start = flat(cross, np.int64, (4,))


def _stamp_bonds(pc: _Pieces, tid: np.ndarray, first: np.ndarray, linked: np.ndarray):
    """Each residue's template bonds, then its link to the previous residue (when linked)."""
    nb = pc.n_bonds[tid]
    block = nb + linked
    row = segment_ids(block)
    pos = segment_arange(block)
    own = pos < nb[row]
    g = pc.bond_start[tid[row[own]]] + pos[own]
    bonds = np.empty((len(row), 2), np.int64)
    orders = np.ones(len(row), np.int64)
    bonds[own] = pc.bonds[g] + first[row[own], None]
    orders[own] = pc.orders[g]
    k = row[~own]
    bonds[~own] = np.stack([first[k - 1] + pc.link[tid[k - 1], 1], first[k] + pc.link[tid[k], 0]], 1)
    return bonds, orders


def _stamp_quads(pc: _Pieces, tid: np.ndarray, first: np.ndarray, linked: np.ndarray) -> np.ndarray:
    """``(L, Q, 4)``: the polymer templates' quads offset, neighbour atoms resolved."""
    R = len(tid)
    rows = np.flatnonzero(pc.poly[tid])
    q = pc.quads[tid[rows]]
    q = np.where(q >= 0, q + first[rows, None, None], q)
    n = pc.n_cross[tid[rows]]
    i = np.repeat(np.arange(len(rows)), n)  # quad row of each neighbour reference
    qi, j, off, name = pc.cross[pc.cross_start[tid[rows[i]]] + segment_arange(n)].T
    k = rows[i]
    m = np.clip(k + off, 0, max(R - 1, 0))
    ok = np.where(off < 0, linked[k], (k + 1 < R) & linked[np.minimum(k + 1, R - 1)])
    at = pc.named[tid[m], name]
    q[i, qi, j] = np.where(ok & (at >= 0), first[m] + at, -1)
    return np.where((q < 0).any(2, keepdims=True), -1, q)
