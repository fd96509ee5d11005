"""OpenFold's atoms-from-frames step, reimplemented as a benchmark peer.

A faithful reimplementation from the published math (AlphaFold supplement,
Alg. 24 ``computeAllAtomCoordinates``, in the form of OpenFold's
``openfold/utils/feats.py`` ``torsion_angles_to_frames`` and
``frames_and_literature_positions_to_atom14_pos``), with rigids as plain
``(R, t)`` tensors where OpenFold has its ``Rigid`` class (the same operations:
composition ``R1 R2, R1 t2 + t1``, a one-hot sum over the 8 rigid groups, the
rigids applied to literature positions). Not OpenFold's code; its constants
(AlphaFold's literature positions and default frames, as OpenFold builds them)
are read from ``benchmarks/data/openfold_constants.npz``
(``benchmarks/make_openfold_constants.py`` says where they come from).

``alpha`` is ``(..., L, 7, 2)`` (sin, cos) of AlphaFold's torsions in its order:
pre-omega, phi, psi, chi1..chi4.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

__all__ = ["alpha_from_zmat_torsions", "atom14_from_frames", "constants"]


@functools.lru_cache(maxsize=8)
def constants(dtype=torch.float32, device="cpu") -> dict:
    """The four tables, as tensors (``default_frames`` split into ``R``, ``t``)."""
    d = np.load(Path(__file__).parent / "data" / "openfold_constants.npz")
    f = torch.as_tensor(d["default_frames"], dtype=dtype, device=device)
    return {
        "default_R": f[..., :3, :3].contiguous(),
        "default_t": f[..., :3, 3].contiguous(),
        "group_idx": torch.as_tensor(d["group_idx"], device=device),
        "atom_mask": torch.as_tensor(d["atom_mask"], dtype=dtype, device=device),
        "lit_positions": torch.as_tensor(d["lit_positions"], dtype=dtype, device=device),
    }


def _compose(R1, t1, R2, t2):
    return R1 @ R2, (R1 @ t2[..., None])[..., 0] + t1


def torsion_angles_to_frames(R, t, alpha, aatype, c):
    """The 8 rigid groups of every residue in global coordinates:
    ``(..., L, 8, 3, 3)``, ``(..., L, 8, 3)``."""
    dR, dt = c["default_R"][aatype], c["default_t"][aatype]  # (..., L, 8, ...)
    bb = alpha.new_zeros((*alpha.shape[:-2], 1, 2))
    bb[..., 1] = 1  # the backbone group: no rotation
    alpha = torch.cat([bb, alpha], -2)  # (..., L, 8, 2)
    s, co = alpha[..., 0], alpha[..., 1]
    one, zero = torch.ones_like(s), torch.zeros_like(s)
    rot = torch.stack([one, zero, zero, zero, co, -s, zero, s, co], -1).unflatten(-1, (3, 3))
    fR, ft = _compose(dR, dt, rot, torch.zeros_like(dt))
    # chi2..chi4 frames are given relative to the previous chi frame: chain them onto chi1's
    R4, t4 = fR[..., 4, :, :], ft[..., 4, :]
    chainR, chaint = [], []
    for k in (5, 6, 7):
        R4, t4 = _compose(R4, t4, fR[..., k, :, :], ft[..., k, :])
        chainR.append(R4)
        chaint.append(t4)
    fR = torch.cat([fR[..., :5, :, :], torch.stack(chainR, -3)], -3)
    ft = torch.cat([ft[..., :5, :], torch.stack(chaint, -2)], -2)
    return _compose(R[..., None, :, :], t[..., None, :], fR, ft)


def frames_and_literature_positions_to_atom14_pos(gR, gt, aatype, c):
    """``(..., L, 14, 3)`` atoms: each atom's rigid group (one-hot sum over the
    8 groups, as OpenFold) applied to its literature position, masked."""
    onehot = torch.nn.functional.one_hot(c["group_idx"][aatype], 8).to(gR.dtype)  # (..., L, 14, 8)
    aR = (gR[..., None, :, :, :] * onehot[..., None, None]).sum(-3)  # (..., L, 14, 3, 3)
    at = (gt[..., None, :, :] * onehot[..., None]).sum(-2)
    lit = c["lit_positions"][aatype]
    pos = (aR @ lit[..., None])[..., 0] + at
    return pos * c["atom_mask"][aatype][..., None]


def atom14_from_frames(R, t, aatype, alpha):
    """Both functions in a row: backbone frames and torsions -> atom14 positions."""
    c = constants(R.dtype, str(R.device))
    gR, gt = torsion_angles_to_frames(R, t, alpha, aatype, c)
    return frames_and_literature_positions_to_atom14_pos(gR, gt, aatype, c)


def alpha_from_zmat_torsions(torsions: torch.Tensor) -> torch.Tensor:
    """zmat's ``(..., L, 7)`` torsions (phi, psi, omega, chi1..chi4) -> OpenFold's
    ``(..., L, 7, 2)`` (sin, cos) in AlphaFold's order (pre-omega, phi, psi, chi1..chi4;
    pre-omega of residue ``i`` is omega of ``i - 1``)."""
    omega_before = torsions[..., 2].roll(1, -1)
    angles = torch.cat([omega_before[..., None], torsions[..., :2], torsions[..., 3:]], -1)
    return torch.stack([torch.sin(angles), torch.cos(angles)], -1)
