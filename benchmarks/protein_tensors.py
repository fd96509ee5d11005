"""Benchmark AlphaFold-tensor conversions, frames and violation losses (zmat.protein).

    python -m benchmarks.protein_tensors              # 16 x 1,000 residues (~1 min on 2 cores)
    python -m benchmarks.protein_tensors --tiny       # 2 x 50 residues, seconds (the test runs this)
    python -m benchmarks.protein_tensors --batch 16 --length 1000 --repeats 5 --dtype float32

The batch is ``--batch`` random sequences of ``--length`` residues built by
``zmat.protein.ProteinBatch`` from helical backbone torsions (phi -57, psi -47
degrees) with random chis, in float64 unless ``--dtype`` says otherwise. Each
operation is timed forward only (``fwd``, under ``no_grad``) and forward plus
``.backward()`` of the sum of its output (``fwd+bwd``); the time is the median
over ``--repeats`` calls after one warm-up call (which builds and caches the
index plans and tables), and "best" the fastest call (on a shared machine, the
least disturbed). Operations:

* ``to_atom37``: ``zmat.protein.atom37.to_atom37(batch, xyz)``, layout -> atom37;
* ``atom37_to_atom14``;
* ``backbone_frames``: frames from atom37 coordinates;
* ``frames_from_torsions``: ``backbone_frames_from_torsions`` (backbone only);
* ``atom14_from_frames``: every heavy atom from frames + torsions (the
  batch's sequences, whose table is cached after the warm-up call);
* ``atom14_from_frames new seq``: the same with new sequences in every call
  (cycling through more than the 16 tables ``zmat.protein.frames`` caches: a
  generative model's batches);
* ``openfold atom14 (peer)``: OpenFold's ``torsion_angles_to_frames`` +
  ``frames_and_literature_positions_to_atom14_pos``, reimplemented from the
  published math in ``benchmarks/openfold_frames.py`` (no table: fresh and
  cached alike), from the same frames and (sin, cos) of the same torsions;
* ``violations``: ``structural_violations`` with a clash pair list built once
  (``clash_pairs(..., skin=1.0)``, as in a training loop: no host sync);
* ``violations+search``: the same, searching the clash pairs in every call.

Results go to ``OUT/protein_tensors.json`` (default ``results/benchmarks``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch


def setup(batch: int, length: int, dtype, seed: int = 0) -> dict:
    import zmat.protein as zp
    from zmat.protein.atom37 import aatype_of, to_atom37

    g = torch.Generator().manual_seed(seed)
    letters = "ACDEFGHIKLMNPQRSTVWY"
    seqs = ["".join(letters[i] for i in torch.randint(0, 20, (length,), generator=g)) for _ in range(batch)]
    pb = zp.ProteinBatch(seqs)
    tor = torch.empty(batch, length, 7, dtype=torch.float64)
    tor[..., 0], tor[..., 1], tor[..., 2] = math.radians(-57), math.radians(-47), math.pi
    tor[..., 3:] = (torch.rand(batch, length, 4, generator=g, dtype=torch.float64) - 0.5) * 2 * math.pi
    xyz = pb.to_xyz(tor).to(dtype)
    pos37, mask37 = to_atom37(pb, xyz)
    aatype = aatype_of(pb)
    R, t = zp.backbone_frames(pos37)
    pos14, mask14 = zp.atom37_to_atom14(pos37, aatype, mask37)
    pairs = zp.clash_pairs(pos14, mask14, aatype, torch.arange(length), skin=1.0)
    from .openfold_frames import alpha_from_zmat_torsions

    fresh = itertools.cycle([torch.randint(0, 20, (batch, length), generator=g) for _ in range(40)])
    alpha = alpha_from_zmat_torsions(tor.to(dtype))
    return dict(pb=pb, xyz=xyz, tor=tor.to(dtype), pos37=pos37, mask37=mask37, aatype=aatype, R=R, t=t,
                pairs=pairs, fresh=fresh, alpha=alpha)  # fmt: skip


def operations(d: dict) -> dict:
    """name -> (function of its differentiable inputs, those inputs)."""
    import zmat.protein as zp
    from zmat.protein.atom37 import to_atom37

    from . import openfold_frames

    aa, m37 = d["aatype"], d["mask37"]
    viol = lambda x, pairs=None: zp.structural_violations(x, aa, m37, pairs=pairs)["loss"]  # noqa: E731
    return {
        "to_atom37": (lambda x: to_atom37(d["pb"], x)[0], (d["xyz"],)),
        "atom37_to_atom14": (lambda x: zp.atom37_to_atom14(x, aa, m37)[0], (d["pos37"],)),
        "backbone_frames": (lambda x: zp.backbone_frames(x)[0], (d["pos37"],)),
        "frames_from_torsions": (lambda t: zp.backbone_frames_from_torsions(t)[0], (d["tor"][..., :3],)),
        "atom14_from_frames": (
            lambda R, t, c: zp.atom14_from_frames(R, t, aa, c)[0],
            (d["R"], d["t"], d["tor"]),
        ),
        "atom14_from_frames new seq": (
            lambda R, t, c: zp.atom14_from_frames(R, t, next(d["fresh"]), c)[0],
            (d["R"], d["t"], d["tor"]),
        ),
        "openfold atom14 (peer)": (
            lambda R, t, alpha: openfold_frames.atom14_from_frames(R, t, aa, alpha),
            (d["R"], d["t"], d["alpha"]),
        ),
        "violations": (lambda x: viol(x, d["pairs"]), (d["pos37"],)),
        "violations+search": (viol, (d["pos37"],)),
    }


def time_op(fn, inputs, mode: str, repeats: int) -> list[float]:
    times = []
    for k in range(repeats + 1):
        args = [x.detach().clone().requires_grad_(mode == "fwd+bwd") for x in inputs]
        t0 = time.perf_counter()
        if mode == "fwd":
            with torch.no_grad():
                fn(*args)
        else:
            fn(*args).sum().backward()
        if k:  # the first call warms the caches
            times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--tiny", action="store_true", help="2 x 50 residues, 1 repeat")
    ap.add_argument("--out", default="results/benchmarks")
    a = ap.parse_args(argv)
    if a.tiny:
        a.batch, a.length, a.repeats = 2, 50, 1
    dtype = getattr(torch, a.dtype)
    t0 = time.perf_counter()
    d = setup(a.batch, a.length, dtype)
    setup_s, threads = time.perf_counter() - t0, torch.get_num_threads()
    print(f"protein tensors: {a.batch} x {a.length} residues, {a.dtype}, CPU {threads} threads")
    print(f"  (setup {setup_s:.1f} s, {len(d['pairs'])} clash pairs)")
    records = []
    for name, (fn, inputs) in operations(d).items():
        row = {"op": name}
        for mode in ("fwd", "fwd+bwd"):
            ts = time_op(fn, inputs, mode, a.repeats)
            row[mode], row[f"{mode} best"] = statistics.median(ts), min(ts)
        records.append(row)
        ms = {k: v * 1e3 for k, v in row.items() if k != "op"}
        print(
            f"  {name:27s} fwd {ms['fwd']:8.1f} ms (best {ms['fwd best']:8.1f})   "
            f"fwd+bwd {ms['fwd+bwd']:8.1f} ms (best {ms['fwd+bwd best']:8.1f})"
        )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = platform.processor() or platform.machine()
    meta = {"batch": a.batch, "length": a.length, "dtype": a.dtype, "repeats": a.repeats, "threads": threads}
    meta["machine"] = machine
    (out / "protein_tensors.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
