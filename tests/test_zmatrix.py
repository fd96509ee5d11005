"""ZMatrix: Gaussian z-matrix read/write through ZMatrix, ASE round trips."""

import importlib.util
import math
import re
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from ase.io.zmatrix import parse_zmatrix

import zmat
from zmat import ZMatrix, rmsd

DATA = Path(__file__).parent / "data"
BAKER = ["01", "02", "04", "09", "12", "17", "18", "19"]
XYZ = [
    "water",
    "peroxide",
    "cyclohexane_chair",
    "cis_platin",
    "ruthenium",
    "nasty_cube",
    "temp_lig",
    "MIL53_small",
    "MIL53_middle",
    "Cd_lattice",
]


def t64(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def baker_for_ase(path):
    """(z-matrix lines, variable dict) of a baker gzmat, split by hand for ASE."""
    lines = path.read_text().splitlines()
    start = next(k for k, ln in enumerate(lines) if re.fullmatch(r"0\s+1", ln.strip())) + 1
    stop = next(k for k, ln in enumerate(lines) if "Variables" in ln)
    defs = {}
    for ln in lines[stop + 1 :]:
        if ln.strip():
            name, value = re.split(r"\s*=\s*|\s+", ln.strip())
            defs[name] = float(value)
    return lines[start:stop], defs


# ------------------------------------------------------------ real files
@pytest.mark.parametrize("nn", BAKER)
def test_gzmat_reproduces_open_babel_reference(nn):
    zm = ZMatrix.read(DATA / f"baker_ts_{nn}.gzmat")
    ref = ase.io.read(DATA / f"baker_ts_{nn}.xyz")
    atoms = zm.to_atoms()
    assert atoms.get_chemical_symbols() == ref.get_chemical_symbols()
    # reference has 5 decimals: 4.1e-6 A is the rounding floor
    assert rmsd(t64(atoms.positions), t64(ref.positions)) < 1e-5


@pytest.mark.parametrize("nn", ["09", "12", "17", "18"])
def test_gzmat_dihedral_sign_is_iupac(nn):
    """Flipping every dihedral builds the mirror image, which does not superpose."""
    zm = ZMatrix.read(DATA / f"baker_ts_{nn}.gzmat")
    ref = t64(ase.io.read(DATA / f"baker_ts_{nn}.xyz").positions)
    flipped = zm.internal * torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    mirror = zm.to_xyz(flipped)[torch.as_tensor(~zm.dummy_mask)]
    assert rmsd(mirror, ref) > 0.5


@pytest.mark.parametrize("nn", BAKER)
def test_gzmat_matches_ase_parse_zmatrix_exactly(nn):
    path = DATA / f"baker_ts_{nn}.gzmat"
    lines, defs = baker_for_ase(path)
    ref = parse_zmatrix(lines, defs=defs)  # dummies kept, same frame
    zm = ZMatrix.read(path)
    assert ref.get_chemical_symbols() == zm.symbols
    np.testing.assert_allclose(zm.to_xyz().numpy(), ref.positions, rtol=0, atol=1e-12)


def test_dummies_kept_in_zmatrix_and_dropped_by_to_atoms():
    zm = ZMatrix.read(DATA / "baker_ts_09.gzmat")
    assert zm.symbols[:4] == ["X"] * 4 and "X" not in zm.symbols[4:]
    assert len(zm) == 20 and zm.internal.shape == (20, 3) and zm.table.n_atoms == 20
    atoms = zm.to_atoms()
    assert len(atoms) == 16 and "X" not in atoms.get_chemical_symbols()
    # the first real atom is placed from dummies only, away from the origin
    assert np.linalg.norm(atoms.positions[0]) > 0.5
    np.testing.assert_array_equal(atoms.positions, zm.to_xyz().numpy()[4:])


@pytest.mark.parametrize("name", XYZ)
def test_xyz_roundtrip_through_zmatrix(name):
    atoms = ase.io.read(DATA / f"{name}.xyz")
    zm = ZMatrix.from_atoms(atoms)
    assert zm.symbols == atoms.get_chemical_symbols()  # input order kept, dummies too
    xyz = zm.to_xyz()
    assert torch.isfinite(zm.internal).all()
    assert rmsd(xyz, t64(atoms.positions)) < 1e-8
    back = zm.to_atoms()
    real = [s != "X" for s in atoms.get_chemical_symbols()]
    assert back.get_chemical_symbols() == [
        s for s, k in zip(atoms.get_chemical_symbols(), real, strict=True) if k
    ]


@pytest.mark.parametrize("variables", [False, True])
@pytest.mark.parametrize("source", [f"baker_ts_{nn}.gzmat" for nn in BAKER] + [f"{n}.xyz" for n in XYZ])
def test_write_read_is_lossless(tmp_path, source, variables):
    if source.endswith(".gzmat"):
        zm = ZMatrix.read(DATA / source)
    else:
        zm = ZMatrix.from_atoms(ase.io.read(DATA / source))
        zm.title, zm.charge, zm.multiplicity = "a title", -1, 2
    path = tmp_path / "out.gzmat"
    zm.write(path, variables=variables, decimals=None)
    back = ZMatrix.read(path)
    assert back.symbols == zm.symbols
    assert np.array_equal(back.table.refs, zm.table.refs)
    assert torch.equal(back.internal, zm.internal)  # bitwise
    assert (back.title, back.charge, back.multiplicity) == (zm.title, zm.charge, zm.multiplicity)
    if source.endswith(".gzmat") and variables:
        assert back.variable_uses == zm.variable_uses and back.variables == zm.variables


def test_written_file_is_gaussian_ordered_and_ase_readable():
    """A table pointing forward is written in construction order; ASE reads the result."""
    atoms = ase.io.read(DATA / "water.xyz")
    zm = ZMatrix.from_atoms(atoms, start=3)
    assert (zm.table.refs[:3] > np.arange(3)[:, None]).any()  # points forward
    text = zm.to_string()
    assert text.startswith("! zmat-order:")
    body = text.split("\n\n")[2].splitlines()[1:]  # after the charge line
    ref = parse_zmatrix(body)
    order = [int(t) - 1 for t in text.splitlines()[0].split(":")[1].split()]
    assert rmsd(t64(ref.positions), t64(atoms.positions[order])) < 1e-10


def test_from_string_errors_come_from_the_parser():
    with pytest.raises(ValueError, match=r"^line 2: reference 0 \(Cartesian"):
        ZMatrix.from_string("O\nH 0 1 2 3\n")


def test_constructor_validates_and_batches():
    with pytest.raises(ValueError, match="symbols"):
        ZMatrix(["O"], torch.zeros(2, 3), [[-1, -1, -1], [0, -1, -1]])
    with pytest.raises(ValueError, match="shape"):
        ZMatrix(["O", "H"], torch.zeros(3, 3), [[-1, -1, -1], [0, -1, -1]])
    zm = ZMatrix.read(DATA / "baker_ts_12.gzmat")
    batch = zm.internal.expand(4, -1, -1).clone().requires_grad_(True)
    xyz = zm.to_xyz(batch)
    assert xyz.shape == (4, 8, 3)
    xyz.sum().backward()
    assert torch.isfinite(batch.grad).all()
    assert "C2H6" in repr(zm)
    assert zmat.ZMatrix is ZMatrix and "ZMatrix" in zmat.__all__


def test_from_atoms_with_explicit_table():
    atoms = ase.io.read(DATA / "peroxide.xyz")
    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]]
    zm = ZMatrix.from_atoms(atoms, table=table)
    assert zm.internal[3, 2].item() == pytest.approx(math.pi)
    with pytest.raises(TypeError):
        ZMatrix.from_atoms(atoms, table=table, start=1)


