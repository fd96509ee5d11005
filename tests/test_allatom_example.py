"""examples/protein_ligand.py runs as a user runs it and does what it claims: the clash and
restraint losses drop, the ligand moves back toward the crystal, the mmCIF it writes reads."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_protein_ligand_example(tmp_path):
    pytest.importorskip("biotite")
    out = tmp_path / "refined.cif"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "examples/protein_ligand.py", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    pat = r"clash ([\d.]+) restraint ([\d.]+) ligand RMSD ([\d.]+) A"
    (c0, r0, m0), (c1, r1, m1) = (tuple(map(float, m)) for m in re.findall(pat, text))
    assert c0 > 1.0 and c1 < 0.1 * c0 and r1 < 0.1 * r0 + 1e-6 and m1 < m0, text
    from biotite.structure.io import pdbx

    from zmat.protein import from_pdb

    back = pdbx.get_structure(pdbx.CIFFile.read(str(out)), model=1, include_bonds=True)
    p = from_pdb(ROOT / "tests" / "data" / "3o5r.cif", ligands=True)
    assert back.array_length() == p.n_atoms and back.bonds.get_bond_count() == len(p.bonds)
