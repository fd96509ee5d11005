"""The :class:`ZMatrix` class: symbols + internal coordinates + construction table,
with Gaussian-style z-matrix input and output.

File format (read)
------------------
A Gaussian input file, or just its molecule specification:

* optional Link 0 lines (``%chk=...``) and a route section (lines starting with
  ``#``, up to a blank line). When there is a route section, a title section
  (up to a blank line) and a charge/multiplicity line follow, as in Gaussian.
  Without a route section the file is a bare z-matrix, optionally preceded by a
  charge/multiplicity line (a line of integers).
* ``!`` starts a comment; lines that are only a comment are ignored.
* z-matrix lines ``El [ref r [ref angle [ref dihedral [0]]]]``, fields separated
  by blanks or commas. ``El`` is an element symbol, optionally followed by a
  label (``C1``, ``H12``), or an atomic number; ``X`` (or ``Xn``) is a dummy
  atom. References are 1-based line numbers or atom labels and must point to
  earlier lines. Values are numbers (Fortran ``1.0D0`` too), variable names, or
  negated variable names (``-D1``). Angles are in degrees and lengths in
  Angstrom, unless the route says ``Units=Bohr``/``AU`` or ``Units=Rad``.
  Cartesian lines and the two-angle form (final flag ``1``/``-1``) are not
  supported. A row with fewer references than ``min(line, 3)`` is a zmat
  extension (a new root or a partial row in a forest); Gaussian rejects it.
* variables after a ``Variables:`` (or ``Constants:``) line, or after the blank
  line that ends the z-matrix: ``NAME= value``, ``NAME=value`` or
  ``NAME value``, up to the next blank line. Anything after that (basis sets,
  further sections) is ignored.

Any error names the line number and quotes the line.

Placement follows ``zmat.to_xyz`` (and hence ``ase.io.zmatrix.parse_zmatrix``):
first atom at the origin, second on ``+x``, third in the ``xy``-plane on the
``+y`` side, dihedrals with the IUPAC sign.

File format (write)
-------------------
Rows are written in construction order (every reference on an earlier line, as
Gaussian requires), references as 1-based line numbers, values as plain numbers
(or, with ``variables=True``, as variables ``R<k>``, ``A<k>``, ``D<k>``). Lengths
are written with ``repr`` and angles as the shortest decimal that reads back to
the same radian value, so ``write`` -> ``read`` is bitwise lossless. When the
table's rows are not in construction order (as after :meth:`ZMatrix.from_atoms`,
which keeps the input atom order), a comment line ``! zmat-order: ...`` records
the row each written line came from (20 numbers per line, 1-based);
:meth:`ZMatrix.read` puts the rows back in that order (other programs ignore
the comment).
"""

from __future__ import annotations

import decimal
import heapq
import math
import os
import re
from collections.abc import Sequence

import numpy as np
import torch

from .table import ConstructionTable, as_table
from .transform import to_internal, to_xyz

__all__ = ["ZMatrix"]

_DEG = math.pi / 180.0
# Degrees are converted exactly (correctly rounded from the decimal text), so
# that every radian value has a decimal degree string that reads back to it.
_CTX = decimal.Context(prec=50)
_PI_OVER_180 = _CTX.divide(decimal.Decimal("3.14159265358979323846264338327950288419716939937510"), 180)
_BOHR = 0.52917721092  # Angstrom, the value Gaussian 09/16 use

_ORDER_RE = re.compile(r"^\s*!\s*zmat-order:\s*(.*)$", re.IGNORECASE)
_HEADER_RE = re.compile(r"^\s*(variables|constants)\s*:?\s*$", re.IGNORECASE)
_VAR_RE = re.compile(r"^\s*([^\s=,]+)\s*(?:=|\s|,)\s*([^\s=,]+)\s*$")
_FORTRAN_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[dD][+-]?\d+$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.']*$")