# ------------------------------------------------------------ variables, look-up, precision
def test_gaussian_variables_are_kept_with_names_signs_and_rows():
    zm = ZMatrix.read(DATA / "baker_ts_09.gzmat")
    assert zm.variable_uses["D1"] == [(10, 2, 1), (11, 2, -1)]  # "D1" and "-D1"
    assert zm.variable_uses["L3"] == [(4, 0, 1), (5, 0, 1)]
    assert zm.variables["D1"] == pytest.approx(math.radians(175.0), abs=1e-15)
    assert zm.internal[11, 2] == -zm.internal[10, 2]
    assert torch.equal(zm.internal_from_variables(zm.variable_values()), zm.internal)
    batch = zm.variable_values() + torch.arange(3.0, dtype=torch.float64)[:, None] / 10  # (3, V)
    c = zm.internal_from_variables(batch)
    assert c.shape == (3, len(zm), 3) and torch.equal(c[:, 11, 2], -c[:, 10, 2])
    assert torch.equal(c[:, 4, 0], c[:, 5, 0]) and torch.equal(c[:, 0], zm.internal[0].expand(3, 3))
    text = zm.to_string()  # written back with the file's names and signs, literals inline
    assert re.search(r"^H\s+8\s+L6\s+5\s+A2\s+1\s+-D1$", text, re.M) and "D1= 175.0" in text


