"""Tests of zmat.clash: smooth clash losses, exclusions, radii, neighbour search."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zmat.clash import (
    ALPHAFOLD_RADII,
    KINDS,
    alphafold_radii,
    candidate_pairs,
    clash_loss,
    exclusions_from_bonds,
    exclusions_from_table,
    vdw_radii,
)
from zmat.testing import GrainAudit

DATA = Path(__file__).parent / "data"
METHODS = ("all_pairs", "neighbors")
SMOOTH = ("softplus", "soft_count", "lennard_jones")
CUDA = pytest.mark.cuda  # skipped by conftest.py without a GPU


# ----------------------------------------------------------------------------
# an independent brute-force reference (numpy, explicit formulas)


def brute(xyz, radii, kind, *, tolerance=1.5, temperature=0.1, tail=None, cap=10.0, exclude=(), mask=None):
    """Clash loss of one structure, pair by pair from the documented formulas."""
    xyz, radii = np.asarray(xyz, np.float64), np.asarray(radii, np.float64)
    n, t = len(xyz), temperature
    if tail is None:
        tail = 10 * t if kind in ("softplus", "soft_count") else 0.0
    i, j = np.triu_indices(n, 1)
    keep = np.ones(len(i), bool)
    if len(exclude):
        ex = {(min(a, b), max(a, b)) for a, b in np.asarray(exclude).tolist()}
        keep &= np.array([(a, b) not in ex for a, b in zip(i.tolist(), j.tolist(), strict=True)], bool)
    if mask is not None:
        keep &= np.asarray(mask)[i] & np.asarray(mask)[j]
    d = np.linalg.norm(xyz[i] - xyz[j], axis=1)
    c = radii[i] + radii[j] - tolerance
    o = c - d
    with np.errstate(all="ignore"):
        if kind == "flat_bottom":
            p = np.maximum(o, 0)
        elif kind == "flat_bottom_squared":
            p = np.maximum(o, 0) ** 2
        elif kind == "softplus":
            p = np.where(o > -tail, t * np.logaddexp(0, o / t) - t * np.logaddexp(0, -tail / t), 0)
        elif kind == "soft_count":
            sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
            p = np.where(o > -tail, sig(o / t) - sig(-tail / t), 0)
        else:
            e = lambda r: ((c / r) ** 6 - 1) ** 2  # noqa: E731
            de = lambda r: 2 * ((c / r) ** 6 - 1) * (-6 * c**6 / r**7)  # noqa: E731
            dcap = c * (1 + math.sqrt(cap)) ** (-1 / 6)
            p = np.where(d < dcap, cap + de(dcap) * (d - dcap), e(d))
            p = np.where((c > 0) & (d < c), p, 0)
    return float(np.where(keep, p, 0).sum())


def cloud(n, *, density=0.02, seed=0, batch=()):
    """Random points at about `density` atoms per A^3 (lysozyme's, in its box)."""
    g = torch.Generator().manual_seed(seed)
    side = (n / density) ** (1 / 3)
    xyz = torch.rand(*batch, n, 3, generator=g, dtype=torch.float64) * side
    radii = 1.2 + 0.8 * torch.rand(n, generator=g, dtype=torch.float64)
    return xyz, radii


def random_pairs(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    pairs = torch.randint(0, n, (k, 2), generator=g)
    return pairs[pairs[:, 0] != pairs[:, 1]]


@pytest.fixture(scope="module")
def lysozyme():
    """1aki heavy atoms (protein and water), AlphaFold radii, 1-2..1-4 exclusions."""
    import biotite.structure.io.pdb as pdb

    atoms = pdb.PDBFile.read(str(DATA / "1aki.pdb")).get_structure(model=1, include_bonds=True)
    bonds = atoms.bonds.as_array()[:, :2]
    xyz = torch.tensor(atoms.coord, dtype=torch.float64)
    radii = alphafold_radii(list(atoms.element), dtype=torch.float64)
    exclude = exclusions_from_bonds(bonds, len(atoms), depth=3)
    return xyz, radii, exclude


# ----------------------------------------------------------------------------
# agreement with brute force


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", METHODS)
def test_random_cloud_matches_brute_force(kind, method):
    xyz, radii = cloud(150, batch=(2,), seed=1)
    exclude = random_pairs(150, 200, seed=2)
    mask = torch.rand(2, 150, generator=torch.Generator().manual_seed(3)) > 0.1
    got = clash_loss(xyz, radii, kind=kind, method=method, exclude=exclude, mask=mask)
    assert got.shape == (2,)
    for b in range(2):
        want = brute(xyz[b], radii, kind, exclude=exclude, mask=mask[b])
        assert want > 0
        torch.testing.assert_close(got[b].item(), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_protein_matches_brute_force(lysozyme, kind):
    xyz, radii, exclude = lysozyme
    # Noise turns a clean crystal structure into one with clashes.
    noisy = xyz + 0.4 * torch.randn(
        xyz.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    want = brute(noisy, radii, kind, exclude=exclude)
    assert want > 0
    for method in METHODS:
        got = clash_loss(noisy, radii, kind=kind, method=method, exclude=exclude)
        torch.testing.assert_close(got.item(), want, rtol=1e-10, atol=1e-10)


def test_crystal_structure_has_almost_no_clashes(lysozyme):
    xyz, radii, exclude = lysozyme
    loss = clash_loss(xyz, radii, exclude=exclude, method="neighbors")
    assert 0 <= loss.item() < 0.1  # a refined 1.5 A structure
    # Without exclusions, every covalent bond is a "clash".
    assert clash_loss(xyz, radii, method="neighbors").item() > 100


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(0, 300),
    density=st.floats(0.001, 0.2),
    kind=st.sampled_from(KINDS),
    tolerance=st.floats(0.0, 2.0),
    seed=st.integers(0, 2**16),
)
def test_neighbors_equal_all_pairs(n, density, kind, tolerance, seed):
    xyz, radii = cloud(n, density=density, seed=seed, batch=(2,))
    kw = dict(kind=kind, tolerance=tolerance)
    a = clash_loss(xyz, radii, method="all_pairs", **kw)
    b = clash_loss(xyz, radii, method="neighbors", **kw)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_neighbors_equal_all_pairs_2k_atoms():
    xyz, radii = cloud(2000, seed=4)
    xyz.requires_grad_(True)
    a = clash_loss(xyz, radii, kind="softplus", method="all_pairs")
    (ga,) = torch.autograd.grad(a, xyz)
    b = clash_loss(xyz, radii, kind="softplus", method="neighbors")
    (gb,) = torch.autograd.grad(b, xyz)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)


def test_float32_wide_span_finds_every_pair():
    # float32 rounding of cell indices grows with the span: 1e5 A here.
    xyz, radii = cloud(1000, seed=20, density=0.05)
    far = xyz + torch.tensor([1e5, 0.0, 0.0], dtype=torch.float64)
    xyz, radii = torch.cat([xyz, far]).float(), torch.cat([radii, radii]).float()
    a = clash_loss(xyz, radii, kind="soft_count", method="all_pairs")
    b = clash_loss(xyz, radii, kind="soft_count", method="neighbors")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_spread_out_points_beyond_int64_grid():
    # Cells would overflow int64 keys: the search widens cells, still exact.
    xyz = torch.tensor(
        [[0.0, 0, 0], [1.0, 0, 0], [1e15, 1e15, 1e15], [1e15, 1e15, 1e15 + 1]], dtype=torch.float64
    )
    radii = torch.full((4,), 1.7, dtype=torch.float64)
    for method in METHODS:
        torch.testing.assert_close(clash_loss(xyz, radii, method=method).item(), 1.8)


# ----------------------------------------------------------------------------
# bounded memory: chunked search and chunked, recomputed evaluation

TINY_BUDGET = 200 * 64  # 64 candidate rows per chunk: many chunks


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_evaluation_matches_all_pairs(kind):
    xyz, radii = cloud(120, seed=22, density=0.08, batch=(2,))
    xyz.requires_grad_(True)
    exclude = random_pairs(120, 150, seed=23)
    mask = torch.rand(2, 120, generator=torch.Generator().manual_seed(24)) > 0.1
    kw = dict(kind=kind, exclude=exclude, mask=mask)
    want = clash_loss(xyz, radii, method="all_pairs", **kw)
    got = clash_loss(xyz, radii, method="neighbors", memory_budget=TINY_BUDGET, **kw)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    (g_want,) = torch.autograd.grad(want.sum(), xyz)
    (g_got,) = torch.autograd.grad(got.sum(), xyz)
    torch.testing.assert_close(g_got, g_want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", SMOOTH)
def test_chunked_evaluation_gradcheck_and_gradgradcheck(kind):
    xyz, radii = cloud(5, density=0.2, seed=25)
    xyz.requires_grad_(True)
    radii.requires_grad_(True)

    def f(x, r):  # 8 candidate rows a chunk: several chunks, recomputed in backward
        return clash_loss(x, r, kind=kind, method="neighbors", memory_budget=200 * 8, exclude=[[0, 1]])

    assert f(xyz, radii) > 0
    assert torch.autograd.gradcheck(f, (xyz, radii))
    assert torch.autograd.gradgradcheck(lambda x: f(x, radii.detach()), (xyz,))


def test_chunked_search_gives_the_same_pairs():
    xyz, radii = cloud(400, seed=26, density=0.05, batch=(2,))
    exclude = random_pairs(400, 300, seed=27)
    whole = candidate_pairs(xyz, radii, exclude=exclude, skin=0.5)
    chunked = candidate_pairs(xyz, radii, exclude=exclude, skin=0.5, memory_budget=TINY_BUDGET)
    assert len(whole) > 100
    assert sorted(map(tuple, whole.tolist())) == sorted(map(tuple, chunked.tolist()))


def test_collapsed_structure_is_exact_in_chunks():
    # 300 atoms within 0.5 A: every pair clashes; 90,000 candidate rows in 30 chunks.
    g = torch.Generator().manual_seed(29)
    xyz = (torch.rand(300, 3, generator=g, dtype=torch.float64) * 0.5).requires_grad_(True)
    radii = torch.full((300,), 1.7, dtype=torch.float64)
    loss = clash_loss(xyz, radii, method="neighbors", memory_budget=200 * 3000)
    torch.testing.assert_close(loss.item(), brute(xyz.detach(), radii, "flat_bottom"), rtol=1e-10, atol=0)
    (g_chunked,) = torch.autograd.grad(loss, xyz)
    (g_all,) = torch.autograd.grad(clash_loss(xyz, radii, method="all_pairs"), xyz)
    torch.testing.assert_close(g_chunked, g_all, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", METHODS)
def test_gradient_pushes_overlapping_atoms_apart(kind, method):
    xyz = torch.tensor([[0.0, 0, 0], [1.2, 0.1, 0]], dtype=torch.float64, requires_grad=True)
    radii = torch.tensor([1.7, 1.52], dtype=torch.float64)
    loss = clash_loss(xyz, radii, kind=kind, method=method)
    (g,) = torch.autograd.grad(loss, xyz)
    bond = xyz[1] - xyz[0]
    # Descent (-g) moves atom 0 away from atom 1 and atom 1 away from atom 0.
    assert torch.dot(-g[0], bond) < 0 < torch.dot(-g[1], bond)
    torch.testing.assert_close(g.sum(0), torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_descent_removes_clashes(kind):
    xyz, radii = cloud(100, seed=5, density=0.05)
    xyz.requires_grad_(True)
    opt = torch.optim.SGD([xyz], lr=0.05)
    first = clash_loss(xyz, radii, kind=kind).item()
    for _ in range(20):
        opt.zero_grad()
        clash_loss(xyz, radii, kind=kind).backward()
        opt.step()
    assert clash_loss(xyz, radii, kind=kind).item() < 0.5 * first


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", METHODS)
def test_zero_loss_and_gradient_without_overlap(kind, method):
    grid = torch.tensor(list(itertools.product(range(4), repeat=3)), dtype=torch.float64)
    xyz = (3.0 * grid).requires_grad_(True)  # 3 A apart: reach is 1.9 (+1 for tails)
    radii = torch.full((64,), 1.7, dtype=torch.float64)
    loss = clash_loss(xyz, radii, kind=kind, method=method)
    (g,) = torch.autograd.grad(loss, xyz)
    assert loss.item() == 0.0
    assert torch.count_nonzero(g) == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", METHODS)
def test_gradcheck(kind, method):
    xyz, radii = cloud(8, density=0.2, seed=6, batch=(2,))
    xyz.requires_grad_(True)
    radii.requires_grad_(True)
    assert clash_loss(xyz, radii, kind=kind, method=method).min() > 0

    def f(x, r):
        return clash_loss(x, r, kind=kind, method=method, exclude=[[0, 1], [2, 3]])

    assert torch.autograd.gradcheck(f, (xyz, radii))
    # Second derivatives: the differentiable pass is shared by both methods,
    # and the neighbour search per evaluation would only slow this down.
    if kind in SMOOTH and method == "all_pairs":
        assert torch.autograd.gradgradcheck(f, (xyz, radii))


@pytest.mark.parametrize("kind", KINDS)
def test_coincident_atoms_give_finite_gradients(kind):
    xyz = torch.tensor([[0.0, 0, 0], [0.0, 0, 0], [0.5, 0, 0]], requires_grad=True)
    loss = clash_loss(xyz, torch.full((3,), 1.7), kind=kind)
    (g,) = torch.autograd.grad(loss, xyz)
    assert torch.isfinite(loss) and torch.isfinite(g).all()
    assert g[2, 0] < 0  # the third atom is still pushed away


def test_lennard_jones_is_capped_and_continuous():
    d = torch.linspace(0.0, 2.5, 2001, dtype=torch.float64)
    xyz = torch.stack([torch.zeros_like(d), d, torch.zeros_like(d)], -1)
    xyz = torch.stack([torch.zeros_like(xyz), xyz], -2).requires_grad_(True)  # (2001, 2, 3)
    radii = torch.tensor([1.7, 1.7], dtype=torch.float64)  # contact at 1.9
    p = clash_loss(xyz, radii, kind="lennard_jones", cap=10.0)
    (g,) = torch.autograd.grad(p.sum(), xyz)
    assert torch.isfinite(p).all() and torch.isfinite(g).all()
    # Linear below p = cap: p(0) = cap + 12 sqrt(cap) (1 + sqrt(cap)).
    torch.testing.assert_close(p[0].item(), 10 + 12 * math.sqrt(10) * (1 + math.sqrt(10)))
    assert (p[d >= 1.9] == 0).all()
    assert (p[:-1] >= p[1:]).all()  # monotone repulsion
    assert p.diff().abs().max() < 0.2  # no jumps (at the cap or at contact)


# ----------------------------------------------------------------------------
# limits of the smooth kinds


def test_soft_count_tends_to_hard_count():
    xyz, radii = cloud(300, seed=7)
    i, j = torch.triu_indices(300, 300, 1)
    overlap = radii[i] + radii[j] - 1.5 - (xyz[i] - xyz[j]).norm(dim=-1)
    hard = (overlap > 0).sum().item()  # the hard count: zero gradient, useless to train
    assert hard > 10 and overlap.abs().min() > 1e-3  # no pair sits on the boundary
    errors = [
        abs(clash_loss(xyz, radii, kind="soft_count", temperature=t, tail=0.5).item() - hard)
        for t in (1e-1, 1e-2, 1e-3, 1e-4)
    ]
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False))
    assert errors[-1] < 1e-6
    # With the default tail = 10 T the bias is sigmoid(-10) per clashing pair.
    default = clash_loss(xyz, radii, kind="soft_count", temperature=1e-4).item()
    assert abs(default - hard) <= 5e-5 * hard


def test_softplus_tends_to_flat_bottom():
    xyz, radii = cloud(300, seed=8)
    flat = clash_loss(xyz, radii).item()
    for t in (1e-3, 1e-5):
        soft = clash_loss(xyz, radii, kind="softplus", temperature=t).item()
        assert abs(soft - flat) < 300 * t


# ----------------------------------------------------------------------------
# exclusions, masks, batches, pair lists


@pytest.mark.parametrize("method", METHODS)
def test_excluded_pairs_contribute_nothing(method):
    xyz = torch.tensor([[0.0, 0, 0], [1.0, 0, 0], [0.0, 1.2, 0]], dtype=torch.float64, requires_grad=True)
    radii = torch.full((3,), 1.7, dtype=torch.float64)
    full = clash_loss(xyz, radii, method=method)
    torch.testing.assert_close(full.item(), 0.9 + 0.7 + (1.9 - math.hypot(1, 1.2)))
    some = clash_loss(xyz, radii, method=method, exclude=torch.tensor([[1, 0]]))
    torch.testing.assert_close(some.item(), full.item() - 0.9)
    none = clash_loss(xyz, radii, method=method, exclude=[[0, 1], [2, 0], [1, 2]])
    (g,) = torch.autograd.grad(none, xyz)
    assert none.item() == 0 and torch.count_nonzero(g) == 0


@pytest.mark.parametrize("method", METHODS)
def test_construction_table_excludes_bonded_neighbours(method):
    # A tight zigzag chain of 8 atoms (bonds 1.44 A, 1-3 pairs 1.6 A); rows (b, a, d).
    refs = np.array([[-1, -1, -1], [0, -1, -1], [1, 0, -1]] + [[i - 1, i - 2, i - 3] for i in range(3, 8)])
    xyz = torch.tensor([[0.8 * i, 1.2 * (i % 2), 0.0] for i in range(8)], dtype=torch.float64)
    radii = torch.full((8,), 1.7, dtype=torch.float64)
    for depth in range(5):
        ex = exclusions_from_table(refs, depth)
        want = brute(xyz, radii, "flat_bottom", exclude=ex)
        table = SimpleNamespace(refs=refs)  # anything with .refs
        for exclude in (table, refs, torch.from_numpy(refs)):
            got = clash_loss(xyz, radii, exclude=exclude, exclusion_depth=depth, method=method)
            torch.testing.assert_close(got.item(), want)
    loss = [brute(xyz, radii, "flat_bottom", exclude=exclusions_from_table(refs, k)) for k in range(3)]
    assert loss[0] > loss[1] > loss[2] == 0


def test_zmat_construction_table_is_accepted():
    import zmat

    refs = np.array([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1]])
    table = zmat.ConstructionTable(refs)
    assert exclusions_from_table(table, 2).tolist() == exclusions_from_table(refs, 2).tolist()
    xyz = torch.tensor([[0.8 * i, 1.2 * (i % 2), 0.0] for i in range(5)], dtype=torch.float64)
    radii = torch.full((5,), 1.7, dtype=torch.float64)
    torch.testing.assert_close(
        clash_loss(xyz, radii, exclude=table, exclusion_depth=1),
        clash_loss(xyz, radii, exclude=exclusions_from_table(refs, 1)),
    )


def test_mask_equals_removing_atoms_and_ignores_nan_padding():
    xyz, radii = cloud(120, seed=9, batch=(3,))
    mask = torch.ones(3, 120, dtype=torch.bool)
    mask[0, 100:] = False
    mask[2, 50:] = False
    padded = xyz.clone()
    padded[~mask] = float("nan")  # padding holds garbage
    padded.requires_grad_(True)
    for method in METHODS:
        loss = clash_loss(padded, radii, mask=mask, method=method)
        (g,) = torch.autograd.grad(loss.sum(), padded)
        assert torch.isfinite(g).all() and (g[~mask] == 0).all()
        for b in range(3):
            keep = mask[b]
            want = clash_loss(xyz[b, keep], radii[keep], method="all_pairs")
            torch.testing.assert_close(loss[b], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_batch_equals_loop(method):
    xyz, _ = cloud(80, seed=10, batch=(2, 3))
    radii = 1.3 + 0.6 * torch.rand(2, 3, 80, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    exclude = random_pairs(80, 100, seed=12)
    got = clash_loss(xyz, radii, method=method, exclude=exclude, kind="softplus")
    assert got.shape == (2, 3)
    for a, b in itertools.product(range(2), range(3)):
        want = clash_loss(xyz[a, b], radii[a, b], method=method, exclude=exclude, kind="softplus")
        assert want.shape == ()
        torch.testing.assert_close(got[a, b], want, rtol=1e-12, atol=1e-12)


def test_verlet_pair_list_with_skin_is_reusable():
    xyz, radii = cloud(500, seed=13, batch=(2,))
    exclude = random_pairs(500, 300, seed=14)
    mask = torch.ones(2, 500, dtype=torch.bool)
    mask[1, 400:] = False
    kw = dict(kind="soft_count", exclude=exclude, mask=mask)
    pairs = candidate_pairs(xyz, radii, skin=1.0, **kw)
    assert pairs.ndim == 2 and pairs.shape[1] == 2
    step = torch.randn(xyz.shape, generator=torch.Generator().manual_seed(15), dtype=torch.float64)
    moved = xyz + 0.49 * step / step.norm(dim=-1, keepdim=True)  # each atom < skin / 2
    for x in (xyz, moved):
        want = clash_loss(x, radii, method="all_pairs", **kw)
        torch.testing.assert_close(clash_loss(x, radii, pairs=pairs, **kw), want)
    # Without the skin the old list misses pairs that moved into range.
    tight = candidate_pairs(xyz, radii, **kw)
    assert len(tight) < len(pairs)


def test_float32_matches_float64(lysozyme):
    xyz, radii, exclude = lysozyme
    noisy = xyz + 0.4 * torch.randn(
        xyz.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    for kind in KINDS:
        want = clash_loss(noisy, radii, exclude=exclude, kind=kind, method="neighbors")
        got = clash_loss(noisy.float(), radii.float(), exclude=exclude, kind=kind, method="neighbors")
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_auto_method_agrees():
    for n in (30, 1000):  # below and above the CPU switch
        xyz, radii = cloud(n, seed=n)
        torch.testing.assert_close(clash_loss(xyz, radii), clash_loss(xyz, radii, method="all_pairs"))


def test_degenerate_sizes():
    for n in (0, 1):
        for method in METHODS:
            out = clash_loss(torch.zeros(2, n, 3), torch.ones(n), method=method)
            assert out.shape == (2,) and (out == 0).all()


# ----------------------------------------------------------------------------
# exclusions from bonds


def graph_distance(bonds, n):
    d = np.full((n, n), np.inf)
    np.fill_diagonal(d, 0)
    for a, b in bonds:
        d[a, b] = d[b, a] = 1
    for k in range(n):  # Floyd-Warshall
        d = np.minimum(d, d[:, k, None] + d[None, k, :])
    return d


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 25), data=st.data(), depth=st.integers(0, 5))
def test_exclusions_from_bonds_is_graph_distance(n, data, depth):
    bonds = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n))
    bonds = [(a, b) for a, b in bonds if a != b]
    got = exclusions_from_bonds(bonds, n, depth)
    d = graph_distance(bonds, n)
    i, j = np.nonzero(np.triu(d <= depth, 1))
    assert got.tolist() == np.stack([i, j], 1).tolist()


def test_exclusions_in_rings():
    benzene = [(k, (k + 1) % 6) for k in range(6)]
    assert len(exclusions_from_bonds(benzene, 6, depth=3)) == 15  # every pair
    para = {(0, 3), (1, 4), (2, 5)}
    got = {tuple(p) for p in exclusions_from_bonds(benzene, 6, depth=2).tolist()}
    assert len(got) == 12 and not got & para
    # A table sees a ring as a chain until the closure is added back.
    refs = np.array([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [4, 3, 2]])
    assert (0, 5) not in {tuple(p) for p in exclusions_from_table(refs, 2).tolist()}
    closed = exclusions_from_table(refs, 2, extra_bonds=[(5, 0)])
    assert {tuple(p) for p in closed.tolist()} == got


# ----------------------------------------------------------------------------
# radii


def test_radii():
    assert vdw_radii(["H", "C", "N", "O", "S"], dtype=torch.float64).tolist() == [1.2, 1.7, 1.55, 1.52, 1.8]
    assert vdw_radii(["Fe", "X"], fallback=2.3).tolist() == [pytest.approx(2.3), 0.0]
    assert alphafold_radii("CNOS", dtype=torch.float64).tolist() == [1.7, 1.55, 1.52, 1.8]
    assert alphafold_radii(["c", "Se"], default=1.9).tolist() == pytest.approx([1.7, 1.9])
    assert ALPHAFOLD_RADII == {"C": 1.7, "N": 1.55, "O": 1.52, "S": 1.8}
    with pytest.raises(ValueError, match="'Se' at index 1"):
        alphafold_radii(["C", "Se"])
    with pytest.raises(ValueError, match="'Xx'"):
        vdw_radii(["Xx"])


# ----------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(radii=torch.ones(5)), ValueError, r"radii of shape \(5,\)"),
        (dict(radii=torch.ones(3, 4)), ValueError, r"radii of shape \(3, 4\)"),
        (dict(xyz=torch.zeros(2, 4, 2)), ValueError, r"\(\.\.\., N, 3\), got \(2, 4, 2\)"),
        (dict(xyz=torch.zeros(2, 4, 3, dtype=torch.long)), TypeError, "float tensor"),
        (dict(mask=torch.ones(5, dtype=torch.bool)), ValueError, r"mask of shape \(5,\)"),
        (dict(mask=torch.ones(4)), TypeError, "bool"),
        (dict(kind="hard"), ValueError, "unknown kind 'hard'"),
        (dict(method="kd_tree"), ValueError, "unknown method 'kd_tree'"),
        (dict(tolerance=-0.1), ValueError, "tolerance must be >= 0"),
        (dict(temperature=0.0), ValueError, "temperature must be > 0"),
        (dict(tail=-1.0), ValueError, "tail must be"),
        (dict(cap=0.0), ValueError, "cap must be > 0"),
        (dict(exclude=[[0, 4]]), ValueError, r"out of range \[0, 4\)"),
        (dict(exclude=torch.zeros(3, 4, dtype=torch.long)), ValueError, r"got shape \(3, 4\)"),
        (dict(exclude=torch.zeros(3, 2)), TypeError, "integers"),
        (dict(exclude=np.zeros((5, 3), int)), ValueError, "table has 5 rows"),
        (dict(pairs=torch.zeros(3)), ValueError, r"\(P, 2\)"),
        (dict(method="neighbors", memory_budget=0), ValueError, "memory_budget must be > 0"),
    ],
)
def test_errors(kwargs, error, match):
    args = dict(xyz=torch.zeros(2, 4, 3), radii=torch.ones(4)) | kwargs
    with pytest.raises(error, match=match):
        clash_loss(args.pop("xyz"), args.pop("radii"), **args)