class ZMatrix:
    """A molecule in internal coordinates.

    Attributes:
        symbols: list of ``N`` element symbols; dummy atoms are ``'X'``.
        internal: ``(N, 3)`` float tensor of ``(r, theta, phi)`` per row
            (Angstrom, radians, IUPAC dihedral sign); 0 where the reference is
            missing.
        table: the :class:`~zmat.ConstructionTable` (rows ``(b, a, d)``).
        title, charge, multiplicity: carried through Gaussian files.

    Args:
        symbols: sequence of ``N`` element symbols.
        internal: ``(N, 3)`` array-like of internal coordinates.
        table: construction table, ``(N, 3)`` integer array-like or
            :class:`~zmat.ConstructionTable`.

    Raises:
        ValueError: lengths or shapes disagree, or the table is invalid.

    Example:
        >>> zm = ZMatrix.from_string("O\\nH 1 0.96\\nH 1 0.96 2 104.5")
        >>> zm.to_xyz().shape
        torch.Size([3, 3])
    """

    def __init__(
        self,
        symbols: Sequence[str],
        internal,
        table,
        *,
        title: str = "",
        charge: int = 0,
        multiplicity: int = 1,
    ) -> None:
        self.table = as_table(table)
        n = self.table.n_atoms
        self.symbols = [str(s) for s in symbols]
        if len(self.symbols) != n:
            raise ValueError(f"{len(self.symbols)} symbols for a construction table of {n} rows")
        internal = torch.as_tensor(internal)
        if not internal.dtype.is_floating_point:
            internal = internal.to(torch.float64)
        if internal.shape != (n, 3):
            raise ValueError(f"internal must have shape ({n}, 3), got {tuple(internal.shape)}")
        self.internal = internal
        self.title = title
        self.charge = int(charge)
        self.multiplicity = int(multiplicity)

    # ----------------------------------------------------------------- basics
    def __len__(self) -> int:
        return self.table.n_atoms

    def __repr__(self) -> str:
        n_dummy = sum(s == "X" for s in self.symbols)
        return (
            f"ZMatrix({self.formula!r}, n_atoms={len(self)}"
            + (f", dummies={n_dummy}" if n_dummy else "")
            + (f", title={self.title!r}" if self.title else "")
            + ")"
        )

    @property
    def formula(self) -> str:
        """Hill-ordered formula of the real atoms (dummies left out)."""
        from ase.formula import Formula

        real = "".join(s for s in self.symbols if s != "X")
        return Formula(real).format("hill") if real else ""

    @property
    def dummy_mask(self) -> np.ndarray:
        """``(N,)`` boolean array, ``True`` for dummy atoms (``'X'``)."""
        return np.array([s == "X" for s in self.symbols], bool)

    def copy(self) -> ZMatrix:
        return ZMatrix(
            list(self.symbols),
            self.internal.clone(),
            self.table,
            title=self.title,
            charge=self.charge,
            multiplicity=self.multiplicity,
        )

    # ------------------------------------------------------------ conversion
    def to_xyz(self, internal: torch.Tensor | None = None, method: str = "auto") -> torch.Tensor:
        """Cartesian coordinates of every row, dummies included.

        Args:
            internal: optional ``(..., N, 3)`` internal coordinates to use
                instead of :attr:`internal` (e.g. a batch, or a tensor that
                requires grad); same table.
            method: see :func:`zmat.to_xyz`.

        Returns:
            ``(..., N, 3)`` tensor, differentiable in ``internal``.
        """
        return to_xyz(self.internal if internal is None else internal, self.table, method=method)

    def to_atoms(self):
        """An :class:`ase.Atoms` of the real atoms (dummies dropped), positions in Angstrom."""
        from ase import Atoms

        xyz = self.to_xyz().detach().to("cpu", torch.float64).numpy()
        keep = ~self.dummy_mask
        atoms = Atoms([s for s, k in zip(self.symbols, keep, strict=True) if k], positions=xyz[keep])
        if self.title:
            atoms.info["title"] = self.title
        return atoms

    @classmethod
    def from_atoms(cls, atoms, table=None, **options) -> ZMatrix:
        """Internal coordinates of an :class:`ase.Atoms`, rows in the input atom order.

        Args:
            atoms: an :class:`ase.Atoms` (from ``ase.io.read`` of any format
                ASE reads). Periodic images are ignored. Symbols ``'X'`` are
                kept as dummy atoms.
            table: construction table to use; by default one is chosen by
                :func:`zmat.autotable.construction_table` (see its rules).
            **options: passed to :func:`zmat.autotable.construction_table`.

        Returns:
            a :class:`ZMatrix` (float64) whose :meth:`to_xyz` reproduces the
            positions up to a rigid motion.
        """
        from .autotable import construction_table

        if table is None:
            table = construction_table(atoms, **options)
        elif options:
            raise TypeError("options are only used when no table is given")
        xyz = torch.as_tensor(np.asarray(atoms.get_positions(), np.float64))
        table = as_table(table)
        return cls(
            atoms.get_chemical_symbols(),
            to_internal(xyz, table),
            table,
            title=str(atoms.info.get("title", "")),
            charge=int(atoms.info.get("charge", 0)),
            multiplicity=int(atoms.info.get("multiplicity", 1)),
        )

    @classmethod
    def from_chemcoord(cls, zmat, *, absolute: bool = False) -> ZMatrix:
        """A chemcoord ``Zmat`` as a :class:`ZMatrix`; see :func:`zmat.chemcoord.from_chemcoord`."""
        from .chemcoord import _import

        imp = _import(zmat, absolute=absolute)
        return cls(imp.symbols, imp.C, imp.table)

    # -------------------------------------------------------------------- I/O
    @classmethod
    def read(cls, path: str | os.PathLike) -> ZMatrix:
        """Read a Gaussian-style z-matrix file (see the module docstring).

        Raises:
            ValueError: malformed input; the message names the line.
        """
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        return cls.from_string(text)

    @classmethod
    def from_string(cls, text: str) -> ZMatrix:
        """Parse Gaussian-style z-matrix text (see :meth:`read`)."""
        return _parse(text)

    def write(self, path: str | os.PathLike, *, variables: bool = False) -> None:
        """Write a Gaussian-style z-matrix file (see :meth:`to_string`)."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_string(variables=variables))

    def to_string(self, *, variables: bool = False) -> str:
        """Gaussian-style z-matrix text; reading it back gives the same ZMatrix.

        Args:
            variables: write values as variables in a ``Variables:`` block
                (``R<k>``, ``A<k>``, ``D<k>`` for line ``k``) instead of inline.
        """
        return _format(self, variables)

    @classmethod
    def from_rdkit(cls, mol, conf_id: int = -1) -> ZMatrix:
        """An RDKit Mol's conformer, rows in the Mol's atom order; see :func:`zmat.rdkit.zmatrix_from_mol`."""
        from .rdkit import zmatrix_from_mol  # RDKit is an optional dependency

        return zmatrix_from_mol(mol, conf_id)


# ======================================================================= write
def _gaussian_order(refs: np.ndarray) -> list[int]:
    """Topological order that takes the lowest available row first (identity if possible)."""
    n = len(refs)
    deps: list[list[int]] = [[] for _ in range(n)]
    indeg = (refs >= 0).sum(1)
    for i, row in enumerate(refs):
        for r in row[row >= 0]:
            deps[int(r)].append(i)
    heap = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        i = heapq.heappop(heap)
        order.append(i)
        for j in deps[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, j)
    return order


def _length_str(x: float) -> str:
    return repr(float(x))


def _deg_to_rad(text: str) -> float:
    """Radians of a decimal degree string, correctly rounded (not ``float(text) * pi / 180``)."""
    return float(_CTX.multiply(decimal.Decimal(text), _PI_OVER_180))


def _angle_str(x: float) -> str:
    """Shortest decimal degree string ``s`` with ``_deg_to_rad(s) == x`` exactly."""
    x = float(x)
    if x == 0.0:
        return "0.0"
    deg = x / _DEG
    for k in range(1, 18):
        text = repr(float(f"{deg:.{k}g}"))
        if _deg_to_rad(text) == x:
            return text
    text = format(_CTX.divide(decimal.Decimal(x), _PI_OVER_180), ".25g")
    return text if "." in text or "E" in text.upper() else text + ".0"


def _format(zm: ZMatrix, variables: bool) -> str:
    refs = zm.table.refs
    order = _gaussian_order(refs)
    line_of = {row: k for k, row in enumerate(order)}  # 0-based written line of each row
    vals = zm.internal.detach().to("cpu", torch.float64).numpy()
    out = []
    if order != list(range(len(order))):
        nums = [str(r + 1) for r in order]
        for k in range(0, len(nums), 20):
            out.append("! zmat-order: " + " ".join(nums[k : k + 20]))
    out += ["#", "", zm.title.strip() or "zmat", "", f"{zm.charge} {zm.multiplicity}"]
    var_lines = []
    width = max(len(s) for s in zm.symbols)
    for k, row in enumerate(order):
        fields = [zm.symbols[row].ljust(width)]
        for c, kind in enumerate("RAD"):
            ref = refs[row, c]
            if ref < 0:
                break
            val = vals[row, c]
            text = _length_str(val) if c == 0 else _angle_str(val)
            if variables:
                name = f"{kind}{k + 1}"
                var_lines.append(f"{name}= {text}")
                text = name
            fields += [str(line_of[int(ref)] + 1), text]
        out.append("  ".join(fields).rstrip())
    if variables and var_lines:
        out += ["  Variables:"] + var_lines
    return "\n".join(out) + "\n\n"


# ======================================================================== read
class _Line:
    __slots__ = ("no", "text", "body")

    def __init__(self, no: int, text: str, body: str) -> None:
        self.no, self.text, self.body = no, text, body

    def error(self, msg: str) -> ValueError:
        return ValueError(f"line {self.no}: {msg}: {self.text.rstrip()!r}")


def _is_ints(tokens: list[str]) -> bool:
    return bool(tokens) and all(re.fullmatch(r"[+-]?\d+", t) for t in tokens)


def _number(tok: str) -> str | None:
    """``tok`` as a normalised finite decimal string (Fortran ``D`` exponent allowed), or None."""
    if _FORTRAN_RE.match(tok):
        tok = tok.replace("D", "E").replace("d", "e")
    try:
        v = float(tok)
    except ValueError:
        return None
    if not math.isfinite(v) or "_" in tok:
        return None
    return tok


def _element(label: str, line: _Line) -> str:
    from ase.data import chemical_symbols

    core = re.split(r"[(\-]", label, maxsplit=1)[0]
    if re.fullmatch(r"\d+", core):
        z = int(core)
        if z >= len(chemical_symbols):
            raise line.error(f"atomic number {z} is out of range")
        return chemical_symbols[z]  # 0 -> 'X'
    m = re.match(r"[A-Za-z]+", core)
    if not m:
        raise line.error(f"cannot read an element symbol from {label!r}")
    letters = m.group()
    if letters.lower() == "bq":
        raise line.error("ghost atoms (Bq) are not supported")
    two = letters[:2].capitalize()
    if len(letters) >= 2 and two in chemical_symbols and two != "X":
        return two
    one = letters[0].upper()
    if one in chemical_symbols:
        return one
    raise line.error(f"unknown element in atom label {label!r}")


def _units(route: str) -> tuple[float, float | None]:
    """(length factor to Angstrom, angle factor to radians or None for degrees) from a route."""
    length, angle = 1.0, None  # None: degrees, converted exactly
    m = re.search(r"units\s*[=(]\s*\(?([^)\s]*)", route, re.IGNORECASE)
    if m:
        words = {w.lower() for w in re.split(r"[,\s()=]+", m.group(1)) if w}
        if words & {"au", "bohr"}:
            length = _BOHR
        if words & {"rad", "radian", "radians"}:
            angle = 1.0
    return length, angle


def _parse(text: str) -> ZMatrix:
    order_comment: tuple[_Line, str] | None = None
    lines: list[_Line] = []
    for no, raw in enumerate(text.splitlines(), start=1):
        m = _ORDER_RE.match(raw)
        if m:  # zmat's own marker, possibly over several lines
            first = order_comment[0] if order_comment else _Line(no, raw, "")
            order_comment = (first, (order_comment[1] + " " if order_comment else "") + m.group(1))
        body = raw.split("!", 1)[0].rstrip()
        if not body.strip() and "!" in raw:
            continue  # a comment-only line is not a section separator
        lines.append(_Line(no, raw, body.strip()))

    pos = 0

    def skip_blank() -> None:
        nonlocal pos
        while pos < len(lines) and not lines[pos].body:
            pos += 1

    def section() -> list[_Line]:
        """Non-blank lines from ``pos`` up to the next blank line."""
        nonlocal pos
        out = []
        while pos < len(lines) and lines[pos].body:
            out.append(lines[pos])
            pos += 1
        return out

    skip_blank()
    while pos < len(lines) and lines[pos].body.startswith("%"):
        pos += 1
    skip_blank()
    title, charge, mult, route = "", 0, 1, ""
    if pos < len(lines) and lines[pos].body.startswith("#"):
        route = " ".join(ln.body for ln in section())
        skip_blank()
        title_lines = section()
        if not title_lines:
            raise ValueError("missing title section after the route section")
        title = " ".join(ln.body for ln in title_lines)
        skip_blank()
        if pos >= len(lines):
            raise ValueError("missing charge/multiplicity line after the title section")
        cm = lines[pos]
        toks = cm.body.replace(",", " ").split()
        if not _is_ints(toks) or len(toks) < 2 or len(toks) % 2:
            raise cm.error("expected a charge and multiplicity line such as '0 1'")
        charge, mult = int(toks[0]), int(toks[1])
        pos += 1
    else:
        toks = lines[pos].body.replace(",", " ").split() if pos < len(lines) else []
        if _is_ints(toks) and len(toks) >= 2:
            if len(toks) % 2:
                raise lines[pos].error("expected a charge and multiplicity line such as '0 1'")
            charge, mult = int(toks[0]), int(toks[1])
            pos += 1
    length_unit, angle_unit = _units(route)

    # ---- z-matrix lines
    zlines: list[_Line] = []
    while pos < len(lines) and lines[pos].body and not _HEADER_RE.match(lines[pos].body):
        zlines.append(lines[pos])
        pos += 1
    if not zlines:
        raise ValueError("no z-matrix lines found")

    symbols: list[str] = []
    labels: dict[str, int | None] = {}
    rows: list[list[int]] = []
    raw_vals: list[list[str]] = []
    for k, ln in enumerate(zlines):
        toks = [t for t in re.split(r"[\s,]+", ln.body) if t]
        if len(toks) == 8:
            if toks[7] in ("1", "-1", "+1"):
                raise ln.error("the two-angle form (final flag 1 or -1) is not supported")
            if toks[7] != "0":
                raise ln.error(f"unexpected 8th field {toks[7]!r} (only the dihedral flag 0 is supported)")
            toks = toks[:7]
        if len(toks) not in (1, 3, 5, 7):
            hint = ""
            if len(toks) == 4 and all(_number(t) is not None for t in toks[1:]):
                hint = "; Cartesian lines 'El x y z' are not supported"
            raise ln.error(
                f"expected 1, 3, 5 or 7 fields (El ref r ref angle ref dihedral), got {len(toks)}{hint}"
            )
        label = toks[0]
        symbols.append(_element(label, ln))
        refs = []
        for c in range(1, len(toks), 2):
            tok = toks[c]
            if re.fullmatch(r"[+-]?\d+", tok):
                r = int(tok) - 1
                if r == -1:
                    raise ln.error("reference 0 (Cartesian coordinates) is not supported")
                if r < 0 or r >= k:
                    if r == k:
                        raise ln.error(f"atom {k + 1} refers to itself")
                    raise ln.error(f"reference {tok} does not name an earlier line (this is line {k + 1})")
            else:
                key = tok.upper()
                if key not in labels:
                    raise ln.error(f"reference {tok!r} is not the label of an earlier atom")
                if labels[key] is None:
                    raise ln.error(f"reference {tok!r} is ambiguous: several atoms carry that label")
                r = labels[key]
            if r in refs:
                raise ln.error(f"atom {r + 1} is used twice as a reference")
            refs.append(r)
        rows.append(refs + [-1] * (3 - len(refs)))
        raw_vals.append(toks[2::2])
        key = label.upper()
        labels[key] = None if key in labels else k

    # ---- variables
    defs: dict[str, str] = {}
    uses_names = any(_number(v) is None for vals in raw_vals for v in vals)
    skip_blank()
    in_block = pos < len(lines) and _HEADER_RE.match(lines[pos].body)
    if in_block or uses_names:
        while pos < len(lines):
            ln = lines[pos]
            if not ln.body:
                skip_blank()
                if pos < len(lines) and _HEADER_RE.match(lines[pos].body):
                    continue
                break
            pos += 1
            if _HEADER_RE.match(ln.body):
                continue
            m = _VAR_RE.match(ln.body)
            if not m:
                raise ln.error("expected a variable definition 'NAME= value' or 'NAME value'")
            name, val = m.group(1), _number(m.group(2))
            if val is None:
                raise ln.error(f"value {m.group(2)!r} of variable {name!r} is not a number")
            if not _NAME_RE.match(name):
                raise ln.error(f"{name!r} is not a valid variable name")
            if name.upper() in defs:
                raise ln.error(f"variable {name!r} is defined twice")
            defs[name.upper()] = val

    # ---- values
    n = len(symbols)
    internal = np.zeros((n, 3), np.float64)
    for k, (ln, vals) in enumerate(zip(zlines, raw_vals, strict=True)):
        for c, tok in enumerate(vals):
            text = _number(tok)
            if text is None:
                name = tok.lstrip("+-")
                if name.upper() not in defs:
                    raise ln.error(f"unknown variable {name!r}")
                text = defs[name.upper()]
                if tok.startswith("-"):
                    text = text[1:] if text.startswith("-") else "-" + text.lstrip("+")
            if c == 0:
                v = float(text)
                if v < 0:
                    raise ln.error(f"negative bond length {v}")
                v = v * length_unit
            else:
                v = _deg_to_rad(text) if angle_unit is None else float(text) * angle_unit
            internal[k, c] = v

    zm = ZMatrix(
        symbols,
        torch.from_numpy(internal),
        ConstructionTable(np.asarray(rows, np.int64)),
        title=title,
        charge=charge,
        multiplicity=mult,
    )
    if order_comment is not None:
        zm = _reorder(zm, *order_comment)
    return zm


def _reorder(zm: ZMatrix, line: _Line, spec: str) -> ZMatrix:
    """Undo the construction-order permutation recorded by :func:`_format`."""
    try:
        order = [int(t) - 1 for t in spec.split()]
    except ValueError:
        raise line.error("malformed zmat-order comment") from None
    n = len(zm)
    if sorted(order) != list(range(n)):
        raise line.error(f"zmat-order must be a permutation of 1..{n}")
    perm = np.asarray(order)  # written line k holds original row perm[k]
    refs = zm.table.refs
    new_refs = np.full_like(refs, -1)
    new_refs[perm] = np.where(refs >= 0, perm[np.maximum(refs, 0)], -1)
    internal = torch.empty_like(zm.internal)
    internal[torch.as_tensor(perm)] = zm.internal
    symbols = [""] * n
    for k, row in enumerate(perm):
        symbols[row] = zm.symbols[k]
    return ZMatrix(
        symbols, internal, new_refs, title=zm.title, charge=zm.charge, multiplicity=zm.multiplicity
    )
