"""Ideal geometry of nucleotides: internal coordinates from torsions and puckers.

``Complex.ideal_internal`` (``zmat/structure/complex.py``) gives every row of a
nucleotide residue its ideal value and its torsion, the sugar ring its
pucker, closed exactly (``zmat/structure/sugar.py``):

* bond lengths, bond angles and fixed dihedrals (offsets, base planarity) of
  every row within a residue: the residue's CCD ideal coordinates, measured
  on the same row;
* the phosphodiester link (``PHOSPHATE``: the rows of ``P``, ``OP1``, ``OP2``,
  ``O5'`` and the angle of ``C5'``, which reach into the previous residue):
  means over the 133 linked nucleotides of 1bna, 4p5j and 5ugo (``tests/data``;
  X-ray structures refined against the restraints of Parkinson et al., Acta
  Cryst. D52, 57, 1996, whose values they match to 1 deg and 0.005 A), since
  the CCD's free 5'-phosphate (``OP3``, a P-OH) models a different group;
  ``OP1`` / ``OP2`` at -114.2 / +114.5 deg from ``O5'`` about ``O3'(i-1)-P``
  (PDB v3 naming);
* alpha, beta, gamma, epsilon, zeta and chi: the torsions given;
* the ring ``C1'``, ``C2'`` from ``(pucker_phase, pucker_amplitude)``, and the
  ring's substituents that depend on it (``O3'``, the first child of ``C2'``:
  ``O2'`` or ``H2'``) placed tetrahedrally from the CCD; so **delta follows
  the pucker** (it is not a free torsion of the rebuild);
* everything else keeps the measured value: rows across chain breaks and
  virtual bonds, hydrogen rotors (``HO3'``, ``HO5'``...), protein residues and
  ligands.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from .._geometry import dihedral_from_bonds
from .ccd import ccd_residue
from .nucleic import NUCLEIC_TORSIONS, RING_ATOMS
from .sugar import place, ring_from_pucker

__all__ = ["NucleicIdeal", "nucleic_ideal"]

#: The phosphodiester link, atom -> (bond length A, bond angle deg, fixed dihedral deg)
#: on its canonical row (P: (-O3', -C3', -C4'); OP1, OP2: (P, -O3', O5'); O5':
#: (P, -O3', -C3'); C5': (O5', P, -O3')); None: from the CCD or a torsion. See the
#: module doc for the source.
PHOSPHATE = {
    "P": (1.607, 120.7, None),
    "OP1": (1.481, 106.6, -114.2),
    "OP2": (1.484, 109.8, 114.5),
    "O5'": (1.593, 103.5, None),
    "C5'": (None, 120.4, None),
}
_TORSIONS = NUCLEIC_TORSIONS[:7]


def _internal(x, b, a, d):
    """(r, theta, phi) of ``x`` on the row (b, a, d); numpy, NaN where a ref is None."""
    r = float(np.linalg.norm(x - b))
    if a is None:
        return r, math.nan, math.nan
    u, v = a - b, x - b
    theta = math.acos(float(np.clip(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)), -1, 1)))
    if d is None:
        return r, theta, math.nan
    b1, b2, b3 = a - d, b - a, x - b
    n1, n2 = np.cross(b1, b2), np.cross(b2, b3)
    y = float(np.cross(n1, n2) @ (b2 / np.linalg.norm(b2)))
    return r, theta, math.atan2(y, float(n1 @ n2))


@functools.cache
def _ideal(res_name: str) -> dict[str, np.ndarray]:
    c = ccd_residue(res_name)
    return dict(zip(c.atom_names.tolist(), c.ideal, strict=True))


def _ring_geometry(res_name: str):
    """Fixed ring part, ring geometry, start u0, and the CCD internal coordinates of
    ``O3'`` on ``(C3', C4', C2')`` and of the C2' substituents on ``(C2', C1', C3')``."""
    x = _ideal(res_name)
    fixed = np.stack([x["C5'"], x["C4'"], x["C3'"], x["O4'"]])
    geom = (
        np.linalg.norm(x["O4'"] - x["C1'"]),
        np.linalg.norm(x["C1'"] - x["C2'"]),
        np.linalg.norm(x["C2'"] - x["C3'"]),
        _internal(x["C2'"], x["C1'"], x["O4'"], None)[1],
    )
    _, th, ph = _internal(x["C1'"], x["O4'"], x["C4'"], x["C5'"])
    nu0 = _internal(x["C2'"], x["C1'"], x["O4'"], x["C4'"])[2]
    sub = {"O3'": _internal(x["O3'"], x["C3'"], x["C4'"], x["C2'"])}
    for name in ("O2'", "H2'", "H2''"):
        if name in x:
            sub[name] = _internal(x[name], x["C2'"], x["C1'"], x["C3'"])
    return fixed, np.array(geom), np.array([th, ph, nu0]), sub


@dataclass(frozen=True)
class NucleicIdeal:
    """Where the ideal values of :func:`nucleic_ideal` go (index arrays over atoms)."""

    const_idx: np.ndarray  #: (M, 2) atom, column of a constant
    const_val: np.ndarray  #: (M,)
    tors_idx: np.ndarray  #: (T,) atoms whose dihedral is a torsion
    tors_res: np.ndarray  #: (T,) polymer residue of each
    tors_name: np.ndarray  #: (T,) index into alpha..chi
    ring_res: np.ndarray  #: (R,) polymer residue of each ring
    ring_atoms: np.ndarray  #: (R, 2) the C1', C2' atoms (their rows are the canonical ones)
    fixed: np.ndarray  #: (R, 4, 3)
    geom: np.ndarray  #: (R, 4)
    u0: np.ndarray  #: (R, 3)
    sub_idx: np.ndarray  #: (S,) ring substituents placed from the ring
    sub_ring: np.ndarray  #: (S,) their ring
    sub_kind: np.ndarray  #: (S,) 0: O3' on (C3', C4', C2'), 1: on C2' (C2', C1', C3')
    sub_val: np.ndarray  #: (S, 3) CCD (r, theta, phi) on that frame


def _names(parsed, k: int, prev: int):
    """Atom index -> CCD name of residue ``k`` (``prev``'s O3' as OP3), and others."""
    out = {}
    res = parsed.residue
    for i in np.flatnonzero(res == k).tolist():
        out[i] = str(parsed.atom_names[i])
    if prev >= 0:
        for i in np.flatnonzero(res == prev).tolist():
            name = str(parsed.atom_names[i])
            if name in ("O3'", "C3'", "C4'"):
                out[i] = {"O3'": "OP3", "C3'": "-C3'", "C4'": "-C4'"}[name]
    return out


def heavy_neighbours(parsed) -> np.ndarray:
    """``(N,)`` number of heavy atoms bonded to each atom."""
    out = np.zeros(len(parsed.refs), np.int64)
    heavy = parsed.elements != "H"
    b = parsed.bonds
    np.add.at(out, b[:, 0], heavy[b[:, 1]])
    np.add.at(out, b[:, 1], heavy[b[:, 0]])
    return out


def ccd_row_values(parsed, k: int, heavy_nb: np.ndarray) -> list[tuple[int, int, float]]:
    """``(atom, column, value)`` CCD ideal values of the hydrogen rows of residue
    ``k`` that lie within it (a rotor's dihedral is left out)."""
    x = _ideal(str(parsed.res_names[k]))
    refs, res, names = parsed.refs, parsed.residue, parsed.atom_names
    out = []
    for i in np.flatnonzero((res == k) & (parsed.elements == "H")).tolist():
        row = refs[i]
        if (row < 0).any() or (res[row] != k).any() or str(names[i]) not in x:
            continue
        pos = [x.get(str(names[j])) for j in row]
        if any(p is None for p in pos):
            continue
        r, theta, phi = _internal(x[str(names[i])], *pos)
        rotor = heavy_nb[row[0]] == 1 and refs[row[2], 0] != row[0]  # PROPER on a one-heavy-bond atom
        out += [(i, 0, r), (i, 1, theta)] + ([] if rotor else [(i, 2, phi)])
    return out


def nucleic_ideal(parsed, torsion_rows: dict[str, np.ndarray], linked_prev: np.ndarray) -> NucleicIdeal:
    """The :class:`NucleicIdeal` plan of a parsed complex.

    Args:
        parsed: ``ComplexAtoms``.
        torsion_rows: ``Complex.torsion_rows()`` as numpy arrays.
        linked_prev: ``(R,)`` previous residue index when linked, else -1.
    """
    refs, elements = parsed.refs, parsed.elements
    heavy_nb = np.zeros(len(refs), np.int64)
    for i, j in parsed.bonds.tolist():
        heavy_nb[i] += elements[j] != "H"
        heavy_nb[j] += elements[i] != "H"
    tors_atoms = {}
    for t, name in enumerate(_TORSIONS):
        for l_, atom in enumerate(torsion_rows[name].tolist()):
            if atom >= 0:
                tors_atoms[atom] = (l_, t)
    const, ring, subs = [], [], []
    poly = parsed.polymer_index
    for k in np.flatnonzero(parsed.family == "nucleic").tolist():
        name = str(parsed.res_names[k])
        x = _ideal(name)
        names = _names(parsed, k, int(linked_prev[k]))
        atoms = {v: i for i, v in names.items()}
        fixed, geom, u0, sub = _ring_geometry(name)
        c1, c2 = atoms.get("C1'", -1), atoms.get("C2'", -1)
        ring_ok = (
            c1 >= 0 and c2 >= 0 and tuple(refs[c1]) == tuple(atoms.get(n, -2) for n in ("O4'", "C4'", "C5'"))
        )
        ring_ok = ring_ok and tuple(refs[c2]) == tuple(atoms.get(n, -2) for n in ("C1'", "O4'", "C4'"))
        ring_ok = ring_ok and all(n in atoms for n in RING_ATOMS)  # a pucker to keep (partial residues)
        if ring_ok:
            ring.append((poly[k], c1, c2, fixed, geom, u0))
        r_id = len(ring) - 1
        for i, own in names.items():
            if parsed.residue[i] != k:
                continue
            row = [names.get(int(j)) if j >= 0 else None for j in refs[i]]
            if row[0] is None or row[0].startswith("-") or own not in x or row[0] not in x:
                continue  # a root, a virtual bond, a row into another residue or on the root H
            pos = [None if n is None or n.startswith("-") or n not in x else x[n] for n in row]
            rv, th, ph = _internal(x[own], pos[0], pos[1], pos[2])
            if row[1] is not None and pos[1] is None:
                th = math.nan
            if "OP3" in row or "-C3'" in row:  # a row across the link: PHOSPHATE
                r_p, th_p, ph_p = PHOSPHATE.get(own, (None, None, None))
                rv = rv if r_p is None else r_p
                th = th if th_p is None else math.radians(th_p)
                ph = ph if ph_p is None else math.radians(ph_p)
            b_, a_, d_ = (int(j) for j in refs[i])
            offset = d_ >= 0 and refs[d_, 0] == b_  # the dihedral is relative to a sibling
            c2_child = row[0] == "C2'" and own in sub and (a_, d_) == (c1, atoms.get("O4'", -2))
            ring_dep = ring_ok and (own in ("C1'", "C2'", "O3'") or c2_child)
            rotor = elements[i] == "H" and heavy_nb[b_] == 1 and not offset
            free = i in tors_atoms or ring_dep or rotor or pos[2] is None
            for col, value in ((0, rv), (1, th), (2, ph if not free else math.nan)):
                if not math.isnan(value):
                    const.append((i, col, value))
            if (
                ring_dep
                and own == "O3'"
                and tuple(refs[i]) == tuple(atoms.get(n, -2) for n in ("C3'", "C4'", "C5'"))
            ):
                subs.append((i, r_id, 0, sub["O3'"]))
            elif ring_dep and c2_child:
                subs.append((i, r_id, 1, sub[own]))
    tors = sorted(tors_atoms.items())
    return NucleicIdeal(
        const_idx=np.array([(i, c) for i, c, _ in const], np.int64).reshape(-1, 2),
        const_val=np.array([v for *_, v in const], np.float64),
        tors_idx=np.array([a for a, _ in tors], np.int64),
        tors_res=np.array([lt[0] for _, lt in tors], np.int64),
        tors_name=np.array([lt[1] for _, lt in tors], np.int64),
        ring_res=np.array([r[0] for r in ring], np.int64),
        ring_atoms=np.array([(r[1], r[2]) for r in ring], np.int64).reshape(-1, 2),
        fixed=np.array([r[3] for r in ring], np.float64).reshape(-1, 4, 3),
        geom=np.array([r[4] for r in ring], np.float64).reshape(-1, 4),
        u0=np.array([r[5] for r in ring], np.float64).reshape(-1, 3),
        sub_idx=np.array([s[0] for s in subs], np.int64),
        sub_ring=np.array([s[1] for s in subs], np.int64),
        sub_kind=np.array([s[2] for s in subs], np.int64),
        sub_val=np.array([s[3] for s in subs], np.float64).reshape(-1, 3),
    )


def apply(plan: NucleicIdeal, internal: torch.Tensor, torsions: dict, measured: dict) -> torch.Tensor:
    """``internal`` with the plan's ideal values, torsions and rings (module doc).

    Args:
        internal: ``(N, 3)`` measured internal coordinates.
        torsions: dict of ``(L,)`` tensors (alpha..chi, pucker_phase,
            pucker_amplitude); missing keys and NaN entries: ``measured``.
        measured: the structure's own ``torsions``.
    """
    dtype = internal.dtype

    def value(name):
        m = measured[name].to(dtype)
        t = torsions.get(name)
        return m if t is None else torch.where(torch.isnan(t), m, t.to(dtype))

    cols = [internal[:, c] for c in range(3)]
    ci = torch.from_numpy(plan.const_idx)
    cv = torch.from_numpy(plan.const_val).to(dtype)
    for c in range(3):
        sel = ci[:, 1] == c
        cols[c] = cols[c].index_put((ci[sel, 0],), cv[sel])
    if len(plan.tors_idx):
        tv = torch.stack([value(n) for n in _TORSIONS], -1)  # (L, 7)
        t = tv[torch.from_numpy(plan.tors_res), torch.from_numpy(plan.tors_name)]
        cols[2] = cols[2].index_put((torch.from_numpy(plan.tors_idx),), t)
    if len(plan.ring_res):
        rr = torch.from_numpy(plan.ring_res)
        phase, amp = value("pucker_phase")[rr], value("pucker_amplitude")[rr]
        fixed = torch.from_numpy(plan.fixed).to(dtype)
        geom = torch.from_numpy(plan.geom).to(dtype)
        c1, c2, u = ring_from_pucker(phase, amp, fixed, geom, torch.from_numpy(plan.u0).to(dtype))
        a1, a2 = torch.from_numpy(plan.ring_atoms).unbind(-1)
        cols[1] = cols[1].index_put((a1,), u[:, 0])
        cols[2] = cols[2].index_put((a1,), u[:, 1]).index_put((a2,), u[:, 2])
        cols[2] = _substituents(plan, cols[2], fixed, c1, c2)
    return torch.stack(cols, -1)


def _substituents(plan: NucleicIdeal, phi: torch.Tensor, fixed, c1, c2) -> torch.Tensor:
    """Dihedrals of the ring substituents on their own rows, from their tetrahedral
    (CCD) places on the closed ring: O3' on (C3', C4', C5'), C2''s child on (C2', C1', O4')."""
    if not len(plan.sub_idx):
        return phi
    k = torch.from_numpy(plan.sub_ring)
    v = torch.from_numpy(plan.sub_val).to(phi.dtype)
    c5, c4, c3, o4 = fixed[k].unbind(-2)
    c1, c2 = c1[k], c2[k]
    o3 = torch.from_numpy(plan.sub_kind) == 0
    b = torch.where(o3[:, None], c3, c2)
    a = torch.where(o3[:, None], c4, c1)
    d = torch.where(o3[:, None], c2, c3)
    x = place(b, a, d, v[:, 0], v[:, 1], v[:, 2])
    ref_a = torch.where(o3[:, None], c4, c1)
    ref_d = torch.where(o3[:, None], c5, o4)
    value = dihedral_from_bonds(ref_a - ref_d, b - ref_a, x - b)
    return phi.index_put((torch.from_numpy(plan.sub_idx),), value)
