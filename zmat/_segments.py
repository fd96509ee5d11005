"""Ragged batches: the offset arithmetic, and ``ptr`` / ``batch`` arguments.

The one place for the ragged idioms every batch builder needs (numpy, host
data): :func:`starts` (exclusive cumulative sum), :func:`ptr`,
:func:`segment_ids`, :func:`per_row`, :func:`segment_arange`, :func:`ranges`
and :func:`take_shift` (the index shift of components taken from a batch).
Their torch twins (``_t``: :func:`starts_t`, :func:`segment_ids_t`,
:func:`per_row_t`, :func:`segment_arange_t`) run on the sizes' device and take
the number of rows ``total`` where the caller knows it, so that no host-device
sync reads it from the sizes.

For the losses (:mod:`zmat.clash`, :mod:`zmat.protein.violations`) it turns
``ptr`` (``(B + 1,)`` offsets) and/or ``batch`` (``(n,)`` structure of each
flat row) into one ``(n,)`` structure index on the device, without a
host-device sync: ``B`` is read from ``ptr``'s shape, or from ``batch`` only
when that is host data. Values are checked where they are host data (CPU
tensors, numpy arrays, lists, :class:`zmat.batch.Ragged`), never on a device.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "Segments",
    "index_arg",
    "on_host",
    "per_row",
    "ptr",
    "ranges",
    "per_row_t",
    "segment_arange",
    "segment_arange_t",
    "segment_ids",
    "segment_ids_t",
    "segments",
    "starts",
    "starts_t",
    "take_shift",
]


def starts(sizes: np.ndarray) -> np.ndarray:
    """The first row of every segment: the exclusive cumulative sum of ``sizes``."""
    return np.cumsum(sizes) - sizes


def ptr(sizes: np.ndarray) -> np.ndarray:
    """``(B + 1,)`` int64 segment bounds ``[0, s_0, s_0 + s_1, ...]``."""
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def per_row(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``values[k]`` repeated ``sizes[k]`` times: a per-segment value on every row."""
    return np.repeat(values, sizes)


def segment_ids(sizes: np.ndarray) -> np.ndarray:
    """The segment of every row, ``[0] * s_0 + [1] * s_1 + ...``."""
    return np.repeat(np.arange(len(sizes)), sizes)


def segment_arange(sizes: np.ndarray) -> np.ndarray:
    """Every row's index within its segment, ``[0 .. s_0) + [0 .. s_1) + ...``."""
    return np.arange(int(np.sum(sizes))) - np.repeat(starts(sizes), sizes)


