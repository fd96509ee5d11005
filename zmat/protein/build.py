"""Torsions -> internal coordinates -> full-atom coordinates, differentiably.

A generative model emits torsions (phi, psi, omega, chi1..chi4 per residue);
the rest of the geometry is ideal (``zmat.protein.topology``). Torsions are
``(..., L, 7)`` tensors with columns in ``TORSION_NAMES`` order, or dicts of
``(..., L)`` tensors (missing keys count as NaN). NaN means "not given": the
default torsion is used instead (``DEFAULT_TORSIONS``), or the measured value
when rebuilding a structure read from a file. phi of the first residue, omega
of the last one and chis a residue does not have are ignored; psi of the last
residue places ``OXT`` (and so ``O``). Proline's ring is closed in every path:
its CB-CG-CD angle is set so that CD is ``PRO_CD_N`` from N
(:func:`proline_cd_angle`), and its NaN chi1/chi2 default to
``topology.PRO_DEFAULT_CHI``.

* :func:`internal_from_torsions` / :func:`to_xyz_from_torsions`: one sequence,
  any leading batch dimensions.
* :class:`ProteinBatch`: sequences of different lengths, padded to ``L_max``
  residues / ``N_max`` atoms with masks, one forest table over the batch.
* FoldingDiff's six-angle backbone (:func:`internal_from_six_angles`,
  :func:`six_angles_from_backbone`): N, CA, C only.

The first two fill the internal coordinates, on plain CPU tensors, in the
compiled kernel (``zmat._kernel.fill``: one loop; below
``zmat._kernel.PARALLEL_ATOMS`` no parallel region that would wait for a busy
core); :func:`fill_internal` is the torch path and its reference.

Ideal geometry drifts from a real structure with chain length: rebuilding a
file's structure from its own torsions with ideal bond lengths and angles
(``Protein.ideal_internal``) accumulates small bond-angle deviations through
the lever arm of the chain; keeping the measured backbone angles removes most
of it (figures: ``docs/history.md``).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .. import _kernel
from .._geometry import tiny
from .._segments import per_row, segment_arange, segment_ids, starts
from ..clash import alphafold_radii, candidate_pairs, exclusions_from_bonds, is_excluded
from ..table import ConstructionTable
from ..transform import to_internal, to_xyz
from .layout import (
    N_TORSIONS,
    Layout,
    ProlineRing,
    SharedTensors,
    layout_from_types,
    residue_types,
    ring_atoms,
    sequence_types,
)
from .pieces import FORWARD, batch_arrays, batch_table, stamp
from .topology import AA3, RESIDUES, TORSION_NAMES, geometry, one_to_three

__all__ = [
    "DEFAULT_TORSIONS",
    "FOLDINGDIFF_ANGLES",
    "FOLDINGDIFF_LENGTHS",
    "ProteinBatch",
    "backbone_table",
    "fill_internal",
    "internal_from_six_angles",
    "internal_from_torsions",
    "protein_layout",
    "six_angles_from_backbone",
    "to_xyz_from_torsions",
]

#: Torsions used where NaN is given (radians): phi -60, psi -45 (helix),
#: omega 180 (trans), chi1 -60, chi2..chi4 180.
DEFAULT_TORSIONS = tuple(math.radians(x) for x in (-60.0, -45.0, 180.0, -60.0, 180.0, 180.0, 180.0))


def as_torsion_tensor(torsions, n_residues: int | None = None) -> torch.Tensor:
    """``(..., L, 7)`` tensor from a tensor or a dict of ``(..., L)`` tensors.

    Raises:
        ValueError: unknown dict key, wrong last dimension or length.
        TypeError: not a float tensor / dict.
    """
    if isinstance(torsions, dict):
        unknown = set(torsions) - set(TORSION_NAMES)
        if unknown:
            raise ValueError(f"unknown torsion names {sorted(unknown)}; expected some of {TORSION_NAMES}")
        ref = next((torch.as_tensor(v) for v in torsions.values()), None)
        if ref is None:
            raise ValueError("torsion dict is empty")
        if not ref.dtype.is_floating_point:
            raise TypeError(f"torsions must be float tensors, got {ref.dtype}")
        cols = [
            torch.as_tensor(torsions[k], dtype=ref.dtype, device=ref.device)
            if k in torsions
            else torch.full_like(ref, torch.nan)
            for k in TORSION_NAMES
        ]
        t = torch.stack(torch.broadcast_tensors(*cols), -1)
    else:
        if not isinstance(torsions, torch.Tensor) or not torsions.dtype.is_floating_point:
            raise TypeError(f"torsions must be a float tensor (..., L, 7) or a dict, got {type(torsions)}")
        t = torsions
        if t.ndim < 2 or t.shape[-1] != N_TORSIONS:
            raise ValueError(f"torsions must have shape (..., L, {N_TORSIONS}), got {tuple(t.shape)}")
    if n_residues is not None and t.shape[-2] != n_residues:
        raise ValueError(f"torsions are given for {t.shape[-2]} residues, the sequence has {n_residues}")
    return t


def fill_internal(lay: Layout, torsions, base: torch.Tensor | None = None) -> torch.Tensor:
    """Ideal internal coordinates of ``lay`` with ``torsions`` in their rows.

    Args:
        lay: a :class:`~zmat.protein.layout.Layout` (or any
            ``SharedTensors`` with ``ideal``, ``ideal_mask``, ``torsion_slot``,
            ``n_residues``).
        torsions: ``(..., L, 7)`` tensor or dict (see the module doc).
        base: optional ``(..., N, 3)`` values for the non-chemical columns and
            for NaN torsions (a structure's measured internal coordinates);
            default: ideal values and ``DEFAULT_TORSIONS``.

    Returns:
        ``(..., N, 3)``, differentiable in ``torsions`` (and ``base``).
    """
    t = as_torsion_tensor(torsions, lay.n_residues)
    if base is None:
        t = _proline_defaults(lay, t)
    return close_proline_rings(lay, _fill_torch(lay, t, base))


def _fill_torch(lay: Layout, t: torch.Tensor, base) -> torch.Tensor:
    """:func:`fill_internal`'s torch ops, before the proline rings are closed."""
    dtype, device = t.dtype, t.device
    ideal = lay.tensor("ideal", device).to(dtype)
    mask = lay.tensor("ideal_mask", device)
    slot = lay.tensor("torsion_slot", device)
    has = slot >= 0
    flat = t.flatten(-2).index_select(-1, slot.clamp_min(0))  # (..., N)
    if base is None:
        default = torch.tensor(DEFAULT_TORSIONS, dtype=dtype, device=device)
        fallback = default[slot.clamp_min(0) % N_TORSIONS]
        base_vals = torch.nan_to_num(ideal, nan=0.0)
    else:
        base_vals = torch.as_tensor(base, dtype=dtype, device=device)
        fallback = base_vals[..., 2]
    tors = torch.where(torch.isnan(flat), fallback, flat)
    fixed = mask & ~torch.isnan(ideal)
    r = torch.where(fixed[:, 0], ideal[:, 0], base_vals[..., 0])
    theta = torch.where(fixed[:, 1], ideal[:, 1], base_vals[..., 1])
    phi = torch.where(has, tors, torch.where(fixed[:, 2], ideal[:, 2], base_vals[..., 2]))
    r, theta, phi = torch.broadcast_tensors(r, theta, phi)
    return torch.stack([r, theta, phi], -1)


_DEFAULTS = torch.tensor(DEFAULT_TORSIONS, dtype=torch.float64)
PRO = AA3.index("PRO")


def _fill(lay: Layout, torsions) -> torch.Tensor:
    """:func:`fill_internal` without ``base``; on plain CPU tensors the
    compiled kernel (``zmat._kernel.fill``: one loop, split over threads only
    above ``zmat._kernel.PARALLEL_ATOMS``; a few dispatched ops), else the torch ops."""
    t = as_torsion_tensor(torsions, lay.n_residues)
    if not _kernel.usable(t):
        return fill_internal(lay, t)
    t = _proline_defaults(lay, t)
    t3 = t.reshape(math.prod(t.shape[:-2]), lay.n_residues, N_TORSIONS)
    out = _kernel.fill(t3, lay.tensor("ideal"), lay.tensor("torsion_slot"), _DEFAULTS)
    if len(lay.proline_rows):  # the ring's chi are the torsions the kernel wrote: read them from t3
        chi = t3.flatten(-2).index_select(-1, lay.tensor("proline_chi")).unflatten(-1, (2, -1))
        out = _CloseRingsInPlace.apply(out, lay.tensor("proline_cd_angle"), *chi.unbind(-2))
    return out.view(*t.shape[:-2], out.shape[-2], 3)


# ------------------------------------------------------------ proline's ring
#: Proline's ring-closing bond N-CD (Engh & Huber 1991), Angstrom.
PRO_CD_N = geometry("PRO")["CD-N"]


def proline_cd_angle(chi1, chi2, n_ca, ca_cb, n_ca_cb, cb_cg, ca_cb_cg, cg_cd, cb_cg_cd, cd_n=PRO_CD_N):
    """The bond angle CB-CG-CD that closes proline's ring: ``|CD - N| = cd_n``.

    The ring is not a tree: CD, placed from CG (bond ``r = cg_cd``, dihedral
    ``chi2``), meets N only at one bond angle ``t``. In the frame of CG (origin), CB
    (on ``+x``) and CA (``xy`` plane, ``y > 0``), the NeRF placements give

        CA = (|CB-CG| - a cos(alpha), a sin(alpha), 0)     (a = |CA-CB|, alpha = CA-CB-CG)
        N  = CA + l (cos(beta) cos(alpha) - sin(beta) cos(chi1) sin(alpha),
                     -cos(beta) sin(alpha) - sin(beta) cos(chi1) cos(alpha),
                     sin(beta) sin(chi1))                  (l = |N-CA|, beta = N-CA-CB)
        CD = r (cos t, sin t cos(chi2), -sin t sin(chi2)),

    so ``|CD - N|^2 = cd_n^2`` reads ``A cos t + B sin t = K`` with ``A = N_x``,
    ``B = N_y cos(chi2) - N_z sin(chi2)``, ``K = (r^2 + |N|^2 - cd_n^2) / (2 r)``: two
    roots ``atan2(B, A) +- acos(K / sqrt(A^2 + B^2))``, of which the one nearer the
    ideal angle ``cb_cg_cd`` is taken. Where the ring cannot close (chi1, chi2 of no
    pucker), CD goes as close to ``cd_n`` from N as it can. Plain elementwise torch ops
    (the same values on every path), differentiable, finite gradients.

    Args: tensors or floats, broadcast; angles in radians, lengths in Angstrom.

    Returns:
        ``t``, radians.
    """
    like = {"dtype": chi1.dtype, "device": chi1.device}
    n_ca, ca_cb, n_ca_cb, cb_cg, ca_cb_cg, cg_cd, cb_cg_cd, cd_n = (
        torch.as_tensor(v, **like) for v in (n_ca, ca_cb, n_ca_cb, cb_cg, ca_cb_cg, cg_cd, cb_cg_cd, cd_n)
    )
    cos, sin = torch.cos, torch.sin
    ca_x, ca_y = cb_cg - ca_cb * cos(ca_cb_cg), ca_cb * sin(ca_cb_cg)
    ax, ay = cos(ca_cb_cg), sin(ca_cb_cg)
    bx, by = n_ca * cos(n_ca_cb), n_ca * sin(n_ca_cb)
    n_x = ca_x + bx * ax - by * cos(chi1) * ay
    n_y = ca_y - bx * ay - by * cos(chi1) * ax
    n_z = by * sin(chi1)
    A, B = n_x, n_y * cos(chi2) - n_z * sin(chi2)
    K = (cg_cd**2 + n_x**2 + n_y**2 + n_z**2 - cd_n**2) / (2 * cg_cd)
    eps = tiny(chi1.dtype)
    h = (A**2 + B**2 - K**2).clamp_min(eps).sqrt()  # R sin(delta); 0 where out of reach
    delta = torch.atan2(h, K)
    mid = torch.atan2(B, A)
    return torch.where(
        (mid + delta - cb_cg_cd).abs() <= (mid - delta - cb_cg_cd).abs(), mid + delta, mid - delta
    )


@functools.cache
def _ideal_ring() -> tuple[float, ...]:
    """:func:`proline_cd_angle`'s terms with proline's ideal geometry folded in: with
    ``c = cos(chi1)``, ``N = (P + Q c, U + V c, W sin(chi1))`` and ``K = K0 + K1 c``
    (``|N|^2`` is linear in ``c``: the ``c^2`` terms cancel); then ``t0``."""
    pro = RESIDUES["PRO"]
    row = {a: pro.ideal[pro.index(a)] for a in ("CA", "CB", "CG", "CD")}
    n_ca, (ca_cb, beta), (cb_cg, alpha), (r, t0) = row["CA"][0], row["CB"][:2], row["CG"][:2], row["CD"][:2]
    ax, ay, bx, by = math.cos(alpha), math.sin(alpha), n_ca * math.cos(beta), n_ca * math.sin(beta)
    P, Q = cb_cg - ca_cb * ax + bx * ax, -by * ay
    U, V, W = ca_cb * ay - bx * ay, -by * ax, by
    K0 = (r * r + P * P + U * U + W * W - PRO_CD_N**2) / (2 * r)
    K1 = (P * Q + U * V) / r
    return P, Q, U, V, W, K0, K1, t0


def ideal_cd_angle(chi1: torch.Tensor, chi2: torch.Tensor) -> torch.Tensor:
    """:func:`proline_cd_angle` with proline's ideal geometry (the hot path): the terms
    folded into constants (:func:`_ideal_ring`), the derivatives written out, and on the
    CPU computed in numpy, so a step dispatches a handful of ops, not a hundred.
    Differentiable twice (the second time in torch ops); elsewhere (devices, ``torch.func``
    transforms, tracing) plain torch ops."""
    if _kernel.usable(chi1):
        return _IdealCDAngle.apply(chi1, chi2)
    return _ideal_angle(torch, chi1, chi2).to(chi1.dtype)


def _ideal_terms(xp, chi1, chi2):
    """``A, B, K, h`` of :func:`proline_cd_angle` and their derivatives in chi1, chi2
    (``xp``: numpy or torch)."""
    P, Q, U, V, W, K0, K1, _ = _ideal_ring()
    c1, s1, c2, s2 = xp.cos(chi1), xp.sin(chi1), xp.cos(chi2), xp.sin(chi2)
    vu = c1 * V + U
    A, B, K = c1 * Q + P, vu * c2 - s1 * s2 * W, c1 * K1 + K0
    dA, dK = s1 * -Q, s1 * -K1  # d/dchi1 (0 in chi2)
    dB1, dB2 = -(s1 * c2 * V + c1 * s2 * W), -(vu * s2 + s1 * c2 * W)
    h2 = A * A + B * B - K * K
    reach = h2 > _TINY_RING  # else the ring cannot close: h = 0, CD as near as it gets
    h = xp.where(reach, xp.where(reach, h2, 1.0) ** 0.5, 0.0)
    return A, B, K, h, (dA, dK, dB1, dB2, reach)


_TINY_RING = 1e-12  # h^2 (A^2) below which the ring counts as not closing


def _ideal_angle(xp, chi1, chi2, grad: bool = False):
    """The angle (of ``mid +- delta``, the one nearer the ideal) and, with ``grad``, its
    derivatives in chi1 and chi2."""
    A, B, K, h, (dA, dK, dB1, dB2, reach) = _ideal_terms(xp, chi1, chi2)
    atan2 = torch.atan2 if xp is torch else np.arctan2
    t0 = _ideal_ring()[-1]
    mid, delta = atan2(B, A), atan2(h, K)
    sign = xp.where(abs(mid + delta - t0) <= abs(mid - delta - t0), 1.0, -1.0)
    if not grad:
        return mid + sign * delta
    R2 = A * A + B * B  # = h^2 + K^2 where the ring closes
    safe_h = xp.where(reach, h, 1.0)
    dh1 = xp.where(reach, (A * dA + B * dB1 - K * dK) / safe_h, 0.0)
    dh2 = xp.where(reach, B * dB2 / safe_h, 0.0)
    hk = xp.where(reach, R2, h * h + K * K)
    d1 = (A * dB1 - B * dA) / R2 + sign * (K * dh1 - h * dK) / hk
    d2 = A * dB2 / R2 + sign * K * dh2 / hk
    return d1, d2


class _IdealCDAngle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, chi1, chi2):
        ctx.save_for_backward(chi1, chi2)
        c1, c2 = (x.detach().numpy().astype(np.float64) for x in (chi1, chi2))
        return torch.from_numpy(_ideal_angle(np, c1, c2)).to(chi1.dtype)

    @staticmethod
    def backward(ctx, g):
        chi1, chi2 = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: differentiable torch ops
            d1, d2 = _ideal_angle(torch, chi1, chi2, grad=True)
        else:
            c1, c2 = (x.detach().numpy().astype(np.float64) for x in (chi1, chi2))
            d1, d2 = (torch.from_numpy(d).to(g.dtype) for d in _ideal_angle(np, c1, c2, grad=True))
        return g * d1, g * d2


