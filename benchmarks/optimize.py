"""Geometry optimisation: zmat.optimize against geomeTRIC, Sella, pyberny and ASE's optimisers.

``python -m benchmarks --suite optimize`` (or ``python -m benchmarks.optimize``).

1. **Baker set** (30 molecules, pyberny's copy ``berny/benchmarks/baker_shajan_2023/``),
   GFN2-xTB through tblite's ASE calculator. One stopping rule for every
   optimiser: the first evaluated geometry whose largest per-atom force norm
   is below 0.01 eV/A (each optimiser runs with its own threshold far below
   that, and a calculator wrapper stops it). Steps = energy+gradient calls.
   Printed: steps per molecule and optimiser, totals, converged counts, final
   energies (a ``*`` marks a run that stopped more than 1 meV above the
   lowest energy any optimiser found: a saddle, the Baker starts being
   symmetric), and each optimiser's own time per step (wall time minus the
   calculator's). The default runs a quick subset (the 12 smallest
   molecules); ``--full`` all 30.
2. **Drug-like molecules** (``--sets druglike``): ten molecules from SMILES
   (:data:`DRUGLIKE`), hydrogens added, one RDKit ETKDGv3 conformer each
   (``randomSeed=42``) as the start; flexible torsions. **Water clusters**
   (``--sets water``): (H2O)6 and (H2O)12, geomeTRIC's test geometries
   (``geometric/data/water6.pdb``, ``water12.xyz`` of the installed package);
   twelve fragments. Same calculator, rule and table as the Baker set; zmat
   runs with ``coords="redundant"`` (``zmat``) and ``coords="tric"``
   (``zmat-TRIC``).
3. **Batched throughput** of :func:`zmat.optimize.minimize` with a torch
   potential (:class:`zmat.optimize.ToyForceField` on histidine, 20 atoms,
   rattled conformers) at B = 1, 64, 1024: conformers per second and the
   optimiser's overhead per conformer-step (time minus the potential's, over
   iterations x B), in wall time and in process CPU time (the one to read on a
   shared machine; with ``--threads 1`` it is the optimiser's own).

Peers are bench dependencies (``pip install -e '.[bench]'``); a missing one is
reported as skipped. Results go to ``--out`` (``optimize.json``, ``optimize.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import torch

from zmat.optimize.steps import BOHR, HARTREE

FTOL = 0.01  # eV/A, the one stopping rule
QUICK = (
    "water", "ammonia", "acetylene", "methylamine", "ethane", "allene", "ethanol", "furan",
    "acetone", "hydroxysulfane", "disilyl_ether", "neopentane",
)  # fmt: skip
OUT = Path(__file__).resolve().parent.parent / "results" / "benchmarks"
DRUGLIKE = {
    "aspirin": "CC(=O)Oc1ccccc1C(=O)O",
    "ibuprofen": "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
    "caffeine": "Cn1cnc2c1c(=O)n(C)c(=O)n2C",
    "paracetamol": "CC(=O)Nc1ccc(O)cc1",
    "nicotine": "CN1CCCC1c1cccnc1",
    "lidocaine": "CCN(CC)CC(=O)Nc1c(C)cccc1C",
    "diphenhydramine": "CN(C)CCOC(c1ccccc1)c1ccccc1",
    "naproxen": "COc1ccc2cc(ccc2c1)C(C)C(=O)O",
    "salbutamol": "CC(C)(C)NCC(O)c1ccc(O)c(CO)c1",
    "procaine": "CCN(CC)CCOC(=O)c1ccc(N)cc1",
}


class Converged(Exception):
    """Raised by the counting calculator at the first geometry that meets the rule."""


class OutOfTime(Exception):
    """Raised by an alarm when one run takes longer than ``--max-seconds`` (its row says so)."""


def _alarm(signum, frame):
    raise OutOfTime


def baker_dir() -> Path:
    import berny

    return Path(berny.__file__).parent / "benchmarks" / "baker_shajan_2023"


class Counting:
    """A calculator's calls, counted and timed; :class:`Converged` at the first converged geometry."""

    def __init__(self, atoms, calc, max_calls: int):
        self.atoms, self.calc, self.max_calls = atoms, calc, max_calls
        self.calls, self.seconds, self.energy, self.done = 0, 0.0, None, False
        self.cache = None

    def evaluate(self, positions: np.ndarray) -> tuple[float, np.ndarray]:
        key = positions.tobytes()
        if self.cache is not None and self.cache[0] == key:
            return self.cache[1], self.cache[2]
        probe = self.atoms.copy()
        probe.positions = positions
        probe.calc = self.calc
        t = time.perf_counter()
        e = probe.get_potential_energy()
        f = probe.get_forces()
        self.seconds += time.perf_counter() - t
        self.calls += 1
        self.cache = (key, e, f)
        self.energy = e
        if np.linalg.norm(f, axis=1).max() < FTOL:
            self.done = True
            raise Converged
        if self.calls >= self.max_calls:
            raise Converged
        return e, f


