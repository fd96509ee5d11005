"""A 16,000-residue assembly (124 copies of lysozyme as separate chains), read
from one mmCIF file and transformed forward and backward in one call."""

import string
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import zmat
import zmat.protein as zp
from zmat import rmsd

DATA = Path(__file__).parent / "data"


@pytest.mark.slow
def test_16000_residue_assembly(tmp_path):
    import biotite.structure as struc
    from biotite.structure.io import pdb, pdbx

    arr = pdb.PDBFile.read(DATA / "1aki.pdb").get_structure(model=1)
    arr = arr[~arr.hetero]
    copies = []
    for i in range(124):
        a = arr.copy()
        a.chain_id[:] = f"{string.ascii_uppercase[i % 26]}{i // 26}"
        a.coord += np.array([(i % 5) * 60.0, (i // 5 % 5) * 60.0, (i // 25) * 60.0], np.float32)
        copies.append(a)
    path = tmp_path / "assembly.cif"
    f = pdbx.CIFFile()
    pdbx.set_structure(f, struc.concatenate(copies))
    f.write(path)

    t0 = time.perf_counter()
    p = zp.from_pdb(path)
    t1 = time.perf_counter()
    C = p.internal.float().requires_grad_()
    xyz = zmat.to_xyz(C, p.table)
    xyz.square().sum().backward()
    t2 = time.perf_counter()
    print(
        f"\n{len(p)} residues, {p.n_atoms} atoms: from_pdb {t1 - t0:.1f} s, fwd+bwd (float32) {t2 - t1:.2f} s"
    )
    assert len(p) == 124 * 129 and len(set(p.res_chain_ids)) == 124
    assert torch.isfinite(C.grad).all()
    x64 = zmat.to_xyz(p.internal, p.table)
    assert rmsd(x64, p.xyz) < 1e-6
