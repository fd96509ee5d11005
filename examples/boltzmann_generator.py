"""A Boltzmann-generator-style normalizing flow on alanine dipeptide, trained by maximum likelihood.

The data are a real molecular-dynamics trajectory: 1000 frames (1 ns) of
alanine dipeptide in implicit solvent made with OpenMM
(``tests/data/alanine_dipeptide.{pdb,dcd}``, origin in ``tests/data/SOURCES.md``),
read with MDAnalysis through :mod:`zmat.md`, which builds the z-matrix from the
topology's bonds. :class:`zmat.flows.InternalCoordinateTransform` with
``normalize_angles=True`` is the bijection between the ``3 N = 66`` Cartesian
coordinates and ``q``: bonds, angles / pi and torsions in ``[0, 1]``, plus the
molecule's position and orientation (``T.circular`` marks the periodic
entries). ``zmat.flows.zuko_flow(T, q_train)`` is the flow from zuko that models
``q``: ``zmat.flows.BoxTransform`` maps every entry affinely onto ``[-pi, pi]``
(the bounded entries by their bounds, the others by the training range with a
margin), then masked autoregressive rational-quadratic splines, *circular* ones
(Rezende et al. 2020: a circular shift, then a spline pinned at both ends) on
the torsions and orientation angles, ordinary ones on the rest, over a uniform
base on that box. ``--plain`` trains zuko's plain ``NSF`` on the same ``q``
instead, for comparison.

The likelihood is reported in Cartesian space, per structure, in nats
(positions in Angstrom)::

    log p(xyz) = log p_flow(q) - log|det dxyz/dq|   (T.log_abs_det_jacobian(q, xyz))

before and after training, on the training frames and on held-out frames.
Then it samples structures (``T(q)``), prints the fraction of frames in the
alpha-R basin (psi between -120 and 50 degrees) for data and samples, and
plots the Ramachandran plot of data against samples to a PNG.

    python examples/boltzmann_generator.py                      # tiny: 300 steps, < 1 min on CPU
    python examples/boltzmann_generator.py --steps 1000 --rotate  # longer, with rotation augmentation

``--rotate`` turns every training batch by random rotations about its root
atom (``T(q)``, rotate, ``T.inv``): the Boltzmann density is invariant under
them, so the flow learns a uniform orientation instead of the trajectory's.
1 ns of one molecule is little data for 66 dimensions: longer runs fit the
training frames much better and the held-out frames worse (see
``docs/examples.md``).

Needs the extras ``md`` (MDAnalysis) and ``flows`` (zuko); matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import zuko

import zmat
from zmat import flows, md

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def make_flow(T, q_train, args) -> zuko.flows.Flow:
    """The library's flow (box, circular splines on ``T.circular``, uniform base), or with
    ``--plain`` zuko's plain NSF on the same ``q``, for comparison."""
    if args.plain:
        hidden = (args.hidden, args.hidden)
        return zuko.flows.NSF(q_train.shape[1], transforms=args.transforms, hidden_features=hidden)
    return flows.zuko_flow(T, q_train, transforms=args.transforms, hidden=args.hidden, bins=args.bins)


def cartesian_log_prob(flow, T, q: torch.Tensor) -> torch.Tensor:
    """``log p(xyz)`` of the structures ``T(q)`` under the flow, ``(B,)`` in float64."""
    with torch.no_grad():
        lp = flow().log_prob(q.float()).double()
    return lp - T.log_abs_det_jacobian(q)


def check_log_det(T, q: torch.Tensor) -> float:
    """Largest difference between ``T.log_abs_det_jacobian`` and ``slogdet`` of the autograd
    Jacobian ``dxyz/dq`` (66 x 66) on a few frames: the Cartesian likelihood uses the exact volume."""
    worst = 0.0
    for qi in q:
        J = torch.autograd.functional.jacobian(lambda x: T(x).flatten(), qi)
        worst = max(worst, abs(float(torch.linalg.slogdet(J)[1] - T.log_abs_det_jacobian(qi))))
    return worst


def random_rotations(n: int, dtype=torch.float64) -> torch.Tensor:
    """``(n, 3, 3)`` rotations drawn from the Haar measure (QR of a Gaussian matrix, signs fixed)."""
    Q, R = torch.linalg.qr(torch.randn(n, 3, 3, dtype=dtype))
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
    return Q * torch.linalg.det(Q)[:, None, None]  # det -1 -> +1 (flip every column)


