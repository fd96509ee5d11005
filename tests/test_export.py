"""Deployment: mixed precision (torch.autocast) and torch.export of a model
that builds coordinates and scores their clashes (docs/deployment.md)."""

from __future__ import annotations

import io

import pytest
import torch
from torch.export import Dim

import zmat
from zmat.clash import candidate_pairs, clash_loss

N = 20  # short: the levels method traces one step per level
CHAIN = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]] + [[i - 1, i - 2, i - 3] for i in range(3, N)]


def internal(batch=(2,), seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    c = torch.rand(*batch, N, 3, generator=g, dtype=torch.float64)
    c[..., 0] += 1.0
    c[..., 1] = 1.6 + 0.5 * c[..., 1]
    c[..., 2] = 6.0 * c[..., 2] - 3.0
    return c.to(dtype)


# ----------------------------------------------------------------------------
# autocast: float32 inside, whatever the region asks for


def test_autocast_is_active_in_this_test():
    # The premise: without zmat's guard, a matmul in the region runs in bfloat16.
    a = torch.rand(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16


@pytest.mark.parametrize("method", zmat.METHODS)
def test_to_xyz_computes_in_float32_under_autocast(method):
    table = zmat.ConstructionTable(CHAIN)
    c = internal()
    want = zmat.to_xyz(c, table, method=method)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = zmat.to_xyz(c, table, method=method)
        from_bf16 = zmat.to_xyz(c.bfloat16(), table, method=method)
    assert got.dtype == torch.float32 and from_bf16.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # exactly the float32 result
    torch.testing.assert_close(from_bf16, zmat.to_xyz(c.bfloat16().float(), table, method=method))


def test_to_internal_and_clash_loss_compute_in_float32_under_autocast():
    table = zmat.ConstructionTable(CHAIN)
    xyz = zmat.to_xyz(internal(), table)
    radii = torch.full((N,), 1.7)
    want_c = zmat.to_internal(xyz, table)
    want_l = clash_loss(xyz, radii, kind="softplus", method="all_pairs")
    assert (want_l > 0).all()
    low = xyz.bfloat16().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got_c = zmat.to_internal(xyz, table)
        got_l = clash_loss(xyz, radii, kind="softplus", method="all_pairs")
        low_l = clash_loss(low, radii, kind="softplus", method="neighbors")
    assert got_c.dtype == got_l.dtype == low_l.dtype == torch.float32
    torch.testing.assert_close(got_c, want_c, rtol=0, atol=0)
    torch.testing.assert_close(got_l, want_l, rtol=0, atol=0)
    torch.testing.assert_close(low_l, clash_loss(low.detach().float(), radii, kind="softplus"))
    low_l.sum().backward()  # the gradient flows back to the bfloat16 input
    assert low.grad.dtype == torch.bfloat16 and low.grad.abs().sum() > 0


# ----------------------------------------------------------------------------
# torch.export


class ClashModel(torch.nn.Module):
    """Internal coordinates -> (coordinates, clash loss), with a fixed pair list."""

    def __init__(self, table, radii, pairs, method="auto"):
        super().__init__()
        self.table, self.method = table, method
        self.register_buffer("radii", radii)
        self.register_buffer("pairs", pairs)

    def forward(self, c):
        xyz = zmat.to_xyz(c, self.table, method=self.method)
        return xyz, clash_loss(xyz, self.radii, pairs=self.pairs, kind="softplus")


def _tensors(obj):
    """Every tensor in nested lists, tuples, dicts and objects' attributes."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        yield from _tensors(list(obj.values()))
    elif hasattr(obj, "__dict__") and not callable(obj):
        yield from _tensors(list(vars(obj).values()))


# Exporting before any eager call works for the analytic method; the levels
# method's plan, made under export's fake tensors, becomes constants that
# torch.export.save cannot write: call once eagerly first (docs/deployment.md).
@pytest.mark.parametrize(
    ("method", "eager_first"), [("analytic", True), ("levels", True), ("analytic", False)]
)
def test_exported_program_matches_eager(method, eager_first):
    table = zmat.ConstructionTable(CHAIN)
    radii = torch.full((N,), 1.7)
    c = internal()
    # pairs of the first structure's atoms (indices < N) work for any batch size
    pairs = candidate_pairs(zmat.to_xyz(c[:1], zmat.ConstructionTable(CHAIN)), radii, skin=3.0)
    model = ClashModel(table, radii, pairs, method)
    if eager_first:  # plans (of the CPU kernel, for the analytic method) cached before tracing
        model(c)
    batch = Dim("batch", min=1, max=4096)
    program = torch.export.export(model, (c,), dynamic_shapes={"c": {0: batch}})
    for n_batch in (2, 5):  # the batch size is symbolic
        x = internal((n_batch,), seed=n_batch)
        want = model(x)
        assert want[1][0] > 0
        # a symbolic batch takes the analytic method's general scan, eager a
        # small batch the pointer-jumping one: same math, float32 rounding apart
        for got, ref in zip(program.module()(x), want, strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    buffer = io.BytesIO()  # a saved program loads back and runs the same
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()
    torch.testing.assert_close(loaded(c)[1], program.module()(c)[1], rtol=0, atol=0)
    # plans built under export's fake tensors are never cached on the table
    cached = [p for k, v in vars(table).items() if k.startswith("_plans ") for p in v.values()]
    assert not any(isinstance(t, torch._subclasses.FakeTensor) for t in _tensors(cached))


def test_exported_program_has_no_host_sync():
    table = zmat.ConstructionTable(CHAIN)
    radii = torch.full((N,), 1.7)
    c = internal()
    model = ClashModel(table, radii, candidate_pairs(zmat.to_xyz(c, table), radii, skin=3.0))
    program = torch.export.export(model, (c,))
    ops = {n.target.__name__ for n in program.graph.nodes if n.op == "call_function"}
    assert ops and not ops & {"_local_scalar_dense.default", "nonzero.default", "item.default"}


# ----------------------------------------------------------------------------
# the one GPU check (benchmarks/gpu.py) never rots


def test_gpu_check_without_cuda_exits_cleanly(tmp_path, monkeypatch, capsys):
    import benchmarks.gpu as gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--out", str(tmp_path)]) == 0
    assert "no CUDA device" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


def test_gpu_grid_dry_run_on_cpu(tmp_path):
    import json

    import benchmarks.gpu as gpu

    assert gpu.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gpu.json").read_text())["results"]
    cases = {r["case"] for r in rows}
    assert {"chain", "protein", "clash neighbors", "clash pairs=", "clash collapsed", "step eager"} <= cases
    by_case = {r["case"]: r for r in rows}
    assert by_case["clash pairs="]["syncs"] == 0 and by_case["step eager"]["syncs"] == 0
    assert by_case["clash neighbors"]["syncs"] == 2  # the inherent ones: sizing, compaction
    assert "| case |" in (tmp_path / "gpu.md").read_text()


class RestraintEnergy(torch.nn.Module):
    """An OpenMM-Torch-style energy: positions (N, 3) in nm -> energy; forces by autograd."""

    def __init__(self, table, xyz, radii, pairs):
        super().__init__()
        self.table = table
        self.register_buffer("radii", radii)
        self.register_buffer("pairs", pairs)
        self.register_buffer("phi0", zmat.to_internal(xyz, table)[:, 2])

    def forward(self, positions):
        xyz = 10.0 * positions  # nm -> Angstrom
        phi = zmat.to_internal(xyz, self.table)[:, 2]
        return (
            clash_loss(xyz, self.radii, pairs=self.pairs, kind="softplus")
            + (1 - torch.cos(phi - self.phi0)).sum()
        )


@pytest.mark.filterwarnings(r"ignore:`torch.jit.\w+` is deprecated:DeprecationWarning")
def test_torchscript_energy_gives_the_same_forces():
    # TorchScript is what OpenMM-Torch's TorchForce loads: a traced, saved and
    # reloaded energy gives the eager energy and forces (-dE/dx by autograd).
    table = zmat.ConstructionTable(CHAIN)
    xyz = zmat.to_xyz(internal(batch=(), dtype=torch.float64), table)
    radii = torch.full((N,), 1.7, dtype=torch.float64)
    pairs = candidate_pairs(xyz, radii, skin=2.0, exclude=zmat.exclusions_from_table(table))
    energy = RestraintEnergy(table, xyz, radii, pairs)
    with pytest.warns(torch.jit.TracerWarning):  # the shape checks are constant in the trace
        traced = torch.jit.trace(energy, (xyz / 10,))
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    g = torch.Generator().manual_seed(3)
    pos = (xyz / 10 + 0.01 * torch.randn(xyz.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    want = energy(pos)
    (f_want,) = torch.autograd.grad(-want, pos)
    got = loaded(pos)
    (f_got,) = torch.autograd.grad(-got, pos)
    assert want > 0 and f_want.abs().max() > 0
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f_got, f_want, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------
# one NaN policy: propagate (a check would cost a host sync every step)


@pytest.mark.parametrize("method", zmat.METHODS)
def test_nan_propagates_through_the_transforms(method):
    table = zmat.ConstructionTable(CHAIN)
    c = internal((3,), dtype=torch.float64)
    c[1, 10, 2] = float("nan")
    xyz = zmat.to_xyz(c, table, method=method)
    finite = torch.isfinite(xyz).all(-1)
    assert finite[[0, 2]].all()  # other structures are unaffected
    assert finite[1, :10].all() and not finite[1, 10:].any()  # the atom and what is built from it
    back = zmat.to_internal(xyz, table)
    assert torch.isfinite(back[[0, 2]]).all()
    assert torch.isnan(back[1, 10:]).any(-1).all()  # NaN positions give NaN, never a silent 0
    assert torch.isfinite(back[1, :10]).all()
    loss = clash_loss(xyz, torch.full((N,), 1.7, dtype=torch.float64), kind="softplus")
    assert torch.isnan(loss[1]) and torch.isfinite(loss[[0, 2]]).all()
