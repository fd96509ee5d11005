"""Redundant primitive internal coordinates and their Wilson B matrix.

A coordinate system is a :class:`Primitives`: one integer tensor of atom
indices per kind of primitive, the kinds in a fixed order (the order of the
value vector ``q``):

* **bonds** ``|x_i - x_j|``: covalent bonds (ring closures included: a bond
  is a bond, there is no spanning tree), hydrogen bonds ``D-H...A``, and the
  shortest contacts that join separate fragments into one connected graph
  (so a water cluster or a ligand beside a pocket has coordinates between its
  pieces);
* **angles** ``angle(x_i, x_j, x_k)`` (vertex ``j``) of bonded pairs, except
  near-linear ones;
* **linear bends**: a near-linear ``i-j-k`` with two neighbours at ``j``
  (alkynes, nitriles, CO2) gets, instead of its singular angle, four angles
  between each arm ``x_end - x_j`` and two fixed directions perpendicular to
  the ``i-k`` axis (pyberny's dummy-atom bends, without the dummy atoms);
* **dihedrals** (IUPAC sign) about every bond, extended through linear
  chains;
* **out-of-plane** angles of three-coordinate centres: the angle between the
  bond ``j -> l`` and the plane ``(i, j, k)``;
* **translation** and **rotation** of each fragment (``coords="tric"``,
  :mod:`.fragments`), in place of the contact bonds between fragments;
* **cartesian** components of frozen atoms (constant rows of B).

Everything is built once on the host from the starting geometry (the union
over conformers where a batch is given); values and B then run on the device
for ``(B, N, 3)`` positions at once, every kind in one fused formula. B comes
from autograd: each primitive's atoms are gathered into a leaf ``(B, G, 4, 3)``,
one backward of the summed values gives every primitive's local gradient,
scattered into ``(B, P, 3N)``. On plain CPU tensors the same formula and its
forward-mode derivatives run in zmat's compiled kernel (:mod:`._compiled`), one
call for the values, one for values and B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np
import torch
from ase.data import covalent_radii, vdw_radii
from scipy.sparse.csgraph import connected_components

from .._geometry import safe_atan2, safe_norm
from . import _compiled, fragments

__all__ = ["KINDS", "Primitives", "build_primitives", "values", "values_and_b", "wilson_b"]

#: the kinds, in the order of ``q``
KINDS = ("bond", "angle", "linear", "dihedral", "oop", "translation", "rotation", "cartesian")
GEOMETRIC = KINDS[:5]  # the kinds of the fused formula (:func:`_fused`); the fragments' have their own
LINEAR = math.radians(175.0)  # an angle above this is treated as linear
UNLINEAR = math.radians(170.0)  # a linear bend below this becomes an angle again (hysteresis)
_SMALL_ANGLE = math.radians(45.0)  # angles below this are left out (pyberny)
_DIHEDRAL_LINEAR = math.radians(5.0)


@dataclass(frozen=True)
class Primitives:
    """A set of primitive internal coordinates over ``n_atoms`` atoms.

    Attributes:
        bond: ``(nb, 2)`` long; angle: ``(na, 3)`` (vertex in the middle);
        linear: ``(nl, 3)`` (arm end, vertex, other end) with ``linear_ref``
        ``(nl, 3)`` float, the fixed direction the arm is measured against;
        dihedral: ``(nd, 4)``; oop: ``(no, 4)`` (``i, j, k, l``: bond
        ``j -> l`` against the plane ``i, j, k``); cartesian: ``(nc, 2)``
        (atom, axis). ``weak``: ``(P,)`` number of non-covalent links in each
        primitive (0 for covalent ones). translation, rotation: ``(n, m)``
        the atoms of each row's fragment (padded), ``frag`` their
        :class:`.fragments.FragmentRows` (``coords="tric"``; else no rows).
    """

    n_atoms: int
    bond: torch.Tensor
    angle: torch.Tensor
    linear: torch.Tensor
    linear_ref: torch.Tensor
    dihedral: torch.Tensor
    oop: torch.Tensor
    cartesian: torch.Tensor
    weak: torch.Tensor = field(repr=False)
    translation: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 1, dtype=torch.long))
    rotation: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 1, dtype=torch.long))
    frag: fragments.FragmentRows | None = field(default=None, repr=False)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(len(getattr(self, k)) for k in KINDS)

    def __len__(self) -> int:
        return sum(self.counts)

    def kind_slice(self, kind: str) -> slice:
        k = KINDS.index(kind)
        start = sum(self.counts[:k])
        return slice(start, start + self.counts[k])

    def periodic(self, device=None) -> torch.Tensor:
        """``(P,)`` bool: the dihedrals (values in ``(-pi, pi]``, differences wrap)."""
        p = torch.zeros(len(self), dtype=torch.bool, device=device)
        p[self.kind_slice("dihedral")] = True
        return p

    def find(self, atoms: tuple[int, ...]) -> int | None:
        """Index in ``q`` of the bond, angle or dihedral over ``atoms`` (either direction), or None."""
        kind = {2: "bond", 3: "angle", 4: "dihedral"}[len(atoms)]
        rows = getattr(self, kind).tolist()
        for want in (list(atoms), list(atoms)[::-1]):
            if want in rows:
                return self.kind_slice(kind).start + rows.index(want)
        return None

    def to(self, device) -> Primitives:
        moved = {k: getattr(self, k).to(device) for k in (*KINDS, "linear_ref", "weak")}
        return replace(self, **moved, frag=self.frag.to(device) if self.frag is not None else None)

    @property
    def rigid_invariant(self) -> bool:
        """Whether every row is unchanged by rigid motions (no linear bend's fixed direction, no
        Cartesian or fragment rows): B's null space then holds the six rigid motions."""
        return not any(len(getattr(self, k)) for k in ("linear", "translation", "rotation", "cartesian"))

    def linear_triples(self) -> frozenset:
        """The ``(i, j, k)`` triples held by linear bends."""
        return frozenset(tuple(t) for t in self.linear.tolist())

    def linear_check(self, xyz: torch.Tensor, host: bool = False) -> torch.Tensor:
        """0-d bool: some angle became linear, or some linear bend bent (a rebuild is due); ``host``:
        a Python bool where the kernel's answer is one (the CPU kernel)."""
        na = len(self.angle)
        if _compiled.usable(xyz):  # the same angles, one kernel call (the torch path: ~20 ops)
            q = _compiled.values(_angle_layout(self, xyz.dtype), xyz).numpy()
            out = bool((q[:, :na] > LINEAR).any() or (q[:, na:] < UNLINEAR).any())
            out = out if host else torch.tensor(out)
        else:
            out = torch.zeros((), dtype=torch.bool, device=xyz.device)
            if na:
                out = out | (_angle(xyz[..., self.angle, :]) > LINEAR).any()
            if len(self.linear):
                out = out | (_angle(xyz[..., self.linear, :]) < UNLINEAR).any()
        if len(self.rotation):  # a fragment turned far from its reference: a new reference
            out = out | fragments.turned_far(self.frag, xyz[..., self.rotation, :])
        return out