def _repulsion(zm, c):
    x = zm.to_xyz(c)[torch.as_tensor(~zm.dummy_mask)]
    return ((x[:, None] - x[None]).norm(dim=-1) + torch.eye(len(x))).log().sum()


def test_gradient_to_shared_variables_matches_finite_differences():
    """dE/d(variable) sums sign * dE/dC over the rows that use it."""
    zm = ZMatrix.read(DATA / "baker_ts_09.gzmat")

    def energy(v):
        return _repulsion(zm, zm.internal_from_variables(v))

    v = zm.variable_values().requires_grad_(True)
    (g,) = torch.autograd.grad(energy(v), v)
    h = 1e-6
    eye = torch.eye(len(v), dtype=v.dtype)
    fd = torch.stack([(energy(v + h * e) - energy(v - h * e)) / (2 * h) for e in eye]).detach()
    assert torch.allclose(g, fd, atol=1e-7, rtol=1e-7) and g.abs().min() > 1e-6
    c = zm.internal.clone().requires_grad_(True)
    (gc,) = torch.autograd.grad(_repulsion(zm, c), c)
    assert torch.allclose(zm.variable_gradient(gc), g, atol=1e-12)
    k = list(zm.variable_uses).index("D1")
    assert torch.allclose(g[k], gc[10, 2] - gc[11, 2], atol=1e-12)  # -D1 enters with its sign


def test_invalid_variables_raise():
    refs = [[-1, -1, -1], [0, -1, -1], [0, 1, -1]]
    c = torch.tensor([[0, 0, 0], [0.96, 0, 0], [0.96, 1.8, 0]], dtype=torch.float64)
    ZMatrix(["O", "H", "H"], c, refs, variables={"ROH": [(1, 0, 1), (2, 0, 1)]})
    with pytest.raises(ValueError, match="reference present"):
        ZMatrix(["O", "H", "H"], c, refs, variables={"A": [(1, 1, 1)]})
    with pytest.raises(ValueError, match="length and an angle"):
        ZMatrix(["O", "H", "H"], c, refs, variables={"X": [(1, 0, 1), (2, 1, 1)]})
    with pytest.raises(ValueError, match="different values in rows 1 and 2"):
        ZMatrix(
            ["O", "H", "H"],
            c * torch.tensor([[1], [1], [1.1]]),
            refs,
            variables={"ROH": [(1, 0, 1), (2, 0, 1)]},
        )
    zm = ZMatrix.read(DATA / "baker_ts_09.gzmat")
    zm.internal[11, 2] = 0.5  # one use of D1 edited by hand
    with pytest.raises(ValueError, match="variable 'D1'"):
        zm.to_string()
    assert "D1" not in zm.to_string(variables=False)


