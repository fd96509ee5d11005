"""The :class:`ZMatrix` class: symbols + internal coordinates + construction table.

Gaussian-style z-matrix text is read and written by :mod:`zmat.gaussian` (the
file format is described there); :meth:`ZMatrix.read`, :meth:`ZMatrix.from_string`,
:meth:`ZMatrix.write` and :meth:`ZMatrix.to_string` convert between its plain
data and a :class:`ZMatrix`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from . import gaussian
from .autotable import construction_table
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
        return cls(
            data.symbols,
            torch.from_numpy(data.values),
            data.refs,
            title=data.title,
            charge=data.charge,
            multiplicity=data.multiplicity,
        )

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
        data = gaussian.GaussianZMatrix(
            self.symbols,
            self.table.refs,
            self.internal.detach().to("cpu", torch.float64).numpy(),
            title=self.title,
            charge=self.charge,
            multiplicity=self.multiplicity,
        )
        return gaussian.to_string(data, variables=variables)

    @classmethod
    def from_rdkit(cls, mol, conf_id: int = -1) -> ZMatrix:
        """An RDKit Mol's conformer, rows in the Mol's atom order; see :func:`zmat.rdkit.zmatrix_from_mol`."""
        from .rdkit import zmatrix_from_mol  # RDKit is an optional dependency

        return zmatrix_from_mol(mol, conf_id)