def ase_calculator(counter: Counting):
    from ase.calculators.calculator import Calculator, all_changes

    class Calc(Calculator):
        implemented_properties = ["energy", "forces"]

        def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
            super().calculate(atoms, properties, system_changes)
            e, f = counter.evaluate(atoms.positions.copy())
            self.results = {"energy": e, "forces": f}

    return Calc()


# ------------------------------------------------------------------ the optimisers, one way to call each
def run_ase_optimizer(cls, counter, atoms, **kw):
    a = atoms.copy()
    a.calc = ase_calculator(counter)
    cls(a, logfile=None, **kw).run(fmax=1e-6, steps=10**6)


def run_zmat(counter, atoms, coords="redundant"):
    import zmat.ase

    run_ase_optimizer(zmat.ase.InternalOptimizer, counter, atoms, coords=coords)


def run_zmat_tric(counter, atoms):
    run_zmat(counter, atoms, coords="tric")


def run_sella(counter, atoms):
    from sella import Sella

    run_ase_optimizer(Sella, counter, atoms, internal=True, order=0)


def run_pyberny(counter, atoms):
    from berny import Berny, geomlib

    tight = {
        "gradientmax": 1e-10,
        "gradientrms": 1e-10,
        "stepmax": 1e-12,
        "steprms": 1e-12,
    }  # the rule stops it
    geom = geomlib.Geometry(atoms.get_chemical_symbols(), atoms.positions)
    opt = Berny(geom, maxsteps=10**6, symmetry="nowarn", **tight)
    for geom in opt:
        e, f = counter.evaluate(np.asarray(geom.coords, dtype=float))
        opt.send((e / HARTREE, -f * BOHR / HARTREE))


def run_geometric(counter, atoms):
    import tempfile

    import geometric.engine
    import geometric.molecule
    import geometric.optimize

    class Engine(geometric.engine.Engine):
        def calc_new(self, coords, dirname):
            e, f = counter.evaluate(coords.reshape(-1, 3) * BOHR)
            return {"energy": e / HARTREE, "gradient": (-f * BOHR / HARTREE).ravel()}

    mol = geometric.molecule.Molecule()
    mol.elem = atoms.get_chemical_symbols()
    mol.xyzs = [atoms.positions.copy()]
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as null, redirect_stdout(null):
        geometric.optimize.run_optimizer(
            customengine=Engine(mol), input=str(Path(tmp) / "x"), coordsys="tric", maxiter=10**4,
            convergence_gmax=1e-8, convergence_grms=1e-8, convergence_drms=1e-10, convergence_dmax=1e-10,
            convergence_energy=1e-12,
        )  # fmt: skip


def _ase(name):
    def run(counter, atoms):
        import ase.optimize

        run_ase_optimizer(getattr(ase.optimize, name), counter, atoms)

    return run


