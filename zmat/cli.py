"""The ``zmat`` command line: convert between z-matrices and Cartesian files.

Usage::

    zmat convert molecule.gzmat molecule.xyz     # z-matrix -> any format ASE writes
    zmat convert protein.pdb protein.gzmat       # any format ASE reads -> z-matrix
    zmat convert molecule.xyz -                  # print the z-matrix
    python -m zmat convert in out                # the same without the script

A file is a z-matrix when its extension is one of ``.gzmat .zmat .gjf .com
.gau`` (or when ``--from``/``--to gzmat`` says so); anything else goes through
``ase.io.read``/``ase.io.write``, which guess the format from the name
(``--from``/``--to`` pass an explicit ASE format). Going to a z-matrix, the
construction table is chosen automatically (see :mod:`zmat.autotable`).
Dummy atoms are kept in z-matrices and dropped from Cartesian files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .zmatrix import ZMatrix

__all__ = ["main"]

ZMAT_SUFFIXES = {".gzmat", ".zmat", ".gjf", ".com", ".gau"}
ZMAT_FORMATS = {"gzmat", "zmat", "gaussian-zmat"}


def _is_zmat(path: str, fmt: str | None) -> bool:
    if fmt is not None:
        return fmt.lower() in ZMAT_FORMATS
    return path == "-" or Path(path).suffix.lower() in ZMAT_SUFFIXES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zmat", description="Convert between z-matrices and Cartesian coordinate files."
    )
    p.add_argument("--version", action="version", version=f"zmat {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser(
        "convert",
        help="convert a file (z-matrix <-> any format ASE reads or writes)",
        description="Convert IN to OUT. Use '-' as OUT to print a z-matrix.",
    )
    c.add_argument("input", help="input file (.gzmat/.zmat/.gjf/.com/.gau, or anything ASE reads)")
    c.add_argument("output", help="output file, or '-' for a z-matrix on standard output")
    c.add_argument("--from", dest="in_format", help="input format: 'gzmat' or an ASE format name")
    c.add_argument("--to", dest="out_format", help="output format: 'gzmat' or an ASE format name")
    c.add_argument(
        "--index", default=None, help="which structure of a multi-structure input ASE reads (default: ASE's)"
    )
    c.add_argument("--variables", action="store_true", help="write z-matrix values as a Variables block")
    c.add_argument("--title", help="title line of a written z-matrix")
    c.add_argument("--charge", type=int, help="charge of a written z-matrix")
    c.add_argument("--multiplicity", type=int, help="spin multiplicity of a written z-matrix")
    c.add_argument("--start", type=int, default=0, help="atom (0-based) that starts the z-matrix")
    c.add_argument("--mult", type=float, default=1.0, help="factor on the covalent radii for bonds")
    return p


def _convert(args: argparse.Namespace) -> None:
    if _is_zmat(args.input, args.in_format) and args.input != "-":
        zm = ZMatrix.read(args.input)
    else:
        import ase.io

        kwargs = {} if args.index is None else {"index": int(args.index)}
        atoms = ase.io.read(args.input, format=args.in_format, **kwargs)
        zm = ZMatrix.from_atoms(atoms, start=args.start, mult=args.mult)
        if not zm.title:
            zm.title = f"{zm.formula} from {Path(args.input).name}"
    if args.title is not None:
        zm.title = args.title
    if args.charge is not None:
        zm.charge = args.charge
    if args.multiplicity is not None:
        zm.multiplicity = args.multiplicity

    if _is_zmat(args.output, args.out_format):
        text = zm.to_string(variables=args.variables)
        if args.output == "-":
            sys.stdout.write(text)
        else:
            Path(args.output).write_text(text, encoding="utf-8")
    else:
        import ase.io

        ase.io.write(args.output, zm.to_atoms(), format=args.out_format)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``zmat`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "convert":
            _convert(args)
    except (ValueError, OSError, KeyError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"zmat: error: {msg}", file=sys.stderr)
        return 1
    return 0
