"""Write ``allatom_fingerprints.json``: what ``parse_complex`` read from real files before its
tables were stamped from templates and its hydrogens placed all at once.

Not part of the test suite: it was run once on the code of the commit before that change (main at
3e501f2, the per-residue and per-hydrogen loops), and ``tests/test_allatom_read.py`` compares the
arrays read now against its output::

    git archive 3e501f2 | tar x -C /tmp/old
    PYTHONPATH=/tmp/old python tests/data/make_allatom_fingerprints.py tests/data

Per case (file and options): every integer, boolean and string array of ``ComplexAtoms`` as the
SHA-256 of its shape, dtype and bytes (exact), and the float coordinates ``xyz`` as their column
sums and sum of squares (compared to 1e-6 A and 1e-12 relative: completed hydrogens' last bits
follow the BLAS ``ddot`` of the machine), the number of completed hydrogens and of atoms.
"""

import hashlib
import json
import sys
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np

from zmat.protein.io import read_atoms
from zmat.structure.allatom import parse_complex
from zmat.structure.hydrogens import Protonation

#: (file, options): DNA, tRNA with 14 modified nucleotides, NMR with every H, a protein with
#: disulfides, partially resolved RNA with ligands, MSE in chains, a protein with FK506.
CASES = (
    ("1bna.cif", {"hydrogens": True}),
    ("1ehz_trna.pdb", {"hydrogens": True}),
    ("1l2y.pdb", {"hydrogens": {"his": "HID", "n_terminus": "neutral", "c_terminus": "neutral"}}),
    ("1aki.pdb", {"hydrogens": True}),
    ("4gxy.pdb", {"hydrogens": True, "ligands": True}),
    ("1a8o_modified.cif", {"hydrogens": True, "ligands": True}),
    ("3o5r.cif", {"hydrogens": True, "ligands": True}),
    ("1igy.pdb", {"hydrogens": True, "ligands": True}),
)


def options(kw: dict) -> dict:
    h = kw.get("hydrogens", False)
    return {**kw, "hydrogens": Protonation(**h) if isinstance(h, dict) else h}


def digest(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    return hashlib.sha256(f"{a.shape} {a.dtype.str}".encode() + a.tobytes()).hexdigest()


def fingerprint(c) -> dict:
    out = {}
    for f in fields(c):
        a = np.asarray(getattr(c, f.name))
        if a.dtype.kind == "f":
            out[f.name] = {"sum": a.sum(0).tolist(), "sumsq": float((a * a).sum())}
        else:
            out[f.name] = digest(a)
    out["n_added"] = int(c.added.sum())
    out["n_atoms"] = len(c.atom_names)
    return out


def read(data: Path, name: str, kw: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_complex(read_atoms(str(data / name)), **options(kw))


if __name__ == "__main__":
    data = Path(sys.argv[1])
    ref = [{"file": name, "options": kw, **fingerprint(read(data, name, kw))} for name, kw in CASES]
    (data / "allatom_fingerprints.json").write_text(json.dumps(ref, indent=1) + "\n")
