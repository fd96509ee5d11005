"""Shape checks that neither import sympy nor specialise symbolic shapes."""

from __future__ import annotations

import numpy as np
import torch


def broadcast_shape(a, b) -> tuple | None:
    """The broadcast shape of ``a`` and ``b``, or ``None`` where they do not broadcast.

    Plain integer shapes take numpy's rule: ``torch.broadcast_shapes`` imports sympy (symbolic
    shapes) on its first call, ~1 s. Symbolic shapes (``torch.export``, ``torch.compile``) take
    torch's rule, so that a dynamic batch dimension is not specialised to its example value."""
    a, b = tuple(a), tuple(b)
    if all(type(s) is int for s in (*a, *b)):
        try:
            return tuple(np.broadcast_shapes(a, b))
        except ValueError:
            return None
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None
