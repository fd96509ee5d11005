"""The compiled CPU kernel of the analytic method (``zmat/_kernel.py``) against
the pure-PyTorch path it replaces on the CPU (``_place_torch``, itself checked
against the reference method and the twin in ``test_analytic.py``)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_table, internal_coordinates, random_internal, tables

import zmat
from zmat import _analytic, _kernel
from zmat.table import TablePlan

DATA = Path(__file__).parent / "data"
# rows that cannot all be rewritten as rigid children: a second segment whose
# anchor is built from positions (the kernel's Frames path)
POSITIONAL = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 0, 1], [4, 3, 0], [5, 4, 3]]


def both(c: torch.Tensor, table, weights: torch.Tensor):
    """Positions and gradient of ``<x, weights>`` by the kernel and by the torch path."""
    out = []
    for place in (zmat.to_xyz, _analytic._place_torch):
        c_ = c.detach().requires_grad_()
        x = place(c_, table)
        out.append((x.detach(), *torch.autograd.grad((x * weights).sum(), c_)))
    return out


# the spy is shared by the examples: the test counts calls as a difference
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=tables(min_atoms=1, max_atoms=14), linear=st.booleans(), data=st.data())
def test_matches_torch_path_on_random_tables(spy, rows, linear, data):
    table = zmat.ConstructionTable(rows)
    # Exactly linear references of a position-built anchor are ill-posed (the
    # documented fallback axis is chosen by rounding-level residuals, which
    # differ between any two summation orders, the reference method's too).
    linear = linear and table.constant_anchors
    c = data.draw(internal_coordinates(len(rows), batch=(2,), linear=linear))
    w = torch.randn(2, len(rows), 3, dtype=torch.float64)
    calls = spy.calls["forward"]
    (x, g), (x_ref, g_ref) = both(c, table, w)
    assert spy.calls["forward"] == calls + 1
    assert torch.allclose(x, x_ref, atol=1e-12, rtol=0), (x - x_ref).abs().max()
    assert torch.allclose(g, g_ref, atol=1e-12, rtol=0), (g - g_ref).abs().max()


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(tables(min_atoms=1, max_atoms=8), min_size=1, max_size=5), data=st.data())
def test_plan_of_a_taken_table_is_taken_from_the_source(spy, pieces, data):
    # a batch of a data set (ConstructionTable.take) takes its kernel plan
    # from the data set's: the same arrays as planning the batch's own table
    source = zmat.ConstructionTable.concatenate([zmat.ConstructionTable(p) for p in pieces])
    ptr = np.cumsum([0] + [len(p) for p in pieces])
    index = np.array(data.draw(st.lists(st.integers(0, len(pieces) - 1), min_size=1, max_size=6)))
    taken = source.take(ptr, index)
    cpu = torch.device("cpu")
    plan = _analytic._kernel_plan(taken, cpu)  # by take: the table's arrays are not made yet
    assert not {"refs", "kind", "dfs_order"} & set(vars(taken))
    own = zmat.ConstructionTable.from_plan(TablePlan.of(taken), taken.n_atoms)
    direct = _analytic._kernel_plan(own, cpu)  # planned from the batch's own arrays
    for name in ("order", "parent", "trig"):
        assert torch.equal(getattr(plan, name), getattr(direct, name)), name
    k = min(len(plan.keep), len(direct.keep))
    keep = direct.keep[:k].bool()
    assert (
        torch.equal(plan.keep[:k], direct.keep[:k]) and not plan.keep[k:].any() and not direct.keep[k:].any()
    )
    assert torch.equal(plan.gather[:k][keep], direct.gather[:k][keep])
    c = data.draw(internal_coordinates(taken.n_atoms, batch=(2,)))
    (x, g), (x_ref, g_ref) = both(c, taken, torch.randn(2, taken.n_atoms, 3, dtype=torch.float64))
    assert torch.allclose(x, x_ref, atol=1e-12, rtol=0) and torch.allclose(g, g_ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("rows", [chain_table(30), POSITIONAL], ids=["chain", "positional"])
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_both_kernel_paths_batched(spy, rows, batch):
    table = zmat.ConstructionTable(rows)
    assert table.constant_anchors == (rows is not POSITIONAL)
    c = random_internal(len(rows), batch=batch, seed=1)
    c[..., 3, 1] = math.pi  # a linear angle
    w = torch.randn(*batch, len(rows), 3, dtype=torch.float64)
    (x, g), (x_ref, g_ref) = both(c, table, w)
    assert spy.of("forward", "backward") == (1, 1)
    assert torch.allclose(x, x_ref, atol=1e-12, rtol=0) and torch.allclose(g, g_ref, atol=1e-12, rtol=0)


def test_strided_input_and_expanded_gradient(spy):
    table = zmat.ConstructionTable(chain_table(9))
    base = random_internal(9, batch=(2,), seed=2)
    c = torch.cat([base, base], -1)[..., ::2].detach().requires_grad_()  # not contiguous
    c_ref = c.detach().clone().requires_grad_()
    x = zmat.to_xyz(c, table)
    x.sum().backward()  # an expanded (stride 0) output gradient
    _analytic._place_torch(c_ref, table).sum().backward()
    assert spy.of("forward", "backward") == (1, 1)
    assert torch.allclose(c.grad, c_ref.grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["1ubi", "1igy"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_real_proteins(spy, name, dtype):
    pytest.importorskip("biotite")
    p = zmat.protein.from_pdb(DATA / f"{name}.pdb")
    c = p.internal.to(dtype)
    w = torch.randn(c.shape, dtype=torch.float64).to(dtype)
    (x, g), (x_ref, g_ref) = both(c, p.table, w)
    assert spy.calls["forward"] == 1
    tol = 1e-10 if dtype == torch.float64 else 2e-3  # float64: within the methods' contract
    assert torch.allclose(x, x_ref, atol=tol, rtol=0)
    assert torch.allclose(g, g_ref, atol=tol * 10, rtol=1e-4 if dtype == torch.float32 else 0)


@pytest.mark.parametrize("rows", [chain_table(7), POSITIONAL], ids=["chain", "positional"])
def test_gradcheck_and_gradgradcheck(spy, rows):
    table = zmat.ConstructionTable(rows)
    c = random_internal(len(rows), batch=(2,), seed=4).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: zmat.to_xyz(x, table), (c,), check_batched_grad=True)
    assert spy.calls["backward"] > 0  # first order through the kernel
    # second order: the backward with create_graph differentiates the torch path
    assert torch.autograd.gradgradcheck(lambda x: zmat.to_xyz(x, table), (c,))


def test_disabled_by_environment(spy, monkeypatch):
    monkeypatch.setenv("ZMAT_NO_KERNEL", "1")
    table = zmat.ConstructionTable(chain_table(6))
    c = random_internal(6, seed=5).requires_grad_()
    zmat.to_xyz(c, table).sum().backward()
    assert spy.of("forward", "backward") == (0, 0)
    assert not _kernel.usable(c)


def test_traced_and_transformed_calls_use_the_torch_path(spy):
    table = zmat.ConstructionTable(chain_table(6))
    c = random_internal(6, seed=5)
    torch.func.jacrev(lambda x: zmat.to_xyz(x, table))(c)
    with torch.autograd.forward_ad.dual_level():
        zmat.to_xyz(torch.autograd.forward_ad.make_dual(c, torch.ones_like(c)), table)
    assert not _kernel.usable(c.half()) and spy.calls["forward"] == 0


def test_build_failure_falls_back_with_one_warning(monkeypatch):
    monkeypatch.delenv("ZMAT_NO_KERNEL", raising=False)
    monkeypatch.delitem(_kernel._state, "module", raising=False)

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(_kernel, "build", broken)
    table = zmat.ConstructionTable(chain_table(6))
    c = random_internal(6, seed=5)
    with pytest.warns(RuntimeWarning, match="no compiler"):
        x = zmat.to_xyz(c, table)
    assert torch.allclose(x, _analytic._place_torch(c, table), atol=1e-12)
    zmat.to_xyz(c, table)  # warned once: pytest's filterwarnings=error would fail a second one


@pytest.mark.skipif(
    not os.environ.get("CI"),
    reason="runs only with CI=1 (CI has a compiler); elsewhere no compiler means the torch path",
)
def test_ci_builds_the_kernel(monkeypatch):
    # CI has a compiler: a kernel that fails to build must fail here, not
    # silently skip every test above and run the torch path instead
    monkeypatch.delenv("ZMAT_NO_KERNEL", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = _kernel.load()
    assert module is not None
    assert {"forward", "backward", "fill_forward", "fill_backward"} <= set(dir(module))


def test_import_does_not_compile():
    code = "import zmat, zmat._kernel as k; print('module' in k._state)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("rows", [chain_table(8), POSITIONAL], ids=["chain", "positional"])
def test_input_may_change_after_the_forward(spy, rows):
    # the kernel saves its output frames, not C (as the torch path): an
    # optimizer step between forward and backward is no error
    table = zmat.ConstructionTable(rows)
    c = random_internal(len(rows), seed=7).requires_grad_()
    w = torch.randn(len(rows), 3, dtype=torch.float64)
    (expected,) = torch.autograd.grad((zmat.to_xyz(c, table) * w).sum(), c)
    x = zmat.to_xyz(c, table)
    with torch.no_grad():
        c.add_(0.1)
    (g,) = torch.autograd.grad((x * w).sum(), c)
    assert spy.calls["backward"] == 2 and torch.allclose(g, expected, atol=1e-12, rtol=0)


def test_third_derivative_through_the_kernel_forward(spy):
    table = zmat.ConstructionTable(chain_table(6))
    c = random_internal(6, seed=8).requires_grad_()
    out = {}
    for name, place in (("kernel", zmat.to_xyz), ("torch", _analytic._place_torch)):
        (g,) = torch.autograd.grad(place(c, table).square().sum(), c, create_graph=True)
        (h,) = torch.autograd.grad(g.square().sum(), c, create_graph=True)
        out[name] = torch.autograd.grad(h.sum(), c)[0]
    assert spy.calls["forward"] == 1 and torch.allclose(out["kernel"], out["torch"], atol=1e-10)


@pytest.mark.parametrize("batch", [(), (5,)], ids=["trees", "structures"])
@pytest.mark.parametrize("positional", [False, True])
def test_threads_give_the_single_thread_result(spy, monkeypatch, batch, positional):
    # Large calls split their structures, or the runs of whole trees of one
    # structure, over threads: the same arithmetic per tree, so bitwise the
    # same result (thresholds lowered so that a small forest splits)
    monkeypatch.setattr(_kernel, "PARALLEL_ATOMS", 1)
    monkeypatch.setattr(_kernel, "CHUNK_ATOMS", 16)
    piece = POSITIONAL if positional else chain_table(9)
    table = zmat.ConstructionTable.concatenate([zmat.ConstructionTable(piece)] * 30)
    plan = table.cached(_analytic._kernel_plan, torch.device("cpu"))
    assert len(plan.chunks) > 5
    c = random_internal(table.n_atoms, batch=batch, seed=9)
    w = torch.randn(c.shape, dtype=torch.float64)
    out = {}
    for n in (1, 3):
        monkeypatch.setattr(torch, "get_num_threads", lambda n=n: n)
        c_ = c.detach().requires_grad_()
        x = zmat.to_xyz(c_, table)
        out[n] = (x.detach(), *torch.autograd.grad((x * w).sum(), c_))
    assert all(torch.equal(a, b) for a, b in zip(out[1], out[3], strict=True))
    assert spy.calls["forward"] == 2
    x_ref, g_ref = both(c, table, w)[1]
    assert torch.allclose(out[3][0], x_ref, atol=1e-12) and torch.allclose(out[3][1], g_ref, atol=1e-12)
