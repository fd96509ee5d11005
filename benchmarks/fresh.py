"""Where training is (issue 15): a fresh batch every step, batch-1 latency,
a busy machine, and scaling.

Sections (``python -m benchmarks.fresh --sections ...``; ``python -m
benchmarks`` runs ``fresh`` and ``latency`` after its grid):

* ``fresh``: one training step (coordinates -> loss gradient) on a batch never
  seen before, by phase, beside the same step cached (second call on the same
  batch): proteins (16 random sequences x 1,000 residues through
  ``zmat.protein.ProteinBatch``), complexes (16 of the real structures of
  ``tests/data``, ``COMPLEX_MIX``: protein-DNA, protein + ligands, DNA, RNA,
  ~880 residues each, all with hydrogens, none, or a coin flip each, read once
  as the data set's preprocessing, through ``ComplexBatch``; ``cached
  ns/atom``: fwd+bwd per atom), molecules in torsion space (256 of a pool
  of 300 (``--quick``) or 600 drug-like molecules, ~29 heavy atoms and ~57
  atoms with hydrogens, ETKDG conformers and ``TorsionSpace.from_mol`` built
  once and kept on disk as the data set's preprocessing; every step a new
  random subset in a new order, batched by ``data.take(pick)`` from the pool
  held as one batch, or by ``TorsionSpace.batch`` of the spaces, through
  ``method="rigid"`` and ``"table"``), and random trees (256 different random
  molecule-like trees of 45-65 atoms, one forest table). Phases: ``layout``
  (``ProteinBatch(sequences)``; for molecules, the batch of spaces or
  offsetting the per-molecule arrays into one), ``table``
  (``ConstructionTable``: validation and planning; for molecules also the fast
  path ``ConstructionTable.concatenate`` of per-molecule tables validated once
  by the data set), ``plan`` (the per-device index plan,
  ``zmat._analytic.prepare``), ``forward``, ``backward`` (first calls).
* ``ratios``: fresh / cached of a 16 x 1,000-residue step and of
  ``atom14_from_frames``, interleaved pairs, wall and CPU, at default threads
  and at one (``benchmarks/fresh_ratios.py``; alone: ``python -m
  benchmarks.fresh_ratios``).
* ``latency``: batch-1 forward and forward+backward (float32, CPU) and
  dispatched aten ops per call (``ops fwd``/``ops bwd``, counted with
  ``zmat.testing.DispatchAudit``) on a 12-atom chain, 1ubi, 1aki and 1igy;
  with the compiled CPU kernel (``zmat/_kernel.py``) the pure-PyTorch path
  beside it (``torch ...``: ``ZMAT_NO_KERNEL=1``, alternating in one run);
  ``--compile`` adds ``torch.compile`` beside eager; tmol's kinematics on the
  same files when tmol is installed (the ``tmol`` extra).
* ``busy``: cached steps alone and while a second process spins on one core,
  at torch's default thread count and at one thread; ``ops/step``: aten ops
  dispatched by one step (the output gradient is made once, outside the step).
  Steps: the transform alone (12-atom chain, 3wip, 16 x 256 residues) and a
  whole training step on 16 x 256 residues (torsions -> ``ProteinBatch.to_xyz``
  -> ``clash_loss(pairs=)`` + ``structural_violations`` with their pair lists
  made once).
* ``scaling``: seconds per atom of forward+backward, 1k-100k atoms at batch 1
  and 1k atoms at batch 1-64; and of ``ConstructionTable(refs)`` (validation
  and planning) on 100k-atom tables of three shapes: a chain, 100k roots (a
  forest of single atoms), a star (every atom bonded to atom 0).
* ``limits``: each headline row's estimated limit on this core and the
  fraction of it reached (``benchmarks/limits.py``).

Times are medians of warm calls (fresh steps: medians over different batches).
``--compare DIR`` runs the ``latency`` and ``scaling`` sections with the zmat
package found in ``DIR`` too, alternating calls in one run, and prints the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .sections import AMINO, DATA, ROOT, SECTIONS, markdown, table  # noqa: F401 (table, markdown: the report)

#: the sections ``python -m benchmarks --suite X`` runs after its grid
SUITE_SECTIONS = {"quick": ("fresh", "latency"), "fresh": SECTIONS, "full": SECTIONS}


def _now() -> float:
    return time.perf_counter()


def _median_time(fn, repeat: int = 5, seconds: float = 0.3) -> float:
    """Median seconds of ``fn()`` over at least ``repeat`` calls and ``seconds``."""
    times = []
    end = _now() + seconds
    while len(times) < repeat or (_now() < end and len(times) < 200):
        t0 = _now()
        fn()
        times.append(_now() - t0)
    return statistics.median(times)


# -------------------------------------------------------------- fresh step
def _step(forward, leaf):
    """Forward, then the gradient of a random linear loss; returns (fwd s, bwd s)."""
    import torch

    t0 = _now()
    out = forward()
    t1 = _now()
    g = torch.ones_like(out)
    torch.autograd.grad(out, leaf, g)
    return t1 - t0, _now() - t1


def _timed(t: dict, phase: str, make):
    """``make()``, its seconds recorded as ``t[phase]``."""
    t0 = _now()
    out = make()
    t[phase] = _now() - t0
    return out


def prepare(table, device) -> None:
    """Build the per-device plans (``zmat._analytic.prepare``; zmat versions
    without it build them in the first forward, which is then timed with it)."""
    try:
        from zmat._analytic import prepare as build
    except ImportError:
        return
    build(table, device, 1)


def protein_step(n_seq: int, length: int, seed: int) -> dict:
    import torch

    from zmat.protein import ProteinBatch

    rng = np.random.default_rng(seed)
    seqs = ["".join(rng.choice(list(AMINO), length)) for _ in range(n_seq)]
    t = {}
    batch = _timed(t, "layout", lambda: ProteinBatch(seqs))
    table = _timed(t, "table", lambda: batch.table)
    torsions = torch.from_numpy(rng.uniform(-3, 3, (n_seq, batch.L_max, 7))).float().requires_grad_(True)
    _timed(t, "plan", lambda: prepare(table, torsions.device))
    t["forward"], t["backward"] = _step(lambda: batch.to_xyz(torsions), torsions)
    cached = [_step(lambda: batch.to_xyz(torsions), torsions) for _ in range(5)]
    t["cached forward"] = statistics.median(c[0] for c in cached)
    t["cached backward"] = statistics.median(c[1] for c in cached)
    return {"atoms": table.n_atoms, **t}


def molecule_step(dataset: list, n_mol: int, seed: int, concatenate: bool) -> dict:
    """``dataset``: list of ``(refs, ConstructionTable)`` per molecule."""
    import torch

    import zmat

    rng = np.random.default_rng(seed)
    pick = rng.choice(len(dataset), n_mol, replace=False)
    t = {}
    t0 = _now()
    if concatenate:
        t["layout"] = 0.0
        table = zmat.ConstructionTable.concatenate([dataset[k][1] for k in pick])
        t["table"] = _now() - t0
    else:
        refs = [dataset[k][0] for k in pick]
        sizes = np.array([len(r) for r in refs])
        shift = np.repeat(np.cumsum(sizes) - sizes, sizes)[:, None]
        flat = np.concatenate(refs)
        flat = np.where(flat >= 0, flat + shift, -1)
        t["layout"] = _now() - t0
        t0 = _now()
        table = zmat.ConstructionTable(flat)
        t["table"] = _now() - t0
    C = torch.from_numpy(rng.uniform(0.5, 2.5, (table.n_atoms, 3))).float().requires_grad_(True)
    t0 = _now()
    prepare(table, C.device)
    t["plan"] = _now() - t0
    t["forward"], t["backward"] = _step(lambda: zmat.to_xyz(C, table), C)
    cached = [_step(lambda: zmat.to_xyz(C, table), C) for _ in range(5)]
    t["cached forward"] = statistics.median(c[0] for c in cached)
    t["cached backward"] = statistics.median(c[1] for c in cached)
    return {"atoms": table.n_atoms, **t}


def molecule_dataset(n: int, seed: int = 0) -> list:
    import zmat

    from .cases import molecule_table

    rng = np.random.default_rng(seed)
    refs = [molecule_table(int(rng.integers(45, 66)), rng) for _ in range(n)]
    out = [(r, zmat.ConstructionTable(r)) for r in refs]
    if hasattr(zmat.ConstructionTable, "concatenate"):  # what each table keeps for concatenate
        assert len(zmat.ConstructionTable.concatenate([t for _, t in out]).kind)  # (arrays made on first use)
    return out


# Drug-like molecules for the torsion-space row: a core with three substituents
# (SMILES assembled deterministically; ring-closure digits %90/%91 in the cores,
# 1 in the groups, so a group's ring closes before the core's does).
_CORES = (
    "c%90cc({a})cc({c})c%90{b}", "c%90cc({a})ncc%90C{b}", "C%90CN({a})CC({c})C%90{b}",
    "c%90ccc%91c(c%90{a})cc({b})n%91", "C%90CC(CN%90{a})C{b}", "c%90nc({a})sc%90{b}",
    "c%90c({c})c({a})c(cc%90){b}", "O=C(N{a})c%90ccc({b})o%90", "N%90(CCN(CC%90){a}){b}",
    "c%90ccc%91n({a})c({b})nc%91c%90",
)  # fmt: skip
_GROUPS = (
    "CCO", "C(=O)NC", "OC", "N1CCOCC1", "c1ccncc1", "CC(C)C", "S(=O)(=O)NC", "C(F)(F)F", "CCN(C)C",
    "Cc1ccccc1", "OCC(=O)O", "C1CCNCC1", "NC(=O)C1CC1", "c1ccc(F)cc1", "CC#N", "OCCOC", "C(=O)OCC",
    "NCc1ccco1", "Cl", "CCCC", "c1cnn(C)c1", "NS(=O)(=O)C", "COc1ccc(O)cc1", "C(C)(C)O",
    "CC(=O)Nc1ccccc1", "OCCCN1CCCC1",
)  # fmt: skip


def drug_like_smiles(n: int, seed: int = 0) -> list[str]:
    """``n`` different canonical SMILES of 28-40 heavy atoms (mean ~30)."""
    from rdkit import Chem

    rng = np.random.default_rng(seed)
    out: dict = {}
    while len(out) < n:
        core = _CORES[rng.integers(len(_CORES))]
        a, b, c = (_GROUPS[i] for i in rng.integers(len(_GROUPS), size=3))
        mol = Chem.MolFromSmiles(core.format(a=a, b=b, c=c))
        if mol is not None and 28 <= mol.GetNumHeavyAtoms() <= 40:
            out.setdefault(Chem.MolToSmiles(mol), None)
    return list(out)


def torsion_dataset(n: int) -> list:
    """``n`` ``TorsionSpace.from_mol`` of ETKDG conformers (with hydrogens): the
    data set's preprocessing, done once and kept on disk (keyed by the zmat
    sources, so another zmat rebuilds its own)."""
    import hashlib
    import pickle
    import tempfile

    from rdkit import Chem, RDLogger
    from rdkit.Chem import AllChem

    import zmat
    from zmat.rdkit import TorsionSpace

    src = Path(zmat.__file__).parent
    key = hashlib.sha1(b"".join(f.read_bytes() for f in sorted(src.rglob("*.py")))).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"zmat-bench-torsions-{n}-{key}.pkl"
    if cache.exists():
        return pickle.loads(cache.read_bytes())
    RDLogger.DisableLog("rdApp.*")
    spaces = []
    for smi in drug_like_smiles(n):
        mol = Chem.AddHs(Chem.MolFromSmiles(smi))
        params = AllChem.ETKDGv3()
        params.randomSeed = 0
        if AllChem.EmbedMolecule(mol, params) != 0:
            raise RuntimeError(f"ETKDG failed on {smi}")
        ts = TorsionSpace.from_mol(mol)
        getattr(ts, "_cache", {}).clear()  # (older zmat pickled per-device plans of the molecule alone)
        ts.table.__dict__.pop("_plans", None)  # (older zmat pickled a table's plans)
        spaces.append(ts)
    tmp = cache.with_suffix(f".{os.getpid()}")
    tmp.write_bytes(pickle.dumps(spaces))
    tmp.replace(cache)
    return spaces


def torsion_step(pool: list, n_mol: int, seed: int, method: str, data=None) -> dict:
    """A batch of ``n_mol`` molecules drawn from ``pool`` (a new subset, in a
    new order), by ``TorsionSpace.batch`` of their spaces or, given ``data``
    (the pool as one batch), by ``data.take``; then a step through
    ``to_xyz(method)``."""
    import torch

    from zmat.rdkit import TorsionSpace

    rng = np.random.default_rng(seed)
    pick = rng.choice(len(pool), n_mol, replace=False)
    t = {}
    t0 = _now()
    ts = data.take(pick) if data is not None else TorsionSpace.batch([pool[k] for k in pick])
    t["layout"] = _now() - t0
    t0 = _now()
    table = ts.table if method == "table" else None
    t["table"] = _now() - t0
    torsions = torch.from_numpy(rng.uniform(-3, 3, len(ts.quads))).float().requires_grad_(True)
    t0 = _now()  # the per-device plans (zmat versions without these build them in the forward)
    if method == "table":
        prepare(table, torsions.device)
        route = getattr(ts, "_table_route", ts)  # zmat with the table route in zmat/_table_torsions.py
        for name in ("scatter", "frames", "_scatter", "_frames"):
            getattr(route, name, lambda *a: None)(torsions.dtype, torsions.device)
    else:
        rigid = getattr(ts, "_rigid_body", None)  # zmat with the rigid route in zmat/_rigid_torsions.py
        plan = rigid.plan if rigid is not None else getattr(ts, "_rigid_plan", lambda *a: None)
        plan(torsions.dtype, torsions.device)
    t["plan"] = _now() - t0
    t["forward"], t["backward"] = _step(lambda: ts.to_xyz(torsions, method=method), torsions)
    cached = [_step(lambda: ts.to_xyz(torsions, method=method), torsions) for _ in range(5)]
    t["cached forward"] = statistics.median(c[0] for c in cached)
    t["cached backward"] = statistics.median(c[1] for c in cached)
    return {"atoms": len(ts.positions), **t}


#: the real structures of the complex rows and how many of each a batch of 16 holds
#: (~880 residues a complex on average: protein-DNA, protein + ligands, DNA, RNA)
COMPLEX_MIX = {"1igy.pdb": 5, "3wip.pdb": 3, "5ugo.cif": 3, "3o5r.cif": 2, "4p5j.cif": 2, "1bna.cif": 1}


def complex_pool(names=None) -> dict:
    """``{(file, hydrogens): Complex}`` read once, tables and internal coordinates
    made (the data set's preprocessing, outside the records)."""
    import warnings

    from zmat.protein import from_pdb

    pool = {}
    for name in names or COMPLEX_MIX:
        for h in (False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                c = from_pdb(DATA / name, hydrogens=h, ligands=True)
            c.table, c.internal  # noqa: B018 (cached on the complex)
            pool[name, h] = c
    return pool


def complex_step(pool: dict, mix: dict, seed: int, hydrogens, padded: bool = False) -> dict:
    """A batch of ``mix`` (file -> count) complexes of ``pool`` in a new random
    order, each with hydrogens (``hydrogens`` True / False, or None: a coin
    flip each), through ``ComplexBatch``; the step is ``to_xyz`` of its
    internal coordinates, flat (``(N, 3)``) or ``padded`` (``(B, n_max, 3)``)."""

    from zmat.protein import ComplexBatch

    rng = np.random.default_rng(seed)
    names = [n for n, k in mix.items() for _ in range(k)]
    flags = rng.random(len(names)) < 0.5 if hydrogens is None else [hydrogens] * len(names)
    items = [pool[names[i], bool(flags[i])] for i in rng.permutation(len(names))]
    t = {}
    cpu = time.process_time()
    batch = _timed(t, "layout", lambda: ComplexBatch(items))
    table = _timed(t, "table", lambda: batch.table)
    leaf = batch.internal.float().requires_grad_(True)
    _timed(t, "plan", lambda: prepare(table, leaf.device))

    def forward():
        return batch.to_xyz(leaf)[0] if padded else batch.to_xyz(leaf, padded=False)

    t["forward"], t["backward"] = _step(forward, leaf)
    t["fresh cpu"] = time.process_time() - cpu
    cached, cpus = [], []
    for _ in range(5):
        cpu = time.process_time()
        cached.append(_step(forward, leaf))
        cpus.append(time.process_time() - cpu)
    t["cached forward"] = statistics.median(c[0] for c in cached)
    t["cached backward"] = statistics.median(c[1] for c in cached)
    t["cached cpu"] = statistics.median(cpus)
    return {"atoms": table.n_atoms, **t}


PHASES = ("layout", "table", "plan", "forward", "backward")


def _summarise(name: str, steps: list[dict]) -> dict:
    rec = {"section": "fresh", "case": name, "atoms": int(statistics.median(s["atoms"] for s in steps))}
    rec["batches"] = len(steps)
    for k in (*PHASES, "cached forward", "cached backward"):
        rec[k] = statistics.median(s[k] for s in steps)
    rec["fresh step"] = sum(rec[k] for k in PHASES)
    rec["cached step"] = rec["cached forward"] + rec["cached backward"]
    rec["fresh / cached"] = rec["fresh step"] / rec["cached step"]
    rec["cached ns/atom"] = statistics.median(
        (s["cached forward"] + s["cached backward"]) / s["atoms"] * 1e9 for s in steps
    )
    return rec


def run_fresh(quick: bool) -> list[dict]:
    import torch

    torch.manual_seed(0)
    protein_step(2, 50, seed=99)  # the process's first calls (imports, allocator) outside the records
    batches = 3 if quick else 5
    out = [_summarise("proteins 16 x 1000 res", [protein_step(16, 1000, s) for s in range(batches)])]
    if not quick:
        out.append(_summarise("proteins 16 x 256 res", [protein_step(16, 256, s) for s in range(batches)]))
        out.append(_summarise("proteins 64 x 128 res", [protein_step(64, 128, s) for s in range(batches)]))
    import inspect

    from zmat.protein import from_pdb

    if "hydrogens" in inspect.signature(from_pdb).parameters:  # (--compare: a zmat before complexes has none)
        out += run_complexes(batches)
    try:
        pool = torsion_dataset(300 if quick else 600)
    except ImportError:  # no RDKit: the tree rows only
        pool = None
    if pool:  # the data set as one batch, its table planned: preprocessing, outside the records
        from zmat.rdkit import TorsionSpace

        data = TorsionSpace.batch(pool)
        assert data.table.n_atoms == len(data.positions)
        # a batch of the data set: data.take(pick) (zmat versions without it: batch of the spaces)
        hows = {"data.take": data if hasattr(data, "take") else None, "TorsionSpace.batch": None}
    for how, method in [(h, m) for h in hows for m in ("rigid", "table")] if pool else ():
        torsion_step(pool, 8, 99, method, hows[how])
        steps = [torsion_step(pool, 256, s, method, hows[how]) for s in range(batches)]
        name = f"molecules 256 of {len(pool)} drug-like, {how}, {method}"
        out.append({**_summarise(name, steps), "via": "take" if hows[how] is not None else "batch"})
    data = molecule_dataset(1024)
    molecule_step(data, 8, seed=99, concatenate=False)
    import zmat

    for concat in (False, True)[: 1 + hasattr(zmat.ConstructionTable, "concatenate")]:
        how = "ConstructionTable.concatenate" if concat else "ConstructionTable(refs)"
        steps = [molecule_step(data, 256, s, concat) for s in range(batches)]
        out.append(_summarise(f"random trees 256 x ~55 atoms, {how}", steps))
    return out


def run_complexes(batches: int) -> list[dict]:
    """16 complexes of real structures (``COMPLEX_MIX``): all with hydrogens, none,
    and a coin flip each; ``cached ns/atom`` is the per-atom cost of fwd+bwd."""
    try:
        pool = complex_pool()
    except ImportError:  # no biotite
        return []
    complex_step(pool, {"1bna.cif": 2}, 99, True)
    out = []
    rows = [(True, "with H", False), (False, "no H", False), (None, "H or not", False)]
    for h, how, padded in [*rows, (True, "with H, padded", True), (False, "no H, padded", True)]:
        steps = [complex_step(pool, COMPLEX_MIX, s, h, padded) for s in range(batches)]
        rec = _summarise(f"complexes 16 x ~880 res, {how}", steps)
        # process CPU time (all threads) of the fresh step over the cached one: the load-robust ratio
        rec["fresh / cached cpu"] = statistics.median(s["fresh cpu"] / s["cached cpu"] for s in steps)
        out.append(rec)
    return out


# ----------------------------------------------------------------- latency
def _chain(n: int):
    return [[-1, -1, -1], [0, -1, -1], [1, 0, -1]] + [[i - 1, i - 2, i - 3] for i in range(3, n)]


def latency_cases() -> list:
    """``(name, table, C)``: batch-1 problems (float32)."""
    import torch

    import zmat
    from zmat.protein import from_pdb

    g = torch.Generator().manual_seed(0)
    out = [("chain 12 atoms", zmat.ConstructionTable(_chain(12)), torch.rand(12, 3, generator=g) + 0.5)]
    for name in ("1ubi", "1aki", "1igy"):
        p = from_pdb(DATA / f"{name}.pdb")
        out.append((f"{name} ({p.n_atoms} atoms)", p.table, p.internal.float()))
    return out


def count_ops(table, C) -> tuple[int, int]:
    import torch

    import zmat
    from zmat.testing import DispatchAudit

    C = C.detach().requires_grad_(True)
    x = zmat.to_xyz(C, table)
    torch.autograd.grad(x, C, torch.ones_like(x))
    with DispatchAudit() as fwd:
        x = zmat.to_xyz(C, table)
    g = torch.ones_like(x)
    with DispatchAudit() as bwd:
        torch.autograd.grad(x, C, g)
    return fwd.count, bwd.count


def tmol_latency(name: str) -> dict:
    """tmol's kinematics on ``tests/data/{name}.pdb`` (amino acids only: tmol
    rejects the files' ligands), its kinematic tree built the way its own
    ``_apply_torsion_deltas`` does (``FoldForest.reasonable_fold_forest``,
    ``PoseStackKinematicsModule``, ``inverse_kin``). tmol adds hydrogens, so
    its atom count is about twice zmat's (heavy atoms). Raises ImportError
    without tmol (``pip install tmol``)."""
    import biotite.structure as struc
    import torch
    from tmol.io._pose_stack_from_biotite import pose_stack_from_atom_array
    from tmol.io._structure_io import atom_array_from_file
    from tmol.kinematics import PoseStackKinematicsModule
    from tmol.kinematics._fold_forest import FoldForest
    from tmol.kinematics.compiled import inverse_kin

    t0 = _now()
    arr = atom_array_from_file(str(DATA / f"{name}.pdb"), None, model=1)
    arr = arr[struc.filter_amino_acids(arr) & ~arr.hetero]
    pose = pose_stack_from_atom_array(arr, torch.device("cpu"))
    module = PoseStackKinematicsModule(pose, FoldForest.reasonable_fold_forest(pose))
    forest = module.kmd.forest
    xyz = torch.zeros((forest.id.shape[0], 3), dtype=torch.float32)
    xyz[1:] = pose.coords.view(-1, 3)[forest.id[1:].to(torch.int64)]
    dofs = inverse_kin(xyz, forest.parent, forest.frame_x, forest.frame_y, forest.frame_z, forest.doftype)
    setup = _now() - t0
    d = dofs.detach().clone().requires_grad_(True)
    g = torch.ones_like(module(d))

    def fwd():
        with torch.no_grad():
            module(d)

    def fwd_bwd():
        torch.autograd.grad(module(d), d, g)

    fwd_bwd()
    return {"tmol atoms": int(forest.id.shape[0] - 1), "tmol setup": setup, "tmol fwd": _median_time(fwd),
            "tmol fwd+bwd": _median_time(fwd_bwd)}  # fmt: skip


class _NoKernel:
    """``with _NoKernel():`` the analytic method's pure-PyTorch path (``ZMAT_NO_KERNEL=1``)."""

    def __enter__(self):
        self.old = os.environ.get("ZMAT_NO_KERNEL")
        os.environ["ZMAT_NO_KERNEL"] = "1"

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("ZMAT_NO_KERNEL")
        else:
            os.environ["ZMAT_NO_KERNEL"] = self.old


@functools.cache
def _kernel_load() -> tuple[bool, float]:
    """Whether zmat has the compiled CPU kernel, and the seconds its first load
    took in this process (the one-time build on a fresh machine, else a load
    from the cache)."""
    try:
        from zmat import _kernel
    except ImportError:  # a zmat from before the kernel (--compare)
        return False, 0.0
    t0 = _now()
    ok = not _kernel.disabled() and _kernel.load() is not None
    return ok, _now() - t0


def run_latency(compile_: bool = False, rounds: int = 3) -> list[dict]:
    """Batch-1 latency; where zmat has its compiled CPU kernel, the pure-PyTorch
    path beside it (``torch ...`` columns), alternating ``rounds`` times."""
    import torch

    import zmat

    kernel, load = _kernel_load()
    out = []
    for name, tab, C0 in latency_cases():
        C = C0.clone().requires_grad_(True)
        g = torch.ones_like(C)
        rec = {"section": "latency", "case": name, "atoms": tab.n_atoms, "kernel": kernel}
        if kernel:
            rec["kernel load"] = load
        rec["ops fwd"], rec["ops bwd"] = count_ops(tab, C0)
        fns = {"eager": lambda c, tab=tab: zmat.to_xyz(c, tab)}
        if compile_:
            zmat.to_xyz(C, tab)  # plans built eagerly, outside the graph
            fns["compiled"] = torch.compile(fns["eager"], dynamic=False)
        modes = [(how, fn, None) for how, fn in fns.items()]
        if kernel:
            modes.append(("torch", fns["eager"], _NoKernel))
            with _NoKernel():
                rec["torch ops fwd"], rec["torch ops bwd"] = count_ops(tab, C0)
        times: dict = {}
        for _ in range(rounds if kernel else 1):
            for how, fn, ctx in modes:

                def fwd(fn=fn, C=C):
                    with torch.no_grad():
                        fn(C)

                def fwd_bwd(fn=fn, C=C, g=g):
                    torch.autograd.grad(fn(C), C, g)

                with ctx() if ctx else contextlib.nullcontext():
                    fwd_bwd()
                    fwd_bwd()
                    times.setdefault(f"{how} fwd", []).append(_median_time(fwd))
                    times.setdefault(f"{how} fwd+bwd", []).append(_median_time(fwd_bwd))
        rec.update({key: statistics.median(v) for key, v in times.items()})
        if kernel:
            rec["torch / kernel fwd+bwd"] = rec["torch fwd+bwd"] / rec["eager fwd+bwd"]
        if not name.startswith("chain"):
            try:
                rec.update(tmol_latency(name.split()[0]))
                rec["tmol / zmat fwd+bwd"] = rec["tmol fwd+bwd"] / rec["eager fwd+bwd"]
            except ImportError:
                rec["tmol"] = "not installed"
        out.append(rec)
    return out


# -------------------------------------------------------------------- busy
def _busy_cases() -> list:
    """``(name, leaf, forward)``: the step differentiates ``forward()`` in ``leaf``."""
    import torch

    import zmat
    from zmat.protein import ProteinBatch, from_pdb

    p = from_pdb(DATA / "3wip.pdb")
    rng = np.random.default_rng(1)
    batch = ProteinBatch(["".join(rng.choice(list(AMINO), 256)) for _ in range(16)])
    tors = torch.from_numpy(rng.uniform(-3, 3, (16, batch.L_max, 7))).float().requires_grad_(True)
    c12 = latency_cases()[0]
    out = [(c12[0], c12[2].clone(), c12[1]), ("3wip batch 1", p.internal.float(), p.table)]
    out = [(name, C.requires_grad_(True), functools.partial(zmat.to_xyz, C, table)) for name, C, table in out]
    out.append(("proteins 16 x 256 res", tors, lambda: batch.to_xyz(tors)))
    with torch.no_grad():
        xyz = batch.to_xyz(tors).requires_grad_(True)
    pairs, radii = batch.clash_pairs(xyz), batch.radii.float()  # a list made every few steps
    clash = functools.partial(zmat.clash_loss, xyz, radii, pairs=pairs, mask=batch.atom_mask)
    out.append(("clash_loss(pairs=) 16 x 256 res", xyz, clash))
    if hasattr(zmat.protein, "structural_violations"):
        whole = ProteinBatch(batch.sequences)  # its own: the step reads more of a batch
        out.append(("proteins 16 x 256 res, whole step", *_whole_step(whole, rng)))
    return out


def _whole_step(batch, rng):
    """A structure model's training step on ``batch``: torsions -> coordinates ->
    ``clash_loss(pairs=)`` + AlphaFold's ``structural_violations`` (its loss),
    both pair lists made once, outside the step, as a training loop reuses a
    Verlet list. Near-helical backbones, random side chains."""
    import torch

    import zmat
    import zmat.protein as zp
    from zmat.protein.atom37 import aatype_of, to_atom37

    tors = torch.from_numpy(rng.uniform(-np.pi, np.pi, (len(batch), batch.L_max, 7))).float()
    tors[..., :3] = torch.tensor([-57.0, -47.0, 180.0]).deg2rad()
    tors.requires_grad_(True)
    with torch.no_grad():
        xyz = batch.to_xyz(tors)
        pos37, mask37 = to_atom37(batch, xyz)
    aatype = aatype_of(batch)
    pairs = batch.clash_pairs(xyz)
    pos14, mask14 = zp.atom37_to_atom14(pos37, aatype, mask37)
    af_pairs = zp.clash_pairs(pos14, mask14, aatype, torch.arange(batch.L_max), skin=1.0)
    radii, mask = batch.radii.float(), batch.atom_mask

    def forward():
        x = batch.to_xyz(tors)
        loss = zmat.clash_loss(x, radii, pairs=pairs, mask=mask).sum()
        x37 = to_atom37(batch, x)[0]
        return loss + zp.structural_violations(x37, aatype, mask37, pairs=af_pairs)["loss"].sum()

    return tors, forward


def run_busy() -> list[dict]:
    import torch

    from zmat.testing import DispatchAudit

    default = torch.get_num_threads()
    out = []
    for name, leaf, forward in _busy_cases():
        # the loss gradient, made once: a loss is the user's, and a ones_like
        # of the output is itself a parallel region on a batch
        g = torch.ones_like(forward())

        def step(forward=forward, leaf=leaf, g=g):
            torch.autograd.grad(forward(), leaf, g)

        rec = {"section": "busy", "case": name + " fwd+bwd", "default threads": default}
        step()
        with DispatchAudit() as audit:  # each elementwise op on a batch is a parallel region
            step()
        rec["ops/step"] = audit.count
        for threads in sorted({default, 1}, reverse=True):
            torch.set_num_threads(threads)
            step()
            idle = _median_time(step)
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                time.sleep(0.2)
                busy = _median_time(step, seconds=1.0)
            finally:
                spinner.kill()
                spinner.wait()
            rec[f"{threads} thr idle"] = idle
            rec[f"{threads} thr busy"] = busy
            rec[f"{threads} thr slowdown"] = busy / idle
        torch.set_num_threads(default)
        out.append(rec)
    return out


# ----------------------------------------------------------------- scaling
def run_scaling(quick: bool) -> list[dict]:
    import torch

    import zmat

    out = []
    grid = [(1000, 1), (10000, 1), (100000, 1), (1000, 4), (1000, 16), (1000, 64)]
    if quick:
        grid = [(1000, 1), (10000, 1), (1000, 16)]
    for n, b in grid:
        table = zmat.ConstructionTable(_chain(n))
        g = torch.Generator().manual_seed(0)
        C = (torch.rand(b, n, 3, generator=g) + 0.5).requires_grad_(True)
        grad = torch.ones_like(C)

        def step(C=C, table=table, grad=grad):
            torch.autograd.grad(zmat.to_xyz(C, table), C, grad)

        step()
        s = _median_time(step)
        out.append({"section": "scaling", "case": f"chain {n} atoms x {b}", "atoms": n * b, "fwd+bwd": s,
                    "per atom": s / (n * b)})  # fmt: skip
    n = 100_000
    for shape, refs in _table_shapes(n).items():
        s = _median_time(functools.partial(zmat.ConstructionTable, refs), repeat=3)
        out.append({"section": "scaling", "case": f"table {shape} {n} atoms", "atoms": n, "table": s,
                    "per atom": s / n})  # fmt: skip
    return out


def _table_shapes(n: int) -> dict:
    """Tables of ``n`` atoms: a chain, ``n`` roots, a star on atom 0."""
    chain = np.full((n, 3), -1, np.int64)
    i = np.arange(n)
    chain[1:, 0], chain[2:, 1], chain[3:, 2] = i[:-1], i[:-2], i[:-3]
    star = np.full((n, 3), -1, np.int64)
    star[1:, 0] = 0
    return {"chain": chain, "roots": np.full((n, 3), -1, np.int64), "star": star}


# ---------------------------------------------------------------- running
def run(sections, quick: bool, compile_: bool = False) -> list[dict]:
    _kernel_load()  # the compiled kernel's one-time load is no part of a fresh step
    records = []
    if "fresh" in sections:
        records += run_fresh(quick)
    if "ratios" in sections:
        from .fresh_ratios import run as run_ratios

        records += run_ratios()
    if "latency" in sections:
        records += run_latency(compile_)
    if "busy" in sections:
        records += run_busy()
    if "scaling" in sections:
        records += run_scaling(quick)
    if "limits" in sections:
        from .limits import run as run_limits

        records += run_limits()
    return records


def run_child(sections, quick: bool, zmat_root: Path | None = None, compile_: bool = False) -> list[dict]:
    """The sections in a fresh child process (the runner's allocator settings);
    ``zmat_root``: import zmat from there instead."""
    from .run import ALLOCATOR_ENV

    env = {**os.environ, **ALLOCATOR_ENV, "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "benchmarks.fresh", "--json", "-", "--sections", *sections]
    cmd += ["--zmat-root", str(zmat_root)] if zmat_root else []
    cmd += ["--quick"] if quick else []
    cmd += ["--compile"] if compile_ else []
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(f"benchmarks.fresh failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


RATIO_KEYS = ("eager fwd", "eager fwd+bwd", "fwd+bwd", "fresh step", "cached step", "table")


def compare(old: Path, sections=("latency", "scaling"), rounds: int = 3) -> list[dict]:
    """``sections`` with this zmat and the one in ``old``, alternating child
    processes (a busy machine slows both alike); medians over ``rounds``, and
    the ratios old / new of the times in ``RATIO_KEYS``."""
    runs: dict = {"old": [], "new": []}
    for _ in range(rounds):
        for who, root in (("old", old), ("new", None)):
            runs[who].append({r["case"]: r for r in run_child(sections, quick=False, zmat_root=root)})
    out = []
    for case, rec in runs["new"][0].items():
        if case not in runs["old"][0]:
            continue
        row = {"section": "compare", "case": case}
        for key, value in rec.items():
            if key.startswith(("ops", "atoms")) or not isinstance(value, float):
                if key.startswith("ops"):
                    row[f"{key} old"], row[f"{key} new"] = runs["old"][0][case].get(key), value
                continue
            if key not in runs["old"][0][case]:
                continue
            o = statistics.median(r[case][key] for r in runs["old"])
            n = statistics.median(r[case][key] for r in runs["new"])
            row[f"{key} old"], row[f"{key} new"] = o, n
            if key in RATIO_KEYS:
                row[f"{key} ratio"] = o / n
        out.append(row)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fresh", description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--quick", action="store_true", help="fewer batches and sizes")
    p.add_argument("--compile", action="store_true", help="add torch.compile'd latency columns (slow)")
    p.add_argument("--compare", type=Path, metavar="DIR", help="zmat package root to compare against")
    p.add_argument("--json", help="write the records here ('-': stdout, last line)")
    p.add_argument("--zmat-root", type=Path, help=argparse.SUPPRESS)  # import zmat from there
    a = p.parse_args(argv)
    if a.zmat_root:
        sys.path.insert(0, str(a.zmat_root))
        import zmat

        assert Path(zmat.__file__).resolve().is_relative_to(a.zmat_root.resolve()), zmat.__file__
    if a.compare:
        records = compare(a.compare, a.sections if a.sections != list(SECTIONS) else ("latency", "scaling"))
    else:
        records = run(a.sections, a.quick, a.compile)
    if a.json == "-":
        print(json.dumps(records))
        return 0
    print(table(records))
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
