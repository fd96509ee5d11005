"""zmat.optimize, coords="tric": fragments' translation and rotation coordinates (B, geomeTRIC, a minimum)."""

import math

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.data import covalent_radii
from ase.optimize import BFGS
from scipy.spatial.transform import Rotation
from test_optimize import WATER_DIMER, TorchCalculator, fd_jacobian, rattled

from zmat.optimize import build_primitives, minimize, values, wilson_b
from zmat.optimize.coordinates import KINDS

BOHR = 0.52917721092


def with_argon(name):
    m = rattled(name, 0.03)
    return m + Atoms("Ar", [[4.0, 3.0, 2.0]])  # a one-atom fragment: translations only


@pytest.mark.parametrize(
    "atoms",
    [WATER_DIMER, with_argon("CH4"), with_argon("CO2"), with_argon("C6H6")],
    ids=["water-dimer", "CH4+Ar", "CO2+Ar", "C6H6+Ar"],
)  # CH4 and benzene: symmetric tops (degenerate quaternion eigenvalues); CO2: a linear fragment
def test_tric_wilson_b_matches_finite_differences(atoms):
    prims = build_primitives(atoms.positions, atoms.numbers, coords="tric")
    counts = dict(zip(KINDS, prims.counts, strict=True))
    assert counts["translation"] == 6 and counts["rotation"] == (6 if atoms is WATER_DIMER else 3)
    x = torch.tensor(atoms.positions, dtype=torch.float64)[None].expand(2, -1, -1).contiguous()
    x[1] += 0.05 * torch.randn(x.shape[1:], generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    B = wilson_b(prims, x)
    assert torch.isfinite(B).all()
    torch.testing.assert_close(B, fd_jacobian(prims, x), atol=1e-7, rtol=1e-6)


def test_tric_values_and_b_agree_with_geometric():
    gi = pytest.importorskip("geometric.internal")
    gm = pytest.importorskip("geometric.molecule")
    x0 = WATER_DIMER.positions
    mol = gm.Molecule()
    mol.elem, mol.xyzs = WATER_DIMER.get_chemical_symbols(), [x0.copy()]
    mol.build_topology()
    theirs = gi.PrimitiveInternalCoordinates(mol, connect=False, addcart=False)
    rows = {}  # (first atom of the fragment, component) -> geomeTRIC's coordinate
    for ic in theirs.Internals:
        kind = type(ic).__name__
        if kind[:-1] in ("Translation", "Rotation"):
            rows[(kind[:-1], min(ic.a), "XYZABC".index(kind[-1]) % 3)] = ic
    prims = build_primitives(x0, WATER_DIMER.numbers, coords="tric")
    order = [("Translation", f, c) for f in (0, 3) for c in range(3)]
    order += [("Rotation", f, c) for f in (0, 3) for c in range(3)]
    ours = slice(prims.kind_slice("translation").start, prims.kind_slice("rotation").stop)
    x1 = x0.copy()  # each water moved rigidly: turned (0.5 and 0.8 rad) and shifted
    for atoms, vec, shift in (([0, 1, 2], [-0.2, 0.1, 0.45], 0.0), ([3, 4, 5], [0.3, -0.5, 0.6], 0.3)):
        c = x1[atoms].mean(0)
        x1[atoms] = (x1[atoms] - c) @ Rotation.from_rotvec(vec).as_matrix().T + c + shift
    for x in (x0, x1):
        bohr = x / BOHR
        q = values(prims, torch.tensor(bohr)[None])[0, ours].numpy()
        ref = np.array([rows[k].value(bohr.ravel()) for k in order])
        np.testing.assert_allclose(q, ref, atol=1e-9)
    assert np.abs(ref[6:]).max() > 0.3  # the rotations are large
    B = wilson_b(prims, torch.tensor(x0 / BOHR)[None])[0, ours].numpy()
    ref_b = np.array([rows[k].derivative(x0.ravel() / BOHR).ravel() for k in order])
    np.testing.assert_allclose(B, ref_b, atol=1e-9)


def water_cluster_energy(x):
    """A flexible three-site water model (TIP3P charges and O-O Lennard-Jones, harmonic O-H and H-O-H, a
    short-range repulsion between the molecules' atoms), eV and Angstrom, atoms (O H H) per molecule;
    ``(B, 3n, 3) -> (B,)``."""
    n = x.shape[1] // 3
    w = x.unflatten(1, (n, 3))  # (B, n molecules, O H H, 3)
    u, v = w[:, :, 1] - w[:, :, 0], w[:, :, 2] - w[:, :, 0]
    r1, r2 = u.norm(dim=-1), v.norm(dim=-1)
    cos = (u * v).sum(-1) / (r1 * r2)
    intra = 20.0 * ((r1 - 0.9572) ** 2 + (r2 - 0.9572) ** 2) + 2.0 * (cos - math.cos(1.8242)) ** 2
    i, j = torch.triu_indices(3 * n, 3 * n, 1)
    i, j = i[i // 3 != j // 3], j[i // 3 != j // 3]  # atom pairs of different molecules
    q = x.new_tensor([-0.834, 0.417, 0.417]).repeat(n)
    r = (x[:, i] - x[:, j]).norm(dim=-1)
    inter = 14.3996 * q[i] * q[j] / r + 0.01 * (1.5 / r) ** 12  # repulsion: H stays off O
    oo = r[:, (i % 3 == 0) & (j % 3 == 0)]
    lj = 4 * 0.006596 * ((3.1507 / oo) ** 12 - (3.1507 / oo) ** 6)
    return intra.sum(-1) + inter.sum(-1) + lj.sum(-1)


water_dimer_energy = water_cluster_energy

#: the first three molecules of geomeTRIC's water12.xyz (geometric/data, BSD): a chain of two hydrogen bonds
WATER_TRIMER = Atoms(
    "OHHOHHOHH",
    positions=[
        [0.3, -1.091, -0.633], [-0.439, -0.862, -0.019], [0.174, -2.012, -0.896],
        [2.739, -0.286, 0.486], [3.039, -1.153, 0.877], [2.002, -0.611, -0.056],
        [-1.983, -0.305, 0.796], [-2.337, 0.56, 0.692], [-1.957, -0.476, 1.725],
    ],
)  # fmt: skip


def test_water_trimer_with_linear_hydrogen_bonds_reaches_the_minimum_of_ase_bfgs():
    """Both O-H...O turn linear on the way (linear bends at the donor H): a step then moved atoms 50 A
    (a near-singular direction of B^T B) and the run diverged; the Cartesian cap keeps it in place."""
    ref = WATER_TRIMER.copy()
    ref.calc = TorchCalculator(water_cluster_energy)
    BFGS(ref, logfile=None).run(fmax=1e-3, steps=2000)
    e_ref = float(water_cluster_energy(torch.tensor(ref.positions)[None])[0])
    x = torch.tensor(WATER_TRIMER.positions)
    res = minimize(water_cluster_energy, x, fmax=1e-3, max_steps=150, numbers=WATER_TRIMER.numbers)
    assert bool(res.converged[0])
    assert abs(float(res.energy[0]) - e_ref) < 1e-5


@pytest.mark.parametrize("coords", ["tric", "redundant"])  # redundant: one O-H...O contact, a soft direction
def test_water_dimer_reaches_the_minimum_of_ase_bfgs(coords):
    start = WATER_DIMER.copy()
    start.positions[3:] += [0.3, 0.0, 0.0]  # pulled apart: the fragments must move as wholes
    start.rattle(0.02, seed=3)
    ref = start.copy()
    ref.calc = TorchCalculator(water_dimer_energy)
    BFGS(ref, logfile=None).run(fmax=1e-5, steps=2000)
    x = torch.tensor(start.positions)
    res = minimize(water_dimer_energy, x, fmax=1e-5, max_steps=300, numbers=start.numbers, coords=coords)
    assert bool(res.converged[0])
    e_ref = float(water_dimer_energy(torch.tensor(ref.positions)[None])[0])
    assert abs(float(res.energy[0]) - e_ref) < 1e-8
    d = lambda p: torch.cdist(p, p)  # noqa: E731 - distances: the minimum up to a rigid motion
    torch.testing.assert_close(d(res.xyz[0]), d(torch.tensor(ref.positions)), atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="coords"):
        minimize(water_dimer_energy, x, numbers=start.numbers, coords="delocalised")


def test_model_hessian_hydrogen_bond_follows_lindhs_decay():
    """The O-H...O stretch gets 0.45 exp(alpha (r_ref^2 - r^2)) (Lindh: H-O alpha 0.3949 bohr^-2, r_ref 2.10
    bohr): about 0.015 hartree/bohr^2 at 1.9 A, near its real curvature (Swart's rho gave 0.17)."""
    from zmat.optimize.steps import model_hessian, period

    prims = build_primitives(WATER_TRIMER.positions, WATER_TRIMER.numbers)
    x = torch.tensor(WATER_TRIMER.positions / BOHR)[None]
    radii = torch.tensor(covalent_radii[WATER_TRIMER.numbers] / BOHR)
    h = model_hessian(prims, x, radii, period(WATER_TRIMER.numbers)).diagonal(dim1=1, dim2=2)[0]
    weak = (prims.weak[: len(prims.bond)] > 0).nonzero()[:, 0]
    assert len(weak) == 2  # the two hydrogen bonds
    i, j = prims.bond[weak].T
    r = (x[0, i] - x[0, j]).norm(dim=-1)
    torch.testing.assert_close(h[weak], 0.45 * torch.exp(0.3949 * (2.10**2 - r**2)), rtol=1e-12, atol=0)
    assert h[weak].max() < 0.03


@pytest.mark.parametrize("trust", [None, 3.0])
def test_the_trust_radius_bounds_each_fragments_rms_move_in_angstrom(trust):
    """The trust radius is Cartesian (geomeTRIC's): no fragment's atoms move more than it RMS in a step,
    0.1 A to start, never above 0.3 A however large the radius asked for. In internal coordinates (bohr
    and radians, the radius of before) the soft contact between fragments turned steps into Angstrom-long
    moves (water clusters collided: +16 eV in one step)."""
    from zmat.optimize.optimizer import TRUST_MAX, InternalStepper

    start = WATER_DIMER.copy()
    start.positions[3:] += [0.5, 0.0, 0.0]  # pulled apart: long steps wanted along the one soft contact
    x = torch.tensor(start.positions)[None]
    kw = {} if trust is None else {"trust": trust}
    stepper = InternalStepper(x, start.numbers, **kw)
    bound = 0.1 if trust is None else TRUST_MAX
    for k in range(3):
        e, g = _energy_and_grad(x)
        _, x_new = stepper.step(x, e, g)
        radius = float(stepper.trust[0]) * BOHR  # the radius this step was taken with
        assert radius <= TRUST_MAX + 1e-12 and (k or radius == pytest.approx(bound))
        moved = (x_new - x)[0].norm(dim=-1) ** 2
        rms = max(float(moved[:3].mean().sqrt()), float(moved[3:].mean().sqrt()))
        assert rms < 1.1 * radius  # the linear image is bounded; the back-transformation stays near it
        x = x_new


def _energy_and_grad(x):
    x = x.clone().requires_grad_(True)
    e = water_cluster_energy(x)
    (g,) = torch.autograd.grad(e.sum(), x)
    return e.detach(), g
