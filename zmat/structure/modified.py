"""Modified residues in a chain: the standard residue type each one is built as.

A modified residue linked into a chain (MSE, SEP, HYP, 5MU, PSU, CCC, A23...) is a
polymer residue of its *parent type*: the wwPDB Chemical Component Dictionary's
``mon_nstd_parent_comp_id`` (``MSE -> MET``, ``5MU -> U``, ``CCC -> C``), when that is
one of the 20 amino acids or the 8 nucleotides. It keeps its own name, atoms, bonds
and hydrogens (its own CCD entry), and takes its parent's tree, named torsions
(``phi .. chi4``; ``alpha .. chi``, the pucker) and AlphaFold residue type.

Atoms are matched to the parent's by the CCD's graphs (:func:`aliases`): atoms of the same
name, then a parent heavy atom without one takes the residue's one unmatched atom bonded to
its matched neighbours' matches. So MSE's selenium ``SE`` stands in ``SD``'s place, as
AlphaFold's data pipeline puts it (``alphafold/data/templates.py``, ``_get_atom_positions``:
"Put the coordinates of the selenium atom in the sulphur column";
``residue_constants.CCD_NAME_TO_ONE_LETTER`` maps ``MSE`` to ``M``), and pyroglutamate's
``OE`` in GLN's ``OE1``. Pseudouridine has all of U's ring names, bonded otherwise: its ring
atoms stand in U's by their bonds (:data:`ALIASES`; its ``C5`` in ``N1``'s place). A parent
atom that the residue lacks, or that is not bonded as in the parent, leaves the parent's tree
edge to it and the torsions through it out (they are grown over the residue's bonds / NaN).
The residue's rotatable bonds that its parent does not have (SEP's ``CB-OG`` and ``OG-P``, a
2'-O-methyl's ``C2'-O2'``: :func:`beyond_parent`) are torsions of its own, in
``ligand_torsions``. A residue without such a parent (an abasic site ``3DR``, a chromophore
made of three residues, ``NRQ``) stays a residue of its own: linked, its rotatable bonds
ligand torsions.
"""

from __future__ import annotations

import functools

import numpy as np

from ..protein.topology import RESIDUES
from .ligands import rotatable_bonds
from .nucleic import NUCLEOTIDES

__all__ = [
    "ALIASES",
    "aliases",
    "beyond_parent",
    "is_cysteine",
    "own_name",
    "parent_atoms",
    "parent_name",
    "parent_type",
    "residue_type",
]

#: Renamings the CCD's graphs do not give (:func:`aliases` derives the rest: MSE's ``SE`` for
#: ``SD``): parent atom name -> own atom name. PSU (pseudouridine, a C-glycoside) has every one of
#: U's ring names, bonded otherwise: the uracil ring is bonded through C5, so its glycosidic torsion
#: chi is O4'-C1'-C5-C4, U's O4'-C1'-N1-C2.
ALIASES = {
    "PSU": {"N1": "C5", "C2": "C4", "O2": "O4", "C4": "C2", "O4": "O2", "C5": "N1"},
}
_STANDARD = frozenset(RESIDUES) | frozenset(NUCLEOTIDES)


@functools.cache
def parent_type(name: str) -> str:
    """The standard residue (one of the 20 amino acids or 8 nucleotides) that residue
    ``name`` is a modification of (the CCD's ``mon_nstd_parent_comp_id``), ``""`` when it
    has none, several, or no CCD entry; a standard residue is its own."""
    if name in _STANDARD:
        return name
    import biotite.structure.info as info

    try:
        col = info.get_from_ccd("chem_comp", name, "mon_nstd_parent_comp_id")
    except KeyError:
        return ""
    parent = str(col.as_array(str)[0]).strip() if col is not None else ""
    return parent if parent in _STANDARD else ""


def residue_type(name: str, family: str) -> str:
    """The type a polymer residue is built as (``MSE`` -> ``MET``); ``""`` for a ligand."""
    return "" if family == "ligand" else name if name in _STANDARD else parent_type(name)


def aliases(name: str) -> dict:
    """Parent atom name -> residue ``name``'s own atom name, where they differ: :data:`ALIASES`,
    else derived from the CCD (:func:`_derived_aliases`; PCA: ``OE1`` -> ``OE``)."""
    return ALIASES[name] if name in ALIASES else _derived_aliases(name)


