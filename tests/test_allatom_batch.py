"""ComplexBatch: complexes of different compositions (DNA, protein-DNA, protein-ligand,
with and without hydrogens) in one forest table, one to_xyz; torsions padded with NaN."""

import os

import numpy as np
import pytest
import torch

import zmat
from zmat._align import superpose
from zmat.batch import collate
from zmat.protein import ComplexBatch, from_pdb

pytest.importorskip("biotite")
DATA = os.path.join(os.path.dirname(__file__), "data")
pytestmark = pytest.mark.filterwarnings("ignore:The coordinates are missing")


@pytest.fixture(scope="module")
def complexes():
    return [
        from_pdb(os.path.join(DATA, "1bna.cif")),
        from_pdb(os.path.join(DATA, "3o5r.cif"), ligands=True, hydrogens=True),
        from_pdb(os.path.join(DATA, "5ugo.cif"), ligands=True),
    ]


def test_batch_rebuilds_every_complex_exactly(complexes):
    b = collate(complexes)
    assert isinstance(b, ComplexBatch) and len(b) == 3
    x, mask = b.to_xyz()
    assert x.shape == (3, max(c.n_atoms for c in complexes), 3)
    for k, c in enumerate(complexes):
        assert int(mask[k].sum()) == c.n_atoms
        xk = x[k][mask[k]]
        assert float((superpose(xk, c.xyz) - c.xyz).abs().max()) < 1e-8
        torch.testing.assert_close(b.unbatch(b.to_xyz(padded=False))[k], xk)
    for key, v in b.torsions.items():
        assert v.shape == (3, max(len(c) for c in complexes))
        for k, c in enumerate(complexes):
            torch.testing.assert_close(v[k, : len(c)], c.torsions[key], equal_nan=True)
            assert torch.isnan(v[k, len(c) :]).all()


def test_batch_torsions_and_clash(complexes):
    b = ComplexBatch(complexes)
    t = {"chi1": b.torsions["chi1"] + 0.3, "ligand": [c.ligand_torsions - 0.2 for c in complexes]}
    x = zmat.to_xyz(b.internal_with_torsions(t), b.table)
    for k, (c, xk) in enumerate(zip(complexes, b.unbatch(x), strict=True)):
        want = zmat.to_xyz(
            c.internal_with_torsions({"chi1": t["chi1"][k, : len(c)], "ligand": t["ligand"][k]}), c.table
        )
        torch.testing.assert_close(xk, want, atol=1e-10, rtol=0)
    # per complex, as each alone
    losses = b.clash_loss(x)
    for k, (c, xk) in enumerate(zip(complexes, b.unbatch(x), strict=True)):
        torch.testing.assert_close(losses[k], zmat.clash_loss(xk, c.radii, exclude=c.exclusions()))


def test_complexes_pickle_and_torsion_step_has_no_host_sync(complexes):
    import pickle

    from zmat.testing import DispatchAudit

    c = pickle.loads(pickle.dumps(complexes[1]))
    torch.testing.assert_close(zmat.to_xyz(c.internal, c.table), zmat.to_xyz(complexes[1].internal, c.table))
    b = pickle.loads(pickle.dumps(ComplexBatch(complexes)))
    assert len(b) == 3 and b.table.n_atoms == sum(x.n_atoms for x in complexes)
    # a training step on torsions: write them, build, measure; no op syncs with the host
    chi = c.torsions["chi1"].clone().requires_grad_(True)
    lig = c.ligand_torsions.clone().requires_grad_(True)
    c.internal_with_torsions({"chi1": chi, "ligand": lig})  # warm the cached indices
    with DispatchAudit() as audit:
        x = zmat.to_xyz(c.internal_with_torsions({"chi1": chi, "ligand": lig}), c.table)
        t = c.measure_torsions(x)
        (x.square().sum() + t["chi2"].nan_to_num().sum()).backward()
    assert audit.syncs == [], audit.syncs


