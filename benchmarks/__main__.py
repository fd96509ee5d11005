"""``python -m benchmarks``: compare every z-matrix -> Cartesian implementation.

With no arguments: the quick suite (a few minutes on a 2-core CPU), on the
CPU and on CUDA when present, in float32. Prints a table per problem (median
time per call, per structure, ratio to the fastest, first call, peak extra
memory) and writes ``results.json``, ``results.png``, ``table.txt``,
``table.md`` (every row) and ``summary.md`` (one row per problem, one column
per implementation) into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

import zmat

from . import fresh, peers, report
from .registry import IMPLS, MODES
from .run import ALLOCATOR_ENV, expand, run
from .suites import BUDGETS, REPEAT_TIME, SCRIPTS, SUITES

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "benchmarks"

EPILOG = """\
implementations:
{impls}

suites: {suites} (see benchmarks/suites.py); --full is --suite full.

Times are medians over warm calls (a cold first call is made and reported
apart; a call slower than half the budget is timed once, cold), in a child
process whose glibc keeps freed memory for reuse (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_). Peak memory is the extra memory of one warm call,
inputs excluded: peak resident memory (VmHWM after malloc_trim) on the CPU,
torch.cuda.max_memory_allocated on CUDA. Sizes whose extrapolated time exceeds
--budget are skipped and say so.

examples:
  python -m benchmarks                                   # quick comparison
  python -m benchmarks --full                            # the whole grid (long)
  python -m benchmarks --impl 'zmat-*' --cases chain --sizes 1000 10000 --batch 1 64
  python -m benchmarks --device cuda --dtype float32 float64
