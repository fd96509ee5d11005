"""Make tests/data/bgflow_reference.npz: bgflow's internal-coordinate transforms on three molecules.

bgflow (github.com/noegroup/bgflow, MIT) is not on any package registry. It was
run from its public source, never installed into the project and never
copied into it:

    git clone https://github.com/noegroup/bgflow /tmp/bgflow
    git -C /tmp/bgflow checkout fbba56fac3eb88f6825d2bd4f745ee75ae9715e1  # 2023-03-24, master
    PYTHONPATH=/tmp/bgflow:$PWD python tests/data/make_bgflow_reference.py

with the project's venv (torch 2.13 CPU, NumPy 2). bgflow predates NumPy 2 and
uses ``np.infty`` at import time; the one shim below restores that alias
(``np.infty = np.inf``) before importing bgflow. Nothing else is changed.
bgflow is run in float64 throughout (``torch.set_default_dtype(torch.float64)``,
so that its internal constants are float64 too, as a float64 bgflow user runs it).

What is stored, per molecule ``m`` in ``ala2``, ``trpcage``, ``ligand``
(all float64):

* ``m/xyz``: ``(B, N, 3)`` input positions (Angstrom).
* ``m/table``: the zmat construction table ``(N, 3)``; ``m/z_matrix``: the same
  as bgflow's z-matrix, rows ``[i, b, a, d]`` (-1 for a missing reference).
* For ``norm`` in ``raw`` (``normalize_angles=False``) and ``norm`` (True),
  the outputs of ``GlobalInternalCoordinateTransformation(z_matrix)``'s
  forward (Cartesian -> internal) pass: ``m/<norm>/bonds``, ``angles``,
  ``torsions``, ``x0``, ``R`` (its Euler chart of the orientation),
  ``dlogp`` (its log-determinant, ``(B, 1)``), and its inverse applied to
  those outputs: ``dlogp_inv`` and ``roundtrip`` (``(B,)``, the largest
  ``|x_back - x|`` in Angstrom).
* ``m/bond_atoms``, ``m/angle_atoms``, ``m/torsion_atoms``: bgflow's own
  ``bond_indices``, ``angle_indices``, ``torsion_indices`` (the order of its
  outputs; column 0 is the atom placed).
* For ``ala2`` also ``RelativeInternalCoordinateTransformation`` with
  ``m/fixed`` (the tree's first three atoms and N, CA of the alanine kept Cartesian) and the rows of the
  other atoms: ``m/rel/<norm>/bonds``, ``angles``, ``torsions``, ``x_fixed``,
  ``dlogp``, ``roundtrip``, ``dlogp_inv``, ``m/rel_z_matrix``.

The molecules: alanine dipeptide (64 frames of tests/data/alanine_dipeptide.dcd,
table from ``zmat.md.construction_table``), Trp-cage (the 38 NMR models of
tests/data/1l2y.pdb with hydrogens, bonds guessed by MDAnalysis, table from
``zmat.md.construction_table``), and a drug-like ligand (tests/data/temp_lig.xyz
plus 31 copies with Gaussian noise of 0.05 A, seed 0, table from
``zmat.autotable.construction_table`` started at its first terminal atom).

bgflow's conventions differ from zmat's in one place that matters for the
tables: ``GlobalInternalCoordinateTransformation`` places a tree's third atom
from the *second* (``d12 = |x2 - x1|``, angle at ``x1``) whatever the third
row's references are; a table whose third atom is bonded to the root (``(0,
1, -1)`` in zmat, valid there) is silently read as another tree. All three
tables here have the third atom on the second (checked by
``tests/test_flows_bgflow.py``).
"""

from pathlib import Path

import numpy as np
import torch

np.infty = np.inf  # bgflow's one NumPy-2 incompatibility (see the docstring)
import bgflow  # noqa: E402

HERE = Path(__file__).resolve().parent