def test_batch_equals_the_complexes_built_one_by_one(complexes):
    """The batch's rows, table and positions are its complexes', bit for bit."""
    items = [complexes[2], complexes[0], complexes[1], complexes[0]]
    b = ComplexBatch(items)
    parts = b.atoms.unbatch(b.internal, dim=-2)
    flat = b.to_xyz(padded=False)
    for k, (c, xk) in enumerate(zip(items, b.unbatch(flat), strict=True)):
        assert torch.equal(parts[k], c.internal)
        assert torch.equal(xk, zmat.to_xyz(c.internal, c.table)), k
    at = b.atoms.ptr.tolist()
    for k, c in enumerate(items):
        assert (b.table.refs[at[k] : at[k + 1]] == c.table.refs + (c.table.refs >= 0) * at[k]).all()


def test_batch_kernel_plan_is_its_pieces_plans_offset(complexes):
    """A concatenated table's kernel plan is made from its pieces' plans: the
    same arrays as one planned whole (gathers where used)."""
    from zmat import _analytic, _kernel

    b = ComplexBatch([complexes[1], complexes[0], complexes[2]])
    plans = [c.table.cached(_analytic._kernel_plan, "cpu") for c in b.complexes]
    joined = _kernel.KernelPlan.concatenate(plans)
    whole = zmat.ConstructionTable(b.table.refs)  # planned as one table, no pieces
    direct = _analytic._kernel_plan(whole, torch.device("cpu"))
    for name in ("keep", "trig", "parent", "order"):
        assert torch.equal(getattr(joined, name), getattr(direct, name)), name
    assert torch.equal(joined.gather[joined.keep.bool()], direct.gather[direct.keep.bool()])
    assert b.table.cached(_analytic._kernel_plan, "cpu").n == b.table.n_atoms


def test_concatenated_kernel_plan_equals_the_packed_join(complexes):
    """``KernelPlan.concatenate`` (one shifted copy of each plan) gives the arrays
    of the packed route (``zmat._columns.joined`` then decoded), bit for bit, with
    offset chains of different widths (a water's 1, a complex's 2) and an
    all-atom batch's fwd+bwd the same as the complexes' one by one."""
    from zmat import _analytic, _columns, _kernel

    water = zmat.ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
    tables = [complexes[1].table, water, complexes[0].table, complexes[2].table, water]
    plans = [t.cached(_analytic._kernel_plan, "cpu") for t in tables]
    joined = _kernel.KernelPlan.concatenate(plans)
    ints = _columns.decode(
        _kernel.KernelArrays, _columns.joined(_kernel.KernelArrays, [p._packed for p in plans])
    )
    flags = _columns.joined(_kernel.KernelFlags, [p._flags for p in plans])
    assert np.array_equal(joined._ints, ints) and np.array_equal(joined._flags, flags)
    assert np.array_equal(joined.roots, np.flatnonzero(ints[-2] < 0))
    b = ComplexBatch([complexes[2], complexes[0], complexes[1]])
    leaf = b.internal.clone().requires_grad_(True)
    x = b.to_xyz(leaf, padded=False)
    (x * torch.linspace(-1, 1, 3, dtype=x.dtype)).sum().backward()
    for c, xk, gk in zip(b.complexes, b.unbatch(x), b.atoms.unbatch(leaf.grad, dim=-2), strict=True):
        one = c.internal.clone().requires_grad_(True)
        y = zmat.to_xyz(one, c.table)
        (y * torch.linspace(-1, 1, 3, dtype=y.dtype)).sum().backward()
        assert torch.equal(xk, y) and torch.equal(gk, one.grad)
    plan = b.table.cached(_analytic._kernel_plan, torch.device("cpu"))  # read in place: no copy made
    assert isinstance(plan, _kernel._JoinedPlan) and "_joined" not in plan.__dict__


