"""Gaussian-style z-matrix text: read and write plain data (no torch, no :class:`~zmat.ZMatrix`).

:func:`parse` turns text into a :class:`GaussianZMatrix` (symbols, references,
values in Angstrom and radians, title, charge, multiplicity, the variable
names used), and :func:`to_string` turns one back into text.
:meth:`zmat.ZMatrix.read`, :meth:`~zmat.ZMatrix.from_string` and
:meth:`~zmat.ZMatrix.write` are thin wrappers around these two functions.

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
  variable names with one sign (``-D1``; ``--D1`` is an error). Angles are in degrees and lengths in
  Angstrom, unless the route says ``Units=Bohr``/``AU`` or ``Units=Rad``. Bond
  angles are read as written, as ``ase.io.zmatrix`` does (a negative one
  included); :class:`~zmat.ZMatrix` refuses those outside ``[0, 180]`` degrees,
  naming the line (:attr:`GaussianZMatrix.lines`).
  Cartesian lines and the two-angle form (final flag ``1``/``-1``) are not
  supported. A row with fewer references than ``min(line, 3)`` is a zmat
  extension (a new root or a partial row in a forest); Gaussian rejects it.
* variables after a ``Variables:`` (or ``Constants:``) line, or after the blank
  line that ends the z-matrix: ``NAME= value``, ``NAME=value`` or
  ``NAME value``, up to the next blank line. Anything after that (basis sets,
  further sections) is ignored. The names defined under ``Constants:`` are
  recorded (:attr:`GaussianZMatrix.constants`) and written back under
  ``Constants:``.

Any error is a ``ValueError`` that names the line number and quotes the line.

Placement follows ``zmat.to_xyz`` (and hence ``ase.io.zmatrix.parse_zmatrix``):
first atom at the origin, second on ``+x``, third in the ``xy``-plane on the
``+y`` side, dihedrals with the IUPAC sign (see ``docs/conventions.md``).

File format (write)
-------------------
The route section read is written back (``#`` when there was none), without
its ``Units=`` keyword since values are written in Angstrom and degrees; Link 0
lines are not kept. Rows are written in construction order (every reference on an earlier line, as
Gaussian requires), references as 1-based line numbers, values as plain numbers
or, with ``variables=True``, as variables: the names (and signs, ``-D1``) that
``zm.variables`` records, or when it records none, ``R<k>``, ``A<k>``, ``D<k>``
for every value of line ``k``. Each value is the shortest decimal (lengths in Angstrom, angles in
degrees) with at most ``decimals`` digits after the point that reads back to
the same float, else rounded to ``decimals`` digits (default 10: 1e-10 A or
degrees at most); ``decimals=None`` writes the shortest decimal that reads back
bitwise (up to 25 significant digits for an angle), so ``to_string`` ->
``parse`` is lossless. When
the rows are not in construction order (as after
:meth:`zmat.ZMatrix.from_atoms`, which keeps the input atom order), a comment
line ``! zmat-order: ...`` records the row each written line came from (20
numbers per line, 1-based); :func:`parse` puts the rows back in that order
(other programs ignore the comment).
"""

from __future__ import annotations

import dataclasses
import decimal
import heapq
import math
import os
import re

import numpy as np

__all__ = ["GaussianZMatrix", "parse", "read", "to_string"]

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
_INT_RE = re.compile(r"[+-]?\d+")


@dataclasses.dataclass
class GaussianZMatrix:
    """A z-matrix as plain data, rows in the order the file records.

    Attributes:
        symbols: ``N`` element symbols, dummies ``'X'``.
        refs: ``(N, 3)`` int64 array of 0-based rows ``(b, a, d)``, ``-1`` where
            missing.
        values: ``(N, 3)`` float64 array ``(r, theta, phi)`` in Angstrom and
            radians (IUPAC dihedral sign), 0 where the reference is missing.
        title, charge, multiplicity: the Gaussian title, charge and spin
            multiplicity.
        variables: per row, the variable token each present value was given by
            (``"R1"``, ``"-D3"``), or ``None`` for a literal number; may be
            empty (no variables).
        route: the route section (``"#P HF/6-31G(d) Opt"``), ``""`` for a bare z-matrix.
        constants: upper-case names of the variables defined under ``Constants:``
            (Gaussian holds them fixed in an optimisation).
        lines: the 1-based line of the text each row was read from (empty when
            not read from text).
    """

    symbols: list[str]
    refs: np.ndarray
    values: np.ndarray
    title: str = ""
    charge: int = 0
    multiplicity: int = 1
    variables: list[list[str | None]] = dataclasses.field(default_factory=list)
    route: str = ""
    constants: frozenset[str] = frozenset()
    lines: list[int] = dataclasses.field(default_factory=list)