def test_exclusion_helper_errors():
    with pytest.raises(ValueError, match=r"shape \(E, 2\)"):
        exclusions_from_bonds([[0, 1, 2]], 3)
    with pytest.raises(ValueError, match="out of range"):
        exclusions_from_bonds([[0, 3]], 3)
    with pytest.raises(ValueError, match="depth"):
        exclusions_from_bonds([[0, 1]], 3, depth=-1)
    with pytest.raises(ValueError, match=r"shape \(N, 3\)"):
        exclusions_from_table(np.zeros((4, 2), int))
    with pytest.raises(ValueError, match="skin"):
        candidate_pairs(torch.zeros(3, 3), torch.ones(3), skin=-1.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_policy_propagates_per_structure(kind, bad):
    # One NaN policy with to_xyz: a non-finite atom makes its structure's loss
    # NaN (no error, no sync), on every path; other structures are unaffected.
    xyz, radii = cloud(60, seed=21, density=0.05, batch=(3,))
    xyz[1, 7, 2] = bad
    want = [brute(xyz[b], radii, kind) for b in (0, 2)]
    pairs = candidate_pairs(xyz, radii, kind=kind)
    assert not (pairs == 60 + 7).any()  # the bad atom is left out of the search
    for extra in (dict(method="all_pairs"), dict(method="neighbors"), dict(pairs=pairs)):
        got = clash_loss(xyz, radii, kind=kind, **extra)
        assert torch.isnan(got[1]), extra
        torch.testing.assert_close(got[[0, 2]].tolist(), want, rtol=1e-10, atol=1e-10)
    masked = torch.ones(3, 60, dtype=torch.bool)
    masked[1, 7] = False  # a masked atom may hold anything
    assert torch.isfinite(clash_loss(xyz, radii, kind=kind, mask=masked, method="neighbors")).all()


def test_given_pairs_self_pairs_count_zero_duplicates_twice_and_bad_indices_raise():
    xyz, radii = cloud(10, seed=30, density=0.5)
    pairs = candidate_pairs(xyz, radii)
    want = clash_loss(xyz, radii, pairs=pairs)
    assert want > 0
    selfish = torch.cat([pairs, torch.tensor([[3, 3], [7, 7]])])
    torch.testing.assert_close(clash_loss(xyz, radii, pairs=selfish), want, rtol=0, atol=0)
    twice = torch.cat([pairs, pairs[:1]])  # trusted, documented: a repeated pair counts twice
    once = clash_loss(xyz, radii, pairs=pairs[:1])
    torch.testing.assert_close(clash_loss(xyz, radii, pairs=twice), want + once)
    for bad in ([[-1, 0]], [[0, 10]]):
        with pytest.raises(ValueError, match=r"pairs row 0 .* out of range \[0, 10\)"):
            clash_loss(xyz, radii, pairs=torch.tensor(bad))
    with pytest.raises(TypeError, match="pairs must hold integers"):
        clash_loss(xyz, radii, pairs=pairs.double())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_radius_gives_nan_on_every_path(bad):
    xyz, radii = cloud(60, seed=31, density=0.05, batch=(3,))
    radii = radii.expand(3, 60).clone()
    radii[1, 7] = bad
    want = [clash_loss(xyz[b], radii[b], method="all_pairs") for b in (0, 2)]
    pairs = candidate_pairs(xyz, radii)
    for extra in (dict(method="all_pairs"), dict(method="neighbors"), dict(pairs=pairs)):
        got = clash_loss(xyz, radii, **extra)
        assert torch.isnan(got[1]), extra
        torch.testing.assert_close(got[[0, 2]], torch.stack(want))
    masked = torch.ones(3, 60, dtype=torch.bool)
    masked[1, 7] = False  # a masked atom's radius may hold anything
    for extra in (dict(method="all_pairs"), dict(method="neighbors"), dict(pairs=pairs)):
        assert torch.isfinite(clash_loss(xyz, radii, mask=masked, **extra)).all(), extra


@pytest.mark.parametrize("method", METHODS)
def test_float32_sum_is_exact_to_its_rounding(method):
    # 2000 coincident atoms: 2M equal penalties; a float32 running sum drifted by +1.8%
    n = 2000
    p = float(torch.tensor(1.7) + torch.tensor(1.7) - 1.5)  # one pair's float32 penalty
    got = clash_loss(torch.zeros(n, 3), torch.full((n,), 1.7), method=method)
    assert got.dtype == torch.float32
    assert abs(float(got) / (p * n * (n - 1) / 2) - 1) < 1.2e-7  # float32 rounding of the sum


def test_radii_none_or_not_numbers_is_a_type_error():
    with pytest.raises(TypeError, match="radii is required"):
        clash_loss(torch.rand(5, 3), None)
    with pytest.raises(TypeError, match="radii must be numbers"):
        clash_loss(torch.rand(5, 3), ["C"] * 5)


def test_pair_lists_are_bounded_by_the_memory_budget():
    # 300 coincident atoms: 44,850 pairs (718 kB as a list); the budget is 160 kB
    xyz, radii = torch.zeros(300, 3), torch.full((300,), 1.7)
    with pytest.raises(ValueError, match="pair list would exceed memory_budget"):
        candidate_pairs(xyz, radii, memory_budget=160_000)
    assert len(candidate_pairs(xyz, radii, memory_budget=800_000)) == 300 * 299 // 2
    got = clash_loss(xyz, radii, method="neighbors", memory_budget=160_000)  # chunked instead
    torch.testing.assert_close(got, clash_loss(xyz, radii, method="all_pairs"))
    import zmat.protein as zp

    batch = zp.ProteinBatch(["MKVLAAG"])
    with pytest.raises(ValueError, match="pair list would exceed memory_budget"):
        batch.clash_pairs(torch.zeros(1, batch.N_max, 3), memory_budget=5_000)


def test_given_pairs_on_the_cpu_open_no_parallel_region():
    # clash_loss(pairs=) with two threads: every op below the grain, forward and backward
    # (the old path ran ~70 ops over the 65k pairs or the 45k coordinates)
    import zmat.protein as zp

    batch = zp.ProteinBatch(["MKVLAAGIVGHWEDKLPRSTQNMFAAGKLEV" * 4] * 16)  # 16 x 124 residues
    tors = torch.rand(len(batch), batch.L_max, 7, generator=torch.Generator().manual_seed(5)) * 6 - 3
    with torch.no_grad():
        xyz = batch.to_xyz(tors)
    pairs = batch.clash_pairs(xyz)
    radii, mask = batch.radii.to(xyz), batch.atom_mask
    assert len(pairs) > GrainAudit.GRAIN and xyz.numel() > GrainAudit.GRAIN
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = xyz.clone().requires_grad_(True)
        with GrainAudit() as big:
            loss = clash_loss(x, radii, pairs=pairs, mask=mask)
            (g,) = torch.autograd.grad(loss.sum(), x)
    finally:
        torch.set_num_threads(threads)
    assert big.ops == [], sorted(set(big.ops))
    torch.set_num_threads(1)  # the plain path: the same values and gradient
    try:
        x1 = xyz.clone().requires_grad_(True)
        want = clash_loss(x1, radii, pairs=pairs, mask=mask)
        (g1,) = torch.autograd.grad(want.sum(), x1)
    finally:
        torch.set_num_threads(threads)
    assert (want > 0).all()
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g, g1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_serial_path_gradcheck_and_gradgradcheck(kind):
    xyz, radii = cloud(12, seed=80, density=0.2, batch=(2,))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 10:] = False
    exclude = random_pairs(12, 8, seed=81)
    pairs = candidate_pairs(xyz, radii, exclude=exclude, mask=mask, kind=kind, skin=1.0)
    r = radii.clone().requires_grad_(True)
    f = lambda x, r: clash_loss(x, r, pairs=pairs, kind=kind, mask=mask, exclude=exclude)  # noqa: E731
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = clash_loss(xyz, radii, method="all_pairs", kind=kind, mask=mask, exclude=exclude)
        assert (want > 0).all()
        torch.testing.assert_close(f(xyz, radii), want, rtol=1e-12, atol=1e-12)
        x = xyz.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(f, (x, r))
        assert torch.autograd.gradgradcheck(f, (x, r))
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------
# ragged batches (ptr / batch)


