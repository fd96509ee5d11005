"""The compiled rigid torsion update (``zmat._kernel.torsions``, ``zmat/csrc/torsions.cpp``)
behind ``TorsionSpace.to_xyz``'s rigid route, against that route's torch ops
(``RigidTorsions.torch_path``, itself checked against RDKit in ``test_rdkit.py``) and against
RDKit's ``SetDihedralRad`` directly."""

from __future__ import annotations

import math

import pytest
import torch

Chem = pytest.importorskip("rdkit.Chem")
from rdkit.Chem import rdMolTransforms  # noqa: E402
from strategies import embedded_mols  # noqa: E402

from zmat.rdkit import TorsionSpace  # noqa: E402

SMILES = {
    "ranolazine": "COc1ccccc1OCC(O)CN1CCN(CC(=O)Nc2c(C)cccc2C)CC1",  # 9 nested rotors
    "lidocaine": "CCN(CC)CC(=O)Nc1c(C)cccc1C",
    "ibuprofen_sodium": "CC(C)Cc1ccc(cc1)[C@H](C)C(=O)[O-].[Na+]",  # two fragments
    "biphenyl": "Cc1ccccc1-c1ccccc1C",
}


@pytest.fixture(scope="module")
def spaces():
    return {name: TorsionSpace.from_mol(mol) for name, mol in embedded_mols(SMILES, seed=11).items()}


def _hard_torsions(ts: TorsionSpace, batch: int, seed: int) -> torch.Tensor:
    """Random torsions with exact hard cases: no change, a change of exactly pi, values at 0 and pi."""
    g = torch.Generator().manual_seed(seed)
    t = ts.torsions + 4 * torch.randn(batch, len(ts.quads), generator=g, dtype=torch.float64)
    t[0] = ts.torsions  # the conformer itself
    t[1] = ts.torsions + math.pi
    t[2, ::2], t[2, 1::2] = 0.0, math.pi
    return t


def both(ts: TorsionSpace, t: torch.Tensor, w: torch.Tensor):
    out = []
    for place in (ts.to_xyz, ts._rigid_body.torch_path):
        t_ = t.detach().requires_grad_()
        x = place(t_)
        out.append((x.detach(), *torch.autograd.grad((x * w).sum(), t_)))
    return out


@pytest.mark.parametrize("name", list(SMILES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_the_torch_route(spy, spaces, name, dtype):
    ts = spaces[name]
    t = _hard_torsions(ts, 5, seed=1).to(dtype)
    w = torch.randn(5, len(ts.positions), 3, dtype=torch.float64).to(dtype)
    (x, g), (x_ref, g_ref) = both(ts, t, w)
    assert spy.of("torsions_forward", "torsions_backward") == (1, 1)
    tol = 1e-12 if dtype == torch.float64 else 2e-4
    torch.testing.assert_close(x, x_ref, atol=tol, rtol=0)
    torch.testing.assert_close(g, g_ref, atol=tol * 10, rtol=1e-5)
    if dtype == torch.float64:  # the conformer comes back exactly where it was
        assert (x[0] - ts.positions).abs().max() < 1e-12


def test_matches_rdkit_set_dihedral(spy, spaces):
    ts = spaces["ranolazine"]
    t = _hard_torsions(ts, 3, seed=2)
    x = ts.to_xyz(t)
    assert spy.calls["torsions_forward"] == 1
    for b in range(3):
        copy = Chem.Mol(ts.mols[0])
        conf = copy.GetConformer()
        for q, v in zip(ts.quads.tolist(), t[b].tolist(), strict=True):
            rdMolTransforms.SetDihedralRad(conf, *q, v)
        assert (x[b] - torch.as_tensor(conf.GetPositions())).abs().max() < 1e-9


def test_batch_take_and_shapes(spy, spaces):
    data = TorsionSpace.batch([spaces[n] for n in SMILES])
    part = data.take([3, 0, 0, 2])
    for ts in (data, part):
        for shape in ((), (2,), (2, 3)):
            t = ts.torsions + torch.randn(*shape, len(ts.quads), dtype=torch.float64)
            x = ts.to_xyz(t)
            assert x.shape == (*shape, len(ts.positions), 3)
            torch.testing.assert_close(x, ts._rigid_body.torch_path(t), atol=1e-12, rtol=0)
    assert spy.calls["torsions_forward"] == 6


def test_strided_input_and_expanded_gradient(spy, spaces):
    ts = spaces["lidocaine"]
    base = _hard_torsions(ts, 3, seed=3)
    t = torch.stack([base, base], -1)[..., 0].detach().requires_grad_()  # not contiguous
    t_ref = t.detach().clone().requires_grad_()
    ts.to_xyz(t).sum().backward()  # an expanded (stride 0) output gradient
    ts._rigid_body.torch_path(t_ref).sum().backward()
    assert spy.of("torsions_forward", "torsions_backward") == (1, 1)
    torch.testing.assert_close(t.grad, t_ref.grad, atol=1e-12, rtol=0)


def test_gradcheck_and_gradgradcheck_through_the_kernel(spy, spaces):
    ts = spaces["ranolazine"]
    t = _hard_torsions(ts, 3, seed=4).requires_grad_()
    w = torch.randn(3, len(ts.positions), 3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: (ts.to_xyz(t) * w).sum(-1), (t,))
    assert spy.calls["torsions_backward"] > 0  # first order through the kernel
    assert torch.autograd.gradgradcheck(lambda t: (ts.to_xyz(t) * w).sum(-1), (t,))


def test_disabled_by_environment(spy, spaces, monkeypatch):
    monkeypatch.setenv("ZMAT_NO_KERNEL", "1")
    ts = spaces["lidocaine"]
    ts.to_xyz(ts.torsions.clone().requires_grad_()).sum().backward()
    assert spy.of("torsions_forward", "torsions_backward") == (0, 0)
