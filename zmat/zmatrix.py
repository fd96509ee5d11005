"""The :class:`ZMatrix` class: symbols + internal coordinates + construction table.

Gaussian-style z-matrix text is read and written by :mod:`zmat.gaussian` (the
file format is described there); :meth:`ZMatrix.read`, :meth:`ZMatrix.from_string`,
:meth:`ZMatrix.write` and :meth:`ZMatrix.to_string` convert between its plain
data and a :class:`ZMatrix`.

Variables: a z-matrix read from text keeps its variables (``R1``, ``A2``, a
shared ``D1`` used as ``D1`` in one row and ``-D1`` in another).
:attr:`ZMatrix.variable_uses` lists the ``(row, column, sign)`` entries of
each, so ``internal[row, column] == sign * value``;
:meth:`ZMatrix.internal_from_variables` maps a ``(..., V)`` tensor of values
(Angstrom, radians) to ``(..., N, 3)`` internal coordinates, differentiably, so
``dE/d(variable)`` is one backward, and :meth:`ZMatrix.variable_gradient` is
its transpose (the sum of ``sign * dE/dC`` over the uses).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from . import gaussian
from .autotable import construction_table
from .batch import ZMatrixBatch
from .chemcoord import import_zmat
from .table import as_table
from .transform import to_internal, to_xyz

__all__ = ["ZMatrix"]


class ZMatrix:
    """A molecule in internal coordinates.

    Attributes:
        symbols: list of ``N`` element symbols; dummy atoms are ``'X'``.
        internal: ``(N, 3)`` float tensor of ``(r, theta, phi)`` per row
            (Angstrom, radians, IUPAC dihedral sign); 0 where the reference is
            missing.
        table: the :class:`~zmat.ConstructionTable` (rows ``(b, a, d)``).
        title, charge, multiplicity, route: carried through Gaussian files
            (``route`` is the route section, ``""`` when none).
        constants: the names (as in :attr:`variable_uses`) of the variables
            Gaussian holds fixed (a ``Constants:`` section); written back there.
        variable_uses: ``{name: [(row, column, sign), ...]}`` of the
            z-matrix variables (empty when there are none); see the module
            docstring.

    Args:
        symbols: sequence of ``N`` element symbols.
        internal: ``(N, 3)`` array-like of internal coordinates; angles in
            radians.
        table: construction table, ``(N, 3)`` integer array-like or
            :class:`~zmat.ConstructionTable`.
        variables: optional ``{name: [(row, column, sign), ...]}``: the entries
            each variable sets (sign ``+1`` or ``-1``; names are
            case-insensitive, as in Gaussian).
        constants: names among ``variables`` that are Gaussian constants.

    Raises:
        ValueError: lengths or shapes disagree, the table is invalid, a bond
            angle is outside ``[0, pi]`` (given in degrees?), or a variable's
            uses are invalid or disagree on its value. A dihedral beyond
            ``2 pi`` warns (degrees?). The values are checked where they are on
            the host.

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
        variables: Mapping[str, Sequence[tuple[int, int, int]]] | None = None,
        route: str = "",
        constants: Sequence[str] = (),
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
        self.variable_uses = _check_variables(variables or {}, self.table.refs)
        self.route = str(route)
        self.constants = _check_constants(constants, self.variable_uses)
        if internal.device.type == "cpu":  # a check on the host costs no sync
            values = internal.detach().to(torch.float64).numpy()
            _check_angles(values, self.table.refs)
            _check_variable_values(self.variable_uses, values)

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
            variables=self.variable_uses,
            route=self.route,
            constants=self.constants,
        )

    @classmethod
    def batch(cls, zmatrices: Sequence[ZMatrix]) -> ZMatrixBatch:
        """Z-matrices of different sizes as one :class:`~zmat.batch.ZMatrixBatch` (one forest table)."""
        return ZMatrixBatch(zmatrices)

    def find(self, *atoms: int) -> tuple[int, int]:
        """``(row, column)`` of the bond, angle or dihedral through ``atoms``.

        Args:
            atoms: 2, 3 or 4 atom indices (0-based, or one sequence of them),
                in either direction: ``(i, b)`` is the bond of row ``i`` with
                references ``(b, a, d)``, ``(i, b, a)`` its angle, ``(i, b, a,
                d)`` (or ``(d, a, b, i)``) its dihedral.

        Raises:
            ValueError: no row holds that coordinate.

        Example:
            >>> zm = ZMatrix.from_string("O\\nO 1 1.46\\nH 1 0.97 2 100\\nH 2 0.97 1 100 3 112")
            >>> zm.find(2, 0, 1, 3)  # the dihedral H-O-O-H is row 3's
            (3, 2)
        """
        if len(atoms) == 1 and isinstance(atoms[0], Sequence | np.ndarray | torch.Tensor):
            atoms = tuple(atoms[0])
        atoms = tuple(_atom_index(a, len(self)) for a in atoms)
        if len(atoms) not in (2, 3, 4):
            raise ValueError(f"give 2, 3 or 4 atoms (a bond, an angle or a dihedral), got {atoms}")
        refs, k = self.table.refs, len(atoms) - 1
        for path in (atoms, atoms[::-1]):
            if 0 <= path[0] < len(self) and tuple(int(r) for r in refs[path[0], :k]) == path[1:]:
                return path[0], k - 1
        kind = ("bond", "angle", "dihedral")[k - 1]
        rows = [f"row {i}: {refs[i].tolist()}" for i in (atoms[0], atoms[-1]) if 0 <= i < len(self)]
        raise ValueError(f"no row holds the {kind} {'-'.join(map(str, atoms))} ({'; '.join(rows)})")

    # ------------------------------------------------------------- variables
    @property
    def variables(self) -> dict[str, float]:
        """``{name: value}`` of the z-matrix variables (Angstrom, radians), from :attr:`internal`."""
        values = self.variable_values().detach().cpu().tolist()
        return dict(zip(self.variable_uses, values, strict=True))

    def variable_values(self) -> torch.Tensor:
        """``(V,)`` values of the variables in :attr:`variable_uses` order: first use times its sign."""
        first = [(r * 3 + c, s) for r, c, s in (u[0] for u in self.variable_uses.values())]
        slot = torch.tensor([f[0] for f in first], dtype=torch.int64, device=self.internal.device)
        sign = torch.tensor([f[1] for f in first], dtype=self.internal.dtype, device=self.internal.device)
        return self.internal.reshape(-1)[slot] * sign

    def internal_from_variables(self, values: torch.Tensor) -> torch.Tensor:
        """Internal coordinates with the variables set to ``values``.

        Args:
            values: ``(..., V)`` tensor in :attr:`variable_uses` order (Angstrom,
                radians).

        Returns:
            ``(..., N, 3)``: :attr:`internal` with ``internal[row, column] =
            sign * values[k]`` for every use of variable ``k``; differentiable
            in ``values``.
        """
        n_var = len(self.variable_uses)
        if values.shape[-1:] != (n_var,):
            raise ValueError(f"values must have shape (..., {n_var}), got {tuple(values.shape)}")
        slot, var, sign = self._variable_index(values.device)
        base = self.internal.to(values.device, values.dtype).reshape(-1).expand(*values.shape[:-1], -1)
        out = base.index_copy(-1, slot, values.index_select(-1, var) * sign.to(values.dtype))
        return out.unflatten(-1, (len(self), 3))

    def variable_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        """``(..., V)`` gradient to the variables from ``(..., N, 3)`` ``grad = dE/d internal``."""
        slot, var, sign = self._variable_index(grad.device)
        flat = grad.flatten(-2).index_select(-1, slot) * sign.to(grad.dtype)
        out = flat.new_zeros(*flat.shape[:-1], len(self.variable_uses))
        return out.index_add(-1, var, flat)

    def _variable_index(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Flat positions, variable index and sign of every use, as tensors on ``device``."""
        uses = [(r * 3 + c, k, s) for k, u in enumerate(self.variable_uses.values()) for r, c, s in u]
        slot, var, sign = (np.array([u[j] for u in uses], np.int64).reshape(-1) for j in range(3))
        return (
            torch.as_tensor(slot, device=device),
            torch.as_tensor(var, device=device),
            torch.as_tensor(sign, device=device),
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
        imp = import_zmat(zmat, absolute=absolute)
        return cls(imp.symbols, imp.C, imp.table)

    # -------------------------------------------------------------------- I/O
    @classmethod
    def read(cls, path: str | os.PathLike) -> ZMatrix:
        """Read a Gaussian-style z-matrix file (format: :mod:`zmat.gaussian`).

        Raises:
            ValueError: malformed input; the message names the line.
        """
        return cls._from_data(gaussian.read(path))

    @classmethod
    def from_string(cls, text: str) -> ZMatrix:
        """Parse Gaussian-style z-matrix text (see :meth:`read`)."""
        return cls._from_data(gaussian.parse(text))

    @classmethod
    def _from_data(cls, data: gaussian.GaussianZMatrix) -> ZMatrix:
        _check_file_angles(data)
        uses: dict[str, list[tuple[int, int, int]]] = {}
        names: dict[str, str] = {}  # upper-case -> first spelling (Gaussian ignores case)
        for row, toks in enumerate(data.variables):
            for col, tok in enumerate(toks):
                if tok:
                    name = names.setdefault(tok.lstrip("+-").upper(), tok.lstrip("+-"))
                    uses.setdefault(name, []).append((row, col, -1 if tok.startswith("-") else 1))
        return cls(
            data.symbols,
            torch.from_numpy(data.values),
            data.refs,
            title=data.title,
            charge=data.charge,
            multiplicity=data.multiplicity,
            variables=uses,
            route=data.route,
            constants=[n for n in uses if n.upper() in data.constants],
        )

    def write(
        self, path: str | os.PathLike, *, variables: bool | None = None, decimals: int | None = 10
    ) -> None:
        """Write a Gaussian-style z-matrix file (see :meth:`to_string`)."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_string(variables=variables, decimals=decimals))

    def to_string(self, *, variables: bool | None = None, decimals: int | None = 10) -> str:
        """Gaussian-style z-matrix text (format: :mod:`zmat.gaussian`).

        Args:
            variables: write the z-matrix's variables (names and signs) in a
                ``Variables:`` block, or, when it has none, every value as a
                variable ``R<k>``, ``A<k>``, ``D<k>`` (line ``k``); ``None``
                (default): when the z-matrix has variables.
            decimals: at most this many digits after the point (lengths in
                Angstrom, angles in degrees); ``None`` writes values that read
                back bitwise.

        Raises:
            ValueError: the uses of a variable disagree (edit it through
                :meth:`internal_from_variables`, or write ``variables=False``).
        """
        if variables is None:
            variables = bool(self.variable_uses)
        tokens: list[list[str | None]] = [[None] * 3 for _ in self.symbols]
        for name, uses in self.variable_uses.items():
            for row, col, sign in uses:
                tokens[row][col] = name if sign > 0 else "-" + name
        data = gaussian.GaussianZMatrix(
            self.symbols,
            self.table.refs,
            self.internal.detach().to("cpu", torch.float64).numpy(),
            title=self.title,
            charge=self.charge,
            multiplicity=self.multiplicity,
            variables=tokens,
            route=self.route,
            constants=frozenset(n.upper() for n in self.constants),
        )
        return gaussian.to_string(data, variables=variables, decimals=decimals)

    @classmethod
    def from_rdkit(cls, mol, conf_id: int = -1) -> ZMatrix:
        """An RDKit Mol's conformer, rows in the Mol's atom order; see :func:`zmat.rdkit.zmatrix_from_mol`."""
        # the optional-extra boundary: zmat.rdkit imports RDKit, which `import zmat` must not need;
        # it is a leaf (plain data out, no import of zmat.zmatrix), so this is no import circle
        from .rdkit import zmatrix_from_mol

        data = zmatrix_from_mol(mol, conf_id)
        return cls(data.symbols, data.internal, data.table, title=data.title, charge=data.charge)


# ------------------------------------------------------------------ checks
def _atom_index(a, n: int) -> int:
    """An atom index in ``[0, n)``: an integer (Python, numpy or a 0-d integer tensor)."""
    integer = isinstance(a, torch.Tensor) and not (a.dtype.is_floating_point or a.dtype == torch.bool)
    if integer and a.ndim == 0:
        a = int(a)
    if isinstance(a, bool) or not isinstance(a, int | np.integer):
        raise TypeError(f"atom indices must be integers, got {a!r} ({type(a).__name__})")
    if not 0 <= a < n:
        raise ValueError(f"atom {int(a)} is out of range for a z-matrix of {n} atoms")
    return int(a)


def _check_angles(values: np.ndarray, refs: np.ndarray) -> None:
    """Bond angles in ``[0, pi]``, dihedrals within ``2 pi``: radians, not degrees."""
    theta = np.where(refs[:, 1] >= 0, values[:, 1], 0.0)
    bad = np.nonzero((theta < -1e-9) | (theta > math.pi + 1e-9))[0]
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"row {i}: bond angle {theta[i]:g} is outside [0, pi]: zmat takes radians "
            f"(degrees? use math.radians or torch.deg2rad); rows {bad[:10].tolist()}"
        )
    phi = np.where(refs[:, 2] >= 0, values[:, 2], 0.0)
    far = np.nonzero(np.abs(phi) > 2 * math.pi + 1e-9)[0]
    if len(far):
        warnings.warn(
            f"row {int(far[0])}: dihedral {phi[far[0]]:g} is beyond 2 pi: zmat takes radians "
            f"(degrees?); rows {far[:10].tolist()}",
            stacklevel=3,
        )


