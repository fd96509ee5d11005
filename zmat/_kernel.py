"""Compiled CPU kernel for the analytic method (batch-1 latency).

Eager PyTorch pays a dispatch floor of a few microseconds per op, and the
analytic method dispatches about a hundred ops per call: for one structure
that floor, not the arithmetic, is the cost. On CPU tensors the same
placement and the same Abe-Go backward (see ``zmat/_analytic.py``) run here as
two single-threaded loops of C++ (``zmat/csrc/rigid_forest.cpp``):

* forward: one pass over the atoms in depth-first order, ``F_j = F_parent(j) . L_j``
  with ``L`` built from the plan's effective internal coordinates (missing
  references and offset chains resolved by the same gather as the torch path);
* backward: the subtree sums in reverse depth-first order, then ``d r``,
  ``d theta``, ``d phi_eff`` per atom, scattered back through the gather.

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

from .table import BOND, PLANAR, ConstructionTable

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
                name, [source], functions=["forward", "backward"], extra_cflags=["-O3"], verbose=False
            )
        except Exception as error:  # no compiler, no ninja, a read-only cache...
            warnings.warn(
                f"zmat: the compiled CPU kernel is unavailable ({type(error).__name__}: {error}); "
                "using the PyTorch path (set ZMAT_NO_KERNEL=1 to silence this)",
                RuntimeWarning,
                stacklevel=3,
            )
    return _state["module"]


def usable(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` may take the kernel: a plain CPU float32/float64
    tensor, outside tracing, ``torch.func`` transforms and forward-mode AD."""
    if x.device.type != "cpu" or x.dtype not in _DTYPES or type(x) not in (torch.Tensor, torch.nn.Parameter):
        return False
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return False
    if _forward_ad._current_level >= 0 or disabled():  # dual tensors need the Functions' jvp
        return False
    return load() is not None


class KernelPlan:
    """The plan arrays the kernel reads, in depth-first order, for one table.

    Args:
        table: the validated table.
        gather: ``(K, N)`` int64, flat index into ``C`` of every atom's
            ``(r, theta, phi, phi of its offset chain...)`` entries.
        keep: ``(K, N)`` bool, which of them the table uses.
        twin_positions: ``C -> positions`` by the torch path (for double backward).
        twin_frames: ``flat (3 N, B) -> (rot, pos)`` by the torch path.
    """

    def __init__(self, table: ConstructionTable, gather, keep, twin_positions, twin_frames) -> None:
        self.n = table.n_atoms
        self.gather = gather.reshape(-1, self.n).contiguous()
        self.keep = keep.reshape(-1, self.n).to(torch.uint8).contiguous()
        kind = table.kind[table.dfs_order]
        trig = np.stack([kind > BOND, kind > PLANAR]).astype(np.uint8)  # theta, phi used (else pi, 0)
        self.trig = torch.as_tensor(trig)
        self.parent = torch.as_tensor(table.dfs_parent, dtype=torch.int64)
        self.order = torch.as_tensor(table.dfs_order, dtype=torch.int64)
        self.twin_positions, self.twin_frames = twin_positions, twin_frames
        self.placement = (self.gather, self.keep, self.trig, self.parent)  # the forward's arrays


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


def _twin_grad(twin, x: torch.Tensor, grads) -> torch.Tensor:
    """Gradient of the torch path's outputs at ``x``, differentiable (double backward)."""
    with torch.enable_grad():
        outputs = twin(x)
    pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g is not None]
    (grad,) = torch.autograd.grad([o for o, _ in pairs], x, [g for _, g in pairs], create_graph=True)
    return grad


# The Functions below use the ctx form of ``forward``, not ``setup_context``:
# ``Function.apply`` binds a ``setup_context`` Function's arguments with
# ``inspect.signature`` (~8 us, more than the kernel on a small molecule), and
# the kernel is never used under ``torch.func`` transforms, which would need it.


def positions(C: torch.Tensor, plan: KernelPlan) -> torch.Tensor:
    """Positions ``(..., N, 3)`` in atom order from internal coordinates ``C``
    ``(..., N, 3)``, for tables whose segments are all rooted at the origin
    (``table.constant_anchors``)."""
    if torch.is_grad_enabled() and C.requires_grad:
        return _Positions.apply(C, plan)
    return _place(C, plan)[1].view(C.shape)  # no graph: no Function


def frames(flat: torch.Tensor, plan: KernelPlan):
    """Flat internal coordinates ``(3 N, B)`` -> frames relative to their
    segment anchors, component-major, dfs order: rotations ``(3, 3, N, B)``,
    positions ``(3, N, B)`` (as ``RigidForest`` in ``zmat/_analytic.py``)."""
    return _Frames.apply(flat, plan)


def _place(C: torch.Tensor, plan: KernelPlan):
    """Frames ``(B, N, 3, 4)`` in dfs order and positions ``(B, N, 3)`` in atom order."""
    return _state["module"].forward(C.reshape(-1, 3 * plan.n), *plan.placement, plan.order)


class _Positions(torch.autograd.Function):
    @staticmethod
    def forward(ctx, C: torch.Tensor, plan: KernelPlan):
        frames, xyz = _place(C, plan)
        ctx.plan = plan
        ctx.save_for_backward(C, frames)  # frames: for the kernel's backward only
        ctx.set_materialize_grads(False)
        return xyz.view(C.shape)

    @staticmethod
    def backward(ctx, g_xyz):
        C, frames = ctx.saved_tensors
        plan = ctx.plan
        if g_xyz is None:
            return None, None
        if _differentiable_backward(g_xyz):
            return _twin_grad(lambda c: (plan.twin_positions(c),), C, (g_xyz,)), None
        g_pos = g_xyz.reshape(-1, plan.n, 3)
        args = (plan.order, plan.gather, plan.keep, plan.parent, 3 * plan.n)
        grad = _state["module"].backward(frames[..., :3], frames[..., 3], None, g_pos, *args)
        return grad.view(C.shape), None


class _Frames(torch.autograd.Function):
    @staticmethod
    def forward(ctx, flat: torch.Tensor, plan: KernelPlan):
        (frames,) = _state["module"].forward(flat.t(), *plan.placement, None)
        frames = frames.permute(2, 3, 1, 0)  # (3, 4, N, B)
        rot, pos = frames[:, :3], frames[:, 3]
        ctx.plan = plan
        ctx.save_for_backward(flat, rot, pos)
        ctx.set_materialize_grads(False)
        return rot, pos

    @staticmethod
    def backward(ctx, g_rot, g_pos):
        flat, rot, pos = ctx.saved_tensors
        plan = ctx.plan
        if g_rot is None and g_pos is None:
            return None, None
        if _differentiable_backward(g_rot, g_pos):
            return _twin_grad(plan.twin_frames, flat, (g_rot, g_pos)), None
        g_rot = None if g_rot is None else g_rot.permute(3, 2, 0, 1)
        g_pos = None if g_pos is None else g_pos.permute(2, 1, 0)
        args = (None, plan.gather, plan.keep, plan.parent, 3 * plan.n)
        grad = _state["module"].backward(rot.permute(3, 2, 0, 1), pos.permute(2, 1, 0), g_rot, g_pos, *args)
        return grad.t(), None