class _CloseRingsInPlace(torch.autograd.Function):
    """The kernel path's ring closure: the CB-CG-CD angles of ``ideal_cd_angle(chi1, chi2)``
    written into the fill's fresh ``(S, N, 3)`` output in place, in numpy. The same values
    as :func:`close_proline_rings`, but no op over the whole output (at two threads each
    such op enters a parallel region, which waits for a busy core)."""

    @staticmethod
    def forward(ctx, out, at, chi1, chi2):
        ctx.mark_dirty(out)
        ctx.save_for_backward(at, chi1, chi2)
        c1, c2 = (x.detach().numpy().astype(np.float64) for x in (chi1, chi2))
        out.detach().numpy().reshape(len(out), -1)[:, at.numpy()] = _ideal_angle(np, c1, c2)
        return out

    @staticmethod
    def backward(ctx, g):
        at, chi1, chi2 = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: differentiable torch ops
            flat = g.flatten(-2)
            d1, d2 = _ideal_angle(torch, chi1, chi2, grad=True)
            g_angle = flat.index_select(-1, at)
            return flat.index_fill(-1, at, 0).view_as(g), None, g_angle * d1, g_angle * d2
        g_out = np.array(g.numpy(), copy=True).reshape(len(g), -1)  # one single-threaded copy
        g_angle = torch.from_numpy(g_out[:, at.numpy()])
        g_out[:, at.numpy()] = 0
        c1, c2 = (x.detach().numpy().astype(np.float64) for x in (chi1, chi2))
        d1, d2 = (torch.from_numpy(d).to(g.dtype) for d in _ideal_angle(np, c1, c2, grad=True))
        return torch.from_numpy(g_out).view_as(g), None, g_angle * d1, g_angle * d2


