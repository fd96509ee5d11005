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

Ideal geometry (``IDEAL``), Angstrom and radians:

* backbone, ``CB`` and ``OXT``: Engh & Huber (1991), Acta Cryst. A47, 392:
  N-CA 1.458, CA-C 1.525, C-N 1.329, C=O 1.231, CA-CB 1.530; N-CA-C 111.2,
  CA-C-N 116.2, C-N-CA 121.7, CA-C-O 120.8 (so O=C-N 123.0 with a planar
  carbonyl), N-CA-CB 110.5, C-CA-CB 110.1 (the improper C-N-CA-CB follows
  from these three angles and L-chirality). The C-terminal ``OXT`` is placed
  like the next residue's ``N`` (angle 116.2) with a C=O length.
* side-chain atoms beyond ``CB``: bond lengths, bond angles and the fixed
  dihedrals measured on the ideal coordinates of the wwPDB Chemical
  Component Dictionary (``pdbx_model_Cartn_*_ideal``) that biotite ships
  (``biotite.structure.info.residue``), computed once at import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "AA1",
    "AA3",
    "BACKBONE",
    "CHI_ATOMS",
    "IDEAL",
    "RESIDUES",
    "TORSION_NAMES",
    "ResidueTemplate",
    "one_to_three",
]

#: Order of the torsion columns everywhere in ``zmat.protein``.
TORSION_NAMES = ("phi", "psi", "omega", "chi1", "chi2", "chi3", "chi4")
PHI, PSI, OMEGA, CHI1 = 0, 1, 2, 3

AA3 = (
    "ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL"
).split()
AA1 = "ARNDCQEGHILKMFPSTWYV"
_ONE = dict(zip(AA1, AA3))
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


def _dihedral(p0, p1, p2, p3) -> float:
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    b1 = b1 / np.linalg.norm(b1)
    v = b0 - (b0 @ b1) * b1
    w = b2 - (b2 @ b1) * b1
    return math.atan2(np.cross(b1, v) @ w, v @ w)


def _angle(p0, p1, p2) -> float:
    u, v = p0 - p1, p2 - p1
    return math.atan2(np.linalg.norm(np.cross(u, v)), u @ v)


def _improper_cb() -> float:
    """Dihedral C-N-CA-CB from the three bond angles at CA (L-chirality)."""
    t_nc, t_ncb, t_ccb = (math.radians(_EH[k]) for k in ("N-CA-C", "N-CA-CB", "C-CA-CB"))
    # CA at the origin, N on +x, C in the xy-plane; solve for the CB direction.
    n = np.array([1.0, 0.0, 0.0])
    c = np.array([math.cos(t_nc), math.sin(t_nc), 0.0])
    x = math.cos(t_ncb)
    y = (math.cos(t_ccb) - x * c[0]) / c[1]
    z = math.sqrt(max(1.0 - x * x - y * y, 0.0))
    cands = [np.array([x, y, z]), np.array([x, y, -z])]
    ca = np.zeros(3)
    # L-amino acids: the improper N-CA-C-CB... pick by the sign the CCD's ALA has.
    sign = _ccd_improper_sign()
    for cb in cands:
        phi = _dihedral(c, n, ca, cb)
        if math.copysign(1.0, phi) == sign:
            return phi
    raise AssertionError("unreachable")


def _ccd_coords(name: str) -> dict[str, np.ndarray]:
    from biotite.structure.info import residue

    arr = residue(name)
    return {str(a): np.asarray(c, np.float64) for a, c, e in zip(arr.atom_name, arr.coord, arr.element)}


def _ccd_improper_sign() -> float:
    x = _ccd_coords("ALA")
    return math.copysign(1.0, _dihedral(x["C"], x["N"], x["CA"], x["CB"]))


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
    rad = math.radians
    ideal = {
        "N": (_EH["C-N"], rad(_EH["CA-C-N"]), math.nan),
        "CA": (_EH["N-CA"], rad(_EH["C-N-CA"]), math.nan),
        "C": (_EH["CA-C"], rad(_EH["N-CA-C"]), math.nan),
        "O": (_EH["C-O"], rad(_EH["CA-C-O"]), math.pi),
        "CB": (_EH["CA-CB"], rad(_EH["N-CA-CB"]), _improper_cb()),
        "OXT": (_EH["C-O"], rad(_EH["CA-C-N"]), math.nan),
    }
    x = _ccd_coords(name) if side else {}
    for atom, b, a, d, tors in side:
        rows[atom] = (b, a, d)
        torsion[atom] = None if tors is None else (TORSION_NAMES.index(tors), 0)
        r = float(np.linalg.norm(x[atom] - x[b]))
        theta = _angle(x[atom], x[b], x[a])
        phi = math.nan if tors is not None else _dihedral(x[d], x[a], x[b], x[atom])
        ideal[atom] = (r, theta, phi)
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
