"""From the users' z-matrix loop to a fast, differentiable clash loss.

The users' report (``shared/seeds/003_*``) describes a chemcoord-style
z-matrix -> Cartesian loop, ``get_X_torch(C, c_table)``: ``C`` is a ``(3, N)``
tensor whose rows are bond lengths, angles and dihedrals (radians, chemcoord's
dihedral sign), ``c_table`` a ``(3, N)`` integer table of bond, angle and
dihedral references whose first rows hold chemcoord's sentinels
(``-9223372036854775807`` and friends) for "absolute" references, and every
atom is written into ``X[:, j] = ...`` in place. On top of it sits a hard
clash count, ``1.0 if get_clash_loss(xyz) > 0.0 else 0.0``.

This script first rebuilds that pattern from the description and shows its
two failures:

1. ``total_loss.backward()`` raises "one of the variables needed for gradient
   computation has been modified by an inplace operation": each ``X[:, j] = ...``
   overwrites memory that autograd saved for earlier atoms;
2. the hard clash count, and the ``(clash > 0).float()`` "fix", has no
   gradient at all: it is piecewise constant, so nothing can learn from it.

Then the migration, three lines::

    C_zmat, table = zmat.chemcoord.from_chemcoord_arrays(c_table, C, degrees=False)
    xyz = zmat.to_xyz(C_zmat, table)                   # (N, 3), differentiable, batched
    loss = zmat.clash_loss(xyz, radii, exclude=table)  # smooth: gradient wherever atoms overlap

and a small decoder (latent -> dihedrals, as in the users' model) trained
against that loss, with the clash loss and the hard clash count going down.

    python examples/seed_migration.py                      # 64-atom chain, ~10 s
    python examples/seed_migration.py --atoms 304 --batch 64 --steps 300   # ~30 s
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

import zmat

# chemcoord's sentinels for the absolute references (chemcoord.constants.int_label)
ORIGIN, E_X, E_Y, E_Z = (-(2**63) + k for k in range(4))  # E_X == -9223372036854775807


# ---------------------------------------------------------------- the users' code
def chain_c_table(n: int) -> torch.Tensor:
    """chemcoord-style (3, N) table of an unbranched chain, sentinels in the first rows."""
    t = torch.empty(3, n, dtype=torch.long)
    for j in range(n):
        t[:, j] = torch.tensor([j - 1, j - 2, j - 3])
    t[:, 0] = torch.tensor([ORIGIN, E_Z, E_X])
    t[:, 1] = torch.tensor([0, E_Z, E_X])
    t[:, 2] = torch.tensor([1, 0, E_X])
    return t


def get_ref_pos_torch(X: torch.Tensor, idx) -> torch.Tensor:
    """Position of reference ``idx``: a column of X, or a fixed point for a sentinel."""
    idx = int(idx)
    if idx < -(2**63) + 101:
        point = torch.zeros(3, dtype=X.dtype, device=X.device)
        if idx != ORIGIN:
            point[idx - E_X] = 1.0  # e_x, e_y, e_z
        return point
    return X[:, idx]


def get_B_torch(X: torch.Tensor, c_table: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    """chemcoord's ``get_B`` ported line by line: the NeRF frame of (b, a, d), filled in place."""
    ref_pos = torch.stack([get_ref_pos_torch(X, c_table[k, j]) for k in range(3)], 1)
    B = torch.empty(3, 3, dtype=X.dtype, device=X.device)
    BA = ref_pos[:, 1] - ref_pos[:, 0]
    AD = ref_pos[:, 2] - ref_pos[:, 1]
    B[:, 2] = -BA / torch.linalg.norm(BA)
    N = torch.linalg.cross(AD, BA)
    B[:, 1] = N / torch.linalg.norm(N)
    B[:, 0] = torch.linalg.cross(B[:, 1], B[:, 2])  # reads B, then writes into it
    return B, ref_pos[:, 0]


def get_S_torch(C: torch.Tensor, j: int) -> torch.Tensor:
    r, alpha, delta = C[:, j]
    return torch.stack(
        [
            r * torch.sin(alpha) * torch.cos(delta),
            -r * torch.sin(alpha) * torch.sin(delta),
            -r * torch.cos(alpha),
        ]
    )


