"""The placement math, in one place. Every method calls these functions.

Frames are packed as ``(..., 3, 4)`` tensors ``[R | x]``: the columns of ``R``
are the frame's axes in world coordinates, ``x`` its origin. Composition is
``[R1 | x1] . [R2 | x2] = [R1 R2 | x1 + R1 x2]``.

Every ``sqrt``, division and ``atan2`` is guarded with the double-``where``
trick, so degenerate geometry gives finite values *and* finite gradients.
"""

from __future__ import annotations

import torch

from .table import BOND, PLANAR, ROOT, ConstructionTable

_TINY = {torch.float16: 1e-6, torch.bfloat16: 1e-6, torch.float32: 1e-12, torch.float64: 1e-24}
# sin^2 of the angle below which three reference points count as collinear
# (relative, so it does not depend on the coordinates' scale): far above
# rounding (so methods agree on which rows it is), far below real geometry
_COLLINEAR = {torch.float16: 1e-4, torch.bfloat16: 1e-4, torch.float32: 1e-10, torch.float64: 1e-20}
_TIE = 1e-6


def tiny(dtype: torch.dtype) -> float:
    """Squared-norm threshold below which a vector counts as zero."""
    return _TINY.get(dtype, 1e-12)


def safe_norm(v: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """``|v|`` with a zero (not NaN) gradient at ``v = 0``."""
    return safe_sqrt((v * v).sum(dim, keepdim=keepdim))


def safe_sqrt(sq: torch.Tensor) -> torch.Tensor:
    """``sqrt(sq)`` of a squared norm, with a zero (not NaN) gradient at ``sq = 0``."""
    ok = ~(sq <= tiny(sq.dtype))  # NaN counts as nonzero: it propagates (NaN policy)
    return torch.where(ok, torch.sqrt(torch.where(ok, sq, torch.ones_like(sq))), torch.zeros_like(sq))


def dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u . v`` over the last dimension (of size 3), ``(...)``: two fused multiply-adds over
    the components, several times faster on batches than ``(u * v).sum(-1)`` (torch's
    reduction over 3 elements is slow)."""
    return torch.addcmul(torch.addcmul(u[..., 0] * v[..., 0], u[..., 1], v[..., 1]), u[..., 2], v[..., 2])


def safe_unit(v: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``v / |v|``, or ``fallback`` (broadcastable, unit) where ``v`` is ~0."""
    sq = (v * v).sum(-1, keepdim=True)
    ok = ~(sq <= tiny(v.dtype))
    inv = torch.rsqrt(torch.where(ok, sq, torch.ones_like(sq)))
    return torch.where(ok, v * inv, fallback.expand_as(v))


def safe_atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``atan2(y, x)`` that is 0, with zero gradient, at ``(0, 0)``."""
    ok = ~((x * x + y * y) <= tiny(x.dtype))
    return torch.where(ok, torch.atan2(torch.where(ok, y, 0.0), torch.where(ok, x, 1.0)), 0.0)


def dihedral_from_bonds(b1: torch.Tensor, b2: torch.Tensor, b3: torch.Tensor) -> torch.Tensor:
    """Dihedral (IUPAC sign) of the path ``p0 -> p1 -> p2 -> p3`` given its bond
    vectors ``b1 = p1 - p0``, ``b2 = p2 - p1``, ``b3 = p3 - p2`` (``(..., 3)``).

    ``atan2(|b2| b1 . (b2 x b3), (b1 x b2) . (b2 x b3))``; 0 with a finite
    gradient where it is undefined (collinear or coincident points).
    """
    n1 = torch.linalg.cross(b1, b2, dim=-1)
    n2 = torch.linalg.cross(b2, b3, dim=-1)
    return safe_atan2(safe_norm(b2) * (b1 * n2).sum(-1), (n1 * n2).sum(-1))


def any_perpendicular(u: torch.Tensor, axes: torch.Tensor | None = None) -> torch.Tensor:
    """A unit vector perpendicular to the unit vector ``u``: ``u x e`` with ``e``
    the first coordinate axis (``x``, then ``y``, then ``z``) whose component of
    ``u`` is the smallest up to ``1e-6``. The tolerance makes the choice the same
    for two methods whose ``u`` differ by rounding (``(1, 0, 0)`` and
    ``(1, 2e-16, 0)`` both take ``y``): an exact tie picks a fixed axis."""
    a = (u if axes is None else (axes * u[..., :, None]).sum(-2)).abs()
    low = a.amin(-1) + _TIE
    ex = a[..., 0] <= low
    ey = ~ex & (a[..., 1] <= low)
    e = torch.stack([ex, ey, ~ex & ~ey], -1).to(u.dtype)
    if axes is not None:  # the same choice in a rotated frame (axes as columns, (..., 3, 3))
        e = (axes * e[..., None, :]).sum(-1)
    w = torch.linalg.cross(u, e, dim=-1)
    return w * torch.rsqrt((w * w).sum(-1, keepdim=True).clamp_min(tiny(u.dtype)))


def frame_from_axes(e1: torch.Tensor, e3: torch.Tensor, origin: torch.Tensor) -> torch.Tensor:
    """Pack orthonormal axes ``e1``, ``e3`` (``e2 = e3 x e1``) and an origin into ``(..., 3, 4)``."""
    e2 = torch.linalg.cross(e3, e1, dim=-1)
    return torch.stack([e1, e2, e3, origin], dim=-1)


def local_transform(c: torch.Tensor, layout: str = "frames") -> torch.Tensor:
    """The local transform ``L(r, theta, phi)``.

    Placing atom ``i`` from its anchor frame ``A`` (first axis along the bond
    ``a -> b``, third axis normal to the plane ``(d, a, b)``) is ``F_i = A . L``:
    the position is ``x_b + A_R @ r (-cos t, sin t cos p, sin t sin p)`` (the
    NeRF formula, IUPAC dihedral sign) and the new frame's third axis
    ``(0, -sin p, cos p)`` is the normal of the plane ``(a, b, i)``. That normal
    does not depend on ``theta``, which is why a straight angle does no harm.

    Args:
        c: ``(..., 3)`` effective internal coordinates ``(r, theta, phi)``.
        layout: ``"frames"`` for ``(..., 3, 4)``; ``"components"`` for
            ``(3, 4, *c.shape[:-1])`` (component-major, see
            :func:`compose_components`).
    """
    r, t, p = c.unbind(-1)
    ct, st, cp, sp = torch.cos(t), torch.sin(t), torch.cos(p), torch.sin(p)
    zero = torch.zeros_like(t)
    e1 = (-ct, st * cp, st * sp)
    e2 = (-st, -ct * cp, -ct * sp)
    e3 = (zero, -sp, cp)
    rows = [(e1[k], e2[k], e3[k], r * e1[k]) for k in range(3)]
    if layout == "components":
        return torch.stack([torch.stack(row) for row in rows])
    return torch.stack([torch.stack(row, -1) for row in rows], -2)


# The same transform as products of three factors (for the analytic method,
# which builds all local transforms with one gather): entry ``k`` of the
# row-major 3x4 ``L`` is ``A[p0] * A[p1] * A[p2]`` with ``(p0, p1, p2) =
# LOCAL_FACTORS[k]``, over the rows ``A = (T, -T)`` of
# ``T = (r, 1, 0, cos t, cos p, sin t, sin p)`` (``-T`` at ``7 + row``).
_R, _ONE, _ZERO, _CT, _CP, _ST, _SP, _NEG = 0, 1, 2, 3, 4, 5, 6, 7
LOCAL_FACTORS = (
    (_NEG + _CT, _ONE, _ONE), (_NEG + _ST, _ONE, _ONE), (_ZERO, _ONE, _ONE), (_R, _NEG + _CT, _ONE),
    (_ST, _CP, _ONE), (_NEG + _CT, _CP, _ONE), (_NEG + _SP, _ONE, _ONE), (_R, _ST, _CP),
    (_ST, _SP, _ONE), (_NEG + _CT, _SP, _ONE), (_CP, _ONE, _ONE), (_R, _ST, _SP),
)  # fmt: skip


def compose(f1: torch.Tensor, f2: torch.Tensor) -> torch.Tensor:
    """``f1 . f2`` for packed frames ``(..., 3, 4)``."""
    out = torch.matmul(f1[..., :3], f2)
    return out + f1 * _last_column(f1)


def compose_components(f1: torch.Tensor, f2: torch.Tensor, e4: torch.Tensor | None = None) -> torch.Tensor:
    """``f1 . f2`` for frames stored component-major, ``(3, 4, ...)``.

    Same product as :func:`compose`; on large batches of frames a few
    elementwise kernels over long contiguous rows beat a batched 3x3 matmul.
    ``e4``: the unit vector ``(0, 0, 0, 1)`` shaped ``(1, 4, 1, ...)`` (any
    dtype that multiplies with ``f1``); callers composing many times build
    it once (:func:`last_column`).
    """
    c0, c1, c2, c3 = f1.split(1, 1)  # columns of f1, (3, 1, ...)
    r0, r1, r2 = f2.split(1, 0)  # rows of f2, (1, 4, ...)
    out = torch.addcmul(torch.addcmul(c0 * r0, c1, r1), c2, r2)
    # the implicit homogeneous row (0, 0, 0, 1) of f2 adds f1's translation
    return torch.addcmul(out, c3, last_column(f1) if e4 is None else e4)


def last_column(f: torch.Tensor) -> torch.Tensor:
    """``(0, 0, 0, 1)`` shaped ``(1, 4, 1, ...)`` to broadcast against
    component-major frames like ``f``."""
    return axis(3, 4, f).view(1, 4, *([1] * (f.ndim - 2)))


def axis(k: int, n: int, like: torch.Tensor) -> torch.Tensor:
    """The ``k``-th unit vector of length ``n``, built on ``like``'s device by a
    kernel (``torch.eye``), not copied from host memory: no transfer per call."""
    return torch.eye(n, dtype=like.dtype, device=like.device)[k]


def _last_column(f: torch.Tensor) -> torch.Tensor:
    return axis(3, 4, f)


def identity_frame(shape, dtype, device) -> torch.Tensor:
    """Identity frames at the origin, shape ``(*shape, 3, 4)``."""
    return torch.eye(3, 4, dtype=dtype, device=device).expand(*shape, 3, 4)


def nerf_anchor(fd: torch.Tensor, xa: torch.Tensor, xb: torch.Tensor, plane: torch.Tensor | None = None):
    """Anchor frame of a full row ``(b, a, d)``, ``(..., 3, 4)``.

    ``e1 = unit(x_b - x_a)``; ``e3`` is the unit normal of the plane
    ``(d, a, b)``, ``unit((x_a - x_d) x e1)`` (the textbook NeRF frame).
    The rule for collinear references (``docs/conventions.md``):

    * ``plane = +1`` (``d`` is a sibling, references ``(b, a, ...)``) or
      ``-1`` (a cousin, ``(a, b, ...)``): ``d``'s own frame holds that plane
      even where ``d`` lies on the axis ``a - b`` (its third axis is the normal
      of the plane it was placed in, exact at straight angles), so
      ``e3 = plane * e3_d``, made orthogonal to ``e1``. In exact arithmetic
      this is the cross product above; the same rule as OFFSET rows.
    * otherwise, where ``d, a, b`` are collinear (``sin^2`` of the angle below
      ``_COLLINEAR``), ``e3 = any_perpendicular(e1)``.

    Args:
        fd: ``d``'s frame ``(..., 3, 4)`` (its position is the last column).
        xa, xb: positions ``(..., 3)``.
        plane: long ``(...)`` of ``+1``, ``-1``, ``0`` (see
            ``ConstructionTable.dihedral_plane``); ``None`` for all 0.
    """
    e1 = safe_unit(xb - xa, axis(0, 3, xb))
    v = xa - fd[..., 3]
    n = torch.linalg.cross(v, e1, dim=-1)
    sq = (n * n).sum(-1, keepdim=True)
    straight = sq <= _COLLINEAR.get(v.dtype, 1e-10) * (v * v).sum(-1, keepdim=True)
    straight = straight | (sq <= tiny(v.dtype))
    inv = torch.rsqrt(torch.where(straight, torch.ones_like(sq), sq))
    e3 = torch.where(straight, any_perpendicular(e1), n * inv)
    if plane is not None:
        nd = fd[..., 2]
        m = plane[..., None].to(nd.dtype) * (nd - (nd * e1).sum(-1, keepdim=True) * e1)
        e3 = torch.where(plane[..., None] != 0, safe_unit(m, e3), e3)
    return frame_from_axes(e1, e3, xb)


def planar_anchor(xa: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
    """Anchor of a ``(b, a, -1)`` row: as :func:`nerf_anchor` with the virtual
    dihedral reference ``x_a + y`` (so ``phi = 0`` is the ``+y`` side)."""
    ez = axis(2, 3, xb)
    e1 = safe_unit(xb - xa, axis(0, 3, xb))
    # (-y) x e1 = (-e1_z, 0, e1_x)
    n = torch.stack([-e1[..., 2], torch.zeros_like(e1[..., 0]), e1[..., 0]], -1)
    return frame_from_axes(e1, safe_unit(n, ez), xb)


def segment_anchor(kind: torch.Tensor, plane: torch.Tensor | None, fd, fa, fb) -> torch.Tensor:
    """Anchor frames of segment roots from their reference atoms' frames.

    ``kind`` (long, broadcastable to the leading dims of ``fb``) selects the
    rule: ROOT (``fb`` is the origin slot, identity), BOND (identity axes at
    ``x_b``), PLANAR (:func:`planar_anchor`), POSITIONAL (:func:`nerf_anchor`,
    with ``plane``). ``fd, fa, fb``: frames ``(..., 3, 4)`` of ``d, a, b``.
    """
    xa, xb = fa[..., 3], fb[..., 3]
    eye = torch.eye(3, dtype=xb.dtype, device=xb.device)
    axes_bond = torch.cat([eye.expand(*xb.shape[:-1], 3, 3), xb.unsqueeze(-1)], -1)
    planar = planar_anchor(xa, xb)
    nerf = nerf_anchor(fd, xa, xb, plane)
    k = kind[..., None, None]
    out = torch.where(k == PLANAR, planar, nerf)
    return torch.where(k <= BOND, axes_bond, out)


def effective_internal(c: torch.Tensor, table: ConstructionTable) -> torch.Tensor:
    """Internal coordinates as the placement uses them, ``(..., N, 3)``.

    Columns whose reference is missing are replaced by constants (so their
    gradient is zero): BOND rows use ``theta = pi, phi = 0`` (placed along
    ``+x``), PLANAR rows ``phi = 0``, ROOT rows ``r = 0`` (identity frame). OFFSET rows get
    ``phi_eff = phi + phi_eff(d)``.
    """
    plan = table.plan(c.device)
    kind = plan.kind
    r, t, p = c.unbind(-1)
    zero = torch.zeros((), dtype=c.dtype, device=c.device)
    # ROOT and BOND rows: theta = pi, phi = 0 makes L the identity rotation
    t = torch.where(kind <= BOND, torch.pi, t)
    p = torch.where(kind <= PLANAR, zero, p)
    r = torch.where(kind == ROOT, zero, r)
    if table.offset_chain.shape[1] > 1:
        # gather-and-sum along sibling chains; slot N is a zero
        padded = torch.cat([p, torch.zeros_like(p[..., :1])], -1)
        chain = plan.offset_chain
        p = padded.index_select(-1, chain.reshape(-1)).reshape(*p.shape, chain.shape[1]).sum(-1)
    return torch.stack([r, t, p], -1)


def rigid_from_three_points(x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor):
    """AlphaFold's ``rigidFrom3Points`` (supplement Alg. 21), differentiable.

    Args:
        x1, x2, x3: ``(..., 3)``; for a backbone frame N, CA, C.

    Returns:
        ``R`` ``(..., 3, 3)`` (axes as columns: ``e1`` along ``x3 - x2``, ``x1``
        in the ``(e1, e2)`` half-plane with positive ``e2``) and ``t = x2``.
        Collinear points give a finite frame (``e2`` falls back to a fixed
        perpendicular), with finite gradients.
    """
    v1, v2 = x3 - x2, x1 - x2
    ex = torch.eye(3, dtype=x1.dtype, device=x1.device)
    e1 = safe_unit(v1, ex[0])
    u2 = v2 - e1 * (e1 * v2).sum(-1, keepdim=True)
    # fallback for a straight angle: any unit vector orthogonal to e1
    other = torch.where(e1[..., :1].abs() < 0.9, ex[0], ex[1])
    perp = other - e1 * (e1 * other).sum(-1, keepdim=True)
    e2 = safe_unit(u2, safe_unit(perp, ex[2]))
    e3 = torch.linalg.cross(e1, e2, dim=-1)
    return torch.stack([e1, e2, e3], -1), x2
