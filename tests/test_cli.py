"""The ``zmat`` command line and ``python -m zmat``."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch

import zmat
from zmat import ZMatrix, rmsd
from zmat.cli import main

DATA = Path(__file__).parent / "data"


def t64(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def test_gzmat_to_xyz_and_back(tmp_path):
    src = DATA / "baker_ts_09.gzmat"
    assert main(["convert", str(src), str(tmp_path / "a.xyz")]) == 0
    xyz = ase.io.read(tmp_path / "a.xyz")
    expected = ZMatrix.read(src).to_atoms()
    assert xyz.get_chemical_symbols() == expected.get_chemical_symbols()  # dummies dropped
    np.testing.assert_allclose(xyz.positions, expected.positions, atol=1e-6)
    assert main(["convert", str(tmp_path / "a.xyz"), str(tmp_path / "b.gzmat"), "--title", "DA"]) == 0
    back = ZMatrix.read(tmp_path / "b.gzmat")
    assert back.title == "DA"
    assert rmsd(back.to_xyz(), t64(xyz.positions)) < 1e-8


def test_ase_formats_and_stdout(tmp_path, capsys):
    assert main(["convert", str(DATA / "cis_platin.xyz"), str(tmp_path / "p.pdb")]) == 0
    assert main(["convert", str(tmp_path / "p.pdb"), "-", "--variables", "--charge", "0"]) == 0
    text = capsys.readouterr().out
    assert "Variables:" in text and text.count("\n") > 11
    zm = ZMatrix.from_string(text)
    ref = ase.io.read(DATA / "cis_platin.xyz")
    assert zm.symbols == ref.get_chemical_symbols()
    assert rmsd(zm.to_xyz(), t64(ref.positions)) < 1e-3  # PDB keeps 3 decimals
    assert main(["convert", str(DATA / "water.xyz"), str(tmp_path / "w.zmat"), "--to", "gzmat"]) == 0
    assert len(ZMatrix.read(tmp_path / "w.zmat")) == 6


def test_errors_are_reported(tmp_path, capsys):
    bad = tmp_path / "bad.gzmat"
    bad.write_text("O\nH 1 0.9\nH 1 0.9 2 ANG\n")
    assert main(["convert", str(bad), str(tmp_path / "x.xyz")]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "ANG" in err
    assert main(["convert", str(tmp_path / "missing.xyz"), "-"]) == 2
    with pytest.raises(SystemExit):
        main(["frobnicate"])


def test_python_dash_m(tmp_path):
    out = tmp_path / "h.xyz"
    res = subprocess.run(
        [sys.executable, "-m", "zmat", "convert", str(DATA / "baker_ts_01.gzmat"), str(out)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert res.returncode == 0, res.stderr
    assert len(ase.io.read(out)) == 3


def test_version_has_one_source(capsys):
    """``zmat --version``, the installed metadata and ``zmat.__version__`` agree (setuptools reads it)."""
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"zmat {zmat.__version__}"
    assert importlib.metadata.version("zmat") == zmat.__version__


_WATER = "3\nwater\nO 0 0 0\nH 0.96 0 0\nH -0.24 0.93 0\n"


@pytest.mark.parametrize(
    "args, stdin, match",
    [
        (["in.unknownext", "out.xyz"], "", r"in.unknownext: unknown file format .*--from"),
        (["w.xyz", "out.weird"], "", r"out.weird: ASE cannot write the format 'weird'.*--to"),
        (["w.xyz", "out.xyz", "--to", "nosuch"], "", r"cannot write the format 'nosuch'"),
        (["empty.xyz", "-"], "", r"empty.xyz: the file is empty"),
        (["w.xyz", "-", "--index", "5"], "", r"--index 5 is out of range: it holds 1 structure"),
        (["w.xyz", "-", "--index", "-2"], "", r"--index -2 is out of range"),
        (["-", "out.xyz"], "", r"standard input is empty"),
        (["-", "out.xyz"], _WATER, r"standard input \(read as a z-matrix; --from FORMAT .*\): line 3"),
        (["missing.xyz", "-"], "", r"missing.xyz: no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, monkeypatch, capsys, args, stdin, match):
    # issue 20: these showed ASE's or StopIteration's tracebacks (exit status 1)
    import io
    import re

    (tmp_path / "w.xyz").write_text(_WATER)
    (tmp_path / "empty.xyz").write_text("")
    (tmp_path / "in.unknownext").write_text("hello\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main(["convert", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zmat: error: ") and re.search(match, err), err


def test_standard_input_z_matrix_and_ase_format(tmp_path, monkeypatch, capsys):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(_WATER))
    assert main(["convert", "-", "-", "--from", "xyz"]) == 0
    text = capsys.readouterr().out
    assert ZMatrix.from_string(text).symbols == ["O", "H", "H"]
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["convert", "-", str(tmp_path / "w.xyz")]) == 0
    back = ase.io.read(tmp_path / "w.xyz")
    assert back.get_chemical_symbols() == ["O", "H", "H"]
    d = back.get_distance(0, 1)
    assert abs(d - 0.96) < 1e-6


def test_build_kernel_is_a_listed_command(capsys, monkeypatch, tmp_path):
    """``zmat --help`` lists ``build-kernel``; it prints the library's path, or one error line and
    exit status 1 when the kernel cannot be built."""
    from zmat import _kernel

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "build-kernel" in capsys.readouterr().out
    monkeypatch.setattr(_kernel, "build", lambda: tmp_path / "zmat_kernel.so")
    assert main(["build-kernel"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "zmat_kernel.so")

    def fail():
        raise RuntimeError("no C++ compiler found (set CXX) and no kernel built ahead")

    monkeypatch.setattr(_kernel, "build", fail)
    assert main(["build-kernel"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == "zmat: error: no C++ compiler found (set CXX) and no kernel built ahead"
    )
