"""One timing helper for the suites that time callables in-process (torsions, flows)."""

from __future__ import annotations

import statistics
import time


def median_seconds(fn, repeat: float) -> float:
    """Median seconds of warm calls of ``fn`` (one cold call first), at least 3 calls,
    for about ``repeat`` seconds."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < repeat:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