def _heavy_graph(name: str):
    import biotite.structure.info as info

    r = info.residue(name)
    names, heavy = r.atom_name.tolist(), r.element != "H"
    adj = {a: set() for a, h in zip(names, heavy, strict=True) if h}
    for i, j in r.bonds.as_array()[:, :2].tolist():
        if heavy[i] and heavy[j]:
            adj[names[i]].add(names[j])
            adj[names[j]].add(names[i])
    return adj, dict(zip(names, r.element.tolist(), strict=True))


@functools.cache
def _derived_aliases(name: str) -> dict:
    """The renamings of modified residue ``name`` by graph matching on the bonded heavy atoms of
    its CCD entry and its parent's: atoms of the same name match; then, until nothing changes, a
    parent heavy atom without a match takes the one unmatched atom bonded to the matches of all its
    matched neighbours (of its element if several; MSE's ``SE`` for ``SD``, PCA's ``OE`` for
    ``OE1``); none when that is not unique."""
    parent = parent_type(name)
    if not parent or parent == name:
        return {}
    mine, elem = _heavy_graph(name)
    theirs, pelem = _heavy_graph(parent)
    match = {a: a for a in theirs if a in mine}
    changed = True
    while changed:
        changed = False
        used = set(match.values())
        for p in theirs:
            near = [match[q] for q in theirs[p] if q in match]
            if p in match or not near:
                continue
            cand = set.intersection(*(mine[m] for m in near)) - used
            if len(cand) > 1:
                cand = {a for a in cand if elem[a] == pelem[p]}
            if len(cand) == 1:
                match[p] = cand.pop()
                used.add(match[p])
                changed = True
    return {p: a for p, a in match.items() if p != a}


def own_name(res_name: str, atom: str) -> str:
    """The name residue ``res_name`` gives its parent's atom ``atom`` (``MSE``: ``SD`` -> ``SE``)."""
    return aliases(res_name).get(atom, atom) if res_name not in _STANDARD else atom


def parent_name(res_name: str, atom: str) -> str:
    """The parent's name of residue ``res_name``'s atom ``atom`` (``MSE``: ``SE`` -> ``SD``)."""
    if res_name in _STANDARD:
        return atom
    for p, own in aliases(res_name).items():
        if own == atom:
            return p
    return atom


def is_cysteine(name: str, family: str, atoms) -> bool:
    """Residue ``name`` is a cysteine, or a modified one in a chain (CSO, CME: parent ``CYS``),
    with its ``SG`` among ``atoms``: a disulfide partner."""
    return residue_type(name, family) == "CYS" and own_name(name, "SG") in atoms


@functools.cache
def parent_atoms(name: str) -> frozenset:
    """The atoms of modified residue ``name`` (its own CCD names) that stand in a parent atom's
    place (:func:`parent_name`); empty without a standard parent."""
    parent = parent_type(name)
    if not parent or parent == name:
        return frozenset()
    import biotite.structure.info as info

    have = set(info.residue(parent).atom_name.tolist())
    return frozenset(a for a in info.residue(name).atom_name.tolist() if parent_name(name, a) in have)


def beyond_parent(name: str, atoms: np.ndarray, atom_names, bonds, orders, elements) -> np.ndarray:
    """``(k, 2)`` the rotatable bonds (``zmat/structure/ligands.py``'s rule) of modified residue
    ``name`` (atom indices ``atoms``, ``bonds`` within it) that its parent does not have: those
    not rotatable among its atoms in the parent's places (SEP: ``CB-OG``, ``OG-P``; OMC: ``C2'-O2'``;
    not SEP's ``CA-CB``, its parent's chi1). Its own torsions (``ligand_torsions``)."""
    every = rotatable_bonds(atoms, bonds, orders, elements)
    mine = parent_atoms(name)
    part = atoms[np.isin(atom_names[atoms], list(mine))]
    theirs = {tuple(b) for b in rotatable_bonds(part, bonds, orders, elements).tolist()}
    return every[np.array([tuple(b) not in theirs for b in every.tolist()], bool).reshape(-1)]
