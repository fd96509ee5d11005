"""The per-pair penalty of :func:`zmat.clash_loss` (formulas in :mod:`zmat.clash`).

One input, one output: pair distances ``d`` and contact distances ``c`` (same
shape) give penalties ``p`` (:func:`penalty`, differentiable;
:func:`penalty_grad`, its analytic first derivatives for the serial path).
:func:`pair_penalties` is the stage of the pipeline: a pair list on the flat
atoms in, one penalty per pair out.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .._geometry import safe_norm

__all__ = ["KINDS", "Penalty", "TAILED", "pair_penalties", "penalty", "penalty_grad"]

KINDS = ("flat_bottom", "flat_bottom_squared", "softplus", "soft_count", "lennard_jones")
TAILED = ("softplus", "soft_count")  # kinds whose default tail is 10 temperatures


class Penalty(NamedTuple):
    kind: str
    tolerance: float
    temperature: float
    tail: float
    cap: float


def penalty(pen: Penalty, d, c):
    """Per-pair penalty for distances ``d`` and contact distances ``c``."""
    o = c - d
    kind, temperature, tail, cap = pen.kind, pen.temperature, pen.tail, pen.cap
    if kind == "flat_bottom":
        return F.relu(o)
    if kind == "flat_bottom_squared":
        return F.relu(o) ** 2
    if kind == "softplus":
        floor = temperature * math.log1p(math.exp(-tail / temperature))
        p = F.softplus(o, beta=1.0 / temperature) - floor
        return torch.where(o > -tail, p, 0.0)
    if kind == "soft_count":
        z = math.exp(-tail / temperature)  # sigmoid(-tail / T), overflow-free
        floor = z / (1.0 + z)
        return torch.where(o > -tail, torch.sigmoid(o / temperature) - floor, 0.0)
    # lennard_jones: capped WCA repulsion, well depth 1.
    clash = (c > 0) & (d < c)
    c_safe = torch.where(c > 0, c, 1.0)  # keeps the unused branch finite
    d_cap = c_safe * (1.0 + math.sqrt(cap)) ** (-1.0 / 6.0)
    d_eff = torch.maximum(d, d_cap)
    x = (c_safe / d_eff) ** 6
    slope = -12.0 * (x - 1.0) * x / d_eff  # dp/dd at d_eff
    # For d >= d_cap the second term is 0; below it, the tangent at d_cap.
    p = (x - 1.0) ** 2 + slope * (d - d_eff)
    return torch.where(clash, p, 0.0)


def penalty_grad(pen: Penalty, d, c):
    """``(dp/dd, dp/dc)`` of :func:`penalty`."""
    o = c - d
    if pen.kind == "lennard_jones":  # see penalty; the capped part is its tangent at d_cap = k c
        clash = (c > 0) & (d < c)
        c_safe = torch.where(c > 0, c, 1.0)
        d_cap = c_safe * (1.0 + math.sqrt(pen.cap)) ** (-1.0 / 6.0)
        d_eff = torch.maximum(d, d_cap)
        x = (c_safe / d_eff) ** 6
        g = 12.0 * (x - 1.0) * x
        g_c = g / c_safe * torch.where(d < d_cap, d / d_cap, 1.0)
        return torch.where(clash, -g / d_eff, 0.0), torch.where(clash, g_c, 0.0)
    if pen.kind == "flat_bottom":
        s = (o > 0).to(o.dtype)
    elif pen.kind == "flat_bottom_squared":
        s = 2.0 * F.relu(o)
    elif pen.kind == "softplus":
        z = o / pen.temperature  # F.softplus is linear above its threshold, 20
        s = torch.where(o > -pen.tail, torch.where(z > 20.0, 1.0, torch.sigmoid(z)), 0.0)
    else:  # soft_count
        q = torch.sigmoid(o / pen.temperature)
        s = torch.where(o > -pen.tail, q * (1.0 - q) / pen.temperature, 0.0)
    return -s, s


def pair_penalties(xyz_f, radii_f, i, j, keep, pen: Penalty):
    """Per-pair penalties ``(P,)`` of pairs ``(i, j)`` of the flat atoms ``xyz_f (M, 3)``,
    ``radii_f (M,)``; zero where ``keep`` (``(P,)`` bool, or None) is False."""
    # index_select, whose backward is an index_add: no sync on any device.
    # safe_norm's zero threshold (1e-24 in float64, 1e-12 in float32, on the
    # squared distance) only affects coincident atoms: value 0, gradient 0.
    d = safe_norm(xyz_f.index_select(0, i) - xyz_f.index_select(0, j))
    c = radii_f.index_select(0, i) + radii_f.index_select(0, j) - pen.tolerance
    p = penalty(pen, d, c)
    return p if keep is None else torch.where(keep, p, 0.0)
