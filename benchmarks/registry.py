"""The implementations: what each runs on, and how one timed call is made.

``prepare(problem, device, dtype, mode)`` does the untimed setup (moving
inputs, building peer objects) and returns a :class:`Prepared`: ``first``
is the cold call (for zmat it builds the ``ConstructionTable`` from the raw
array, so it includes validation and planning), ``call`` the warm one that is
timed. ``mode`` is ``"fwd"`` (inputs without grad) or ``"fwd+bwd"`` (forward,
then ``torch.autograd.grad`` of the output with a random upstream gradient).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

import zmat

from . import peers, seeds
from .cases import Problem

__all__ = ["IMPLS", "Impl", "Prepared", "Unsupported", "select"]

MODES = ("fwd", "fwd+bwd")


class Unsupported(RuntimeError):
    """This implementation cannot run this task (recorded as skipped, with the reason)."""


@dataclass
class Prepared:
    call: Callable[[], object]
    first: Callable[[], object] | None = None
    note: str = ""
    scale: float = 1.0  # the runner multiplies measured times by this (a timed subset of the batch)


@dataclass
class Impl:
    name: str
    group: str  # "seed", "zmat", "peer"
    summary: str
    prepare: Callable[[Problem, torch.device, torch.dtype, str], Prepared]
    cases: tuple[str, ...] = ("chain", "molecules", "protein", "protein-mix")
    devices: tuple[str, ...] = ("cpu", "cuda")
    #: least growth exponent of time with size, for extrapolating (steeper measured growth wins)
    exponent: dict = field(default_factory=lambda: {"fwd": 1.0, "fwd+bwd": 1.0})
    #: rough a-priori seconds for (atoms per structure, structures, mode), or None
    estimate: Callable[[int, int, str], float] | None = None
    requires: str | None = None  # peer package name

    def unavailable(self, case: str, device: str) -> str | None:
        if case not in self.cases:
            return f"not applicable to {case}"
        if device.split(":")[0] not in self.devices:
            return f"{device} not supported ({'/'.join(self.devices)} only)"
        if self.requires:
            return peers.available(self.requires)
        return None


def _inputs(problem: Problem, device, dtype, mode):
    C = problem.C.to(device=device, dtype=dtype)
    if mode == "fwd+bwd":
        C.requires_grad_(True)
    return C


def _autograd_call(fn, C, mode, seed=0):
    """A zero-arg callable: ``fn(C)`` then, for fwd+bwd, its vector-Jacobian product."""
    if mode == "fwd":
        return lambda: fn(C)
    gen = torch.Generator().manual_seed(seed)
    g = {}

    def call():
        out = fn(C)
        if "g" not in g:
            g["g"] = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(out.device)
        return torch.autograd.grad(out, C, g["g"])

    return call


# ------------------------------------------------------------------ zmat
def _zmat(method):
    def prepare(problem, device, dtype, mode):
        C = _inputs(problem, device, dtype, mode)
        table = problem.table
        call = _autograd_call(lambda c: zmat.to_xyz(c, table, method=method), C, mode)

        def first():  # cold: validate the raw table, classify it, build the device plan
            cold = zmat.ConstructionTable(problem.refs)
            return _autograd_call(lambda c: zmat.to_xyz(c, cold, method=method), C, mode)()

        return Prepared(call, first)

    return prepare


# ----------------------------------------------------------------- seeds
def _seed(fn):
    def prepare(problem, device, dtype, mode):
        C = _inputs(problem, device, dtype, mode)
        return Prepared(_autograd_call(lambda c: fn(c, problem.table), C, mode))

    return prepare


def _seed_estimate(per_step, cat=False, fd=False):
    def est(atoms, structures, mode):
        t = structures * atoms * per_step
        if mode == "fwd+bwd":
            t *= 3
            if fd:
                t += seeds.fd_cost(atoms, structures) * atoms * per_step
        if cat:  # copying the (3, N) buffer at each step, twice more in backward
            t += structures * atoms * atoms * 3 * 8 / 4e9 * (3 if mode == "fwd+bwd" else 1)
        return t

    return est


# --------------------------------------------------------------- mp_nerf
def _mp_nerf(prebuilt):
    def prepare(problem, device, dtype, mode):
        from mp_nerf.proteins import build_scaffolds_from_scn_angles, protein_fold

        inputs = peers.mp_nerf_inputs(problem.residues, len(problem.sequences), dtype, device)
        if mode == "fwd+bwd":
            inputs = [(s, a.requires_grad_(True)) for s, a in inputs]
        n_atoms = np.mean([peers.mp_nerf_atoms(s) for s, _ in inputs[:4]])
        note = f"random sequence(s), {n_atoms:.0f} atoms, per-structure loop"
        if prebuilt:
            scaffolds = []
            for s, a in inputs:
                sc = build_scaffolds_from_scn_angles(s, a.detach(), device=device)
                if mode == "fwd+bwd":
                    sc["angles_mask"].requires_grad_(True)
                scaffolds.append(sc)

            def fold_all():
                return [protein_fold(**sc, device=device)[0] for sc in scaffolds]

            leaves = [sc["angles_mask"] for sc in scaffolds]
        else:

            def fold_all():
                out = []
                for s, a in inputs:
                    sc = build_scaffolds_from_scn_angles(s, a, device=device)
                    out.append(protein_fold(**sc, device=device)[0])
                return out

            leaves = [a for _, a in inputs]
        if mode == "fwd":
            return Prepared(fold_all, note=note)

        def call():
            outs = fold_all()
            return torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs])

        return Prepared(call, note=note)

    return prepare


# ------------------------------------------------------------- chemcoord
#: chemcoord is slow per structure (pandas; the Jacobian): time at most this many, scale to the batch
CHEMCOORD_MEASURED = 32


def _chemcoord(kernel):
    def prepare(problem, device, dtype, mode):
        B = problem.C.shape[0]
        g = np.random.default_rng(0).standard_normal((problem.table.n_atoms, 3))
        notes = ["CPU float64, per-structure loop"]
        if mode == "fwd+bwd":
            notes.append("Jacobian (no autograd)")
        if kernel:
            get_X, get_grad_X = peers.chemcoord_kernel()
            Cc, c_table, inv = peers.chemcoord_arrays(problem.C, problem.table)
            gc = g.T  # (3, N) upstream gradient

            def one(k):
                err, _, X = get_X(Cc[k], c_table)
                if err:
                    raise RuntimeError(f"chemcoord get_X: invalid reference (code {err})")
                if mode == "fwd+bwd":
                    J = get_grad_X(Cc[k], c_table)
                    np.einsum("ijlk,ij->kl", J, gc)
                return X[:, inv]

            n = B if mode == "fwd" else min(B, CHEMCOORD_MEASURED)  # the Jacobian is slow
        else:
            n = min(B, CHEMCOORD_MEASURED)
            zms = peers.chemcoord_zmats(problem.C, problem.table, n)

            def one(k):
                xyz = zms[k].get_cartesian()
                if mode == "fwd+bwd":
                    J = zms[k].get_grad_cartesian(as_function=False)
                    np.einsum("ijlk,ji->lk", J, g[: J.shape[1]])
                return xyz

        scale = B / n
        if scale > 1:
            notes.append(f"{n} of {B} timed, scaled")

        def call():
            for k in range(n):
                one(k)

        return Prepared(call, note=", ".join(notes), scale=scale)

    return prepare


def _chemcoord_estimate(kernel):
    def est(atoms, structures, mode):
        n = structures if kernel and mode == "fwd" else min(structures, CHEMCOORD_MEASURED)
        t = n * (atoms * 1e-6 + (0 if kernel else 3e-3))
        if mode == "fwd+bwd":
            t += n * atoms * atoms * 1.5e-6
        return t

    return est


# ---------------------------------------------------------------- registry
IMPLS: dict[str, Impl] = {}


def _add(impl: Impl) -> None:
    IMPLS[impl.name] = impl


_add(
    Impl(
        "seed-inplace",
        "seed",
        "users' loop, X[:, j] = ... and B[:, k] = ... (backward fails)",
        _seed(seeds.seed_inplace),
        estimate=_seed_estimate(150e-6),
    )
)
_add(
    Impl(
        "seed-cat",
        "seed",
        "users' fix: torch.cat of X at every step",
        _seed(seeds.seed_cat),
        exponent={"fwd": 2.0, "fwd+bwd": 2.0},  # copies the whole (3, N) buffer at each step
        estimate=_seed_estimate(150e-6, cat=True),
    )
)
_add(
    Impl(
        "seed-fd",
        "seed",
        "users' autograd.Function, finite-difference backward over every element",
        _seed(seeds.seed_fd),
        exponent={"fwd": 1.0, "fwd+bwd": 2.0},
        estimate=_seed_estimate(150e-6, fd=True),
    )
)
for _m in zmat.METHODS:
    _add(Impl(f"zmat-{_m}", "zmat", f"zmat.to_xyz(method={_m!r})", _zmat(_m)))
_add(
    Impl(
        "mp_nerf",
        "peer",
        "mp_nerf build_scaffolds_from_scn_angles + protein_fold, per structure (forward only)",
        _mp_nerf(prebuilt=False),
        cases=("protein", "protein-mix"),
        requires="mp_nerf",
    )
)
_add(
    Impl(
        "mp_nerf-fold",
        "peer",
        "mp_nerf protein_fold on prebuilt scaffolds, per structure (forward only)",
        _mp_nerf(prebuilt=True),
        cases=("protein", "protein-mix"),
        requires="mp_nerf",
    )
)
_add(
    Impl(
        "chemcoord",
        "peer",
        "chemcoord Zmat.get_cartesian (+ get_grad_cartesian Jacobian), per structure, CPU float64",
        _chemcoord(kernel=False),
        cases=("chain", "molecules", "protein"),
        devices=("cpu",),
        exponent={"fwd": 1.0, "fwd+bwd": 2.0},
        estimate=_chemcoord_estimate(False),
        requires="chemcoord",
    )
)
_add(
    Impl(
        "chemcoord-kernel",
        "peer",
        "chemcoord's numba get_X (+ get_grad_X Jacobian), per structure, CPU float64",
        _chemcoord(kernel=True),
        cases=("chain", "molecules", "protein"),
        devices=("cpu",),
        exponent={"fwd": 1.0, "fwd+bwd": 2.0},
        estimate=_chemcoord_estimate(True),
        requires="chemcoord",
    )
)


def select(patterns: list[str] | None) -> list[str]:
    """Implementation names matching any of ``patterns`` (names or globs), in registry order.

    Raises:
        ValueError: a pattern that matches nothing.
    """
    if not patterns:
        return list(IMPLS)
    chosen = set()
    for p in patterns:
        hit = fnmatch.filter(IMPLS, p)
        if not hit:
            raise ValueError(f"--impl {p!r} matches no implementation; choose from {', '.join(IMPLS)}")
        chosen.update(hit)
    return [n for n in IMPLS if n in chosen]
