"""How close the headline rows come to this core's limit (issue 23, item 5).

``python -m benchmarks.limits`` (``--tiny``: a smoke test); ``python -m
benchmarks --suite fresh`` runs it as the ``limits`` section of
``benchmarks/fresh.py``.

For each headline row the work per unit (atom, conformer, pair) is counted
from the code that does it (``WORK`` below: trig calls, flops, compulsory
bytes), the core's peaks are measured on one torch thread, and the row's
limit is the slowest of the three resources::

    limit = max(trig / trig rate, flops / flop rate, bytes / copy rate(bytes))
    fraction = limit / measured

* trig rate: ``torch.sin`` and ``torch.cos`` over 2^20 float64 elements
  (vectorised; the kernel computes its frames in double);
* flop rate: a float64 (kernel rows) or float32 (torch-op rows) matrix product,
  ``2 n^3`` flops (every multiply-add of the hardware's widest FMA);
* copy rate: ``dst.copy_(src)`` of the row's own working set (bytes read +
  written), so a set that fits in the caches is held to the cache's speed.

Compulsory bytes: every input read once and every output written once (the
kernel's double scratch, the position reads of a pair list's atoms and the
like are assumed to stay in the caches). The counts are lower bounds of the
work, so the fraction is an upper bound of the efficiency reached.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

#: work per unit, counted from the loops. Kernel rows (``zmat/csrc/rigid_forest.cpp``,
#: positions only, float32 in and out, K = 4 plan rows for proteins):
#: forward per atom: cos/sin of theta and phi (4); the local frame (8 mul) and its
#: product with the parent's 3x4 frame (36 mul + 27 add); reads 3 coordinates (12 B),
#: the plan (gather 4 x 8, keep 4, trig 2, parent 8, order 8 B), writes frames (48 B)
#: and positions (12 B). Backward per atom: moment x * g (9), subtree sums into the
#: parent (12), torque about the anchor (12), the three derivatives (18), their
#: scatter (3); reads frames' rotation (36 B) and positions (12 B), the output
#: gradient (12 B), rows, parent, gather, keep (52 B), writes and zeroes the
#: input gradient (24 B). The protein fill (``fill_forward``/``fill_backward``) adds
#: ideal values (24 B), torsion slot (8 B), torsion and coordinate read/write (16 B)
#: forward and 24 B backward per atom.
KERNEL_FWD = {"trig": 4, "flops": 71, "bytes": 126}
KERNEL_BWD = {"trig": 0, "flops": 54, "bytes": 136}
FILL = {"trig": 0, "flops": 0, "bytes": 72}
WORK = {
    "kernel fwd+bwd per atom": {k: KERNEL_FWD[k] + KERNEL_BWD[k] for k in KERNEL_FWD},
    "protein fwd+bwd per atom": {k: KERNEL_FWD[k] + KERNEL_BWD[k] + FILL[k] for k in KERNEL_FWD},
    # rigid torsion update, per conformer of k torsions and n atoms (ranolazine: 9, 64),
    # forward: per torsion a rotation about its bond (unit axis: 3 sub, 5 mul/add, sqrt,
    # 3 div; Rodrigues' matrix from cos/sin: ~25) composed with its parent's motion (63);
    # per atom its motion applied (9 mul + 9 add); reads the torsions (4 k B), writes the
    # positions (12 n B); the reference positions and plan are shared by the batch
    "torsion fwd per conformer": lambda k, n: {
        "trig": 2 * k,
        "flops": 100 * k + 18 * n,
        "bytes": 4 * k + 12 * n,
    },  # fmt: skip
    # clash_loss(pairs=) flat_bottom per pair, forward + backward: difference (3),
    # squared norm (5), sqrt, contact and overlap (3), relu and sum (2); backward the
    # step of relu, d / |d| (3 div, 3 mul) and the two scatter-adds (6); the pair's
    # indices read twice (32 B), its atoms' positions and radii in the caches
    "clash fwd+bwd per pair": {"trig": 0, "flops": 27, "bytes": 32},
}


#: CPU time of this thread (one torch thread): on a shared machine wall time
#: also counts the other processes' turns on the core
_clock = time.thread_time


def _times(fn, seconds: float, repeat: int) -> list[float]:
    fn()
    times, end = [], time.perf_counter() + seconds
    while len(times) < repeat or (time.perf_counter() < end and len(times) < 200):
        t0 = _clock()
        fn()
        times.append(_clock() - t0)
    return times


def _best(fn, seconds: float = 0.2, repeat: int = 3) -> float:
    """Fastest call of ``fn``: a peak is what the core does undisturbed."""
    return min(_times(fn, seconds, repeat))


def _median(fn, seconds: float = 0.3, repeat: int = 3) -> float:
    return statistics.median(_times(fn, seconds, repeat))


def trig_rate(n: int = 1 << 20) -> float:
    """sin and cos evaluations per second (float64, vectorised)."""
    x = torch.rand(n, dtype=torch.float64) * 6.3
    y = torch.empty_like(x)
    return 2 * n / _best(lambda: (torch.sin(x, out=y), torch.cos(x, out=y)))


def flop_rate(dtype: torch.dtype, n: int = 384) -> float:
    """Flops per second of an ``n x n`` matrix product."""
    a, b = torch.rand(n, n, dtype=dtype), torch.rand(n, n, dtype=dtype)
    c = torch.empty_like(a)
    return 2 * n**3 / _best(lambda: torch.mm(a, b, out=c))


def copy_rate(nbytes: float) -> float:
    """Bytes (read + written) per second of a copy whose source and destination
    together are ``nbytes`` (at least 64 kB)."""
    n = max(int(nbytes) // 8, 1 << 13)
    src, dst = torch.rand(n), torch.empty(n)
    return 8 * n / _best(lambda: dst.copy_(src))


def limit(work: dict, units: float, flop_dtype: torch.dtype, peaks: dict) -> tuple[float, str]:
    """The time of ``units`` x ``work`` at the peaks, and the bounding resource."""
    need = {
        "trig": work["trig"] * units / peaks["trig"],
        "flops": work["flops"] * units / peaks[f"flops {flop_dtype}"],
        "bytes": work["bytes"] * units / copy_rate(work["bytes"] * units),
    }
    bound = max(need, key=need.get)
    return need[bound], bound


# ------------------------------------------------------------ headline rows
def _kernel_step(C, table):
    import zmat

    C = C.detach().clone().requires_grad_(True)
    g = torch.ones_like(C)
    return lambda: torch.autograd.grad(zmat.to_xyz(C, table), C, g)


def protein_batch1(name: str = "1ubi"):
    """(row, atoms, step): batch-1 fwd+bwd of a PDB file's table, float32."""
    from zmat.protein import from_pdb

    from .sections import DATA

    p = from_pdb(DATA / f"{name}.pdb")
    return f"{name} batch 1 fwd+bwd", p.n_atoms, _kernel_step(p.internal.float(), p.table)


