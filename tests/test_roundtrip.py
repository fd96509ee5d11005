"""Round trips at straight angles (issue 31): ``to_xyz(to_internal(x)) == x`` for every ``x = to_xyz(C)``,
and ``T(T.inv(x)) == x`` for a flow, where ``to_xyz`` carries frames through straight angles."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from strategies import straight_angles, tables

import zmat
from zmat.flows import InternalCoordinateTransform

#: the draws every test here shares: 400 random tables (sibling and cousin rows favoured) with
#: exact straight angles on ~30% of the rows and ~80% of the dihedral references on an axis
_DRAWS: list = []


def _draws() -> list:
    if not _DRAWS:  # 20 draws per example: most of hypothesis' cost is per example

        @settings(
            max_examples=20,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(data=st.data())
        def draw(data):
            got = []  # kept only once the example is whole (an overrun one is aborted midway)
            for _ in range(20):
                rows = data.draw(tables(min_atoms=3, max_atoms=12, proper_bias=0.3, plane_bias=0.7))
                got.append((rows, data.draw(straight_angles(rows))))
            _DRAWS.extend(got)

        draw()
    assert len(_DRAWS) == 400
    return _DRAWS


def _joined(draws):
    """The draws as one forest: a table of all of them and their positions, ``(N, 3)``."""
    table = zmat.ConstructionTable.concatenate([zmat.ConstructionTable(rows) for rows, _ in draws])
    sizes = [len(rows) for rows, _ in draws]
    return table, zmat.to_xyz(torch.cat([c for _, c in draws]), table), sizes


def _worst_draw(y, x, draws, sizes) -> str:
    err = torch.stack([e.max() for e in (y - x).norm(dim=-1).split(sizes)])
    k = int(err.argmax())
    return f"{int((err > 1e-9).sum())}/{len(sizes)} draws off, worst {float(err[k]):.2e} A: {draws[k][0]}"


def test_every_straight_angle_draw_round_trips():
    draws = _draws()
    table, x, sizes = _joined(draws)
    xg = x.clone().requires_grad_(True)
    C = zmat.to_internal(xg, table)
    y = zmat.to_xyz(C.detach(), table)
    assert (y - x).norm(dim=-1).max() < 1e-10, _worst_draw(y, x, draws, sizes)
    (g,) = torch.autograd.grad(C.sin().sum() + C[..., 0].sum(), xg)  # finite at the degenerate points
    assert torch.isfinite(g).all()


def test_sibling_on_the_axis_round_trips():
    # the issue's table: atom 4 at 180 degrees on the axis 2-3 is atom 5's sibling reference
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [3, 2, 4]]
    x = [[0, 0, 0], [0, 0, 1.0], [0, 1.0, 1.5], [1.0, 1.0, 2.0], [2, 1, 2.5], [1, 2, 3.0]]
    x = torch.tensor(x, dtype=torch.float64)
    y = zmat.to_xyz(zmat.to_internal(x, table), table)
    assert (zmat.superpose(y, x) - x).norm(dim=-1).max() < 1e-10
    x = zmat.to_xyz(zmat.to_internal(x, table), table)  # exactly, in to_xyz's placement
    assert (zmat.to_xyz(zmat.to_internal(x, table), table) - x).norm(dim=-1).max() < 1e-12


def test_a_chain_through_straight_angles_round_trips_with_gradients():
    # atoms 1, 2, 3, 4 on a line (two straight angles in a row), then a proper chain on
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [4, 3, 2], [5, 4, 3], [4, 3, 5]]
    C = [[0, 0, 0], [1.5, 0, 0], [1.4, 2.0, 0], [1.3, math.pi, 0.4], [1.2, math.pi, -1.0], [1.1, 1.9, 0.7]]
    C = torch.tensor([*C, [1.5, 1.7, 2.1], [1.0, 2.2, -2.0]], dtype=torch.float64)
    x = zmat.to_xyz(C, table)
    assert (zmat.to_xyz(zmat.to_internal(x, table), table) - x).norm(dim=-1).max() < 1e-12
    # moving atoms 0 and 7 keeps the line straight: the dihedrals measured against the carried
    # axis (atom 2's plane) are smooth there
    free = [0, 7]

    def f(p):
        return zmat.to_internal(x.index_put((torch.tensor(free),), p), table)[..., 5:, 2]

    p = x[free].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (p,)) and torch.autograd.gradgradcheck(f, (p,))


def test_molecules_with_linear_groups_round_trip():
    Chem = pytest.importorskip("rdkit.Chem")
    from rdkit.Chem import AllChem

    for smiles in ("CC#CC(=O)C#N", "CC#CC#CC"):  # an ynone with a nitrile; a diyne
        mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
        AllChem.EmbedMolecule(mol, randomSeed=1)
        zm = zmat.ZMatrix.from_rdkit(mol)
        C = zm.internal.double().clone()
        linear = C[:, 1] > math.radians(170)
        assert linear.sum() >= 3
        C[linear, 1] = math.pi  # the linear groups exactly straight
        x = zmat.to_xyz(C, zm.table)
        y = zmat.to_xyz(zmat.to_internal(x, zm.table), zm.table)
        assert (y - x).norm(dim=-1).max() < 1e-10, smiles


def test_flow_inverse_round_trips_every_straight_angle_draw():
    draws = _draws()[::4]
    table, x, sizes = _joined(draws)
    q, R = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    x = x @ (q * torch.sign(torch.linalg.det(q))).T + 1.5  # the flow's trees in any orientation
    T = InternalCoordinateTransform(table)
    y = T(T.inv(x[None]))[0]
    assert (y - x).norm(dim=-1).max() < 1e-9, _worst_draw(y, x, draws, sizes)


def test_compiled_carried_rows_are_the_torch_ones(monkeypatch):
    """The flows' compiled inverse (``zmat._kernel.carried``) equals the carried axes' torch path
    (``ZMAT_NO_KERNEL``), values and gradients (through the trees' axes too), on 100 of the
    straight-angle draws as one flow of rotated trees (and a perturbed copy), and passes
    gradcheck / gradgradcheck through an inherited axis."""
    from zmat import _carried, _kernel

    if not _kernel.usable(torch.zeros(1, dtype=torch.float64)):
        pytest.skip("no compiled kernel")
    table, x, sizes = _joined(_draws()[200:300])
    gen = torch.Generator().manual_seed(0)
    turn = torch.linalg.qr(torch.randn(len(sizes), 3, 3, generator=gen, dtype=x.dtype))[0]
    x = torch.einsum("nij,nj->ni", turn.repeat_interleave(torch.tensor(sizes), 0), x)
    xs = torch.stack([x, x + 1e-3 * torch.randn(x.shape, generator=gen, dtype=x.dtype)])
    w = torch.randn(2, 3 * table.n_atoms, generator=gen, dtype=x.dtype)
    T, out = InternalCoordinateTransform(table), []
    calls = []
    monkeypatch.setattr(_kernel, "carried", lambda *a, f=_kernel.carried: calls.append(1) or f(*a))
    for off in ("", "1"):
        monkeypatch.setenv("ZMAT_NO_KERNEL", off)
        v = xs.clone().requires_grad_(True)
        q = T.inv(v)
        out.append((q, *torch.autograd.grad((q * w).sum(), v)))
    assert len(calls) == 1
    (q1, g1), (q2, g2) = out
    assert (q1 - q2).abs().max() < 1e-12
    assert ((g1 - g2).abs() / (1 + g2.abs())).max() < 1e-9
    monkeypatch.delenv("ZMAT_NO_KERNEL")
    # a chain through a straight angle at atom 2: atom 3's axis is inherited from atom 2's parent
    rows = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [4, 3, 2]]
    C = torch.tensor(
        [[0, 0, 0], [1.0, 0, 0], [1.2, 1.9, 0], [1.1, math.pi, 0.7], [1.3, 1.8, 1.1], [1.0, 2.0, -0.4]],
        dtype=torch.float64,
    )
    t = zmat.ConstructionTable(rows)
    y = zmat.to_xyz(C, t)[None].requires_grad_(True)
    flags = InternalCoordinateTransform(t)._tensors(y.device, y.dtype)["flags"]
    assert t.cached(_carried.carried_kernel, y.device) is not None
    free = y[:, [0, 4, 5]].detach().clone().requires_grad_(True)  # 1, 2, 3 keep the line straight

    def rows_of(v):
        return _carried.kernel_rows(
            torch.stack([v[:, 0], *y.detach()[:, 1:4].unbind(1), v[:, 1], v[:, 2]], 1), t, flags
        )

    assert torch.autograd.gradcheck(rows_of, (free,))
    assert torch.autograd.gradgradcheck(rows_of, (free,))
