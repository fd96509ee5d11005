"""Data-parallel training with ``torch.distributed``: zmat inside a DDP loss.

zmat adds nothing to learn for multi-machine training: ``to_xyz`` and
``clash_loss`` are ordinary differentiable torch functions, so they sit inside
the loss of a ``DistributedDataParallel`` model like any layer, and DDP
all-reduces the gradients they produce. This script shows the whole pattern
on one machine with the ``gloo`` backend (CPU; also CUDA tensors):

* a small MLP reads the interatomic distances of a target conformation of a
  chain and predicts its dihedrals;
* ``zmat.to_xyz`` builds the predicted coordinates (one shared table, the
  batch in leading dimensions);
* loss = geometry term (mean squared error of all interatomic distances,
  superposition-free) + ``clash_loss`` (flat-bottom, 1-2/1-3/1-4 pairs
  excluded);
* each process trains on its shard (``DistributedSampler``); at the end the
  script checks that every rank holds the same parameters.

Run it as is (it starts its processes with ``torch.multiprocessing.spawn``,
``--nproc`` of them, on a free local port), or under ``torchrun``, which is
how the same file scales to several machines::

    python examples/distributed.py                            # 2 processes, ~20 s
    torchrun --standalone --nproc_per_node 2 examples/distributed.py
    torchrun --nnodes 2 --node_rank 0 --master_addr HOST --master_port 29500 \\
        --nproc_per_node 8 examples/distributed.py --device cuda --backend nccl --samples 100000

The default is small; ``--atoms``, ``--samples``, ``--epochs`` and
``--batch`` (per process) give the real size.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import zmat

BOND, ANGLE = 1.53, math.radians(111.0)
RADIUS, TOLERANCE = 1.7, 0.4  # carbons clash closer than 3.0 A


def chain_table(n: int) -> zmat.ConstructionTable:
    rows = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]] + [[i - 1, i - 2, i - 3] for i in range(3, n)]
    return zmat.ConstructionTable(rows[:n])


def internal(dihedrals: torch.Tensor) -> torch.Tensor:
    """(..., N - 3) dihedrals -> (..., N, 3) internal coordinates of the chain."""
    pad = dihedrals.new_zeros(*dihedrals.shape[:-1], 3)
    phi = torch.cat([pad, dihedrals], -1)
    r = torch.full_like(phi, BOND)
    theta = torch.full_like(phi, ANGLE)
    return torch.stack([r, theta, phi], -1)


def distances(xyz: torch.Tensor) -> torch.Tensor:
    """Upper-triangle interatomic distances, (..., N (N - 1) / 2)."""
    n = xyz.shape[-2]
    i, j = torch.triu_indices(n, n, 1, device=xyz.device)
    return (xyz[..., i, :] - xyz[..., j, :]).norm(dim=-1)


def make_dataset(n_atoms: int, n_samples: int, seed: int) -> TensorDataset:
    """Clash-free rotamer conformations (trans/gauche, 15 degree noise): (distances, dihedrals)."""
    g = torch.Generator().manual_seed(seed)
    table = chain_table(n_atoms)
    pairs = zmat.exclusions_from_table(table, depth=3)
    radii = torch.full((n_atoms,), RADIUS)
    kept = []
    while sum(len(k) for k in kept) < n_samples:
        centres = torch.tensor([math.pi, math.pi / 3, -math.pi / 3])
        which = torch.multinomial(
            torch.tensor([0.6, 0.2, 0.2]), 4 * n_samples * (n_atoms - 3), True, generator=g
        )
        phi = centres[which] + torch.randn(which.shape, generator=g) * math.radians(15.0)
        phi = phi.view(4 * n_samples, n_atoms - 3)
        xyz = zmat.to_xyz(internal(phi), table)
        ok = zmat.clash_loss(xyz, radii, exclude=pairs, tolerance=TOLERANCE) == 0
        kept.append(phi[ok])
    phi = torch.cat(kept)[:n_samples]
    return TensorDataset(distances(zmat.to_xyz(internal(phi), table)), phi)


class DihedralNet(nn.Module):
    """Interatomic distances -> dihedrals (radians), through (sin, cos) pairs."""

    def __init__(self, n_atoms: int, width: int = 256) -> None:
        super().__init__()
        self.n = n_atoms - 3
        n_in = n_atoms * (n_atoms - 1) // 2
        self.net = nn.Sequential(
            nn.Linear(n_in, width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Linear(width, 2 * self.n),
        )

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        sc = self.net(d / 10.0).unflatten(-1, (self.n, 2))
        return torch.atan2(sc[..., 0], sc[..., 1])


class Loss:
    """Geometry + clash loss of predicted dihedrals, through zmat.to_xyz; per sample, (B,)."""

    def __init__(self, n_atoms: int, clash_weight: float, device) -> None:
        self.table = chain_table(n_atoms)
        self.pairs = zmat.exclusions_from_table(self.table, depth=3).to(device)  # built once, reused
        self.radii = torch.full((n_atoms,), RADIUS, device=device)
        self.clash_weight = clash_weight

    def __call__(self, dihedrals: torch.Tensor, target: torch.Tensor):
        xyz = zmat.to_xyz(internal(dihedrals), self.table)  # (B, N, 3)
        geometry = (distances(xyz) - target).square().mean(-1)
        clash = zmat.clash_loss(xyz, self.radii, exclude=self.pairs, tolerance=TOLERANCE)
        return geometry + self.clash_weight * clash, geometry, clash


def evaluate(model, loader, loss_fn, device) -> torch.Tensor:
    """(loss, geometry, clash) summed over this rank's shard, and the sample count."""
    total = torch.zeros(4, dtype=torch.float64, device=device)
    with torch.no_grad():
        for d, _ in loader:
            d = d.to(device)
            loss, geometry, clash = loss_fn(model(d), d)
            total += torch.stack([loss.sum(), geometry.sum(), clash.sum(), torch.tensor(len(d))]).to(total)
    return total


