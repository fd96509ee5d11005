"""The grids: which cases, sizes, batches and implementations each suite runs.

* ``quick`` (the default): every implementation on a 12-atom chain (batch 1,
  where the seed finite-difference backward can run), chains of 100 and 1,000
  atoms (batch 16), a 30-atom molecule x 1,024 conformers, and proteins of
  129 and ~1,000 residues. About 70 s on a 2-core CPU.
* ``methods``: the zmat methods side by side (chains of 1k/10k/100k atoms at
  batch 1 and 64, a ~500-residue protein at batch 1 and 16, a 4,000-atom chain
  at batch 16 against the seed ``torch.cat`` loop, 16 different ~1,000-residue
  sequences in one batch).
* ``targets``: what the README's claims rest on (a ~1,000-residue protein vs
  mp_nerf, an 8,000-atom chain at batch 16 vs the seed ``torch.cat`` loop,
  molecule batches vs chemcoord's kernel).
* ``full``: all of the above, plus every implementation on proteins of
  100-2,000 residues and molecules of 20-60 atoms. Long (about 20 minutes on
  a 2-core CPU; slow implementations are skipped where they would blow the
  per-call budget).
* ``tiny``: a smoke test (seconds) used by ``tests/test_benchmarks.py``.
* ``fresh``: no grid; every section of ``benchmarks/fresh.py`` (fresh-batch
  training steps, batch-1 latency and ops per call, a busy machine, scaling).
  ``quick`` runs its ``fresh`` and ``latency`` sections, shortened.
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import MODES

__all__ = ["BUDGETS", "REPEAT_TIME", "SUITES", "Series"]

ZMAT = ("zmat-*",)


@dataclass(frozen=True)
class Series:
    case: str
    sizes: tuple[int, ...]
    batches: tuple[int, ...]
    impls: tuple[str, ...] | None = None  # patterns; None = every implementation
    modes: tuple[str, ...] = MODES
    budget: float | None = None  # seconds per record; None = the suite's
    force: bool = False  # run even if extrapolated past the budget (what a README claim rests on)


QUICK = [
    Series("chain", (12,), (1,)),  # the only size where the seed finite-difference backward runs
    Series("chain", (100, 1000), (16,)),
    Series("molecules", (30,), (1024,)),
    Series("protein", (129, 1000), (1,)),
]
METHODS = [
    Series("chain", (1000, 10000, 100000), (1, 64), ZMAT),
    Series("protein", (500,), (1, 16), ZMAT),
    Series("chain", (4000,), (16,), ZMAT, ("fwd+bwd",)),
    Series("chain", (4000,), (16,), ("seed-cat",), ("fwd+bwd",), force=True),
    Series("protein-mix", (1000,), (16,), ZMAT + ("mp_nerf*",), budget=60),
]
TARGETS = [
    Series("protein", (1000,), (1,), ZMAT + ("mp_nerf*",)),
    Series("chain", (8000,), (16,), ZMAT, ("fwd+bwd",)),
    Series("chain", (8000,), (16,), ("seed-cat",), ("fwd+bwd",), force=True),
    Series("molecules", (20, 40, 60), (16, 4096), ZMAT + ("chemcoord*",)),
]
FULL = [
    *QUICK,
    *METHODS,
    *TARGETS,
    Series("chain", (1000, 10000, 100000), (1, 64)),
    Series("chain", (1000, 2000, 4000, 8000), (16,)),
    Series("molecules", (20, 40, 60), (4096,)),
    Series("protein", (100, 250, 500, 1000, 2000), (1, 16)),
]
TINY = [
    Series("chain", (8, 16), (2,)),
    Series("molecules", (12,), (2,)),
    Series("protein", (12,), (1,)),
]

#: suites that are scripts of their own (``python -m benchmarks.torsions``); ``__main__`` dispatches to them
SCRIPTS = {
    "torsions": "benchmarks.torsions",
    "gpu": "benchmarks.gpu",
    "protein_tensors": "benchmarks.protein_tensors",  # AlphaFold tensors, frames, violation losses
    "flows": "benchmarks.flows",  # zmat.flows.InternalCoordinateTransform vs bgflow's algorithm
    "optimize": "benchmarks.optimize",  # zmat.optimize vs geomeTRIC, Sella, pyberny, ASE (Baker set)
    "clash": "benchmarks.clash",  # clash_loss: all pairs vs neighbour list, memory, ragged batches
    "train": "benchmarks.train",  # a FoldingDiff-style model trained with and without clash_loss
}

SUITES = {"quick": QUICK, "methods": METHODS, "targets": TARGETS, "full": FULL, "tiny": TINY, "fresh": []}
#: default seconds per record (cold call + timed calls) before a size is skipped as too slow
BUDGETS = {"quick": 4.0, "methods": 10.0, "targets": 10.0, "full": 10.0, "tiny": 2.0, "fresh": 4.0}
#: seconds of timed (warm) calls per record: floor(REPEAT_TIME / cold call) calls, at least 1
REPEAT_TIME = {"quick": 0.5, "methods": 1.0, "targets": 1.0, "full": 1.0, "tiny": 0.02, "fresh": 0.5}
