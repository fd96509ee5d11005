"""The OpenFold peer of the benchmarks (``benchmarks/openfold_frames.py``): it computes what it claims."""

import sys
from pathlib import Path

import torch

import zmat.protein as zp
from zmat.protein.atom37 import atom37_to_atom14

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))
from benchmarks import openfold_frames as of  # noqa: E402

DATA = Path(__file__).parent / "data"
NAMES = ("phi", "psi", "omega", "chi1", "chi2", "chi3", "chi4")


def test_identity_frame_gives_literature_backbone():
    # AlphaFold's ALA in its backbone frame (rigid_group_atom_positions): N, CA, C, CB
    R, t = torch.eye(3, dtype=torch.float64)[None], torch.zeros(1, 3, dtype=torch.float64)
    pos = of.atom14_from_frames(
        R, t, torch.tensor([0]), of.alpha_from_zmat_torsions(torch.zeros(1, 7)).double()
    )
    want = torch.tensor([[-0.525, 1.363, 0.0], [0, 0, 0], [1.526, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(pos[0, :3], want, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        pos[0, 4], torch.tensor([-0.529, -0.774, -1.205], dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_rebuilds_a_real_protein_like_zmat():
    p = zp.from_pdb(DATA / "1ubi.pdb")
    pos37, mask37 = p.to_atom37()
    pos37 = pos37.double()
    R, t = zp.backbone_frames(pos37)
    tor = torch.stack([p.torsions[k] for k in NAMES], -1).double().nan_to_num(0.0)
    peer = of.atom14_from_frames(R, t, p.aatype, of.alpha_from_zmat_torsions(tor))
    ours, mask = zp.atom14_from_frames(R, t, p.aatype, tor)
    ref, ref_mask = atom37_to_atom14(pos37, p.aatype, mask37)
    m = mask & ref_mask.bool()
    rms = lambda a, b: float((a - b)[m].square().sum(-1).mean().sqrt())  # noqa: E731
    # different ideal geometry (AlphaFold's literature vs Engh & Huber), same torsions:
    # both near the structure and near each other (a wrong torsion order or sign: > 1 A)
    assert rms(peer, ref) < 0.25 and rms(ours, ref) < 0.25 and rms(peer, ours) < 0.06