# ======================================================================= write
def construction_order(refs: np.ndarray) -> list[int]:
    """Topological order of the rows of ``refs`` (``(N, 3)``), lowest available row
    first (the identity when every reference points to an earlier row).

    Raises:
        ValueError: the references form a cycle.
    """
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
    if len(order) != n:
        rest = sorted(set(range(n)) - set(order))
        raise ValueError(f"the references of rows {rest[:10]} form a cycle")
    return order


def _fixed(x: float, decimals: int) -> str:
    """``x`` rounded to ``decimals`` digits after the point, trailing zeros dropped (``-0`` as ``0``)."""
    text = f"{x:.{decimals}f}".rstrip("0")
    text = text + "0" if text.endswith(".") else text
    return "0.0" if float(text) == 0.0 else text


def _length_str(x: float, decimals: int | None = None) -> str:
    """``repr(x)`` when it has at most ``decimals`` digits after the point (or ``decimals`` is None)."""
    text = repr(float(x))
    if decimals is None or ("e" not in text and len(text.partition(".")[2]) <= decimals):
        return text
    return _fixed(float(x), decimals)


def _deg_to_rad(text: str) -> float:
    """Radians of a decimal degree string, correctly rounded (not ``float(text) * pi / 180``)."""
    return float(_CTX.multiply(decimal.Decimal(text), _PI_OVER_180))


def _angle_str(x: float, decimals: int | None = None) -> str:
    """Shortest decimal degree string ``s`` with ``_deg_to_rad(s) == x`` exactly; with
    ``decimals``, at most that many digits after the point (rounded when none reads back)."""
    x = float(x)
    if x == 0.0:
        return "0.0"
    deg = x / _DEG
    if decimals is not None:
        for k in range(1, decimals + 1):
            text = f"{deg:.{k}f}"
            if _deg_to_rad(text) == x:
                return _fixed(deg, k)
        return _fixed(deg, decimals)
    for k in range(1, 18):
        text = repr(float(f"{deg:.{k}g}"))
        if _deg_to_rad(text) == x:
            return text
    text = format(_CTX.divide(decimal.Decimal(x), _PI_OVER_180), ".25g")
    return text if "." in text or "E" in text.upper() else text + ".0"


def _written_route(route: str) -> str:
    """The route to write: the one read (``#`` when none), without its ``Units=`` keyword (the
    values are written in Angstrom and degrees)."""
    route = re.sub(r"\s*\bunits\s*(=\s*\([^)]*\)|=\s*\S+|\([^)]*\))", "", route.strip(), flags=re.IGNORECASE)
    return route if route.startswith("#") else "#"