def molecules():
    import MDAnalysis as mda
    from ase.io import read

    from zmat import md
    from zmat.autotable import connectivity, construction_table

    u = mda.Universe(str(HERE / "alanine_dipeptide.pdb"), str(HERE / "alanine_dipeptide.dcd"))
    ala = u.atoms
    yield "ala2", md.positions(ala, stop=64).numpy(), md.construction_table(ala).refs
    t = mda.Universe(str(HERE / "1l2y.pdb"), to_guess=("types", "masses", "bonds"))
    yield "trpcage", md.positions(t.atoms).numpy(), md.construction_table(t.atoms).refs
    lig = read(HERE / "temp_lig.xyz")
    noise = np.random.default_rng(0).normal(scale=0.05, size=(31, len(lig), 3))
    xyz = np.concatenate([lig.positions[None], lig.positions[None] + noise])
    # bgflow takes a tree's third atom as bonded to the second, whatever its row says: start
    # the table at a terminal atom so that the table says so too
    start = next(i for i, nb in enumerate(connectivity(lig)) if len(nb) == 1)
    yield "ligand", xyz, construction_table(lig, start=start).refs


def z_matrix(refs: np.ndarray) -> np.ndarray:
    return np.concatenate([np.arange(len(refs))[:, None], refs], 1).astype(np.int64)


def roundtrip(back: torch.Tensor, xyz: np.ndarray) -> torch.Tensor:
    """``(B,)``: the largest ``|x_back - x|`` per structure."""
    return (back.reshape(xyz.shape) - torch.as_tensor(xyz)).abs().amax((1, 2))


def run_global(zm: np.ndarray, xyz: np.ndarray, normalize: bool) -> dict:
    ic = bgflow.GlobalInternalCoordinateTransformation(zm, normalize_angles=normalize)
    x = torch.as_tensor(xyz).reshape(len(xyz), -1)
    bonds, angles, torsions, x0, R, dlogp = ic(x)
    back, dlogp_inv = ic(bonds, angles, torsions, x0, R, inverse=True)
    out = dict(bonds=bonds, angles=angles, torsions=torsions, x0=x0, R=R, dlogp=dlogp)
    out.update(roundtrip=roundtrip(back, xyz), dlogp_inv=dlogp_inv)
    idx = dict(bond_atoms=ic.bond_indices, angle_atoms=ic.angle_indices, torsion_atoms=ic.torsion_indices)
    return {k: v.detach().numpy() for k, v in out.items()}, idx


def run_relative(zm: np.ndarray, fixed: np.ndarray, xyz: np.ndarray, normalize: bool) -> dict:
    ic = bgflow.RelativeInternalCoordinateTransformation(zm, fixed, normalize_angles=normalize)
    x = torch.as_tensor(xyz).reshape(len(xyz), -1)
    bonds, angles, torsions, x_fixed, dlogp = ic(x)
    back, dlogp_inv = ic(bonds, angles, torsions, x_fixed, inverse=True)
    out = dict(bonds=bonds, angles=angles, torsions=torsions, x_fixed=x_fixed, dlogp=dlogp)
    out.update(roundtrip=roundtrip(back, xyz), dlogp_inv=dlogp_inv)
    return {k: v.detach().numpy() for k, v in out.items()}


def main() -> None:
    torch.set_default_dtype(torch.float64)
    store = {}
    for name, xyz, refs in molecules():
        xyz = np.ascontiguousarray(xyz, np.float64)
        zm = z_matrix(refs)
        store.update({f"{name}/xyz": xyz, f"{name}/table": refs, f"{name}/z_matrix": zm})
        for norm in ("raw", "norm"):
            out, idx = run_global(zm, xyz, norm == "norm")
            store.update({f"{name}/{norm}/{k}": v for k, v in out.items()})
            store.update({f"{name}/{k}": np.asarray(v) for k, v in idx.items()})
            print(f"{name} {norm}: round trip {out['roundtrip'].max():.1e} A")
        if name == "ala2":  # backbone heavy atoms Cartesian, the rest relative to them
            # the rows without three references (the tree's first atoms) and N, CA of ALA
            fixed = np.union1d(np.nonzero(refs[:, 2] < 0)[0], [6, 8]).astype(np.int64)
            rel = zm[~np.isin(zm[:, 0], fixed)]
            store.update({f"{name}/fixed": fixed, f"{name}/rel_z_matrix": rel})
            for norm in ("raw", "norm"):
                out = run_relative(rel, fixed, xyz, norm == "norm")
                store.update({f"{name}/rel/{norm}/{k}": v for k, v in out.items()})
    np.savez_compressed(HERE / "bgflow_reference.npz", **store)


if __name__ == "__main__":
    main()
