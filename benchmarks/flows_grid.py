"""The flows grid: zmat's InternalCoordinateTransform against bgflow, every mode and size.

Part of ``python -m benchmarks --suite flows``. Modes: ``global`` (no fixed
atoms; bgflow's ``GlobalInternalCoordinateTransformation``) and ``fixed``
(a Cartesian backbone, the rest internal; bgflow's
``RelativeInternalCoordinateTransformation``, the part of its ``Mixed``
transform that is a coordinate change). Sizes: one alanine dipeptide, 1,024
of them, 16 proteins. Rows: ``fwd`` (internal -> Cartesian with the
log-determinant), ``inv`` (Cartesian -> internal with it), ``inv+bwd`` (the
gradient of ``sum q^2 + sum logdet`` of ``inv`` with respect to the positions),
float32 and float64.

The reference is bgflow itself where it can be imported: it is not on PyPI
and never a dependency of zmat; ``--bgflow PATH`` (or ``ZMAT_BGFLOW=PATH``)
names a source checkout, e.g. ``git clone https://github.com/noegroup/bgflow
/tmp/bgflow`` at ``fbba56f`` (as ``tests/data/make_bgflow_reference.py``).
Without it the global rows use :mod:`benchmarks.bgflow_algorithm` (its
algorithm reimplemented) and the fixed rows have no reference; the table says
which ran. ``--against PATH`` times another copy of ``zmat/flows.py`` (e.g.
main's, copied to ``/tmp``) in the same process: before/after in one run.

Timing: ``--runs`` runs; in each, every contender of a row is timed in turn
(interleaved), wall and thread CPU time (``time.thread_time``), the median
over its calls; the table gives the median over runs and the spread
(min-max of the runs' medians) of the ratio.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time

import numpy as np
import torch

import zmat
from zmat.flows import InternalCoordinateTransform

from .bgflow_algorithm import BgflowAlgorithm
from .flow_cases import alanine_dipeptide, protein

BACKBONE = ("N", "CA", "C")
OPS = ("fwd", "inv", "inv+bwd")


def load_bgflow(path: str | None):
    """bgflow from a source checkout ``path`` (or installed), or ``None``. Two shims, both
    for bgflow's age, none changing its transforms: ``np.infty`` (gone in NumPy 2), and jax
    hidden when the installed jax lacks ``jax.dlpack.to_dlpack`` (its optional jax bridge)."""
    if path:
        sys.path.insert(0, os.path.abspath(path))
    if not hasattr(np, "infty"):
        np.infty = np.inf
    try:
        import jax.dlpack

        if not hasattr(jax.dlpack, "to_dlpack"):
            sys.modules["jax"] = None  # bgflow's jax bridge would fail at import
    except ImportError:
        pass
    try:
        import bgflow
    except Exception:  # noqa: BLE001 (not there, or broken: both mean "no bgflow")
        return None
    return bgflow


def load_flows(path: str):
    """Another copy of ``zmat/flows.py`` as module ``zmat._flows_against`` (its relative imports
    resolve in zmat)."""
    spec = importlib.util.spec_from_file_location("zmat._flows_against", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ problems
def cases(tiny: bool):
    """``(name, table, xyz float64 (B, N, 3), fixed atoms)`` for every size."""
    table, xyz = alanine_dipeptide(8 if tiny else 1024)
    # the tree's first three atoms and the backbone C, N, CA, C, N of CC(=O)NC(C)C(=O)NC
    ala_fixed = np.union1d(_first_atoms(table), [1, 3, 4, 6, 8])
    yield "alanine dipeptide x 1", table, xyz[:1], ala_fixed
    yield f"alanine dipeptide x {len(xyz)}", table, xyz, ala_fixed
    n_res, batch = (12, 2) if tiny else (600, 16)
    ptable, pxyz, names = protein(n_res, batch)
    yield f"{batch} x protein ({pxyz.shape[1]} atoms)", ptable, pxyz, _protein_fixed(ptable, names)


def _first_atoms(table) -> np.ndarray:
    return np.nonzero(zmat.ConstructionTable(table).refs[:, 2] < 0)[0]


def _protein_fixed(table, names: np.ndarray) -> np.ndarray:
    """The backbone N, CA, C (``names``: the table's atom names) and the tree's first atoms."""
    return np.union1d(_first_atoms(table), np.nonzero(np.isin(names, BACKBONE))[0])


# ------------------------------------------------------------------ contenders
def zmat_calls(cls, table, fixed, xyz: torch.Tensor) -> dict:
    """``{op: callable}`` for one InternalCoordinateTransform class."""
    T = cls(table, fixed_atoms=fixed)
    q = T.inv(xyz)

    def inv_bwd():
        x = xyz.detach().requires_grad_(True)
        qq = T.inv(x)
        ld = T.inv.log_abs_det_jacobian(x, qq)
        return torch.autograd.grad(qq.square().sum() + ld.sum(), x)

    return {
        "fwd": lambda: T.call_and_ladj(q),
        "inv": lambda: T.inv.log_abs_det_jacobian(xyz, T.inv(xyz)),
        "inv+bwd": inv_bwd,
    }


def bgflow_calls(bgflow, table, fixed, xyz: torch.Tensor) -> dict:
    """``{op: callable}`` for bgflow's transform (its forward is zmat's inverse)."""
    refs = zmat.ConstructionTable(table).refs
    z = np.concatenate([np.arange(len(refs))[:, None], refs], 1).astype(np.int64)
    if fixed is None:
        flow = bgflow.GlobalInternalCoordinateTransformation(_bgflow_global_z(refs), normalize_angles=False)
    else:
        flow = bgflow.RelativeInternalCoordinateTransformation(
            z[~np.isin(z[:, 0], fixed)], fixed, normalize_angles=False
        )
    x = xyz.reshape(xyz.shape[0], -1)
    out = flow(x)

    def inv_bwd():
        xg = x.detach().requires_grad_(True)
        *ics, dlogp = flow(xg)
        loss = sum(t.square().sum() for t in ics) + dlogp.sum()
        return torch.autograd.grad(loss, xg)

    return {"fwd": lambda: flow(*out[:-1], inverse=True), "inv": lambda: flow(x), "inv+bwd": inv_bwd}


def _bgflow_global_z(refs: np.ndarray) -> np.ndarray:
    """bgflow's z-matrix ``(atom, b, a, d)``, the first three atoms' rows first."""
    ref = BgflowAlgorithm(refs)
    r0, r1, r2 = ref.initial.tolist()
    return np.asarray([[r0, -1, -1, -1], [r1, r0, -1, -1], [r2, r1, r0, -1], *ref.rows.tolist()])


def algorithm_calls(table, xyz: torch.Tensor) -> dict:
    """``{op: callable}`` for :mod:`benchmarks.bgflow_algorithm` (global only)."""
    ref = BgflowAlgorithm(table)
    ics = tuple(t.detach() for t in ref.to_ic(xyz)[0])

    def fwd():
        with torch.no_grad():  # its first-atom Jacobian enables autograd itself
            return ref.to_xyz(ics)

    def inv_bwd():
        x = xyz.detach().requires_grad_(True)
        ic, dlogp = ref.to_ic(x)
        return torch.autograd.grad(sum(t.square().sum() for t in ic) + dlogp.sum(), x)

    return {"fwd": fwd, "inv": lambda: ref.to_ic(xyz), "inv+bwd": inv_bwd}


# ------------------------------------------------------------------ timing
def _time(fn, budget: float) -> tuple[float, float]:
    """Median wall and thread-CPU seconds of warm calls of ``fn`` for about ``budget`` s."""
    walls, cpus = [], []
    start = time.perf_counter()
    while len(walls) < 3 or time.perf_counter() - start < budget:
        w, c = time.perf_counter(), time.thread_time()
        fn()
        cpus.append(time.thread_time() - c)
        walls.append(time.perf_counter() - w)
    return statistics.median(walls), statistics.median(cpus)


def time_row(calls: dict, runs: int, budget: float) -> dict:
    """``{contender: [(wall, cpu) per run]}``, the contenders interleaved within each run."""
    for fn in calls.values():
        fn()  # cold calls (plans, caches) outside the timing
    out = {name: [] for name in calls}
    for _ in range(runs):
        for name, fn in calls.items():
            out[name].append(_time(fn, budget))
    return out


def grid(args) -> list[dict]:
    """Every mode, size, dtype and op; one record per row."""
    bgflow = load_bgflow(args.bgflow or os.environ.get("ZMAT_BGFLOW"))
    ref_name = f"bgflow {getattr(bgflow, '__version__', '')}".strip() if bgflow else "bgflow-algorithm"
    against = load_flows(args.against).InternalCoordinateTransform if args.against else None
    records, default = [], torch.get_default_dtype()
    for name, table, xyz64, fixed in cases(args.tiny):
        if xyz64.shape[0] == 1:
            records.append({"case": name, "floor": floor(table, xyz64, against, fixed)})
            print(format_floor(records[-1]), flush=True)
        for dtype in (torch.float32, torch.float64):
            torch.set_default_dtype(dtype)  # bgflow's own constants in the row's dtype
            try:
                xyz = xyz64.to(dtype)
                for mode, fx in (("global", None), ("fixed", fixed)):
                    contenders = {"zmat": zmat_calls(InternalCoordinateTransform, table, fx, xyz)}
                    if against is not None:
                        contenders["zmat before"] = zmat_calls(against, table, fx, xyz)
                    if bgflow is not None:
                        contenders[ref_name] = bgflow_calls(bgflow, table, fx, xyz)
                    elif fx is None:
                        contenders[ref_name] = algorithm_calls(table, xyz)
                    for op in OPS:
                        calls = {k: v[op] for k, v in contenders.items()}
                        times = time_row(calls, args.runs, args.budget)
                        rec = {"case": name, "mode": mode, "dtype": str(dtype)[6:], "op": op}
                        rec.update({k: v for k, v in times.items()})
                        records.append(rec)
                        print(format_row(rec), flush=True)
            finally:
                torch.set_default_dtype(default)
    return records


def _ratio(rec: dict, num: str, den: str, k: int) -> str:
    r = [a[k] / b[k] for a, b in zip(rec[num], rec[den], strict=True)]
    return f"{statistics.median(r):6.1f}x [{min(r):.1f}-{max(r):.1f}]"


def format_row(rec: dict) -> str:
    ms = lambda k, i: statistics.median(t[i] for t in rec[k]) * 1e3  # noqa: E731
    head = f"{rec['case']:32s} {rec['mode']:6s} {rec['dtype']:7s} {rec['op']:7s}"
    cells = [f"{k} {ms(k, 0):9.3f} ms wall {ms(k, 1):9.3f} ms cpu" for k in rec if k not in HEAD_KEYS]
    refs = [k for k in rec if k not in HEAD_KEYS and k.startswith("bgflow")]
    ratios = [f"{k}/zmat wall {_ratio(rec, k, 'zmat', 0)} cpu {_ratio(rec, k, 'zmat', 1)}" for k in refs]
    if "zmat before" in rec:
        ratios.append(f"before/after wall {_ratio(rec, 'zmat before', 'zmat', 0)}")
    return head + " | " + "; ".join(cells + ratios)


HEAD_KEYS = ("case", "mode", "dtype", "op")


def floor(table, xyz: torch.Tensor, against=None, fixed=None) -> dict:
    """One alanine dipeptide: forward + log-det (global, and with ``fixed`` atoms) against one
    ``zmat.to_xyz`` call: ``{contender: [(wall, cpu) per run]}`` (s)."""
    xyz = xyz[:1].float()
    C = zmat.to_internal(xyz, table)
    calls = {"to_xyz": lambda: zmat.to_xyz(C, table)}
    for label, cls in (("zmat", InternalCoordinateTransform), ("zmat before", against)):
        for mode, fx in (("", None), (" fixed", fixed)):
            if cls is not None and (fx is not None or not mode):
                T = cls(table, fixed_atoms=fx)
                q = T.inv(xyz)
                calls[f"{label}{mode} fwd+logdet"] = lambda T=T, q=q: T.call_and_ladj(q)
    return time_row(calls, 3, 0.3)


def format_floor(rec: dict) -> str:
    """Medians over runs of wall and thread CPU time, each against ``to_xyz``'s in the same run."""
    runs = rec["floor"]
    cells = []
    for k, v in runs.items():
        us = [statistics.median(t[i] for t in v) * 1e6 for i in (0, 1)]
        pairs = list(zip(v, runs["to_xyz"], strict=True))
        ratio = [statistics.median(a[i] / b[i] for a, b in pairs) for i in (0, 1)]
        cells.append(f"{k} wall {us[0]:.0f} us ({ratio[0]:.1f}x), cpu {us[1]:.0f} us ({ratio[1]:.1f}x)")
    return f"{rec['case']} float32, floor (x: of to_xyz): " + "; ".join(cells)
