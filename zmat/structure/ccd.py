"""Residue definitions from the wwPDB Chemical Component Dictionary (CCD).

The CCD, as shipped by biotite (``biotite.structure.info``), gives every
component's atom names, elements, bonds with bond orders, and ideal
coordinates (``pdbx_model_Cartn_*_ideal``; biotite falls back to the model
coordinates where the ideal ones are missing). zmat uses it for

* the bond graph of nucleotides, hydrogens and ligands (amino-acid heavy
  atoms have their own templates, ``zmat/protein/topology.py``),
* the positions of missing hydrogens, taken from the ideal coordinates in the
  local frame of their heavy atom (``zmat/structure/hydrogens.py``).

biotite is the optional extra ``protein``; it is imported on first use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["CCDResidue", "ccd_residue", "has_ccd_entry"]


@dataclass(frozen=True)
class CCDResidue:
    """One CCD component.

    Attributes:
        name: the component ID (``"DA"``, ``"ATP"``).
        atom_names, elements: ``(n,)`` string arrays, CCD order.
        bonds: ``(E, 3)`` int64 rows ``(i, j, order)`` with biotite's
            ``BondType`` codes (1 single, 2 double, 3 triple, 5/6 aromatic
            single/double...).
        ideal: ``(n, 3)`` float64 ideal coordinates (Angstrom).
        link_type: the CCD's ``chem_comp.type`` (``"DNA LINKING"``, ``"NON-POLYMER"``...).
        leaving: ``(n,)`` bool, the CCD's ``pdbx_leaving_atom_flag``: atoms a polymer
            link replaces (``OXT``, ``HXT``, the amide ``H2``; ``OP3``, ``HO3'``).
    """

    name: str
    atom_names: np.ndarray
    elements: np.ndarray
    bonds: np.ndarray
    ideal: np.ndarray
    link_type: str
    leaving: np.ndarray

    def index(self) -> dict[str, int]:
        return {a: i for i, a in enumerate(self.atom_names.tolist())}

    def leaving_at(self, atom: str) -> frozenset[str]:
        """The leaving atoms a link at ``atom`` replaces: the flagged atoms bonded to
        it and every atom bonded to those (``C``: ``OXT``, ``HXT``; ``O3'``: ``HO3'``)."""
        nb = self.neighbors()
        flagged = dict(zip(self.atom_names.tolist(), self.leaving.tolist(), strict=True))
        out = {y for y in nb.get(atom, []) if flagged[y]}
        return frozenset(out | {z for y in out for z in nb[y] if z != atom})

    def neighbors(self) -> dict[str, list[str]]:
        """Bonded atom names of every atom, in bond order."""
        nb: dict[str, list[str]] = {a: [] for a in self.atom_names.tolist()}
        names = self.atom_names
        for i, j, _ in self.bonds.tolist():
            nb[names[i]].append(str(names[j]))
            nb[names[j]].append(str(names[i]))
        return nb


@functools.cache
def ccd_residue(name: str) -> CCDResidue:
    """The CCD entry of residue ``name`` (cached).

    Raises:
        ValueError: ``name`` has no entry in the CCD biotite ships.
    """
    import biotite.structure.info as info

    try:
        res = info.residue(name, allow_missing_coord=True)
    except KeyError:
        raise ValueError(
            f"residue {name!r} has no entry in the Chemical Component Dictionary "
            "(biotite.structure.info), so its atoms and bonds are unknown"
        ) from None
    bonds = res.bonds.as_array().astype(np.int64) if res.bonds is not None else np.zeros((0, 3), np.int64)
    ideal = res.coord.astype(np.float64)
    try:
        link = str(info.link_type(name))
    except KeyError:
        link = ""
    flags = info.get_from_ccd("chem_comp_atom", name, "pdbx_leaving_atom_flag")
    leaving = np.asarray(flags.as_array(str) if flags is not None else [], dtype="U1") == "Y"
    return CCDResidue(
        name=name,
        atom_names=np.asarray(res.atom_name, dtype="U6"),
        elements=np.asarray([e.capitalize() for e in res.element], dtype="U2"),
        bonds=bonds,
        ideal=ideal,
        link_type=link,
        leaving=leaving if len(leaving) == len(res.atom_name) else np.zeros(len(res.atom_name), bool),
    )


def has_ccd_entry(name: str) -> bool:
    """True when the CCD has residue ``name``."""
    try:
        ccd_residue(name)
    except ValueError:
        return False
    return True
