"""Fresh / cached ratios of a protein training step and of ``atom14_from_frames``,
interleaved in one process (issue 33, item 2).

    python -m benchmarks.fresh_ratios             # quick: ~1 min on 2 idle cores
    python -m benchmarks.fresh_ratios --reps 30   # more pairs, tighter spreads
    python -m benchmarks.fresh --sections ratios  # the same as a section of ``--suite fresh``

Each repetition times one *fresh* call and then one *cached* call right after it,
so that a load swing on a shared machine hits both alike; the ratio is taken per
pair, and the tables give its median and spread (min-max over pairs) beside the
medians of each call. Every call is timed in wall seconds and in process CPU
seconds (``time.process_time``: all threads of this process). The process runs
with the allocator settings of every benchmark child (``benchmarks/run.py``:
large blocks reused, not handed back to the system).

How to read it: on a loaded machine the wall times swing, and the per-pair
ratios at one thread (wall and CPU) are what to trust; at several threads the
CPU time also counts the threads' spinning while they wait for a descheduled
partner, so a loaded machine's CPU ratios there are not the work's. On an idle
machine the wall ratio at torch's default thread count is the figure the
issue's target is about.

Rows, at torch's default thread count and at one thread:

* ``step``: 16 new random sequences x 1,000 residues: ``ProteinBatch(seqs)``,
  then ``batch.to_xyz(torsions)`` forward and backward (gradient of ones);
  cached: the same step again on that batch.
* ``step, DataLoader``: the batch made ahead (as a ``DataLoader`` worker makes
  it: ``ProteinBatch(seqs).prepare()`` and a pickle round trip, outside the
  timer), then the step; cached as above.
* ``atom14``: ``atom14_from_frames`` forward (no grad) on 16 x 1,000 residues of
  a new random sequence every call (more sequences than any cache holds);
  cached: the same sequence again.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time

import numpy as np

from .sections import AMINO, table

PAIRS = ("step", "step, DataLoader", "atom14")


def _clock():
    return time.perf_counter(), time.process_time()


def _timed(fn, x) -> tuple:
    """``fn(x)``, its wall and process CPU seconds."""
    w0, c0 = _clock()
    y = fn(x)
    w1, c1 = _clock()
    return y, w1 - w0, c1 - c0


def _sequences(rng, n_seq: int, length: int) -> list[str]:
    return ["".join(rng.choice(list(AMINO), length)) for _ in range(n_seq)]


def _cases(n_seq: int, length: int, seed: int) -> dict:
    """``name -> (make, fresh, cached)``: per pair ``x = make()`` (untimed), then
    the timed calls ``y = fresh(x)`` and ``cached(y)``."""
    import torch

    import zmat.protein as zp

    rng = np.random.default_rng(seed)
    tors = torch.from_numpy(rng.uniform(-3, 3, (n_seq, length, 7))).float().requires_grad_(True)

    def step(batch):
        x = batch.to_xyz(tors)
        torch.autograd.grad(x, tors, torch.ones_like(x))
        return batch

    def ready():  # a DataLoader worker's batch: made there, pickled to the main process
        batch = zp.ProteinBatch(_sequences(rng, n_seq, length))
        return pickle.loads(pickle.dumps(getattr(batch, "prepare", lambda: batch)()))

    R = torch.linalg.qr(torch.from_numpy(rng.normal(size=(n_seq, length, 3, 3))))[0].float()
    t = torch.from_numpy(rng.normal(size=(n_seq, length, 3)) * 10).float()
    c = tors.detach()

    def atom14(aa):
        with torch.no_grad():
            zp.atom14_from_frames(R, t, aa, c)
        return aa

    return {
        "step": (lambda: _sequences(rng, n_seq, length), lambda s: step(zp.ProteinBatch(s)), step),
        "step, DataLoader": (ready, step, step),
        "atom14": (lambda: torch.from_numpy(rng.integers(0, 20, (n_seq, length))), atom14, atom14),
    }


def _pairs(case, reps: int) -> np.ndarray:
    """``(reps, 4)``: fresh wall, fresh cpu, cached wall, cached cpu, interleaved."""
    make, fresh, cached = case
    out = []
    for _ in range(reps):
        y, fw, fc = _timed(fresh, make())
        _, cw, cc = _timed(cached, y)
        out.append((fw, fc, cw, cc))
    return np.array(out)


def _record(name: str, threads: int, a: np.ndarray) -> dict:
    rec = {"section": "ratios", "case": name, "threads": threads, "pairs": len(a)}
    for i, key in enumerate(("fresh wall", "fresh cpu", "cached wall", "cached cpu")):
        rec[key] = float(np.median(a[:, i]))
    for what, f, c in (("wall", 0, 2), ("cpu", 1, 3)):
        r = a[:, f] / a[:, c]
        rec[f"{what} ratio"] = float(np.median(r))
        rec[f"{what} min-max"] = f"{r.min():.2f}-{r.max():.2f}"
    return rec


def run(reps=8, n_seq=16, length=1000, seed=0, threads=None, rows=PAIRS) -> list[dict]:
    """The ``rows`` (module docstring) at each of ``threads`` (default: torch's and 1)."""
    import torch

    default = torch.get_num_threads()
    cases = _cases(n_seq, length, seed)
    out = []
    for th in threads or sorted({default, 1}, reverse=True):
        torch.set_num_threads(th)
        for name in rows:
            _pairs(cases[name], 1)  # warm: first calls, allocator
            out.append(_record(name, th, _pairs(cases[name], reps)))
    torch.set_num_threads(default)
    return out


def main(argv=None) -> int:
    doc = __doc__.split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m benchmarks.fresh_ratios", description=doc)
    p.add_argument("--reps", type=int, default=8, help="interleaved pairs per row (default 8)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=1000)
    p.add_argument("--threads", type=int, nargs="+", help="thread counts (default: torch's default and 1)")
    p.add_argument("--rows", nargs="+", choices=PAIRS, default=PAIRS, metavar="ROW", help=f"of {PAIRS}")
    a = p.parse_args(argv)
    from .run import ALLOCATOR_ENV

    if any(os.environ.get(k) != v for k, v in ALLOCATOR_ENV.items()):  # the runner's allocator settings
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.fresh_ratios", *sys.argv[1:]],
                  {**os.environ, **ALLOCATOR_ENV})  # fmt: skip
    t0 = time.perf_counter()
    records = run(a.reps, a.batch, a.length, threads=a.threads, rows=a.rows)
    print(table(records))
    print(f"\n({time.perf_counter() - t0:.0f} s; ratios per interleaved pair, median and min-max)")
    return 0


if __name__ == "__main__":
    sys.exit(main(None if len(sys.argv) > 1 else []))
