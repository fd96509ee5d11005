"""The compiled kernel as users meet it (``zmat/_kernel.py``): built by the C++
compiler into a cache keyed by what the build depends on, safe from several
processes at once, buildable ahead (``python -m zmat build-kernel``), and
registered as ``torch.library`` operators that ``torch.compile`` and
``torch.export`` graphs call (checked by ``torch.library.opcheck``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from strategies import chain_table, random_internal

import zmat
from zmat import _analytic, _kernel

ROOT = Path(__file__).resolve().parents[1]
POSITIONAL = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 0, 1], [4, 3, 0], [5, 4, 3]]


def _python(code: str, cache: Path, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "ZMAT_KERNEL_DIR": str(cache), **env}
    full.pop("ZMAT_NO_KERNEL", None)
    return subprocess.Popen(
        [sys.executable, "-c", code], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


FIRST_CALL = (
    "import torch, zmat, zmat._kernel as k\n"
    "t = zmat.ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]])\n"
    "zmat.to_xyz(torch.rand(4, 3, dtype=torch.float64), t)\n"
    "assert k._state['module'] is not None\n"
    "print(k.library_path())\n"
)


def test_four_processes_build_on_an_empty_cache_at_once_then_load_it_silently(tmp_path):
    procs = [_python(FIRST_CALL, tmp_path) for _ in range(4)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1 and [p.name for p in tmp_path.iterdir()] == [Path(*paths).name]  # no partial files
    assert any("zmat: compiling the CPU kernel" in err for _, err in outs)
    for _, err in outs:  # one line while building, ending with the time it took; nothing else
        assert len(err.strip().splitlines()) <= 1 and "warning" not in err.lower()
        assert not err or re.fullmatch(
            r"zmat: compiling the CPU kernel into .*build-kernel.* \.\.\. \d+\.\d s", err.strip()
        )
    # built: the command that builds ahead finds it, says nothing and prints its path
    warm = _python(
        "import runpy, sys; sys.argv = ['zmat', 'build-kernel']; runpy.run_module('zmat')", tmp_path
    )
    out, err = warm.communicate(timeout=240)
    assert warm.returncode == 0 and out.strip() in paths and err == ""


def test_cache_key_ignores_path_but_follows_compiler_and_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("ZMAT_KERNEL_DIR", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    key = _kernel.library_path()
    # another PATH (a venv's bin with its own ninja, a symlinked compiler) finds the same file
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ninja").write_text("#!/bin/sh\nexit 1\n")
    (bin_ / "ninja").chmod(0o755)
    (bin_ / "c++").symlink_to(_kernel._compiler()[0])
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    assert _kernel.library_path() == key
    # another compiler, other flags or other sources give another file
    assert _kernel.library_path([_kernel._compiler()[0], "-march=x86-64"]) != key
    src = tmp_path / "csrc"
    src.mkdir()
    for f in _kernel._CSRC.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(_kernel, "_CSRC", src)
    assert _kernel.library_path() == key
    (src / "parallel.h").write_text((src / "parallel.h").read_text() + "\n// changed\n")
    assert _kernel.library_path() != key


# ------------------------------------------------------------------ operators
def _plan(rows):
    table = zmat.ConstructionTable(rows)
    return table, table.cached(_analytic._kernel_plan, torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_opcheck_placement_ops(spy, dtype):
    _, plan = _plan(chain_table(9))
    c = random_internal(9, batch=(3,), seed=1).to(dtype).reshape(3, -1).requires_grad_()
    ops = torch.ops.zmat
    torch.library.opcheck(ops.place.default, (c, *plan.placement, plan.chunks, plan.order))
    torch.library.opcheck(ops.frames.default, (c, *plan.placement, plan.chunks))
    frames, _ = ops.place(c.detach(), *plan.placement, plan.chunks, plan.order)
    g = torch.randn_like(frames)
    args = (plan.gather, plan.keep, plan.parent, plan.chunks, c.shape[1])
    for grads in ((g[..., :3], g[..., 3], None, None), (None, None, g[..., 3], plan.order)):
        torch.library.opcheck(ops.place_backward.default, (frames, *grads, *args))
    assert spy.calls["forward"] > 0 and spy.calls["backward"] > 0


def test_opcheck_fill_and_torsion_ops(spy):
    t = torch.randn(2, 5, 7, dtype=torch.float64)
    t[0, 1, 3] = float("nan")
    slot = torch.tensor([-1, 0, 8, 13, 34, -1, 22], dtype=torch.long)
    ideal = torch.randn(7, 3, dtype=torch.float64)
    defaults = torch.randn(7, dtype=torch.float64)
    torch.library.opcheck(torch.ops.zmat.fill.default, (t.requires_grad_(), ideal, slot, defaults))
    g = torch.randn(2, 7, 3, dtype=torch.float64)
    torch.library.opcheck(torch.ops.zmat.fill_backward.default, (g, t.detach(), slot))
    # two nested torsions moving atoms 2.. (plan layout of zmat._kernel.torsions)
    x0 = torch.randn(6, 3, dtype=torch.float64)
    u = torch.nn.functional.normalize(x0[[2, 4]] - x0[[1, 3]], dim=-1)
    plan = (
        torch.tensor([1, 0]), torch.tensor([-1, 0]), torch.tensor([-1, -1, 0, 0, 1, 1]),
        torch.tensor([0.3, -0.2], dtype=torch.float64), u, x0[[1, 3]], x0,
    )  # fmt: skip
    tors = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.zmat.torsions.default, (tors, *plan))
    g = torch.randn(4, 6, 3, dtype=torch.float64)
    torch.library.opcheck(torch.ops.zmat.torsions_backward.default, (g, tors.detach(), *plan))
    assert spy.of("fill_forward", "torsions_forward") > (0, 0)


@pytest.mark.parametrize("rows", [chain_table(12), POSITIONAL], ids=["chain", "positional"])
def test_compiled_graph_calls_the_kernel(spy, rows):
    table = zmat.ConstructionTable(rows)
    c = random_internal(len(rows), batch=(2,), seed=2).requires_grad_()
    w = torch.randn(2, len(rows), 3, dtype=torch.float64)

    def loss(x):
        return (zmat.to_xyz(x, table) * w).sum()

    (g_want,) = torch.autograd.grad(loss(c), c)
    torch._dynamo.reset()
    calls = spy.of("forward", "backward")
    value = torch.compile(loss, backend="aot_eager", fullgraph=True)(c)
    (g,) = torch.autograd.grad(value, c)
    assert spy.calls["forward"] > calls[0] and spy.calls["backward"] > calls[1]
    torch.testing.assert_close(value, loss(c), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, g_want, rtol=1e-12, atol=1e-12)


def test_exported_program_calls_the_kernel(spy):
    table = zmat.ConstructionTable(chain_table(20))

    class Model(torch.nn.Module):
        def forward(self, c):
            return zmat.to_xyz(c, table)

    c = random_internal(20, batch=(3,), seed=3).float()
    program = torch.export.export(Model(), (c,))
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "zmat.place.default" in ops
    calls = spy.calls["forward"]
    torch.testing.assert_close(program.module()(c), Model()(c), rtol=0, atol=0)
    assert spy.calls["forward"] == calls + 2
