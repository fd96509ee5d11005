"""bgflow's internal-coordinate transform, its algorithm reimplemented for the ``flows`` benchmark.

bgflow (github.com/bgflow/bgflow, not on PyPI) builds its
``GlobalInternalCoordinateTransformation`` from two parts, both reproduced
here from the description of its algorithm (``bgflow/nn/flow/crd_transform``,
``internal_coordinates.py`` and ``ic_helper.py``), in our own code:

* the first three atoms (``ReferenceSystemTransformation``): origin, two
  distances, an angle and three Euler angles (``alpha``, ``cos beta``,
  ``gamma``); their 9 x 9 Jacobian by brute-force autograd (the inputs repeated
  9 times, one backward pass with the identity as cotangent,
  ``create_graph=True``) and its determinant;
* every other atom (``RelativeInternalCoordinateTransformation`` with the
  first three as fixed atoms): Cartesian -> internal in one vectorised step,
  each bond, angle and torsion with its explicit gradient with respect to the
  atom it places, ``log|det|`` of the stacked 3 x 3 per atom; internal ->
  Cartesian level by level (``decompose_z_matrix``: a level is every row whose
  three references are placed), each level one NeRF step with its explicit
  3 x 3 Jacobian, written into a preallocated buffer of points.

Layouts differ from zmat's (bgflow's orientation chart and torsion sign are
its own); the benchmark checks that the log-determinants agree
(``-dlogp`` of bgflow's Cartesian -> internal is zmat's
``log_abs_det_jacobian``) and that the algorithm's round trip is exact.
"""

from __future__ import annotations

import numpy as np
import torch

import zmat

__all__ = ["BgflowAlgorithm"]

EPS = 1e-7  # bgflow's default clamp of norms


def _norm(v):
    return torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(EPS)


def _outer(x, y):
    return x[..., :, None] * y[..., None, :]


def _det3x3(a):
    return (torch.linalg.cross(a[..., 0, :], a[..., 1, :], dim=-1) * a[..., 2, :]).sum(-1)


def _skew(x):
    zero = torch.zeros_like(x[..., 0])
    a, b, c = x.unbind(-1)
    return torch.stack(
        [torch.stack([zero, c, -b], -1), torch.stack([-c, zero, a], -1), torch.stack([b, -a, zero], -1)], -1
    )


# ------------------------------------------------ Cartesian -> internal, with gradients
def _bond(x1, x2):
    d = x2 - x1
    n = _norm(d)
    return n[..., 0], -d / n


def _angle(x1, x2, x3):
    r12, r32 = x1 - x2, x3 - x2
    n12, n32 = _norm(r12), _norm(r32)
    u12, u32 = r12 / n12, r32 / n32
    eye = torch.eye(3, dtype=x1.dtype, device=x1.device)
    J = u32[..., None, :] @ ((eye - _outer(u12, u12)) / n12[..., None])
    c = (u12 * u32).sum(-1).clamp(-1 + EPS, 1 - EPS)
    return torch.acos(c), (-J / torch.sqrt(1 - c * c)[..., None, None])[..., 0, :]


def _torsion(x1, x2, x3, x4):
    b0, b1, b2 = x1 - x2, x3 - x2, x4 - x3
    u1 = b1 / _norm(b1)
    eye = torch.eye(3, dtype=x1.dtype, device=x1.device)
    dv = eye - _outer(u1, u1)  # the rejection from b1, and its Jacobian
    v = b0 - (b0 * u1).sum(-1, keepdim=True) * u1
    w = b2 - (b2 * u1).sum(-1, keepdim=True) * u1
    A = _skew(u1)
    x = (v * w).sum(-1, keepdim=True)[..., None]
    y = ((A @ v[..., None])[..., 0] * w).sum(-1, keepdim=True)[..., None]
    sq = (x * x + y * y).clamp_min(EPS)
    J = (-y / sq) @ w[..., None, :] @ dv + (x / sq) @ w[..., None, :] @ A @ dv
    return torch.atan2(y, x)[..., 0, 0], J[..., 0, :]