def _angle_layout(prims: Primitives, dtype: torch.dtype) -> tuple:
    """:func:`kernel_layout`'s arrays for :meth:`Primitives.linear_check`: the angles, then the linear
    bends' ``i, j, k`` as angles (kind 1), cached."""
    cache = prims.__dict__.setdefault("_layouts", {})
    key = "angles", dtype
    if key not in cache:
        rows = torch.cat([prims.angle, prims.linear]).cpu()
        atoms = torch.cat([rows, rows[:, -1:]], 1).contiguous()
        kind = torch.ones(len(rows), dtype=torch.long)
        cache[key] = atoms, kind, torch.zeros(len(rows), 3, dtype=dtype), torch.zeros(0, dtype=torch.long)
    return cache[key]


def _angle(p: torch.Tensor) -> torch.Tensor:
    """``(..., 3, 3)`` points ``i, j, k`` -> angle at ``j``, radians."""
    u, v = p[..., 0, :] - p[..., 1, :], p[..., 2, :] - p[..., 1, :]
    return safe_atan2(safe_norm(torch.linalg.cross(u, v, dim=-1)), (u * v).sum(-1))


def _layout(prims: Primitives, device) -> tuple:
    """The fused layout of the geometric primitives, built once per :class:`Primitives` and device.

    ``(atoms, masks, ref, cols, cart)``: ``atoms`` ``(G, 4)`` every bond, angle,
    linear bend, dihedral and out-of-plane row padded to four atoms (the last
    atom repeated); ``masks`` ``(5, G)`` bool, one row per kind; ``ref``
    ``(G, 3)`` the linear bends' reference directions (0 elsewhere); ``cols``
    ``(G, 12)`` the columns of B the four atoms fill; ``cart`` ``(C,)`` the
    flat ``3 * atom + axis`` of the Cartesian rows.
    """
    cache = prims.__dict__.setdefault("_layouts", {})
    if device not in cache:
        kinds = GEOMETRIC
        rows = [getattr(prims, k) for k in kinds]
        atoms = torch.cat([torch.cat([r, r[:, -1:].expand(-1, 4 - r.shape[1])], 1) for r in rows])
        code = torch.cat([torch.full((len(r),), k) for k, r in enumerate(rows)])
        masks = code[None, :] == torch.arange(len(kinds))[:, None]
        ref = torch.zeros(len(atoms), 3, dtype=torch.float64)
        ref[masks[kinds.index("linear")]] = prims.linear_ref.to(torch.float64)
        cols = (3 * atoms[:, :, None] + torch.arange(3)).reshape(len(atoms), 12)
        cart = 3 * prims.cartesian[:, 0] + prims.cartesian[:, 1]
        cache[device] = tuple(t.to(device) for t in (atoms, masks, ref, cols, cart))
    return cache[device]


