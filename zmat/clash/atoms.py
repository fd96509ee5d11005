"""First stage of :func:`zmat.clash_loss`: the inputs checked, broadcast and flattened.

One input, one output: ``xyz (..., N, 3)``, ``radii``, ``mask``, the batch
layout (``ptr`` / ``batch``) and the exclusions in; :class:`Atoms` out: flat
rows ``(M, 3)`` with their radii and mask (padding zeroed), the
:class:`Layout` saying which structure each row belongs to, and the exclusion
keys. Errors are raised here, once, naming the shape at fault.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from .._segments import on_host, segments
from .._shapes import broadcast_shape
from .exclusions import batch_keys

__all__ = ["Atoms", "Layout", "prepare"]


class Layout(NamedTuple):
    """Which structure each row of the flattened batch ``xyz_f`` (M rows) belongs to.

    Padded batches: row ``a`` is structure ``a // n``. Ragged batches (``ptr`` /
    ``batch``): each block of ``n`` rows (one per leading index) holds ``B``
    structures, and ``seg`` says which (as a flat result index). Exclusion keys
    name rows modulo ``period``: ``n`` for exclusions shared by every
    structure (or of a whole ragged block), ``B n`` for per-structure lists
    of a padded ``(..., B, n, 3)`` batch. ``size``: the number of results,
    ``prod(shape)``.
    """

    shape: tuple
    n: int
    seg: torch.Tensor | None
    period: int
    size: int


class Atoms(NamedTuple):
    """The atoms of one call: ``xyz (M, 3)``, ``radii (M,)``, ``mask (M,)`` bool or None
    (flat, padding zeroed; unflattened as given with ``prepare(flatten=False)``), their
    :class:`Layout`, and the sorted exclusion keys (or None)."""

    xyz: torch.Tensor
    radii: torch.Tensor
    mask: torch.Tensor | None
    layout: Layout
    excl: torch.Tensor | None


def prepare(xyz, radii, mask, exclude=None, depth=3, ptr=None, batch=None, pairs=None, flatten=True) -> Atoms:
    """Validate, broadcast and flatten the inputs of :func:`zmat.clash_loss` into :class:`Atoms`
    (``flatten=False``: ``xyz``, ``radii`` as a tensor and ``mask`` as given); a given
    pair list ``pairs`` is checked too."""
    _check_xyz(xyz)
    *lead, n, _ = xyz.shape
    full = (*lead, n)
    radii = _radii(radii, xyz, full)
    _check_mask(mask, xyz, full)
    layout, excl = _layout(xyz, lead, n, exclude, depth, ptr, batch)
    if pairs is not None:
        _check_pairs(pairs, xyz)
    if not flatten:
        return Atoms(xyz, radii, mask, layout, excl)
    return Atoms(*_flatten(xyz, radii, mask), layout, excl)


def _radii(radii, xyz, full) -> torch.Tensor:
    """``radii`` as a tensor of ``xyz``'s dtype that broadcasts to ``full``."""
    n = full[-1]
    if radii is None:
        raise TypeError(
            "clash_loss: radii is required: a tensor or array-like of shape (N,) or (..., N) "
            "(zmat.vdw_radii(symbols), zmat.clash.alphafold_radii(elements))"
        )
    if isinstance(radii, torch.Tensor) and radii.device != xyz.device:
        raise ValueError(f"clash_loss: radii on {radii.device}, xyz on {xyz.device}")
    try:
        radii = torch.as_tensor(radii, device=xyz.device).to(xyz.dtype)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"clash_loss: radii must be numbers, got {type(radii).__name__}: {e}") from None
    if radii.ndim == 0 or radii.shape[-1] != n or broadcast_shape(radii.shape, full) != full:
        raise ValueError(
            f"clash_loss: radii of shape {tuple(radii.shape)} do not match xyz of shape "
            f"{tuple(xyz.shape)}; expected (N,) or (..., N) with N = {n}"
        )
    return radii


