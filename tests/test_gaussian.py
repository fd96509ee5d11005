"""zmat.gaussian: Gaussian-style z-matrix text <-> plain data (no ZMatrix, no torch)."""

import ast
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from ase.io.zmatrix import parse_zmatrix

import zmat
from zmat.gaussian import GaussianZMatrix, _angle_str, _deg_to_rad, construction_order, parse, read, to_string

DATA = Path(__file__).parent / "data"
BAKER = ["01", "02", "04", "09", "12", "17", "18", "19"]


def _xyz(zm: GaussianZMatrix) -> np.ndarray:
    return zmat.to_xyz(torch.from_numpy(zm.values), zm.refs).numpy()


def test_module_imports_neither_torch_nor_zmatrix():
    tree = ast.parse(Path(zmat.gaussian.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.startswith("torch") or "zmatrix" in m or m in ("table", "transform")]


@pytest.mark.parametrize("nn", BAKER)
def test_plain_data_matches_ase_and_round_trips_bitwise(nn):
    """Values against ASE's placement (measured back with to_internal), then write -> parse."""
    zm = read(DATA / f"baker_ts_{nn}.gzmat")
    assert isinstance(zm.values, np.ndarray) and zm.refs.dtype == np.int64
    # the baker files list rows in construction order: ASE reads the same z-matrix lines
    text = (DATA / f"baker_ts_{nn}.gzmat").read_text()
    lines = text.splitlines()
    start = next(k for k, ln in enumerate(lines) if re.fullmatch(r"0\s+1", ln.strip())) + 1
    stop = next(k for k, ln in enumerate(lines) if "Variables" in ln)
    defs = dict(re.split(r"\s*=\s*|\s+", ln.strip()) for ln in lines[stop + 1 :] if ln.strip())
    ase_xyz = parse_zmatrix(lines[start:stop], defs={k: float(v) for k, v in defs.items()}).positions
    measured = zmat.to_internal(torch.as_tensor(ase_xyz), zm.refs).numpy()
    real = [s != "X" for s in zm.symbols]
    diff = np.remainder(measured - zm.values + math.pi, 2 * math.pi) - math.pi
    assert np.abs(diff[real]).max() < 1e-9
    for variables in (False, True):
        back = parse(to_string(zm, variables=variables))
        assert back.symbols == zm.symbols and np.array_equal(back.refs, zm.refs)
        assert np.array_equal(back.values, zm.values)  # bitwise


def test_zmat_order_comment_restores_rows_and_their_variable_names():
    refs = np.array([[1, -1, -1], [-1, -1, -1], [1, 0, -1]])  # row 0 refers to the later row 1
    zm = GaussianZMatrix(["H", "O", "H"], refs, np.array([[0.96, 0, 0], [0, 0, 0], [0.96, 1.8, 0]]))
    text = to_string(zm, variables=True, decimals=None)  # bitwise
    assert text.startswith("! zmat-order: 2 1 3\n")
    back = parse(text)
    assert back.symbols == zm.symbols and np.array_equal(back.refs, refs)
    assert np.array_equal(back.values, zm.values)
    assert back.variables == [["R2"], [], ["R3", "A3"]]  # named after the written lines


def test_construction_order_and_cycles():
    assert construction_order(np.array([[2, -1, -1], [-1, -1, -1], [1, -1, -1]])) == [1, 2, 0]
    with pytest.raises(ValueError, match=r"rows \[0, 1\] form a cycle"):
        construction_order(np.array([[1, -1, -1], [0, -1, -1]]))


def test_angle_strings_are_short_and_exact():
    assert _angle_str(_deg_to_rad("109.5")) == "109.5"
    assert _angle_str(-math.pi / 2) == "-90.0"
    g = torch.Generator().manual_seed(0)
    for x in (torch.rand(2000, generator=g, dtype=torch.float64) * 2 * math.pi - math.pi).tolist():
        assert _deg_to_rad(_angle_str(x)) == x


# ------------------------------------------------------------ parser
FULL = """%chk=foo.chk
%mem=1GB
# opt b3lyp/6-31g(d)
  units=angstrom

Title line one
title two

0,1
O1
H2, O1, ROH
H3  O1  ROH  H2  AHOH  ! a comment
X4  1   1.0D0  2  90.  3  0.0
C5  1   1.5  4   -AX  2  +DX  0

Variables:
ROH=0.96
AHOH 104.5
Constants:
AX = 95.0
DX   120.5

--Link1--
"""


def test_parser_reads_gaussian_input_features():
    zm = parse(FULL)
    assert zm.symbols == ["O", "H", "H", "X", "C"]
    assert zm.title == "Title line one title two" and (zm.charge, zm.multiplicity) == (0, 1)
    assert zm.refs.tolist() == [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [0, 1, 2], [0, 3, 1]]
    assert zm.variables == [[], ["ROH"], ["ROH", "AHOH"], [None, None, None], [None, "-AX", "+DX"]]
    expected = np.array([1.5, math.radians(-95.0), math.radians(120.5)])
    np.testing.assert_allclose(zm.values[4], expected, rtol=1e-15, atol=0)
    ref = parse_zmatrix(
        ["O1", "H2 O1 ROH", "H3 O1 ROH H2 AHOH", "X4 1 1.0 2 90. 3 0.0", "C5 1 1.5 4 -AX 2 DX"],
        defs={"ROH": 0.96, "AHOH": 104.5, "AX": 95.0, "DX": 120.5},
    )
    np.testing.assert_allclose(_xyz(zm), ref.positions, atol=1e-12)


def test_parser_bare_zmatrix_and_blank_line_variables():
    bare = parse("O\nH 1 R\nH 1 R 2 A\n\nR 0.96\nA=104.5\n")
    assert bare.title == "" and bare.charge == 0
    with_charge = parse("1 2\nO\nH 1 0.96\nH 1 0.96 2 104.5\n")
    assert (with_charge.charge, with_charge.multiplicity) == (1, 2)
    assert np.array_equal(bare.values, with_charge.values)
    ref = parse_zmatrix("O\nH 1 0.96\nH 1 0.96 2 104.5")
    np.testing.assert_allclose(_xyz(bare), ref.positions, atol=1e-12)


def test_parser_units_and_atomic_numbers():
    zm = parse("# hf units=(au,rad)\n\nt\n\n0 1\n8\n1 1 1.0\n1 1 1.0 2 1.5\n")
    assert zm.symbols == ["O", "H", "H"]
    assert zm.values[1, 0] == pytest.approx(0.52917721092)
    assert zm.values[2, 1] == 1.5


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("O\nH 1 0.9\nH 1 0.9 2 R\n", 3, "unknown variable 'R'"),
        ("O\nH 1 0.9\nH 1 0.9 2 -AX\n", 3, "unknown variable 'AX'"),
        ("O\nH 2 0.9\n", 2, "refers to itself"),
        ("O\nH 1 0.9\nH 3 0.9 1 90\n", 3, "refers to itself"),
        ("O\nH 1 0.9\nH 4 0.9 1 90\n", 3, "earlier line"),
        ("O\nH 1 0.9\nH 1 0.9 1 90\n", 3, "used twice"),
        ("O\nH 1 0.9 3\n", 2, "expected 1, 3, 5 or 7 fields"),
        ("O\nH 1 -0.9\n", 2, "negative bond length"),
        ("O\nH 1 abc!\n", 2, "unknown variable"),
        ("O\nH Q 0.9\n", 2, "not the label of an earlier atom"),
        ("O\nH 0 1 2 3\n", 2, "Cartesian"),
        ("O 0.0 0.0 0.0\n", 1, "Cartesian"),
        ("Qz\n", 1, "unknown element"),
        ("Bq\n", 1, "ghost"),
        ("C1\nC1 1 1.5\nH 1 1.0 C1 90\n", 3, "ambiguous"),
        ("O\nH 1 0.9\nH 1 0.9 2 90 1 0 1\n", 3, "two-angle form"),
        ("O\nH 1 R\n\nR 1.0 2.0\n", 4, "variable definition"),
        ("O\nH 1 R\nVariables:\nR=1\nR=2\n", 5, "defined twice"),
        ("O\nH 1 R\nVariables:\nR=x1\n", 4, "not a number"),
        ("# hf\n\ntitle\n\nO\nH 1 1.0\n", 5, "charge and multiplicity"),
        # issue 31: one sign at most
        ("O\nH 1 0.9\nH 1 0.9 2 --A\n\nA= 90\n", 3, "at most one sign"),
        ("O\nH 1 0.9\nH 1 0.9 2 +-A\n\nA= 90\n", 3, "at most one sign"),
    ],
)
def test_malformed_input_names_the_line(text, line, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)) as info:
        parse(text)
    msg = str(info.value)
    assert msg.startswith(f"line {line}:")
    offending = text.splitlines()[line - 1].rstrip()
    assert repr(offending) in msg


