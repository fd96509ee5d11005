"""The optimiser's coordinate side in zmat's compiled CPU kernel (``zmat/csrc/primitives.cpp``).

At one molecule a step is dispatch-bound: the torch path of the fused values
and B costs about 200 ops, each back-transformation iteration about 100. On
plain CPU float tensors (:func:`zmat._kernel.usable`), with no gradient
wanted through the positions, these run as loops of C++ instead, a call each:

* :func:`values` and :func:`values_and_b`: the geometric primitives (the
  fused formula of :func:`.coordinates._fused`, B from forward-mode
  derivatives of the same formula) and the frozen atoms' Cartesian rows;
* :func:`back_round`: one round of :func:`.steps.back_transform`'s
  fixed-Jacobian iteration, every conformer on its own (on the CPU the torch
  path stops a conformer once it is done as well: the same iterates).

The fragments' translation and rotation rows (``coords="tric"``) stay in torch
(the rotation is an eigendecomposition per fragment): their values and B are
added beside the kernel's, and their back-transformation is the torch loop.
Elsewhere (CUDA, ``ZMAT_NO_KERNEL=1``, a kernel that failed to build, autograd
through ``xyz``) the torch path runs, with the same results to rounding.
"""

from __future__ import annotations

import ctypes

import torch

from .. import _kernel

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
_LAYOUT = [_I, _I, _I, _P, _P, _P, _I, _P]  # b, n, g, atoms, kind, ref, c, cart
_ARGS = {
    "prims_values": [_P, *_LAYOUT, _P, _I],
    "prims_b": [_P, *_LAYOUT, _P, _P, _I],
    "back_round": [_P] * 6 + _LAYOUT + [_I, _I, _F, _F, _I, _P, _P, _P, _I],
    "prims_gram": [_P, *_LAYOUT, _P, _I],
    "prims_times": [_P, *_LAYOUT, _P, _I, _P, _I],
}
_fns: dict = {}


def usable(x: torch.Tensor) -> bool:
    """Whether a call at ``x`` takes the kernel: :func:`zmat._kernel.usable` and no autograd through ``x``."""
    return not (x.requires_grad and torch.is_grad_enabled()) and _kernel.usable(x)


def has_fragments(prims) -> bool:
    """Whether ``prims`` has translation or rotation rows (their back-transformation stays in torch)."""
    return bool(len(prims.translation) or len(prims.rotation))


def _fn(name: str, dtype: torch.dtype):
    key = name, dtype
    if key not in _fns:
        fn = getattr(_kernel.load().lib, f"zmat_{name}_{'f32' if dtype == torch.float32 else 'f64'}")
        fn.argtypes, fn.restype = _ARGS[name], None
        _fns[key] = fn
    return _fns[key]


def _args(x: torch.Tensor, lay: tuple) -> tuple:
    atoms, kind, ref, cart = lay
    return (x.shape[0], x.shape[1], len(atoms), atoms.data_ptr(), kind.data_ptr(), ref.data_ptr(), len(cart),
            cart.data_ptr())  # fmt: skip


def _threads(x: torch.Tensor, rows: int) -> int:
    return _kernel.threads(x.shape[0], rows * x.shape[1])


def values(lay: tuple, x: torch.Tensor) -> torch.Tensor:
    """``(B, G + C)`` values at ``x`` of the rows of ``lay`` (:func:`.coordinates.kernel_layout`)."""
    x = x.contiguous()
    q = x.new_empty((x.shape[0], len(lay[0]) + len(lay[3])))
    _fn("prims_values", x.dtype)(x.data_ptr(), *_args(x, lay), q.data_ptr(), _threads(x, 1))
    return q


def values_and_b(lay: tuple, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` ``(B, G + C)`` and their rows of B ``(B, G + C, 3N)`` at ``x`` (rows as :func:`values`)."""
    x = x.contiguous()
    p = len(lay[0]) + len(lay[3])
    q, bm = x.new_empty((x.shape[0], p)), x.new_empty((x.shape[0], p, 3 * x.shape[1]))
    _fn("prims_b", x.dtype)(x.data_ptr(), *_args(x, lay), q.data_ptr(), bm.data_ptr(), _threads(x, 12))
    return q, bm


def back_round(lay, x, r, target, U, Vs, periodic, iterations, tol, stall, stall_on, best, best_x, best_q):
    """One round of :func:`.steps.back_transform` from ``x`` ``(B, N, 3)`` and the residual ``r``
    ``(B, P)`` (every row in ``lay``), ``U`` ``(B, P, R)`` and ``Vs`` ``(B, 3N, R)``; ``best`` ``(B,)``,
    ``best_x``, ``best_q`` (contiguous) are updated in place."""
    x, r, target, U, Vs = (t.contiguous() for t in (x, r, target, U, Vs))
    _fn("back_round", x.dtype)(
        x.data_ptr(), r.data_ptr(), target.data_ptr(), U.data_ptr(), Vs.data_ptr(), periodic.data_ptr(),
        *_args(x, lay), U.shape[-1], iterations, tol, stall, int(stall_on), best.data_ptr(),
        best_x.data_ptr(), best_q.data_ptr(), _threads(x, 4 * U.shape[1]),
    )  # fmt: skip


def gram(lay: tuple, bm: torch.Tensor) -> torch.Tensor:
    """``B^T B`` ``(B, 3N, 3N)`` of :func:`values_and_b`'s ``bm`` (rows as ``lay``), from each row's at
    most 12 nonzero columns."""
    bm = bm.contiguous()
    G = bm.new_empty((bm.shape[0], bm.shape[-1], bm.shape[-1]))
    x = bm[:, 0].unflatten(-1, (-1, 3))  # (B, N, 3): the sizes _args reads
    _fn("prims_gram", bm.dtype)(bm.data_ptr(), *_args(x, lay), G.data_ptr(), _threads(x, 12))
    return G


def times(lay: tuple, bm: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """``B W`` ``(B, P, R)`` for ``W`` ``(B, 3N, R)``, from each row of ``bm``'s nonzero columns."""
    bm, W = bm.contiguous(), W.contiguous()
    U = bm.new_empty((bm.shape[0], bm.shape[1], W.shape[-1]))
    x = bm[:, 0].unflatten(-1, (-1, 3))  # (B, N, 3): the sizes _args reads
    _fn("prims_times", bm.dtype)(bm.data_ptr(), *_args(x, lay), W.data_ptr(), W.shape[-1], U.data_ptr(),
                                 _threads(x, W.shape[-1]))  # fmt: skip
    return U
