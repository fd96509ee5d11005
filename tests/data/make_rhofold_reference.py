"""Write ``rhofold_reference.npz``: RhoFold's own atoms from nucleotide frames and torsions.

Not part of the test suite: it was run once, and ``tests/test_nucleic_frames.py`` compares
``zmat.structure.nucleic_frames.nucleotide_atoms_from_frames`` against its output. The atoms come
from RhoFold's ``RNAConverter.build_cords`` (``rhofold/utils/converter.py`` of ml4bio/RhoFold,
commit of the public snapshot used: see ``tests/data/SOURCES.md``), run unchanged from a checkout
put on ``PYTHONPATH`` with an empty ``rhofold/__init__.py`` (the package
init imports the whole model; ``rhofold/utils`` needs torch, numpy and ``ml_collections``)::

    PYTHONPATH=/path/to/RhoFold:/path/to/ml_collections python tests/data/make_rhofold_reference.py tests/data

Inputs: the 83 standard nucleotides of ``tests/data/4p5j.cif`` (its modified A23 left out),
frames ``rigid_from_three_points(C4', C1', N)`` of the file's atoms (zmat's parse), and torsions
drawn uniformly in ``[-pi, pi)`` (seeded), so the reference does not depend on zmat's torsion
measurement. RhoFold takes a frame as a quaternion + translation and a torsion as (cos, sin),
normalised with an epsilon of 1e-4: the pairs are passed scaled by 1e4 so that it changes them by
1e-8 only. RhoFold computes in float32 (and its frame helper adds 1e-4 to norms), so agreement is
to about 1e-3 A.

Contents: ``seq`` (RhoFold letters), ``R`` ``(L, 3, 3)``, ``t`` ``(L, 3)``, ``torsions`` ``(L, 4)``
(RhoFold's angl_0..angl_3), ``atoms`` ``(L, 23, 3)`` and ``mask`` ``(L, 23)`` in RhoFold's atom order
(``ATOM_NAMES_PER_RESD``, the slot order of ``nucleic_frames``).
"""

import sys
from pathlib import Path

import numpy as np
import torch
from rhofold.utils.converter import RNAConverter
from rhofold.utils.rigid_utils import rot_to_quat

import zmat
from zmat.structure import nucleic_frames as nf


def main(out_dir: str) -> None:
    c = zmat.protein.from_pdb(Path(__file__).with_name("4p5j.cif"))
    pos, mask, restype, _ = nf.nucleotide_positions(c)
    R, t = nf.nucleotide_frames(pos)
    L = len(restype)
    torsions = torch.from_numpy(np.random.default_rng(29).uniform(-np.pi, np.pi, (L, 4)))
    seq = "".join(nf.NUCLEIC_RESTYPES[k] for k in restype.tolist())
    fram = torch.cat([rot_to_quat(R.float()), t.float()], -1)[None]  # (1, L, 7)
    angl = torch.zeros(1, L, 6, 2)
    angl[..., 0] = 1.0  # RhoFold's unused omega, phi groups: identity
    angl[0, :, 2:, 0], angl[0, :, 2:, 1] = torsions.cos().float(), torsions.sin().float()
    atoms, cmask = RNAConverter().build_cords(seq, fram, angl * 1e4, rtn_cmsk=True)
    np.savez_compressed(
        Path(out_dir) / "rhofold_reference.npz",
        seq=np.array(seq),
        R=R.numpy(),
        t=t.numpy(),
        torsions=torsions.numpy(),
        atoms=atoms.double().numpy(),
        mask=cmask.numpy().astype(bool),
    )


if __name__ == "__main__":
    main(sys.argv[1])
