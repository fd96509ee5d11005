"""One timed measurement, in a child process (``python -m benchmarks.worker``).

Protocol: one JSON request per line on stdin, one JSON reply per line on the
original stdout (library prints go to stderr). The runner starts it with
glibc told to keep freed memory for reuse (``run.ALLOCATOR_ENV``), so that the
timed calls measure computation rather than first-touch page faults.

Memory is measured on one more warm call after the timed ones (on the cold
call when that was the only one):

* CPU: ``malloc_trim(0)`` first gives every free heap page back to the
  system and ``/proc/self/clear_refs`` resets the high-water mark; the record
  is ``VmHWM`` after the call minus ``VmRSS`` before it: the extra resident
  memory the call needed, inputs excluded, allocator overhead (fragmentation)
  included ("rss-peak"). Below ~64 kB it is not resolved.
* CUDA: ``torch.cuda.max_memory_allocated()`` after
  ``reset_peak_memory_stats()``, minus the allocated memory before the call
  ("cuda-max-allocated").
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import os
import re
import statistics
import sys
import time
import traceback

import torch

from zmat.testing import DispatchAudit

from . import cases
from .registry import IMPLS, Unsupported

# ------------------------------------------------------------------ memory
_STATUS = "/proc/self/status"


def _kib(key: str) -> int | None:
    try:
        with open(_STATUS) as f:
            m = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def _trim() -> None:
    """Give free heap pages back to the system (glibc), so that reusing them shows in the RSS."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Memory:
    """Peak extra memory of the calls made between :meth:`start` and :meth:`stop`."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.method = "cuda-max-allocated" if self.cuda else "rss-peak"

    def start(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            _trim()
            self.ok = _reset_hwm()
            self.base = _kib("VmRSS")

    def stop(self) -> int | None:
        if self.cuda:
            torch.cuda.synchronize()
            return max(0, torch.cuda.max_memory_allocated() - self.base)
        hwm = _kib("VmHWM")
        if not self.ok or hwm is None or self.base is None:
            return None
        return max(0, hwm - self.base) * 1024


# ------------------------------------------------------------------ timing
#: count dispatched ops (one more call, under a Python dispatch mode) for calls faster than this
OPS_MAX_S = 0.05


def _repeats(first: float, budget: float, max_repeats: int, repeat_time: float) -> int:
    """How many warm calls to time after a cold call that took ``first`` seconds.

    As many as fit in ``repeat_time`` seconds (at least 1, at most
    ``max_repeats``); none when the cold call took half the budget already.
    """
    if first >= budget / 2:
        return 0  # slow: the cold call is the measurement
    return int(max(1, min(max_repeats, repeat_time / max(first, 1e-9))))


def _error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def measure(task: dict) -> dict:
    rec = dict(task)
    impl = IMPLS[task["impl"]]
    device = torch.device(task["device"])
    dtype = getattr(torch, task["dtype"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    problem = cases.make(task["case"], task["size"], task["batch"])
    rec.update(atoms=problem.atoms, residues=problem.residues, source=problem.note)
    try:
        prep = impl.prepare(problem, device, dtype, task["mode"])
        gc.freeze()  # the peers' imports, once
    except Unsupported as e:
        return {**rec, "status": f"skipped: {e}"}
    rec["note"] = prep.note
    mem = Memory(device)
    rec["memory"] = mem.method
    start = time.perf_counter()
    try:
        mem.start()
        t0 = time.perf_counter()
        (prep.first or prep.call)()
        sync()
        first = time.perf_counter() - t0
        peak = mem.stop()
        n = _repeats(first, task["budget"], task["max_repeats"], task["repeat_time"])
        if task.get("force"):  # a claim rests on it: time a warm call, however slow
            n = max(n, 1)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            prep.call()
            sync()
            times.append(time.perf_counter() - t0)
        if n:  # memory: one more (untimed) warm call, from a trimmed heap
            mem.start()
            prep.call()
            peak = mem.stop()
        if impl.group == "zmat" and times and statistics.median(times) < OPS_MAX_S:
            with DispatchAudit() as audit:  # dispatched aten ops of one warm call (fwd+bwd: both)
                prep.call()
            rec["ops"] = audit.count
    except Exception as e:
        elapsed = time.perf_counter() - start
        return {
            **rec,
            "status": f"failed: {_error(e)}",
            "elapsed_s": elapsed,
            "error": traceback.format_exc(limit=3),
        }
    if not times:  # slow: the cold call is the measurement (its memory too)
        times = [first]
        rec["note"] = ", ".join(filter(None, [prep.note, "one cold call (slow)"]))
    s = prep.scale
    rec.update(
        status="ok",
        median_s=statistics.median(times) * s,
        call_s=statistics.median(times),  # what one call took (for a scaled subset, the subset)
        first_s=first * s,
        times_s=[t * s for t in times],
        repeats=len(times),
        peak_bytes=peak,  # a per-structure loop (scaled) peaks like one structure
    )
    return rec


def main() -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by libraries goes to the log, not the protocol
    sys.stdout = sys.stderr
    try:  # zmat's compiled CPU kernel: loaded (built once per machine) here, not in a timed cold call
        from zmat import _kernel

        _kernel.load()
    except ImportError:  # a zmat from before the kernel
        pass
    gc.freeze()  # what is alive now is never garbage: keeps gc.collect() before each record cheap
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req.get("op") == "build":
                t0 = time.perf_counter()
                p = cases.make(req["case"], req["size"], req["batch"])
                reply = {"ok": True, "seconds": time.perf_counter() - t0, "atoms": p.atoms, "note": p.note}
                gc.collect()
                gc.freeze()
            else:
                reply = measure(req)
        except cases.Unavailable as e:
            reply = {**req, "ok": False, "status": f"skipped: {e}"}
        except Exception as e:
            reply = {**req, "ok": False, "status": f"failed: {_error(e)}", "error": traceback.format_exc()}
        reply = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in reply.items()}
        proto.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