OPTIMIZERS = {
    "zmat": (run_zmat, None),
    "zmat-TRIC": (run_zmat_tric, None),
    "pyberny": (run_pyberny, "berny"),
    "geomeTRIC": (run_geometric, "geometric"),
    "Sella": (run_sella, "sella"),
    "ASE-BFGS": (_ase("BFGS"), None),
    "ASE-LBFGS": (_ase("LBFGS"), None),
    "ASE-FIRE": (_ase("FIRE"), None),
}


def _available(module):
    if module is None:
        return None
    try:
        __import__(module)
    except Exception as e:  # noqa: BLE001 - any import failure means "skip this peer"
        return f"skipped: {module} not importable ({type(e).__name__})"
    return None


def druglike() -> dict:
    """``{name: ase.Atoms}``: each of :data:`DRUGLIKE` with hydrogens, one ETKDGv3 conformer (seed 42)."""
    from ase import Atoms
    from rdkit import Chem
    from rdkit.Chem import AllChem

    out = {}
    for name, smiles in DRUGLIKE.items():
        mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
        params = AllChem.ETKDGv3()
        params.randomSeed = 42
        if AllChem.EmbedMolecule(mol, params) != 0:
            raise RuntimeError(f"ETKDG found no conformer for {name}")
        out[name] = Atoms([a.GetSymbol() for a in mol.GetAtoms()], mol.GetConformer().GetPositions())
    return out


def water_clusters() -> dict:
    """``{name: ase.Atoms}``: geomeTRIC's (H2O)6 and (H2O)12 test geometries."""
    import ase.io
    import geometric

    data = Path(geometric.__file__).parent / "data"
    return {"water6": ase.io.read(data / "water6.pdb"), "water12": ase.io.read(data / "water12.xyz")}


def baker(names, optimizers, max_calls: int, **kw) -> dict:
    import ase.io

    return run_set({n: ase.io.read(baker_dir() / f"{n}.xyz") for n in names}, optimizers, max_calls, **kw)


def run_set(
    structures: dict, optimizers, max_calls: int, rows=None, save=lambda: None, max_seconds: float = 0
) -> dict:
    """Every optimiser on every ``{name: ase.Atoms}``: steps, convergence, final energy, own time.

    ``rows`` is filled in place (pass the dict a ``save()`` writes out after every run, so a run that
    is stopped keeps what it measured)."""
    import logging
    import signal

    from tblite.ase import TBLite

    logging.getLogger("geometric").setLevel(logging.ERROR)
    logging.getLogger("geometric.nifty").setLevel(logging.ERROR)
    rows = {} if rows is None else rows
    for name, atoms in structures.items():  # pyberny prints its log on stdout: quiet it with a logging level
        logging.getLogger("berny").setLevel(logging.ERROR)
        atoms = atoms.copy()
        atoms.pbc = False
        rows[name] = {}
        for opt in optimizers:
            fn, module = OPTIMIZERS[opt]
            skip = _available(module)
            if skip:
                rows[name][opt] = {"status": skip}
                continue
            counter = Counting(atoms, TBLite(method="GFN2-xTB", verbosity=0), max_calls)
            t = time.perf_counter()
            status = "ok"
            old = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, max_seconds)  # 0: no limit
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fn(counter, atoms)
            except Converged:
                pass
            except OutOfTime:
                status = f"out of time: over {max_seconds:.0f} s"
            except Exception as e:  # noqa: BLE001 - a peer's failure is a result, not a crash
                status = f"failed: {type(e).__name__}: {e}"[:120]
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
            wall = time.perf_counter() - t
            if status == "ok" and not counter.done:
                status = f"not converged in {max_calls} calls"
            rows[name][opt] = {
                "status": status,
                "steps": counter.calls,
                "converged": counter.done,
                "energy": counter.energy,
                "own_ms_per_step": 1e3 * (wall - counter.seconds) / max(counter.calls, 1),
            }
            print(f"  {name:24s} {opt:10s} {counter.calls:4d} {status}", flush=True)
            save()
    return rows


