"""Benchmark zmat.clash_loss: all pairs vs neighbour list, forward + backward.

    python -m benchmarks.clash               # N = 1k, 3k, 10k: well under a minute
    python -m benchmarks.clash --full        # N = 1k ... 100k and 120k
    python -m benchmarks.clash --sizes 5000 --methods neighbors --kind soft_count
    python -m benchmarks.clash --collapsed --sizes 5000 20000 --methods neighbors
    python -m benchmarks.clash --ragged      # one ragged call (ptr=) against the loop over molecules

The structure is a synthetic assembly: copies of lysozyme (tests/data/1aki.pdb,
1001 protein heavy atoms) tiled on a cubic grid at 0.8 of their extent, so that
neighbouring copies interpenetrate a little, with 0.3 A Gaussian noise on every
atom: it has clashes, within and between copies. 120k atoms is about the size
of a 16,000-residue chaperonin. Radii are AlphaFold's; pairs within 3 bonds
(biotite's bond list, repeated per copy) are excluded.

With ``--collapsed`` the structure is instead N atoms drawn uniformly in a
0.5 A cube (radius 1.7 A, no exclusions), as a model may emit at
initialisation: every pair clashes, N(N-1)/2 of them. It measures the memory
bound of the chunked evaluation (``--memory-budget``) and the cost per pair.

With ``--ragged`` it instead times a ragged batch of ``--molecules`` pieces of
lysozyme of 30-90 atoms (0.3 A noise, each with its own 1-2..1-4 exclusions)
in one ``clash_loss(..., ptr=..., exclude=[per molecule])`` call against the
Python loop over molecules it replaces, forward + backward, alternating the
two, for the default method and for ``pairs=`` (the training path), and
checks that the values agree.

Each case runs in a fresh process (multiprocessing "spawn"), so that memory is
measured per case:

- CPU: the process's peak resident set size, its high-water mark reset just
  before the first call (Linux: VmHWM after writing 5 to /proc/self/clear_refs;
  elsewhere ``ru_maxrss``, the peak since start), and ``extra`` = peak minus
  the RSS at that point (Python, torch, the inputs, built in the parent), that
  is what the loss itself needed;
- CUDA: ``torch.cuda.max_memory_allocated`` after setup is reset.

Time is the median over ``--repeats`` calls (after one warm-up) of one
``clash_loss(...)`` plus ``.backward()``, the neighbour search included. For the
neighbour method the search alone (``candidate_pairs``) is timed too; "best" is
the fastest call (on a shared machine, the least disturbed). All-pairs
cases above ``--max-all-pairs`` pairs are skipped and their memory estimated.
Results go to ``OUT/clash.json`` and, if matplotlib is installed, ``OUT/clash.png``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import re
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

PDB = Path(__file__).resolve().parent.parent / "tests" / "data" / "1aki.pdb"
SMALL = [1000, 3000, 10000]
FULL = [1000, 3000, 10000, 30000, 100000, 120000]
BYTES_PER_PAIR = 75  # all-pairs, float32, fwd + bwd: measured 74 B/pair at N = 10k (145 at 3k)


def protein(path: Path = PDB):
    """Heavy atoms of the protein in ``path``: coordinates (n, 3), elements, bonds (E, 2)."""
    import biotite.structure as struc
    import biotite.structure.io.pdb as pdb

    atoms = pdb.PDBFile.read(str(path)).get_structure(model=1, include_bonds=True)
    atoms = atoms[struc.filter_amino_acids(atoms)]
    return atoms.coord.astype(np.float64), list(atoms.element), atoms.bonds.as_array()[:, :2]


def assembly(n: int, *, packing: float = 0.8, noise: float = 0.3, seed: int = 0):
    """First ``n`` atoms of lysozyme copies tiled on a grid: xyz (n, 3), elements, bonds."""
    xyz0, elements0, bonds0 = protein()
    n0 = len(xyz0)
    copies = -(-n // n0)
    side = int(np.ceil(copies ** (1 / 3)))
    grid = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3)
    step = packing * (xyz0.max(0) - xyz0.min(0))
    xyz = (xyz0[None] - xyz0.min(0) + grid[:copies, None] * step).reshape(-1, 3)[:n]
    xyz = xyz + np.random.default_rng(seed).normal(scale=noise, size=xyz.shape)
    bonds = (bonds0[None] + n0 * np.arange(copies)[:, None, None]).reshape(-1, 2)
    return xyz, (elements0 * copies)[:n], bonds[(bonds < n).all(1)]


def _status_mb(field: str) -> float | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"{field}:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else None


def _reset_peak_rss() -> tuple[float, str]:
    """Start a fresh RSS high-water mark; returns (current RSS in MB, how measured).

    Linux resets the peak (VmHWM) on writing 5 to /proc/self/clear_refs; else
    fall back on ru_maxrss, the peak since the process started.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_mb("VmRSS"), "VmHWM"
    except OSError:
        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20, "ru_maxrss"


