"""Modified residues in a chain: the standard residue type each one is built as.

A modified residue linked into a chain (MSE, SEP, HYP, 5MU, PSU, CCC, A23...) is a
polymer residue of its *parent type*: the wwPDB Chemical Component Dictionary's
``mon_nstd_parent_comp_id`` (``MSE -> MET``, ``5MU -> U``, ``CCC -> C``), when that is
one of the 20 amino acids or the 8 nucleotides. It keeps its own name, atoms, bonds
and hydrogens (its own CCD entry), and takes its parent's tree, named torsions
(``phi .. chi4``; ``alpha .. chi``, the pucker) and AlphaFold residue type.

Atoms are matched to the parent's by name, but for the renamings of :data:`ALIASES`:
MSE's selenium ``SE`` stands in ``SD``'s place, as AlphaFold's data pipeline puts it
(``alphafold/data/templates.py``, ``_get_atom_positions``: "Put the coordinates of the
selenium atom in the sulphur column"; ``residue_constants.CCD_NAME_TO_ONE_LETTER`` maps
``MSE`` to ``M``), and pseudouridine's ring atoms stand in U's by their bonds (its
``C5`` in ``N1``'s place). A parent atom that the residue lacks, or that is not bonded
as in the parent, leaves the parent's tree edge to it and the torsions through it out
(they are grown over the residue's bonds / NaN). A residue without such a parent (an
abasic site ``3DR``, a chromophore made of three residues, ``NRQ``) stays a residue of
its own: linked, its rotatable bonds ligand torsions.
"""

from __future__ import annotations

import functools

from ..protein.topology import RESIDUES
from .nucleic import NUCLEOTIDES

__all__ = ["ALIASES", "own_name", "parent_name", "parent_type", "residue_type"]

#: Per modified residue, parent atom name -> its own atom name (the rest: the same name). MSE: the
#: selenium in the sulphur's place (AlphaFold's rule); PSU (pseudouridine, a C-glycoside): the uracil
#: ring bonded through C5, so its glycosidic torsion chi is O4'-C1'-C5-C4, U's O4'-C1'-N1-C2.
ALIASES = {
    "MSE": {"SD": "SE"},
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


def own_name(res_name: str, atom: str) -> str:
    """The name residue ``res_name`` gives its parent's atom ``atom`` (``MSE``: ``SD`` -> ``SE``)."""
    return ALIASES.get(res_name, {}).get(atom, atom)


def parent_name(res_name: str, atom: str) -> str:
    """The parent's name of residue ``res_name``'s atom ``atom`` (``MSE``: ``SE`` -> ``SD``)."""
    for p, own in ALIASES.get(res_name, {}).items():
        if own == atom:
            return p
    return atom