def ragged_case(sizes=(7, 30, 1, 0, 45), seed=40):
    """Structures of different sizes back to back, per-structure exclusions and mask."""
    g = torch.Generator().manual_seed(seed)
    parts = [cloud(n, seed=seed + k, density=0.08) for k, n in enumerate(sizes)]
    xyz = torch.cat([x for x, _ in parts])
    radii = torch.cat([r for _, r in parts])
    excl = [random_pairs(n, 2 * n, seed + k) if n > 1 else torch.zeros(0, 2, dtype=torch.long)
            for k, n in enumerate(sizes)]  # fmt: skip
    mask = torch.rand(len(xyz), generator=g) > 0.1
    ptr = torch.tensor([0, *np.cumsum(sizes)])
    return xyz, radii, excl, mask, ptr


@pytest.mark.parametrize("kind", ["flat_bottom", "softplus", "lennard_jones"])
def test_ragged_batch_equals_the_loop_over_structures(kind):
    xyz, radii, excl, mask, ptr = ragged_case()
    kw = dict(kind=kind, tolerance=0.5)

    def loop(x):
        return torch.stack([
            clash_loss(x[a:b], radii[a:b], exclude=e, mask=mask[a:b], method="all_pairs", **kw)
            for a, b, e in zip(ptr[:-1].tolist(), ptr[1:].tolist(), excl, strict=True)
        ])  # fmt: skip

    want = loop(xyz)
    assert (want[[0, 1, 4]] > 0).all()
    flat_excl = torch.cat([e + a for e, a in zip(excl, ptr[:-1].tolist(), strict=True)])
    pairs = candidate_pairs(xyz, radii, exclude=excl, mask=mask, ptr=ptr, **kw)
    batch = torch.repeat_interleave(torch.arange(5), ptr.diff())
    for extra in (
        dict(method="all_pairs", ptr=ptr),
        dict(method="neighbors", ptr=ptr),
        dict(method="neighbors", memory_budget=TINY_BUDGET, ptr=ptr),
        dict(pairs=pairs, ptr=ptr),
        dict(method="neighbors", batch=batch),  # host batch alone
        dict(method="all_pairs", ptr=ptr.numpy(), batch=batch),
    ):
        got = clash_loss(xyz, radii, exclude=excl, mask=mask, **kw, **extra)
        assert got.shape == (5,)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=str(extra))
    flat = clash_loss(xyz, radii, exclude=flat_excl, mask=mask, ptr=ptr, **kw)  # flat pairs work too
    torch.testing.assert_close(flat, want, rtol=1e-12, atol=1e-12)
    x = xyz.clone().requires_grad_(True)
    (g_want,) = torch.autograd.grad(loop(x).sum(), x)
    (g_got,) = torch.autograd.grad(
        clash_loss(x, radii, exclude=excl, mask=mask, pairs=pairs, ptr=ptr, **kw).sum(), x
    )
    torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)


