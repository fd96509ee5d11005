"""Run a grid: tasks in a child process, per-record time budgets, a progress bar.

Sizes run in increasing order within each series (implementation, case,
batch, dtype, device, mode). Before a task runs, its time is extrapolated
from the previous size of the same series (``t * (n / n_prev) ** p``, ``p``
the implementation's growth exponent, or the growth measured over the last
two sizes if that is steeper, up to 3) or, for the first size, from the
implementation's rough a-priori estimate; if that exceeds the budget the task
is recorded as ``skipped: too slow (extrapolated X s per call)``, unless its
series is ``force``d (a README claim rests on it). A task that still runs
past ``max(30, 3 * budget)`` seconds (30 minutes if forced) is killed (its
worker is restarted) and recorded as skipped too.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .registry import IMPLS, MODES
from .registry import select as select_impls
from .suites import Series

__all__ = ["Task", "expand", "run"]

ROOT = Path(__file__).resolve().parent.parent
#: glibc keeps freed memory for reuse (like PyTorch's CUDA caching allocator, or jemalloc), so
#: that times measure computation, not first-touch page faults (very slow in some VMs: 10x here)
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


@dataclass(frozen=True)
class Task:
    impl: str
    case: str
    size: int
    batch: int
    dtype: str
    device: str
    mode: str
    budget: float
    max_repeats: int
    repeat_time: float
    force: bool = False

    @property
    def problem(self):
        return (self.case, self.size, self.batch)

    @property
    def series(self):
        return (self.impl, self.case, self.batch, self.dtype, self.device, self.mode)


def expand(
    series: list[Series],
    devices: list[str],
    dtypes: list[str],
    budget: float,
    max_repeats: int,
    repeat_time: float,
    impls: list[str] | None = None,
    cases: list[str] | None = None,
    sizes: list[int] | None = None,
    batches: list[int] | None = None,
    modes: list[str] | None = None,
) -> list[Task]:
    """The tasks of a suite, deduplicated, grouped by problem, sizes ascending.

    Implementations are only paired with the cases they apply to (mp_nerf:
    proteins; chemcoord: not ``protein-mix``).
    """
    wanted = set(select_impls(impls))
    tasks: dict[tuple, Task] = {}
    for s in series:
        if cases and s.case not in cases:
            continue
        names = [
            n
            for n in select_impls(list(s.impls) if s.impls else None)
            if n in wanted and s.case in IMPLS[n].cases
        ]
        for dev, dt, b, n, name, mode in itertools.product(
            devices, dtypes, batches or s.batches, sizes or s.sizes, names, modes or s.modes
        ):
            t = Task(name, s.case, n, b, dt, dev, mode, s.budget or budget, max_repeats, repeat_time, s.force)
            key = (name, s.case, n, b, dt, dev, mode)
            if key in tasks:  # the same task in two series: the more permissive one
                old = tasks[key]
                t = replace(t, budget=max(t.budget, old.budget), force=t.force or old.force)
            tasks[key] = t
    impl_rank = {n: i for i, n in enumerate(IMPLS)}
    case_rank = {s.case: i for i, s in reversed(list(enumerate(series)))}
    return sorted(
        tasks.values(),
        key=lambda t: (
            t.device,
            t.dtype,
            case_rank[t.case],
            t.batch,
            t.size,
            impl_rank[t.impl],
            MODES.index(t.mode),
        ),
    )


# ------------------------------------------------------------------ worker
class WorkerError(RuntimeError):
    pass


class Worker:
    """A ``python -m benchmarks.worker`` child; restarted after a crash or timeout."""

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        env = {**os.environ, **ALLOCATOR_ENV}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env.setdefault("PYTHONWARNINGS", "ignore")
        self.log = open(self.log_path, "a")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=ROOT,
            env=env,
        )

    def request(self, obj: dict, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise WorkerError(f"timed out after {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            self.close()
            hint = " (killed: out of memory?)" if rc in (-9, 137) else ""
            raise WorkerError(f"worker exited with code {rc}{hint}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.log.close()


# -------------------------------------------------------------- the loop
def _extrapolate(task: Task, atoms: int, history: dict) -> float | None:
    """Seconds one call of ``task`` should take, from its series so far (or a rough model)."""
    impl = IMPLS[task.impl]
    p = impl.exponent.get(task.mode, 1.0)
    est = None
    pts = history.get(task.series, [])
    if pts:
        measured = [(n, t) for n, t, ok in pts if ok and t > 0]
        if len(measured) >= 2 and measured[-1][0] > measured[-2][0]:  # the growth seen so far
            (n0, t0), (n1, t1) = measured[-2:]
            p = max(p, min(3.0, math.log(t1 / t0) / math.log(n1 / n0)))
        n1, t1, _ = pts[-1]
        est = t1 * (task.size / n1) ** p
    elif impl.estimate is not None:
        est = impl.estimate(atoms, task.batch, task.mode)
    if task.mode != "fwd":  # never cheaper than the forward alone
        fwd = history.get((task.impl, task.case, task.batch, task.dtype, task.device, "fwd"), [])
        if fwd and fwd[-1][0] == task.size:
            est = max(est or 0.0, fwd[-1][1])
    return est


def run(tasks: list[Task], out: Path, on_record=None, progress: bool = True) -> list[dict]:
    """Run ``tasks``; call ``on_record(record)`` after each; return the records."""
    from tqdm.auto import tqdm

    out.mkdir(parents=True, exist_ok=True)
    worker = Worker(out / "worker.log")
    records: list[dict] = []
    history: dict = {}  # series -> [(size, seconds, measured)] of the sizes run or extrapolated
    built: dict = {}
    bar = tqdm(total=len(tasks), disable=not progress, unit="task", dynamic_ncols=True, file=sys.stderr)

    def emit(task: Task, rec: dict) -> None:
        records.append(rec)
        if rec["status"].startswith("skipped") and "too slow" in rec["status"]:
            bar.write(
                f"  skipped {task.impl} on {task.case} {task.size} x{task.batch} {task.mode}: "
                f"{rec['status'][len('skipped: ') :]}"
            )
        if on_record:
            on_record(rec)
        bar.update(1)

    try:
        for problem, group in itertools.groupby(tasks, key=lambda t: t.problem):
            group = list(group)
            bar.set_description(f"{problem[0]} {problem[1]} x{problem[2]}")
            if problem not in built:
                req = {"op": "build", "case": problem[0], "size": problem[1], "batch": problem[2]}
                try:
                    built[problem] = worker.request(req, timeout=600)
                except WorkerError as e:
                    built[problem] = {"ok": False, "status": f"failed: building the case: {e}"}
                if not built[problem].get("ok"):
                    bar.write(f"  {problem[0]} {problem[1]}: {built[problem]['status']}")
            info = built[problem]
            for task in group:
                rec = {k: v for k, v in task.__dict__.items()}
                if not info.get("ok"):
                    emit(task, {**rec, "status": info["status"]})
                    continue
                why = IMPLS[task.impl].unavailable(task.case, task.device)
                if why:
                    emit(task, {**rec, "status": f"skipped: {why}"})
                    continue
                est = _extrapolate(task, info["atoms"], history)
                if est is not None and est > task.budget and not task.force:
                    history.setdefault(task.series, []).append((task.size, est, False))
                    emit(task, {**rec, "status": f"skipped: too slow (extrapolated {est:.3g} s per call)"})
                    continue
                bar.set_postfix_str(f"{task.impl} {task.mode}", refresh=True)
                timeout = 1800.0 if task.force else max(30.0, 3 * task.budget)
                t0 = time.perf_counter()
                try:
                    res = worker.request(task.__dict__, timeout=timeout)
                except WorkerError as e:
                    res = {**rec, "status": f"skipped: {e}"}
                    history.setdefault(task.series, []).append((task.size, timeout, False))
                else:
                    seconds = res.get("call_s") or res.get("elapsed_s") or (time.perf_counter() - t0)
                    history.setdefault(task.series, []).append((task.size, seconds, "median_s" in res))
                res.pop("ok", None)
                res["wall_s"] = round(time.perf_counter() - t0, 3)
                emit(task, res)
    finally:
        bar.close()
        worker.close()
    return records
