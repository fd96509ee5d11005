"""zmat.ase: an ASE calculator's energy and gradient in internal coordinates, against finite differences."""

from pathlib import Path

import ase.io
import pytest
import torch
from ase.calculators.emt import EMT

import zmat
from zmat.ase import InternalEnergy, potential_energy

DATA = Path(__file__).parent / "data"


def _central_differences(f, x: torch.Tensor, where: torch.Tensor, h: float = 1e-5) -> torch.Tensor:
    out = torch.zeros_like(x)
    for k in torch.nonzero(where.reshape(-1)).reshape(-1).tolist():
        e = torch.zeros_like(x).reshape(-1)
        e[k] = h
        out.reshape(-1)[k] = (f(x + e.view_as(x)) - f(x - e.view_as(x))) / (2 * h)
    return out


def test_internal_gradient_matches_finite_differences():
    atoms = ase.io.read(DATA / "peroxide.xyz")
    atoms.rattle(0.05, seed=1)
    zm = zmat.ZMatrix.from_atoms(atoms)
    energy = InternalEnergy(zm, EMT())
    e, g = energy.energy_and_gradient()
    present = torch.as_tensor(zm.table.refs >= 0)
    fd = _central_differences(lambda c: float(energy(c).detach()), zm.internal, present)
    assert e == pytest.approx(float(energy()))
    assert torch.allclose(g, fd, atol=1e-6) and g.abs().max() > 1e-2
    assert (g[~present] == 0).all()


def test_constrained_atoms_keep_the_calculators_gradient():
    """An ASE constraint (FixAtoms zeroes the fixed atom's forces) does not change dE/dC (issue 31)."""
    from ase.constraints import FixAtoms, Hookean

    text = "C\nC 1 1.5\nC 2 1.5 1 109.5\nC 3 1.5 2 109.5 1 60.0\nC 4 1.5 3 109.5 2 -60.0"
    zm = zmat.ZMatrix.from_string(text)
    present = torch.as_tensor(zm.table.refs >= 0)
    for constraint in (FixAtoms(indices=[4]), Hookean(a1=0, a2=4, rt=1.0, k=5.0)):
        atoms = zm.to_atoms()
        atoms.set_constraint(constraint)
        energy = InternalEnergy(zm, EMT(), atoms=atoms)
        _, g = energy.energy_and_gradient()
        fd = _central_differences(lambda c, e=energy: float(e(c).detach()), zm.internal, present, h=1e-6)
        assert torch.allclose(g, fd, atol=1e-5) and g[4, 0].abs() > 1.0


def test_gradient_to_shared_variables_with_dummies():
    """baker_ts_09: dummy atoms, shared lengths and dihedrals used as D and -D."""
    zm = zmat.ZMatrix.read(DATA / "baker_ts_09.gzmat")
    energy = InternalEnergy(zm, EMT())
    v = zm.variable_values().requires_grad_(True)
    (g,) = torch.autograd.grad(energy.of_variables(v), v)
    fd = _central_differences(
        lambda x: float(energy.of_variables(x).detach()), v.detach(), torch.ones_like(v, dtype=bool)
    )
    assert torch.allclose(g, fd, atol=1e-6) and g.abs().max() > 1e-2
    _, gc = energy.energy_and_gradient()
    assert torch.allclose(zm.variable_gradient(gc), g, atol=1e-12)


def test_potential_energy_backward_is_minus_the_forces():
    atoms = ase.io.read(DATA / "water.xyz")
    atoms.calc = EMT()
    x = torch.as_tensor(atoms.positions).requires_grad_(True)
    e = potential_energy(x, atoms)
    e.backward()
    assert e.item() == pytest.approx(atoms.get_potential_energy())
    assert torch.allclose(x.grad, -torch.as_tensor(atoms.get_forces()))


def test_bad_input_raises():
    zm = zmat.ZMatrix.read(DATA / "baker_ts_09.gzmat")
    with pytest.raises(ValueError, match="no calculator"):
        InternalEnergy(zm)
    with pytest.raises(ValueError, match="real"):
        InternalEnergy(zm, EMT(), atoms=ase.io.read(DATA / "water.xyz"))
    energy = InternalEnergy(zm, EMT())
    with pytest.raises(ValueError, match="one structure per call"):
        energy(zm.internal.expand(2, -1, -1))
    atoms = ase.io.read(DATA / "water.xyz")
    with pytest.raises(ValueError, match="no calculator"):
        potential_energy(torch.as_tensor(atoms.positions), atoms)
    atoms.calc = EMT()
    with pytest.raises(ValueError, match=rf"shape \({len(atoms)}, 3\)"):
        potential_energy(torch.zeros(len(atoms) + 1, 3), atoms)