def test_missing_sections_raise():
    with pytest.raises(ValueError, match="no z-matrix"):
        parse("\n\n")
    with pytest.raises(ValueError, match="title"):
        parse("# hf\n\n")


def test_route_and_constants_are_written_back():
    """Issue 31: the route line was written as '#', a Constants: section as Variables:."""
    text = "%chk=a.chk\n#P HF/6-31G(d) Opt Units=(Bohr,Rad)\n\ntitle\n\n0 1\nC\nC 1 R\nC 2 R 1 A\n"
    zm = parse(text + "  Variables:\nR= 2.8\n  Constants:\nA= 1.9\n")
    assert zm.route == "#P HF/6-31G(d) Opt Units=(Bohr,Rad)" and zm.constants == {"A"}
    out = to_string(zm, variables=True)
    assert out.splitlines()[0] == "#P HF/6-31G(d) Opt"  # values are written in Angstrom and degrees
    assert out.split("Constants:")[1].split() == ["A=", _angle_str(zm.values[2, 1], 10)]
    assert "A=" not in out.split("Constants:")[0]
    back = parse(out)
    assert back.constants == {"A"} and back.route == "#P HF/6-31G(d) Opt"
    np.testing.assert_allclose(back.values, zm.values, atol=1e-9)
    z = zmat.ZMatrix.from_string("C\nC 1 R\nC 2 R 1 A\n  Variables:\nR= 1.5\n  Constants:\nA= 109.5")
    assert z.constants == ("A",) and z.copy().constants == ("A",)
    assert "Constants:\nA= 109.5" in z.to_string() and "Constants" not in parse(to_string(parse("C\n"))).route
    with pytest.raises(ValueError, match="constant 'B' is not one of the variables"):
        zmat.ZMatrix(z.symbols, z.internal, z.table, variables=z.variable_uses, constants=["B"])


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("O\nH 1 0.9\nH 1 0.9 2 190.0\n", 3, "bond angle 190 degrees (3.316125579 rad) is outside [0, 180]"),
        ("O\nH 1 0.9\nH 1 0.9 2 -A\n\nA= 90\n", 3, "bond angle -90 degrees"),
        ("# hf units=rad\n\nt\n\n0 1\nO\nH 1 0.9\nH 1 0.9 2 3.5\n", 8, "(3.5 rad) is outside"),
        ("! zmat-order: 2 1 3\nO\nH 1 0.9\nH 1 0.9 2 200\n", 4, "(row 2): bond angle 200 degrees"),
    ],
)
def test_zmatrix_from_a_file_names_the_line_of_a_bad_angle(text, line, fragment):
    """Issue 31: an angle beyond 180 degrees in a file got the constructor's advice about radians."""
    with pytest.raises(ValueError, match=re.escape(fragment)) as info:
        zmat.ZMatrix.from_string(text)
    assert str(info.value).startswith(f"line {line} ") and "radians" not in str(info.value)