def _check_mask(mask, xyz, full) -> None:
    if mask is None:
        return
    n = full[-1]
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError("clash_loss: mask must be a bool tensor")
    if mask.device != xyz.device:
        raise ValueError(f"clash_loss: mask on {mask.device}, xyz on {xyz.device}")
    if mask.ndim == 0 or mask.shape[-1] != n or broadcast_shape(mask.shape, full) != full:
        raise ValueError(
            f"clash_loss: mask of shape {tuple(mask.shape)} does not match xyz of "
            f"shape {tuple(xyz.shape)}; expected (N,) or (..., N) with N = {n}"
        )


def _check_pairs(pairs, xyz) -> None:
    """A (P, 2) integer pair list on ``xyz``'s device; indices checked where on the host."""
    if not isinstance(pairs, torch.Tensor) or pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"clash_loss: pairs must be a (P, 2) tensor, got {getattr(pairs, 'shape', pairs)}")
    if pairs.dtype.is_floating_point or pairs.dtype.is_complex or pairs.dtype == torch.bool:
        raise TypeError(f"clash_loss: pairs must hold integers, got {pairs.dtype}")
    if pairs.device != xyz.device:
        raise ValueError(f"clash_loss: pairs on {pairs.device}, xyz on {xyz.device}")
    m = xyz.numel() // 3
    if pairs.numel() and on_host(pairs):  # host memory: checking it involves no device
        host = pairs.numpy()
        bad = (host < 0) | (host >= m)
        if bad.any():
            row = int(np.argmax(bad.any(1)))
            raise ValueError(
                f"clash_loss: pairs row {row} = {host[row].tolist()} is out of range [0, {m}) "
                f"(indices into xyz.reshape(-1, 3))"
            )


def _flatten(xyz, radii, mask):
    """``xyz_f (M, 3), radii_f (M,), mask_f (M,) or None``, padding zeroed."""
    full = xyz.shape[:-1]
    m = math.prod(full)
    xyz_f = xyz.reshape(m, 3)
    radii_f = radii.expand(full).reshape(m)
    if mask is None:
        return xyz_f, radii_f, None
    mask_f = mask.expand(full).reshape(m)
    # Padded atoms may hold garbage (NaN): a where, not a product, keeps
    # it out of the values and the gradient.
    return torch.where(mask_f[:, None], xyz_f, 0.0), torch.where(mask_f, radii_f, 0.0), mask_f


def _layout(xyz, lead, n: int, exclude, depth: int, ptr, batch):
    """The :class:`Layout` of ``xyz`` (padded, or ragged by ``ptr``/``batch``) and the
    exclusion keys."""
    dev = xyz.device
    if ptr is None and batch is None:
        excl, period = batch_keys(exclude, tuple(xyz.shape), depth, dev, None)
        return Layout(tuple(lead), n, None, period, math.prod(lead)), excl
    ragged = segments(ptr, batch, n, dev)
    n_lead, seg = math.prod(lead), ragged.index
    if n_lead != 1:
        seg = ((torch.arange(n_lead, device=dev) * ragged.count)[:, None] + seg).reshape(-1)
    excl, period = batch_keys(exclude, tuple(xyz.shape), depth, dev, ragged)
    return Layout((*lead, ragged.count), n, seg, period, n_lead * ragged.count), excl


def _check_xyz(xyz) -> None:
    if not isinstance(xyz, torch.Tensor):
        raise TypeError(f"clash_loss: xyz must be a torch.Tensor, got {type(xyz).__name__}")
    if not xyz.is_floating_point():
        raise TypeError(f"clash_loss: xyz must be a float tensor, got {xyz.dtype}")
    if xyz.ndim < 2 or xyz.shape[-1] != 3:
        raise ValueError(f"clash_loss: xyz must have shape (..., N, 3), got {tuple(xyz.shape)}")