"""


def _machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "zmat": zmat.__version__,
        "mp_nerf": peers.version("mp_nerf"),
        "chemcoord": peers.version("chemcoord"),
    }
    if torch.cuda.is_available():
        info["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def parse(argv=None) -> argparse.Namespace:
    impls = "\n".join(f"  {n:17s} {i.summary}" for n, i in IMPLS.items())
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog=EPILOG.format(impls=impls, suites=", ".join(SUITES)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--suite",
        choices=[*SUITES, *SCRIPTS],
        default="quick",
        help="which grid to run (default: quick); "
        + ", ".join(f"{k} runs python -m {v} with the other arguments" for k, v in SCRIPTS.items()),
    )
    p.add_argument("--full", action="store_true", help="the full grid (same as --suite full)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    p.add_argument(
        "--device",
        nargs="+",
        default=None,
        metavar="DEV",
        help="devices: cpu, cuda, cuda:1 ... (default: cpu, and cuda when available)",
    )
    p.add_argument(
        "--dtype",
        nargs="+",
        default=["float32"],
        choices=["float32", "float64"],
        help="dtypes (default: float32; chemcoord always computes in float64)",
    )
    p.add_argument("--cases", nargs="+", choices=list(report.CASES), help="only these cases")
    p.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        metavar="N",
        help="override the sizes of every series (atoms for chain/molecules, residues for proteins)",
    )
    p.add_argument("--batch", nargs="+", type=int, metavar="B", help="override the batch sizes")
    p.add_argument("--impl", nargs="+", metavar="NAME", help="implementations: names or globs ('zmat-*')")
    p.add_argument("--modes", nargs="+", choices=MODES, help="fwd and/or fwd+bwd (default: both)")
    p.add_argument(
        "--budget",
        type=float,
        help="seconds per record (cold call + timed calls) above which a size is skipped "
        f"(default per suite: {', '.join(f'{k} {v:g}' for k, v in BUDGETS.items())})",
    )
    p.add_argument(
        "--repeat-time",
        type=float,
        help="seconds of warm timed calls per record, after the cold call "
        f"(default per suite: {', '.join(f'{k} {v:g}' for k, v in REPEAT_TIME.items())})",
    )
    p.add_argument("--repeats", type=int, default=25, help="most warm timed calls per record (default 25)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-fresh", action="store_true", help="skip the training-step sections (fresh batch, latency, ...)"
    )
    p.add_argument("--list", action="store_true", help="list the tasks and exit")
    p.add_argument(
        "--render",
        type=Path,
        metavar="DIR",
        help="run nothing: redraw the tables and plot from DIR/results.json",
    )
    a = p.parse_args(argv)
    if a.full:
        a.suite = "full"
    if a.device is None:
        a.device = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for d in a.device:
        if d.startswith("cuda") and not torch.cuda.is_available():
            p.error(f"--device {d}: CUDA is not available here")
    return a


def _script_suite(argv: list[str]) -> str | None:
    """The suite named by ``--suite X`` if it is one of the standalone scripts."""
    for i, x in enumerate(argv):
        name = argv[i + 1] if x == "--suite" and i + 1 < len(argv) else x.partition("--suite=")[2]
        if name in SCRIPTS:
            return name
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    script = _script_suite(argv)
    if script is not None:
        rest = [x for x in argv if x not in ("--suite", script, f"--suite={script}")]
        importlib.import_module(SCRIPTS[script]).main(rest)
        return 0
    a = parse(argv)
    if a.render:
        data = json.loads((a.render / "results.json").read_text())
        text, _ = report.write_outputs(a.render, data["records"])
        print(text)
        return 0
    try:
        tasks = expand(
            SUITES[a.suite],
            a.device,
            a.dtype,
            a.budget or BUDGETS[a.suite],
            a.repeats,
            a.repeat_time or REPEAT_TIME[a.suite],
            impls=a.impl,
            cases=a.cases,
            sizes=a.sizes,
            batches=a.batch,
            modes=a.modes,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.list:
        for t in tasks:
            print(f"{t.impl:17s} {t.case:12s} {t.size:>7} x{t.batch:<5} {t.dtype} {t.device} {t.mode}")
        return 0
    sections = fresh.SUITE_SECTIONS.get(a.suite, ()) if not (a.impl or a.cases or a.no_fresh) else ()
    if not tasks and not sections:
        print("error: no task matches these options", file=sys.stderr)
        return 2
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "suite": a.suite,
        "argv": sys.argv[1:] if argv is None else list(argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "memory": "CPU: peak resident memory above the inputs during one warm call (VmHWM after "
        "malloc_trim(0) and clear_refs); CUDA: max_memory_allocated above the inputs",
        "allocator": ALLOCATOR_ENV,
    }
    print(
        f"zmat benchmarks, suite {a.suite!r}: {len(tasks)} tasks on {meta['machine']['cpu']} "
        f"({meta['machine']['cores']} cores, {meta['machine']['torch_threads']} torch threads)"
        + (f", {', '.join(meta['machine']['cuda'])}" if "cuda" in meta["machine"] else ""),
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    records: list[dict] = []

    def save(rec):
        records.append(rec)
        report.write_json(out / "results.json", {**meta, "complete": False}, records)

    if tasks:
        run(tasks, out, on_record=save, progress=not a.no_progress)
    extra = ""
    if sections:  # the training-step sections (benchmarks/fresh.py), in their own process
        print(f"training-step sections: {', '.join(sections)} ...", file=sys.stderr)
        train = fresh.run_child(sections, quick=a.suite != "fresh")
        meta["fresh"] = train
        (out / "fresh.md").write_text(fresh.markdown(train) + "\n")
        extra = "\n" + fresh.table(train)
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["complete"] = True
    report.write_json(out / "results.json", meta, records)
    text, plotted = report.write_outputs(out, records) if records else ("", False)
    print(text + extra)
    print(
        f"\nwall time {meta['wall_s']:.0f} s; wrote {out / 'results.json'}, {out / 'table.md'}, "
        f"{out / 'summary.md'}" + (f", {out / 'results.png'}" if plotted else " (nothing to plot)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