def to_string(zm: GaussianZMatrix, *, variables: bool = False, decimals: int | None = 10) -> str:
    """Gaussian-style z-matrix text of ``zm``; :func:`parse` reads it back.

    Args:
        zm: the data to write.
        variables: write values as variables in a ``Variables:`` block: the
            names and signs ``zm.variables`` records (other values inline), or,
            when it records none, every value as ``R<k>``, ``A<k>``, ``D<k>``
            (line ``k``).
        decimals: digits after the point at most (see the module docstring);
            ``None`` for a bitwise round trip.

    Raises:
        ValueError: the references form a cycle, or the uses of one variable
            disagree on its value (the message names the rows).

    Example:
        >>> zm = parse("O\\nH 1 0.96\\nH 1 0.96 2 104.5")
        >>> print(to_string(zm).strip())
        #
        <BLANKLINE>
        zmat
        <BLANKLINE>
        0 1
        O
        H  1  0.96
        H  1  0.96  2  104.5
    """
    refs = np.asarray(zm.refs, np.int64)
    vals = np.asarray(zm.values, np.float64)
    order = construction_order(refs)
    line_of = {row: k for k, row in enumerate(order)}  # 0-based written line of each row
    out = []
    if order != list(range(len(order))):
        nums = [str(r + 1) for r in order]
        for k in range(0, len(nums), 20):
            out.append("! zmat-order: " + " ".join(nums[k : k + 20]))
    out += [_written_route(zm.route), "", zm.title.strip() or "zmat", "", f"{zm.charge} {zm.multiplicity}"]
    kept = any(t for toks in zm.variables for t in toks)  # else every value gets a name
    tokens = zm.variables if kept else [[] for _ in zm.symbols]
    defined: dict[str, tuple[str, int, float]] = {}  # upper-case name -> (value text, row, value)
    var_lines: list[str] = []
    const_lines: list[str] = []
    width = max(len(s) for s in zm.symbols)
    for k, row in enumerate(order):
        fields = [zm.symbols[row].ljust(width)]
        for c, kind in enumerate("RAD"):
            ref = refs[row, c]
            if ref < 0:
                break
            tok = (tokens[row][c] if c < len(tokens[row]) else None) if variables else None
            val = -vals[row, c] if tok and tok.startswith("-") else vals[row, c]
            text = _length_str(val, decimals) if c == 0 else _angle_str(val, decimals)
            if variables and (tok or not kept):
                name = tok.lstrip("+-") if tok else f"{kind}{k + 1}"
                key = name.upper()
                if key not in defined:
                    defined[key] = (text, row, val)
                    (const_lines if key in zm.constants else var_lines).append(f"{name}= {text}")
                elif abs(defined[key][2] - val) > 1e-9:  # rounding apart is one value
                    raise ValueError(
                        f"variable {name!r} is {defined[key][0]} in row {defined[key][1]} but "
                        f"{text} in row {row}: write with variables=False, or make its uses agree"
                    )
                text = tok or name
            fields += [str(line_of[int(ref)] + 1), text]
        out.append("  ".join(fields).rstrip())
    if variables and var_lines:
        out += ["  Variables:"] + var_lines
    if variables and const_lines:
        out += ["  Constants:"] + const_lines
    return "\n".join(out) + "\n\n"


# ======================================================================== read
class _Line:
    __slots__ = ("no", "text", "body")

    def __init__(self, no: int, text: str, body: str) -> None:
        self.no, self.text, self.body = no, text, body

    def error(self, msg: str) -> ValueError:
        return ValueError(f"line {self.no}: {msg}: {self.text.rstrip()!r}")


class _Cursor:
    """The significant lines of a file and a read position."""

    def __init__(self, lines: list[_Line]) -> None:
        self.lines, self.pos = lines, 0

    def peek(self) -> _Line | None:
        return self.lines[self.pos] if self.pos < len(self.lines) else None

    def skip_blank(self) -> None:
        while self.pos < len(self.lines) and not self.lines[self.pos].body:
            self.pos += 1

    def section(self) -> list[_Line]:
        """Non-blank lines from here up to the next blank line."""
        out = []
        while self.pos < len(self.lines) and self.lines[self.pos].body:
            out.append(self.lines[self.pos])
            self.pos += 1
        return out


def _split_lines(text: str) -> tuple[list[_Line], tuple[_Line, str] | None]:
    """The lines that matter (comment-only lines dropped) and the ``zmat-order`` comment."""
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
    return lines, order_comment


def _is_ints(tokens: list[str]) -> bool:
    return bool(tokens) and all(_INT_RE.fullmatch(t) for t in tokens)


def _charge_line(cur: _Cursor, required: bool) -> tuple[int, int] | None:
    """``(charge, multiplicity)`` from the current line, if it is one (or must be)."""
    ln = cur.peek()
    toks = ln.body.replace(",", " ").split() if ln is not None else []
    if not (_is_ints(toks) and len(toks) >= 2):
        if required:
            raise ln.error("expected a charge and multiplicity line such as '0 1'")
        return None
    if len(toks) % 2:
        raise ln.error("expected a charge and multiplicity line such as '0 1'")
    cur.pos += 1
    return int(toks[0]), int(toks[1])