def test_ragged_leading_dims_and_gradcheck():
    from zmat.batch import Ragged

    xyz, radii, excl, _, ptr = ragged_case(sizes=(5, 8), seed=50)
    xyz = torch.stack([xyz, xyz.flip(0)])  # two samples of the batch
    r = Ragged([5, 8])
    got = clash_loss(xyz, radii, exclude=excl, ptr=r, method="all_pairs")
    assert got.shape == (2, 2)
    for s in range(2):
        for b, (a, c) in enumerate(((0, 5), (5, 13))):
            want = clash_loss(xyz[s, a:c], radii[a:c], exclude=excl[b], method="all_pairs")
            torch.testing.assert_close(got[s, b], want, rtol=1e-12, atol=1e-12)
    x = xyz[0].clone().requires_grad_(True)
    f = lambda x: clash_loss(x, radii, exclude=excl, ptr=ptr, kind="softplus", method="neighbors")  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))


def test_padded_batch_takes_per_structure_exclusions():
    xyz, radii = cloud(40, seed=60, density=0.08, batch=(3,))
    excl = [random_pairs(40, 60, seed=61 + b) for b in range(3)]
    got = clash_loss(xyz, radii, exclude=excl, method="neighbors")
    for b in range(3):
        torch.testing.assert_close(got[b], clash_loss(xyz[b], radii, exclude=excl[b]), rtol=1e-12, atol=1e-12)
    pairs = candidate_pairs(xyz, radii, exclude=excl)
    torch.testing.assert_close(clash_loss(xyz, radii, exclude=excl, pairs=pairs), got, rtol=1e-12, atol=1e-12)