# ------------------------------------------------ internal -> Cartesian, with Jacobian
def _nerf(p1, p2, p3, d, a, t):
    """The position at distance ``d`` from ``p1``, angle ``a`` to ``p2``, torsion ``t`` to ``p3``,
    and its 3 x 3 Jacobian in ``(d, a, t)``."""
    v1 = p1 - p2
    n = torch.linalg.cross(v1, p1 - p3, dim=-1)
    nn = torch.linalg.cross(v1, n, dim=-1)
    n_hat, nn_hat = n / _norm(n), nn / _norm(nn)
    st, ct, sa, ca = torch.sin(t), torch.cos(t), torch.sin(a), torch.cos(a)
    v3 = -st * n_hat + ct * nn_hat
    n3 = _norm(v3)
    v3_hat = v3 / n3
    v1_hat = v1 / _norm(v1)
    pos = p1 + d * sa * v3_hat - d * ca * v1_hat
    eye = torch.eye(3, dtype=p1.dtype, device=p1.device)
    j_d = sa * v3_hat - ca * v1_hat
    j_a = d * ca * v3_hat + d * sa * v1_hat
    dv3 = (d * sa)[..., None] * (eye - _outer(v3_hat, v3_hat)) / n3[..., None]
    j_t = (dv3 @ (-ct * n_hat - st * nn_hat)[..., None])[..., 0]
    return pos, torch.stack([j_d, j_a, j_t], -1)


# ------------------------------------------------ the first three atoms
def _euler_matrix(alpha, cos_beta, gamma):
    """``Rz(alpha) Rx(beta) Rz(gamma)`` (bgflow's proper Euler angles, ``beta`` given by its cosine)."""

    def rot(theta, i, j):
        c, s = torch.cos(theta), torch.sin(theta)
        one, zero = torch.ones_like(theta), torch.zeros_like(theta)
        m = [[one, zero, zero], [zero, one, zero], [zero, zero, one]]
        m[i][i], m[i][j], m[j][i], m[j][j] = c, -s, s, c
        return torch.stack([torch.stack(row, -1) for row in m], -2)

    beta = torch.acos(cos_beta.clamp(-1 + EPS, 1 - EPS))
    return rot(alpha, 0, 1) @ rot(beta, 1, 2) @ rot(gamma, 0, 1)


def _init_to_xyz(s):
    """9 numbers (origin, d01, d12, a012, alpha, cos beta, gamma) -> the first three points."""
    x0, d01, d12, a012 = s[..., :3], s[..., 3:4], s[..., 4:5], s[..., 5:6]
    zero = torch.zeros_like(d01)
    p1 = torch.cat([zero, zero, d01], -1)  # the second point on +z
    p2 = p1 + d12 * torch.cat([torch.sin(a012), zero, -torch.cos(a012)], -1)  # in the xz-plane
    R = _euler_matrix(s[..., 6], s[..., 7], s[..., 8])
    return torch.cat([x0, x0 + (R @ p1[..., None])[..., 0], x0 + (R @ p2[..., None])[..., 0]], -1)


def _init_to_ic(s):
    """The first three points (9 numbers) -> origin, d01, d12, a012, alpha, cos beta, gamma."""
    x0, x1, x2 = s[..., :3], s[..., 3:6], s[..., 6:9]
    d01, _ = _bond(x0, x1)
    d12, _ = _bond(x1, x2)
    a012, _ = _angle(x0, x1, x2)
    e3 = (x1 - x0) / _norm(x1 - x0)
    e2 = torch.linalg.cross(e3, x2 - x0, dim=-1)
    e2 = e2 / _norm(e2)
    e1 = torch.linalg.cross(e2, e3, dim=-1)  # R = [e1 e2 e3] = Rz(alpha) Rx(beta) Rz(gamma)
    alpha = torch.atan2(e3[..., 0], -e3[..., 1])
    gamma = torch.atan2(e1[..., 2], e2[..., 2])
    return torch.cat([x0, torch.stack([d01, d12, a012, alpha, e3[..., 2], gamma], -1)], -1)


def _with_jacobian(fn, s):
    """``fn(s)`` and its 9 x 9 Jacobian by brute-force autograd (bgflow's ``get_jacobian``)."""
    with torch.enable_grad():
        rep = s.unsqueeze(-2).expand(*s.shape[:-1], 9, 9).clone()
        if not rep.requires_grad:
            rep.requires_grad_(True)
        y = fn(rep)
        eye = torch.eye(9, dtype=s.dtype, device=s.device).expand_as(y)
        (J,) = torch.autograd.grad(y, rep, eye, create_graph=True)
    return y[..., 0, :], J


