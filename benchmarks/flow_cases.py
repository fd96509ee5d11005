"""The flows benchmarks' problems: alanine dipeptide conformers (RDKit) and a protein batch,
each turned by random rigid motions (shared by ``benchmarks.flows`` and ``benchmarks.flows_grid``)."""

from __future__ import annotations

import torch

import zmat

ALANINE_DIPEPTIDE = "CC(=O)NC(C)C(=O)NC"


def _rigid(xyz: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Every structure of ``(B, N, 3)`` turned by a random proper rotation and shifted."""
    q, r = torch.linalg.qr(torch.randn(xyz.shape[0], 3, 3, generator=gen, dtype=xyz.dtype))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    q = q * torch.linalg.det(q)[:, None, None]
    return xyz @ q.transpose(-1, -2) + 5 * torch.randn(xyz.shape[0], 1, 3, generator=gen, dtype=xyz.dtype)


def alanine_dipeptide(batch: int, seed: int = 0):
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles(ALANINE_DIPEPTIDE))
    if AllChem.EmbedMolecule(mol, randomSeed=seed) != 0:
        raise RuntimeError("ETKDG failed for alanine dipeptide")
    zm = zmat.ZMatrix.from_rdkit(mol)
    gen = torch.Generator().manual_seed(seed)
    C = zm.internal.to(torch.float64).expand(batch, -1, -1).clone()
    C[..., 2] += 0.3 * torch.randn(C.shape[:-1], generator=gen, dtype=torch.float64)
    return zm.table, _rigid(zmat.to_xyz(C, zm.table), gen)


def protein(n_res: int, batch: int, seed: int = 0):
    from .cases import make

    p = make("protein", n_res, batch)
    gen = torch.Generator().manual_seed(seed)
    return p.table, _rigid(zmat.to_xyz(p.C, p.table), gen), p.atom_names
