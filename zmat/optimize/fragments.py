"""Translation and rotation coordinates of fragments (TRIC: Wang and Song, J. Chem. Phys. 144, 214108, 2016).

With ``coords="tric"`` every fragment (a connected piece of the covalent
graph: one molecule of a cluster, a ligand, a pocket) gets, instead of the
contact bonds that otherwise join fragments,

* three **translations**: the components of its centroid;
* three **rotations**: the exponential map ``theta * axis`` of the rotation
  that best superposes the fragment on its reference positions (Horn's
  quaternion: the top eigenvector of a 4x4 matrix), times the fragment's
  radius of gyration (a length, as geomeTRIC's), refreshed (the coordinates
  rebuilt) when it nears ``pi``.

A single atom gets its translations only. A linear fragment's rotation about
its own axis is undefined; as geomeTRIC, the quaternion matrix is regularised
towards the reference (``0.1`` of its largest eigenvalue), so the
coordinate stays smooth (that direction is then redundant and the
non-redundant space drops it).

Each row of ``q`` is one (fragment, component): ``idx`` ``(n, m)`` atoms of
the row's fragment, padded, with ``mask``; the rows are values of gathered
points like every other primitive, so :func:`zmat.optimize.wilson_b` gets
their B rows from the same one backward pass. The top eigenvector's
derivative comes from first-order perturbation theory (only its own
eigenvalue gap enters), so symmetric tops (CH4, NH3, benzene), whose lower
eigenvalues are degenerate, have finite B rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.sparse.csgraph import connected_components

from .._geometry import safe_atan2, safe_norm

__all__ = [
    "LARGE_ROTATION",
    "FragmentRows",
    "exp_map",
    "fragment_rows",
    "rotation",
    "translation",
    "turned_far",
]

LARGE_ROTATION = 0.9 * math.pi  # a rotation past this rebuilds the coordinates (new reference; geomeTRIC's)
_LINEAR = 1.03  # top two eigenvalues of the fragment's own quaternion matrix closer than this: linear


@dataclass(frozen=True)
class FragmentRows:
    """Per-row data of the translation and rotation coordinates.

    Attributes:
        t_mask: ``(nt, m)`` bool, the real atoms of each translation row's
            fragment; t_axis: ``(nt,)`` long, its Cartesian component.
        r_mask: ``(nr, m)``; r_axis: ``(nr,)`` component of the exponential map;
        r_ref: ``(B, nr, m, 3)`` reference positions (centred; any length
            unit: the best rotation does not depend on their scale);
        r_reg: ``(nr,)`` regularisation of linear fragments (0 otherwise).
    """

    t_mask: torch.Tensor
    t_axis: torch.Tensor
    r_mask: torch.Tensor
    r_axis: torch.Tensor
    r_ref: torch.Tensor
    r_reg: torch.Tensor

    def to(self, device) -> FragmentRows:
        return replace(self, **{k: getattr(self, k).to(device) for k in self.__dataclass_fields__})


def _centre(p: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked centroid ``(..., 3)`` and centred points ``(..., m, 3)`` (padding at 0)."""
    w = mask.to(p.dtype)
    c = (p * w[..., None]).sum(-2) / w.sum(-1)[..., None]
    return c, (p - c[..., None, :]) * w[..., None]


def translation(p: torch.Tensor, mask: torch.Tensor, axis: torch.Tensor) -> torch.Tensor:
    """``(..., n)`` centroid component ``axis`` of each row's points ``p`` ``(..., n, m, 3)``."""
    c, _ = _centre(p, mask)
    return torch.gather(c, -1, axis.expand(*c.shape[:-1])[..., None])[..., 0]


def _horn() -> np.ndarray:
    """``K`` ``(4, 4, 3, 3)``: Horn's matrix is ``F_ab = K_abij R_ij`` for the correlation ``R``."""
    K = np.zeros((4, 4, 3, 3))
    x, y, z = 0, 1, 2
    terms = {
        (0, 0): [(x, x, 1), (y, y, 1), (z, z, 1)], (0, 1): [(y, z, 1), (z, y, -1)],
        (0, 2): [(z, x, 1), (x, z, -1)], (0, 3): [(x, y, 1), (y, x, -1)],
        (1, 1): [(x, x, 1), (y, y, -1), (z, z, -1)], (1, 2): [(x, y, 1), (y, x, 1)],
        (1, 3): [(x, z, 1), (z, x, 1)], (2, 2): [(y, y, 1), (z, z, -1), (x, x, -1)],
        (2, 3): [(y, z, 1), (z, y, 1)], (3, 3): [(z, z, 1), (y, y, -1), (x, x, -1)],
    }  # fmt: skip
    for (a, b), ts in terms.items():
        for i, j, sign in ts:
            K[a, b, i, j] = K[b, a, i, j] = sign
    return K.reshape(16, 9)


_HORN = _horn()
_E00 = np.eye(4) * (np.arange(4) == 0)


def _quaternion_matrix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Horn's ``(..., 4, 4)`` matrix whose top eigenvector is the rotation taking ``x`` onto ``y``."""
    R = x.transpose(-1, -2) @ y  # (..., 3, 3) correlation sum_i x_i y_i^T
    K = torch.as_tensor(_HORN, dtype=R.dtype, device=R.device)
    return (R.flatten(-2) @ K.T).unflatten(-1, (4, 4))


