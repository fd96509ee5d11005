"""Compiled CPU kernel for the analytic method (batch-1 latency).

Eager PyTorch pays a dispatch floor of a few microseconds per op, and the
analytic method dispatches about a hundred ops per call: for one structure
that floor, not the arithmetic, is the cost. On CPU tensors the same
placement and the same Abe-Go backward (see ``zmat/_analytic.py``) run here as
single-threaded loops of C++ (``zmat/csrc/rigid_forest.cpp``):

* forward: one pass over the atoms in depth-first order, ``F_j = F_parent(j) . L_j``
  with ``L`` built from the plan's effective internal coordinates (missing
  references and offset chains resolved by the same gather as the torch path);
* backward: the subtree sums in reverse depth-first order, then ``d r``,
  ``d theta``, ``d phi_eff`` per atom, scattered back through the gather;
* and, for proteins built from torsions, the fill of the internal coordinates
  (:func:`fill`, ``zmat.protein.build.fill_internal``'s math) and its
  gradient: a step of ``ProteinBatch.to_xyz`` then enters no parallel region,
  which on a shared machine waits for a busy core.

The kernel is compiled by ``torch.utils.cpp_extension.load_inline`` on the
first CPU call (not at ``import zmat``), once per machine: torch caches the
build in its extensions directory (``TORCH_EXTENSIONS_DIR``), keyed by a hash
of the source, so later processes only load it. It serves every table (the
plan arrays are inputs), so no new sequence or table compiles anything.

The pure-PyTorch path stays the reference and the fallback: it is used when
the kernel cannot be built (a warning, once), when ``ZMAT_NO_KERNEL=1``, for
other devices and dtypes, under ``torch.compile``/``torch.export`` tracing,
``torch.func`` transforms and forward-mode AD, and for double backward (a
backward with ``create_graph=True`` differentiates the torch path instead).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad

from .table import ConstructionTable

_SOURCE = Path(__file__).with_name("csrc") / "rigid_forest.cpp"
_DTYPES = (torch.float32, torch.float64)
_state: dict = {}  # "module": the loaded extension, or None where it failed


def disabled() -> bool:
    """Whether ``ZMAT_NO_KERNEL`` turns the kernel off (read at every call)."""
    return os.environ.get("ZMAT_NO_KERNEL", "") not in ("", "0")


def load():
    """The compiled extension (built on the first call, cached on disk), or
    ``None`` if it cannot be built (warned once; the torch path is used)."""
    if "module" not in _state:
        _state["module"] = None
        try:
            from torch.utils.cpp_extension import load_inline

            source = _SOURCE.read_text()
            name = "zmat_rigid_forest_" + hashlib.sha1(source.encode()).hexdigest()[:12]
            _state["module"] = load_inline(
                name,
                [source],
                functions=["forward", "backward", "fill_forward", "fill_backward"],
                extra_cflags=["-O3"],
                verbose=False,
            )
        except Exception as error:  # no compiler, no ninja, a read-only cache...
            warnings.warn(
                f"zmat: the compiled CPU kernel is unavailable ({type(error).__name__}: {error}); "
                "using the PyTorch path (set ZMAT_NO_KERNEL=1 to silence this)",
                RuntimeWarning,
                stacklevel=3,
            )
    return _state["module"]


def serves(device: torch.device) -> bool:
    """Whether eager float calls on ``device`` take the kernel (see :func:`usable`)."""
    if device.type != "cpu" or torch.compiler.is_compiling() or disabled():
        return False
    return load() is not None


def usable(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` may take the kernel: a plain CPU float32/float64
    tensor, outside tracing, ``torch.func`` transforms and forward-mode AD."""
    if x.dtype not in _DTYPES or type(x) not in (torch.Tensor, torch.nn.Parameter):
        return False
    if torch._C._are_functorch_transforms_active() or _forward_ad._current_level >= 0:
        return False  # (dual tensors need the Functions' jvp)
    return serves(x.device)


# ------------------------------------------------------------ protein fill
def fill(t: torch.Tensor, ideal: torch.Tensor, slot: torch.Tensor, defaults: torch.Tensor) -> torch.Tensor:
    """Torsions ``(S, L, 7)`` -> internal coordinates ``(S, N, 3)`` of a
    protein layout: ``zmat.protein.build.fill_internal`` without ``base`` in
    one single-threaded loop (its ~30 elementwise ops each enter a parallel
    region on a batch, and wait there for a busy core).

    Args:
        t: ``(S, L, 7)`` float32/float64 CPU torsions (any strides).
        ideal: ``(N, 3)`` float64 ideal values (NaN: 0).
        slot: ``(N,)`` int64 torsion slot ``k * 7 + c`` of each atom, -1 for none.
        defaults: ``(7,)`` float64 torsions used where ``t`` is NaN.
    """
    if torch.is_grad_enabled() and t.requires_grad:
        return _Fill.apply(t, ideal, slot, defaults)
    return _state["module"].fill_forward(t, ideal, slot, defaults)


