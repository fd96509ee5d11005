"""Checks for your own code: which aten ops a call dispatches, and which of them sync.

:class:`DispatchAudit` is a ``TorchDispatchMode`` that records every aten op
dispatched inside it (forward, and backward when the backward runs inside it
too) and flags the ops that force a device-to-host copy or have an output
shape that depends on tensor values: on a GPU each of them stalls the host
until the device catches up, and none of them can be captured in a CUDA graph.
Counting ops is also the machine-independent proxy for kernel launches that
the benchmarks report as ``ops/call``.

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

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SYNC_OPS", "DispatchAudit"]

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