def kernel_layout(prims: Primitives, dtype: torch.dtype, cartesian: bool = True) -> tuple:
    """The rows as the compiled kernel (:mod:`._compiled`) takes them, cached: ``(atoms, kind, ref, cart)``
    contiguous CPU arrays, :func:`_layout`'s with ``kind`` ``(G,)`` the row's index in :data:`GEOMETRIC`,
    ``ref`` in ``dtype`` and ``cart`` empty unless ``cartesian``."""
    cache = prims.__dict__.setdefault("_layouts", {})
    key = "kernel", dtype, cartesian
    if key not in cache:
        atoms, masks, ref, _, cart = _layout(prims, torch.device("cpu"))
        rows = (atoms, masks.long().argmax(0), ref.to(dtype), cart if cartesian else cart[:0])
        cache[key] = tuple(t.contiguous() for t in rows)
    return cache[key]


def _fused(masks: torch.Tensor, ref: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Values of every geometric primitive from its four gathered points ``p`` ``(B, G, 4, 3)``.

    One formula for all kinds: ``atan2(S, C)`` of two vectors ``a, w`` per row
    (angle: the two arms; linear bend: the arm and the reference made
    perpendicular to the axis; out-of-plane: the plane's normal and the bond,
    sine and cosine swapped; dihedral: the two planes' normals, the sine signed
    by the middle bond's length times ``b1 . n2`` as in
    :func:`~zmat._geometry.dihedral_from_bonds`), the bond's length where the
    row is a bond. Selected with ``where`` (a row's other branches get zero
    gradient), so an evaluation costs a few dozen ops, not a loop over kinds.
    """
    bond, _, linear, dihedral, oop = masks.unbind(0)
    bond3, linear3, dihedral3, oop3 = (m[:, None] for m in (bond, linear, dihedral, oop))
    norm = torch.linalg.vector_norm  # its gradient at 0 is 0: padded rows stay finite
    b1, v, b3 = (p[..., 1:, :] - p[..., :-1, :]).unbind(-2)
    uv = torch.linalg.cross(v, b1, dim=-1)  # (p0 - p1) x (p2 - p1)
    axis = b1 + v  # p2 - p0
    axis = axis / norm(axis, dim=-1, keepdim=True).clamp_min(1e-12)
    perp = ref - (ref * axis).sum(-1, keepdim=True) * axis
    a = torch.where(oop3, uv, torch.where(dihedral3, -uv, -b1))
    w = torch.where(dihedral3, torch.linalg.cross(v, b3, dim=-1), torch.where(oop3, v + b3, v))
    w = torch.where(linear3, perp, w)
    dot = (a * w).sum(-1)
    cross = norm(torch.linalg.cross(a, w, dim=-1), dim=-1)
    sine = torch.where(oop, dot, torch.where(dihedral, norm(v, dim=-1) * (b1 * w).sum(-1), cross))
    ang = safe_atan2(sine, torch.where(oop, cross, dot))
    return torch.where(bond, norm(b1, dim=-1), ang)


def _fragment_values(prims: Primitives, kind: str, p: torch.Tensor) -> torch.Tensor:
    """Translations or rotations of the fragments from their gathered atoms ``(B, n, m, 3)``."""
    f = prims.frag
    if kind == "translation":
        return fragments.translation(p, f.t_mask, f.t_axis)
    return fragments.rotation(p, f.r_mask, f.r_axis, f.r_ref, f.r_reg)


def _others(prims: Primitives) -> tuple[str, ...]:
    """The non-empty kinds outside the fused formula (fragments' translations and rotations), in order."""
    return tuple(k for k in ("translation", "rotation") if len(getattr(prims, k)))


def values(prims: Primitives, xyz: torch.Tensor) -> torch.Tensor:
    """The primitives' values ``q``, ``(B, P)``, at positions ``xyz`` ``(B, N, 3)``.

    Lengths in the unit of ``xyz``, angles in radians (dihedrals in ``(-pi, pi]``).
    On plain CPU tensors (no autograd through ``xyz``) the geometric and Cartesian
    rows come from the compiled kernel (:mod:`._compiled`), one call.
    """
    others = _others(prims)
    if _compiled.usable(xyz) and not others:
        return _compiled.values(kernel_layout(prims, xyz.dtype), xyz)
    atoms, masks, ref, _, cart = _layout(prims, xyz.device)
    if _compiled.usable(xyz):
        out = [_compiled.values(kernel_layout(prims, xyz.dtype, cartesian=False), xyz)]
    else:
        out = [_fused(masks, ref.to(xyz.dtype), xyz[:, atoms])]
    out += [_fragment_values(prims, k, xyz[:, getattr(prims, k)]) for k in others]
    if len(cart):
        out.append(xyz.flatten(1)[:, cart])
    return torch.cat(out, 1) if len(out) > 1 else out[0]


def values_and_b(prims: Primitives, xyz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` ``(B, P)`` and the Wilson B matrix ``dq/dx`` ``(B, P, 3N)`` at ``xyz``, by autograd.

    One backward pass for every primitive at once: each row's atoms are a
    separate copy in a gathered leaf (``(B, G, 4, 3)`` for the fused kinds, one
    more per fragment kind), so the gradient of the summed values is every
    row's own derivative, scattered into its columns. On plain CPU tensors the
    geometric and Cartesian rows come from the compiled kernel instead
    (:mod:`._compiled`: forward-mode derivatives of the same formula, one call);
    the fragments' rows stay in torch.
    """
    others = _others(prims)
    compiled = _compiled.usable(xyz)
    if compiled and not others:
        return _compiled.values_and_b(kernel_layout(prims, xyz.dtype), xyz)
    atoms, masks, ref, cols, cart = _layout(prims, xyz.device)
    bsz, n3, x = xyz.shape[0], 3 * prims.n_atoms, xyz.detach()
    idx = ([] if compiled else [atoms]) + [getattr(prims, k) for k in others]
    with torch.enable_grad():
        leaves = [x[:, i].requires_grad_(True) for i in idx]
        qs = [] if compiled else [_fused(masks, ref.to(xyz.dtype), leaves[0])]
        qs += [_fragment_values(prims, k, leaf) for k, leaf in zip(others, leaves[len(qs) :], strict=True)]
        local = torch.autograd.grad(sum(q.sum() for q in qs), leaves)
    fragment_cols = [
        (3 * i[:, :, None] + torch.arange(3, device=xyz.device)).flatten(1)
        for i in idx[len(qs) - len(others) :]
    ]
    cols = ([] if compiled else [cols]) + fragment_cols
    blocks = []
    for i, g, c in zip(idx, local, cols, strict=True):
        block = xyz.new_zeros(bsz, len(i), n3)
        blocks.append(block.scatter_add_(2, c.expand(bsz, -1, -1), g.reshape(bsz, len(i), -1)))
    q = [t.detach() for t in qs]
    if compiled:
        q0, b0 = _compiled.values_and_b(kernel_layout(prims, x.dtype, cartesian=False), x)
        q, blocks = [q0, *q], [b0, *blocks]
    if len(cart):
        one = torch.zeros(len(cart), n3, dtype=xyz.dtype, device=xyz.device)
        one[torch.arange(len(cart), device=xyz.device), cart] = 1.0
        q.append(xyz.flatten(1)[:, cart])
        blocks.append(one.expand(bsz, -1, -1))
    if len(q) == 1:
        return q[0], blocks[0]
    return torch.cat(q, 1), torch.cat(blocks, 1)


def wilson_b(prims: Primitives, xyz: torch.Tensor) -> torch.Tensor:
    """The Wilson B matrix ``dq/dx``, ``(B, P, 3N)``, by autograd (see :func:`values_and_b`).

    Lengths and ``xyz`` in one unit.
    """
    return values_and_b(prims, xyz)[1]


# ---------------------------------------------------------------- topology (host, once)
def _radii(numbers: np.ndarray, table: np.ndarray, fallback: float) -> np.ndarray:
    r = np.asarray(table)[numbers].astype(float)
    return np.where(np.isfinite(r), r, fallback)


def _bonds(xyz: np.ndarray, numbers: np.ndarray, join: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Bond matrix (covalent, hydrogen and, if ``join``, fragment-joining bonds) and the covalent-fragment
    matrix."""
    n = len(numbers)
    d = np.linalg.norm(xyz[:, :, None] - xyz[:, None], axis=-1)  # (B, N, N)
    rc = _radii(numbers, covalent_radii, 0.7)
    covalent = (d < 1.3 * (rc[:, None] + rc[None, :])).any(0) & ~np.eye(n, dtype=bool)
    _, label = connected_components(covalent, directed=False)
    same = label[:, None] == label[None, :]
    bonds = covalent.copy()
    # hydrogen bonds D-H...A (D, A in N, O, F): H...A below 2.5 A, angle D-H...A above 120 deg
    polar = np.isin(numbers, (7, 8, 9))
    for h in np.flatnonzero(numbers == 1):
        donors = np.flatnonzero(covalent[h] & polar)
        for a in np.flatnonzero(polar & ~covalent[h]):
            for dn in donors:
                if a == dn or covalent[dn, a]:
                    continue
                u, v = xyz[0, dn] - xyz[0, h], xyz[0, a] - xyz[0, h]
                cos = u @ v / (np.linalg.norm(u) * np.linalg.norm(v))
                if d[0, h, a] < 2.5 and cos < -0.5:
                    bonds[h, a] = bonds[a, h] = True
    # join fragments: contacts within the sum of van der Waals radii, widened until connected (pyberny)
    rv = _radii(numbers, vdw_radii, 2.0)
    shift, dmin = 0.0, d.min(0)
    while join and connected_components(bonds, directed=False)[0] > 1:
        _, lab = connected_components(bonds, directed=False)
        apart = lab[:, None] != lab[None, :]
        bonds |= apart & (dmin < rv[:, None] + rv[None, :] + shift)
        shift += 1.0
    return bonds, same


def _angles_all(xyz: np.ndarray, i, j, k) -> np.ndarray:
    u, v = xyz[:, i] - xyz[:, j], xyz[:, k] - xyz[:, j]
    cos = (u * v).sum(-1) / (np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1))
    return np.arccos(np.clip(cos, -1.0, 1.0))  # (B,)


class _AngleTable(dict):
    """``(B,)`` angle ``i-j-k`` keyed ``(i, j, k)``, every pair of ``j``'s neighbours from one vectorised
    :func:`_angles_all` (elementwise the same arithmetic; one call per triple was a third of a rebuild)."""

    def __init__(self, xyz: np.ndarray, bonds: np.ndarray) -> None:
        nbs = [np.flatnonzero(row) for row in bonds]
        keys = [(int(i), j, int(k)) for j, nb in enumerate(nbs) for i in nb for k in nb if i != k]
        t = np.asarray(keys, dtype=np.int64).reshape(-1, 3)
        a = _angles_all(xyz, t[:, 0], t[:, 1], t[:, 2])  # (B, M)
        super().__init__((key, a[:, m]) for m, key in enumerate(keys))
        self.xyz = xyz

    def __missing__(self, key):
        return _angles_all(self.xyz, *key)


def _perpendicular(axis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    e = np.zeros(3)
    e[int(np.argmin(np.abs(axis)))] = 1.0
    p1 = e - (e @ axis) * axis
    p1 /= np.linalg.norm(p1)
    return p1, np.cross(axis, p1)


def _dihedrals(center, angle: _AngleTable, bonds, same, out: dict) -> None:
    """Dihedrals about the (possibly linear-extended) chain ``center`` (pyberny's rule)."""

    def sides(end, nxt):
        nonlin, lin = [], []
        for n in np.flatnonzero(bonds[end]):
            if n in center:
                continue
            a = angle[int(n), end, nxt]
            (lin if ((a > math.pi - _DIHEDRAL_LINEAR) | (a < _DIHEDRAL_LINEAR)).any() else nonlin).append(
                int(n)
            )
        return nonlin, lin

    left, lin_l = sides(center[0], center[1])
    right, lin_r = sides(center[-1], center[-2])
    if center[0] < center[-1]:
        weak_center = sum(not same[a, b] for a, b in zip(center, center[1:], strict=False))
        for i in left:
            for j in right:
                if i == j:
                    continue
                weak = weak_center + (not same[i, center[0]]) + (not same[center[-1], j])
                if weak <= 1:
                    out.setdefault((i, center[0], center[-1], j), weak)
    if len(center) <= 3 and len(lin_l) <= 1 and len(lin_r) <= 1:
        if lin_l and not lin_r:
            _dihedrals(lin_l + center, angle, bonds, same, out)
        elif lin_r and not lin_l:
            _dihedrals(center + lin_r, angle, bonds, same, out)


def build_primitives(
    xyz,
    numbers,
    *,
    extra: tuple[tuple[int, ...], ...] = (),
    frozen: tuple[int, ...] = (),
    out_of_plane: bool = True,
    linear: frozenset = frozenset(),
    coords: str = "redundant",
) -> Primitives:
    """The primitive internal coordinates of a molecule (or cluster) at ``xyz``.

    Args:
        xyz: ``(N, 3)`` or ``(B, N, 3)`` positions in Angstrom (a batch: the
            union of every conformer's bonds; an angle is linear if it is in any).
        numbers: ``(N,)`` atomic numbers.
        extra: atom tuples (2, 3 or 4 atoms) to include as bonds, angles or
            dihedrals even if the rules leave them out (constraints).
        frozen: atoms whose Cartesian components are primitives (frozen atoms).
        out_of_plane: include out-of-plane angles of three-coordinate centres.
        linear: ``(i, j, k)`` triples that were linear before (a rebuild): they
            stay linear down to 170 degrees (hysteresis), new ones from 175.
        coords: ``"redundant"`` (fragments joined by contact bonds) or
            ``"tric"`` (each fragment's translation and rotation instead,
            :mod:`.fragments`; the reference is ``xyz``).

    Returns:
        a :class:`Primitives` on the CPU (``.to(device)`` to move it).
    """
    xyz = np.asarray(torch.as_tensor(xyz, dtype=torch.float64).cpu())
    xyz = xyz[None] if xyz.ndim == 2 else xyz
    numbers = np.asarray(numbers, dtype=np.int64)
    n = len(numbers)
    if coords not in ("redundant", "tric"):
        raise ValueError(f"coords must be 'redundant' or 'tric', got {coords!r}")
    tric = coords == "tric"
    bonds, same = _bonds(xyz, numbers, join=not tric)
    weak_bond = {(i, j): int(not same[i, j]) for i, j in zip(*np.nonzero(np.triu(bonds)), strict=False)}
    angles, bends, refs = {}, [], []
    angle = _AngleTable(xyz, bonds)
    for j in range(n):
        nb = np.flatnonzero(bonds[j])
        for i, k in combinations(nb, 2):
            a = angle[int(i), j, int(k)]
            weak = int(not same[i, j]) + int(not same[j, k])
            was = (int(i), j, int(k)) in linear or (int(k), j, int(i)) in linear
            if (a > (UNLINEAR if was else LINEAR)).any():
                if len(nb) == 2:  # an sp centre: linear bends; otherwise the other angles hold it
                    axis = xyz[0, k] - xyz[0, i]
                    for ref in _perpendicular(axis / np.linalg.norm(axis)):
                        bends += [(int(i), j, int(k)), (int(k), j, int(i))]
                        refs += [ref, ref]
            elif (a > _SMALL_ANGLE).all():
                angles[(int(i), j, int(k))] = weak
    dihedrals: dict = {}
    for i, j in weak_bond:
        _dihedrals([int(i), int(j)], angle, bonds, same, dihedrals)
    oop = {}
    if out_of_plane:
        covalent_nb = bonds & same
        for j in range(n):
            nb = np.flatnonzero(covalent_nb[j])
            if len(nb) == 3:
                oop[(int(nb[0]), j, int(nb[1]), int(nb[2]))] = 0
    for t in extra:
        t = tuple(int(a) for a in t)
        table = {2: weak_bond, 3: angles, 4: dihedrals}[len(t)]
        key = t if len(t) != 2 else tuple(sorted(t))
        if key not in table and key[::-1] not in table:
            table[key] = 1
    cart = [(a, c) for a in frozen for c in range(3)]
    weak = [*weak_bond.values(), *angles.values(), *[0] * len(bends), *dihedrals.values(), *oop.values()]
    frag = {}
    if tric:
        t_idx, r_idx, rows = fragments.fragment_rows(xyz, same)
        frag = {"translation": t_idx, "rotation": r_idx, "frag": rows}
        weak += [0] * (len(t_idx) + len(r_idx))

    def idx(rows, k):
        return torch.tensor(list(rows), dtype=torch.long).reshape(-1, k)

    return Primitives(
        n_atoms=n,
        bond=idx(weak_bond, 2),
        angle=idx(angles, 3),
        linear=idx(bends, 3),
        linear_ref=torch.tensor(np.asarray(refs, dtype=float).reshape(-1, 3)),
        dihedral=idx(dihedrals, 4),
        oop=idx(oop, 4),
        cartesian=idx(cart, 2),
        weak=torch.tensor(weak + [0] * len(cart), dtype=torch.long),
        **frag,
    )
