"""Mixed precision: zmat's transforms and losses compute in float32 under autocast.

Placing atoms composes thousands of rotations and the clash loss subtracts
nearby coordinates: in float16/bfloat16 both lose the geometry (bfloat16 has
8 bits of mantissa, a 0.4 A step at 100 A). Under ``torch.autocast`` the
decorated functions therefore run with autocast disabled and with
float16/bfloat16 tensor arguments upcast to float32; float32 and float64
inputs are left as they are. Outputs are then float32 (or float64), and the
caller's autocast region picks up again after the call. Device-agnostic: the
device type is the first argument's.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["float32_under_autocast"]

_LOW = (torch.float16, torch.bfloat16)


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know ("meta"): never on
        return False
    except TypeError:  # torch < 2.4: no device_type argument
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return device_type == "cuda" and torch.is_autocast_enabled()


def _up(x):
    if isinstance(x, torch.Tensor) and x.dtype in _LOW:
        return x.float()
    return x


def float32_under_autocast(fn):
    """Decorator: run ``fn`` in float32 when autocast is on for its first argument's device."""

    @functools.wraps(fn)
    def wrapper(x, *args, **kwargs):
        device_type = x.device.type if isinstance(x, torch.Tensor) else "cpu"
        if not _autocast_enabled(device_type):
            return fn(x, *args, **kwargs)
        with torch.autocast(device_type, enabled=False):
            args = [_up(a) for a in args]
            kwargs = {k: _up(v) for k, v in kwargs.items()}
            return fn(_up(x), *args, **kwargs)

    return wrapper
