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
    zm.write(path, variables=variables)
    back = ZMatrix.read(path)
    assert back.symbols == zm.symbols
    assert np.array_equal(back.table.refs, zm.table.refs)
    assert torch.equal(back.internal, zm.internal)  # bitwise
    assert (back.title, back.charge, back.multiplicity) == (zm.title, zm.charge, zm.multiplicity)


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
