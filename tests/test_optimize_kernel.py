"""zmat.optimize's coordinates in the compiled kernel (zmat/csrc/primitives.cpp) against the torch path."""

from pathlib import Path

import ase.io
import pytest
import torch
from ase import Atoms

from zmat.optimize import ToyForceField, build_primitives, values
from zmat.optimize.coordinates import values_and_b
from zmat.optimize.optimizer import InternalStepper, _evaluate
from zmat.optimize.steps import back_transform, reduced_space, wrap
from zmat.testing import DispatchAudit

# ops of one step at batch 1 (allene, kernel on): values_and_b 2 and back_transform 5 of them (the torch
# path: 202 and ~360); the rest is the step's linear algebra (69 measured: the step's bookkeeping on numpy
# views, the periodic mask's and fragments' views made once per rebuild; 77 without those, ~256 before, ~430
# before the line search, BFGS vectors, Cartesian cap and linear check went there)
VALUES_AND_B_OPS, BACK_TRANSFORM_OPS, STEP_OPS = 2, 5, 72


def baker(name):
    berny = pytest.importorskip("berny")
    return ase.io.read(Path(berny.__file__).parent / "benchmarks" / "baker_shajan_2023" / f"{name}.xyz")


def both(monkeypatch, fn):
    """``fn()`` on the torch path (``ZMAT_NO_KERNEL=1``) and on the kernel."""
    monkeypatch.setenv("ZMAT_NO_KERNEL", "1")
    old = fn()
    monkeypatch.setenv("ZMAT_NO_KERNEL", "0")
    return old, fn()


WATER_DIMER = Atoms(
    "OHHOHH",
    positions=[[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0], [2.9, 0, 0], [3.2, 0.5, 0.75], [3.2, 0.5, -0.75]],
)


# acetylene: linear bends only; allene: linear bends and out-of-plane; trifluorobenzene unperturbed: planar,
# out-of-plane at 0 and dihedrals at +-pi (a zero sine's sign); histidine: every covalent kind
@pytest.mark.parametrize("name", ["acetylene", "allene", "trifluorobenzene_135", "histidine", "tric"])
def test_compiled_values_and_b_equal_the_torch_path(monkeypatch, name):
    m = WATER_DIMER if name == "tric" else baker(name)
    prims = build_primitives(
        m.positions, m.numbers, frozen=(1,), coords="tric" if name == "tric" else "redundant"
    )
    x = torch.tensor(m.positions)[None].expand(3, -1, -1).clone() / 0.529177
    x[1:] += 0.05 * torch.randn(x[1:].shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    (q0, b0, v0), (q1, b1, v1) = both(monkeypatch, lambda: (*values_and_b(prims, x), values(prims, x)))
    assert q1.shape == q0.shape and b1.shape == b0.shape
    torch.testing.assert_close(q1, q0, atol=1e-12, rtol=0)
    torch.testing.assert_close(v1, q0, atol=1e-12, rtol=0)
    torch.testing.assert_close(b1, b0, atol=1e-12, rtol=0)
    assert (b1[:, :, :] != 0).any(-1).all()  # every row has a derivative


@pytest.mark.parametrize("refresh, stall", [(0, 0.99), (0, 0.05), (1, 0.99)])
def test_compiled_back_transform_equals_the_torch_loop(monkeypatch, refresh, stall):
    """The fixed-Jacobian iteration per conformer with its stop and fallback rules, and the refresh round
    (constraints); ``stall`` 0.05 stops the moderate step while it still converges (the rule is active)."""
    m = baker("histidine")
    prims = build_primitives(m.positions, m.numbers)
    x = torch.tensor(m.positions)[None].expand(4, -1, -1).clone() / 0.529177
    x += 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    q, Bm = values_and_b(prims, x)
    U, Vs, _ = reduced_space(Bm)
    periodic = prims.periodic()
    gen = torch.Generator().manual_seed(2)
    dq = (U @ (0.3 * torch.randn(4, U.shape[-1], 1, generator=gen, dtype=x.dtype)))[..., 0]
    dq[0] *= 0.01  # near-linear: stops on the update's size
    dq[1] = 0.05 * torch.randn(dq.shape[1], generator=gen, dtype=x.dtype)  # redundant: the residual stalls
    dq[2] *= 3.0  # far: diverges, the first iterate is kept
    dq = wrap(dq, periodic)

    def run(stall=stall):
        return back_transform(prims, x, q, dq, (U, Vs), periodic, refresh=refresh, stall=stall)

    (x0, q0), (x1, q1) = both(monkeypatch, run)
    torch.testing.assert_close(x1, x0, atol=1e-12, rtol=0)
    torch.testing.assert_close(q1, q0, atol=1e-12, rtol=0)
    assert (x1 != x).any(-1).any(-1).all()
    if stall < 0.5:
        assert (run(0.99)[0] - x1)[3].abs().max() > 1e-6


def test_a_compiled_step_dispatches_a_few_ops_on_the_coordinates(monkeypatch):
    """At batch 1 a step is dispatch-bound: values and B one kernel call, the back-transformation one."""
    import zmat.optimize.optimizer as optimizer

    counts = {"values_and_b": [], "back_transform": []}

    def audited(name):
        fn = getattr(optimizer, name)

        def call(*args, **kwargs):
            with DispatchAudit() as a:
                out = fn(*args, **kwargs)
            counts[name].append(a.count)
            return out

        return call

    for name in counts:
        monkeypatch.setattr(optimizer, name, audited(name))
    m = baker("allene")
    x = torch.tensor(m.positions)[None] + 0.05
    prims = build_primitives(m.positions, m.numbers)
    values(prims, x)
    with DispatchAudit() as v:
        values(prims, x)
    stepper, ff, steps = InternalStepper(x, m.numbers), ToyForceField(m.numbers, m.positions), []
    for _ in range(3):
        e, g = _evaluate(ff, x)
        with DispatchAudit() as s:
            x = stepper.step(x, e, g)[1]
        steps.append(s.count)
    assert v.count == 1, v.count
    assert counts == {"values_and_b": [VALUES_AND_B_OPS] * 3, "back_transform": [BACK_TRANSFORM_OPS] * 3}, (
        counts
    )
    assert max(steps) <= STEP_OPS, steps
