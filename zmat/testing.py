"""Checks for your own code: methods agree, rigid-motion invariance, and which aten ops a call
dispatches (and which of them sync).

:func:`assert_methods_agree` checks that every method of :func:`zmat.to_xyz`
gives the same coordinates and gradients for your internal coordinates and
table (the guarantee of ``docs/conventions.md``: within 1e-10 in float64).
:func:`assert_rigid_invariant` checks that a function of positions (a loss,
internal coordinates, a distance matrix) does not change when the structure is
rotated and translated.

:class:`DispatchAudit` is a ``TorchDispatchMode`` that records every aten op
dispatched inside it (forward, and backward when the backward runs inside it
too) and flags the ops that force a device-to-host copy or have an output
shape that depends on tensor values: on a GPU each of them stalls the host
until the device catches up, and none of them can be captured in a CUDA graph.
Counting ops is also the machine-independent proxy for kernel launches that
the benchmarks report as ``ops/call``. :class:`GrainAudit` records the CPU ops
large enough to open a parallel region (each waits for every intra-op thread).

Example:
    >>> import torch, zmat
    >>> from zmat.testing import DispatchAudit
    >>> C = torch.rand(12, 3, dtype=torch.float64)
    >>> table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]] + [[i - 1, i - 2, i - 3] for i in range(3, 12)]
    >>> with DispatchAudit() as audit:
    ...     xyz = zmat.to_xyz(C, table)
    >>> audit.syncs
    []
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .transform import METHODS, to_xyz

__all__ = [
    "SYNC_OPS",
    "DispatchAudit",
    "GrainAudit",
    "assert_methods_agree",
    "assert_rigid_invariant",
    "default_atol",
]


def default_atol(dtype: torch.dtype) -> float:
    """The tolerance the tests use for ``dtype``: 1e-10 in float64, 1e-4 in float32, else 0.05."""
    return {torch.float64: 1e-10, torch.float32: 1e-4}.get(dtype, 0.05)


def assert_methods_agree(
    C: torch.Tensor, table, *, atol: float | None = None, methods: Sequence[str] = METHODS
) -> None:
    """Assert that every method of :func:`zmat.to_xyz` gives the same positions and gradients.

    Positions are compared with the first method's, and so is the gradient of a
    fixed, generic weighted sum of the positions (one vector-Jacobian product).

    Args:
        C: ``(..., N, 3)`` internal coordinates (float; not modified).
        table: the construction table (anything :func:`zmat.to_xyz` accepts).
        atol: absolute tolerance, same unit as the positions; default
            :func:`default_atol` of ``C.dtype``. Gradients get ``atol`` times
            the largest gradient entry (at least 1).
        methods: the methods to compare (default: :data:`zmat.METHODS`).

    Raises:
        AssertionError: naming the method and the largest deviation.

    Example:
        >>> C = torch.tensor([[0.0, 0, 0], [1.5, 0, 0], [1.4, 2.0, 0], [1.1, 1.9, 2.1]], dtype=torch.float64)
        >>> assert_methods_agree(C, [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]])
    """
    atol = default_atol(C.dtype) if atol is None else atol
    results = []
    for method in methods:
        c = C.detach().clone().requires_grad_()
        xyz = to_xyz(c, table, method=method)
        weight = torch.cos(torch.arange(xyz.numel(), dtype=xyz.dtype, device=xyz.device)).view_as(xyz)
        (grad,) = torch.autograd.grad((xyz * weight).sum(), c)
        results.append((method, xyz.detach(), grad))
    first, xyz0, grad0 = results[0]
    grad_atol = atol * max(1.0, float(grad0.abs().max()))
    for method, xyz, grad in results[1:]:
        err = float((xyz - xyz0).abs().max())
        if not err <= atol:
            raise AssertionError(f"to_xyz method {method!r} differs from {first!r} by {err:.3g} > {atol:.3g}")
        err = float((grad - grad0).abs().max())
        if not err <= grad_atol:
            raise AssertionError(
                f"the gradient of method {method!r} differs from {first!r}'s by {err:.3g} > {grad_atol:.3g}"
            )


def _rotation(dtype: torch.dtype, device) -> torch.Tensor:
    """A fixed generic proper rotation: 1 radian about the axis ``(1, 2, 3) / |(1, 2, 3)|``."""
    k = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) / math.sqrt(14.0)
    skew = torch.tensor([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]], dtype=torch.float64)
    return torch.linalg.matrix_exp(skew).to(dtype=dtype, device=device)


def assert_rigid_invariant(
    fn: Callable[[torch.Tensor], torch.Tensor],
    xyz: torch.Tensor,
    *,
    atol: float | None = None,
    rotation: torch.Tensor | None = None,
    translation: torch.Tensor | None = None,
    period: float | None = None,
) -> None:
    """Assert ``fn(xyz @ R.T + t) == fn(xyz)`` for a proper rotation ``R`` and a translation ``t``.

    Args:
        fn: function of ``(..., N, 3)`` positions returning a tensor.
        xyz: ``(..., N, 3)`` positions.
        atol: absolute tolerance; default :func:`default_atol` of ``xyz.dtype``
            times ``max(1, max |fn(xyz)|)``.
        rotation: ``(3, 3)`` proper rotation; default a fixed generic one.
        translation: ``(3,)``; default ``(1.5, -2, 0.5)``.
        period: compare differences modulo this (``2 * math.pi`` for angles,
            where ``pi`` and ``-pi`` are the same dihedral).

    Raises:
        AssertionError: with the largest deviation.

    Example:
        >>> xyz = torch.tensor([[0.0, 0, 0], [1.5, 0, 0], [2, 1.4, 0], [3, 1.5, 1.2]], dtype=torch.float64)
        >>> table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]]
        >>> assert_rigid_invariant(lambda x: zmat.to_internal(x, table), xyz, period=2 * math.pi)
    """
    rot = _rotation(xyz.dtype, xyz.device) if rotation is None else rotation.to(xyz)
    shift = torch.tensor([1.5, -2.0, 0.5]) if translation is None else translation
    ref = fn(xyz)
    moved = fn(xyz @ rot.transpose(-1, -2) + shift.to(xyz))
    diff = moved - ref
    if period is not None:
        diff = torch.remainder(diff + period / 2, period) - period / 2
    if atol is None:
        atol = default_atol(xyz.dtype) * max(1.0, float(ref.abs().max()) if ref.numel() else 1.0)
    err = float(diff.abs().max()) if diff.numel() else 0.0
    if not err <= atol:
        raise AssertionError(f"not invariant under a rigid motion: largest change {err:.3g} > {atol:.3g}")


#: aten ops that copy a value to the host or size their output from tensor values.
SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",  # .item(), bool(t), float(t), int(t)
        "item",
        "is_nonzero",
        "nonzero",
        "nonzero_static",
        "argwhere",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
        "bincount",
        "histc",
        "equal",
        "allclose",
        "_assert_async",
    }
)


def _is_sync(name: str, args, kwargs) -> bool:
    if name in SYNC_OPS:
        return True
    if name == "repeat_interleave":  # output size from the repeats, unless given
        return kwargs.get("output_size") is None and not (len(args) > 3 and args[3] is not None)
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):  # boolean-mask indexing
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    return False


class DispatchAudit(TorchDispatchMode):
    """Record every aten op dispatched inside the ``with`` block.

    Attributes:
        ops: op names in dispatch order (``"mul"``, ``"index_select"``, ...).
        syncs: the names among ``ops`` that sync with the host or have
            data-dependent output shapes (see :data:`SYNC_OPS`; also
            ``repeat_interleave`` without ``output_size`` and boolean-mask
            ``index``/``index_put``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        self.ops.append(name)
        if _is_sync(name, args, kwargs):
            self.syncs.append(name)
        return func(*args, **kwargs)

    @property
    def count(self) -> int:
        """Number of dispatched aten ops."""
        return len(self.ops)

    def histogram(self) -> Counter:
        """``Counter`` of op names, most common first with ``.most_common()``."""
        return Counter(self.ops)


class GrainAudit(TorchDispatchMode):
    """Record the aten ops inside the ``with`` block that work on a tensor of at least
    torch's parallel grain (``GRAIN`` elements, ``VML_GRAIN`` for the vectorised math
    of ``VML``; in-place ops judged by their other arguments, gathers by their output).

    On the CPU each such op is a parallel region at two or more threads, which waits
    for every thread: with another process holding a core, each waits for the
    scheduler. Views and allocations are not counted.

    Attributes:
        ops: the schema names of the recorded ops, in dispatch order.
    """

    GRAIN = 32768
    VML_GRAIN = 2048
    VML = ("sqrt", "rsqrt", "pow", "exp", "log", "log1p", "expm1", "tanh", "sin", "cos")
    VIEWS = ("view", "reshape", "unbind", "select", "slice", "expand", "as_strided", "detach", "alias", "t")

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        inplace = name.endswith("_")
        skip = 1 if inplace or name in ("index_select", "index") else 0  # a gather loops over its index
        tensors = [a for a in (*args[skip:], *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        if not inplace:
            outs = out if isinstance(out, (tuple, list)) else [out]
            tensors += [o for o in outs if isinstance(o, torch.Tensor)]
        grain = self.VML_GRAIN if name.rstrip("_").split(".")[0] in self.VML else self.GRAIN
        if not name.startswith((*self.VIEWS, "lift")) and any(t.numel() >= grain for t in tensors):
            self.ops.append(func._schema.name)
        return out
