"""All-atom structures: proteins, DNA, RNA, hydrogens and ligands, a tree per chain in one table.

:func:`parse_complex` turns a ``biotite`` ``AtomArray`` into a
:class:`ComplexAtoms`: every kept atom (file order within a residue, then the
hydrogens it completed), its covalent bonds with bond orders, a construction
table over all of them, and the atoms of every polymer torsion. What is kept:

* polymer residues, always: the 20 amino acids (``zmat/protein/topology.py``)
  and the nucleotides DA DC DG DT A C G U (``zmat/structure/nucleic.py``), every
  heavy atom the CCD entry names (``OXT``, ``OP3`` included), the resolved ones
  of a partially resolved residue; modified residues linked into a chain
  (:func:`in_chain_modified`: MSE, SEP, 5MU, abasic sites), linked by their CCD
  linking type, polymer residues of their CCD parent type where they have one
  (``MSE`` a ``MET``: its tree, torsions and AlphaFold slots; ``zmat/structure/modified.py``);
* ``hydrogens``: the file's hydrogens, and the missing ones completed
  (``zmat/structure/hydrogens.py``);
* ``ligands``: every other residue but water (ligands, cofactors, ions),
  bonds from its CCD entry (``zmat/structure/ccd.py``).

An atom whose name its residue's CCD entry does not know (a renamed residue, a
force field's hydrogen name) is kept as an *extra* atom of its residue, bonded by
covalent radii (``zmat.autotable.connectivity``; else to its nearest atom) to
atoms of the same residue and placed off the nearest template atom it is bonded
to, with one warning per residue naming them; extra atoms are in no torsion and
not in ``atom37``. An unknown residue (no CCD entry) with ``ligands=True``
raises ``ValueError``.

The construction table is one tree over every kept atom, so
``zmat.to_xyz(internal, table)`` reproduces the coordinates up to one rigid
motion, but it is made of one tree per chain: every connected piece (a chain,
or its part up to a break; a ligand; an ion) is grown over the bonds that a
tree may follow (bonds within residues and polymer links, never a disulfide or
another cross-link) from its own root, the first heavy atom without a template
parent (a chain's first ``N``, ``P`` or ``O5'``; a ligand's first heavy atom).
Bond references follow the chemistry: every atom of a polymer residue its
template parent (amino acids: the rows of ``topology.py``; nucleotides:
``nucleic.py``; a modified residue in a chain its parent type's, or, without a
parent type, it is entered through its link atom), every hydrogen its heavy
atom, the rest breadth first over bonds. The first piece's root is moved to a
leaf beside it (the N-terminal ``H1``, a phosphate oxygen; ``_leaf_root``), and
its first three atoms are the structure's *frame*: every other piece's root
hangs off them, its row ``(r2, r1, r0)`` and its first children's rows
(measured values) being that piece's six rigid-body coordinates. No torsion
moves the frame, so a torsion edit moves only atoms of its own piece downstream
of the rotated bond. Rows are ``PROPER`` (``(b, parent(b), angle reference of
b)``, the dihedral column being a torsion about ``parent(b)-b``), except that
the children of one atom are ``OFFSET`` on one representative child (the atom
of a named torsion, else the first heavy child, else the first child): rotating
that torsion moves the whole group, hydrogens included (methyl and hydroxyl
rotors are the dihedral of their first hydrogen); the roots hung off the frame
stay ``PROPER`` rows of their own. No row is position-anchored. Coincident
atoms warn and their rows go around them
(``zmat.protein.io.reroute_degenerate``, as for proteins).

The tables are stamped: bonds, template parents, key atoms and torsion atoms from
each residue type and variant's template, compiled once
(``zmat/structure/templates.py``); every component whose atoms all have a template
parent (a chain of template residues, an ion) takes those parents as its tree, and the
rows come from the parents in one vectorised pass (:func:`_rows`). The standard amino
acids' heavy atoms take their parents (a missing template parent's fallback included) and
OFFSET siblings from ``Protein``'s own routine (:func:`_amino_rule`,
``zmat.protein.layout.amino_tree``): one rule for both views. Only components
with atoms that have no template parent (ligands, residues missing atoms, extra
atoms) are grown atom by atom (:func:`_grow`); ``parse_complex(..., stamped=False)``
grows every one, and gives the same arrays.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np

from .._segments import segment_arange, segment_ids, starts
from ..autotable import connectivity, elements
from ..protein.io import chain_mask, reroute_degenerate, warn_coincident
from ..protein.layout import amino_tree, template_slots
from ..protein.topology import RESIDUES
from .ccd import ccd_residue
from .hydrogens import AMIDE, LINK_ATOMS, Protonation, extra_names, file_names, place, place_all, plan
from .ligands import rotatable_bonds, torsion_rows
from .modified import beyond_parent, is_cysteine, own_name, parent_name, parent_type, residue_type
from .nucleic import NUCLEOTIDES
from .templates import AMINO_TYPE, N_DIHEDRALS, QUAD_NAMES, SLOTS_PER_RESIDUE, stamp

__all__ = ["QUAD_NAMES", "WATER", "ComplexAtoms", "in_chain_modified", "needs_complex", "parse_complex"]

WATER = ("HOH", "DOD", "WAT", "H2O")
#: C(i)-N(i+1) and O3'(i)-P(i+1) distances above this (Angstrom) are chain breaks.
LINK_MAX = 2.0
#: SG-SG distances below this (Angstrom) are disulfide bonds.
DISULFIDE_MAX = 2.5


@dataclass(frozen=True)
class ComplexAtoms:
    """A parsed all-atom structure (N atoms, R residues, L of them polymer).

    Per atom: ``atom_names``, ``elements``, ``residue`` (index into the
    residue arrays), ``xyz`` ``(N, 3)`` float64, ``added`` (True for a
    completed hydrogen), ``extra`` (True for an atom its CCD entry lacks).
    Per residue: ``res_names``, ``res_ids``,
    ``ins_codes``, ``chain_ids``, ``hetero``, ``family`` (``"protein"``,
    ``"nucleic"``, ``"ligand"``), ``res_types`` (the standard type a polymer residue
    is built as: its name, an in-chain modified residue's parent, ``MSE`` -> ``MET``;
    ``""`` for ligands; ``zmat/structure/modified.py``), ``polymer_index`` (-1 for
    ligands).
    ``bonds`` ``(E, 2)`` and ``bond_orders`` ``(E,)`` (biotite ``BondType``
    codes); ``refs`` ``(N, 3)`` the construction rows; ``quads`` ``(L, Q, 4)``
    the atoms of every ``QUAD_NAMES`` dihedral, -1 where undefined; ``key``
    the template torsion atoms. Ligand torsions (``zmat/structure/ligands.py``; a modified
    residue's rotatable bonds beyond its parent's too, ``modified.beyond_parent``):
    ``ligand_rows`` ``(T,)`` the atom whose dihedral column each is,
    ``ligand_quads`` ``(T, 4)``, ``ligand_residue`` ``(T,)``. ``linked``
    ``(R,)``: residue ``k`` is bonded to ``k - 1`` in its polymer.
    """

    atom_names: np.ndarray
    elements: np.ndarray
    residue: np.ndarray
    xyz: np.ndarray
    added: np.ndarray
    extra: np.ndarray
    res_names: np.ndarray
    res_ids: np.ndarray
    ins_codes: np.ndarray
    chain_ids: np.ndarray
    hetero: np.ndarray
    family: np.ndarray
    res_types: np.ndarray
    polymer_index: np.ndarray
    bonds: np.ndarray
    bond_orders: np.ndarray
    refs: np.ndarray
    quads: np.ndarray
    key: np.ndarray
    ligand_rows: np.ndarray
    ligand_quads: np.ndarray
    ligand_residue: np.ndarray
    linked: np.ndarray


def needs_complex(atoms, chain=None) -> bool:
    """True when ``atoms`` (restricted to ``chain``, a chain ID or list) has a
    nucleotide or an in-chain modified residue (:func:`in_chain_modified`), which a
    ``Protein`` cannot hold; False for anything without residue names (the caller's
    type check reports it)."""
    names = getattr(atoms, "res_name", None)
    if not isinstance(names, np.ndarray):
        return False
    mask = chain_mask(atoms, chain)
    if np.isin(names[mask], NUCLEOTIDES).any():
        return True
    return atoms.coord.ndim == 2 and bool(in_chain_modified(atoms)[mask].any())  # not a stack


@functools.cache
def _polymer_kind(name: str) -> str:
    """``backbone_kind`` of a residue name from its CCD linking type alone (cheap: no
    component is parsed), ``""`` for water, non-polymer types and names without an entry."""
    import biotite.structure.info as info

    if name in WATER:
        return ""
    if name in RESIDUES or name in NUCLEOTIDES:
        return family_of(name)
    try:
        link = str(info.link_type(name) or "").upper()
    except KeyError:
        return ""
    return "protein" if "PEPTIDE" in link else "nucleic" if "DNA" in link or "RNA" in link else ""


def in_chain_modified(atoms) -> np.ndarray:
    """``(n,)`` bool: the atoms of non-standard residues that belong to a polymer
    (MSE, SEP, 5MU, abasic sites...): a peptide or nucleotide linking type in the CCD,
    and linked (``C-N`` / ``O3'-P`` at most ``LINK_MAX``) to a neighbour of the same
    chain and backbone. The CCD is asked only about residues so linked."""
    import biotite.structure as struc

    out = np.zeros(atoms.array_length(), bool)
    standard = set(RESIDUES) | set(NUCLEOTIDES) | set(WATER)
    if set(np.unique(atoms.res_name).tolist()) <= standard:
        return out
    bounds = struc.get_residue_starts(atoms, add_exclusive_stop=True, extra_categories=("res_name",))
    res_names = atoms.res_name[bounds[:-1]].tolist()
    near = {kind: _near_links(atoms, bounds, *LINK_ATOMS[kind]) for kind in LINK_ATOMS}

    def bonded(i: int, kind: str) -> bool:  # residue i to residue i + 1
        return bool(near[kind][i]) and _polymer_kind(res_names[i]) == _polymer_kind(res_names[i + 1]) == kind

    R = len(res_names)
    for r, name in enumerate(res_names):
        if name not in standard and any(
            (r > 0 and bonded(r - 1, k)) or (r + 1 < R and bonded(r, k)) for k in near
        ):
            out[bounds[r] : bounds[r + 1]] = True
    return out


def _near_links(atoms, bounds: np.ndarray, y: str, x: str) -> np.ndarray:
    """``(R - 1,)``: residue ``i``'s first atom ``x`` is at most ``LINK_MAX`` from residue ``i + 1``'s
    first atom ``y``, in the same chain (numpy over all residues at once)."""
    R = len(bounds) - 1
    res = np.repeat(np.arange(R), np.diff(bounds))

    def first(name: str) -> np.ndarray:  # per residue, its first atom of that name, -1: none
        at = np.flatnonzero(atoms.atom_name == name)
        out = np.full(R, len(res), np.int64)
        np.minimum.at(out, res[at], at)
        return np.where(out < len(res), out, -1)

    fx, fy = first(x)[:-1], first(y)[1:]
    ok = (fx >= 0) & (fy >= 0) & (atoms.chain_id[bounds[:-2]] == atoms.chain_id[bounds[1:-1]])
    d = np.linalg.norm(atoms.coord[np.maximum(fx, 0)] - atoms.coord[np.maximum(fy, 0)], axis=-1)
    return ok & (d <= LINK_MAX)


def family_of(res_name: str) -> str:
    if res_name in RESIDUES:
        return "protein"
    if res_name in NUCLEOTIDES:
        return "nucleic"
    return "ligand"


# ------------------------------------------------------------------ residues
@dataclass
class _Res:
    name: str
    family: str
    kind: str  # the backbone it links into: "protein", "nucleic", "" (backbone_kind)
    chain: str
    res_id: int
    ins_code: str
    hetero: bool
    names: list
    elements: list
    xyz: np.ndarray  # (n, 3) float64
    added: list
    extra: list  # per atom: not in the CCD entry (kept, bonded by distance)
    extra_bonds: list  # local (i, j) bonds of the extra atoms (_extra_bonds)


def _select(atoms, chain, hydrogens: bool, ligands: bool):
    import biotite.structure as struc

    if not isinstance(atoms, struc.AtomArray):
        hint = " (take one model: stack[0])" if isinstance(atoms, struc.AtomArrayStack) else ""
        raise TypeError(f"atoms must be a biotite.structure.AtomArray{hint}, got {type(atoms).__name__}")
    keep = ~np.isin(atoms.res_name, WATER)
    if not hydrogens:
        keep &= ~np.isin(np.char.upper(atoms.element.astype(str)), ["H", "D"])
    modified = in_chain_modified(atoms)
    if not ligands:  # polymers, modified residues in them included
        keep &= np.isin(atoms.res_name, list(RESIDUES) + list(NUCLEOTIDES)) | modified
    keep &= chain_mask(atoms, chain)
    atoms = atoms[keep]
    if atoms.array_length() == 0:
        raise ValueError("no polymer residue or ligand left in the structure")
    return atoms, modified[keep]


def _residues(atoms, modified: np.ndarray) -> list[_Res]:
    """The kept residues, atoms by their CCD names (first of a name wins); an in-chain
    modified residue (``modified``: per atom) with a standard parent is a polymer residue
    of its parent's family (``zmat/structure/modified.py``). Per residue slices of arrays
    read once (an AtomArray's attribute access costs ~10 us a call); the atoms a residue's
    CCD entry lacks found per residue name at once (:func:`_unknown`)."""
    import biotite.structure as struc

    # a change of name starts a residue too: two residues sharing chain, number and insertion
    # code (biotite's 1xnr has U129 / G129) stay two
    bounds = struc.get_residue_starts(atoms, add_exclusive_stop=True, extra_categories=("res_name",))
    first = bounds[:-1]
    atom_name = atoms.atom_name.tolist()
    element = atoms.element.tolist()
    cap = {e: str(e).capitalize() for e in set(element)}
    element = [cap[e] for e in element]
    coord = atoms.coord.astype(np.float64)
    meta = zip(
        atoms.res_name[first].tolist(),
        atoms.chain_id[first].tolist(),
        atoms.res_id[first].tolist(),
        atoms.ins_code[first].tolist(),
        atoms.hetero[first].tolist(),
        modified[first].tolist(),
        strict=True,
    )
    out = []
    for name, chain, res_id, ins, hetero, mod in meta:
        fam = family_of(name)
        if fam == "ligand" and mod and family_of(parent_type(name)) == _polymer_kind(name):
            fam = family_of(parent_type(name))
        ccd_residue(name)  # raises, naming the residue, without a CCD entry
        out.append(_Res(name, fam, backbone_kind(name, fam), str(chain), int(res_id), str(ins), bool(hetero),
                        [], [], [], [], [], []))  # fmt: skip
    extra = _unknown(out, np.asarray(atoms.atom_name), bounds)
    for res, s, e in zip(out, bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        keep = _first_of_names(res, atom_name[s:e])
        if keep is None:
            res.names, res.elements, res.extra, res.xyz = atom_name[s:e], element[s:e], extra[s:e], coord[s:e]
        else:
            at = [s + i for i in keep]
            res.names, res.elements = [atom_name[i] for i in at], [element[i] for i in at]
            res.extra, res.xyz = [extra[i] for i in at], coord[np.array(at, np.int64)].reshape(-1, 3)
        res.added = [False] * len(res.names)
        if any(res.extra):
            res.extra_bonds = _extra_bonds(res)
            kept = [a for a, x in zip(res.names, res.extra, strict=True) if x]
            warnings.warn(
                f"chain {res.chain} residue {res.res_id}{res.ins_code} {res.name}: atoms {kept} are not "
                "in its CCD entry; kept as extra atoms, bonded by distance within the residue",
                stacklevel=4,
            )
    return out


def _first_of_names(res: _Res, names: list) -> list[int] | None:
    """The atoms kept of a residue whose names repeat (the first of each, with a warning);
    None where none repeats (all kept)."""
    if len(set(names)) == len(names):
        return None
    keep, seen = [], set()
    for i, a in enumerate(names):
        if a in seen:
            warnings.warn(
                f"residue {res.name} {res.chain}{res.res_id}{res.ins_code}: atom {a!r} appears again (a "
                "repeated residue number?); the first one is kept",
                stacklevel=5,
            )
            continue
        seen.add(a)
        keep.append(i)
    return keep


def _unknown(residues: list[_Res], atom_name: np.ndarray, bounds: np.ndarray) -> list[bool]:
    """Per atom: its name is neither in its residue's CCD entry nor one of the hydrogens the
    residue may have beyond it (``hydrogens.extra_names``); one ``isin`` per residue variant."""
    variant = {}
    group = np.array([variant.setdefault((r.name, r.kind), len(variant)) for r in residues], np.int64)
    group = np.repeat(group, np.diff(bounds))
    out = np.zeros(len(atom_name), bool)
    for (name, kind), g in variant.items():
        sel = np.flatnonzero(group == g)
        known = list(ccd_residue(name).atom_names.tolist()) + list(extra_names(name, kind))
        out[sel] = ~np.isin(atom_name[sel], known)
    return out.tolist()


def _extra_bonds(res: _Res) -> list[tuple[int, int]]:
    """Local bonds of a residue's extra atoms: an extra hydrogen to its nearest heavy atom, an
    extra heavy atom to the heavy atoms within covalent radii (``zmat.autotable.connectivity``),
    else to its nearest heavy atom; all within the residue."""
    for i in np.flatnonzero(res.extra).tolist():
        try:
            elements([res.elements[i]])
        except ValueError:
            raise ValueError(
                f"chain {res.chain} residue {res.res_id}{res.ins_code} {res.name}: atom {res.names[i]} has "
                f"element {res.elements[i]!r}, which has no covalent radius to bond it by distance"
            ) from None
    xyz = np.array(res.xyz, np.float64).reshape(-1, 3)
    heavy = np.array([e not in ("H", "D", "T") for e in res.elements], bool)  # D, T: isotopes
    nbrs = connectivity(xyz[heavy], symbols=[e for e, h in zip(res.elements, heavy, strict=True) if h])
    at = np.flatnonzero(heavy)  # heavy-local -> residue-local
    local = np.cumsum(heavy) - 1
    pairs = set()
    for i in np.flatnonzero(res.extra).tolist():
        js = at[nbrs[local[i]]].tolist() if heavy[i] else []
        if not js:
            d = np.where(heavy, np.linalg.norm(xyz - xyz[i], axis=1), np.inf)
            d[i] = np.inf
            js = [int(np.argmin(d))] if np.isfinite(d).any() else []
        pairs |= {(min(i, j), max(i, j)) for j in js}
    return sorted(pairs)


def backbone_kind(res_name: str, family: str) -> str:
    """``"protein"``, ``"nucleic"`` or ``""``: the polymer backbone a residue
    links into (a modified residue by its CCD type, e.g. ``L-PEPTIDE LINKING``)."""
    return family if family != "ligand" else _polymer_kind(res_name)


def _linked(residues: list[_Res]) -> np.ndarray:
    """``(R,)``: residue ``k`` is covalently linked to ``k - 1`` in its polymer
    (same chain and backbone, ``C-N`` / ``O3'-P`` at most ``LINK_MAX``); the distances at once."""
    pairs = []  # (k, atom x of k - 1, atom y of k)
    for k in range(1, len(residues)):
        p, q = residues[k - 1], residues[k]
        if p.chain != q.chain or not q.kind or p.kind != q.kind:
            continue
        y, x = LINK_ATOMS[q.kind]
        if x in p.names and y in q.names:
            pairs.append((k, p.xyz[p.names.index(x)], q.xyz[q.names.index(y)]))
    out = np.zeros(len(residues), bool)
    if pairs:
        k, px, qy = zip(*pairs, strict=True)
        d = np.array(px) - np.array(qy)
        out[list(k)] = np.sqrt(np.vecdot(d, d)) <= LINK_MAX  # np.linalg.norm's bits
    return out


def _disulfides(residues: list[_Res]) -> list[tuple[int, int]]:
    """Pairs of cysteines (residue indices) whose SG atoms are closer than ``DISULFIDE_MAX``;
    a modified cysteine in a chain (CSO, CME, CSD: parent type ``CYS``) counts as one."""
    cys = [k for k, r in enumerate(residues) if is_cysteine(r.name, r.family, r.names)]
    sg = np.array([residues[k].xyz[residues[k].names.index(own_name(residues[k].name, "SG"))] for k in cys])
    i, j = np.triu_indices(len(cys), 1)
    d = sg[i] - sg[j] if len(cys) else np.zeros((0, 3))
    near = np.sqrt(np.vecdot(d, d)) < DISULFIDE_MAX  # np.linalg.norm's bits
    return [(cys[a], cys[b]) for a, b in zip(i[near].tolist(), j[near].tolist(), strict=True)]


def _complete_hydrogens(residues: list[_Res], linked: np.ndarray, opts: Protonation, bridged: set) -> None:
    """Add every residue's missing hydrogens after its atoms: each residue variant's plan
    (``hydrogens.plan``: which ones, on which reference atoms, made once per variant) offset by
    the residue's first atom, and all of them placed at once (``hydrogens.place_all``); warn,
    naming them, where coincident or collinear heavy atoms leave no direction (those, and
    proline's N-terminal pair, are placed one by one, ``hydrogens.place``)."""
    R = len(residues)
    plans, c_at = [], np.full(R, -1, np.int64)
    for k, res in enumerate(residues):
        res.names = file_names(res.name, res.kind, bool(linked[k]), res.names)
        elem = res.elements
        # a heavy atom with a file hydrogen of an unknown name (CHARMM's HN) gets no more
        carried = frozenset(
            res.names[j if elem[i] == "H" else i] for i, j in res.extra_bonds if "H" in (elem[i], elem[j])
        )
        prev_c = bool(linked[k]) and res.kind == "protein" and "C" in residues[k - 1].names
        if prev_c:
            c_at[k] = residues[k - 1].names.index("C")
        nxt = k + 1 < R and bool(linked[k + 1])
        key = (tuple(res.names), tuple(elem), tuple(res.extra), carried, k in bridged, prev_c)
        p = plan(res.name, res.kind, bool(linked[k]), nxt, opts, *key)
        if p.error:
            raise ValueError(f"chain {res.chain} residue {res.name} {res.res_id}{res.ins_code}: {p.error}")
        plans.append(p)
    counts = np.array([len(p.names) for p in plans], np.int64)
    if not counts.sum():
        return
    first = starts(np.array([len(r.names) for r in residues], np.int64))
    owner = np.repeat(np.arange(R), counts)
    how = np.concatenate([p.how for p in plans])
    refs = np.concatenate([p.refs for p in plans]) + first[owner][:, None]
    amide = how == AMIDE
    refs[amide, 2] = (first[owner - 1] + c_at[owner])[amide]  # the previous residue's C
    xyz = np.concatenate([r.xyz for r in residues])
    pos, done = place_all(xyz, how, refs, np.concatenate([p.coef for p in plans]))
    degenerate = []
    names = [h for p in plans for h in p.names]
    on = [x for p in plans for x in p.on]
    for i in np.flatnonzero(~done).tolist():  # one by one: its own message
        res = residues[owner[i]]
        coords = {a: x for a, x, e in zip(res.names, res.xyz, res.elements, strict=True) if e != "H"}
        prev_c = xyz[refs[i, 2]] if how[i] == AMIDE else None
        label = f"chain {res.chain} residue {res.name} {res.res_id}{res.ins_code}"
        pos[i], ok = place(res.name, res.kind, names[i], on[i], coords, prev_c, label)
        if not ok:
            degenerate.append(f"{res.chain} {res.name} {res.res_id}{res.ins_code} {names[i]}")
    # every residue's atoms, then its hydrogens, in one array (each residue's xyz a view of it)
    sizes = np.diff(np.append(first, len(xyz)))
    at = starts(sizes + counts)
    out = np.empty((len(xyz) + len(pos), 3))
    out[np.arange(len(xyz)) + np.repeat(at - first, sizes)] = xyz
    out[np.repeat(at + sizes, counts) + segment_arange(counts)] = pos
    for k, (a, b) in enumerate(zip(at.tolist(), (at + sizes + counts).tolist(), strict=True)):
        residues[k].xyz = out[a:b]
    for k in np.flatnonzero(counts).tolist():
        res, n = residues[k], int(counts[k])
        res.names = res.names + list(plans[k].names)
        res.elements = res.elements + ["H"] * n
        res.added = res.added + [True] * n
        res.extra = res.extra + [False] * n
    if degenerate:
        more = f" and {len(degenerate) - 5} more" if len(degenerate) > 5 else ""
        warnings.warn(
            f"{len(degenerate)} completed hydrogens have coincident or collinear heavy reference atoms, "
            f"placed at their bond length in an arbitrary direction: {'; '.join(degenerate[:5])}{more}",
            stacklevel=4,
        )


# ------------------------------------------------------------------- graph
def _components(n: int, pref: np.ndarray, bonds: np.ndarray, heavy: np.ndarray):
    """Per atom its component, and the components' roots in file order: the first heavy
    atom without a template parent (a chain's first ``N`` / ``P`` / ``O5'``, a ligand's
    first heavy atom). Linear: one connected-components pass."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    has = np.flatnonzero(pref >= 0)
    edges = np.concatenate([bonds.reshape(-1, 2), np.stack([has, pref[has]], 1)])
    graph = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    n_comp, label = connected_components(graph, directed=False)
    by = np.lexsort((np.arange(n), ~heavy, pref >= 0, label))
    root_of = by[np.r_[True, label[by][1:] != label[by][:-1]]]  # indexed by label
    lowest = np.full(n_comp, n, np.int64)
    np.minimum.at(lowest, label, np.arange(n))
    return label, root_of, root_of[np.argsort(lowest)]


def _tree(
    n: int,
    pref: np.ndarray,
    tree: np.ndarray,
    bonds: np.ndarray,
    heavy: np.ndarray,
    stamp: bool = True,
    keep_root: np.ndarray | None = None,
):
    """Parents, ``virtual`` (the roots hung off the frame) and the frame ``(r0, r1, r2)`` of
    the module doc's trees. ``bonds``: the bonds a tree may follow (no cross-links).
    ``keep_root``: ``(n,)`` the atoms of ``Protein``'s view (``breaks="continue"``: the standard
    amino acids' heavy atoms); a stamped first tree rooted at one, whose root's children are all
    such atoms, keeps its root (``Protein``'s frame) instead of moving it to a leaf.

    ``pref``: template parents; ``tree``: the templates' tree parents. A component whose
    atoms all have a tree parent but its root is stamped: its parents are the templates'.
    The others (pieces a residue's own growth does not cover) are grown atom by atom
    (:func:`_grow`); ``stamp=False`` grows every component (the reference)."""
    label, root_of, roots = _components(n, pref, bonds, heavy)
    first = label[roots[0]]
    ok = _complete(label, tree, root_of) if stamp else np.zeros(len(root_of), bool)
    if (label == first).sum() < 3:  # a tiny first component (an ion): the frame grows through the next
        ok[:] = False
    parent = np.where(ok[label], tree, -1)
    frame = _stamped_frame(int(roots[0]), parent, keep_root) if ok[first] else None
    if frame is None and ok[first]:  # no leaf beside the root: grown
        ok[first] = False
        parent[label == first] = -1
    children, nbrs = _adjacency(~ok[label], pref, bonds)
    placed = ok[label].copy()
    virtual = np.zeros(n, bool)
    frame = frame or []
    for root in roots[~ok[label[roots]]].tolist():
        tree = _grow(root, children, nbrs, pref, parent, placed)
        if not frame:
            tree = _leaf_root(tree, parent)
        elif len(frame) < 3:  # tiny first components (ions): the frame grows through the next
            parent[tree[0]] = frame[-1]
        else:
            parent[tree[0]] = frame[2]
            virtual[tree[0]] = True
        if len(frame) < 3:  # extend the frame along first children
            kids: dict[int, int] = {}
            for v in tree[1:]:
                kids.setdefault(int(parent[v]), v)
            v = tree[0]
            while v is not None and len(frame) < 3:
                frame.append(v)
                v = kids.get(v)
    rest = roots[ok[label[roots]] & (label[roots] != first)]
    parent[rest], virtual[rest] = frame[2], True
    return parent, virtual, tuple(frame)


def _complete(label: np.ndarray, pref: np.ndarray, root_of: np.ndarray) -> np.ndarray:
    """Per component: every atom but its root has a template parent, and following
    parents leads every atom to the root (pointer doubling: log depth numpy steps)."""
    n = len(pref)
    top = np.where(pref >= 0, pref, np.arange(n))
    for _ in range(max(1, n.bit_length())):
        top = top[top]
    wrong = (top != root_of[label]) | ((pref < 0) & (np.arange(n) != root_of[label]))
    return np.bincount(label, weights=wrong, minlength=len(root_of)) == 0


def _stamped_frame(root: int, parent: np.ndarray, keep_root=None) -> list[int] | None:
    """The first tree's frame with its template parents (``_leaf_root``'s re-rooting at a
    leaf child of a root with several children, unless they and the root are ``keep_root``
    atoms, :func:`_tree`; its children in index order, as grown); None where the root has no
    leaf child (then it is grown)."""
    kids = np.flatnonzero(parent == root)
    if keep_root is not None and len(kids) > 1 and keep_root[root] and keep_root[kids].all():
        # Protein's frame: r2 is r1's first child, else the root's second
        grand = np.flatnonzero(parent == kids[0])
        return [root, int(kids[0]), int(grand[0] if len(grand) else kids[1])]
    if len(kids) > 1:
        n_kids = np.bincount(parent[parent >= 0], minlength=len(parent))
        leaves = kids[n_kids[kids] == 0]
        if not len(leaves):
            return None
        leaf = int(leaves[0])
        parent[root], parent[leaf] = leaf, -1
        root, kids = leaf, np.array([root])
    c1 = int(kids[0])
    return [root, c1, int(np.flatnonzero(parent == c1)[0])]


def _adjacency(mask: np.ndarray, pref: np.ndarray, bonds: np.ndarray):
    """Template children and bonded neighbours of the atoms in ``mask`` (those grown)."""
    children: dict[int, list[int]] = {}
    nbrs: dict[int, list[int]] = {}
    for v in np.flatnonzero(mask & (pref >= 0)).tolist():
        children.setdefault(int(pref[v]), []).append(v)
    for i, j in bonds[mask[bonds[:, 0]]].tolist():
        nbrs.setdefault(i, []).append(j)
        nbrs.setdefault(j, []).append(i)
    return children, nbrs


def _grow(root: int, children, nbrs, pref: np.ndarray, parent: np.ndarray, placed: np.ndarray) -> list[int]:
    """One component's atoms in placement order from ``root`` (parents written into
    ``parent``): template children first, then breadth first over bonds, atoms without a
    template parent before those with one (ring closures, missing atoms, ligands)."""
    placed[root] = True
    out, queue = [root], deque([root])
    frontier: list[tuple[int, int, int]] = []  # (has a preferred parent, atom, parent)
    while True:
        while queue:
            u = queue.popleft()
            for c in children.get(u, ()):
                if not placed[c]:
                    placed[c], parent[c] = True, u
                    out.append(c)
                    queue.append(c)
            for c in nbrs.get(u, ()):
                if not placed[c]:
                    heapq.heappush(frontier, (int(pref[c] >= 0), c, u))
        while frontier and placed[frontier[0][1]]:
            heapq.heappop(frontier)
        if not frontier:
            return out
        _, v, p = heapq.heappop(frontier)
        placed[v], parent[v] = True, p
        out.append(v)
        queue.append(v)


def _leaf_root(grown: list[int], parent: np.ndarray) -> list[int]:
    """The structure's first tree re-rooted, if its root has several children, at a leaf
    (a child of the root if one is a leaf: the N-terminal ``H1``, a phosphate oxygen). A
    root with a single child keeps every row rigid: its child ``BOND``, the first grandchild
    ``PLANAR``, every other row ``PROPER`` / ``OFFSET`` (further children of a root would be
    position-anchored)."""
    root = grown[0]
    nkids: dict[int, int] = {}
    for v in grown[1:]:
        nkids[int(parent[v])] = nkids.get(int(parent[v]), 0) + 1
    if nkids.get(root, 0) <= 1:
        return grown
    leaves = [v for v in grown[1:] if v not in nkids]
    near = [v for v in leaves if parent[v] == root]
    leaf = (near or leaves)[0]
    path = [leaf]
    while path[-1] != root:
        path.append(int(parent[path[-1]]))
    parent[path[1:]] = path[:-1]
    parent[leaf] = -1
    on_path = set(path)
    return path + [v for v in grown if v not in on_path]


def _rows(parent: np.ndarray, frame: tuple, key: np.ndarray, heavy: np.ndarray, virtual, rule) -> np.ndarray:
    """Rows over the tree (module doc), stamped from the parents: ``(parent, grandparent,
    great-grandparent)`` (PROPER), OFFSET on a representative sibling; the frame's
    ``r1`` BOND, ``r2`` PLANAR, ``r1``'s other children on ``r2``. The ``virtual`` roots
    (other chains, ligands) stay PROPER rows of their own: no torsion of the frame's
    atoms turns them. ``rule`` ``(n,)`` (:func:`_amino_rule`): for the standard amino acids'
    heavy atoms ``Protein``'s choice, the sibling to be OFFSET on (``>= 0``) or PROPER
    (-1); -2 for the other atoms, which are OFFSET on their group's representative (the
    atom of a named torsion, else the first heavy atom, else the first) unless they are it."""
    n = len(parent)
    r0, r1, r2 = frame
    up = np.append(parent, -1)  # up[-1] == -1: the parent of "none" is none
    a, d = up[parent], up[up[parent]]
    refs = np.stack([parent, a, d], 1)
    on_r1 = parent == r1
    refs[on_r1, 2] = np.where(np.arange(n)[on_r1] == r2, -1, r2)
    proper = (d >= 0) & ~virtual
    own = proper & (rule >= 0)
    own[own] = parent[rule[own]] == parent[own]  # still its sibling in this tree
    refs[own, 2] = rule[own]
    # one representative per group of the other proper siblings; the others OFFSET on it
    rank = np.where(key, 0, np.where(heavy, 1, 2)) * n + np.arange(n)
    sib = np.flatnonzero(proper & ~own)
    best = np.full(n, n * 3, np.int64)
    np.minimum.at(best, parent[sib], rank[sib])
    rep = best[parent[sib]] % n
    off = (sib != rep) & (rule[sib] == -2)
    refs[sib[off], 2] = rep[off]
    # a root kept with several children (Protein's frame, _stamped_frame's keep_root): its other
    # children on (r0, r1, r2), r2 itself PLANAR on (r0, r1) where it is one of them, and a
    # dihedral that runs off the root on r1, as Protein's rows (none of these without keep_root)
    refs[(parent == r0) & (np.arange(n) != r1)] = (r0, r1, r2)
    if parent[r2] == r0:
        refs[r2] = (r0, r1, -1)
    refs[(refs[:, 1] == r0) & (refs[:, 2] < 0) & (np.arange(n) != r2), 2] = r1
    return refs


def _amino_rule(residues: list[_Res], linked, residue, names, heavy, extra, breaks: str):
    """``(N,)`` tree parents (-1: none) and row ``rule`` (:func:`_rows`) of the standard amino
    acids' heavy atoms, by ``Protein``'s own routine (``zmat.protein.layout.amino_tree``): the
    template parent, else a bonded atom placed earlier, else a virtual link (the residue's
    ``C, CA, N``, the previous one's, the nearest earlier atom of depth >= 2); OFFSET only on
    the template's sibling. ``breaks="continue"`` links every amino acid to the amino acid
    before it in the file (``Protein``'s one tree), ``"pieces"`` only those ``linked``. An
    in-chain modified amino acid (``MSE``) is in that tree as its parent type (its neighbours'
    rows see it; its torsion atoms are never OFFSET on a virtual link's child), but keeps its
    own template's parents."""
    n = len(residue)
    parent, rule = np.full(n, -1, np.int64), np.full(n, -2, np.int64)
    rtypes = [residue_type(r.name, r.family) if r.family == "protein" else "" for r in residues]
    types = np.array([AMINO_TYPE.get(t, -1) for t in rtypes], np.int64)
    aa = np.flatnonzero(types >= 0)
    if not len(aa):
        return parent, rule
    index = np.full(len(residues), -1, np.int64)
    index[aa] = np.arange(len(aa))
    sel = np.flatnonzero((types[residue] >= 0) & heavy & ~extra)
    modified = np.array([r.name != t for r, t in zip(residues, rtypes, strict=True)])
    names = names.copy()
    for i in sel[modified[residue[sel]]].tolist():  # MSE's SE in SD's slot (few atoms)
        names[i] = parent_name(residues[residue[i]].name, str(names[i]))
    slot = template_slots(types[residue[sel]], names[sel])
    sel, slot = sel[slot >= 0], slot[slot >= 0]
    where = np.full((len(aa), SLOTS_PER_RESIDUE), -1, np.int64)  # atom of each residue slot
    where[index[residue[sel]], slot] = sel
    follows = np.r_[False, np.diff(aa) == 1]
    link = follows if breaks == "continue" else follows & linked[aa]
    t = amino_tree(types[aa], where >= 0, link, np.zeros(len(aa), bool))
    g = where[t.atoms.res_of, t.atoms.slot]  # atom of each of the tree's atoms
    s = t.refs[:, 2]
    sibling = (s >= 0) & (t.parent[np.maximum(s, 0)] == t.parent)
    std = ~modified[aa[t.atoms.res_of]]  # a modified residue's parents are its template's
    parent[g[std]] = np.where(t.parent >= 0, g[t.parent], -1)[std]
    rule[g] = np.where(sibling, g[np.maximum(s, 0)], -1)  # (_rows checks a sibling is one)
    return parent, rule


# ------------------------------------------------------------------- parse
def parse_complex(
    atoms, chain=None, hydrogens=False, ligands: bool = False, stamped: bool = True, breaks: str = "pieces"
) -> ComplexAtoms:
    """All kept atoms of an ``AtomArray`` with bonds, rows and torsion atoms.

    Args:
        atoms: ``biotite.structure.AtomArray`` (one model).
        chain: a chain ID or a list of them; default all chains.
        hydrogens: False (heavy atoms only), True (the file's hydrogens and
            the missing ones completed, :class:`~zmat.structure.hydrogens.Protonation`
            defaults) or a ``Protonation``.
        ligands: keep the residues that are neither polymer nor water.
        stamped: rows stamped from the residue templates (``zmat/structure/templates.py``);
            False compiles every residue anew and grows every tree atom by atom (the
            reference the stamped rows are tested against: the same arrays).
        breaks: the chain-break rule. ``"pieces"``: every piece (a chain, its part after a
            break, a ligand) is its own rigid body off the frame (``Complex``).
            ``"continue"``: an amino acid not linked to the previous residue, an amino acid
            with a ``C``, hangs its ``N`` off that ``C`` (the ``Protein`` view: one tree, the
            rows of ``zmat.protein.layout`` on complete residues); other pieces as ``"pieces"``.

    Raises:
        ValueError: unknown chain, nothing left, a residue without a CCD
            entry, a missing hydrogen without heavy atoms to place it from
            (naming chain, residue and atom).
    """
    if breaks not in ("pieces", "continue"):
        raise ValueError(f"breaks must be 'pieces' or 'continue', got {breaks!r}")
    opts = hydrogens if isinstance(hydrogens, Protonation) else Protonation()
    residues = _residues(*_select(atoms, chain, bool(hydrogens), ligands))
    linked = _linked(residues)
    bridges = _disulfides(residues)
    if hydrogens:
        _complete_hydrogens(residues, linked, opts, {k for pair in bridges for k in pair})
    bonds, orders, tree_ok, pref, tree, key, quads = stamp(residues, linked, bridges, cache=stamped)
    sizes = np.array([len(r.names) for r in residues], np.int64)
    n = int(sizes.sum())
    xyz = np.concatenate([r.xyz for r in residues]).reshape(n, 3)
    elements = np.array(_flat(r.elements for r in residues), "U2")
    residue = segment_ids(sizes)
    heavy = elements != "H"
    atom_names = np.array(_flat(r.names for r in residues), "U6")
    extra = np.array(_flat(r.extra for r in residues), bool)
    aa_parent, rule = _amino_rule(residues, linked, residue, atom_names, heavy, extra, breaks)
    pref = np.where((aa_parent >= 0) & (pref < 0), aa_parent, pref)  # one rule for missing parents
    tree = np.where(aa_parent >= 0, aa_parent, tree)
    keep_root = (rule != -2) & heavy if breaks == "continue" else None  # Protein's view's atoms
    parent, virtual, frame = _tree(n, pref, tree, bonds[tree_ok], heavy, stamped, keep_root)
    last = quads[:, :N_DIHEDRALS, 3]
    key[last[last >= 0]] = True  # a torsion's atom represents its siblings (not the ring nu)
    refs = _rows(parent, frame, key, heavy, virtual, rule)

    def label(i: int) -> str:
        r = residues[residue[i]]
        return f"{r.chain} {r.name} {r.res_id}{r.ins_code} {atom_names[i]}"

    if warn_coincident(xyz, label):
        refs = reroute_degenerate(refs, xyz)
    fam = np.array([r.family for r in residues])
    poly = np.cumsum(fam != "ligand") - 1
    plain = ~extra[bonds].any(1)  # no torsion about a bond by distance
    own = (fam == "ligand") | np.array([r.name != residue_type(r.name, r.family) for r in residues])
    lig_rows, lig_quads, lig_res = _ligand_torsions(
        own, residues, residue, bonds[plain], orders[plain], elements, atom_names, parent, refs
    )
    return ComplexAtoms(
        atom_names=atom_names,
        elements=elements,
        residue=residue,
        xyz=xyz,
        added=np.array(_flat(r.added for r in residues), bool),
        extra=extra,
        res_names=np.array([r.name for r in residues], "U5"),
        res_ids=np.array([r.res_id for r in residues], np.int64),
        ins_codes=np.array([r.ins_code for r in residues], "U1"),
        chain_ids=np.array([r.chain for r in residues], str),  # as long as the file's
        hetero=np.array([r.hetero for r in residues], bool),
        family=fam,
        res_types=np.array([residue_type(r.name, r.family) for r in residues], "U5"),
        polymer_index=np.where(fam != "ligand", poly, -1),
        bonds=bonds,
        bond_orders=orders,
        refs=refs,
        quads=quads,
        key=key,
        ligand_rows=lig_rows,
        ligand_quads=lig_quads,
        ligand_residue=lig_res,
        linked=linked,
    )


def _flat(lists) -> list:
    """The per-residue lists one after the other."""
    return list(itertools.chain.from_iterable(lists))


def _ligand_torsions(own, residues, residue, bonds, orders, elements, atom_names, parent, refs):
    """The rotatable-bond torsions (``ComplexAtoms.ligand_rows`` .. ``ligand_residue``) of the
    residues ``own`` (ligands; modified residues, their bonds beyond their parent's:
    ``modified.beyond_parent``), each one's bonds grouped once (linear in atoms and ligands),
    each residue variant's rotatable bonds found once (:func:`_own_rotatable`, local indices)."""
    ri = residue[bonds[:, 0]]
    inside = np.flatnonzero((ri == residue[bonds[:, 1]]) & own[ri])
    inside = inside[np.argsort(ri[inside], kind="stable")]
    cuts = np.searchsorted(ri[inside], np.flatnonzero(own), side="left")
    ends = np.searchsorted(ri[inside], np.flatnonzero(own), side="right")
    first = np.searchsorted(residue, np.arange(len(residues)))
    rot, owner = [np.zeros((0, 2), np.int64)], [np.zeros(0, np.int64)]
    for k, s, e in zip(np.flatnonzero(own).tolist(), cuts.tolist(), ends.tolist(), strict=True):
        if e - s < 3:  # no rotatable bond with fewer than three bonds
            continue
        sel, f, res = inside[s:e], int(first[k]), residues[k]
        variant = (res.family, res.name, tuple(res.names), tuple(res.elements))
        r = _own_rotatable(*variant, (bonds[sel] - f).tobytes(), orders[sel].tobytes())
        rot.append(r + f)
        owner.append(np.full(len(r), k, np.int64))
    rot, owner = np.concatenate(rot), np.concatenate(owner)
    rows, quads, kept = torsion_rows(rot, parent, refs)
    return rows, quads, owner[kept]


@functools.lru_cache(maxsize=4096)  # one entry per residue variant met; bounded
def _own_rotatable(family: str, name: str, names: tuple, elements: tuple, bonds: bytes, orders: bytes):
    """The rotatable bonds of one residue variant (``bonds``, ``orders``: its bonds' bytes, local
    indices): a ligand's (``ligands.rotatable_bonds``), a modified residue's beyond its parent's."""
    bonds = np.frombuffer(bonds, np.int64).reshape(-1, 2)
    orders = np.frombuffer(orders, np.int64)
    atoms, elements, names = np.unique(bonds), np.array(elements), np.array(names)
    if family == "ligand":
        return rotatable_bonds(atoms, bonds, orders, elements)
    return beyond_parent(name, atoms, names, bonds, orders, elements)
