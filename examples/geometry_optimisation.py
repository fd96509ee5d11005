"""Geometry optimisation and a relaxed dihedral scan in internal coordinates.

An ASE calculator gives energies and Cartesian forces ``F = -dE/dx``. zmat's
``to_xyz`` is differentiable, so autograd turns the forces into the gradient
with respect to the internal coordinates in one vector-Jacobian product,
``dE/dC = -(dx/dC)^T F``; ``zmat.ase.InternalEnergy`` is that bridge::

    energy = zmat.ase.InternalEnergy(zm, calc)
    energy(C).backward()        # C requires grad; C.grad = dE/dC

and any torch optimiser (here L-BFGS) works on bond lengths, angles and
dihedrals directly. Freezing a coordinate is just leaving it out of the
optimised tensor, which makes a *relaxed scan* trivial: fix the dihedral,
relax everything else, move on.

Default (no arguments, a few seconds): hydrogen peroxide (``peroxide.xyz``,
planar trans) with a small force field built from ASE's ``ForceField``
calculator (Morse bonds, harmonic angles, a two-term torsion chosen to mimic
H2O2's skewed minimum near 112 degrees). It runs a relaxed H-O-O-H scan from 0
to 180 degrees and a full optimisation, and compares with ASE's Cartesian BFGS.

Bigger runs::

    python examples/geometry_optimisation.py --scan-points 73
    python examples/geometry_optimisation.py --molecule tests/data/cyclohexane_chair.xyz \\
        --calculator emt --rattle 0.05 --steps 500
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import ase.io
import numpy as np
import torch
from ase.calculators.emt import EMT
from ase.calculators.ff import ForceField
from ase.optimize import BFGS
from ase.utils.ff import Angle, Dihedral, Morse, VdW

import zmat
import zmat.ase

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def peroxide_force_field() -> ForceField:
    """A toy force field for H-O-O-H (atoms in that order), energies in eV.

    Morse O-H and O-O bonds, harmonic H-O-O angles (100 deg), and the torsion
    ``k1 (1 + cos phi) + k2 (1 + cos 2 phi)`` with ``k1 = 1.5 k2``: minimum at
    ``cos phi = -k1 / (4 k2)``, i.e. about 112 deg, trans barrier about
    1 kcal/mol, cis barrier about 5 kcal/mol; plus an H...H Lennard-Jones term.
    """
    k2 = 0.061
    return ForceField(
        morses=[
            Morse(0, 1, D=4.6, alpha=2.2, r0=0.967),
            Morse(2, 3, D=4.6, alpha=2.2, r0=0.967),
            Morse(1, 2, D=2.2, alpha=2.0, r0=1.464),
        ],
        angles=[
            Angle(0, 1, 2, k=4.0, a0=math.radians(100.0)),
            Angle(1, 2, 3, k=4.0, a0=math.radians(100.0)),
        ],
        dihedrals=[
            Dihedral(0, 1, 2, 3, k=1.5 * k2, d0=0.0, n=1),
            Dihedral(0, 1, 2, 3, k=k2, d0=0.0, n=2),
        ],
        # H...H Lennard-Jones: opens the angles near cis, so the scan relaxes something
        vdws=[VdW(0, 3, epsilonij=0.01, sigmaij=2.0)],
    )


def relax(energy: zmat.ase.InternalEnergy, C: torch.Tensor, free: torch.Tensor, steps: int, gtol: float):
    """Minimise over ``C[free]`` with L-BFGS; returns (C, E, max |dE/dC| over free, iterations)."""
    x = C[free].clone().requires_grad_(True)
    fixed = C.detach()

    def full(x):
        return fixed.masked_scatter(free, x)

    opt = torch.optim.LBFGS(
        [x],
        lr=1.0,
        max_iter=steps,
        tolerance_grad=gtol,
        tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        e = energy(full(x))
        e.backward()
        return e

    opt.step(closure)
    C = full(x.detach())
    x = C[free].clone().requires_grad_(True)
    e = energy(full(x))
    (g,) = torch.autograd.grad(e, x)
    return C, e.item(), g.abs().max().item(), opt.state[opt._params[0]]["n_iter"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--molecule", default=str(DATA / "peroxide.xyz"), help="any file ASE reads, or a .gzmat")
    p.add_argument(
        "--calculator",
        choices=["peroxide-ff", "emt"],
        default=None,
        help="default: peroxide-ff for peroxide.xyz, emt otherwise",
    )
    p.add_argument(
        "--scan-row", type=int, default=None, help="row whose dihedral is scanned (default: H-O-O-H)"
    )
    p.add_argument("--scan-points", type=int, default=13, help="points from 0 to 180 degrees")
    p.add_argument("--steps", type=int, default=200, help="L-BFGS iterations per relaxation")
    p.add_argument("--gtol", type=float, default=1e-5, help="stop when max |dE/dC| is below this")
    p.add_argument(
        "--rattle", type=float, default=0.05, help="random displacement (A) of the start (breaks symmetry)"
    )
    args = p.parse_args(argv)
    t0 = time.perf_counter()

    path = Path(args.molecule)
    if path.suffix in (".gzmat", ".zmat", ".gjf", ".com"):
        atoms = zmat.ZMatrix.read(path).to_atoms()
    else:
        atoms = ase.io.read(path)
    if args.rattle:
        atoms.rattle(args.rattle, seed=0)
    zm = zmat.ZMatrix.from_atoms(atoms)
    calc_name = args.calculator or ("peroxide-ff" if path.name == "peroxide.xyz" else "emt")
    calc = peroxide_force_field() if calc_name == "peroxide-ff" else EMT()
    seen = zm.to_atoms()
    seen.cell = 100.0 * np.eye(3)  # ASE's ForceField needs a cell (pbc stays off)
    energy = zmat.ase.InternalEnergy(zm, calc, atoms=seen)
    print(f"{zm}: {len(zm)} rows, table {zm.table}, calculator {calc_name}")

    C0 = zm.internal.clone()
    free = torch.as_tensor(zm.table.refs >= 0)  # missing references have no coordinate

    # ---- full optimisation in internal coordinates
    C, e, gmax, iters = relax(energy, C0, free, args.steps, args.gtol)
    xyz = zm.to_xyz(C)[energy.real].numpy()
    print(
        f"\ninternal-coordinate L-BFGS: E = {e:.6f} eV after {iters} iterations, "
        f"{energy.calls} calculator calls, max |dE/dC| = {gmax:.1e}"
    )
    ref = energy.atoms.copy()
    ref.positions = atoms.positions
    ref.calc = calc
    opt = BFGS(ref, logfile=None)
    opt.run(fmax=1e-4, steps=10 * args.steps)
    e_ref = ref.get_potential_energy()
    print(f"Cartesian BFGS (ASE, fmax 1e-4): E = {e_ref:.6f} eV after {opt.nsteps} steps")
    dev = float(zmat.rmsd(torch.tensor(xyz), torch.tensor(ref.positions)))
    print(f"RMSD between the internal-coordinate and the Cartesian minimum: {dev:.2e} A")

    # ---- relaxed dihedral scan
    row = args.scan_row
    if row is None and calc_name == "peroxide-ff":
        row, _ = zm.find(0, 1, 2, 3)  # the row whose dihedral is H-O-O-H (atoms in the file's order)
        phi_min = math.degrees(C[row, 2])
        print(f"optimised H-O-O-H dihedral: {abs(phi_min):.2f} deg (O-O {float(C[2, 0]):.4f} A)")
    if row is not None and args.scan_points > 0:
        b, a, d = zm.table.refs[row]
        print(
            f"\nrelaxed scan of dihedral {d}-{a}-{b}-{row} ({zm.symbols[d]}-{zm.symbols[a]}-"
            f"{zm.symbols[b]}-{zm.symbols[row]}): phi, E - E_min, bond, angle"
        )
        frozen = free.clone()
        frozen[row, 2] = False
        start = C.clone()
        rows = []
        for phi in np.linspace(0.0, 180.0, args.scan_points):
            start[row, 2] = math.radians(phi)
            start, e_phi, gmax, _ = relax(energy, start, frozen, args.steps, args.gtol)
            rows.append((phi, e_phi, float(start[row, 0]), math.degrees(start[row, 1]), gmax))
        for phi, e_phi, r, theta, gmax in rows:
            print(f"  {phi:7.1f}  {e_phi - e:9.5f} eV  {r:.4f} A  {theta:7.2f} deg   (max|g| {gmax:.0e})")
        if len(rows) > 1:
            k = int(np.argmin([r[1] for r in rows]))
            print(f"lowest scan point: phi = {rows[k][0]:.1f} deg")
    print(f"\ntotal {energy.calls} calculator calls, {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    torch.set_num_threads(1)  # a small model: on a shared machine more threads wait for each other
    main()