def test_ragged_with_pairs_makes_no_sync():
    from zmat.testing import DispatchAudit

    xyz, radii, excl, mask, ptr = ragged_case()
    pairs = candidate_pairs(xyz, radii, exclude=excl, mask=mask, ptr=ptr, skin=1.0)
    x = xyz.clone().requires_grad_(True)
    clash_loss(x, radii, exclude=excl, mask=mask, pairs=pairs, ptr=ptr)
    with DispatchAudit() as audit:
        clash_loss(x, radii, exclude=excl, mask=mask, pairs=pairs, ptr=ptr).sum().backward()
    assert audit.syncs == []


def test_ragged_errors():
    xyz, radii, excl, _, ptr = ragged_case(sizes=(5, 8), seed=70)
    with pytest.raises(ValueError, match="ptr must rise from 0 to N = 13"):
        clash_loss(xyz, radii, ptr=[0, 5, 12])
    with pytest.raises(TypeError, match="ptr must hold integers"):
        clash_loss(xyz, radii, ptr=ptr.double())
    with pytest.raises(ValueError, match="batch must have shape"):
        clash_loss(xyz, radii, batch=torch.zeros(12, dtype=torch.long))
    with pytest.raises(ValueError, match="exclude has 3 entries"):
        clash_loss(xyz, radii, ptr=ptr, exclude=[*excl, excl[0]])
    with pytest.raises(ValueError, match=r"exclude\[0\] index out of range \[0, 5\)"):
        clash_loss(xyz, radii, ptr=ptr, exclude=[excl[1], excl[1]])
    with pytest.raises(ValueError, match="holds 1 structures"):
        clash_loss(xyz, radii, exclude=excl)  # padded (N, 3): one structure


