"""A small torsion-space protein model trained on real structures.

A 1D convolutional network reads a sequence and predicts the seven torsions of
every residue (phi, psi, omega, chi1..chi4, as sin/cos pairs). The torsions
go through ``zmat.protein.ProteinBatch`` (ideal geometry, a padded batch of
different lengths, one forest table) and ``zmat.to_xyz`` to full-atom
coordinates, on which the loss is computed:

* torsion term: ``1 - cos(predicted - true)`` over the torsions defined in the
  file;
* geometry term: mean absolute error of the CA-CA distances shorter than
  15 A (a local, superposition-free structure loss);
* clash term: ``zmat.clash.clash_loss`` (AlphaFold's flat-bottom penalty,
  radii C 1.7, N 1.55, O 1.52, S 1.8, tolerance 1.5 A) over the atom pairs
  more than three covalent bonds apart, ring closures included.

The default is tiny and runs in seconds (CI runs it); ``--full`` trains a
larger model on random crops of every test structure. ``--out DIR`` writes a
predicted structure per training chain as PDB.

    python examples/protein_torsion_model.py            # tiny, ~10 s
    python examples/protein_torsion_model.py --full --out samples/
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import zmat.protein as zp
from zmat.clash import clash_loss

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
TINY = [("1l2y.pdb", None), ("1ubi.pdb", None)]
FULL = [("1l2y.pdb", None), ("1ubi.pdb", None), ("1aki.pdb", None), ("7pfl.pdb", None), ("1igy.pdb", "A")]


class TorsionNet(nn.Module):
    """Sequence -> (L, 7) torsions (radians), by a residual 1D CNN."""

    def __init__(self, width: int = 32, depth: int = 2, kernel: int = 9) -> None:
        super().__init__()
        self.embed = nn.Embedding(21, width)  # 20 amino acids + padding
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv1d(width, width, kernel, padding=kernel // 2), nn.GELU())
            for _ in range(depth)
        )
        self.head = nn.Linear(width, 14)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).transpose(1, 2)  # (B, W, L)
        for block in self.blocks:
            h = h + block(h)
        sc = self.head(h.transpose(1, 2)).unflatten(-1, (7, 2))  # (B, L, 7, 2)
        return torch.atan2(sc[..., 0], sc[..., 1])


def load_chains(files) -> list[zp.Protein]:
    return [zp.from_pdb(DATA / f, chain=c) for f, c in files]


def crops(proteins, length: int | None, generator: torch.Generator) -> list[tuple[zp.Protein, int, int]]:
    out = []
    for p in proteins:
        L = len(p)
        n = L if length is None else min(length, L)
        s = int(torch.randint(0, L - n + 1, (), generator=generator))
        out.append((p, s, s + n))
    return out


def make_batch(items):
    """Tokens, true torsions, true CA coordinates and a ProteinBatch for crops."""
    seqs = [p.sequence[s:e] for p, s, e in items]
    batch = zp.ProteinBatch(seqs)
    B, L = len(seqs), batch.L_max
    tokens = torch.full((B, L), 20, dtype=torch.long)
    tors = torch.full((B, L, 7), torch.nan)
    ca_true = torch.full((B, L, 3), torch.nan)
    for b, (p, s, e) in enumerate(items):
        tokens[b, : e - s] = torch.tensor([zp.topology.AA1.index(c) for c in seqs[b]])
        tors[b, : e - s] = p.torsion_tensor()[s:e].float()
        ca = p.atom_names == "CA"
        res = p.residue_index[torch.as_tensor(ca)]
        sel = (res >= s) & (res < e)
        ca_true[b, res[sel] - s] = p.xyz[torch.as_tensor(ca)][sel].float()
    # torsions at crop ends are not those of a free terminus
    tors[:, 0, 0] = torch.nan
    for b, (_, s, e) in enumerate(items):
        tors[b, e - s - 1, 1:3] = torch.nan
    ca_idx = torch.zeros(B, L, dtype=torch.long)
    for b, lay in enumerate(batch.layouts):
        ca_idx[b, : lay.n_residues] = torch.as_tensor((lay.atom_names == "CA").nonzero()[0])
    return tokens, tors, ca_true, ca_idx, batch


def losses(model, tokens, tors, ca_true, ca_idx, batch, pairs=None):
    pred = model(tokens)  # (B, L, 7)
    defined = ~torch.isnan(tors)
    torsion = (1 - torch.cos(pred - tors.nan_to_num()))[defined].mean()
    xyz = batch.to_xyz(pred)  # (B, N_max, 3)
    ca = torch.gather(xyz, 1, ca_idx.unsqueeze(-1).expand(-1, -1, 3))
    d_pred, d_true = torch.cdist(ca, ca), torch.cdist(ca_true.nan_to_num(), ca_true.nan_to_num())
    ok = batch.residue_mask[:, :, None] & batch.residue_mask[:, None, :] & (d_true < 15.0)
    ok &= ~torch.isnan(ca_true[..., 0])[:, :, None] & ~torch.isnan(ca_true[..., 0])[:, None, :]
    geometry = (d_pred - d_true).abs()[ok].mean()
    if pairs is None:
        pairs = batch.clash_pairs(xyz)
    clash = clash_loss(xyz, batch.radii.to(xyz), mask=batch.atom_mask, pairs=pairs)
    clash = (clash / batch.atom_mask.sum(-1)).mean()  # per atom
    return torsion, geometry, clash, xyz


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="real size: larger model, all structures, crops")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--clash-weight", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=None, help="write predicted structures here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    if args.full:
        proteins, steps, crop, model = load_chains(FULL), args.steps or 2000, 96, TorsionNet(128, 6)
    else:
        proteins, steps, crop, model = load_chains(TINY), args.steps or 40, 40, TorsionNet(32, 2)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    fixed = None if args.full else make_batch(crops(proteins, crop, gen))
    history = []
    t0 = time.perf_counter()
    for step in range(steps):
        data = fixed or make_batch(crops(proteins, crop, gen))
        torsion, geometry, clash, _ = losses(model, *data)
        loss = torsion + 0.1 * geometry + args.clash_weight * clash
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append([x.item() for x in (loss, torsion, geometry, clash)])
        if step % max(steps // 10, 1) == 0 or step == steps - 1:
            print(
                f"step {step:5d}  loss {loss:.3f}  torsion {torsion:.3f}  "
                f"CA-distance MAE {geometry:.2f} A  clash/atom {clash:.4f} A  "
                f"({time.perf_counter() - t0:.1f} s)"
            )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with torch.no_grad():
            items = crops(proteins, None, gen)
            tokens, tors, ca_true, ca_idx, batch = make_batch(items)
            xyz = batch.to_xyz(model(tokens))
        for b, (p, _, _) in enumerate(items):
            path = args.out / f"predicted_{b}_{p.sequence[:6]}.pdb"
            zp.Protein.from_batch(batch, b, xyz[b]).to_pdb(path)
            print(f"wrote {path}")
    return {"history": history, "model": model}


if __name__ == "__main__":
    torch.set_num_threads(1)  # a small model: on a shared machine more threads wait for each other
    main()
