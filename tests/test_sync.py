"""Sync audit: the hot paths dispatch no op that waits for the device or sizes
its output from tensor values, and a training step compiles into one graph.

Every call is audited with ``zmat.testing.DispatchAudit`` (a TorchDispatchMode
that records every aten op) on the CPU: an op that would stall a GPU
(``_local_scalar_dense`` behind ``.item()``/``bool()``/``int()``, ``nonzero``,
boolean-mask indexing, ``unique``, ``repeat_interleave`` without
``output_size``, ...) is flagged whatever the device. Plans are built on the
first call (host work, once per table and device): each audit is of the
second call, as in a training loop.
"""

from __future__ import annotations

import pytest
import torch

import zmat
from zmat.clash import candidate_pairs, clash_loss, exclusions_from_table
from zmat.testing import DispatchAudit

N = 40
CHAIN = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]] + [[i - 1, i - 2, i - 3] for i in range(3, N)]


def internal(batch=(2,), seed=0):
    g = torch.Generator().manual_seed(seed)
    c = torch.rand(*batch, N, 3, generator=g, dtype=torch.float64)
    c[..., 0] += 1.0  # bond lengths 1 ... 2
    c[..., 1] = 1.2 + 1.2 * c[..., 1]  # angles 69 ... 137 degrees
    c[..., 2] = 6.0 * c[..., 2] - 3.0
    return c.requires_grad_(True)


def audit_fwd_bwd_double(fn, x):
    """Syncs of the forward, the backward and the double backward of ``fn(x)``."""
    fn(x)  # first call: builds the plans
    with DispatchAudit() as fwd:
        y = fn(x)
    with DispatchAudit() as bwd:
        (g,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with DispatchAudit() as bwd2:
        (h,) = torch.autograd.grad(g.square().sum(), x)
    assert fwd.count > 0 and bwd.count > 0 and bwd2.count > 0 and torch.isfinite(h).all()
    return {"forward": fwd.syncs, "backward": bwd.syncs, "double backward": bwd2.syncs}


@pytest.mark.parametrize("method", zmat.METHODS)
def test_to_xyz_makes_no_sync(method):
    table = zmat.ConstructionTable(CHAIN)
    syncs = audit_fwd_bwd_double(lambda c: zmat.to_xyz(c, table, method=method), internal())
    assert syncs == {"forward": [], "backward": [], "double backward": []}


def test_to_internal_makes_no_sync():
    table = zmat.ConstructionTable(CHAIN)
    xyz = zmat.to_xyz(internal(), table).detach().requires_grad_(True)
    syncs = audit_fwd_bwd_double(lambda x: zmat.to_internal(x, table), xyz)
    assert syncs == {"forward": [], "backward": [], "double backward": []}


def test_the_audit_sees_syncs():
    # The audit is not blind: the ops the hot paths avoid are flagged.
    x = torch.rand(10)
    with DispatchAudit() as a:
        x.sum().item()
        x[x > 0.5]
        torch.unique(x)
        torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 3]))
    assert a.syncs == ["_local_scalar_dense", "index", "_unique2", "repeat_interleave"]


def clash_inputs(batch=(2,)):
    table = zmat.ConstructionTable(CHAIN)
    c = internal(batch)
    with torch.no_grad():
        c[..., 1] = 1.6  # a tight chain that folds onto itself: some clashes
    xyz = zmat.to_xyz(c, table).detach().requires_grad_(True)
    radii = torch.full((N,), 1.7, dtype=torch.float64)
    mask = torch.ones(*batch, N, dtype=torch.bool)
    mask[..., -3:] = False
    return table, xyz, radii, mask


@pytest.mark.parametrize("kind", ["flat_bottom", "softplus", "lennard_jones"])
def test_clash_loss_with_pairs_makes_no_sync(kind):
    table, xyz, radii, mask = clash_inputs()
    exclude = exclusions_from_table(table)
    pairs = candidate_pairs(xyz, radii, exclude=exclude, mask=mask, skin=1.0, kind=kind)
    assert len(pairs) > 0

    def loss(x):
        return clash_loss(x, radii, pairs=pairs, mask=mask, exclude=exclude, kind=kind)

    assert loss(xyz).min() > 0
    syncs = audit_fwd_bwd_double(loss, xyz)
    assert syncs == {"forward": [], "backward": [], "double backward": []}


