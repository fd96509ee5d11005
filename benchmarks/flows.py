"""Normalizing-flow transforms: zmat's InternalCoordinateTransform against bgflow's algorithm.

``python -m benchmarks --suite flows`` (or ``python -m benchmarks.flows``; ``--tiny``
for a smoke test). Two problems, float32 by default, on one thread
(``--threads``):

* alanine dipeptide (``CC(=O)NC(C)C(=O)NC`` with hydrogens, 22 atoms, one
  RDKit ETKDG conformer, table from ``zmat.ZMatrix.from_rdkit``), 1,024
  conformers: dihedrals perturbed, each moved by a random rigid motion;
* 16 conformers of a 300-residue protein (heavy atoms, ``benchmarks.cases``'s
  ``protein`` problem), each moved by a random rigid motion.

Rows, each the median of warm calls: internal -> Cartesian with the
log-determinant (``fwd+logdet``), Cartesian -> internal with it
(``inv+logdet``), and the gradient of ``sum xyz^2 + sum logdet`` with respect to
the internal coordinates (``fwd+bwd``), for

* ``zmat``: ``T.call_and_ladj(q)``, ``T.inv(xyz)`` with
  ``T.inv.log_abs_det_jacobian``; also ``T(q)`` and the log-determinant alone,
  whose ratio is the log-determinant's share of the transform;
* ``bgflow-algorithm``: :mod:`benchmarks.bgflow_algorithm`, bgflow's
  algorithm reimplemented (level-by-level NeRF with explicit 3 x 3 Jacobians,
  a 9 x 9 autograd Jacobian for the first three atoms);
* ``bgflow``: bgflow's own ``GlobalInternalCoordinateTransformation`` when
  ``import bgflow`` works (it is not on PyPI: ``pip install
  git+https://github.com/bgflow/bgflow``; never a dependency of zmat).

The log-determinants of zmat and of the reimplementation are compared
(max deviation printed), and so are both round trips.
"""

from __future__ import annotations

import argparse
import json

import torch

from zmat.flows import InternalCoordinateTransform

from . import flows_grid
from .bgflow_algorithm import BgflowAlgorithm
from .flow_cases import alanine_dipeptide, protein
from .timing import median_seconds


def _bgflow():
    try:
        import bgflow
    except Exception:  # noqa: BLE001 (not installed, or broken: both mean "not here")
        return None
    return bgflow


def run_case(name: str, table, xyz64: torch.Tensor, dtype: torch.dtype, repeat: float) -> dict:
    T = InternalCoordinateTransform(table)
    ref = BgflowAlgorithm(table)
    xyz = xyz64.to(dtype)
    q = T.inv(xyz)
    ics = tuple(t.detach() for t in ref.to_ic(xyz)[0])
    res = {"case": name, "batch": xyz.shape[0], "atoms": xyz.shape[1], "levels": len(ref.levels) + 1}

    def grad_zmat():
        qg = q.clone().requires_grad_(True)
        x, ld = T.call_and_ladj(qg)
        return torch.autograd.grad(x.square().sum() + ld.sum(), qg)

    def grad_ref():
        ig = tuple(t.clone().requires_grad_(True) for t in ics)
        x, ld = ref.to_xyz(ig)
        return torch.autograd.grad(x.square().sum() + ld.sum(), ig)

    res["zmat fwd+logdet"] = median_seconds(lambda: T.call_and_ladj(q), repeat)
    res["zmat inv+logdet"] = median_seconds(lambda: T.inv.log_abs_det_jacobian(xyz, T.inv(xyz)), repeat)
    res["zmat fwd+bwd"] = median_seconds(grad_zmat, repeat)
    res["zmat fwd"] = median_seconds(lambda: T(q), repeat)
    res["zmat logdet"] = median_seconds(lambda: T.log_abs_det_jacobian(q), repeat)
    with torch.no_grad():  # bgflow's first-atom Jacobian needs autograd: it enables it itself
        res["bgflow-algorithm fwd+logdet"] = median_seconds(lambda: ref.to_xyz(ics), repeat)
        res["bgflow-algorithm inv+logdet"] = median_seconds(lambda: ref.to_ic(xyz), repeat)
    res["bgflow-algorithm fwd+bwd"] = median_seconds(grad_ref, repeat)
    res.update(_bgflow_rows(table, xyz, repeat))

    # agreement, in float64: log-determinants and round trips
    q64 = T.inv(xyz64)
    ld_zmat = T.log_abs_det_jacobian(q64)
    ics64, dlogp = ref.to_ic(xyz64)
    ics64, dlogp = tuple(t.detach() for t in ics64), dlogp.detach()
    res["max |ld zmat + dlogp bgflow-algorithm|"] = float((ld_zmat + dlogp).abs().max())
    res["zmat round trip A (float64)"] = float((T(q64) - xyz64).abs().max())
    res["zmat round trip A (float32)"] = float((T(T.inv(xyz64.float())).double() - xyz64).abs().max())
    res["bgflow-algorithm round trip A (float64)"] = float(
        (ref.to_xyz(ics64)[0].detach() - xyz64).abs().max()
    )
    return res