def baker_table(rows: dict, optimizers) -> str:
    lowest = {
        n: min((r["energy"] for r in row.values() if r.get("converged")), default=None)
        for n, row in rows.items()
    }
    head = "| molecule | " + " | ".join(optimizers) + " |"
    lines = [head, "|" + "---|" * (len(optimizers) + 1)]
    totals = dict.fromkeys(optimizers, 0)
    conv = dict.fromkeys(optimizers, 0)
    saddles = dict.fromkeys(optimizers, 0)
    own = {o: [] for o in optimizers}
    for n, row in rows.items():
        cells = []
        for o in optimizers:
            r = row.get(o, {})  # absent: a stopped run had not reached it
            if "steps" not in r:
                cells.append("skip" if r else "-")
                continue
            totals[o] += r["steps"]
            own[o].append(r["own_ms_per_step"])
            mark = ""
            if not r["converged"]:
                mark = " (no)"
            elif lowest[n] is not None and r["energy"] > lowest[n] + 1e-3:
                mark, saddles[o] = " *", saddles[o] + 1
            conv[o] += bool(r["converged"])
            cells.append(f"{r['steps']}{mark}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("| **total steps** | " + " | ".join(f"**{totals[o]}**" for o in optimizers) + " |")
    lines.append("| converged | " + " | ".join(f"{conv[o]}/{len(rows)}" for o in optimizers) + " |")
    lines.append("| above the lowest minimum (*) | " + " | ".join(str(saddles[o]) for o in optimizers) + " |")
    lines.append(
        "| own time per step (median ms) | "
        + " | ".join(f"{np.median(own[o]):.1f}" if own[o] else "-" for o in optimizers)
        + " |"
    )
    return "\n".join(lines)


def throughput(batches, max_steps: int = 60) -> list[dict]:
    """minimize() with ToyForceField on histidine: conformers/s and overhead per conformer-step."""
    import ase.io

    import zmat.optimize as zo

    atoms = ase.io.read(baker_dir() / "histidine.xyz")
    ff = zo.ToyForceField(atoms.numbers, atoms.positions)
    calls = [0]

    def energy(x):
        calls[0] += 1
        return ff(x)

    out = []
    gen = torch.Generator().manual_seed(0)
    for bsz in batches:
        x0 = torch.tensor(atoms.positions)[None] + 0.05 * torch.randn(bsz, len(atoms), 3, generator=gen)
        zo.minimize(ff, x0[:1], fmax=FTOL, max_steps=3, numbers=atoms.numbers)  # warm up
        runs = []  # a small batch is one short run: repeat it (>= 1 s in all, at most 30), take medians
        while not runs or (sum(w for w, _ in runs) < 1.0 and len(runs) < 30):
            calls[0] = 0
            t, c = time.perf_counter(), time.process_time()
            res = zo.minimize(energy, x0, fmax=FTOL, max_steps=max_steps, numbers=atoms.numbers)
            runs.append((time.perf_counter() - t, time.process_time() - c))
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        # the potential's own cost (forward and backward at this batch), timed apart
        xg = x0.clone().requires_grad_(True)
        t, c = time.perf_counter(), time.process_time()
        for _ in range(5):
            torch.autograd.grad(ff(xg).sum(), xg)
        potential = calls[0] * (time.perf_counter() - t) / 5
        potential_cpu = calls[0] * (time.process_time() - c) / 5
        overhead = (wall - potential) / (calls[0] * bsz)
        overhead_cpu = (cpu - potential_cpu) / (calls[0] * bsz)
        out.append(
            {
                "B": bsz,
                "runs": len(runs),
                "iterations": calls[0],
                "converged": int(res.converged.sum()),
                "mean_steps": float(res.steps.double().mean()),
                "wall_s": wall,
                "conformers_per_s": bsz / wall,
                "overhead_us_per_conformer_step": 1e6 * overhead,
                "overhead_cpu_us_per_conformer_step": 1e6 * overhead_cpu,
            }
        )
        print(f"  B={bsz}: {out[-1]}", flush=True)
    return out


def throughput_table(rows) -> str:
    lines = [
        "| B | iterations | converged | mean steps | wall (s) | conformers/s | overhead per conformer-step "
        "(wall) | (process CPU) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['B']} | {r['iterations']} | {r['converged']}/{r['B']} | {r['mean_steps']:.1f} | "
            f"{r['wall_s']:.2f} | {r['conformers_per_s']:.1f} | "
            f"{r['overhead_us_per_conformer_step']:.0f} us | "
            f"{r['overhead_cpu_us_per_conformer_step']:.0f} us |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks --suite optimize", description=__doc__.split("\n")[0]
    )
    p.add_argument("--full", action="store_true", help="all 30 Baker molecules (default: the 12 smallest)")
    p.add_argument("--molecules", nargs="+", help="these Baker molecules")
    p.add_argument("--optimizers", nargs="+", choices=list(OPTIMIZERS), default=list(OPTIMIZERS))
    p.add_argument("--batches", nargs="*", type=int, default=[1, 64, 1024], help="none: skip the throughput")
    p.add_argument(
        "--max-calls", type=int, default=300, help="calls after which a run counts as not converged"
    )
    p.add_argument(
        "--max-seconds", type=float, default=3600, help="wall time after which one run is stopped (0: none)"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--throughput-steps", type=int, default=60,
        help="most iterations of each batched run (fewer: a quick overhead figure, e.g. "
        "--no-baker --batches 1024 --throughput-steps 5)",
    )  # fmt: skip
    p.add_argument("--no-baker", action="store_true")
    p.add_argument(
        "--sets", nargs="*", choices=["druglike", "water"], default=[],
        help="also these sets: ten drug-like molecules (RDKit conformers), water clusters (H2O)6, (H2O)12",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    result = {}
    text = []
    a.out.mkdir(parents=True, exist_ok=True)

    def save():  # after every run: a stopped benchmark keeps its rows
        (a.out / "optimize.json").write_text(json.dumps(result, indent=1, default=float))

    if not a.no_baker:
        names = a.molecules or (sorted(f.stem for f in baker_dir().glob("*.xyz")) if a.full else QUICK)
        print(
            f"Baker set, GFN2-xTB (tblite), {len(names)} molecules, stop at max |F_i| < {FTOL} eV/A",
            flush=True,
        )
        rows = result["baker"] = {}
        baker(names, a.optimizers, a.max_calls, rows=rows, save=save, max_seconds=a.max_seconds)
        text.append("Baker set, GFN2-xTB, steps = energy+gradient calls to max |F_i| < 0.01 eV/A\n")
        text.append(baker_table(rows, a.optimizers))
    for name in a.sets:
        structures = druglike() if name == "druglike" else water_clusters()
        print(f"{name}: {len(structures)} structures, GFN2-xTB, stop at max |F_i| < {FTOL} eV/A", flush=True)
        rows = result[name] = {}
        run_set(structures, a.optimizers, a.max_calls, rows=rows, save=save, max_seconds=a.max_seconds)
        text.append(f"\n{name}, GFN2-xTB, steps = energy+gradient calls to max |F_i| < 0.01 eV/A\n")
        text.append(baker_table(rows, a.optimizers))
    if a.batches:
        print("batched throughput, ToyForceField on histidine (20 atoms)", flush=True)
        rows = throughput(a.batches, a.throughput_steps)
        result["throughput"] = rows
        text.append(
            "\nzmat.optimize.minimize, batched, torch potential (ToyForceField, histidine, 20 atoms)\n"
        )
        text.append(throughput_table(rows))
    out = "\n".join(text)
    print("\n" + out)
    save()
    (a.out / "optimize.md").write_text(out + "\n")


if __name__ == "__main__":
    main()
