"""Per-device plans of an object: built once per name, dtype and device, then kept.

The torsion-space routes (:mod:`zmat._rigid_torsions`, :mod:`zmat._table_torsions`)
keep their index tensors and constants here, beside the data they are made of;
a construction table keeps its own in :meth:`zmat.ConstructionTable.cached`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["DevicePlans"]

T = TypeVar("T")


class DevicePlans:
    """A dict of plans keyed by ``(name, dtype, device)``, each built on first use."""

    __slots__ = ("_plans",)

    def __init__(self) -> None:
        self._plans: dict = {}

    def get(self, name: str, dtype: torch.dtype, device: torch.device, build: Callable[[], T]) -> T:
        """``build()``, called once for ``(name, dtype, device)`` and kept."""
        key = (name, dtype, device)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = build()
        return plan
