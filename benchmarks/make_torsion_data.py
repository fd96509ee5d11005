"""Write ``benchmarks/data/backbone_angles.npz``: FoldingDiff's six backbone angles of real chains.

Not run by the benchmarks: it was run once. Sources (every protein chain of each file,
first model, first altloc, amino acids only):

- the 51 single-chain PDB files of MDAnalysisTests 2.11.0's ``data/dssp/`` (the PyPI sdist
  ``mdanalysistests-2.11.0.tar.gz``, sha256 5edeb5b0...02d2ea; ``1mr1D_failing`` left out,
  it is a broken copy of ``1mr1D``), extracted to a folder;
- the protein entries of ``tests/data`` (1aki, 1igy, 1l2y, 1ubi, 3o5r, 3wip, 5ugo, 7pfl;
  origins in ``tests/data/SOURCES.md``).

::

    python benchmarks/make_torsion_data.py /path/to/MDAnalysisTests/data/dssp

Each chain is cut into segments at chain breaks (a missing N, CA or C, or a C-N distance
above 2 A); a segment's angles are ``zmat.protein.six_angles_from_backbone`` of its N, CA,
C (float64; the last row's step angles and the first phi are NaN, as FoldingDiff has them).
Held-out entries: every fifth entry in name order (the split is by entry, so the 10
copies of 3wip's chain or 1igy's two copies of each chain never straddle it).

Arrays: ``angles`` (R, 6) float32 radians, ``segment_ptr`` (S + 1,) int64 row offsets,
``segment_entry`` (S,) int64, ``entries`` (E,) str, ``chains`` (S,) str,
``held_out`` (E,) bool.
"""

from __future__ import annotations

import sys
from pathlib import Path

import biotite.structure as struc
import biotite.structure.io as strucio
import numpy as np
import torch

from zmat.protein import six_angles_from_backbone

ROOT = Path(__file__).resolve().parent.parent
REPO_FILES = ["1aki.pdb", "1igy.pdb", "1l2y.pdb", "1ubi.pdb", "3o5r.cif", "3wip.pdb", "5ugo.cif", "7pfl.pdb"]
MIN_SEGMENT = 8


def backbone_segments(array) -> list[tuple[str, np.ndarray]]:
    """(chain id, (L, 3, 3) N/CA/C coordinates) per unbroken stretch of each protein chain."""
    array = array[struc.filter_amino_acids(array)]
    out = []
    for chain in struc.get_chains(array):
        res = []
        for r in struc.residue_iter(array[array.chain_id == chain]):
            names = list(r.atom_name)
            res.append(
                np.stack([r.coord[names.index(n)] for n in ("N", "CA", "C")])
                if {"N", "CA", "C"} <= set(names)
                else None
            )
        cut = [[]]
        for a, b in zip([None, *res[:-1]], res, strict=True):
            if b is None or (a is not None and np.linalg.norm(b[0] - a[2]) > 2.0):
                cut.append([])
            if b is not None:
                cut[-1].append(b)
        out += [(str(chain), np.stack(s)) for s in cut if len(s) >= MIN_SEGMENT]
    return out


def main(dssp_dir: str) -> None:
    files = sorted(p for p in Path(dssp_dir).glob("*.pdb.gz") if "failing" not in p.name)
    files += [ROOT / "tests" / "data" / f for f in REPO_FILES]
    files.sort(key=lambda p: p.name.split(".")[0].lower())
    angles, ptr, seg_entry, chains, entries = [], [0], [], [], []
    for e, path in enumerate(files):
        if path.suffix == ".gz":
            import gzip

            from biotite.structure.io.pdb import PDBFile

            with gzip.open(path, "rt") as f:
                array = PDBFile.read(f).get_structure(model=1)
        else:
            array = strucio.load_structure(path, model=1)
        entries.append(path.name.split(".")[0])
        for chain, bb in backbone_segments(array):
            a, _ = six_angles_from_backbone(torch.from_numpy(bb.reshape(-1, 3).astype(np.float64)))
            angles.append(a.numpy().astype(np.float32))
            ptr.append(ptr[-1] + len(bb))
            seg_entry.append(e)
            chains.append(chain)
    held_out = np.arange(len(entries)) % 5 == 4
    out = ROOT / "benchmarks" / "data" / "backbone_angles.npz"
    np.savez_compressed(
        out,
        angles=np.concatenate(angles),
        segment_ptr=np.asarray(ptr, np.int64),
        segment_entry=np.asarray(seg_entry, np.int64),
        entries=np.asarray(entries),
        chains=np.asarray(chains),
        held_out=held_out,
    )
    print(f"{out}: {len(entries)} entries ({held_out.sum()} held out), {len(chains)} segments, ", end="")
    print(f"{ptr[-1]} residues")


if __name__ == "__main__":
    main(sys.argv[1])