def rotated(T, q: torch.Tensor) -> torch.Tensor:
    """``q`` of the same structures turned by random rotations about their root atom: the
    Boltzmann density is invariant under them, so the orientation is uniform, whatever the frames."""
    xyz = T(q)
    root = xyz[..., T.table.refs[:, 0] < 0, :][..., :1, :]
    return T.inv((xyz - root) @ random_rotations(len(q)).transpose(-1, -2) + root)


def ramachandran(xyz: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
    """``(B, 2)`` phi, psi in degrees."""
    return torch.rad2deg(zmat.dihedrals(xyz, quads))


def alpha_fraction(phipsi: torch.Tensor) -> float:
    psi = phipsi[:, 1]
    return float(((psi > -120) & (psi < 50)).double().mean())


def plot(data: torch.Tensor, samples: torch.Tensor, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), sharey=True)
    for ax, pts, title in zip(axes, (data, samples), ("MD data", "flow samples"), strict=True):
        ax.hist2d(pts[:, 0].numpy(), pts[:, 1].numpy(), bins=60, range=[[-180, 180], [-180, 180]], cmin=1)
        ax.set(title=f"{title} ({len(pts)})", xlabel="phi (deg)", xlim=(-180, 180), ylim=(-180, 180))
    axes[0].set_ylabel("psi (deg)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--transforms", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--bins", type=int, default=8)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rotate", action="store_true", help="augment with random rotations about the root")
    ap.add_argument("--plain", action="store_true", help="a plain zuko NSF on q instead, for comparison")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "zmat_boltzmann_generator.png")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)

    ag = md.atom_group((DATA / "alanine_dipeptide.pdb", DATA / "alanine_dipeptide.dcd"))
    T, q = md.flow_coordinates(ag, normalize_angles=True)  # (F, 66) float64
    perm = torch.randperm(len(q))
    n_test = len(q) // 5
    q_test, q_train = q[perm[:n_test]], q[perm[n_test:]]
    print(
        f"{len(q)} frames of {len(ag)} atoms: {len(q_train)} training, {n_test} held out; q has {q.shape[1]}"
    )
    print(f"{int(T.circular.sum())} periodic entries (torsions, 2 orientation angles) get circular splines")

    print(f"log|det dxyz/dq| vs slogdet of the autograd Jacobian: {check_log_det(T, q[:4]):.1e}")
    flow = make_flow(T, q_train, args)
    z_train = q_train.float()

    def nll(qs):
        return float(-cartesian_log_prob(flow, T, qs).mean())

    before = nll(q_train), nll(q_test)
    print(f"Cartesian NLL before: train {before[0]:.2f}, held out {before[1]:.2f} nats per structure")
    opt = torch.optim.Adam(flow.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)
    t0 = time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(len(z_train), (args.batch,))
        batch = rotated(T, q_train[idx]).float() if args.rotate else z_train[idx]
        loss = -flow().log_prob(batch).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % max(1, args.steps // 5) == 0:
            print(f"  step {step + 1}: NLL(q) {float(loss.detach()):.2f}")
    seconds = time.perf_counter() - t0
    after = nll(q_train), nll(q_test)
    print(f"Cartesian NLL after: train {after[0]:.2f}, held out {after[1]:.2f} nats per structure")
    print(f"trained {args.steps} steps in {seconds:.1f} s")

    with torch.no_grad():
        z = flow().sample((args.samples,)).double()
    xyz_samples = T(z)
    sel = "resname ACE and name C", "resname ALA and name N", "resname ALA and name CA"
    sel += "resname ALA and name C", "resname NME and name N"
    c0, n, ca, c, n1 = (int(ag.select_atoms(s)[0].ix) for s in sel)  # Universe indices = group indices here
    quads = torch.tensor([[c0, n, ca, c], [n, ca, c, n1]])
    data = ramachandran(md.positions(ag), quads)
    samples = ramachandran(xyz_samples, quads)
    print(f"alpha-R fraction: data {alpha_fraction(data):.2f}, samples {alpha_fraction(samples):.2f}")
    bonds = zmat.to_internal(xyz_samples, T.table)[..., 0][:, T.table.refs[:, 0] >= 0]
    print(f"sampled bond lengths {float(bonds.min()):.3f} to {float(bonds.max()):.3f} A")
    plot(data, samples, args.out)
    print(f"Ramachandran plot: {args.out}")


if __name__ == "__main__":
    torch.set_num_threads(1)  # a small model: on a shared machine more threads wait for each other
    main()