def test_find_looks_up_a_row_by_its_atoms():
    zm = ZMatrix.from_atoms(ase.io.read(DATA / "cyclohexane_chair.xyz"))
    refs = zm.table.refs
    for i, (b, a, d) in enumerate(refs.tolist()):
        if d >= 0:
            assert zm.find(i, b, a, d) == zm.find(d, a, b, i) == zm.find(np.array([d, a, b, i])) == (i, 2)
            assert zm.find(i, b, a) == zm.find(a, b, i) == (i, 1) and zm.find(b, i) == (i, 0)
    i, (b, a, d) = 3, refs[3].tolist()
    with pytest.raises(ValueError, match=f"no row holds the dihedral {i}-{a}-{b}-{d}"):
        zm.find(i, a, b, d)
    with pytest.raises(ValueError, match="2, 3 or 4 atoms"):
        zm.find(1)
    # issue 31: -1 matched row 0's missing bond reference; 0.5 was truncated to 0
    for bad, atom in (((-1, 0), -1), ((0, -1), -1), ((len(zm), 0), len(zm))):
        with pytest.raises(ValueError, match=f"atom {atom} is out of range"):
            zm.find(*bad)
    for bad in ((0.5, 1), (True, 1), ("1", 0)):
        with pytest.raises(TypeError, match="atom indices must be integers"):
            zm.find(*bad)
    assert zm.find(torch.tensor(1), np.int64(0)) == (1, 0)


def test_written_values_have_a_sane_precision():
    """At most 10 digits after the point by default (angles used to take up to 25 digits)."""
    for name in ("cyclohexane_chair", "temp_lig", "peroxide"):
        zm = ZMatrix.from_atoms(ase.io.read(DATA / f"{name}.xyz"))
        text = zm.to_string()
        body = [ln.split()[2::2] for ln in text.split("\n\n")[2].splitlines()[1:]]
        assert max(len(v.partition(".")[2]) for vals in body for v in vals) <= 10, name
        back = ZMatrix.from_string(text)
        assert (back.internal - zm.internal).abs().max() < 1e-10
        assert "109.5" in ZMatrix.from_string("O\nH 1 0.96\nH 1 0.96 2 109.5").to_string()


def test_bond_angles_in_degrees_are_refused():
    refs = [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [2, 0, 1]]
    c = torch.tensor([[0, 0, 0], [0.96, 0, 0], [0.96, 104.5, 0], [1.0, 1.9, 0]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"row 2: bond angle 104.5 is outside \[0, pi\]: zmat takes radians"):
        ZMatrix(["O", "H", "H", "H"], c, refs)
    c[2, 1] = 1.8
    c[3, 2] = 120.0
    with pytest.warns(UserWarning, match="row 3: dihedral 120 is beyond 2 pi"):
        ZMatrix(["O", "H", "H", "H"], c, refs)
    c[3, 2] = -math.pi
    ZMatrix(["O", "H", "H", "H"], c, refs)  # exactly pi and [0, pi] are fine


# ------------------------------------------------------------ example
def test_geometry_optimisation_example_runs(capsys):
    path = Path(__file__).parents[1] / "examples" / "geometry_optimisation.py"
    spec = importlib.util.spec_from_file_location("geometry_optimisation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--scan-points", "3", "--steps", "100"])
    out = capsys.readouterr().out
    phi = float(re.search(r"optimised H-O-O-H dihedral: ([\d.]+) deg", out).group(1))
    assert 105 < phi < 117  # the toy force field's skewed minimum
    m = re.search(r"Cartesian minimum: (\S+) A", out)
    assert float(m.group(1)) < 1e-3