def protein_batch(n_seq: int, length: int):
    """(row, atoms, step): a ``ProteinBatch`` of random sequences, cached fwd+bwd."""
    from zmat.protein import ProteinBatch

    from .sections import AMINO

    rng = np.random.default_rng(0)
    batch = ProteinBatch(["".join(rng.choice(list(AMINO), length)) for _ in range(n_seq)])
    tors = torch.from_numpy(rng.uniform(-3, 3, (n_seq, batch.L_max, 7))).float().requires_grad_(True)
    g = torch.ones(n_seq, batch.N_max, 3)
    step = lambda: torch.autograd.grad(batch.to_xyz(tors), tors, g)  # noqa: E731
    return f"proteins {n_seq} x {length} res fwd+bwd", batch.table.n_atoms, step


def torsion_update(batch: int):
    """(row, conformers, step, torsions, atoms): ranolazine's rigid forward, float32."""
    from zmat.rdkit import TorsionSpace

    from .torsions import SMILES, _embed

    ts = TorsionSpace.from_mol(_embed(SMILES))
    k = len(ts.quads)
    gen = torch.Generator().manual_seed(0)
    t = (ts.torsions + (torch.rand(batch, k, generator=gen, dtype=torch.float64) * 2 - 1) * torch.pi).float()
    return f"torsion update {batch} conformers fwd", batch, (lambda: ts.to_xyz(t)), k, len(ts.positions)


def clash_pairs_step(n: int):
    """(row, pairs, step): ``clash_loss(pairs=)`` fwd+bwd on ``n`` atoms of tiled lysozyme."""
    from zmat.clash import candidate_pairs, clash_loss

    from .clash import inputs

    d = inputs(n)
    xyz = torch.tensor(d["xyz"], dtype=torch.float32, requires_grad=True)
    radii = torch.tensor(d["radii"], dtype=torch.float32)
    # a Verlet list with a wide skin: long enough that the cost per pair, not
    # per call, is measured
    pairs = candidate_pairs(xyz.detach(), radii, exclude=torch.from_numpy(d["exclude"]), skin=3.0)

    def step():
        return torch.autograd.grad(clash_loss(xyz, radii, pairs=pairs), xyz)

    return f"clash_loss(pairs=) {n} atoms fwd+bwd", len(pairs), step


def run(tiny: bool = False) -> list[dict]:
    """The ``limits`` records: the peaks, then one per headline row."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the limit of one core
    try:
        peaks = {"trig": trig_rate(), **{f"flops {d}": flop_rate(d) for d in (torch.float32, torch.float64)}}
        out = [{"section": "limits", "case": "peaks (1 thread)", "trig/s": f"{peaks['trig']:.3g}",
                "float32 flop/s": f"{peaks['flops torch.float32']:.3g}",
                "float64 flop/s": f"{peaks['flops torch.float64']:.3g}",
                "copy B/s (256 MB)": f"{copy_rate(1 << 28 if not tiny else 1 << 24):.3g}",
                "copy B/s (1 MB)": f"{copy_rate(1 << 20):.3g}"}]  # fmt: skip
        kernel, protein = WORK["kernel fwd+bwd per atom"], WORK["protein fwd+bwd per atom"]
        rows = [(*protein_batch1(), kernel, "atom", torch.float64)]
        big = protein_batch(2, 20) if tiny else protein_batch(16, 1000)
        rows.append((*big, protein, "atom", torch.float64))
        try:
            name, b, step, k, n = torsion_update(4 if tiny else 256)
            rows.append((name, b, step, WORK["torsion fwd per conformer"](k, n), "conformer", torch.float32))
        except ImportError:  # no RDKit
            pass
        rows.append((*clash_pairs_step(1500 if tiny else 20000), WORK["clash fwd+bwd per pair"], "pair",
                     torch.float32))  # fmt: skip
        for name, units, step, work, unit, dtype in rows:
            measured = _median(step, 0.05 if tiny else 0.5)
            t, bound = limit(work, units, dtype, peaks)
            out.append({"section": "limits", "case": name, "unit": unit, "units": units,
                        **{f"{k}/unit": v for k, v in work.items()}, "measured": measured, "limit": t,
                        "bound by": bound, "fraction": t / measured})  # fmt: skip
        return out
    finally:
        torch.set_num_threads(threads)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.limits", description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="smoke test: tiny sizes, short repeats")
    a = p.parse_args(argv)
    from .sections import table

    records = run(a.tiny)
    print(table(records))
    return records


if __name__ == "__main__":
    main()
