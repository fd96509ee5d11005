"""A small frame-based denoiser trained with AlphaFold's structural-violation loss.

Frame-based structure models (AlphaFold's structure module, FrameDiff,
RFdiffusion) move per-residue rigid frames and predict side-chain torsions.
This example does that on the real structures in ``tests/data``:

* the data: each structure in AlphaFold's tensors (``Protein.to_atom37``,
  ``aatype``), its backbone frames (``zmat.protein.backbone_frames``, AlphaFold's
  convention) and torsions, corrupted by noise (frames: 0.4 A and 0.1 rad;
  torsions: 0.4 rad);
* the model: a per-residue MLP that reads the residue type, the noisy torsions
  and its neighbours' positions in its own frame, and predicts a rigid update
  of the frame and torsion corrections;
* the structure: every heavy atom from frames + torsions
  (``zmat.protein.atom14_from_frames``: each residue built by ``zmat.to_xyz``
  in its frame, ideal geometry);
* the loss: squared atom error to the true atoms plus AlphaFold's
  structural-violation loss (``zmat.protein.structural_violations``: peptide
  bond lengths and angles, between-residue clashes through ``zmat.clash_loss``,
  within-residue bounds).

It prints the violation metrics of a fixed noisy evaluation set going down.

    python examples/frames_and_violations.py            # tiny, ~15 s
    python examples/frames_and_violations.py --full     # more structures and steps
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import zmat.protein as zp

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
TINY = ["1l2y.pdb", "1ubi.pdb"]
FULL = ["1l2y.pdb", "1ubi.pdb", "1aki.pdb", "7pfl.pdb"]


def skew(v: torch.Tensor) -> torch.Tensor:
    z = torch.zeros_like(v[..., 0])
    x, y, w = v.unbind(-1)
    return torch.stack([z, -w, y, w, z, -x, -y, x, z], -1).unflatten(-1, (3, 3))


def load(name: str) -> dict:
    p = zp.from_pdb(DATA / name)
    pos, mask = p.to_atom37()
    R, t = zp.backbone_frames(pos)
    tor = p.torsion_tensor()
    pos14, mask14 = p.to_atom14()
    return {
        "name": name,
        "aatype": p.aatype,
        "mask37": mask,
        "R": R,
        "t": t,
        "torsions": torch.nan_to_num(tor),  # undefined torsions are unused by the builder
        "pos14": pos14,
        "mask14": mask14,
    }


def corrupt(s: dict, g: torch.Generator) -> tuple:
    L = len(s["aatype"])
    rot = torch.linalg.matrix_exp(skew(0.1 * torch.randn(L, 3, generator=g, dtype=torch.float64)))
    R = s["R"] @ rot
    t = s["t"] + 0.4 * torch.randn(L, 3, generator=g, dtype=torch.float64)
    tor = s["torsions"] + 0.4 * torch.randn(L, 7, generator=g, dtype=torch.float64)
    return R, t, tor


class FrameNet(nn.Module):
    """(aatype, noisy frames, noisy torsions) -> rigid update and torsion corrections."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(21, 16)
        self.mlp = nn.Sequential(
            nn.Linear(16 + 14 + 6, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 13)
        )
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)  # starts as the identity: no update

    def forward(self, aatype, R, t, tor):
        # neighbours' origins in each residue's frame (the padding copies the end residue)
        prev = torch.cat([t[:1], t[:-1]])
        nxt = torch.cat([t[1:], t[-1:]])
        local = torch.einsum("lji,lkj->lki", R, torch.stack([prev, nxt], 1) - t[:, None])
        x = torch.cat([self.embed(aatype), tor.sin(), tor.cos(), local.flatten(1) / 4], -1).float()
        out = self.mlp(x).double()
        R2 = R @ torch.linalg.matrix_exp(skew(0.1 * out[:, :3]))
        t2 = t + torch.einsum("lij,lj->li", R, out[:, 3:6])
        return R2, t2, tor + out[:, 6:]


def evaluate(model, s, R, t, tor, train: bool):
    with torch.set_grad_enabled(train):
        R2, t2, tor2 = model(s["aatype"], R, t, tor)
        pos14, _ = zp.atom14_from_frames(R2, t2, s["aatype"], tor2)
        m = s["mask14"]
        mse = ((pos14 - s["pos14"]) ** 2).sum(-1)[m].mean()
        pos37, _ = zp.atom14_to_atom37(pos14, s["aatype"], m)
        v = zp.structural_violations(pos37, s["aatype"], s["mask37"])
        return mse + v["loss"], mse, v


def report(model, structures, evalset) -> dict:
    keys = ("violations_per_residue", "violations_between_residue_bond", "violations_between_residue_clash")
    tot = {k: 0.0 for k in (*keys, "rmsd", "loss")}
    for s, (R, t, tor) in zip(structures, evalset, strict=True):
        loss, mse, v = evaluate(model, s, R, t, tor, train=False)
        tot["rmsd"] += mse.sqrt().item() / len(structures)
        tot["loss"] += v["loss"].item() / len(structures)
        for k in keys:
            tot[k] += v[k].item() / len(structures)
    return tot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="more structures and steps")
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    names = FULL if args.full else TINY
    steps = args.steps or (1500 if args.full else 300)
    structures = [load(n) for n in names]
    g = torch.Generator().manual_seed(12)
    evalset = [corrupt(s, g) for s in structures]
    model = FrameNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = report(model, structures, evalset)
    fmt = "step {:4d}: atom RMSD {rmsd:.3f} A, violation loss {loss:.3f}, residues violating {violations_per_residue:.3f} (bonds {violations_between_residue_bond:.3f}, clashes {violations_between_residue_clash:.3f})"  # noqa: E501
    print("structures:", ", ".join(f"{s['name']} ({len(s['aatype'])} res)" for s in structures))
    print(fmt.format(0, **first))
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        opt.zero_grad()
        total = 0.0
        for s in structures:
            loss, _, _ = evaluate(model, s, *corrupt(s, g), train=True)
            total = total + loss / len(structures)
        total.backward()
        opt.step()
        if step % max(steps // 4, 1) == 0:
            print(fmt.format(step, **report(model, structures, evalset)))
    last = report(model, structures, evalset)
    print(f"trained {steps} steps in {time.perf_counter() - t0:.1f} s")
    print(
        f"residues violating {first['violations_per_residue']:.3f} -> {last['violations_per_residue']:.3f}; "
        f"violation loss {first['loss']:.3f} -> {last['loss']:.3f}; atom RMSD {first['rmsd']:.3f} -> "
        f"{last['rmsd']:.3f} A"
    )


if __name__ == "__main__":
    torch.set_num_threads(1)  # a small model: on a shared machine more threads wait for each other
    main()