def _top_eigenvector(F: torch.Tensor) -> torch.Tensor:
    """Top eigenvector ``(..., 4)`` of symmetric ``F``, first component >= 0, differentiable.

    The value comes from ``eigh`` without its backward; the derivative from
    ``dv = sum_i v_i v_i^T dF v / (l_0 - l_i)`` (only the top gap: the
    others may be degenerate), as ``v + P (F - F.detach()) v``.
    """
    with torch.no_grad():
        lam, V = torch.linalg.eigh(F)
        v = V[..., -1]
        v = v * torch.where(v[..., :1] < 0, -1.0, 1.0)
        gap = (lam[..., -1:] - lam).clamp_min(1e-12 * lam.abs().amax(-1, keepdim=True).clamp_min(1e-300))
        inv = torch.where(torch.arange(4, device=F.device) == 3, 0.0, 1.0 / gap)
        P = (V * inv[..., None, :]) @ V.transpose(-1, -2)  # pseudo-inverse of l_0 I - F
    dF = F - F.detach()
    return v + (P @ (dF @ v[..., None]))[..., 0]


def exp_map(p, mask, ref, reg) -> tuple[torch.Tensor, torch.Tensor]:
    """Exponential map ``(..., n, 3)`` of the rotation taking each row's points ``p`` ``(..., n, m, 3)``
    best onto ``ref``, and their radius of gyration ``(..., n)``."""
    _, x = _centre(p, mask)
    w = mask.to(p.dtype)
    rg, y = _rg(x, w), ref.to(p.dtype)
    F = _quaternion_matrix(x / rg[..., None, None], y / _rg(y, w)[..., None, None])
    e00 = torch.as_tensor(_E00, dtype=F.dtype, device=F.device)
    F = F + reg[..., None, None].to(F.dtype) * e00  # linear fragments: towards the reference (geomeTRIC)
    qt = _top_eigenvector(F)
    q0, qv = qt[..., 0].clamp_min(1e-12), qt[..., 1:]
    s = safe_norm(qv)
    t = s / q0
    small = t < 1e-3  # 2 atan(t) / (t q0): its series near the reference (no 0/0)
    fac = torch.where(small, 2.0 / q0 * (1 - t * t / 3), 2 * safe_atan2(s, q0) / torch.where(small, 1.0, s))
    return fac[..., None] * qv, rg


def rotation(p, mask, axis, ref, reg) -> torch.Tensor:
    """``(..., n)`` component ``axis`` of each row's exponential map times its radius of gyration."""
    v, rg = exp_map(p, mask, ref, reg)
    return torch.gather(v, -1, axis.expand(*v.shape[:-1])[..., None])[..., 0] * rg


def turned_far(rows: FragmentRows, p: torch.Tensor) -> torch.Tensor:
    """0-d bool: some fragment turned past :data:`LARGE_ROTATION` (``p``: the rotation rows' points)."""
    v, _ = exp_map(p[..., ::3, :, :], rows.r_mask[::3], rows.r_ref[:, ::3], rows.r_reg[::3])
    return (v.norm(dim=-1) > LARGE_ROTATION).any()


def _rg(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Radius of gyration ``(..., n)`` of centred, masked points ``(..., n, m, 3)`` (weights ``w``)."""
    return ((y * y).sum(-1) * w).sum(-1).div(w.sum(-1)).clamp_min(1e-300).sqrt()


def fragment_rows(xyz: np.ndarray, covalent: np.ndarray):
    """The translation and rotation rows of every covalent fragment at ``xyz`` ``(B, N, 3)``.

    Returns ``(t_idx (nt, m), r_idx (nr, m), FragmentRows)``: atom indices of
    each row's fragment (padded with the fragment's first atom, masked).
    """
    _, label = connected_components(covalent, directed=False)
    frags = [np.flatnonzero(label == f) for f in range(label.max() + 1)]
    m = max(len(f) for f in frags)
    t_idx, t_mask, t_axis, r_idx, r_mask, r_axis, r_ref, r_reg = [], [], [], [], [], [], [], []
    for f in frags:
        row = np.full(m, f[0])
        row[: len(f)] = f
        mask = np.arange(m) < len(f)
        t_idx += [row] * 3
        t_mask += [mask] * 3
        t_axis += [0, 1, 2]
        if len(f) < 2:
            continue
        ref = xyz[:, row] - xyz[:, f].mean(1, keepdims=True)
        ref = ref * mask[None, :, None]
        lam = np.linalg.eigvalsh(_quaternion_matrix(torch.tensor(ref[0]), torch.tensor(ref[0])).numpy())
        linear = lam[-1] < _LINEAR * lam[-2]  # a linear fragment's top eigenvalue is double
        reg = 0.1 * lam[-1] / max((ref[0] ** 2).sum() / len(f), 1e-300) if linear else 0.0
        r_idx += [row] * 3
        r_mask += [mask] * 3
        r_axis += [0, 1, 2]
        r_ref += [ref] * 3
        r_reg += [reg] * 3

    def long(rows, k):
        return torch.tensor(np.asarray(rows, dtype=np.int64).reshape(-1, k))

    rows = FragmentRows(
        t_mask=torch.tensor(np.asarray(t_mask, dtype=bool).reshape(-1, m)),
        t_axis=long(t_axis, 1)[:, 0],
        r_mask=torch.tensor(np.asarray(r_mask, dtype=bool).reshape(-1, m)),
        r_axis=long(r_axis, 1)[:, 0],
        r_ref=torch.tensor(np.stack(r_ref, 1) if r_ref else np.zeros((xyz.shape[0], 0, m, 3))),
        r_reg=torch.tensor(np.asarray(r_reg, dtype=float)),
    )
    return long(t_idx, m), long(r_idx, m), rows
