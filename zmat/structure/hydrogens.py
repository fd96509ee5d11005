"""Hydrogens: which ones a residue has, and where the missing ones go.

Names are PDB v3 / CCD ones. Which hydrogens a residue gets (``wanted``)
follows the CCD entry of the residue with the usual choices at pH 7, named by
:class:`Protonation`:

* amino acids: the CCD's ``H2`` and ``HXT`` are leaving atoms of the peptide
  bond and are dropped; a chain's first residue gets ``H1, H2, H3`` (charged
  N-terminus; ``H1, H2`` neutral; proline ``H2, H3`` / ``H2``) instead of
  ``H``, a residue after a peptide bond its amide ``H`` (not proline); a
  chain's last residue keeps ``HXT`` only with a neutral C-terminus. Asp and
  Glu are deprotonated (no ``HD2`` / ``HE2``), Lys and Arg protonated, His
  ``HIE`` (``HE2``; ``HID``: ``HD1``; ``HIP``: both), a cysteine in a
  disulfide has no ``HG``.
* nucleotides: the phosphate is deprotonated (no ``HOP2``, ``HOP3``); a
  strand's 3' residue keeps ``HO3'``; a 5' residue without phosphorus gets
  ``HO5'`` (not in the CCD entries, which model the 5'-phosphate).
* other residues (ligands): every hydrogen of the CCD entry.

Positions of missing hydrogens (``place``): the amide ``H`` on the bisector
of ``C(i-1)-N-CA`` (1.01 A, in the peptide plane); the N-terminal ``H1..H3``
and ``HO5'`` tetrahedral (1.01 / 0.96 A, 109.5 deg, staggered on ``C`` /
``C4'``); every other one from the CCD's ideal coordinates, carried into the
residue's frame: its bond length, angle and dihedral in the ideal component
on the row ``(heavy atom, a bonded heavy atom, a second bonded heavy atom of
either)``, then placed on the same row of the structure. Hydrogens whose
heavy atom has two heavy neighbours are so fixed by local geometry; rotors
(methyl, hydroxyl, amine) take the CCD conformer's dihedral.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .ccd import ccd_residue

__all__ = ["Protonation", "place", "wanted"]


@dataclass(frozen=True)
class Protonation:
    """Protonation choices for completing hydrogens.

    Attributes:
        his: ``"HIE"`` (H on NE2, default), ``"HID"`` (on ND1) or ``"HIP"`` (both, charged).
        n_terminus: ``"charged"`` (NH3+, default) or ``"neutral"`` (NH2).
        c_terminus: ``"charged"`` (COO-, default) or ``"neutral"`` (COOH, ``HXT``).
    """

    his: str = "HIE"
    n_terminus: str = "charged"
    c_terminus: str = "charged"

    def __post_init__(self) -> None:
        for field, value, ok in (
            ("his", self.his, ("HIE", "HID", "HIP")),
            ("n_terminus", self.n_terminus, ("charged", "neutral")),
            ("c_terminus", self.c_terminus, ("charged", "neutral")),
        ):
            if value not in ok:
                raise ValueError(f"Protonation.{field} must be one of {ok}, got {value!r}")


_DROP = {"ASP": {"HD2"}, "GLU": {"HE2"}}
_HIS_DROP = {"HIE": {"HD1"}, "HID": {"HE2"}, "HIP": set()}
N_TERMINAL = {"charged": ("H1", "H2", "H3"), "neutral": ("H1", "H2")}
N_TERMINAL_PRO = {"charged": ("H2", "H3"), "neutral": ("H2",)}


def extra_names(res_name: str, family: str) -> dict[str, str]:
    """Hydrogens a residue may have that its CCD entry lacks -> their heavy atom."""
    if family == "protein":
        return {"H1": "N", "H2": "N", "H3": "N"}
    if family == "nucleic":
        return {"HO5'": "O5'"}
    return {}


def wanted(res_name: str, family: str, prev: bool, nxt: bool, opts: Protonation, heavy: set[str]):
    """``[(hydrogen, heavy atom)]`` a residue should have (see the module doc).

    Args:
        res_name, family: the residue (``"protein"``, ``"nucleic"``, ``"ligand"``).
        prev, nxt: linked to the previous / next residue of its polymer.
        opts: the protonation choices.
        heavy: the heavy atoms the residue has (a hydrogen needs its heavy atom).
    """
    ccd = ccd_residue(res_name)
    nb = _ccd_tables(res_name)[2]
    hs = [(str(a), nb[a][0]) for a, e in zip(ccd.atom_names, ccd.elements, strict=True) if e == "H" and nb[a]]
    drop: set[str] = set()
    add: list[tuple[str, str]] = []
    if family == "protein":
        drop |= {"H2", "HXT"} | _DROP.get(res_name, set())
        if res_name == "HIS":
            drop |= _HIS_DROP[opts.his]
        if not prev:
            drop.add("H")
            names = (N_TERMINAL_PRO if res_name == "PRO" else N_TERMINAL)[opts.n_terminus]
            add = [(h, "N") for h in names]
        elif res_name == "PRO":
            drop.add("H")
        if not nxt and opts.c_terminus == "neutral":
            drop.discard("HXT")
    elif family == "nucleic":
        drop |= {"HOP2", "HOP3"}
        if nxt:
            drop.add("HO3'")
        if not prev and "P" not in heavy:
            add = [("HO5'", "O5'")]
    out = [(h, x) for h, x in hs if h not in drop] + add
    return [(h, x) for h, x in out if x in heavy]


def _cross(u, v) -> np.ndarray:
    """``np.cross`` of two 3-vectors, without its per-call axis handling (it dominates otherwise)."""
    return np.array([u[1] * v[2] - u[2] * v[1], u[2] * v[0] - u[0] * v[2], u[0] * v[1] - u[1] * v[0]])


def _nerf(xb, xa, xd, r, theta, phi) -> np.ndarray:
    """Position at bond ``r`` from ``xb``, angle ``theta`` at ``xb`` from ``xa``,
    dihedral ``phi`` (IUPAC) about ``xa-xb`` from ``xd``."""
    bc = xb - xa
    bc = bc / np.linalg.norm(bc)
    n = _cross(xa - xd, bc)
    n = n / np.linalg.norm(n)
    m = _cross(n, bc)
    s = r * math.sin(theta)
    return xb - r * math.cos(theta) * bc + s * math.cos(phi) * m + s * math.sin(phi) * n


def _internal(x, xb, xa, xd) -> tuple[float, float, float]:
    """``(r, theta, phi)`` of ``x`` on the row ``(b, a, d)``."""
    b3, b2, b1 = x - xb, xb - xa, xa - xd
    r = float(np.linalg.norm(b3))
    theta = math.acos(float(np.clip(np.dot(-b2, b3) / (np.linalg.norm(b2) * r), -1, 1)))
    n1, n2 = _cross(b1, b2), _cross(b2, b3)
    y = float(np.dot(_cross(n1, n2), b2 / np.linalg.norm(b2)))
    return r, theta, math.atan2(y, float(np.dot(n1, n2)))


def _frame_refs(x: str, nb: dict[str, list[str]], heavy_have: set[str]) -> tuple[str, str] | None:
    """Two heavy reference atoms for a hydrogen on ``x``: a bonded heavy atom
    ``a`` and a second heavy atom bonded to ``x`` or to ``a``, all in ``heavy_have``."""
    heavy = [y for y in nb.get(x, []) if y in heavy_have]
    for a in heavy:
        second = [y for y in heavy if y != a] + [y for y in nb.get(a, []) if y != x and y in heavy_have]
        if second:
            return a, second[0]
    return None


def place(res_name: str, family: str, h: str, x: str, coords: dict, prev_c=None) -> np.ndarray:
    """Position of the missing hydrogen ``h`` on heavy atom ``x`` (module doc).

    Args:
        res_name, family: the residue.
        h, x: hydrogen and heavy atom names.
        coords: name -> ``(3,)`` positions of the residue's heavy atoms.
        prev_c: ``C`` of the previous residue (amide ``H``), or None.

    Raises:
        ValueError: no reference atoms to place it from (names the residue).
    """
    if family == "protein" and h == "H" and prev_c is not None:
        u = coords["N"] - prev_c
        w = coords["N"] - coords["CA"]
        v = u / np.linalg.norm(u) + w / np.linalg.norm(w)
        return coords["N"] + 1.01 * v / np.linalg.norm(v)
    tetra = math.radians(109.5)
    if family == "protein" and h in ("H1", "H2", "H3"):
        if res_name == "PRO" and "CD" in coords:  # two heavy neighbours: sp3 pair
            d1, d2 = (coords["N"] - coords[y] for y in ("CA", "CD"))
            b = d1 / np.linalg.norm(d1) + d2 / np.linalg.norm(d2)
            n = _cross(d1, d2)
            half = tetra / 2
            sign = 1.0 if h == "H2" else -1.0
            v = b / np.linalg.norm(b) * math.cos(half) + sign * n / np.linalg.norm(n) * math.sin(half)
            return coords["N"] + 1.01 * v
        if "C" in coords:
            offset = {"H1": 180.0, "H2": 60.0, "H3": -60.0}[h]
            return _nerf(coords["N"], coords["CA"], coords["C"], 1.01, tetra, math.radians(offset))
    if h == "HO5'" and "C4'" in coords:
        return _nerf(coords["O5'"], coords["C5'"], coords["C4'"], 0.96, tetra, math.pi)
    ideal, heavy, nb = _ccd_tables(res_name)
    refs = _frame_refs(x, nb, {k for k in coords if k in heavy})
    if refs is None or h not in ideal or not np.isfinite(ideal[h]).all():
        raise ValueError(f"residue {res_name}: no reference atoms to place hydrogen {h} on {x}")
    r, theta, phi = _ccd_row(res_name, h, x, *refs)
    return _nerf(coords[x], coords[refs[0]], coords[refs[1]], r, theta, phi)


@functools.cache
def _ccd_tables(res_name: str):
    """Ideal positions, heavy-atom names and bonded neighbours of a CCD entry."""
    ccd = ccd_residue(res_name)
    ideal = dict(zip(ccd.atom_names.tolist(), ccd.ideal, strict=True))
    heavy = frozenset(a for a, e in zip(ccd.atom_names.tolist(), ccd.elements, strict=True) if e != "H")
    return ideal, heavy, ccd.neighbors()


@functools.cache
def _ccd_row(res_name: str, h: str, x: str, a: str, d: str) -> tuple[float, float, float]:
    ideal = _ccd_tables(res_name)[0]
    return _internal(ideal[h], ideal[x], ideal[a], ideal[d])
