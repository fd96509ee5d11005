"""CPU evaluation that opens no parallel region, shared by the losses' training paths.

torch runs an op over 32,768 elements or more (its grain; 2,048 for sqrt, exp
and other vectorised math) on every intra-op thread, and each such op waits for
all of them: with a second process busy on one core, each op then waits for the
scheduler. A serial path keeps every torch op below the grain (chunks of
``SERIAL_CHUNK`` elements) or does the arithmetic in numpy (single-threaded),
whatever the thread setting, which it leaves alone.
"""

from __future__ import annotations

import numpy as np
import torch

from ._segments import on_host

__all__ = ["SERIAL_CHUNK", "host_zeros", "is_functorch", "serial"]

SERIAL_CHUNK = 32767  # below the grain (32,768): a 1-D op on a chunk runs on one thread


def serial(x) -> bool:
    """Whether a call on ``x`` takes a serial CPU path: eager CPU, several threads,
    outside ``torch.func`` transforms and traces (which keep the plain torch path)."""
    if not isinstance(x, torch.Tensor) or not on_host(x) or torch.get_num_threads() == 1:
        return False
    return not is_functorch(x)


def is_functorch(t) -> bool:
    """Whether ``t`` is a tensor inside ``torch.func`` transforms (no storage to read)."""
    try:
        t.data_ptr()
    except RuntimeError:
        return True
    return False


def host_zeros(shape, dtype) -> torch.Tensor:
    """Zeros without a torch fill (numpy's allocation: no parallel region)."""
    return torch.from_numpy(np.zeros(shape, dtype=torch.empty(0, dtype=dtype).numpy().dtype))
