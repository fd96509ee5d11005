"""The ``zmat`` command line: convert between z-matrices and Cartesian files; build the kernel.

Usage::

    zmat convert molecule.gzmat molecule.xyz     # z-matrix -> any format ASE writes
    zmat convert protein.pdb protein.gzmat       # any format ASE reads -> z-matrix
    zmat convert molecule.xyz -                  # print the z-matrix
    cat molecule.gzmat | zmat convert - out.xyz  # a z-matrix from standard input
    cat molecule.xyz | zmat convert - - --from xyz   # any ASE format from standard input
    python -m zmat convert in out                # the same without the script
    zmat build-kernel                            # compile the CPU kernel ahead, print its path

A file is a z-matrix when its extension is one of ``.gzmat .zmat .gjf .com
.gau`` (or when ``--from``/``--to gzmat`` says so); anything else goes through
``ase.io.read``/``ase.io.write``, which guess the format from the name
(``--from``/``--to`` pass an explicit ASE format). Going to a z-matrix, the
construction table is chosen automatically (see :mod:`zmat.autotable`).
Dummy atoms are kept in z-matrices and dropped from Cartesian files.

Errors (an unknown format, an empty or unreadable file, ``--index`` past the
last structure, a bad z-matrix line) are one line on standard error,
``zmat: error: ...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

from . import __version__, _kernel
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
        "--index",
        type=int,
        default=None,
        help="which structure (0-based; negative from the end) of a multi-structure input ASE reads "
        "(default: the last)",
    )
    c.add_argument("--variables", action="store_true", help="write z-matrix values as a Variables block")
    c.add_argument("--title", help="title line of a written z-matrix")
    c.add_argument("--charge", type=int, help="charge of a written z-matrix")
    c.add_argument("--multiplicity", type=int, help="spin multiplicity of a written z-matrix")
    c.add_argument("--start", type=int, default=0, help="atom (0-based) that starts the z-matrix")
    c.add_argument("--mult", type=float, default=1.0, help="factor on the covalent radii for bonds")
    sub.add_parser(
        "build-kernel",
        help="compile the CPU kernel ahead (images, clusters) and print its path",
        description="Compile zmat's CPU kernel into its cache (ZMAT_KERNEL_DIR, else ~/.cache/zmat) "
        "and print the library's path; exit status 1 if it cannot be built.",
    )
    return p


def _build_kernel() -> int:
    try:
        path = _kernel.build()
    except Exception as error:  # no compiler, a read-only cache...
        print(f"zmat: error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


class _Error(Exception):
    """A problem with the command's input, reported as one line."""


def _read_ase(source, name: str, fmt: str | None, index: int | None):
    """``ase.io.read`` with its errors turned into one-line messages."""
    import ase.io
    from ase.io.formats import UnknownFileTypeError

    try:
        images = ase.io.read(source, format=fmt, index=":")
    except UnknownFileTypeError as err:
        text = str(err)
        if text.startswith("Empty file"):
            raise _Error(f"{name}: the file is empty") from None
        hint = "name it with --from FORMAT (gzmat or an ASE format)"
        raise _Error(f"{name}: unknown file format ({text}); {hint}") from None
    except StopIteration:
        images = []
    if not images:
        raise _Error(f"{name}: no structure found")
    index = -1 if index is None else index
    if not -len(images) <= index < len(images):
        raise _Error(f"{name}: --index {index} is out of range: it holds {len(images)} structure(s)")
    return images[index]


def _check_output_format(path: str, fmt: str | None) -> None:
    """Fail before reading when ASE cannot write ``path``'s format."""
    from ase.io.formats import UnknownFileTypeError, filetype, ioformats

    try:
        name = filetype(path, read=False) if fmt is None else fmt
    except (UnknownFileTypeError, ValueError) as err:
        raise _Error(f"{path}: unknown output format ({err}); name it with --to FORMAT") from None
    if name not in ioformats or not ioformats[name].can_write:
        flag = "--to" if fmt is not None else "the extension"
        raise _Error(f"{path}: ASE cannot write the format {name!r} ({flag}); name one with --to FORMAT")


def _read(args: argparse.Namespace) -> ZMatrix:
    if args.input == "-":  # standard input: a z-matrix, or --from an ASE format
        text = sys.stdin.read()
        if not text.strip():
            raise _Error("standard input is empty")
        if args.in_format is None or _is_zmat("-", args.in_format):
            try:
                return ZMatrix.from_string(text)
            except ValueError as err:
                where = "standard input (read as a z-matrix; --from FORMAT for another)"
                raise _Error(f"{where}: {err}") from None
        atoms = _read_ase(io.StringIO(text), "standard input", args.in_format, args.index)
        return ZMatrix.from_atoms(atoms, start=args.start, mult=args.mult)
    if _is_zmat(args.input, args.in_format):
        return ZMatrix.read(args.input)
    if not Path(args.input).exists():
        raise _Error(f"{args.input}: no such file")
    atoms = _read_ase(args.input, args.input, args.in_format, args.index)
    zm = ZMatrix.from_atoms(atoms, start=args.start, mult=args.mult)
    if not zm.title:
        zm.title = f"{zm.formula} from {Path(args.input).name}"
    return zm


def _convert(args: argparse.Namespace) -> None:
    to_zmat = _is_zmat(args.output, args.out_format)
    if not to_zmat:
        _check_output_format(args.output, args.out_format)
    zm = _read(args)
    if args.title is not None:
        zm.title = args.title
    if args.charge is not None:
        zm.charge = args.charge
    if args.multiplicity is not None:
        zm.multiplicity = args.multiplicity

    if to_zmat:
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
    if args.command == "build-kernel":
        return _build_kernel()
    try:
        if args.command == "convert":
            _convert(args)
    except (_Error, ValueError, OSError, KeyError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"zmat: error: {msg}".splitlines()[0], file=sys.stderr)
        return 2  # as argparse's usage errors
    return 0