def _bgflow_rows(table, xyz: torch.Tensor, repeat: float) -> dict:
    """bgflow's own transform, when it can be imported (its z-matrix: (atom, b, a, d) rows)."""
    bgflow = _bgflow()
    if bgflow is None:
        return {"bgflow": "not installed"}
    try:
        ref = BgflowAlgorithm(table)
        r0, r1, r2 = ref.initial.tolist()  # bgflow's z-matrix: the first three atoms' rows too
        first = [[r0, -1, -1, -1], [r1, r0, -1, -1], [r2, r1, r0, -1]]
        z = torch.as_tensor(first + ref.rows.tolist()).numpy()
        flow = bgflow.GlobalInternalCoordinateTransformation(z, normalize_angles=False)
        x = xyz.reshape(xyz.shape[0], -1)
        out = flow(x)
        return {
            "bgflow": getattr(bgflow, "__version__", "installed"),
            "bgflow fwd+logdet": median_seconds(lambda: flow(*out[:-1], inverse=True), repeat),
            "bgflow inv+logdet": median_seconds(lambda: flow(x), repeat),
        }
    except Exception as e:  # noqa: BLE001 (report, do not fail the suite)
        return {"bgflow": f"failed: {type(e).__name__}: {e}"}


def report(results: list[dict]) -> str:
    ms = lambda s: f"{s * 1e3:9.3f} ms"  # noqa: E731
    lines = []
    for r in results:
        lines.append(
            f"{r['case']}: {r['batch']} x {r['atoms']} atoms ({r['levels']} dependency levels), "
            f"{r['dtype']}, {r['threads']} thread(s)"
        )
        for mode in ("fwd+logdet", "inv+logdet", "fwd+bwd"):
            z, b = r[f"zmat {mode}"], r[f"bgflow-algorithm {mode}"]
            own = f"; bgflow {ms(r[f'bgflow {mode}'])}" if f"bgflow {mode}" in r else ""
            lines.append(f"  {mode:11s} zmat {ms(z)}  bgflow-algorithm {ms(b)}  ({b / z:6.1f}x){own}")
        share = r["zmat logdet"] / r["zmat fwd"]
        lines.append(
            f"  log-det alone {ms(r['zmat logdet'])} = {100 * share:.1f}% of the transform "
            f"({ms(r['zmat fwd'])})"
        )
        lines.append(
            "  agreement: max |ld zmat + dlogp bgflow-algorithm| "
            f"{r['max |ld zmat + dlogp bgflow-algorithm|']:.1e}; "
            f"round trip zmat {r['zmat round trip A (float64)']:.1e} A (float64), "
            f"{r['zmat round trip A (float32)']:.1e} A (float32); bgflow-algorithm "
            f"{r['bgflow-algorithm round trip A (float64)']:.1e} A (float64); bgflow: {r['bgflow']}"
        )
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1024, help="alanine dipeptide conformers (default 1024)")
    p.add_argument("--proteins", type=int, default=16, help="protein conformers (default 16)")
    p.add_argument("--residues", type=int, default=300, help="protein length (default 300)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--repeat", type=float, default=1.0, help="seconds of warm calls per measurement")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--tiny", action="store_true", help="smoke test: 8 dipeptides, 2 proteins of 12 residues")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--bgflow", help="a bgflow source checkout for the grid (default: $ZMAT_BGFLOW)")
    p.add_argument("--against", help="another copy of zmat/flows.py to time beside this one (before/after)")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs per row of the grid (default 3)")
    p.add_argument("--budget", type=float, default=0.2, help="seconds per contender per run (default 0.2)")
    p.add_argument("--grid-only", action="store_true", help="only the grid (every mode and size vs bgflow)")
    a = p.parse_args(argv)
    if a.tiny:
        a.batch, a.proteins, a.residues, a.repeat, a.runs, a.budget = 8, 2, 12, 0.01, 1, 0.01
    torch.set_num_threads(a.threads)
    results = {"grid": flows_grid.grid(a), "cases": [] if a.grid_only else _cases(a)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


def _cases(a) -> list[dict]:
    dtype = getattr(torch, a.dtype)
    table, xyz = alanine_dipeptide(a.batch)
    results = [run_case("alanine dipeptide", table, xyz, dtype, a.repeat)]
    table, xyz, names = protein(a.residues, a.proteins)
    n_res = int((names == "CA").sum())
    results.append(run_case(f"protein of {n_res} residues", table, xyz, dtype, a.repeat))
    for r in results:
        r["dtype"], r["threads"] = a.dtype, a.threads
    print(report(results))
    return results


if __name__ == "__main__":
    main()
