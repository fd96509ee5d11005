"""Torsion updates of B conformers: zmat's TorsionSpace against two seed-style loops.

``python -m benchmarks.torsions`` (default: 256 conformers of ranolazine, 31
heavy atoms, 64 with hydrogens, 9 rotatable bonds; ``--tiny`` for a smoke test).

Implementations, all given the same conformer and the same ``(B, k)`` target
torsions, all producing ``(B, N, 3)`` positions:

* ``zmat rigid``: ``TorsionSpace.to_xyz(t)`` (default ``method="rigid"``: the
  rotations of the moving sides composed level by level), one batched call;
  forward, and forward plus backward (the gradient of a scalar with respect
  to the torsions, which neither loop has).
* ``zmat table``: ``TorsionSpace.to_xyz(t, method="table")``: frozen internal
  coordinates, torsions scattered in, one ``zmat.to_xyz`` call.
* ``rdkit-loop``: for each conformer, for each rotatable bond,
  ``rdMolTransforms.SetDihedralRad`` (C++; it finds the moving side and
  rotates it on every call).
* ``td-loop``: torsional diffusion's update (``utils/torsion.py``,
  ``modify_conformer``, github.com/gcorso/torsional-diffusion), reimplemented:
  per conformer, per bond, a SciPy rotation about the bond by the torsion
  change, applied in NumPy to a precomputed boolean mask of the moving atoms.

Ragged batches: ``B`` torsion spaces of different molecules are batched with
``TorsionSpace.batch`` (flat atoms, forest table) at every step; the building
cost is reported against the forward plus backward it serves.

Times are medians of warm calls on one thread (``--threads``), ratios taken
within one run. The loops' results are checked against zmat's (max deviation
printed) so the comparison is between equal outputs.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from .timing import median_seconds

SMILES = "COc1ccccc1OCC(O)CN1CCN(CC(=O)Nc2c(C)cccc2C)CC1"  # ranolazine
MIX = [  # the ragged batch cycles through these
    "COc1ccccc1OCC(O)CN1CCN(CC(=O)Nc2c(C)cccc2C)CC1",
    "Cc1ccc(NC(=O)c2ccc(CN3CCN(C)CC3)cc2)cc1Nc1nccc(-c2cccnc2)n1",
    "CC(C)Cc1ccc(cc1)[C@@H](C)C(=O)O",
    "CNCCC(Oc1ccc(C(F)(F)F)cc1)c1ccccc1",
    "CCCCC(=O)N(Cc1ccc(-c2ccccc2-c2nn[nH]n2)cc1)[C@@H](C(C)C)C(=O)O",
    "COCCc1ccc(OCC(O)CNC(C)C)cc1",
    "CCN(CC)CC(=O)Nc1c(C)cccc1C",
    "CCOC(=O)/C=C/c1ccccc1",
]


def _embed(smiles: str, seed: int = 0):
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
    params = AllChem.ETKDGv3()
    params.randomSeed = seed
    if AllChem.EmbedMolecule(mol, params) != 0:
        raise RuntimeError(f"ETKDG failed for {smiles}")
    return mol


def _moving_masks(mol, quads: np.ndarray) -> np.ndarray:
    """``(k, N)`` bool: atoms on ``c``'s side of each bond ``b-c`` (torsional diffusion's ``mask_rotate``)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = mol.GetNumAtoms()
    edges = np.array([(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()])
    masks = np.zeros((len(quads), n), bool)
    for k, (_, b, c, _) in enumerate(quads.tolist()):
        keep = ~(((edges[:, 0] == b) & (edges[:, 1] == c)) | ((edges[:, 0] == c) & (edges[:, 1] == b)))
        e = edges[keep]
        label = connected_components(coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(n, n)), False)[
            1
        ]
        masks[k] = label == label[c]
    return masks


def td_loop(pos: np.ndarray, bonds: np.ndarray, masks: np.ndarray, updates: np.ndarray) -> np.ndarray:
    """Torsional diffusion's per-conformer, per-bond update (reimplemented): rotate the
    masked side of bond ``(u, v)`` (``v`` on the moving side) by ``updates[b, k]``."""
    from scipy.spatial.transform import Rotation

    out = pos.copy()
    for b in range(len(out)):
        x = out[b]
        for k, (u, v) in enumerate(bonds.tolist()):
            if updates[b, k] == 0:
                continue
            axis = x[u] - x[v]
            rot = Rotation.from_rotvec(axis * updates[b, k] / np.linalg.norm(axis)).as_matrix()
            x[masks[k]] = (x[masks[k]] - x[v]) @ rot.T + x[v]
    return out


def rdkit_loop(confs, quads: list, values: list) -> None:
    from rdkit.Chem import rdMolTransforms

    for conf, vals in zip(confs, values, strict=True):
        for q, v in zip(quads, vals, strict=True):
            rdMolTransforms.SetDihedralRad(conf, *q, v)


