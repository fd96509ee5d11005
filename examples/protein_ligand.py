"""Refine a ligand and the side chains around it together, in torsion space.

FK506 bound to FKBP51 (PDB 3o5r, ``tests/data/3o5r.cif``): the complex is read
with its ligand (``ligands=True``) into one construction table, so one
``zmat.to_xyz`` builds protein and ligand, and one ``zmat.clash_loss`` scores
protein-ligand contacts with the rest. The ligand's rotatable torsions and the
chi angles of the pocket's residues are scrambled, then refined together by
Adam under

* the clash loss over every atom pair more than three bonds apart, and
* flat-bottom restraints on the crystal's ligand-protein polar contacts
  (N/O pairs within 3.5 A), as an experiment would supply them.

Everything else (bond lengths, angles, rings, stereocentres, the backbone)
stays as in the crystal. Prints the losses and the ligand's RMSD to the
crystal before and after, and writes the refined complex as mmCIF (bonds and
bond orders kept).

    python examples/protein_ligand.py [--steps 150] [--out refined.cif]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

import zmat
from zmat.protein import from_pdb

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "tests", "data", "3o5r.cif")


def pocket_and_contacts(p, cutoff: float = 5.0, polar: float = 3.5):
    """Polymer residues with an atom within ``cutoff`` of the ligand, and the
    crystal's ligand-protein N/O pairs within ``polar`` (with their distances)."""
    lig = torch.from_numpy((p.family == "ligand")[p.parsed.residue])
    d = torch.cdist(p.xyz[~lig], p.xyz[lig])
    prot_atoms = torch.nonzero(~lig)[:, 0]
    near = prot_atoms[(d < cutoff).any(1)]
    poly_of = torch.from_numpy(p.parsed.polymer_index)[p.residue_index]
    pocket = torch.zeros(len(p), dtype=torch.bool)
    pocket[poly_of[near]] = True
    is_polar = torch.from_numpy(p.elements == "N") | torch.from_numpy(p.elements == "O")
    ij = torch.nonzero((d < polar) & is_polar[~lig][:, None] & is_polar[lig][None, :])
    pairs = torch.stack([prot_atoms[ij[:, 0]], torch.nonzero(lig)[:, 0][ij[:, 1]]], 1)
    return lig, pocket, pairs, d[ij[:, 0], ij[:, 1]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pdb", default=DEFAULT)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "zmat_protein_ligand.cif"))
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()

    p = from_pdb(args.pdb, ligands=True)
    lig, pocket, pairs, d0 = pocket_and_contacts(p)
    excl, radii = p.exclusions(), p.radii
    chi = ("chi1", "chi2", "chi3", "chi4")
    x_crystal = zmat.to_xyz(p.internal, p.table)  # the crystal in the table's frame

    def build(lig_delta, chi_delta):
        t = {k: p.torsions[k] + chi_delta[:, c] for c, k in enumerate(chi)}
        t["ligand"] = p.ligand_torsions + lig_delta
        return zmat.to_xyz(p.internal_with_torsions(t), p.table)

    def losses(x):
        clash = zmat.clash_loss(x, radii, exclude=excl)
        dist = (x[pairs[:, 0]] - x[pairs[:, 1]]).norm(dim=-1)
        restraint = torch.relu(dist - d0 - 0.3).pow(2).sum()
        return clash, restraint

    def ligand_rmsd(x):
        return float((x[lig] - x_crystal[lig]).pow(2).sum(-1).mean().sqrt())

    # scramble: the ligand's torsions by up to 1.5 rad, the pocket's chis by up to 1 rad
    T = len(p.ligand_torsions)
    lig_delta = ((torch.rand(T, dtype=torch.float64) * 2 - 1) * 1.5).requires_grad_(True)
    chi_delta = ((torch.rand(len(p), 4, dtype=torch.float64) * 2 - 1) * 1.0 * pocket[:, None]).requires_grad_(
        True
    )
    with torch.no_grad():
        x = build(lig_delta, chi_delta)
        c0, r0 = losses(x)
        rmsd0 = ligand_rmsd(x)
    print(
        f"complex: {p}; ligand torsions {T}; pocket residues {int(pocket.sum())}; polar contacts {len(pairs)}"
    )
    print(f"start: clash {float(c0):.2f} restraint {float(r0):.3f} ligand RMSD {rmsd0:.2f} A")

    opt = torch.optim.Adam([lig_delta, chi_delta], lr=0.05)
    for _ in range(args.steps):
        opt.zero_grad()
        clash, restraint = losses(build(lig_delta, chi_delta * pocket[:, None]))
        (clash + 10.0 * restraint).backward()
        opt.step()
    with torch.no_grad():
        x = build(lig_delta, chi_delta * pocket[:, None])
        c1, r1 = losses(x)
        rmsd1 = ligand_rmsd(x)
        # back into the file's frame (the table's frame differs by one rigid motion), then write
        ones = torch.ones(p.n_atoms, 1, dtype=torch.float64)
        fit = torch.linalg.lstsq(torch.cat([x_crystal, ones], 1), p.xyz).solution
        p.to_pdb(args.out, xyz=torch.cat([x, ones], 1) @ fit)
    print(f"refined: clash {float(c1):.2f} restraint {float(r1):.3f} ligand RMSD {rmsd1:.2f} A")
    print(f"{args.steps} steps, {time.perf_counter() - t0:.1f} s")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    torch.set_num_threads(1)  # a small model: on a shared machine more threads wait for each other
    main()