class BgflowAlgorithm:
    """bgflow's global internal-coordinate transform (one tree, first three atoms as the reference
    system) on a zmat construction table.

    ``to_xyz(ics)``: internal -> Cartesian and ``log|det d xyz / d ic|``; ``to_ic(xyz)``:
    Cartesian -> internal and bgflow's ``dlogp`` (its negative). ``ics`` is ``(init, bonds,
    angles, torsions)``: ``init`` ``(B, 9)`` (origin, d01, d12, a012, alpha, cos beta, gamma),
    then one entry per remaining atom, ``(B, N - 3)`` each, in the order of ``self.rows``.
    """

    def __init__(self, table) -> None:
        refs = zmat.ConstructionTable(table).refs
        nref = (refs >= 0).sum(1)
        if (nref < 3).sum() != 3:
            raise ValueError("bgflow's global transform needs one tree of at least three atoms")
        root, first, second = (int(np.nonzero(nref == k)[0][0]) for k in range(3))
        if tuple(refs[second, :2]) != (first, root):
            raise ValueError("the third atom must refer to (second atom, root), as bgflow places it")
        self.n_atoms = n = len(refs)
        self.initial = np.array([root, first, second])
        rows = np.nonzero(nref == 3)[0]
        self.rows = np.concatenate([rows[:, None], refs[rows]], 1)  # bgflow's z-matrix: (atom, b, a, d)
        # decompose_z_matrix: a level is every row whose references are placed
        placed = np.zeros(n, bool)
        placed[self.initial] = True
        order = list(self.initial)
        self.levels = []  # (row indices into self.rows, reference positions in the point buffer)
        left = np.arange(len(rows))
        pos = np.full(n, -1, np.int64)
        pos[self.initial] = np.arange(3)
        while len(left):
            ready = placed[self.rows[left, 1:]].all(1)
            if not ready.any():
                raise ValueError("z-matrix decomposition failed: unreachable atoms")
            level = left[ready]
            atoms = self.rows[level, 0]
            self.levels.append((torch.as_tensor(level), torch.as_tensor(pos[self.rows[level, 1:]])))
            pos[atoms] = len(order) + np.arange(len(atoms))
            order += atoms.tolist()
            placed[atoms] = True
            left = left[~ready]
        self.atom_to_pos = torch.as_tensor(pos)
        self.row_atoms = torch.as_tensor(self.rows)

    def to_ic(self, xyz: torch.Tensor):
        """``(B, N, 3)`` -> ``(init, bonds, angles, torsions), dlogp`` (bgflow's forward)."""
        z = self.row_atoms
        x1, x2, x3, x4 = (xyz[:, z[:, k]] for k in range(4))
        bonds, jb = _bond(x1, x2)
        angles, ja = _angle(x1, x2, x3)
        torsions, jt = _torsion(x1, x2, x3, x4)
        dlogp = _det3x3(torch.stack([jb, ja, jt], -2)).abs().log().sum(-1)
        s = xyz[:, self.initial].reshape(-1, 9)
        init, J = _with_jacobian(_init_to_ic, s)
        return (init, bonds, angles, torsions), dlogp + torch.linalg.det(J).abs().log()

    def to_xyz(self, ics):
        """``(init, bonds, angles, torsions)`` -> ``(B, N, 3), log|det d xyz / d ic|`` (bgflow's inverse)."""
        init, bonds, angles, torsions = ics
        s, J = _with_jacobian(_init_to_xyz, init)
        logdet = torch.linalg.det(J).abs().log()
        points = torch.empty(init.shape[0], self.n_atoms, 3, dtype=init.dtype, device=init.device)
        points[:, :3] = s.view(-1, 3, 3)
        start = 3
        for level, ref in self.levels:
            ctx = points[:, ref]
            p, Jl = _nerf(
                ctx[:, :, 0], ctx[:, :, 1], ctx[:, :, 2], bonds[:, level, None], angles[:, level, None],
                torsions[:, level, None],
            )  # fmt: skip
            logdet = logdet + _det3x3(Jl).abs().log().sum(-1)
            points[:, start : start + len(level)] = p
            start += len(level)
        return points[:, self.atom_to_pos], logdet