def run(batch: int, dtype: torch.dtype, repeat: float, mix: int) -> dict:
    from rdkit import Chem

    from zmat.rdkit import TorsionSpace

    mol = _embed(SMILES)
    ts = TorsionSpace.from_mol(mol)
    k, n = len(ts.quads), mol.GetNumAtoms()
    gen = torch.Generator().manual_seed(0)
    delta = (torch.rand(batch, k, generator=gen, dtype=torch.float64) * 2 - 1) * torch.pi
    target = ts.torsions + delta
    res = {
        "molecule": SMILES,
        "heavy_atoms": mol.GetNumHeavyAtoms(),
        "atoms": n,
        "torsions": k,
        "batch": batch,
    }
    t = target.to(dtype)
    tg = t.clone().requires_grad_(True)
    for method in ("rigid", "table"):
        res[f"zmat {method} fwd"] = median_seconds(lambda m=method: ts.to_xyz(t, method=m), repeat)
        res[f"zmat {method} fwd+bwd"] = median_seconds(
            lambda m=method: torch.autograd.grad(ts.to_xyz(tg, method=m).square().sum(), tg), repeat
        )
    x_zmat = ts.to_xyz(target).numpy()
    res["max |rigid - table| A"] = float(np.abs(x_zmat - ts.to_xyz(target, method="table").numpy()).max())

    # RDKit: one Mol holding B copies of the conformer, updated in place
    many = Chem.Mol(mol)
    for _ in range(batch - 1):
        many.AddConformer(Chem.Conformer(mol.GetConformer()), assignId=True)
    confs = list(many.GetConformers())
    quads, values = ts.quads.tolist(), target.tolist()
    res["rdkit-loop"] = median_seconds(lambda: rdkit_loop(confs, quads, values), repeat)
    x_rdkit = np.stack([c.GetPositions() for c in confs])

    # torsional diffusion: torsion changes applied to the conformer's positions
    pos = np.repeat(mol.GetConformer().GetPositions()[None], batch, 0)
    bonds, masks = ts.quads[:, 1:3].numpy(), _moving_masks(mol, ts.quads.numpy())
    # TD's axis points from the moving to the fixed atom: rotating by -delta raises the dihedral by delta
    upd = -delta.numpy()
    res["td-loop"] = median_seconds(lambda: td_loop(pos, bonds, masks, upd), repeat)
    x_td = td_loop(pos, bonds, masks, upd)
    res["max |zmat - rdkit| A"] = float(np.abs(x_zmat - x_rdkit).max())
    res["max |zmat - td| A"] = float(np.abs(x_zmat - x_td).max())
    res.update(_ragged(batch, dtype, repeat, mix))
    return res


def _ragged(batch: int, dtype: torch.dtype, repeat: float, mix: int) -> dict:
    """Build a batch of B torsion spaces of different molecules, then fwd+bwd on it
    (rigid method: no table needed; the table method also builds the forest table)."""
    from zmat.rdkit import TorsionSpace

    spaces = [TorsionSpace.from_mol(_embed(s)) for s in MIX[:mix]]
    items = [spaces[i % len(spaces)] for i in range(batch)]
    tb = TorsionSpace.batch(items)
    t = (tb.torsions + 0.5).to(dtype).requires_grad_(True)

    def step(space, method="rigid"):
        return torch.autograd.grad(space.to_xyz(t, method=method).square().sum(), t)

    return {
        "ragged atoms": len(tb.positions),
        "ragged torsions": len(tb.quads),
        "ragged build": median_seconds(lambda: TorsionSpace.batch(items), repeat),
        "ragged fwd+bwd (fresh batch)": median_seconds(lambda: step(TorsionSpace.batch(items)), repeat),
        "ragged fwd+bwd (warm)": median_seconds(lambda: step(tb), repeat),
        "ragged table fwd+bwd (fresh batch)": median_seconds(
            lambda: step(TorsionSpace.batch(items), "table"), repeat
        ),
        "ragged table fwd+bwd (warm)": median_seconds(lambda: step(tb, "table"), repeat),
    }


def report(res: dict) -> str:
    ms = lambda s: f"{s * 1e3:9.3f} ms"  # noqa: E731
    lines = [
        f"{res['batch']} conformers of a {res['heavy_atoms']}-heavy-atom molecule ({res['atoms']} atoms "
        f"with H), {res['torsions']} rotatable bonds, {res.get('dtype', '')}:",
    ]
    zmat_rows = [f"zmat {m} {mode}" for m in ("rigid", "table") for mode in ("fwd", "fwd+bwd")]
    for name in (*zmat_rows, "rdkit-loop", "td-loop"):
        lines.append(f"  {name:20s} {ms(res[name])}")
    for peer in ("rdkit-loop", "td-loop"):
        ratios = ", ".join(f"{name} {res[peer] / res[name]:.1f}x" for name in zmat_rows)
        lines.append(f"  vs {peer}: {ratios}")
    lines.append(
        f"  agreement: max |zmat - rdkit| {res['max |zmat - rdkit| A']:.1e} A, "
        f"max |zmat - td| {res['max |zmat - td| A']:.1e} A, "
        f"rigid vs table {res['max |rigid - table| A']:.1e} A"
    )
    lines.append(
        f"ragged batch of {res['batch']} molecules ({res['ragged atoms']} atoms, {res['ragged torsions']} "
        f"torsions): build {ms(res['ragged build'])}; fwd+bwd rigid {ms(res['ragged fwd+bwd (warm)'])} warm, "
        f"{ms(res['ragged fwd+bwd (fresh batch)'])} build included; build / fwd+bwd = "
        f"{res['ragged build'] / res['ragged fwd+bwd (warm)']:.2f}; table method "
        f"{ms(res['ragged table fwd+bwd (warm)'])} warm, {ms(res['ragged table fwd+bwd (fresh batch)'])} "
        "with building its forest table and plans"
    )
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256, help="conformers (default 256)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--repeat", type=float, default=1.0, help="seconds of warm calls per measurement")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--mix", type=int, default=len(MIX), help="different molecules in the ragged batch")
    p.add_argument("--tiny", action="store_true", help="smoke test: 4 conformers, short repeats")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    if a.tiny:
        a.batch, a.repeat, a.mix = 4, 0.01, 2
    torch.set_num_threads(a.threads)
    res = run(a.batch, getattr(torch, a.dtype), a.repeat, a.mix)
    print(report({**res, "dtype": a.dtype}))
    res["dtype"], res["threads"] = a.dtype, a.threads
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
