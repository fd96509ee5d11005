"""Residue templates of the 20 standard amino acids: heavy atoms, construction
rows, bonds and ideal geometry.

Every template lists its heavy atoms in PDB order (``N, CA, C, O, CB, ...``,
``OXT`` last) and, for each atom, its *canonical construction row*
``(b, a, d)``. Names prefixed ``-`` are atoms of the previous residue, ``+`` of
the next one. Rows follow the chemistry and form one rigid tree, so that every
row is ``PROPER`` or ``OFFSET`` (``zmat/table.py``):

========  =====================  ====================================
atom      row ``(b, a, d)``       dihedral column
========  =====================  ====================================
``N``     ``(-C, -CA, -N)``      psi of the previous residue
``CA``    ``(N, -C, -CA)``       omega of the previous residue
``C``     ``(CA, N, -C)``        phi
``O``     ``(C, CA, +N)``        180 deg (offset on the next ``N``)
``O``     ``(C, CA, OXT)``       180 deg, at a C-terminus with ``OXT``
``OXT``   ``(C, CA, N)``         psi (``OXT`` stands where ``+N`` would)
``CB``    ``(CA, N, C)``         fixed improper, L-chirality (offset on ``C``)
``XG``    ``(CB, CA, N)``        chi1, then chi2..chi4 down the side chain
others    ``(b, a, sibling)``    fixed, e.g. ``CG2`` of Val on ``CG1``
========  =====================  ====================================

The side-chain dihedrals chi1..chi4 are the IUPAC ones (chi1 = N-CA-CB-XG,
chi2 = CA-CB-XG-XD with ``CD1``/``OD1``/``ND1``/``SD``, ...). Ring closures
(Pro ``CD-N``, Phe/Tyr ``CE2-CZ``, His ``CE1-NE2``, Trp ``NE1-CE2`` and
``CZ3-CH2``) are not rows of the tree; they are listed in ``ring_bonds`` so
that clash exclusions see them.

Ideal geometry (templates store Angstrom and radians; ``IDEAL`` lists the
backbone values below in Angstrom and degrees):

* backbone, ``CB`` and ``OXT``: Engh & Huber (1991), Acta Cryst. A47, 392:
  N-CA 1.458, CA-C 1.525, C-N 1.329, C=O 1.231, CA-CB 1.530; N-CA-C 111.2,
  CA-C-N 116.2, C-N-CA 121.7, CA-C-O 120.8 (so O=C-N 123.0 with a planar
  carbonyl), N-CA-CB 110.5, C-CA-CB 110.1 (the improper C-N-CA-CB follows
  from these three angles and L-chirality). The C-terminal ``OXT`` is placed
  like the next residue's ``N`` (angle 116.2) with a C=O length.
* side-chain atoms beyond ``CB`` (``SIDE_CHAIN_GEOMETRY``): mean bond lengths
  and bond angles over the complete residues of three X-ray structures refined
  against Engh & Huber restraints (1aki 1.5 A, 1ubi 1.8 A, 7pfl 1.8 A; the
  files are in ``tests/data``, and a test recomputes the table from them),
  rounded to 0.001 A and 0.1 deg. Fixed dihedrals of planar groups (rings,
  carboxylates, amides, guanidinium) are exactly 0 or 180 deg, with Arg
  ``NH1`` cis to ``CD`` (IUPAC); those of tetrahedral branches (``CG2`` of
  Val/Thr/Ile, ``CD2`` of Leu) are the measured means.

The Chemical Component Dictionary's ideal coordinates (shipped by biotite)
give the atom names and the bond graph, and a test checks the templates
against them, but not the values: they model the free, neutral amino acid
with a force field (109.5 deg at CB where proteins have 113-116 deg, protonated
Asp/Glu carboxylates with C-O 1.21/1.34 A, Arg ``NH1`` trans to ``CD``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._geometry import dihedral_from_bonds

__all__ = [
    "AA1",
    "AA3",
    "BACKBONE",
    "CHI_ATOMS",
    "IDEAL",
    "PRO_DEFAULT_CHI",
    "RESIDUES",
    "SIDE_CHAIN_GEOMETRY",
    "TORSION_NAMES",
    "ResidueTemplate",
    "one_to_three",
]

#: Order of the torsion columns everywhere in ``zmat.protein``.
TORSION_NAMES = ("phi", "psi", "omega", "chi1", "chi2", "chi3", "chi4")
PHI, PSI, OMEGA, CHI1 = 0, 1, 2, 3

AA3 = ("ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL").split()
AA1 = "ARNDCQEGHILKMFPSTWYV"
_ONE = dict(zip(AA1, AA3, strict=True))
BACKBONE = ("N", "CA", "C", "O")

# Engh & Huber (1991) backbone values (Angstrom, degrees).
_EH = {
    "N-CA": 1.458,
    "CA-C": 1.525,
    "C-N": 1.329,
    "C-O": 1.231,
    "CA-CB": 1.530,
    "N-CA-C": 111.2,
    "CA-C-N": 116.2,
    "C-N-CA": 121.7,
    "CA-C-O": 120.8,
    "N-CA-CB": 110.5,
    "C-CA-CB": 110.1,
}

# Where a residue type differs (Engh & Huber 1991, their proline-specific classes; Angstrom,
# degrees): proline's N is bonded to CD, which shortens N-CA and the C-N before it, widens
# CA-C-N, and closes N-CA-CB to 103.0. "CD-N" is the ring closure (not a row of the tree).
_EH_TYPE = {
    "PRO": {"N-CA": 1.466, "C-N": 1.341, "CA-C-N": 116.9, "N-CA-CB": 103.0, "CD-N": 1.473},
}

# Side chains: (atom, bond ref, angle ref, dihedral ref, torsion name or None).
# The dihedral ref is the bond ref's angle ref (PROPER) or an earlier sibling
# (OFFSET, fixed dihedral).
_SIDE = {
    "ALA": [],
    "GLY": [],
    "SER": [("OG", "CB", "CA", "N", "chi1")],
    "CYS": [("SG", "CB", "CA", "N", "chi1")],
    "VAL": [("CG1", "CB", "CA", "N", "chi1"), ("CG2", "CB", "CA", "CG1", None)],
    "THR": [("OG1", "CB", "CA", "N", "chi1"), ("CG2", "CB", "CA", "OG1", None)],
    "LEU": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("CD1", "CG", "CB", "CA", "chi2"),
        ("CD2", "CG", "CB", "CD1", None),
    ],
    "ILE": [
        ("CG1", "CB", "CA", "N", "chi1"),
        ("CG2", "CB", "CA", "CG1", None),
        ("CD1", "CG1", "CB", "CA", "chi2"),
    ],
    "MET": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("SD", "CG", "CB", "CA", "chi2"),
        ("CE", "SD", "CG", "CB", "chi3"),
    ],
    "PRO": [("CG", "CB", "CA", "N", "chi1"), ("CD", "CG", "CB", "CA", "chi2")],
    "PHE": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("CD1", "CG", "CB", "CA", "chi2"),
        ("CD2", "CG", "CB", "CD1", None),
        ("CE1", "CD1", "CG", "CB", None),
        ("CE2", "CD2", "CG", "CB", None),
        ("CZ", "CE1", "CD1", "CG", None),
    ],
    "TYR": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("CD1", "CG", "CB", "CA", "chi2"),
        ("CD2", "CG", "CB", "CD1", None),
        ("CE1", "CD1", "CG", "CB", None),
        ("CE2", "CD2", "CG", "CB", None),
        ("CZ", "CE1", "CD1", "CG", None),
        ("OH", "CZ", "CE1", "CD1", None),
    ],
    "TRP": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("CD1", "CG", "CB", "CA", "chi2"),
        ("CD2", "CG", "CB", "CD1", None),
        ("NE1", "CD1", "CG", "CB", None),
        ("CE2", "CD2", "CG", "CB", None),
        ("CE3", "CD2", "CG", "CE2", None),
        ("CZ2", "CE2", "CD2", "CG", None),
        ("CZ3", "CE3", "CD2", "CG", None),
        ("CH2", "CZ2", "CE2", "CD2", None),
    ],
    "HIS": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("ND1", "CG", "CB", "CA", "chi2"),
        ("CD2", "CG", "CB", "ND1", None),
        ("CE1", "ND1", "CG", "CB", None),
        ("NE2", "CD2", "CG", "CB", None),
    ],
    "ASP": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("OD1", "CG", "CB", "CA", "chi2"),
        ("OD2", "CG", "CB", "OD1", None),
    ],
    "ASN": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("OD1", "CG", "CB", "CA", "chi2"),
        ("ND2", "CG", "CB", "OD1", None),
    ],
    "GLU": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("CD", "CG", "CB", "CA", "chi2"),
        ("OE1", "CD", "CG", "CB", "chi3"),
        ("OE2", "CD", "CG", "OE1", None),
    ],
    "GLN": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("CD", "CG", "CB", "CA", "chi2"),
        ("OE1", "CD", "CG", "CB", "chi3"),
        ("NE2", "CD", "CG", "OE1", None),
    ],
    "LYS": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("CD", "CG", "CB", "CA", "chi2"),
        ("CE", "CD", "CG", "CB", "chi3"),
        ("NZ", "CE", "CD", "CG", "chi4"),
    ],
    "ARG": [
        ("CG", "CB", "CA", "N", "chi1"),
        ("CD", "CG", "CB", "CA", "chi2"),
        ("NE", "CD", "CG", "CB", "chi3"),
        ("CZ", "NE", "CD", "CG", "chi4"),
        ("NH1", "CZ", "NE", "CD", None),
        ("NH2", "CZ", "NE", "NH1", None),
    ],
}

# Side-chain geometry beyond CB: atom -> (bond length A, bond angle deg, fixed
# dihedral deg or None for a chi torsion), for the rows of _SIDE; see the
# module docstring for the source. n = residues averaged.
SIDE_CHAIN_GEOMETRY = {
    "SER": {"OG": (1.415, 111.0, None)},  # n=29
    "CYS": {"SG": (1.801, 114.6, None)},  # n=20
    "VAL": {"CG1": (1.523, 110.5, None), "CG2": (1.521, 110.6, 123.0)},  # n=37
    "THR": {"OG1": (1.435, 108.8, None), "CG2": (1.523, 111.0, -121.4)},  # n=38
    "LEU": {"CG": (1.528, 115.7, None), "CD1": (1.522, 110.3, None), "CD2": (1.522, 110.4, 122.5)},  # n=46
    "ILE": {"CG1": (1.531, 110.3, None), "CG2": (1.530, 110.7, -124.1), "CD1": (1.525, 114.0, None)},  # n=24
    "MET": {"CG": (1.516, 113.6, None), "SD": (1.809, 111.3, None), "CE": (1.793, 101.0, None)},  # n=13
    "PRO": {"CG": (1.501, 104.8, None), "CD": (1.510, 106.1, None)},  # n=18
    "PHE": {
        "CG": (1.503, 113.6, None),
        "CD1": (1.389, 120.7, None),
        "CD2": (1.388, 120.4, 180.0),
        "CE1": (1.385, 120.8, 180.0),
        "CE2": (1.386, 120.7, 180.0),
        "CZ": (1.386, 119.8, 0.0),
    },  # n=22
    "TYR": {
        "CG": (1.512, 113.8, None),
        "CD1": (1.391, 120.8, None),
        "CD2": (1.391, 120.9, 180.0),
        "CE1": (1.387, 121.1, 180.0),
        "CE2": (1.389, 121.0, 180.0),
        "CZ": (1.383, 119.5, 0.0),
        "OH": (1.374, 119.5, 180.0),
    },  # n=14
    "TRP": {
        "CG": (1.499, 113.2, None),
        "CD1": (1.368, 127.2, None),
        "CD2": (1.433, 126.4, 180.0),
        "NE1": (1.371, 110.1, 180.0),
        "CE2": (1.413, 107.0, 180.0),
        "CE3": (1.394, 133.4, 180.0),
        "CZ2": (1.390, 121.9, 180.0),
        "CZ3": (1.384, 118.5, 180.0),
        "CH2": (1.380, 117.2, 0.0),
    },  # n=9
    "HIS": {
        "CG": (1.493, 113.4, None),
        "ND1": (1.378, 122.8, None),
        "CD2": (1.355, 131.1, 180.0),
        "CE1": (1.320, 109.3, 180.0),
        "NE2": (1.372, 107.0, 180.0),
    },  # n=9
    "ASP": {"CG": (1.514, 113.0, None), "OD1": (1.248, 119.9, None), "OD2": (1.255, 117.1, 180.0)},  # n=29
    "ASN": {"CG": (1.518, 112.7, None), "OD1": (1.235, 120.7, None), "ND2": (1.330, 116.4, 180.0)},  # n=37
    "GLU": {
        "CG": (1.525, 114.5, None),
        "CD": (1.511, 113.3, None),
        "OE1": (1.251, 118.3, None),
        "OE2": (1.257, 118.0, 180.0),
    },  # n=16
    "GLN": {
        "CG": (1.523, 113.3, None),
        "CD": (1.515, 112.2, None),
        "OE1": (1.234, 120.7, None),
        "NE2": (1.329, 116.0, 180.0),
    },  # n=22
    "LYS": {
        "CG": (1.521, 113.9, None),
        "CD": (1.522, 112.0, None),
        "CE": (1.520, 111.8, None),
        "NZ": (1.483, 112.0, None),
    },  # n=24
    "ARG": {
        "CG": (1.521, 114.1, None),
        "CD": (1.510, 111.2, None),
        "NE": (1.457, 111.6, None),
        "CZ": (1.333, 124.9, None),
        "NH1": (1.331, 121.2, 0.0),
        "NH2": (1.331, 119.1, 180.0),
    },  # n=26
}

_RINGS = {
    "PRO": [("CD", "N")],
    "PHE": [("CE2", "CZ")],
    "TYR": [("CE2", "CZ")],
    "HIS": [("CE1", "NE2")],
    "TRP": [("NE1", "CE2"), ("CZ3", "CH2")],
}


@dataclass(frozen=True)
class ResidueTemplate:
    """One amino acid: heavy atoms, canonical rows, bonds and ideal geometry.

    Attributes:
        name: three-letter code (``"ALA"``); ``letter`` the one-letter code.
        atoms: heavy-atom names in PDB order, ``OXT`` last.
        elements: element symbol of each atom.
        rows: canonical row ``(b, a, d)`` of each atom as names (``-`` prefix:
            previous residue, ``+``: next; ``""`` for none). ``O`` is listed with
            ``+N``; at a C-terminus with ``OXT`` it uses ``OXT`` instead.
        torsion: per atom, ``(torsion index, residue offset)`` of the torsion in
            its dihedral column, or ``None`` for a fixed dihedral (see
            ``TORSION_NAMES``).
        ideal: ``(n_atoms, 3)`` float64 ideal ``(r, theta, phi)`` of the
            canonical rows; ``phi`` is the fixed dihedral, NaN for torsions.
        bonds: intra-residue covalent bonds as name pairs, ring closures
            included (the peptide bond is added by the layout).
        ring_bonds: the bonds that close rings (not rows of the tree).
    """

    name: str
    letter: str
    atoms: tuple[str, ...]
    elements: tuple[str, ...]
    rows: tuple[tuple[str, str, str], ...]
    torsion: tuple[tuple[int, int] | None, ...]
    ideal: np.ndarray
    bonds: tuple[tuple[str, str], ...]
    ring_bonds: tuple[tuple[str, str], ...]

    def index(self, name: str) -> int:
        return self.atoms.index(name)


def geometry(name: str) -> dict[str, float]:
    """Engh & Huber's backbone values for residue type ``name`` (``IDEAL`` with the
    type's own classes, e.g. proline's)."""
    return {**_EH, **_EH_TYPE.get(name, {})}


def _improper_cb(eh: dict[str, float]) -> float:
    """Dihedral C-N-CA-CB from the three bond angles at CA, L-chirality (negative)."""
    t_nc, t_ncb, t_ccb = (math.radians(eh[k]) for k in ("N-CA-C", "N-CA-CB", "C-CA-CB"))
    # CA at the origin, N on +x, C in the xy-plane; solve for the CB direction.
    n, ca = np.array([1.0, 0.0, 0.0]), np.zeros(3)
    c = np.array([math.cos(t_nc), math.sin(t_nc), 0.0])
    x = math.cos(t_ncb)
    y = (math.cos(t_ccb) - x * c[0]) / c[1]
    cb = np.array([x, y, math.sqrt(max(1.0 - x * x - y * y, 0.0))])
    bonds = torch.from_numpy(np.stack([n - c, ca - n, cb - ca]))  # path C -> N -> CA -> CB
    return -abs(float(dihedral_from_bonds(*bonds)))


def _build_template(name: str) -> ResidueTemplate:
    side = _SIDE[name]
    atoms = ["N", "CA", "C", "O"] + (["CB"] if name != "GLY" else []) + [s[0] for s in side] + ["OXT"]
    rows = {
        "N": ("-C", "-CA", "-N"),
        "CA": ("N", "-C", "-CA"),
        "C": ("CA", "N", "-C"),
        "O": ("C", "CA", "+N"),
        "CB": ("CA", "N", "C"),
        "OXT": ("C", "CA", "N"),
    }
    torsion: dict[str, tuple[int, int] | None] = {
        "N": (PSI, -1),
        "CA": (OMEGA, -1),
        "C": (PHI, 0),
        "O": None,
        "CB": None,
        "OXT": (PSI, 0),
    }
    rad, eh = math.radians, geometry(name)
    ideal = {
        "N": (eh["C-N"], rad(eh["CA-C-N"]), math.nan),
        "CA": (eh["N-CA"], rad(eh["C-N-CA"]), math.nan),
        "C": (eh["CA-C"], rad(eh["N-CA-C"]), math.nan),
        "O": (eh["C-O"], rad(eh["CA-C-O"]), math.pi),
        "CB": (eh["CA-CB"], rad(eh["N-CA-CB"]), _improper_cb(eh)),
        "OXT": (eh["C-O"], rad(_EH["CA-C-N"]), math.nan),
    }
    geom = SIDE_CHAIN_GEOMETRY.get(name, {})
    for atom, b, a, d, tors in side:
        rows[atom] = (b, a, d)
        torsion[atom] = None if tors is None else (TORSION_NAMES.index(tors), 0)
        r, theta, phi = geom[atom]
        ideal[atom] = (r, rad(theta), math.nan if phi is None else rad(phi))
    bonds = [("N", "CA"), ("CA", "C"), ("C", "O"), ("C", "OXT")]
    bonds += [(at, rows[at][0]) for at in atoms if at not in ("N", "CA", "C", "O", "OXT")]
    rings = tuple(_RINGS.get(name, ()))
    elements = tuple(at[0] for at in atoms)
    return ResidueTemplate(
        name=name,
        letter=AA1[AA3.index(name)],
        atoms=tuple(atoms),
        elements=elements,
        rows=tuple(tuple(rows[at]) for at in atoms),
        torsion=tuple(torsion[at] for at in atoms),
        ideal=np.array([ideal[at] for at in atoms], np.float64),
        bonds=tuple(bonds) + rings,
        ring_bonds=rings,
    )


#: Templates of the 20 standard amino acids, by three-letter code.
RESIDUES: dict[str, ResidueTemplate] = {name: _build_template(name) for name in AA3}

#: Atoms of chi1..chi4 per residue (the dihedral's four atoms, IUPAC order).
CHI_ATOMS: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    name: tuple(
        (t.rows[i][2], t.rows[i][1], t.rows[i][0], t.atoms[i])
        for k in range(4)
        for i in range(len(t.atoms))
        if t.torsion[i] == (CHI1 + k, 0)
    )
    for name, t in RESIDUES.items()
}

#: The ideal geometry values used above (Engh & Huber 1991), for reference.
IDEAL = dict(_EH)
#: Proline's chi1 and chi2 where NaN is given (radians): +30 and -35 deg, the C-gamma
#: endo pucker (the generic defaults, -60 and 180 deg, cannot close its ring).
PRO_DEFAULT_CHI = (math.radians(30.0), math.radians(-35.0))


def one_to_three(sequence: str) -> list[str]:
    """``"ACD"`` -> ``["ALA", "CYS", "ASP"]``.

    Raises:
        ValueError: for a letter that is not one of the 20 standard amino acids.
    """
    out = []
    for k, s in enumerate(sequence):
        try:
            out.append(_ONE[s.upper()])
        except KeyError:
            raise ValueError(
                f"unknown one-letter amino-acid code {s!r} at position {k}; "
                f"zmat.protein knows the 20 standard ones: {AA1}"
            ) from None
    return out
