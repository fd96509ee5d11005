"""The one GPU check: CUDA tests plus a GPU benchmark grid, in one command.

    python -m benchmarks.gpu                     # on a CUDA machine: tests + grid (< 5 min)
    python -m benchmarks.gpu --device cpu --tiny # dry run of the grid on the CPU (seconds)

On a machine without CUDA the default run says so and exits cleanly (status
0): there is nothing to check. With CUDA it

1. runs the CUDA-marked tests (``pytest -m cuda``), which compare every
   device path with the CPU and check that the differentiable clash path does
   not sync (``torch.cuda.set_sync_debug_mode("error")``);
2. times a grid, forward + backward, median of warm calls, each synchronised:
   chains of 1k-100k atoms (batch 1 and 64), batches of proteins up to
   64 x 1,000 residues (``zmat.protein.ProteinBatch``), the clash loss of a
   100k-atom assembly (neighbour search, and with a given pair list), a
   collapsed structure (20,000 atoms within 0.5 A) under the default memory
   budget, and a training step (``to_xyz`` + ``clash_loss(pairs=...)`` +
   backward) eager vs ``torch.compile`` (and CUDA graphs,
   ``mode="reduce-overhead"``);
3. writes ``gpu.json`` and ``gpu.md`` (a markdown table) into ``--out``.

Every row also reports ``ops/call``: aten ops dispatched by one call
(``zmat.testing.DispatchAudit``), the machine-independent proxy for kernel
launches, and the host syncs among them. Peak memory is
``torch.cuda.max_memory_allocated`` above the inputs (not measured on the CPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "results" / "gpu"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn, device: torch.device, repeats: int, audit: bool = True) -> dict:
    """Median seconds of ``fn()`` over warm calls, peak extra memory, ops and syncs of one call."""
    from zmat.testing import DispatchAudit

    fn()  # warm-up: plans, kernels, compilation
    _sync(device)
    row: dict = {}
    if audit:
        with DispatchAudit() as a:
            fn()
        row.update(ops=a.count, syncs=len(a.syncs))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    row.update(ms=1e3 * statistics.median(times), best_ms=1e3 * min(times))
    if device.type == "cuda":
        row["peak_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    return row


def _chain(n: int):
    import zmat

    refs = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]] + [[i - 1, i - 2, i - 3] for i in range(3, n)]
    return zmat.ConstructionTable(refs[:n])


def _internal(shape, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = torch.rand(*shape, 3, generator=g, dtype=torch.float64)
    c[..., 0] += 1.0
    c[..., 1] = 1.6 + 0.5 * c[..., 1]
    c[..., 2] = 6.0 * c[..., 2] - 3.0
    return c.to(device=device, dtype=dtype).requires_grad_(True)


def chain_rows(sizes, batches, device, dtype, repeats):
    import zmat

    for n in sizes:
        table = _chain(n)
        for b in batches:
            c = _internal((b, n), device, dtype)

            def step(c=c, table=table):
                zmat.to_xyz(c, table).square().sum().backward()

            yield dict(case="chain", size=f"{b} x {n} atoms", **measure(step, device, repeats))


def protein_rows(lengths, batches, device, dtype, repeats):
    from zmat.protein import ProteinBatch

    letters = "ACDEFGHIKLMNPQRSTVWY"
    for L in lengths:
        for b in batches:
            seqs = ["".join(letters[(7 * k + 3 * s) % 20] for k in range(L)) for s in range(b)]
            batch = ProteinBatch(seqs)
            t = (0.3 * torch.randn(b, L, 7, generator=torch.Generator().manual_seed(L))).to(device, dtype)
            t.requires_grad_(True)

            def step(t=t, batch=batch):
                batch.to_xyz(t).square().sum().backward()

            size = f"{b} x {L} residues ({batch.N_max * b} atoms)"
            yield dict(case="protein", size=size, **measure(step, device, repeats))


def clash_rows(n_atoms, collapsed, device, dtype, repeats):
    from benchmarks.clash import assembly
    from zmat.clash import alphafold_radii, candidate_pairs, clash_loss, exclusions_from_bonds

    xyz, elements, bonds = assembly(n_atoms)
    x = torch.tensor(xyz, dtype=dtype, device=device, requires_grad=True)
    radii = alphafold_radii(elements, dtype=dtype, device=device)
    exclude = exclusions_from_bonds(bonds, n_atoms).to(device)
    pairs = candidate_pairs(x, radii, exclude=exclude, skin=1.0)
    size = f"{n_atoms} atoms, {len(pairs)} pairs"
    yield dict(
        case="clash search",
        size=size,
        **measure(lambda: candidate_pairs(x, radii, exclude=exclude), device, 1),
    )
    yield dict(
        case="clash neighbors",
        size=size,
        **measure(
            lambda: clash_loss(x, radii, exclude=exclude, method="neighbors").backward(), device, repeats
        ),
    )
    yield dict(
        case="clash pairs=",
        size=size,
        **measure(lambda: clash_loss(x, radii, pairs=pairs).backward(), device, repeats),
    )
    g = torch.Generator().manual_seed(0)
    xc = (0.5 * torch.rand(collapsed, 3, generator=g)).to(device, dtype).requires_grad_(True)
    rc = torch.full((collapsed,), 1.7, dtype=dtype, device=device)
    yield dict(
        case="clash collapsed",
        size=f"{collapsed} atoms within 0.5 A, {collapsed * (collapsed - 1) // 2} pairs",
        **measure(lambda: clash_loss(xc, rc, method="neighbors").backward(), device, 1, audit=False),
    )


def compiled_rows(n, b, device, dtype, repeats, modes):
    """A training step eager vs compiled: to_xyz + clash_loss(pairs=...) + backward."""
    import zmat
    from zmat.clash import candidate_pairs, clash_loss

    table = _chain(n)
    c = _internal((b, n), device, dtype)
    radii = torch.full((n,), 1.7, dtype=dtype, device=device)
    pairs = candidate_pairs(zmat.to_xyz(c, table), radii, skin=1.0, kind="softplus")

    def loss(c):
        return clash_loss(zmat.to_xyz(c, table), radii, pairs=pairs, kind="softplus").sum()

    size = f"{b} x {n} atoms, {len(pairs)} pairs"
    eager = measure(lambda: loss(c).backward(), device, repeats)
    yield dict(case="step eager", size=size, **eager)
    for name, kwargs in modes:
        torch._dynamo.reset()
        compiled = torch.compile(loss, fullgraph=True, **kwargs)
        graphs = kwargs.get("mode") == "reduce-overhead"

        def fn(compiled=compiled, graphs=graphs):
            if graphs:  # a new iteration: CUDA graphs may reuse the last outputs' memory
                torch.compiler.cudagraph_mark_step_begin()
            compiled(c).backward()

        t = time.perf_counter()
        fn()  # compilation
        _sync(device)
        row = measure(fn, device, repeats, audit=False)
        row.update(compile_s=time.perf_counter() - t, vs_eager=eager["ms"] / row["ms"])
        yield dict(case=f"step {name}", size=size, **row)


def run_cuda_tests() -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", str(ROOT / "tests")]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return dict(
        returncode=proc.returncode, summary=lines[-1] if lines else "", seconds=time.perf_counter() - t
    )


def grid(device: torch.device, dtype: torch.dtype, tiny: bool):
    """The sections of the grid, each a generator of rows."""
    if tiny:
        aot = [("compiled (aot_eager)", dict(backend="aot_eager"))]
        return [
            chain_rows([50], [2], device, dtype, 1),
            protein_rows([8], [2], device, dtype, 1),
            clash_rows(300, 200, device, dtype, 1),
            compiled_rows(30, 2, device, dtype, 1, aot),
        ]
    modes = [("compiled", {})]
    if device.type == "cuda":
        modes.append(("CUDA graphs", dict(mode="reduce-overhead")))
    return [
        chain_rows([1000, 10_000, 100_000], [1, 64], device, dtype, 10),
        protein_rows([100, 1000], [1, 16, 64], device, dtype, 5),
        clash_rows(100_000, 20_000, device, dtype, 5),
        compiled_rows(1000, 64, device, dtype, 10, modes),
    ]


COLUMNS = ["case", "size", "ms", "best_ms", "ops", "syncs", "peak_mb", "vs_eager", "compile_s"]


def markdown(rows: list[dict]) -> str:
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(k)) for k in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--tiny", action="store_true", help="seconds-long grid (CI dry run)")
    p.add_argument("--no-tests", action="store_true", help="skip the CUDA tests")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device on this machine; nothing to check (--device cpu: a dry run)")
        return 0
    meta = dict(
        torch=torch.__version__, python=platform.python_version(), device=str(device), dtype=args.dtype
    )
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    start = time.perf_counter()
    tests = None
    if device.type == "cuda" and not args.no_tests:
        tests = run_cuda_tests()
        print(f"CUDA tests: {tests['summary']} (exit {tests['returncode']})", flush=True)
    rows = []
    for section in grid(device, getattr(torch, args.dtype), args.tiny):
        try:  # one failing section must not cost the others on a borrowed GPU
            for row in section:
                rows.append(row)
                print(markdown([row]).splitlines()[-1], flush=True)
        except Exception as e:  # noqa: BLE001
            rows.append(dict(case="error", size=f"{type(e).__name__}: {e}"[:300]))
            print(f"error: {rows[-1]['size']}", flush=True)
    meta["seconds"] = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(dict(meta=meta, tests=tests, results=rows), indent=1))
    (out / "gpu.md").write_text(f"{meta}\n\n{markdown(rows)}\n")
    print(f"\n{markdown(rows)}\n\nwrote {out / 'gpu.json'} and {out / 'gpu.md'} ({meta['seconds']:.0f} s)")
    failed = (tests is not None and tests["returncode"] != 0) or any(r["case"] == "error" for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