def _header(cur: _Cursor) -> tuple[str, int, int, str]:
    """Link 0, route, title and charge lines: ``(title, charge, multiplicity, route)``."""
    cur.skip_blank()
    while (ln := cur.peek()) is not None and ln.body.startswith("%"):
        cur.pos += 1
    cur.skip_blank()
    ln = cur.peek()
    if ln is None or not ln.body.startswith("#"):  # a bare z-matrix
        charge, mult = _charge_line(cur, required=False) or (0, 1)
        return "", charge, mult, ""
    route = " ".join(ln.body for ln in cur.section())
    cur.skip_blank()
    title_lines = cur.section()
    if not title_lines:
        raise ValueError("missing title section after the route section")
    cur.skip_blank()
    if cur.peek() is None:
        raise ValueError("missing charge/multiplicity line after the title section")
    charge, mult = _charge_line(cur, required=True)
    return " ".join(ln.body for ln in title_lines), charge, mult, route


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


def _fields(ln: _Line) -> list[str]:
    """The fields of a z-matrix line, without the trailing dihedral flag ``0``."""
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
    return toks


def _reference(tok: str, k: int, labels: dict[str, int | None], ln: _Line) -> int:
    """0-based row of reference ``tok`` on line ``k`` (0-based): a line number or a label."""
    if not _INT_RE.fullmatch(tok):
        key = tok.upper()
        if key not in labels:
            raise ln.error(f"reference {tok!r} is not the label of an earlier atom")
        if labels[key] is None:
            raise ln.error(f"reference {tok!r} is ambiguous: several atoms carry that label")
        return labels[key]
    r = int(tok) - 1
    if r == -1:
        raise ln.error("reference 0 (Cartesian coordinates) is not supported")
    if r == k:
        raise ln.error(f"atom {k + 1} refers to itself")
    if r < 0 or r > k:
        raise ln.error(f"reference {tok} does not name an earlier line (this is line {k + 1})")
    return r


def _zmatrix_rows(cur: _Cursor) -> tuple[list[_Line], list[str], list[list[int]], list[list[str]]]:
    """The z-matrix lines: ``(lines, symbols, refs rows, value tokens)``."""
    zlines: list[_Line] = []
    while (ln := cur.peek()) is not None and ln.body and not _HEADER_RE.match(ln.body):
        zlines.append(ln)
        cur.pos += 1
    if not zlines:
        raise ValueError("no z-matrix lines found")
    symbols: list[str] = []
    labels: dict[str, int | None] = {}  # label -> row, None when ambiguous
    rows: list[list[int]] = []
    tokens: list[list[str]] = []
    for k, ln in enumerate(zlines):
        toks = _fields(ln)
        symbols.append(_element(toks[0], ln))
        refs: list[int] = []
        for tok in toks[1::2]:
            r = _reference(tok, k, labels, ln)
            if r in refs:
                raise ln.error(f"atom {r + 1} is used twice as a reference")
            refs.append(r)
        rows.append(refs + [-1] * (3 - len(refs)))
        tokens.append(toks[2::2])
        key = toks[0].upper()
        labels[key] = None if key in labels else k
    return zlines, symbols, rows, tokens


def _variables(cur: _Cursor, needed: bool) -> tuple[dict[str, str], frozenset[str]]:
    """Variable definitions (upper-case name -> decimal string) after the z-matrix, and the
    upper-case names of those under a ``Constants:`` header."""
    defs: dict[str, str] = {}
    constants: set[str] = set()
    in_constants = False
    cur.skip_blank()
    ln = cur.peek()
    if not needed and not (ln is not None and _HEADER_RE.match(ln.body)):
        return defs, frozenset()
    while (ln := cur.peek()) is not None:
        if not ln.body:
            cur.skip_blank()
            nxt = cur.peek()
            if nxt is not None and _HEADER_RE.match(nxt.body):
                continue
            break
        cur.pos += 1
        header = _HEADER_RE.match(ln.body)
        if header:
            in_constants = header.group(1).lower() == "constants"
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
        if in_constants:
            constants.add(name.upper())
    return defs, frozenset(constants)