def test_clash_loss_all_pairs_makes_no_sync():
    table, xyz, radii, mask = clash_inputs()
    exclude = exclusions_from_table(table)
    syncs = audit_fwd_bwd_double(
        lambda x: clash_loss(x, radii, method="all_pairs", mask=mask, exclude=exclude, kind="softplus"), xyz
    )
    assert syncs == {"forward": [], "backward": [], "double backward": []}


def test_neighbour_search_syncs_exactly_twice():
    # Inherent: the number of pairs depends on the data. One sync sizes the
    # candidate rows, one compacts them (or, above the memory budget, one cuts
    # them into chunks, which are then evaluated without compaction).
    _, xyz, radii, mask = clash_inputs()
    with DispatchAudit() as search:
        candidate_pairs(xyz, radii, mask=mask)
    assert search.syncs == ["_local_scalar_dense", "nonzero"]  # size; compaction
    for budget in (None, 200 * 64):  # one chunk; several chunks
        with DispatchAudit() as fwd:
            loss = clash_loss(xyz, radii, mask=mask, method="neighbors", memory_budget=budget)
        with DispatchAudit() as bwd:
            loss.sum().backward()
        # One chunk: size + compaction. Several: size + the chunk boundaries,
        # fetched by .tolist(), a device-to-host copy that dispatches no aten
        # op on the CPU (so the audit cannot see it; counted by hand here).
        want = ["_local_scalar_dense", "nonzero"] if budget is None else ["_local_scalar_dense"]
        assert fwd.syncs == want, budget
        assert bwd.syncs == []


def test_chunked_search_syncs_once_per_chunk():
    from zmat._neighbors import build_cell_list

    _, xyz, radii, _ = clash_inputs()
    x = xyz.detach().reshape(-1, 3)
    group = torch.arange(len(x)) // N
    with DispatchAudit() as build:
        cells = build_cell_list(x, group, 4.0)
    assert build.syncs == []
    with DispatchAudit() as plan:
        chunks = cells.chunks(max_rows=50)
    # the row count, then the boundaries (.tolist(): invisible to the audit on the CPU)
    assert len(chunks) > 3 and plan.syncs == ["_local_scalar_dense"]
    with DispatchAudit() as rows:
        for lo, hi, n_rows in chunks:
            cells.rows(lo, hi, n_rows)
    assert rows.syncs == []


def test_protein_builders_make_no_sync():
    g = torch.Generator().manual_seed(1)
    t = (0.3 * torch.randn(5, 7, generator=g, dtype=torch.float64)).requires_grad_()
    syncs = audit_fwd_bwd_double(lambda x: zmat.protein.to_xyz_from_torsions(x, "MKVWC"), t)
    assert syncs == {"forward": [], "backward": [], "double backward": []}
    batch = zmat.protein.ProteinBatch(["MKV", "ACDEFG"])
    t = torch.zeros(2, 6, 7, dtype=torch.float64, requires_grad=True)
    syncs = audit_fwd_bwd_double(batch.to_xyz, t)
    assert syncs == {"forward": [], "backward": [], "double backward": []}


def test_torsion_space_makes_no_sync():
    rdkit = pytest.importorskip("zmat.rdkit")  # issue 11; rdkit is an optional extra
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles("CCCCOCC(=O)N"))
    AllChem.EmbedMolecule(mol, randomSeed=7)
    ts = rdkit.TorsionSpace.from_mol(mol)
    t = ts.torsions.clone().requires_grad_(True)
    syncs = audit_fwd_bwd_double(ts.to_xyz, t)
    assert syncs == {"forward": [], "backward": [], "double backward": []}


# ----------------------------------------------------------------------------
# a training step compiles into one graph


def test_training_step_compiles_fullgraph():
    # to_xyz + clash_loss(pairs=...) compiled with fullgraph=True (which raises
    # on any graph break); AOTAutograd compiles the matching backward graph,
    # run by .backward(). The pair list is built outside, every few steps.
    table, xyz, radii, mask = clash_inputs()
    c = zmat.to_internal(xyz.detach(), table).requires_grad_(True)
    pairs = candidate_pairs(xyz, radii, exclude=exclusions_from_table(table), mask=mask, skin=1.0)

    def loss(c):
        x = zmat.to_xyz(c, table)
        return clash_loss(x, radii, pairs=pairs, mask=mask, kind="softplus").sum()

    want = loss(c)  # the eager call also builds the table's plan
    (g_want,) = torch.autograd.grad(want, c)
    torch._dynamo.reset()
    got = torch.compile(loss, backend="aot_eager", fullgraph=True)(c)
    got.backward()
    assert want > 0
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(c.grad, g_want, rtol=1e-10, atol=1e-10)
