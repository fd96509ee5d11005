"""The analytic method: its custom Function against its pure-autograd twin,
forward mode, torch.func transforms, higher derivatives, torch.compile."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import chain_table, internal_coordinates, random_internal, tables

import zmat
from zmat._analytic import RigidForest, forest_plan


def analytic(c, rows):
    return zmat.to_xyz(c, rows, method="analytic")


def twin(c, rows):
    return zmat.to_xyz(c, rows, method="prefix")


BRANCHED = [
    [-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [2, 1, 3], [3, 2, 1],
    [3, 2, 5], [5, 3, 2], [1, 0, 2], [8, 1, 0], [9, 8, 1], [4, 2, 1],
]  # fmt: skip


@settings(max_examples=20)
@given(rows=tables(min_atoms=2, max_atoms=12), data=st.data())
def test_twin_values_gradients_and_second_derivatives(rows, data):
    c = data.draw(internal_coordinates(len(rows), batch=(2,))).requires_grad_()
    g = torch.randn(2, len(rows), 3, dtype=torch.float64)
    v = torch.randn_like(c)
    out = []
    for f in (analytic, twin):
        x = f(c, rows)
        (grad,) = torch.autograd.grad((x * g).sum(), c, create_graph=True)
        (hvp,) = torch.autograd.grad((grad * v).sum(), c)
        out.append((x, grad, hvp))
    for a, b in zip(*out, strict=True):
        assert torch.allclose(a, b, atol=1e-10, rtol=1e-9)


@settings(max_examples=15)
@given(rows=tables(min_atoms=2, max_atoms=10), data=st.data())
def test_adjoint_identity(rows, data):
    """<vjp(g), v> = <g, jvp(v)> for the custom Function itself."""
    c = data.draw(internal_coordinates(len(rows), batch=(3,)))
    table = zmat.ConstructionTable(rows)
    plan = forest_plan(table, c.device)
    flat = c.reshape(-1, 3 * len(rows)).t()  # the Function's input layout: (3 N, B)
    v = torch.randn_like(flat)
    out, jvp = torch.func.jvp(lambda x: RigidForest.apply(x, plan), (flat,), (v,))
    g = tuple(torch.randn_like(o) for o in out)  # (rotations, positions)
    _, vjp_fn = torch.func.vjp(lambda x: RigidForest.apply(x, plan), flat)
    (vjp,) = vjp_fn(g)
    rhs = sum((gi * ji).sum() for gi, ji in zip(g, jvp, strict=True))
    assert torch.allclose((vjp * v).sum(), rhs, rtol=1e-10)


@pytest.mark.parametrize("rows", [chain_table(9), BRANCHED], ids=["chain", "branched"])
def test_jvp_matches_finite_differences_and_twin(rows):
    c = random_internal(len(rows), seed=4)
    v = torch.randn_like(c)
    _, tangent = torch.func.jvp(lambda x: analytic(x, rows), (c,), (v,))
    _, tangent_twin = torch.func.jvp(lambda x: twin(x, rows), (c,), (v,))
    eps = 1e-6
    fd = (analytic(c + eps * v, rows) - analytic(c - eps * v, rows)) / (2 * eps)
    assert torch.allclose(tangent, tangent_twin, atol=1e-10)
    assert torch.allclose(tangent, fd, atol=1e-7)


def test_torch_func_transforms():
    rows = BRANCHED
    n = len(rows)
    c = random_internal(n, batch=(4,), seed=8)

    # vmap over a batch equals the batched call
    assert torch.allclose(torch.func.vmap(lambda x: analytic(x, rows))(c), analytic(c, rows), atol=1e-12)

    def energy(x, f):
        xyz = f(x, rows)
        return (xyz[..., None, :, :] - xyz[..., :, None, :]).square().sum(-1).add(1).log().sum()

    g = torch.func.grad(lambda x: energy(x, analytic))(c[0])
    g_twin = torch.func.grad(lambda x: energy(x, twin))(c[0])
    assert torch.allclose(g, g_twin, atol=1e-10)

    jr = torch.func.jacrev(lambda x: analytic(x, rows))(c[0])
    jf = torch.func.jacfwd(lambda x: analytic(x, rows))(c[0])
    jt = torch.func.jacrev(lambda x: twin(x, rows))(c[0])
    assert jr.shape == (n, 3, n, 3)
    assert torch.allclose(jr, jt, atol=1e-10) and torch.allclose(jf, jt, atol=1e-10)

    # Hessian by forward-over-reverse, and vmap of grad over the batch
    h = torch.func.jacfwd(torch.func.grad(lambda x: energy(x, analytic)))(c[0])
    h_twin = torch.func.hessian(lambda x: energy(x, twin))(c[0])
    assert torch.allclose(h, h_twin, atol=1e-8)
    gb = torch.func.vmap(torch.func.grad(lambda x: energy(x, analytic)))(c)
    assert torch.allclose(gb[0], g, atol=1e-10)


def test_third_derivative():
    rows = chain_table(6)
    c = random_internal(6, seed=1).requires_grad_()

    def f(x):
        return analytic(x, rows)[-1].sum()

    assert torch.autograd.gradgradcheck(lambda x: torch.autograd.grad(f(x), x, create_graph=True)[0], c)


def test_wgan_gp_gradient_penalty_through_the_transform():
    """Critic on coordinates built by to_xyz; the penalty needs create_graph."""
    torch.manual_seed(0)
    rows = chain_table(12)
    critic = torch.nn.Sequential(torch.nn.Linear(36, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()
    results = {}
    for method in zmat.METHODS:
        critic.zero_grad()
        c = random_internal(12, batch=(5,), seed=2).requires_grad_()
        score = critic(zmat.to_xyz(c, rows, method=method).flatten(-2))
        (grad,) = torch.autograd.grad(score.sum(), c, create_graph=True)
        penalty = ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()
        penalty.backward()
        results[method] = (c.grad.clone(), critic[0].weight.grad.clone())
    ref = results["reference"]
    for method, (gc, gw) in results.items():
        assert torch.isfinite(gc).all() and gw.abs().sum() > 0
        assert torch.allclose(gc, ref[0], atol=1e-9) and torch.allclose(gw, ref[1], atol=1e-9), method


def test_backward_saves_linear_memory():
    """The Function saves only its output frames: 12 numbers per atom."""
    rows = chain_table(2000)
    c = random_internal(2000, seed=0).requires_grad_()
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        analytic(c, rows)
    total = sum(saved)
    assert total < 40 * 2000, total  # O(N), no per-round intermediates
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        twin(c, rows)
    assert sum(saved) > 2 * total  # the twin keeps the composition graph


def test_torch_compile_fullgraph():
    # fullgraph=True: no graph break, hence no host sync, in the hot path
    rows = zmat.ConstructionTable(BRANCHED)  # built (validated) outside the compiled code
    c = random_internal(len(BRANCHED), batch=(2,), seed=3).requires_grad_()

    def loss(x):
        return zmat.to_xyz(x, rows, method="analytic").square().sum()

    loss(c)  # the first eager call builds the table's index plan for this device
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    value = compiled(c)
    (g,) = torch.autograd.grad(value, c)
    (g_ref,) = torch.autograd.grad(loss(c), c)
    assert torch.allclose(value, loss(c)) and torch.allclose(g, g_ref, atol=1e-10)


@pytest.mark.parametrize("eager_first", [False, True])
def test_compile_plans_while_tracing(eager_first):
    # The eager CPU kernel plans only itself; the torch path's plans are then
    # built while Dynamo traces (for real, constants of the graph), with no
    # graph break, whether or not an eager call came first.
    rows = zmat.ConstructionTable(BRANCHED)
    c = random_internal(len(BRANCHED), batch=(3,), seed=4).requires_grad_()

    def loss(x):
        return zmat.to_internal(zmat.to_xyz(x, rows, method="analytic"), rows).square().sum()

    want = loss(c)
    (g_want,) = torch.autograd.grad(want, c)
    fresh = zmat.ConstructionTable(BRANCHED)
    if eager_first:
        zmat.to_xyz(c, fresh, method="analytic")
    torch._dynamo.reset()

    def fresh_loss(x):
        return zmat.to_internal(zmat.to_xyz(x, fresh, method="analytic"), fresh).square().sum()

    got = torch.compile(fresh_loss, backend="aot_eager", fullgraph=True)(c)
    (g,) = torch.autograd.grad(got, c)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, g_want, rtol=1e-10, atol=1e-10)


def test_positional_segments_use_analytic_path():
    # rows that cannot be rewritten put later segments behind the first one
    rows = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 0, 1], [4, 3, 0], [5, 4, 3]]
    table = zmat.ConstructionTable(rows)
    assert len(table.stage_atoms) == 2
    c = random_internal(7, seed=6)
    c[3, 1] = math.pi / 2
    assert torch.allclose(analytic(c, rows), zmat.to_xyz(c, rows, method="reference"), atol=1e-12)


@pytest.mark.parametrize("method", ["levels", "reference"])
def test_other_methods_and_to_internal_compile_without_graph_breaks(method):
    table = zmat.ConstructionTable(BRANCHED)
    c = random_internal(len(BRANCHED), seed=5)

    def roundtrip(x):
        return zmat.to_internal(zmat.to_xyz(x, table, method=method), table)

    expected = roundtrip(c)  # eager call first: builds the index plan
    compiled = torch.compile(roundtrip, backend="aot_eager", fullgraph=True)
    assert torch.allclose(compiled(c), expected, atol=1e-12)


def _deep_forest():
    """Two chains of 40 and 23 atoms with side branches and offset rows: deeper than a block."""
    rows = chain_table(40)
    rows += [[5, 4, 3], [40, 5, 4], [41, 40, 5], [12, 11, 10], [43, 12, 11], [43, 12, 44]]
    base = len(rows)
    rows += [[-1, -1, -1], [base, -1, -1], [base + 1, base, -1]]
    rows += [[base + i - 1, base + i - 2, base + i - 3] for i in range(3, 23)]
    return rows


@pytest.mark.parametrize("scan", ["jump", "levels"])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_both_scans_match_reference_on_deep_forests(monkeypatch, scan, batch):
    import zmat._analytic as analytic_module

    monkeypatch.setattr(analytic_module, "JUMP_FRAMES", 1 << 30 if scan == "jump" else 0)
    monkeypatch.setattr(analytic_module, "JUMP_FRAMES_BATCHED", 1 << 30 if scan == "jump" else 0)
    rows = _deep_forest()
    table = zmat.ConstructionTable(rows)
    assert table.max_depth > 2 * analytic_module.JUMP_BLOCK and table.offset_chain.shape[1] > 1
    c = random_internal(len(rows), batch=batch, seed=11).requires_grad_()
    g = torch.randn(*batch, len(rows), 3, dtype=torch.float64)
    out = {}
    for method in ("analytic", "prefix", "reference"):
        x = zmat.to_xyz(c, table, method=method)
        out[method] = (x, *torch.autograd.grad((x * g).sum(), c))
    for method in ("analytic", "prefix"):
        for a, b in zip(out[method], out["reference"], strict=True):
            assert torch.allclose(a, b, atol=1e-10), method


def test_dispatched_ops_per_call():
    """Batch-1 latency is dispatch-bound: a 12-atom chain's forward and backward
    stay within a fixed number of aten ops (issue 15: <= 80 and <= 65)."""
    from zmat.testing import DispatchAudit

    rows = chain_table(12)
    table = zmat.ConstructionTable(rows)
    c = random_internal(12, seed=0).requires_grad_()
    x = zmat.to_xyz(c, table)
    torch.autograd.grad(x.sum(), c)  # plans built
    with DispatchAudit() as fwd:
        x = zmat.to_xyz(c, table)
    with DispatchAudit() as bwd:
        torch.autograd.grad(x.sum(), c)
    assert fwd.count <= 80 and bwd.count <= 65, (fwd.count, bwd.count)
    assert not fwd.syncs and not bwd.syncs


@settings(max_examples=15)
@given(rows=tables(min_atoms=1, max_atoms=12), data=st.data())
def test_planned_local_frames_are_the_local_transform(rows, data):
    """Both ways the plan builds local transforms (three gathered factors per
    entry, or entry by entry) equal the one placement formula applied to the
    effective internal coordinates; the extra slot is the identity."""
    from zmat._analytic import local_frames
    from zmat._geometry import effective_internal, local_transform

    c = data.draw(internal_coordinates(len(rows), batch=(2,)))
    table = zmat.ConstructionTable(rows)
    plan = forest_plan(table, c.device)
    ref = local_transform(effective_internal(c, table).index_select(-2, plan.dfs_order), layout="components")
    for small in (True, False):
        out = local_frames(c.reshape(2, -1).t(), plan, small)
        assert torch.allclose(out[:, :, :-1], ref.transpose(2, 3), atol=1e-14)
        assert torch.equal(out[:, :, -1], torch.eye(3, 4, dtype=c.dtype)[..., None].expand(3, 4, 2))