def _value(tok: str, column: int, defs: dict[str, str], units, ln: _Line) -> float:
    """The value of token ``tok`` in ``column`` (0 length, 1 angle, 2 dihedral), in A and radians."""
    text = _number(tok)
    if text is None:
        name = tok[1:] if tok[:1] in "+-" else tok
        if not _NAME_RE.match(name):
            raise ln.error(f"{tok!r} is neither a number nor a variable name with at most one sign")
        if name.upper() not in defs:
            raise ln.error(f"unknown variable {name!r}")
        text = defs[name.upper()]
        if tok.startswith("-"):
            text = text[1:] if text.startswith("-") else "-" + text.lstrip("+")
    length_unit, angle_unit = units
    if column == 0:
        v = float(text)
        if v < 0:
            raise ln.error(f"negative bond length {v}")
        return v * length_unit
    return _deg_to_rad(text) if angle_unit is None else float(text) * angle_unit


def _reorder(zm: GaussianZMatrix, line: _Line, spec: str) -> GaussianZMatrix:
    """Undo the construction-order permutation recorded by :func:`to_string`."""
    try:
        order = [int(t) - 1 for t in spec.split()]
    except ValueError:
        raise line.error("malformed zmat-order comment") from None
    n = len(zm.symbols)
    if sorted(order) != list(range(n)):
        raise line.error(f"zmat-order must be a permutation of 1..{n}")
    perm = np.asarray(order, np.int64)  # written line k holds original row perm[k]
    refs = np.full_like(zm.refs, -1)
    refs[perm] = np.where(zm.refs >= 0, perm[np.maximum(zm.refs, 0)], -1)
    values = np.empty_like(zm.values)
    values[perm] = zm.values
    symbols = [""] * n
    variables: list[list[str | None]] = [[] for _ in range(n)]
    lines = [0] * n
    for k, row in enumerate(order):
        symbols[row], variables[row], lines[row] = zm.symbols[k], zm.variables[k], zm.lines[k]
    return dataclasses.replace(
        zm, symbols=symbols, refs=refs, values=values, variables=variables, lines=lines
    )


def parse(text: str) -> GaussianZMatrix:
    """Read Gaussian-style z-matrix text (format in the module docstring).

    Returns:
        a :class:`GaussianZMatrix`; rows in file order, or in the order a
        ``! zmat-order:`` comment records.

    Raises:
        ValueError: malformed input; the message names the line and quotes it.

    Example:
        >>> zm = parse("O\\nH 1 ROH\\nH 1 ROH 2 104.5\\n\\nROH= 0.96")
        >>> zm.symbols, zm.refs.tolist(), zm.variables[2]
        (['O', 'H', 'H'], [[-1, -1, -1], [0, -1, -1], [0, 1, -1]], ['ROH', None])
    """
    lines, order_comment = _split_lines(text)
    cur = _Cursor(lines)
    title, charge, mult, route = _header(cur)
    units = _units(route)
    zlines, symbols, rows, tokens = _zmatrix_rows(cur)
    defs, constants = _variables(cur, needed=any(_number(t) is None for toks in tokens for t in toks))
    values = np.zeros((len(symbols), 3), np.float64)
    for k, (ln, toks) in enumerate(zip(zlines, tokens, strict=True)):
        for c, tok in enumerate(toks):
            values[k, c] = _value(tok, c, defs, units, ln)
    variables = [[None if _number(t) is not None else t for t in toks] for toks in tokens]
    zm = GaussianZMatrix(
        symbols,
        np.asarray(rows, np.int64),
        values,
        title,
        charge,
        mult,
        variables,
        route,
        constants,
        [ln.no for ln in zlines],
    )
    return zm if order_comment is None else _reorder(zm, *order_comment)


def read(path: str | os.PathLike) -> GaussianZMatrix:
    """:func:`parse` the UTF-8 file at ``path``."""
    with open(path, encoding="utf-8") as fh:
        return parse(fh.read())