def close_proline_rings(lay, internal: torch.Tensor, cd_n=None) -> torch.Tensor:
    """``internal`` with each proline's CB-CG-CD angle set by :func:`proline_cd_angle`
    from the bond lengths, angles, chi1 and chi2 in ``internal``, so that its ring closes.

    Args:
        lay: a :class:`~zmat.protein.layout.Layout` (or the batch arrays) with
            ``proline_rows``: ``(P, 4)`` atoms CA, CB, CG, CD of the prolines whose
            ring rows are canonical (others are left as they are).
        internal: ``(..., N, 3)``.
        cd_n: ``None``: the rows hold proline's ideal geometry (every torsion path
            that fills ideal values) and close to ``PRO_CD_N``, with the geometry
            folded into constants; else the CD-N length to close (a float or ``(P,)``
            tensor) with the geometry read from ``internal`` (a structure's own).
    """
    if not len(lay.proline_rows):
        return internal
    flat = internal.flatten(-2)  # entries atom * 3 + column: one gather, one scatter
    if cd_n is None:
        chi = flat.index_select(-1, lay.tensor("proline_ring_chi", internal.device))  # (..., 2 P)
        angle = ideal_cd_angle(*chi.unflatten(-1, (2, -1)).unbind(-2))
    else:
        idx = lay.tensor("proline_rows", internal.device)
        ca, cb, cg, cd = internal.index_select(-2, idx.T.reshape(-1)).unflatten(-2, (4, -1)).unbind(-3)
        angle = proline_cd_angle(cg[..., 2], cd[..., 2], ca[..., 0], cb[..., 0], cb[..., 1], cg[..., 0],
                                 cg[..., 1], cd[..., 0], cd[..., 1], cd_n)  # fmt: skip
    return flat.index_copy(-1, lay.tensor("proline_cd_angle", internal.device), angle).view_as(internal)


