"""The non-redundant space of B without an eigendecomposition, where B's null space is the rigid motions.

:func:`.steps.reduced_space` takes the eigenvectors of ``G = B^T B`` above
``rcond`` of the largest: for bonds, angles, dihedrals and out-of-plane
angles of a molecule (no linear bend's fixed direction, no Cartesian or
fragment rows) the dropped ones are the six rigid motions, known from the
positions. Here the space orthogonal to them, ``R_perp`` (a QR of the six),
gets ``G_perp = R_perp^T G R_perp = L L^T`` by Cholesky and the basis
``Vs = R_perp L^-T``: ``U = B Vs`` is orthonormal and spans the range of B,
and ``Vs U^T = G^+ B^T``, as the eigenvectors' (a different orthonormal
basis of the same space: the RFO and trust steps, the Cartesian images and
the back-transformation are the same to rounding). A 60 x 60 eigh costs
about 0.3 ms, the Cholesky and the triangular solve a fifth of it.

That every kept direction is above the cut is certified, not assumed:
``lambda_min(G_perp) >= 1 / |L^-1|_F^2`` and ``lambda_max(G) <= tr G``, so
``1 / |Vs|_F^2 > rcond tr G`` (``|Vs|_F = |L^-T|_F``) means the eigenvalue rule keeps exactly these
directions (a soft contact, a missing coordinate, a near-linear molecule
fail it); otherwise :func:`reduced_space` returns None and the caller
decomposes. The check reads the tensors, so this runs on the CPU only.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _compiled


def rigid_motions(xyz: torch.Tensor) -> torch.Tensor:
    """``(B, 3N, 6)``: the three translations and the three rotations about the centroid of ``xyz``
    ``(B, N, 3)`` (a CPU tensor: built on its numpy view, ten small ops), flattened atom-major."""
    x = xyz.numpy()
    bsz, n = x.shape[:2]
    d = x - x.mean(1, keepdims=True)
    R = np.zeros((bsz, n, 3, 6))
    R[:, :, [0, 1, 2], [0, 1, 2]] = 1.0
    # the rotation about axis e_k moves atom i by e_k x d_i
    R[:, :, 1, 3], R[:, :, 2, 3] = -d[..., 2], d[..., 1]
    R[:, :, 0, 4], R[:, :, 2, 4] = d[..., 2], -d[..., 0]
    R[:, :, 0, 5], R[:, :, 1, 5] = -d[..., 1], d[..., 0]
    return torch.from_numpy(R.reshape(bsz, 3 * n, 6))


def reduced_space(Bm: torch.Tensor, xyz: torch.Tensor, layout: tuple | None = None, rcond: float = 1e-6):
    """:func:`.steps.reduced_space`'s ``(U, Vs, keep)`` for ``Bm`` ``(B, P, 3N)`` whose null space is
    the rigid motions of ``xyz`` ``(B, N, 3)``, or None where that is not certified (the caller then
    decomposes ``B^T B``), with ``3N - 6`` columns: the six dropped ones left out (the eigenvalue path
    keeps them as zero columns), so the reduced Hessian's eigendecomposition is ``3N - 6`` wide.
    ``layout``: B's rows as :func:`.coordinates.kernel_layout` gives them, where the kernel is to form
    ``B^T B`` and ``B Vs`` from each row's at most 12 nonzero columns (not the dense products)."""
    bsz, n3 = Bm.shape[0], Bm.shape[-1]
    if n3 < 9 or Bm.device.type != "cpu":  # (two atoms: five rigid motions)
        return None
    perp = torch.linalg.qr(rigid_motions(xyz), mode="complete").Q[..., 6:]
    sparse = layout is not None and _compiled.usable(Bm)
    G = _compiled.gram(layout, Bm) if sparse else Bm.transpose(1, 2) @ Bm
    L, info = torch.linalg.cholesky_ex(torch.bmm(torch.bmm(perp.mT, G), perp))  # (bmm: 3 ops, matmul's 14)
    if info.numpy().any():  # (a CPU tensor: its view, one op)
        return None
    W = torch.linalg.solve_triangular(L, perp.transpose(1, 2), upper=False).transpose(1, 2).contiguous()
    w, g = W.numpy(), G.numpy()
    if not (np.square(w).sum((1, 2)) * (rcond * np.trace(g, axis1=1, axis2=2)) < 1).all():
        return None
    return _compiled.times(layout, Bm, W) if sparse else Bm @ W, W, torch.ones(bsz, n3 - 6, dtype=torch.bool)