def fill_vjp(g: torch.Tensor, t: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`fill` in differentiable torch ops (for double
    backward and batched gradients): ``g`` ``(S, N, 3)`` -> ``(S, L, 7)``."""
    index = slot.clamp_min(0)
    keep = (slot >= 0) & ~torch.isnan(t.flatten(1).index_select(1, index))
    g_phi = torch.where(keep, g[..., 2], 0)
    return torch.zeros_like(t).flatten(1).index_add(1, index, g_phi).view_as(t)


class _Fill(torch.autograd.Function):
    """The ctx form, as the placement Functions below (why: see there)."""

    @staticmethod
    def forward(ctx, t, ideal, slot, defaults):
        ctx.slot = slot
        ctx.save_for_backward(t)
        ctx.set_materialize_grads(False)
        return _state["module"].fill_forward(t, ideal, slot, defaults)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None, None
        (t,) = ctx.saved_tensors
        if _differentiable_backward(g):
            return fill_vjp(g, t.detach(), ctx.slot), None, None, None
        return _state["module"].fill_backward(g, t, ctx.slot), None, None, None


class KernelPlan:
    """The plan arrays the kernel reads, in depth-first order, for one table.

    Args:
        ints: ``(K + 2, N)`` int64: ``gather`` ``(K, N)``, the flat index into
            ``C`` of every atom's ``(r, theta, phi, phi of its offset
            chain...)`` entries; then every atom's parent (dfs position, -1
            none) and its atom index (``order``).
        flags: ``(K + 2, N)`` bool: ``keep`` ``(K, N)``, which of those
            entries the table uses; then whether theta and phi are used
            (``trig``; else pi, 0).
        vjp: ``(table, rot, pos, g_rot, g_pos) -> flat gradient (3 N, B)`` in
            differentiable torch ops (``_vjp`` of ``zmat/_analytic.py``), for
            double backward and batched gradients; it plans the torch path
            only when such a backward happens.
    """

    def __init__(self, ints: np.ndarray, flags: np.ndarray, vjp) -> None:
        self._ints, self._flags, self.vjp = ints, flags.view(np.uint8), vjp
        k = len(ints) - 2
        self.n = ints.shape[1]
        self.gather, self.parent, self.order = (torch.from_numpy(a) for a in (ints[:k], ints[k], ints[k + 1]))
        self.keep, self.trig = torch.from_numpy(self._flags[:k]), torch.from_numpy(self._flags[k:])
        self.placement = (self.gather, self.keep, self.trig, self.parent)  # the forward's arrays

    def take(self, ptr: np.ndarray, index: np.ndarray) -> KernelPlan:
        """The plan of ``ConstructionTable._take(ptr, index)``'s table, by the
        same gathers: component ``k`` of the table is atoms and dfs positions
        ``ptr[k]:ptr[k + 1]``, so its columns move together, indices shifted."""
        sizes = (ptr[1:] - ptr[:-1])[index]
        shift = np.repeat(np.cumsum(sizes) - sizes - ptr[index], sizes)  # new - old position
        cols = np.arange(len(shift)) - shift
        ints = np.take(self._ints, cols, axis=1)
        k = len(ints) - 2
        ints[:k] += 3 * shift  # flat indices into C; unused ones (keep 0) clipped below
        np.clip(ints[:k], 0, 3 * len(shift) - 1, out=ints[:k])
        ints[k] += np.where(ints[k] >= 0, shift, 0)  # parents (-1: none)
        ints[k + 1] += shift
        return KernelPlan(ints, np.take(self._flags, cols, axis=1), self.vjp)

    @staticmethod
    def concatenate(plans: list[KernelPlan]) -> KernelPlan:
        """The plan of ``ConstructionTable.concatenate`` of the plans' tables:
        their columns side by side, indices shifted by each table's first atom
        (a concatenated table keeps every piece's atoms and dfs positions in one
        range); a narrower offset chain is padded with unused entries."""
        k = max(len(p._ints) for p in plans) - 2
        shape = (k + 2, sum(p.n for p in plans))
        ints, flags = np.empty(shape, np.int64), np.zeros(shape, np.uint8)
        at = 0
        for p in plans:  # per piece, whole rows shifted in one pass (no per-atom Python)
            m, cols = len(p._ints) - 2, slice(at, at + p.n)
            np.add(p._ints[:m], 3 * at, out=ints[:m, cols])  # flat indices into C
            ints[m:k, cols] = 3 * at  # a narrower offset chain: unused entries, in range
            np.add(p._ints[m:], at, out=ints[k:, cols])
            np.putmask(ints[k, cols], p._ints[m] < 0, -1)  # parents (-1: none)
            flags[:m, cols] = p._flags[:m]
            flags[k:, cols] = p._flags[m:]
            at += p.n
        return KernelPlan(ints, flags.view(bool), plans[0].vjp)


def _differentiable_backward(*grads) -> bool:
    """A backward with ``create_graph=True`` or under ``vmap`` (batched
    gradients, e.g. gradcheck's) differentiates the torch path instead of
    calling the kernel, which needs plain tensors."""
    if torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
        return True
    functorch = torch._C._functorch
    return any(
        g is not None and (functorch.is_legacy_batchedtensor(g) or functorch.is_functorch_wrapped_tensor(g))
        for g in grads
    )


# The Functions below use the ctx form of ``forward``, not ``setup_context``:
# ``Function.apply`` binds a ``setup_context`` Function's arguments with
# ``inspect.signature`` (~8 us, more than the kernel on a small molecule), and
# the kernel is never used under ``torch.func`` transforms, which would need it.


def positions(C: torch.Tensor, plan: KernelPlan, table: ConstructionTable) -> torch.Tensor:
    """Positions ``(..., N, 3)`` in atom order from internal coordinates ``C``
    ``(..., N, 3)``, for tables whose segments are all rooted at the origin
    (``table.constant_anchors``)."""
    if torch.is_grad_enabled() and C.requires_grad:
        return _Positions.apply(C, plan, table)[0]
    return _place(C, plan)[1].view(C.shape)  # no graph: no Function


def frames(flat: torch.Tensor, plan: KernelPlan, table: ConstructionTable):
    """Flat internal coordinates ``(3 N, B)`` -> frames relative to their
    segment anchors, component-major, dfs order: rotations ``(3, 3, N, B)``,
    positions ``(3, N, B)`` (as ``RigidForest`` in ``zmat/_analytic.py``)."""
    return _Frames.apply(flat, plan, table)


def _place(C: torch.Tensor, plan: KernelPlan):
    """Frames ``(B, N, 3, 4)`` in dfs order and positions ``(B, N, 3)`` in atom order."""
    return _state["module"].forward(C.reshape(-1, 3 * plan.n), *plan.placement, plan.order)


def _split(frames: torch.Tensor):
    """``(B, N, 3, 4)`` -> rotations ``(3, 3, N, B)``, positions ``(3, N, B)``
    (component-major views, the layout of ``RigidForest``)."""
    frames = frames.permute(2, 3, 1, 0)
    return frames[:, :3], frames[:, 3]


def _backward(ctx, g_rot, g_pos, g_xyz=None) -> torch.Tensor:
    """Gradient ``(B, 3 N)`` of the flat internal coordinates from the saved
    frames (outputs: so double backward differentiates the torch ``vjp``
    through them, as ``RigidForest`` does) and the output gradients."""
    rot, pos = ctx.saved_tensors
    plan = ctx.plan
    rows = None
    differentiable = _differentiable_backward(g_rot, g_pos, g_xyz)
    if g_xyz is not None:  # (..., N, 3) in atom order
        g_xyz = g_xyz.reshape(-1, plan.n, 3)
        if g_pos is None and not differentiable:
            rows = plan.order  # the kernel reads row order[j] for dfs position j
        else:
            g_dfs = g_xyz.index_select(1, plan.order).permute(2, 1, 0)
            g_pos = g_dfs if g_pos is None else g_pos + g_dfs
    if differentiable:
        return plan.vjp(ctx.table, rot, pos, g_rot, g_pos).t()
    g_rot = None if g_rot is None else g_rot.permute(3, 2, 0, 1)
    g_pos = g_xyz if rows is not None else (None if g_pos is None else g_pos.permute(2, 1, 0))
    args = (rows, plan.gather, plan.keep, plan.parent, 3 * plan.n)
    return _state["module"].backward(rot.permute(3, 2, 0, 1), pos.permute(2, 1, 0), g_rot, g_pos, *args)


class _Positions(torch.autograd.Function):
    """``C -> (positions (..., N, 3) in atom order, rot, pos)``; the frames are
    outputs only for the backward (``positions`` returns the first)."""

    @staticmethod
    def forward(ctx, C: torch.Tensor, plan: KernelPlan, table: ConstructionTable):
        frames, xyz = _place(C, plan)
        rot, pos = _split(frames)
        ctx.plan, ctx.table, ctx.shape = plan, table, C.shape
        ctx.save_for_backward(rot, pos)
        ctx.set_materialize_grads(False)
        return xyz.view(C.shape), rot, pos

    @staticmethod
    def backward(ctx, g_xyz, g_rot, g_pos):
        if g_xyz is None and g_rot is None and g_pos is None:
            return None, None, None
        return _backward(ctx, g_rot, g_pos, g_xyz).reshape(ctx.shape), None, None


class _Frames(torch.autograd.Function):
    @staticmethod
    def forward(ctx, flat: torch.Tensor, plan: KernelPlan, table: ConstructionTable):
        (frames,) = _state["module"].forward(flat.t(), *plan.placement, None)
        rot, pos = _split(frames)
        ctx.plan, ctx.table = plan, table
        ctx.save_for_backward(rot, pos)
        ctx.set_materialize_grads(False)
        return rot, pos

    @staticmethod
    def backward(ctx, g_rot, g_pos):
        if g_rot is None and g_pos is None:
            return None, None, None
        return _backward(ctx, g_rot, g_pos).t(), None, None