def worker(rank: int, world: int, args, port: int | None = None) -> None:
    if port is not None:  # started by this script; torchrun sets these itself
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # processes on this machine
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    try:
        device = torch.device(args.device)
        if device.type == "cuda":
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        run(rank, world, args, device)
    finally:
        dist.destroy_process_group()


def run(rank: int, world: int, args, device) -> None:
    data = make_dataset(args.atoms, args.samples, args.seed)  # every rank builds the same data...
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)  # ...and reads its shard
    full_shard = DataLoader(
        data, batch_size=256, sampler=DistributedSampler(data, world, rank, shuffle=False)
    )

    torch.manual_seed(args.seed)
    model = DDP(
        DihedralNet(args.atoms).to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    loss_fn = Loss(args.atoms, args.clash_weight, device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    def report(tag: str) -> tuple[float, float, float]:
        local = evaluate(model, full_shard, loss_fn, device)
        mine = (local[:3] / local[3]).tolist()
        line = (
            f"[rank {rank}] {tag}: loss {mine[0]:.4f} (geometry {mine[1]:.4f} A^2, clash {mine[2]:.4f} A) "
            f"on its {int(local[3])} samples\n"
        )
        sys.stdout.write(line)  # one write per line: ranks share the terminal
        sys.stdout.flush()
        dist.all_reduce(local)  # sum over ranks
        return tuple((local[:3] / local[3]).tolist())

    before = report("before")
    t0 = time.perf_counter()
    steps = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for d, _ in loader:
            d = d.to(device)
            loss, geometry, clash = loss_fn(model(d), d)
            opt.zero_grad()
            loss.mean().backward()  # DDP all-reduces (averages) the gradients here
            opt.step()
            steps += 1
    seconds = time.perf_counter() - t0
    grad_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    after = report("after")

    # All ranks must hold identical parameters: compare with rank 0's copy.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    diff = (flat - ref).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(
            f"{world} processes, backend {args.backend}, device {device.type}: {steps} steps per rank "
            f"in {seconds:.1f} s ({1e3 * seconds / max(steps, 1):.1f} ms/step), "
            f"last gradient norm {grad_norm:.3e}\n"
            f"global loss {before[0]:.4f} -> {after[0]:.4f} "
            f"(geometry {before[1]:.4f} -> {after[1]:.4f} A^2, clash {before[2]:.4f} -> {after[2]:.4f} A)\n"
            f"parameters in sync across ranks: max |difference| = {diff.item():.1e}",
            flush=True,
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="processes to spawn (ignored under torchrun)")
    ap.add_argument("--atoms", type=int, default=24, help="chain length")
    ap.add_argument("--samples", type=int, default=512, help="training conformations (all ranks)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32, help="per process")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--clash-weight", type=float, default=1.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads per process (0: cores / processes)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    else:
        mp.spawn(worker, args=(args.nproc, args, free_port()), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