# ----------------------------------------------------------------------------
# CUDA (skipped without a GPU)


@CUDA
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_matches_cpu(kind):
    xyz, radii = cloud(1500, seed=16, batch=(2,))
    exclude = random_pairs(1500, 1000, seed=17)
    want = clash_loss(xyz, radii, kind=kind, exclude=exclude, method="all_pairs")
    for method in METHODS:
        got = clash_loss(xyz.cuda(), radii.cuda(), kind=kind, exclude=exclude.cuda(), method=method)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)


@CUDA
def test_cuda_chunked_and_collapsed_match_cpu():
    g = torch.Generator().manual_seed(30)
    xyz = (torch.rand(2, 400, 3, generator=g, dtype=torch.float64) * 0.5).requires_grad_(True)
    radii = torch.full((400,), 1.7, dtype=torch.float64)
    want = clash_loss(xyz, radii, kind="softplus", method="all_pairs")
    (g_want,) = torch.autograd.grad(want.sum(), xyz)
    x = xyz.detach().cuda().requires_grad_(True)
    got = clash_loss(x, radii.cuda(), kind="softplus", method="neighbors", memory_budget=TINY_BUDGET * 100)
    (g_got,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(g_got.cpu(), g_want, rtol=1e-10, atol=1e-8)


@CUDA
def test_cuda_differentiable_part_does_not_sync():
    xyz, radii = cloud(3000, seed=18, batch=(2,))
    xyz, radii = xyz.cuda().requires_grad_(True), radii.cuda()
    exclude = random_pairs(3000, 1000, seed=19).cuda()
    mask = torch.ones(2, 3000, dtype=torch.bool, device="cuda")
    kw = dict(kind="softplus", exclude=exclude, mask=mask)
    pairs = candidate_pairs(xyz, radii, skin=0.5, **kw)  # this part may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for extra in (dict(pairs=pairs), dict(method="all_pairs")):
            clash_loss(xyz, radii, **kw, **extra).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ----------------------------------------------------------------------------
# the benchmark never rots


def test_benchmark_smoke(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(DATA.parent.parent))  # the repository root
    from benchmarks.clash import main

    rows = main(["--sizes", "300", "--repeats", "1", "--in-process", "--out", str(tmp_path)])
    assert {r["method"] for r in rows} == {"all_pairs", "neighbors"}
    assert (tmp_path / "clash.json").exists()
    assert rows[0]["loss"] == pytest.approx(rows[1]["loss"], rel=1e-4)


def test_ragged_benchmark_smoke(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(DATA.parent.parent))  # the repository root
    from benchmarks.clash import main

    rows = main(
        ["--ragged", "--molecules", "4", "--repeats", "1", "--dtype", "float64", "--out", str(tmp_path)]
    )
    assert len(rows) == 2 and all(r["max_abs_diff"] < 1e-12 and r["one_call_ms"] > 0 for r in rows)
    assert (tmp_path / "clash_ragged.json").exists()


FIRST_CALLS = """
import sys
import torch, zmat
table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1]]
xyz = zmat.to_xyz(torch.rand(5, 3, dtype=torch.float64) + 1, table)
zmat.clash_loss(xyz, torch.ones(5, dtype=torch.float64), exclude=table)
p = zmat.protein.from_pdb(sys.argv[1])
zmat.clash_loss(p.xyz, p.radii, exclude=p.exclusions())
pos, mask = p.to_atom37()
zmat.protein.structural_violations(pos, p.aatype, mask)
print("sympy" in sys.modules)
"""


def test_first_calls_import_no_sympy():
    """torch imports sympy (~1 s) behind some shape helpers (``torch.broadcast_shapes``: symbolic
    shapes); the first ``clash_loss`` and the protein calls beside it must not reach them (issue 32)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", FIRST_CALLS, str(Path(__file__).parent / "data" / "1l2y.pdb")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "False"