def test_concatenated_plan_with_offset_chains_of_different_widths(complexes, monkeypatch):
    """Pieces whose offset chains differ in width (a water: 1, a complex: 2):
    the joined plan pads the narrower one; every piece placed as alone, bit for bit."""
    from zmat import _analytic

    monkeypatch.setattr(_analytic, "PIECE_PLAN_ATOMS", 1)  # small pieces: planned from theirs too
    water = zmat.ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
    c = complexes[0]
    assert water.offset_chain.shape[1] < c.table.offset_chain.shape[1]
    table, atoms = zmat.batch.concatenate_tables([water, c.table, water])
    w = torch.tensor([[0.5, 0.7, 0.9], [0.96, 0.0, 0.0], [0.96, 1.8, 0.0]], dtype=torch.float64)
    x = atoms.unbatch(zmat.to_xyz(torch.cat([w, c.internal, w]), table))
    assert torch.equal(x[1], zmat.to_xyz(c.internal, c.table))
    assert torch.equal(x[0], zmat.to_xyz(w, water)) and torch.equal(x[2], x[0])


def test_joined_plan_is_read_in_place_with_the_bits_of_the_copied_plan(complexes, monkeypatch):
    """The kernel reads a concatenated plan's pieces in place (no joined arrays
    written): positions, frames and gradients equal those of the same arrays
    copied into one plan, bit for bit, chunked over threads (runs of trees inside
    pieces) or not (a unit per piece), for 1 and 4 structures."""
    from zmat import _analytic, _kernel

    if not _kernel.serves(torch.device("cpu")):
        pytest.skip("the compiled kernel is off")
    monkeypatch.setattr(_kernel, "CHUNK_ATOMS", 64)  # several runs of trees per piece
    monkeypatch.setattr(_kernel, "PARALLEL_ATOMS", 1)
    w = np.array([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
    water = zmat.ConstructionTable(w)
    box = zmat.ConstructionTable(np.concatenate([np.where(w < 0, w, w + 3 * i) for i in range(60)]))
    tables = [zmat.ConstructionTable(complexes[k].table.refs) for k in (1, 0, 2)]  # planned anew
    tables = [tables[0], water, box, tables[1], tables[2], water]  # (a complex is one tree)
    table, _ = zmat.batch.concatenate_tables(tables)
    joined = _kernel.KernelPlan.concatenate([t.cached(_analytic._kernel_plan, "cpu") for t in tables])
    starts = np.cumsum([0] + [t.n_atoms for t in tables])
    assert np.isin(starts, joined.chunks.numpy()).all() and len(joined.chunks) > len(tables) + 2
    rng = np.random.default_rng(0)

    def step(plan, C, g):  # positions, frames and their gradients
        x, (rot, pos) = _kernel.positions(C, plan, table), _kernel.frames(C.flatten(1).t(), plan, table)
        gf = [torch.from_numpy(rng.normal(size=v.shape)) for v in (rot, pos)]
        return x, rot, pos, *torch.autograd.grad(x, C, g), *torch.autograd.grad((rot, pos), C, gf)

    threads = torch.get_num_threads()
    try:
        for n_threads, b in [(1, 1), (3, 1), (3, 4), (3, 8)]:
            torch.set_num_threads(n_threads)
            C = torch.from_numpy(rng.uniform(0.5, 2.5, (b, joined.n, 3))).requires_grad_(True)
            g = torch.from_numpy(rng.normal(size=(b, joined.n, 3)))
            state = rng.bit_generator.state
            got = step(joined, C, g)
            assert "_joined" not in joined.__dict__, "the kernel read a joined copy"
            rng.bit_generator.state = state
            want = step(_kernel.KernelPlan(joined._ints, joined._flags, joined.vjp), C, g)
            for k, (x, y) in enumerate(zip(got, want, strict=True)):
                assert torch.equal(x, y), (n_threads, b, k)
            del joined.__dict__["_joined"]
    finally:
        torch.set_num_threads(threads)