def ranges(first: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The ranges ``[first[k], first[k] + sizes[k])`` one after the other."""
    return np.repeat(first - starts(sizes), sizes) + np.arange(sizes.sum())


def take_shift(ptr: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segments ``index`` (in that order) of a batch whose segment ``k`` is rows
    ``ptr[k]:ptr[k + 1]``: their ``sizes``, and ``shift`` (new - old index of
    every row taken), so that the rows taken are ``arange(N') - shift``."""
    sizes = (ptr[1:] - ptr[:-1])[index]
    return sizes, np.repeat(starts(sizes) - ptr[index], sizes)


# ------------------------------------------------------------ torch twins
def starts_t(sizes: torch.Tensor) -> torch.Tensor:
    """:func:`starts` of a tensor: ``cumsum(sizes) - sizes``, on its device."""
    return torch.cumsum(sizes, 0) - sizes


def per_row_t(values: torch.Tensor, sizes: torch.Tensor | int, total: int | None = None) -> torch.Tensor:
    """:func:`per_row` of a tensor: ``values[k]`` repeated ``sizes[k]`` times (``sizes``
    an int: each that many times); ``total`` the number of rows, where known (no sync)."""
    return values.repeat_interleave(sizes, dim=0, output_size=total)


def segment_ids_t(sizes: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """:func:`segment_ids` of a tensor, on its device; ``total = sizes.sum()`` where known
    (no sync)."""
    return per_row_t(torch.arange(len(sizes), device=sizes.device), sizes, total)


def segment_arange_t(sizes: torch.Tensor, total: int | None = None, ids: torch.Tensor | None = None):
    """:func:`segment_arange` of a tensor: every row's index within its segment,
    ``arange(total) - starts_t(sizes)[ids]``; ``ids`` the rows' segments where the caller
    has them (:func:`segment_ids_t`); ``total`` where known (no sync), else read from ``ids``
    (or the sizes)."""
    if ids is None:
        ids = segment_ids_t(sizes, total)
    n = ids.shape[0] if total is None else total
    return torch.arange(n, device=sizes.device) - starts_t(sizes)[ids]


def on_host(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read without a device sync (and outside a trace)."""
    tracing = torch.compiler.is_compiling() or torch.jit.is_tracing()
    return t.device.type == "cpu" and type(t) is torch.Tensor and not tracing


def index_arg(x, name: str, device, who: str = "clash_loss") -> tuple[torch.Tensor, np.ndarray | None]:
    """An integer argument as an int64 tensor on ``device``, and its host copy when
    it is host data (readable without a device sync), else None."""
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError(f"{who}: {name} must hold integers, got {x.dtype}")
        host = x.numpy() if on_host(x) else None
        return x.to(device=device, dtype=torch.long), host
    try:
        host = np.asarray(x)
    except (ValueError, TypeError) as e:
        raise TypeError(f"{who}: {name} must be an integer array, got {type(x).__name__}: {e}") from None
    if host.dtype.kind not in "iu":
        raise TypeError(f"{who}: {name} must hold integers, got {host.dtype}")
    return torch.as_tensor(host.astype(np.int64), device=device), host


class Segments(NamedTuple):
    """``B`` structures over ``n`` flat rows.

    ``index``: ``(n,)`` int64 structure of each row, on the device; ``sizes``:
    the ``B`` sizes where known on the host, else None; ``starts``: ``(B,)``
    first row of each, on the device (None for an unsorted ``batch``).
    """

    count: int
    index: torch.Tensor
    sizes: np.ndarray | None
    starts: torch.Tensor | None


def _agree(sizes: np.ndarray, batch, who: str) -> None:
    """``batch`` (where host data) must be the rows' structures that ``ptr`` gives."""
    _, host = index_arg(batch, "batch", "cpu", who)
    want = segment_ids(sizes)
    if host is not None and host.shape == want.shape and not np.array_equal(host, want):
        k = int(np.flatnonzero(host != want)[0])
        raise ValueError(
            f"{who}: ptr and batch disagree: row {k} is in structure {int(want[k])} by ptr, "
            f"{int(host[k])} by batch (give one of them)"
        )


def segments(ptr, batch, n: int, device, who: str = "clash_loss", rows: str = "xyz") -> Segments:
    """:class:`Segments` from ``ptr`` (a :class:`zmat.batch.Ragged` too) and/or ``batch``."""
    sizes = None
    if ptr is not None:
        ptr, host = index_arg(getattr(ptr, "ptr", ptr), "ptr", device, who)
        if ptr.ndim != 1 or ptr.shape[0] < 1:
            raise ValueError(f"{who}: ptr must have shape (B + 1,), got {tuple(ptr.shape)}")
        if host is not None:
            sizes = np.diff(host)
            if host[0] != 0 or host[-1] != n or (sizes < 0).any():
                raise ValueError(
                    f"{who}: ptr must rise from 0 to N = {n} (the flat rows of {rows}), got "
                    f"{host[:4].tolist()}{' ...' if len(host) > 4 else ''} ending at {host[-1]}"
                )
        count, first = ptr.shape[0] - 1, ptr[:-1]
        if batch is not None and sizes is not None:
            _agree(sizes, batch, who)
        if batch is None:
            index = torch.arange(count, device=device).repeat_interleave(ptr[1:] - first, output_size=n)
            return Segments(count, index, sizes, first)
    batch, host = index_arg(batch, "batch", device, who)
    if tuple(batch.shape) != (n,):
        raise ValueError(f"{who}: batch must have shape (N,) = ({n},), got {tuple(batch.shape)}")
    if ptr is None:
        if host is None:
            raise ValueError(
                f"{who}: batch= on {batch.device} needs ptr= too (reading the number of "
                "structures from batch would sync with the device)"
            )
        count = int(host.max()) + 1 if n else 0
        sizes, first = np.bincount(host.clip(0), minlength=count), None
        if (np.diff(host) >= 0).all():  # sorted, as PyG's: structure b is one run of rows
            first = torch.as_tensor(starts(sizes), device=device)
    if host is not None and n and (host.min() < 0 or host.max() >= count):
        raise ValueError(f"{who}: batch values must lie in [0, {count}), got {host.min()} to {host.max()}")
    return Segments(count, batch, sizes, first)