def _peak_rss_mb(how: str) -> float:
    if how == "VmHWM":
        return _status_mb("VmHWM")
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def inputs(n: int) -> dict:
    """The assembly as plain arrays: coordinates, radii, 1-2..1-4 exclusions."""
    from zmat.clash import alphafold_radii, exclusions_from_bonds

    xyz, elements, bonds = assembly(n)
    t = time.perf_counter()
    exclude = exclusions_from_bonds(bonds, n, depth=3).numpy()
    exclusion_s = time.perf_counter() - t
    radii = alphafold_radii(elements, dtype=torch.float64).numpy()
    return dict(xyz=xyz, radii=radii, exclude=exclude, exclusion_s=exclusion_s)


def collapsed_inputs(n: int, side: float = 0.5) -> dict:
    """N atoms uniform in a ``side``-Angstrom cube: every pair clashes."""
    xyz = np.random.default_rng(0).uniform(0.0, side, size=(n, 3))
    return dict(xyz=xyz, radii=np.full(n, 1.7), exclude=np.zeros((0, 2), np.int64), exclusion_s=0.0)


def run_case(cfg: dict, data: dict) -> dict:
    """One (N, method) case; meant to run in a fresh process.

    The inputs are built by the caller, so that the child's memory high-water
    mark before the first call is little more than Python, torch and the data.
    """
    from zmat.clash import candidate_pairs, clash_loss

    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])
    method, device = cfg["method"], torch.device(cfg["device"])
    dtype = getattr(torch, cfg["dtype"])
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    xyz = torch.tensor(data["xyz"], dtype=dtype, device=device, requires_grad=True)
    radii = torch.tensor(data["radii"], dtype=dtype, device=device)
    exclude = torch.from_numpy(data["exclude"]).to(device)
    kw = dict(exclude=exclude if len(exclude) else None, kind=cfg["kind"])
    if cfg.get("memory_budget"):
        kw["memory_budget"] = cfg["memory_budget"]

    setup_mb, how = _reset_peak_rss()
    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)

    def step():
        xyz.grad = None
        loss = clash_loss(xyz, radii, method=method, **kw)
        loss.backward()
        sync()
        return loss

    times = []
    for k in range(cfg["repeats"] + 1):  # the first call is a warm-up
        t = time.perf_counter()
        loss = step()
        if k:
            times.append(time.perf_counter() - t)
    out = dict(cfg, time_s=statistics.median(times), best_s=min(times), exclusion_s=data["exclusion_s"])
    out["loss"] = float(loss.detach())
    if cuda:
        out["peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        out["extra_mb"] = out["peak_mb"] - base / 2**20
    else:
        out["peak_mb"] = _peak_rss_mb(how)
        out["extra_mb"] = out["peak_mb"] - setup_mb
        out["memory"] = how
    if method == "neighbors" and not cfg.get("collapsed"):
        search = []
        for _ in range(cfg["repeats"]):
            t = time.perf_counter()
            pairs = candidate_pairs(xyz, radii, **kw)
            sync()
            search.append(time.perf_counter() - t)
        out["search_s"] = statistics.median(search)
        out["pairs"] = int(pairs.shape[0])
    else:  # every pair: all_pairs, or a collapsed structure (whose list would not fit)
        out["pairs"] = cfg["n"] * (cfg["n"] - 1) // 2
    out["ns_per_pair"] = 1e9 * out["time_s"] / max(out["pairs"], 1)
    return out


def _in_child(cfg: dict, data: dict) -> dict:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(run_case, (cfg, data))


def _table(rows: list[dict], memory_note: str) -> str:
    head = (
        f"{'N':>7} {'method':>10} {'pairs':>11} {'fwd+bwd s':>10} {'best s':>8} {'search s':>9} "
        f"{'peak MB':>9} {'extra MB':>9} {'ns/pair':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"{r['n']:>7} {r['method']:>10} {r['pairs']:>11} skipped: {r['skipped']}")
            continue
        search = f"{r['search_s']:.3f}" if "search_s" in r else "-"
        lines.append(
            f"{r['n']:>7} {r['method']:>10} {r['pairs']:>11} {r['time_s']:>10.4f} {r['best_s']:>8.4f} "
            f"{search:>9} {r['peak_mb']:>9.0f} {r['extra_mb']:>9.0f} {r['ns_per_pair']:>8.1f}"
        )
    lines.append(memory_note)
    return "\n".join(lines)


def _plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(9, 3.5))
    for method in sorted({r["method"] for r in rows}):
        done = [r for r in rows if r["method"] == method and not r.get("skipped")]
        ns = [r["n"] for r in done]
        ax_t.loglog(ns, [r["time_s"] for r in done], "o-", label=method)
        ax_m.loglog(ns, [max(r["extra_mb"], 1.0) for r in done], "o-", label=method)
    ax_t.set(xlabel="atoms N", ylabel="median fwd+bwd (s)")
    ax_m.set(xlabel="atoms N", ylabel="extra peak memory (MB)")
    ax_t.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def ragged_cases(n_molecules: int, seed: int = 0):
    """Pieces of noisy lysozyme of 30-90 atoms, flat: xyz, radii, ptr, per-molecule exclusions."""
    from zmat.clash import alphafold_radii, exclusions_from_bonds

    xyz0, elements0, bonds0 = protein()
    rng = np.random.default_rng(seed)
    parts, radii, exclude, sizes = [], [], [], []
    for _ in range(n_molecules):
        n = int(rng.integers(30, 91))
        a = int(rng.integers(0, len(xyz0) - n))
        b = bonds0[(bonds0 >= a).all(1) & (bonds0 < a + n).all(1)] - a
        parts.append(xyz0[a : a + n] + rng.normal(scale=0.3, size=(n, 3)))
        radii.append(alphafold_radii(elements0[a : a + n], dtype=torch.float64))
        exclude.append(exclusions_from_bonds(b, n, depth=3))
        sizes.append(n)
    ptr = torch.tensor(np.concatenate([[0], np.cumsum(sizes)]))
    return torch.from_numpy(np.concatenate(parts)), torch.cat(radii), ptr, exclude


def run_ragged(n_molecules: int, dtype: str, repeats: int) -> list[dict]:
    """One ragged call against the per-molecule loop (fwd + bwd), alternating; same values."""
    from zmat.clash import candidate_pairs, clash_loss

    dt = getattr(torch, dtype)
    xyz, radii, ptr, exclude = ragged_cases(n_molecules)
    xyz, radii = xyz.to(dt), radii.to(dt)
    bounds = list(zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True))
    rows = []
    for label in ("default method", "pairs="):
        pairs = candidate_pairs(xyz, radii, exclude=exclude, ptr=ptr, skin=1.0) if label == "pairs=" else None
        loop_pairs = [
            candidate_pairs(xyz[a:b], radii[a:b], exclude=e, skin=1.0) if pairs is not None else None
            for (a, b), e in zip(bounds, exclude, strict=True)
        ]
        x = xyz.clone().requires_grad_(True)

        def one(x=x, pairs=pairs):
            loss = clash_loss(x, radii, exclude=exclude, ptr=ptr, pairs=pairs)
            loss.sum().backward()
            return loss.detach()

        def loop(x=x, loop_pairs=loop_pairs):
            loss = torch.stack([
                clash_loss(x[a:b], radii[a:b], exclude=e, pairs=q)
                for (a, b), e, q in zip(bounds, exclude, loop_pairs, strict=True)
            ])  # fmt: skip
            loss.sum().backward()
            return loss.detach()

        got, want = one(), loop()
        times = {"one call": [], "loop": []}
        for _ in range(max(repeats, 5)):
            for name, fn in (("one call", one), ("loop", loop)):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        one_s, loop_s = (statistics.median(times[k]) for k in ("one call", "loop"))
        rows.append(dict(
            case=f"ragged {n_molecules} molecules, {label}", atoms=len(xyz), dtype=dtype,
            max_abs_diff=float((got - want).abs().max()), loss_sum=float(want.sum()),
            one_call_ms=one_s * 1e3, loop_ms=loop_s * 1e3, loop_over_one=loop_s / one_s,
        ))  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--full", action="store_true", help=f"N in {FULL}")
    p.add_argument("--sizes", type=int, nargs="+", help=f"atom counts (default {SMALL})")
    p.add_argument("--methods", nargs="+", default=["all_pairs", "neighbors"])
    p.add_argument("--kind", default="flat_bottom")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--max-all-pairs", type=float, default=2e7, help="skip all-pairs above this")
    p.add_argument("--in-process", action="store_true", help="no child processes (memory then cumulative)")
    p.add_argument("--collapsed", action="store_true", help="N atoms within 0.5 A instead of the assembly")
    p.add_argument(
        "--memory-budget", type=int, default=0, help="clash_loss memory_budget, bytes (0: default)"
    )
    p.add_argument("--ragged", action="store_true", help="one ragged call against the loop over molecules")
    p.add_argument("--molecules", type=int, default=64, help="molecules of the --ragged batch")
    p.add_argument("--out", default="results")
    args = p.parse_args(argv)
    if args.ragged:
        rows = run_ragged(args.molecules, args.dtype, args.repeats)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "clash_ragged.json").write_text(json.dumps(dict(results=rows), indent=1))
        return rows

    sizes = args.sizes or (FULL if args.full else SMALL)
    cuda = args.device.startswith("cuda")
    if cuda:
        memory_note = "memory: torch.cuda.max_memory_allocated; extra = peak - allocated after setup"
    else:
        memory_note = (
            "memory: peak RSS of a fresh process per case, its high-water mark reset just before "
            "the first call (Linux VmHWM via /proc/self/clear_refs); extra = peak - RSS at that "
            "point (Python, torch, inputs) = what the loss needed"
        )
    if args.in_process:
        memory_note += " [--in-process: peaks are cumulative, not per case]"
    rows = []
    for n in sizes:
        data = collapsed_inputs(n) if args.collapsed else inputs(n)
        for method in args.methods:
            cfg = dict(
                n=n, method=method, kind=args.kind, dtype=args.dtype, device=args.device, repeats=args.repeats
            )
            cfg.update(collapsed=args.collapsed, memory_budget=args.memory_budget)
            pairs = n * (n - 1) // 2
            if method == "all_pairs" and pairs > args.max_all_pairs:
                gb = pairs * BYTES_PER_PAIR * (2 if args.dtype == "float64" else 1) / 1e9
                rows.append(dict(cfg, pairs=pairs, skipped=f"~{gb:.1f} GB estimated"))
            else:
                rows.append(run_case(cfg, data) if args.in_process else _in_child(cfg, data))
            print(_table(rows[-1:], "").splitlines()[-2], flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(
        torch=torch.__version__,
        python=platform.python_version(),
        machine=platform.machine(),
        threads=args.threads or torch.get_num_threads(),
        memory=memory_note,
        structure=(collapsed_inputs if args.collapsed else assembly).__doc__,
    )
    (out / "clash.json").write_text(json.dumps(dict(meta=meta, results=rows), indent=1))
    _plot(rows, out / "clash.png")
    print()
    print(_table(rows, memory_note))
    return rows


if __name__ == "__main__":
    main()