def get_X_torch(C: torch.Tensor, c_table: torch.Tensor) -> torch.Tensor:
    """The users' loop (``_zmat_transformation.py`` line 57, in torch): (3, N) -> (N, 3)."""
    X = torch.zeros_like(C)  # ([b a d], n_atoms)
    for j in range(X.shape[1]):
        B, ref_pos = get_B_torch(X, c_table, j)
        S = get_S_torch(C, j)
        X[:, j] = torch.mv(B, S) + ref_pos  # in place: breaks backward
    return X.T


def distances(xyz: torch.Tensor) -> torch.Tensor:
    """(..., N, N) interatomic distances (exact; cdist's matmul shortcut loses digits)."""
    return (xyz[..., :, None, :] - xyz[..., None, :, :]).norm(dim=-1)


def hard_clash_count(xyz: torch.Tensor, keep: torch.Tensor, cutoff: float) -> torch.Tensor:
    """The users' ``get_clash_loss``: how many non-excluded pairs are closer than ``cutoff``."""
    d = distances(xyz)
    return ((d < cutoff) & keep).sum((-1, -2)) // 2


# ------------------------------------------------------------------ the model
class DihedralDecoder(nn.Module):
    """latent -> N dihedrals (radians), through (sin, cos) pairs and atan2 as in the users' model."""

    def __init__(self, n_atoms: int, latent: int = 16, width: int = 128) -> None:
        super().__init__()
        self.n = n_atoms
        self.net = nn.Sequential(nn.Linear(latent, width), nn.GELU(), nn.Linear(width, 2 * n_atoms))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.net(z)
        return torch.atan2(out[..., : self.n], out[..., self.n :])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atoms", type=int, default=64, help="chain length N (the users had 304)")
    ap.add_argument("--batch", type=int, default=32, help="conformations per step")
    ap.add_argument("--steps", type=int, default=60, help="training steps")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    n = args.atoms
    result: dict = {}

    # The users' inputs: fixed bonds and angles (C-C 1.53 A, 111 deg), dihedrals from a network.
    c_table = chain_c_table(n)
    bonds = torch.full((n,), 1.53, device=device)
    angles = torch.full((n,), math.radians(111.0), device=device)
    radius, tolerance = 1.7, 0.4  # two carbons clash closer than 1.7 + 1.7 - 0.4 = 3.0 A
    model = DihedralDecoder(n).to(device)
    z = torch.randn(args.batch, 16, device=device)

    # --------------------------------------------------------------- failure 1
    print(f"== 1. the users' loop: X[:, j] = ... over {n} atoms")
    dihedrals = model(z[0])
    C = torch.stack((bonds, angles, dihedrals))  # (3, N)
    xyz = get_X_torch(C, c_table.to(device))
    total_loss = (xyz[:, None] - xyz[None]).square().sum()  # any loss on xyz will do
    try:
        total_loss.backward()
        print("backward: no error (unexpected)")
        result["inplace_error"] = None
    except RuntimeError as err:
        msg = str(err).split(" Hint:")[0]
        print(f"total_loss.backward() raises RuntimeError:\n  {msg}")
        print("  (the loop overwrites tensors autograd saved: X[:, j] = ... and, in get_B, B[:, k] = ...)")
        result["inplace_error"] = msg

    # --------------------------------------------------------------- failure 2
    model.zero_grad(set_to_none=True)
    print("\n== 2. the hard clash count has no gradient")
    sep = torch.arange(n, device=device)
    keep = (sep[:, None] - sep[None]).abs() > 3  # pairs more than three bonds apart
    cutoff = 2 * radius - tolerance
    with torch.no_grad():  # the forward pass of the loop works; the count needs nothing else
        xyz = get_X_torch(torch.stack((bonds, angles, model(z[0]))), c_table.to(device))
    clash = hard_clash_count(xyz, keep, cutoff)
    clash_loss_term = torch.tensor(0.0, requires_grad=True, device=device)
    total_loss = clash_loss_term + (1.0 if clash > 0.0 else 0.0)
    total_loss.backward()  # runs, but only reaches the constant it started from
    weight = model.net[0].weight
    print(
        f"clash count {int(clash)}; loss `1.0 if clash > 0.0 else 0.0` = {total_loss.item()}: "
        f"decoder weight.grad = {weight.grad}"
    )
    as_float = (clash > 0.0).float()
    print(
        f"`(clash > 0.0).float()` = {as_float.item()}: requires_grad={as_float.requires_grad}, "
        f"grad_fn={as_float.grad_fn}; its gradient is 0 wherever it is defined"
    )
    result["hard_grad"] = weight.grad
    result["float_requires_grad"] = as_float.requires_grad

    # --------------------------------------------------------------- migration
    print("\n== 3. zmat: the same table and values, one call, differentiable")
    C = torch.stack((bonds, angles, model(z[0])))  # (3, N), exactly the users' input
    C_zmat, table = zmat.chemcoord.from_chemcoord_arrays(c_table, C, degrees=False)
    t0 = time.perf_counter()
    xyz = zmat.to_xyz(C_zmat, table)  # (N, 3), differentiable in the decoder's weights
    t_zmat = time.perf_counter() - t0
    print(f"from_chemcoord_arrays -> {table}")
    with torch.no_grad():  # same structure as the users' loop (up to a rigid motion), in float64
        C64 = C.detach().double()
        t0 = time.perf_counter()
        ref = get_X_torch(C64, c_table.to(device))
        t_loop = time.perf_counter() - t0
        xyz64 = zmat.to_xyz(*zmat.chemcoord.from_chemcoord_arrays(c_table, C64, degrees=False))
        dev = (distances(xyz64) - distances(ref)).abs().max().item()
    print(
        f"max |interatomic distance difference| to the users' loop (float64): {dev:.1e} A; "
        f"loop {1e3 * t_loop:.1f} ms, zmat.to_xyz {1e3 * t_zmat:.2f} ms"
    )
    result["max_distance_difference"] = dev
    # For a batch, convert the table once; rows with an absolute reference (the first three)
    # take the converted values, every other row is (bond, angle, -dihedral): zmat's IUPAC sign.
    plain = torch.as_tensor(~(c_table < -(2**63) + 101).any(0), device=device)[:, None]
    pairs = zmat.exclusions_from_table(table, depth=3).to(device)  # 1-2, 1-3, 1-4 pairs never clash
    radii = torch.full((n,), radius, device=device)

    def batch_loss(model):
        dihedrals = model(z)  # (B, N)
        C_batch = torch.stack((bonds.expand_as(dihedrals), angles.expand_as(dihedrals), -dihedrals), -1)
        C_batch = torch.where(plain, C_batch, C_zmat.detach())
        xyz = zmat.to_xyz(C_batch, table)  # (B, N, 3)
        loss = zmat.clash_loss(xyz, radii, exclude=pairs, tolerance=tolerance)  # (B,)
        return loss.mean(), xyz

    loss0, xyz0 = batch_loss(model)
    loss0.backward()
    gnorm0 = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    model.zero_grad()
    count0 = hard_clash_count(xyz0.detach(), keep, cutoff).float().mean()
    print(f"smooth clash loss {loss0.item():.3f} A, gradient norm {gnorm0:.3e} (the hard count's was None)")

    print(f"\n== 4. training the decoder on the clash loss: batch {args.batch}, {args.steps} steps")
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    history = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        loss, xyz = batch_loss(model)
        opt.zero_grad()
        loss.backward()
        gnorm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
        opt.step()
        history.append(loss.item())
        if step % max(args.steps // 6, 1) == 0 or step == args.steps - 1:
            print(f"step {step:4d}  clash loss {loss.item():8.3f} A  grad norm {gnorm:.2e}")
    t_train = time.perf_counter() - t0
    with torch.no_grad():
        loss1, xyz1 = batch_loss(model)
    count1 = hard_clash_count(xyz1, keep, cutoff).float().mean()
    print(
        f"clash loss {loss0.item():.3f} -> {loss1.item():.3f} A, "
        f"hard clash count per conformation {count0:.1f} -> {count1:.1f}, "
        f"{1e3 * t_train / max(args.steps, 1):.1f} ms/step"
    )
    result.update(
        loss_before=loss0.item(),
        loss_after=loss1.item(),
        count_before=count0.item(),
        count_after=count1.item(),
        history=history,
        grad_norm=gnorm0.item(),
    )
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)  # a small model: on a shared machine more threads wait for each other
    main()