def _proline_defaults(lay, t: torch.Tensor) -> torch.Tensor:
    """``(..., L, 7)`` torsions with NaN chi1, chi2 of the prolines set to ``PRO_DEFAULT_CHI``
    (ops on the prolines' entries only, and one copy)."""
    if not len(lay.proline_rows):
        return t
    at = lay.tensor("proline_chi", t.device)  # (2 P,): flat torsion index of chi1, chi2
    flat = t.flatten(-2)
    chi = flat.index_select(-1, at)
    chi = torch.where(torch.isnan(chi), lay.tensor("proline_chi_default", t.device).to(t.dtype), chi)
    return flat.index_copy(-1, at, chi).view_as(t)


@functools.lru_cache(maxsize=128)
def protein_layout(sequence: str) -> Layout:
    """Layout of one chain of ``sequence`` (one-letter codes): every heavy atom,
    ``OXT`` on the last residue, one tree whose rows are all canonical."""
    return layout_from_types(_sequence_types(sequence))


def internal_from_torsions(torsions, sequence: str) -> torch.Tensor:
    """Internal coordinates of a full-atom chain from torsions and ideal geometry.

    Args:
        torsions: ``(..., L, 7)`` tensor (``TORSION_NAMES`` columns, radians)
            or dict of ``(..., L)`` tensors; NaN = default.
        sequence: one-letter sequence of length L.

    Returns:
        ``(..., N, 3)`` for ``protein_layout(sequence).table``; differentiable.

    Example:
        >>> import zmat
        >>> t = torch.zeros(5, 7, dtype=torch.float64)
        >>> C = internal_from_torsions(t, "ACDEF")
        >>> xyz = zmat.to_xyz(C, protein_layout("ACDEF").table)
    """
    return _fill(protein_layout(sequence), torsions)


def to_xyz_from_torsions(torsions, sequence: str, method: str = "auto") -> torch.Tensor:
    """``zmat.to_xyz(internal_from_torsions(torsions, sequence), table)``: ``(..., N, 3)``."""
    lay = protein_layout(sequence)
    return to_xyz(_fill(lay, torsions), lay.table, method=method)


class _General(NamedTuple):
    """``ProteinBatch``'s general path: the proteins' layouts, the padded
    table's ``(B * N_max, 3)`` rows, the padded arrays (as
    :func:`~zmat.protein.pieces.batch_arrays`'s) and the padded sizes."""

    layouts: list
    refs: np.ndarray
    arrays: dict
    L_max: int
    N_max: int


