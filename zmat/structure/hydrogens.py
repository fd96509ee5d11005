"""Hydrogens: which ones a residue has, and where the missing ones go.

Names are PDB v3 / CCD ones; OpenMM's N-terminal ``H`` (beside ``H2``, ``H3``)
is read as ``H1`` (``file_names``). The file's hydrogens are kept, and with
them its protonation: a heavy atom that has hydrogens in the file gets no more,
and a HIS with ``HD1`` or ``HE2`` keeps its tautomer (``missing``). Heavy atoms
without hydrogens in the file get those of their residue's CCD entry, less the
*leaving atoms* of each polymer link the residue makes (the CCD's
``pdbx_leaving_atom_flag``: ``H2`` / proline's ``H`` on a peptide-bonded ``N``,
``OXT`` and ``HXT`` on a peptide-bonded ``C``, ``OP3``, ``HOP3`` on a linked
``P``, ``HO3'`` on a linked ``O3'``), for modified residues (MSE, 5MU...) as
for standard ones, with the usual choices at pH 7, named by :class:`Protonation`:

* peptide-linking residues: a chain's first residue gets ``H1, H2, H3``
  (charged N-terminus; ``H1, H2`` neutral; proline ``H2, H3`` / ``H2``)
  instead of its CCD hydrogens on ``N``; a chain's last residue keeps ``HXT``
  only with a neutral C-terminus. Asp and Glu are deprotonated (no ``HD2`` /
  ``HE2``), Lys and Arg protonated, His ``HIE`` (``HE2``; ``HID``: ``HD1``;
  ``HIP``: both), a cysteine in a disulfide has no ``HG``, phosphates (SEP)
  are deprotonated.
* nucleotide-linking residues: the phosphate is deprotonated (no ``HOP2``,
  ``HOP3``); a strand's 3' residue keeps ``HO3'``; a 5' residue without
  phosphorus gets ``HO5'`` (not in the CCD entries, which model the 5'-phosphate).
* other residues (ligands): every hydrogen of the CCD entry.

Positions of missing hydrogens (``place``): the amide ``H`` on the bisector
of ``C(i-1)-N-CA`` (1.01 A, in the peptide plane); the N-terminal ``H1..H3``
and ``HO5'`` tetrahedral (1.01 / 0.96 A, 109.5 deg, staggered on ``C`` /
``C4'``); every other one from the CCD's ideal coordinates, carried into the
residue's frame: its bond length, angle and dihedral in the ideal component
on the row ``(heavy atom, a bonded heavy atom, a second bonded heavy atom of
either)``, then placed on the same row of the structure. Hydrogens whose
heavy atom has two heavy neighbours are so fixed by local geometry; rotors
(methyl, hydroxyl, amine) take the CCD conformer's dihedral. Where the
reference atoms coincide or are collinear (a degenerate file), some finite
frame is taken and the caller warns: no completed hydrogen is ever NaN.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .ccd import ccd_residue

__all__ = [
    "LINK_ATOMS",
    "HydrogenPlan",
    "Protonation",
    "extra_names",
    "file_names",
    "missing",
    "place",
    "place_all",
    "plan",
]


@dataclass(frozen=True)
class Protonation:
    """Protonation choices for completing hydrogens: they decide for heavy atoms
    without hydrogens in the file (the file's protonation is kept, module doc).

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
#: The atoms a polymer link is made at: (to the previous residue, to the next one).
LINK_ATOMS = {"protein": ("N", "C"), "nucleic": ("P", "O3'")}
#: Phosphate hydrogens, dropped on polymer residues (deprotonated at pH 7).
_PHOSPHATE = {"HOP2", "HOP3"}


def extra_names(res_name: str, kind: str) -> dict[str, str]:
    """Hydrogens a residue may have that its CCD entry lacks -> their heavy atom
    (``kind``: the backbone it links into, ``"protein"``, ``"nucleic"`` or ``""``)."""
    if kind == "protein":
        return {"H1": "N", "H2": "N", "H3": "N"}
    if kind == "nucleic":
        return {"HO5'": "O5'"}
    return {}


def file_names(res_name: str, kind: str, prev: bool, names: list[str]) -> list[str]:
    """The file's atom names with OpenMM's N-terminal ``H`` (beside ``H2``, ``H3``)
    read as PDB v3's ``H1`` (proline: the first of ``H2``, ``H3`` it lacks)."""
    if kind != "protein" or prev or "H" not in names:
        return names
    ends = N_TERMINAL_PRO["charged"] if res_name == "PRO" else N_TERMINAL["charged"]
    free = [h for h in ends if h not in names]
    return [free[0] if a == "H" and free else a for a in names]


def _heavy_of(res_name: str, kind: str, h: str) -> str | None:
    nb = _ccd_tables(res_name)[2]
    return nb[h][0] if nb.get(h) else extra_names(res_name, kind).get(h)


def missing(
    res_name: str, kind: str, prev: bool, nxt: bool, opts: Protonation, heavy: set[str], have=(), carried=()
):
    """``[(hydrogen, heavy atom)]`` to add to a residue (see the module doc).

    Args:
        res_name: the residue; ``kind``: the backbone it links into (``"protein"``,
            ``"nucleic"``, ``""`` for none).
        prev, nxt: linked to the previous / next residue of its polymer (the CCD's
            leaving atoms of each link are dropped).
        opts: the protonation choices.
        heavy: the heavy atoms the residue has (a hydrogen needs its heavy atom).
        have: the hydrogens the file has. They are kept, and with them the file's
            protonation: a heavy atom that has hydrogens in the file gets no more
            (whatever the file names them), a HIS with ``HD1`` or ``HE2`` keeps its
            tautomer.
        carried: heavy atoms that carry file hydrogens of names the CCD entry lacks.
    """
    hs = _ccd_hydrogens(res_name)
    drop: set[str] = set()
    add: list[tuple[str, str]] = []
    if kind:
        at_prev, at_next = LINK_ATOMS[kind]
        drop |= _PHOSPHATE
        drop |= _leaving_at(res_name, at_prev) if prev else set()
        charged_c = kind == "protein" and opts.c_terminus == "charged"
        drop |= _leaving_at(res_name, at_next) if nxt or charged_c else set()
    if kind == "protein":
        drop |= _DROP.get(res_name, set())
        if res_name == "HIS":
            drop |= {"HD1", "HE2"} if {"HD1", "HE2"} & set(have) else _HIS_DROP[opts.his]
        on_n = [h for h, x in hs if x == "N"]
        if not prev and on_n:
            drop |= set(on_n)
            names = (N_TERMINAL if len(on_n) >= 2 else N_TERMINAL_PRO)[opts.n_terminus]
            add = [(h, "N") for h in names]
    elif kind == "nucleic" and not prev and "P" not in heavy:
        add = [("HO5'", "O5'")]
    out = [(h, x) for h, x in hs if h not in drop] + add
    # a heavy atom with hydrogens in the file keeps the file's (its protonation)
    covered = {_heavy_of(res_name, kind, h) for h in have} | set(carried)
    return [(h, x) for h, x in out if x in heavy and x not in covered and h not in have]


def _cross(u, v) -> np.ndarray:
    """``np.cross`` of two 3-vectors, without its per-call axis handling (it dominates otherwise)."""
    return np.array([u[1] * v[2] - u[2] * v[1], u[2] * v[0] - u[0] * v[2], u[0] * v[1] - u[1] * v[0]])


#: Shorter vectors (Angstrom) have no direction: coincident or collinear atoms.
_TINY = 1e-6


def _unit(v, fallback) -> tuple[np.ndarray, bool]:
    """``v / |v|`` and True, or ``fallback`` (a vector, or a function giving one, called only
    then) and False where ``v`` has no direction."""
    n = math.sqrt(float(v.dot(v)))  # np.linalg.norm's own formula (the same bits), without its overhead
    if n > _TINY:
        return v / n, True
    return np.asarray(fallback() if callable(fallback) else fallback, np.float64), False


def _perpendicular(u) -> np.ndarray:
    """A unit vector perpendicular to the unit vector ``u``."""
    axis = np.eye(3)[int(np.argmin(np.abs(u)))]
    return _unit(_cross(u, axis), (0.0, 0.0, 1.0))[0]


def _coefficients(r: float, theta: float, phi: float) -> tuple[float, float, float]:
    """NeRF's factors of ``(r, theta, phi)``: along the bond, in plane, out of plane."""
    s = r * math.sin(theta)
    return r * math.cos(theta), s * math.cos(phi), s * math.sin(phi)


def _nerf(xb, xa, xd, coef) -> tuple[np.ndarray, bool]:
    """Position at ``coef`` (:func:`_coefficients` of bond ``r`` from ``xb``, angle ``theta``
    at ``xb`` from ``xa``, dihedral ``phi`` (IUPAC) about ``xa-xb`` from ``xd``); and False
    where the reference atoms coincide or are collinear (then some finite frame is taken)."""
    bc, ok1 = _unit(xb - xa, (1.0, 0.0, 0.0))
    n, ok2 = _unit(_cross(xa - xd, bc), lambda: _perpendicular(bc))
    m = _cross(n, bc)
    return xb - coef[0] * bc + coef[1] * m + coef[2] * n, ok1 and ok2


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


#: How a completed hydrogen is placed: NeRF on three heavy atoms, the amide ``H`` on the
#: bisector (``N, CA`` and the previous ``C``), proline's N-terminal pair; none (no references).
NERF, AMIDE, PAIR, NONE = 0, 1, 2, 3
_TETRA = math.radians(109.5)
_NO_COEF = (0.0, 0.0, 0.0)


def _recipe(res_name: str, kind: str, h: str, x: str, local: dict, prev_c: bool):
    """``(how, (b, a, d), coef)`` of the missing hydrogen ``h`` on ``x`` (module doc), the
    references as ``local``'s values (``local``: the residue's heavy atoms by name); ``prev_c``:
    the previous residue's ``C`` is there (``AMIDE``'s third reference)."""
    if kind == "protein" and h == "H" and prev_c and "CA" in local:
        return AMIDE, (local["N"], local["CA"], None), _NO_COEF
    if kind == "protein" and h in ("H1", "H2", "H3") and x == "N" and "CA" in local:
        if "CD" in local and res_name == "PRO":  # two heavy neighbours: sp3 pair
            return PAIR, (local["N"], local["CA"], local["CD"]), _NO_COEF
        if "C" in local:
            phi = math.radians({"H1": 180.0, "H2": 60.0, "H3": -60.0}[h])
            return NERF, (local["N"], local["CA"], local["C"]), _coefficients(1.01, _TETRA, phi)
    if h == "HO5'" and "C5'" in local and "C4'" in local:
        return NERF, (local["O5'"], local["C5'"], local["C4'"]), _coefficients(0.96, _TETRA, math.pi)
    _, heavy, nb = _ccd_tables(res_name)
    refs = _frame_refs(x, nb, {k for k in local if k in heavy})
    if refs is None or h not in _finite_ideal(res_name):
        return NONE, (None, None, None), _NO_COEF
    return NERF, (local[x], local[refs[0]], local[refs[1]]), _coefficients(*_ccd_row(res_name, h, x, *refs))


def _no_references(h: str, x: str, heavy) -> str:
    return (
        f"no bonded heavy atoms to place hydrogen {h} on {x} from (the residue has {sorted(heavy)}); "
        "read it with hydrogens=False, or with its hydrogens in the file"
    )


def place(res_name: str, kind: str, h: str, x: str, coords: dict, prev_c=None, label: str = ""):
    """Position of the missing hydrogen ``h`` on heavy atom ``x`` (module doc), one at a time:
    the reference of :func:`place_all`, and its fallback where the references are degenerate.

    Args:
        res_name, kind: the residue and the backbone it links into.
        h, x: hydrogen and heavy atom names.
        coords: name -> ``(3,)`` positions of the residue's heavy atoms.
        prev_c: ``C`` of the previous residue (amide ``H``), or None.
        label: the residue for messages (``"chain A residue LEU 7"``).

    Returns:
        ``((3,) position, ok)``; ``ok`` is False where the reference atoms
        coincide or are collinear: the position is finite, 1.0 A from ``x``
        (or the CCD's bond length), in some direction.

    Raises:
        ValueError: no bonded heavy atoms to place it from (names chain, residue, atoms).
    """
    how, (b, a, d), coef = _recipe(res_name, kind, h, x, {k: k for k in coords}, prev_c is not None)
    if how == NONE:
        raise ValueError(f"{label or 'residue ' + res_name}: {_no_references(h, x, coords)}")
    if how == AMIDE:
        u, ok1 = _unit(coords[b] - prev_c, (1.0, 0.0, 0.0))
        w, ok2 = _unit(coords[b] - coords[a], (0.0, 1.0, 0.0))
        v, ok3 = _unit(u + w, lambda: _perpendicular(u))
        return coords[b] + 1.01 * v, ok1 and ok2 and ok3
    if how == PAIR:
        d1, ok1 = _unit(coords[b] - coords[a], (1.0, 0.0, 0.0))
        d2, ok2 = _unit(coords[b] - coords[d], lambda: _perpendicular(d1))
        bis, ok3 = _unit(d1 + d2, d1)
        n, ok4 = _unit(_cross(d1, d2), lambda: _perpendicular(bis))
        sign = 1.0 if h == "H2" else -1.0
        v = bis * math.cos(_TETRA / 2) + sign * n * math.sin(_TETRA / 2)
        return coords[b] + 1.01 * v, ok1 and ok2 and ok3 and ok4
    return _nerf(coords[b], coords[a], coords[d], coef)


@dataclass(frozen=True)
class HydrogenPlan:
    """The hydrogens one residue variant completes and how each is placed, over the residue's
    local atom indices (:func:`plan`, made once per variant): ``names`` and ``on`` (their heavy
    atoms), ``how`` ``(k,)`` (``NERF``, ``AMIDE``, ``PAIR``), ``refs`` ``(k, 3)`` the reference
    atoms ``(b, a, d)`` (``AMIDE``: ``(N, CA, -1)``, its third the previous residue's ``C``),
    ``coef`` ``(k, 3)`` NeRF's factors; ``error``: the message for a hydrogen without
    references, which the caller raises naming the residue (it cannot be completed)."""

    names: tuple
    on: tuple
    how: np.ndarray
    refs: np.ndarray
    coef: np.ndarray
    error: str = ""


@functools.lru_cache(maxsize=4096)  # one entry per residue variant met; bounded
def plan(res_name, kind, prev, nxt, opts, names, elements, extra, carried, no_thiol, prev_c) -> HydrogenPlan:
    """The :class:`HydrogenPlan` of a residue variant: its name and backbone ``kind``, linked to
    the previous / next residue, the protonation ``opts``, its atoms (``names``, ``elements``,
    ``extra``: tuples), the heavy atoms with file hydrogens of unknown names (``carried``), no
    thiol ``HG`` (a disulfide), the previous residue's ``C`` there (``prev_c``)."""
    heavy = {a for a, e in zip(names, elements, strict=True) if e != "H"}
    have = [a for a, e, x in zip(names, elements, extra, strict=True) if e == "H" and not x]
    local = {a: j for j, a in enumerate(names) if a in heavy}
    rows = []
    for h, x in missing(res_name, kind, prev, nxt, opts, heavy, have, carried):
        if no_thiol and h == "HG":  # no thiol H on a disulfide
            continue
        how, refs, coef = _recipe(res_name, kind, h, x, local, prev_c)
        if how == NONE:
            none = np.zeros((0, 3), np.int64)
            return HydrogenPlan((), (), none[:, 0], none, none.astype(float), _no_references(h, x, local))
        rows.append((h, x, how, [-1 if r is None else r for r in refs], coef))
    return HydrogenPlan(
        tuple(r[0] for r in rows),
        tuple(r[1] for r in rows),
        np.array([r[2] for r in rows], np.int64),
        np.array([r[3] for r in rows], np.int64).reshape(-1, 3),
        np.array([r[4] for r in rows], np.float64).reshape(-1, 3),
    )


def _units(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``v`` over their norms (``_unit``'s bits: ``vecdot`` is the ``dot`` it takes), and
    where they have a direction (the others are left to :func:`place`)."""
    n = np.sqrt(np.vecdot(v, v))
    ok = n > _TINY
    return v / np.where(ok, n, 1.0)[:, None], ok


def _crosses(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """:func:`_cross` over rows (the same products in the same order)."""
    (u0, u1, u2), (v0, v1, v2) = u.T, v.T
    return np.stack([u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0], 1)


def place_all(xyz: np.ndarray, how: np.ndarray, refs: np.ndarray, coef: np.ndarray):
    """Every ``NERF`` and ``AMIDE`` hydrogen at once, bit for bit :func:`place`'s positions.

    Args:
        xyz: ``(N, 3)`` the heavy atoms; ``how`` ``(k,)``; ``refs`` ``(k, 3)`` indices into
            ``xyz`` (``AMIDE``: ``(N, CA, previous C)``); ``coef`` ``(k, 3)``.

    Returns:
        ``(k, 3)`` positions and ``(k,)`` done: False for ``PAIR`` rows and rows whose
        references coincide or are collinear, which :func:`place` places one at a time.
    """
    out = np.zeros((len(how), 3))
    done = np.zeros(len(how), bool)
    sel = np.flatnonzero(how == NERF)
    xb, xa, xd = (xyz[refs[sel, c]] for c in range(3))
    bc, ok1 = _units(xb - xa)
    n, ok2 = _units(_crosses(xa - xd, bc))
    m = _crosses(n, bc)
    c = coef[sel]
    out[sel] = xb - c[:, :1] * bc + c[:, 1:2] * m + c[:, 2:] * n
    done[sel] = ok1 & ok2
    sel = np.flatnonzero(how == AMIDE)
    xn, xca, xc = (xyz[refs[sel, c]] for c in range(3))
    u, ok1 = _units(xn - xc)
    w, ok2 = _units(xn - xca)
    v, ok3 = _units(u + w)
    out[sel] = xn + 1.01 * v
    done[sel] = ok1 & ok2 & ok3
    return out, done


@functools.cache
def _ccd_tables(res_name: str):
    """Ideal positions, heavy-atom names and bonded neighbours of a CCD entry."""
    ccd = ccd_residue(res_name)
    ideal = dict(zip(ccd.atom_names.tolist(), ccd.ideal, strict=True))
    heavy = frozenset(a for a, e in zip(ccd.atom_names.tolist(), ccd.elements, strict=True) if e != "H")
    return ideal, heavy, ccd.neighbors()


@functools.cache
def _finite_ideal(res_name: str) -> frozenset[str]:
    """The atoms of a CCD entry with finite ideal coordinates."""
    return frozenset(a for a, x in _ccd_tables(res_name)[0].items() if np.isfinite(x).all())


@functools.cache
def _ccd_hydrogens(res_name: str) -> tuple[tuple[str, str], ...]:
    """The CCD entry's hydrogens with a bonded atom: ``(hydrogen, its heavy atom)``."""
    ccd = ccd_residue(res_name)
    nb = _ccd_tables(res_name)[2]
    return tuple(
        (str(a), nb[a][0]) for a, e in zip(ccd.atom_names, ccd.elements, strict=True) if e == "H" and nb[a]
    )


@functools.cache
def _leaving_at(res_name: str, atom: str) -> frozenset[str]:
    return ccd_residue(res_name).leaving_at(atom)


@functools.lru_cache(maxsize=4096)  # one entry per residue variant met; bounded
def _ccd_row(res_name: str, h: str, x: str, a: str, d: str) -> tuple[float, float, float]:
    ideal = _ccd_tables(res_name)[0]
    return _internal(ideal[h], ideal[x], ideal[a], ideal[d])
