"""Rigid superposition (Kabsch, proper rotations only) and RMSD, in torch.

Both functions take any number of leading batch dimensions and are
differentiable. They exist to compare structures built in different frames
(z-matrix placements, Open Babel, chemcoord): a proper rotation plus a
translation, never a reflection, so a mirror image does not superpose.
"""

from __future__ import annotations

import math

import torch

from ._geometry import safe_norm

__all__ = ["superpose", "rmsd"]


def _check(mobile: torch.Tensor, target: torch.Tensor) -> None:
    if mobile.shape != target.shape or mobile.ndim < 2 or mobile.shape[-1] != 3:
        raise ValueError(
            "superposition needs two tensors of the same shape (..., N, 3), got "
            f"{tuple(mobile.shape)} and {tuple(target.shape)}"
        )


def kabsch_rotation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Proper rotation ``R`` (``(..., 3, 3)``) minimising ``|p R^T - q|`` for centred ``p, q``."""
    h = p.transpose(-1, -2) @ q  # (..., 3, 3) covariance
    u, _, vh = torch.linalg.svd(h)
    # flip the last singular vector where the best orthogonal map is a reflection
    d = torch.sign(torch.linalg.det(vh.transpose(-1, -2) @ u.transpose(-1, -2)))
    d = torch.where(d == 0, torch.ones_like(d), d)
    diag = torch.ones_like(h[..., 0])
    diag = torch.cat([diag[..., :2], d.unsqueeze(-1)], -1)
    return vh.transpose(-1, -2) @ (diag.unsqueeze(-1) * u.transpose(-1, -2))


def superpose(mobile: torch.Tensor, target: torch.Tensor, return_transform: bool = False):
    """``mobile`` moved onto ``target`` by the best proper rigid motion (Kabsch).

    Args:
        mobile: ``(..., N, 3)`` positions to move.
        target: ``(..., N, 3)`` positions to fit, same shape.
        return_transform: also return the motion ``(R, t)``, so that other
            coordinates in ``mobile``'s frame (an edited structure, the rest of
            a file) can be moved the same way: ``x @ R.mT + t[..., None, :]``.

    Returns:
        ``(..., N, 3)``: ``mobile`` rotated (``det R = +1``) and translated so
        that the sum of squared distances to ``target`` is smallest. With
        ``return_transform=True``, ``(moved, R, t)``: ``R`` ``(..., 3, 3)``
        and ``t`` ``(..., 3)`` with ``moved == mobile @ R.mT + t[..., None, :]``
        (biotite's ``superimpose`` returns the same motion as an
        ``AffineTransformation``; scipy's ``Rotation.align_vectors(target -
        target_centre, mobile - mobile_centre)`` the same ``R``).
        Differentiable; the gradient goes through an SVD and is unstable where
        two singular values of the covariance coincide (e.g. linear molecules).

    Raises:
        ValueError: the shapes differ or are not ``(..., N, 3)``.

    Example:
        >>> a = torch.randn(5, 3, dtype=torch.float64)
        >>> rot = torch.linalg.matrix_exp(torch.tensor([[0, -1.0, 0], [1, 0, 0], [0, 0, 0]]).double())
        >>> torch.allclose(superpose(a @ rot.T + 1, a), a)
        True
        >>> moved, R, t = superpose(a @ rot.T + 1, a, return_transform=True)
        >>> torch.allclose(R, rot.T) and torch.allclose(moved, (a @ rot.T + 1) @ R.mT + t)
        True
    """
    _check(mobile, target)
    cm, ct = mobile.mean(-2, keepdim=True), target.mean(-2, keepdim=True)
    p, q = mobile - cm, target - ct
    R = kabsch_rotation(p, q)
    moved = p @ R.transpose(-1, -2) + ct
    if not return_transform:
        return moved
    t = (ct - cm @ R.transpose(-1, -2)).squeeze(-2)
    return moved, R, t


def rmsd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Root-mean-square deviation after the best proper superposition of ``a`` onto ``b``.

    The optimal rotation is computed without gradient: by the envelope theorem
    the first derivative of the minimum does not depend on how the minimiser
    moves, so the gradient is exact (and stable, with no SVD backward) while
    the value keeps full precision (no ``|a|^2 + |b|^2 - 2 tr`` cancellation).

    Args:
        a, b: ``(..., N, 3)`` positions.

    Returns:
        ``(...)`` RMSD, same unit as the input; exactly 0, with a zero gradient,
        where the residual's norm is below :func:`zmat._geometry.safe_norm`'s
        threshold (``1e-12`` in float64, ``1e-6`` in float32).

    Raises:
        ValueError: the shapes differ or are not ``(..., N, 3)``.
    """
    _check(a, b)
    p = a - a.mean(-2, keepdim=True)
    q = b - b.mean(-2, keepdim=True)
    with torch.no_grad():
        rot = kabsch_rotation(p.detach(), q.detach())
    diff = p @ rot.transpose(-1, -2) - q
    return safe_norm(diff.flatten(-2)) / math.sqrt(a.shape[-2])