class ProteinBatch:
    """Sequences of different lengths on a padded layout with one forest table.

    Protein ``b`` occupies atoms ``b * N_max .. b * N_max + n_b - 1`` of the
    flattened ``(B * N_max)`` layout; padding atoms are extra roots at the
    origin. Torsions are ``(..., B, L_max, 7)`` (padding ignored).

    Attributes:
        sequences: the B sequences.
        layouts: their :class:`~zmat.protein.layout.Layout`.
        table: ``ConstructionTable`` over ``B * N_max`` atoms.
        atom_mask: ``(B, N_max)`` bool; residue_mask ``(B, L_max)`` bool.
        atom_names, elements: ``(B, N_max)`` string arrays (``""`` on padding).
        residue_index: ``(B, N_max)`` int64 (-1 on padding).
        radii: ``(B, N_max)`` float64 AlphaFold radii (0 on padding).

    A sample is written with ``Protein.from_batch(batch, b, xyz[b]).to_pdb(path)``.

    Example:
        >>> batch = ProteinBatch(["MKV", "ACDEFG"])
        >>> xyz = batch.to_xyz(torch.zeros(2, 6, 7))  # (2, N_max, 3)
    """

    def __init__(self, sequences: Sequence[str]) -> None:
        if isinstance(sequences, (str, bytes)) or not hasattr(sequences, "__len__"):
            raise TypeError(f"ProteinBatch needs a list of sequences (str), got {type(sequences).__name__}")
        if len(sequences) == 0:
            raise ValueError("ProteinBatch needs a non-empty list of sequences")
        for k, s in enumerate(sequences):
            if not isinstance(s, str):
                raise TypeError(
                    f"ProteinBatch: sequence {k} is a {type(s).__name__}, expected a str of one-letter codes"
                )
        if not any(sequences):
            raise ValueError("ProteinBatch: every sequence is empty; a batch needs at least one residue")
        self.sequences = list(sequences)
        self._types = [_sequence_types(s) for s in self.sequences]
        if all(len(t) for t in self._types):  # the fast path: stamped from per-type pieces
            self._stamp = stamp(self._types)
            self.L_max, self.N_max = self._stamp.L_max, self._stamp.n_max
            a = batch_arrays(self._stamp, FORWARD)
        else:
            self._stamp = None
            a = self._arrays
            self.L_max, self.N_max = self._general.L_max, self._general.N_max
        pro = self._padded_pro()
        self._set_flat(a["ideal"], a.get("ideal_mask"), a["torsion_slot"], pro, a.get("proline_rows"))

    def _set_flat(self, ideal, ideal_mask, torsion_slot, is_pro, proline_rows) -> None:
        """The arrays the fill reads; ``ideal_mask`` None: made if the torch fill needs it."""
        st = self._stamp
        if ideal_mask is None:
            ideal_mask = lambda: batch_arrays(st, ("ideal_mask",))["ideal_mask"]  # noqa: E731
        self._flat = _Arrays(ideal, ideal_mask, torsion_slot, len(self) * self.L_max, is_pro)
        if proline_rows is not None:  # stamped per residue: no pass over the atoms
            self._flat.proline_rows = proline_rows

    def _padded_pro(self) -> np.ndarray:
        """``(B * L_max,)`` bool: the padded residue is a proline."""
        n = np.fromiter(map(len, self._types), np.int64, len(self._types))
        flat = np.concatenate(self._types)
        out = np.zeros(len(n) * self.L_max, bool)
        out[per_row(np.arange(len(n)) * self.L_max, n) + segment_arange(n)] = flat == PRO
        return out

    @functools.cached_property
    def _arrays(self) -> dict:
        return batch_arrays(self._stamp) if self._stamp is not None else self._general.arrays

    # made on first use: a training step that does not read them does not pay for them
    @functools.cached_property
    def atom_mask(self) -> torch.Tensor:
        return torch.from_numpy(self._arrays["atom_mask"])

    @functools.cached_property
    def residue_mask(self) -> torch.Tensor:
        return torch.from_numpy(self._arrays["residue_mask"])

    @functools.cached_property
    def atom_names(self) -> np.ndarray:
        return self._arrays["atom_names"]

    @functools.cached_property
    def elements(self) -> np.ndarray:
        return self._arrays["elements"]

    @functools.cached_property
    def residue_index(self) -> torch.Tensor:
        return torch.from_numpy(self._arrays["residue_index"])

    @functools.cached_property
    def layouts(self) -> list[Layout]:
        """The proteins' :class:`~zmat.protein.layout.Layout` (built on first use)."""
        return self._general.layouts

    @functools.cached_property
    def table(self) -> ConstructionTable:
        """``ConstructionTable`` over the ``B * N_max`` atoms (built on first use,
        from per-residue-type pieces: ``zmat.protein.pieces``)."""
        if self._stamp is not None:
            return batch_table(self._stamp)
        return ConstructionTable(self._general.refs)

    @functools.cached_property
    def _general(self) -> _General:
        """The general path (and the reference of the fast one in the tests):
        one layout of the whole batch (a forest: each protein starts a tree),
        cut into the proteins' layouts and scattered into the padding."""
        types = self._types
        B = len(types)
        n_res = np.array([len(t) for t in types], np.int64)
        res0 = starts(n_res)  # first residue of each protein
        linked = np.ones(int(n_res.sum()), bool)
        linked[res0[n_res > 0]] = False
        big = layout_from_types(np.concatenate(types), linked=linked)
        prot_res = segment_ids(n_res)  # protein of each residue
        prot_atom = prot_res[big.residue_index]
        n_atoms = np.bincount(prot_atom, minlength=B)
        atom0 = starts(n_atoms)
        bond_end = np.searchsorted(prot_atom[big.bonds[:, 0]], np.arange(B), side="right")
        bond0 = np.concatenate([[0], bond_end[:-1]])
        layouts = [
            _cut(big, res0[b], n_res[b], atom0[b], n_atoms[b], bond0[b], bond_end[b]) for b in range(B)
        ]
        Lm, n = int(n_res.max()), int(n_atoms.max())
        pos = prot_atom * n + np.arange(big.n_atoms) - atom0[prot_atom]  # padded index of each atom
        res_pos = prot_res * Lm + np.arange(len(prot_res)) - res0[prot_res]  # ... of each residue
        refs = np.full((B * n, 3), -1, np.int64)
        refs[pos] = np.where(big.refs >= 0, pos[np.maximum(big.refs, 0)], -1)
        a = {"ideal": np.zeros((B * n, 3)), "ideal_mask": np.zeros((B * n, 3), bool)}
        a["ideal"][pos] = big.ideal
        a["ideal_mask"][pos] = big.ideal_mask
        s = big.torsion_slot
        a["torsion_slot"] = np.full(B * n, -1, np.int64)
        a["torsion_slot"][pos] = np.where(s >= 0, res_pos[s // N_TORSIONS] * N_TORSIONS + s % N_TORSIONS, -1)
        a["atom_mask"] = np.zeros(B * n, bool)
        a["atom_mask"][pos] = True
        a["residue_mask"] = np.zeros(B * Lm, bool)
        a["residue_mask"][res_pos] = True
        a["atom_names"] = np.full(B * n, "", "U4")
        a["atom_names"][pos] = big.atom_names
        a["elements"] = np.full(B * n, "", "U2")
        a["elements"][pos] = big.elements
        a["residue_index"] = np.full(B * n, -1, np.int64)
        a["residue_index"][pos] = big.residue_index - res0[prot_atom]
        for k in ("atom_mask", "atom_names", "elements", "residue_index"):
            a[k] = a[k].reshape(B, n)
        a["residue_mask"] = a["residue_mask"].reshape(B, Lm)
        return _General(layouts, refs, a, Lm, n)

    def prepare(self) -> ProteinBatch:
        """Make now what a CPU training step reads beyond the fill's arrays (made
        by the constructor): the compiled kernel's plan, stamped from the pieces
        (``zmat.protein.pieces.kernel_arrays``). A prepared batch pickles with
        these arrays, so a ``DataLoader`` worker can make it and the step in the
        main process plans nothing (:meth:`collate`). Returns ``self``."""
        if self._stamp is not None:
            _kernel.serves(torch.device("cpu"))  # the C stamp, loaded (a worker that made no step yet)
            self.table.kernel_arrays()  # (cached on the table)
            self._prepared = True
        return self

    @classmethod
    def collate(cls, sequences) -> ProteinBatch:
        """``ProteinBatch(sequences).prepare()``: a ``DataLoader``'s ``collate_fn``,
        so that its workers make the batches (``docs/proteins.md``). The kernel
        library is loaded first, so that the fill's arrays are stamped in C too."""
        _kernel.serves(torch.device("cpu"))
        return cls(list(sequences)).prepare()

    def __reduce__(self):
        # a batch is its sequences: pickle those, not the lazily made arrays and functions,
        # unless prepared (then what the step reads, as tensors: a DataLoader moves those
        # through shared memory); from_proteins' tensors go as state
        state = {k: v for k, v in vars(self).items() if k in ("torsions", "torsion_mask")}
        if not self.__dict__.get("_prepared"):
            return (type(self), (self.sequences,), state or None)
        f, kernel = self._flat, self.table.kernel_arrays()
        arrays = (f.ideal, f.torsion_slot, f.is_pro, f.proline_rows, *kernel)
        made = (self._types, self._stamp, [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        return (_prepared_batch, (self.sequences, made), state or None)

    @classmethod
    def from_proteins(cls, proteins) -> ProteinBatch:
        """A batch of the sequences of :class:`~zmat.protein.Protein` s, with their torsions.

        Sets ``torsions`` ``(B, L_max, 7)`` float64 (each protein's measured torsions,
        NaN where undefined and on padding) and ``torsion_mask`` ``(B, L_max, 7)`` bool
        (defined), so ``batch.to_xyz(batch.torsions)`` rebuilds every protein with ideal
        geometry (NaN torsions take the defaults).

        A batch's proteins are single chains of complete residues: a protein with
        chain breaks or several chains is joined into one chain (the torsions across
        a break are undefined, so they take the defaults) with a ``UserWarning``
        naming it; missing side-chain atoms are built. To keep breaks, rebuild with
        ``Protein.xyz_from_torsions``.
        """
        proteins = list(proteins)
        for k, p in enumerate(proteins):
            if not hasattr(p, "torsion_tensor") or not hasattr(p, "sequence"):
                raise TypeError(
                    f"ProteinBatch.from_proteins: item {k} is a {type(p).__name__}, not a Protein"
                )
        joined = [(k, p.n_breaks, len(set(p.res_chain_ids.tolist()))) for k, p in enumerate(proteins)]
        joined = [j for j in joined if j[1] or j[2] > 1]
        if joined:
            what = ", ".join(f"protein {k} ({b} breaks, {c} chains)" for k, b, c in joined[:5])
            warnings.warn(
                f"ProteinBatch.from_proteins: {what}: a batch builds one continuous chain per protein, so "
                "its breaks are joined (their torsions take the defaults); Protein.xyz_from_torsions "
                "keeps them",
                UserWarning,
                stacklevel=2,
            )
        batch = cls([p.sequence for p in proteins])
        t = torch.full((len(batch), batch.L_max, N_TORSIONS), torch.nan, dtype=torch.float64)
        for b, p in enumerate(proteins):
            t[b, : len(p)] = p.torsion_tensor()
        batch.torsions, batch.torsion_mask = t, ~torch.isnan(t)
        return batch

    def __len__(self) -> int:
        return len(self.sequences)

    def __repr__(self) -> str:
        return f"ProteinBatch(B={len(self)}, L_max={self.L_max}, N_max={self.N_max})"

    def internal_from_torsions(self, torsions) -> torch.Tensor:
        """``(..., B, L_max, 7)`` torsions -> ``(..., B * N_max, 3)`` internal
        coordinates for ``self.table`` (differentiable)."""
        t = as_torsion_tensor(torsions)
        if t.shape[-3:-1] != (len(self), self.L_max):
            raise ValueError(
                f"torsions must have shape (..., {len(self)}, {self.L_max}, 7), got {tuple(t.shape)}"
            )
        return _fill(self._flat, t.flatten(-3, -2))

    def to_xyz(self, torsions, method: str = "auto") -> torch.Tensor:
        """``(..., B, L_max, 7)`` torsions -> ``(..., B, N_max, 3)`` coordinates
        (padding atoms at the origin)."""
        xyz = to_xyz(self.internal_from_torsions(torsions), self.table, method=method)
        return xyz.unflatten(-2, (len(self), self.N_max))

    @functools.cached_property
    def radii(self) -> torch.Tensor:
        out = torch.zeros(len(self), self.N_max, dtype=torch.float64)
        for b, lay in enumerate(self.layouts):
            out[b, : lay.n_atoms] = alphafold_radii(lay.elements.tolist(), dtype=torch.float64)
        return out

    @functools.cached_property
    def _exclusion_keys(self) -> torch.Tensor:
        keys = []
        for b, lay in enumerate(self.layouts):
            e = exclusions_from_bonds(lay.tensor("bonds"), lay.n_atoms, depth=3) + b * self.N_max
            keys.append(e[:, 0] * (len(self) * self.N_max) + e[:, 1])
        return torch.sort(torch.cat(keys)).values

    def clash_pairs(self, xyz: torch.Tensor, skin: float = 1.0, **kwargs) -> torch.Tensor:
        """Candidate pairs for ``zmat.clash_loss(xyz, batch.radii, pairs=...)``.

        Pairs within each protein (``zmat.clash.candidate_pairs``), minus the
        pairs within 3 covalent bonds of that protein (ring closures
        included); padding excluded. Indices into ``xyz.reshape(-1, 3)``.

        Args:
            xyz: ``(..., B, N_max, 3)``.
            skin: Verlet skin (Angstrom) so the list can be reused while atoms
                move less than ``skin / 2``.
            kwargs: passed to ``candidate_pairs`` (``tolerance``, ``kind``, ...).
        """
        with torch.no_grad():
            pairs = candidate_pairs(
                xyz.detach(), self.radii.to(xyz), mask=self.atom_mask.to(xyz.device), skin=skin, **kwargs
            )
        size = len(self) * self.N_max
        excluded = is_excluded(pairs[:, 0], pairs[:, 1], size, self._exclusion_keys.to(pairs.device))
        return pairs[~excluded]


def _prepared_batch(sequences: list, made: tuple) -> ProteinBatch:
    """A prepared :class:`ProteinBatch` from its pickled arrays (``ProteinBatch.__reduce__``)."""
    batch = ProteinBatch.__new__(ProteinBatch)
    batch.sequences, (batch._types, batch._stamp, tensors) = sequences, made
    ideal, slot, is_pro, pro_rows, *kernel = (t.numpy() for t in tensors)
    batch.L_max, batch.N_max = batch._stamp.L_max, batch._stamp.n_max
    batch._set_flat(ideal, None, slot, is_pro, pro_rows)
    batch.table = batch_table(batch._stamp, tuple(kernel))  # (the cached property's slot)
    batch._prepared = True
    return batch


def _sequence_types(sequence: str) -> np.ndarray:
    types = sequence_types(sequence)
    if types is None:  # not plain ASCII codes: the slow path, or its ValueError
        types = residue_types(one_to_three(sequence))
    return types


def _cut(big: Layout, r0: int, n_res: int, a0: int, n_atoms: int, e0: int, e1: int) -> Layout:
    """The layout of residues ``r0 .. r0 + n_res - 1`` (atoms ``a0 ..``, bonds
    ``e0 .. e1 - 1``) of a forest layout, when they form their own tree."""
    r1, a1 = r0 + n_res, a0 + n_atoms
    shift = lambda x, d: np.where(x >= 0, x - d, -1)  # noqa: E731
    return Layout(
        res_names=big.res_names[r0:r1],
        atom_names=big.atom_names[a0:a1],
        elements=big.elements[a0:a1],
        residue_index=big.residue_index[a0:a1] - r0,
        refs=shift(big.refs[a0:a1], a0),
        bonds=big.bonds[e0:e1] - a0,
        ideal=big.ideal[a0:a1],
        ideal_mask=big.ideal_mask[a0:a1],
        torsion_slot=shift(big.torsion_slot[a0:a1], r0 * N_TORSIONS),
        torsion_atoms=shift(big.torsion_atoms[r0:r1], a0),
        bonded=big.bonded[r0:r1],
    )


class _Arrays(SharedTensors, ProlineRing):
    """The arrays :func:`fill_internal` reads, for a padded batch."""

    def __init__(self, ideal, ideal_mask, torsion_slot, n_residues, is_pro):
        """``ideal_mask`` may be a function making it (on first use); ``is_pro``: ``(n_residues,)``."""
        self.ideal, self._ideal_mask, self.torsion_slot = ideal, ideal_mask, torsion_slot
        self.n_residues, self.is_pro = n_residues, is_pro

    @functools.cached_property
    def proline_rows(self) -> np.ndarray:
        """As ``Layout.proline_rows``; a batch's residues are complete, in template
        order (``N, CA, C, O, CB, CG, CD``): CA and CB are 4 and 1 atoms before CG."""
        cg, cd = ring_atoms(self.torsion_slot, self.is_pro)
        return np.stack([cg - 4, cg - 1, cg, cd], 1)

    @functools.cached_property
    def ideal_mask(self) -> np.ndarray:
        return self._ideal_mask() if callable(self._ideal_mask) else self._ideal_mask

    def tensor(self, name: str, device: torch.device | str | None = None) -> torch.Tensor:
        """As :meth:`SharedTensors.tensor`; on the CPU the tensor shares the
        batch's own array (no copy on a fresh batch's first call)."""
        if device is None or torch.device(device).type == "cpu":
            cache = self.__dict__.setdefault("_tensors", {})
            key = (name, torch.device("cpu"))
            if key not in cache:
                cache[key] = torch.from_numpy(np.ascontiguousarray(getattr(self, name)))
            return cache[key]
        return super().tensor(name, device)


# ----------------------------------------------------------- FoldingDiff
#: FoldingDiff's angle columns (``foldingdiff/angles_and_coords.py``).
FOLDINGDIFF_ANGLES = ("phi", "psi", "omega", "tau", "CA:C:1N", "C:1N:1CA")
#: FoldingDiff's bond lengths (``foldingdiff/nerf.py``): N-CA, CA-C, C-N.
FOLDINGDIFF_LENGTHS = (1.46, 1.54, 1.34)
#: Geometry of FoldingDiff's fixed first residue (THR 1 of 1CRN): N-CA, CA-C
#: (Angstrom) and N-CA-C (radians).
FOLDINGDIFF_FIRST = (1.4979966622125696, 1.5087710230515416, 1.8891967842942983)


@functools.lru_cache(maxsize=64)
def backbone_table(n_residues: int) -> ConstructionTable:
    """Table of a backbone ``N, CA, C`` per residue (``3 L`` atoms, one tree):
    ``N_i (C, CA, N)_{i-1}`` psi, ``CA_i (N_i, C_{i-1}, CA_{i-1})`` omega,
    ``C_i (CA_i, N_i, C_{i-1})`` phi."""
    n = 3 * n_residues
    refs = np.full((n, 3), -1, np.int64)
    refs[1, 0] = 0
    refs[2, :2] = (1, 0)
    for j in range(3, n):
        refs[j] = (j - 1, j - 2, j - 3)
    return ConstructionTable(refs)


def internal_from_six_angles(angles: torch.Tensor, lengths=None, first=FOLDINGDIFF_FIRST) -> torch.Tensor:
    """FoldingDiff's six angles -> internal coordinates for :func:`backbone_table`.

    FoldingDiff's layout (``canonical_distances_and_dihedrals``): row ``i`` of
    ``angles`` is ``(phi_i, psi_i, omega_i, tau, CA:C:1N, C:1N:1CA)`` where
    phi/psi/omega are biotite's, and the three bond angles belong to the step
    from residue ``i`` to ``i + 1``: ``tau`` = N-CA-C of residue ``i + 1``,
    ``CA:C:1N`` = CA_i-C_i-N_{i+1}, ``C:1N:1CA`` = C_i-N_{i+1}-CA_{i+1}. The
    last row's step values, ``phi_0``, ``psi_{L-1}`` and ``omega_{L-1}`` are
    unused (NaN there is fine), exactly as FoldingDiff's ``NERFBuilder``.

    Args:
        angles: ``(..., L, 6)`` radians.
        lengths: optional ``(..., L, 3)`` step bond lengths in FoldingDiff's
            order ``("0C:1N", "N:CA", "CA:C")`` (same step indexing), or a
            3-tuple ``(N-CA, CA-C, C-N)``; default ``FOLDINGDIFF_LENGTHS``.
        first: N-CA, CA-C, N-CA-C of the first residue (FoldingDiff fixes it to
            1CRN's first residue).

    Returns:
        ``(..., 3 L, 3)``, differentiable in ``angles`` (and ``lengths``).
    """
    if angles.ndim < 2 or angles.shape[-1] != 6:
        raise ValueError(f"angles must have shape (..., L, 6), got {tuple(angles.shape)}")
    dtype, device = angles.dtype, angles.device
    step = angles[..., :-1, :]
    if lengths is None or not isinstance(lengths, torch.Tensor):
        nca, cac, cn = FOLDINGDIFF_LENGTHS if lengths is None else lengths
        lens = torch.tensor([cn, nca, cac], dtype=dtype, device=device).expand(*step.shape[:-1], 3)
    else:
        lens = lengths[..., :-1, :].to(dtype)
    n_row = torch.stack([lens[..., 0], step[..., 4], step[..., 1]], -1)
    ca_row = torch.stack([lens[..., 1], step[..., 5], step[..., 2]], -1)
    c_row = torch.stack([lens[..., 2], step[..., 3], angles[..., 1:, 0]], -1)
    rest = torch.stack([n_row, ca_row, c_row], -2).flatten(-3, -2)  # (..., 3 (L - 1), 3)
    r_nca, r_cac, tau0 = (float(x) for x in first)
    head = torch.tensor([[0.0, 0, 0], [r_nca, 0, 0], [r_cac, tau0, 0]], dtype=dtype, device=device)
    head = head.expand(*rest.shape[:-2], 3, 3)
    return torch.cat([head, rest], -2)


def six_angles_from_backbone(xyz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse: ``(..., 3 L, 3)`` N, CA, C coordinates -> FoldingDiff's
    ``(..., L, 6)`` angles and ``(..., L, 3)`` step lengths (NaN where
    FoldingDiff has NaN / padding). Differentiable."""
    L = xyz.shape[-2] // 3
    C = to_internal(xyz, backbone_table(L))[..., 3:, :].unflatten(-2, (L - 1, 3))  # (..., L-1, 3, 3)
    nan = torch.full_like(C[..., :1, 0, 0], torch.nan)
    pad = lambda x: torch.cat([x, nan], -1)  # noqa: E731
    phi = torch.cat([nan, C[..., 2, 2]], -1)
    psi, omega = pad(C[..., 0, 2]), pad(C[..., 1, 2])
    tau, cacn, cnca = pad(C[..., 2, 1]), pad(C[..., 0, 1]), pad(C[..., 1, 1])
    lens = torch.stack([pad(C[..., 0, 0]), pad(C[..., 1, 0]), pad(C[..., 2, 0])], -1)
    return torch.stack([phi, psi, omega, tau, cacn, cnca], -1), lens