def _check_variables(variables, refs: np.ndarray) -> dict[str, list[tuple[int, int, int]]]:
    """Validated ``{name: [(row, column, sign)]}``: present entries, each set once, one kind per name."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    seen: dict[tuple[int, int], str] = {}
    upper: set[str] = set()
    for name, uses in variables.items():
        name = str(name)
        if name.upper() in upper:
            raise ValueError(f"variable {name!r} is given twice (names are case-insensitive)")
        upper.add(name.upper())
        clean = [(int(r), int(c), int(s)) for r, c, s in uses]
        if not clean:
            raise ValueError(f"variable {name!r} has no uses")
        for r, c, s in clean:
            if not (0 <= r < len(refs) and 0 <= c < 3) or refs[r, c] < 0 or s not in (1, -1):
                raise ValueError(
                    f"variable {name!r}: use (row {r}, column {c}, sign {s}) needs a row with that "
                    "reference present and a sign of +1 or -1"
                )
            if (r, c) in seen:
                raise ValueError(f"row {r}, column {c} is set by both {seen[r, c]!r} and {name!r}")
            seen[r, c] = name
        if len({c == 0 for _, c, _ in clean}) > 1:
            raise ValueError(f"variable {name!r} is used for both a length and an angle")
        out[name] = clean
    return out


def _check_file_angles(data: gaussian.GaussianZMatrix) -> None:
    """Bond angles of a file outside ``[0, 180]`` degrees: an error naming the line (the
    constructor's advice, radians rather than degrees, is wrong for a file)."""
    theta = np.where(data.refs[:, 1] >= 0, data.values[:, 1], 0.0)
    bad = np.nonzero((theta < -1e-9) | (theta > math.pi + 1e-9))[0]
    if len(bad) and data.lines:
        i = int(bad[0])
        raise ValueError(
            f"line {data.lines[i]} (row {i}): bond angle {math.degrees(theta[i]):.10g} degrees "
            f"({theta[i]:.10g} rad) is outside [0, 180] degrees"
        )


def _check_constants(constants, uses: dict) -> tuple[str, ...]:
    """``constants`` as the spellings of :attr:`ZMatrix.variable_uses`; each must be a variable."""
    spelling = {name.upper(): name for name in uses}
    out = []
    for name in constants:
        if str(name).upper() not in spelling:
            raise ValueError(f"constant {name!r} is not one of the variables {sorted(spelling.values())}")
        out.append(spelling[str(name).upper()])
    return tuple(dict.fromkeys(out))


def _check_variable_values(uses: dict[str, list[tuple[int, int, int]]], values: np.ndarray) -> None:
    for name, entries in uses.items():
        got = [s * values[r, c] for r, c, s in entries]
        if max(got) - min(got) > 1e-9:
            r0, r1 = entries[int(np.argmin(got))][0], entries[int(np.argmax(got))][0]
            raise ValueError(f"variable {name!r} has different values in rows {r0} and {r1}: {got}")
