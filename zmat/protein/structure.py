"""Proteins: heavy atoms, a construction table over them, torsions.

A :class:`Protein` keeps the heavy atoms of the 20 standard residues, a
construction table over exactly those atoms, their internal coordinates and
the backbone and side-chain torsions. :func:`from_pdb` / :func:`from_structure`
make one from a file or a ``biotite`` ``AtomArray`` (first model and first
altloc by default; hydrogens, waters, ligands and non-standard residues are
skipped; the file handling is ``zmat/protein/io.py``), ``Protein.from_sequence``
and ``Protein.from_batch`` from a sequence or a sample of a
:class:`~zmat.protein.ProteinBatch`.

The whole structure is **one** tree (``zmat/protein/layout.py``): chains and
segments after a chain break hang off the previous residue through a virtual
link whose internal coordinates are measured from the file, so
``zmat.to_xyz(p.internal, p.table)`` gives back ``p.xyz`` up to a single rigid
motion, chain breaks, several chains and truncated side chains included.

Atoms are in template order within each residue (``N, CA, C, O, CB, ...,
OXT``, which is PDB order), residues in file order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from ..clash import alphafold_radii, exclusions_from_bonds
from ..structure.allatom import needs_complex, parse_complex
from ..structure.complex import Complex
from ..table import BOND, PLANAR, ROOT
from ..transform import dihedrals, to_internal, to_xyz
from . import atom37, io
from .build import (
    ProteinBatch,
    as_torsion_tensor,
    close_proline_rings,
    fill_internal,
    protein_layout,
    to_xyz_from_torsions,
)
from .frames import superpose_on_atoms
from .layout import N_TORSIONS, Layout, residue_types, sequence_of
from .topology import TORSION_NAMES

__all__ = ["Protein", "from_pdb", "from_structure"]


class Protein:
    """Heavy atoms of a protein, with a construction table and torsions.

    Made by :func:`from_pdb`, :func:`from_structure`, :meth:`from_sequence`
    or :meth:`from_batch`. N atoms, L residues.

    Attributes:
        sequence: one-letter sequence (``str`` of length L).
        xyz: ``(N, 3)`` float64 tensor of positions (Angstrom).
        atom_names, elements: ``(N,)`` string arrays.
        residue_index: ``(N,)`` int64 tensor, each atom's residue (0..L-1);
            shared with the layout (read it, never write into it).
        chain_id: ``(N,)`` string array, each atom's chain.
        res_names, res_ids, ins_codes, res_chain_ids: ``(L,)`` residue
            annotations as in the file.
        layout: the :class:`~zmat.protein.layout.Layout` (rows, bonds,
            torsion bookkeeping); immutable, its arrays are read-only.
        table: ``ConstructionTable`` over the N atoms (one tree).
        internal: ``(N, 3)`` float64 ``zmat.to_internal(xyz, table)``.
        torsions: dict ``"phi", "psi", "omega", "chi1".."chi4"`` -> ``(L,)``
            float64 tensors in radians, NaN where undefined (termini, chain
            breaks, missing atoms, residues without that chi). phi/psi/omega
            follow ``biotite.structure.dihedral_backbone`` (``omega[i]`` is
            CA(i)-C(i)-N(i+1)-CA(i+1)).
        radii: ``(N,)`` float64 AlphaFold radii (C 1.7, N 1.55, O 1.52, S 1.8).
        bonds: ``(E, 2)`` int64 tensor of covalent bonds: intra-residue with
            ring closures, peptide bonds (not across breaks), disulfides.
    """

    def __init__(
        self,
        lay: Layout,
        xyz,
        res_ids: Sequence[int] | None = None,
        ins_codes: Sequence[str] | None = None,
        res_chain_ids: Sequence[str] | None = None,
    ) -> None:
        self.layout = lay
        self.xyz = torch.as_tensor(xyz, dtype=torch.float64)
        L = lay.n_residues
        if self.xyz.shape != (lay.n_atoms, 3):
            raise ValueError(f"xyz must have shape ({lay.n_atoms}, 3), got {tuple(self.xyz.shape)}")
        self.res_names = lay.res_names
        self.res_ids = np.arange(1, L + 1) if res_ids is None else np.asarray(res_ids, np.int64)
        self.ins_codes = np.full(L, "", "U1") if ins_codes is None else np.asarray(ins_codes, "U1")
        self.res_chain_ids = np.full(L, "A", "U4") if res_chain_ids is None else np.asarray(res_chain_ids)
        self.sequence = sequence_of(residue_types(lay.res_names.tolist()))
        self.atom_names = lay.atom_names
        self.elements = lay.elements
        self.residue_index = lay.tensor("residue_index")
        self.chain_id = self.res_chain_ids[lay.residue_index]

    # ----------------------------------------------------------- basics
    def __len__(self) -> int:
        return self.layout.n_residues

    def __repr__(self) -> str:
        chains = "".join(dict.fromkeys(self.res_chain_ids.tolist()))
        return (
            f"Protein(residues={len(self)}, atoms={self.layout.n_atoms}, chains={chains!r}, "
            f"breaks={self.n_breaks})"
        )

    @property
    def n_atoms(self) -> int:
        return self.layout.n_atoms

    @property
    def n_breaks(self) -> int:
        """Consecutive residues of one chain without a peptide bond."""
        same = self.res_chain_ids[1:] == self.res_chain_ids[:-1]
        return int((same & ~self.layout.bonded[1:]).sum())

    @property
    def table(self):
        return self.layout.table

    @functools.cached_property
    def internal(self) -> torch.Tensor:
        return to_internal(self.xyz, self.table)

    @functools.cached_property
    def torsions(self) -> dict[str, torch.Tensor]:
        t = self.measure_torsions(self.xyz)
        return {name: t[:, k] for k, name in enumerate(TORSION_NAMES)}

    def torsion_tensor(self) -> torch.Tensor:
        """``(L, 7)`` torsions, columns in ``TORSION_NAMES`` order (NaN: undefined)."""
        return torch.stack([self.torsions[k] for k in TORSION_NAMES], -1)

    def measure_torsions(self, xyz: torch.Tensor) -> torch.Tensor:
        """Torsions of other coordinates of these atoms, differentiably.

        Args:
            xyz: ``(..., N, 3)``.

        Returns:
            ``(..., L, 7)`` radians, NaN where undefined.
        """
        return dihedrals(xyz, self.layout.tensor("torsion_atoms", xyz.device))

    @functools.cached_property
    def radii(self) -> torch.Tensor:
        return alphafold_radii(self.elements.tolist(), dtype=torch.float64)

    @property
    def bonds(self) -> torch.Tensor:
        """``(E, 2)`` int64, shared with the layout (read it, never write into it)."""
        return self.layout.tensor("bonds")

    def exclusions(self, depth: int = 3) -> torch.Tensor:
        """``(P, 2)`` int64 atom pairs within ``depth`` covalent bonds (ring
        closures, peptide bonds and disulfides included), for ``zmat.clash_loss``."""
        return exclusions_from_bonds(self.bonds, self.n_atoms, depth=depth)

    # -------------------------------------------------------- rebuilding
    def ideal_internal(self, torsions=None) -> torch.Tensor:
        """Internal coordinates with ideal bond lengths and angles.

        Every chemical row (``layout.ideal_mask``) gets the ideal bond length,
        bond angle and fixed dihedral (``zmat.protein.topology``) and its
        torsion from ``torsions``; rows across chain breaks and virtual links
        keep the measured values, as do torsions given as NaN; proline rings are
        closed (``zmat.protein.build.close_proline_rings``). With the default
        ``torsions`` (this structure's own) this is the torsion-only rebuild of
        the structure; :meth:`internal_from_torsions` keeps its own geometry.

        Args:
            torsions: ``(..., L, 7)`` tensor or dict of ``(..., L)`` tensors;
                default ``self.torsions``.

        Returns:
            ``(..., N, 3)``, differentiable in ``torsions``.
        """
        if torsions is None:
            torsions = self.torsion_tensor()
        return fill_internal(self.layout, torsions, base=self.internal)

    def internal_from_torsions(self, torsions=None, geometry: str = "own") -> torch.Tensor:
        """Internal coordinates of this structure with other torsions.

        Args:
            torsions: ``(..., L, 7)`` tensor (``TORSION_NAMES`` columns, radians)
                or dict of ``(..., L)`` tensors; NaN (or a missing key) keeps the
                structure's own torsion. Default: the structure's own.
            geometry: ``"own"``: every bond length, bond angle and fixed dihedral
                is the structure's (``self.internal``), only the torsions change;
                ``"ideal"``: Engh & Huber's, as :meth:`ideal_internal`. Either
                way rows across chain breaks and between chains keep their
                measured values, so breaks stay breaks; proline rings are closed
                (``zmat.protein.build.close_proline_rings``; with ``"own"``, to
                the structure's own CD-N length).

        Returns:
            ``(..., N, 3)`` for ``self.table``, differentiable in ``torsions``.
            With ``"own"`` and the structure's torsions it is ``self.internal``.
        """
        if geometry == "ideal":
            return self.ideal_internal(torsions)
        if geometry != "own":
            raise ValueError(f"geometry must be 'own' or 'ideal', got {geometry!r}")
        base = self.internal
        if torsions is None:
            return base
        t = as_torsion_tensor(torsions, len(self))
        lay = self.layout
        slot = lay.tensor("torsion_slot", t.device)
        flat = t.flatten(-2).index_select(-1, slot.clamp_min(0))  # (..., N)
        keep = (slot < 0) | torch.isnan(flat)
        phi = torch.where(keep, base[:, 2].to(t), flat)
        r, theta = base[:, 0].to(t), base[:, 1].to(t)
        internal = torch.stack(torch.broadcast_tensors(r, theta, phi), -1)
        return close_proline_rings(lay, internal, cd_n=self._proline_cd_n.to(t))

    @functools.cached_property
    def _proline_cd_n(self) -> torch.Tensor:
        """``(P,)`` CD-N lengths of the prolines of ``layout.proline_rows``."""
        rows = self.layout.proline_rows
        n = self.layout.refs[rows[:, 0], 0]  # CA's bond reference is N
        return (self.xyz[rows[:, 3]] - self.xyz[n]).norm(dim=-1)

    def xyz_from_torsions(self, torsions=None, geometry: str = "own", method: str = "auto") -> torch.Tensor:
        """Coordinates of this structure with other torsions, in its own frame.

        ``zmat.to_xyz(self.internal_from_torsions(torsions, geometry), self.table)``
        moved rigidly so that the tree's first three atoms (the root and its first
        two descendants, whose places no torsion changes) sit where they are in
        ``self.xyz``: with ``geometry="own"`` and the structure's own torsions this
        gives ``self.xyz`` back.

        Example:
            >>> p = zmat.protein.from_pdb("tests/data/1ubi.pdb")
            >>> t = p.torsion_tensor().clone()
            >>> t[10, 3] += 1.0  # turn chi1 of residue 10; every other DOF as in the file
            >>> xyz = p.xyz_from_torsions(t)  # (N, 3), differentiable in t
        """
        x = to_xyz(self.internal_from_torsions(torsions, geometry), self.table, method=method)
        return superpose_on_atoms(x, self.xyz, self._frame_atoms)

    def with_torsions(self, torsions, geometry: str = "own") -> Protein:
        """A copy of this protein (same atoms, annotations) with its coordinates from
        :meth:`xyz_from_torsions` (detached, float64), e.g. to write with ``to_pdb``."""
        xyz = self.xyz_from_torsions(torsions, geometry).detach().to(torch.float64)
        if xyz.shape != self.xyz.shape:
            raise ValueError(f"with_torsions: one structure at a time, torsions gave {tuple(xyz.shape)}")
        return Protein(self.layout, xyz, self.res_ids, self.ins_codes, self.res_chain_ids)

    @functools.cached_property
    def _frame_atoms(self) -> tuple[int, int, int]:
        """The root, its BOND child and the PLANAR row's atom (the tree's fixed start)."""
        kind = self.table.kind
        return tuple(int(np.flatnonzero(kind == k)[0]) for k in (ROOT, BOND, PLANAR))

    # ------------------------------------------------------------- output
    def to_structure(self, xyz=None):
        """A ``biotite.structure.AtomArray`` of these atoms (``xyz`` overrides)."""
        coord = self.xyz if xyz is None else xyz
        coord = torch.as_tensor(coord).detach().cpu().to(torch.float64).numpy()
        if coord.shape != (self.n_atoms, 3):
            raise ValueError(f"xyz must have shape ({self.n_atoms}, 3), got {coord.shape}")
        return io.atom_array(self.layout, coord, self.res_ids, self.ins_codes, self.res_chain_ids)

    def to_pdb(self, path, xyz=None) -> None:
        """Write a PDB file (or mmCIF if ``path`` ends in ``.cif``).

        Args:
            path: output file.
            xyz: optional ``(N, 3)`` coordinates to write instead of ``self.xyz``
                (a sample, a rebuild); a tensor with grad is detached.
        """
        io.write_atoms(self.to_structure(xyz), path)

    # --------------------------------------------------------- factories
    @classmethod
    def from_sequence(cls, sequence: str, xyz=None) -> Protein:
        """A protein of ``sequence`` with every heavy atom (``OXT`` at the end).

        Args:
            sequence: one-letter codes.
            xyz: ``(N, 3)`` coordinates; default: built from ideal geometry with
                the default torsions (``zmat.protein.build``).
        """
        lay = protein_layout(sequence)
        if xyz is None:
            L = lay.n_residues
            nan = torch.full((L, N_TORSIONS), torch.nan, dtype=torch.float64)
            xyz = to_xyz_from_torsions(nan, sequence).detach()
        return cls(lay, xyz)

    @classmethod
    def from_batch(cls, batch: ProteinBatch, b: int, xyz=None) -> Protein:
        """Protein ``b`` of a :class:`~zmat.protein.ProteinBatch`, e.g. to write
        a sample with ``.to_pdb``.

        Args:
            batch: the batch.
            b: index of the protein in the batch.
            xyz: ``(N_max, 3)`` or ``(n_b, 3)`` coordinates (padding dropped);
                default: as :meth:`from_sequence`.

        Example:
            >>> batch = ProteinBatch(["MKV", "ACDEFG"])
            >>> xyz = batch.to_xyz(torch.zeros(2, 6, 7, dtype=torch.float64))
            >>> Protein.from_batch(batch, 1, xyz[1]).sequence
            'ACDEFG'
        """
        if not isinstance(batch, ProteinBatch):
            raise TypeError(f"Protein.from_batch: batch must be a ProteinBatch, got {type(batch).__name__}")
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not -len(batch) <= b < len(batch):
            raise ValueError(
                f"Protein.from_batch: b={b!r} is not an index of a batch of {len(batch)} proteins"
            )
        lay = batch.layouts[b]
        if xyz is None:
            return cls.from_sequence(batch.sequences[b])
        return cls(lay, torch.as_tensor(xyz).detach()[: lay.n_atoms].to(torch.float64))

    # ------------------------------------ AlphaFold tensors (zmat.protein.atom37)
    @property
    def aatype(self) -> torch.Tensor:
        """``(L,)`` int64 residue types in AlphaFold's order (``atom37.RESTYPES``)."""
        return atom37.aatype_of(self)

    def to_atom37(self, xyz=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(..., L, 37, 3)`` positions and ``(L, 37)`` mask (:func:`zmat.protein.atom37.to_atom37`)."""
        return atom37.to_atom37(self, xyz)

    def to_atom14(self, xyz=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(..., L, 14, 3)`` positions and ``(L, 14)`` mask (:func:`zmat.protein.atom37.to_atom14`)."""
        return atom37.to_atom14(self, xyz)


def from_pdb(
    path, chain=None, model: int | None = None, altloc: str = "first", hydrogens=False, ligands=False
) -> Protein:
    """Read a PDB or mmCIF file into a :class:`Protein` (or a :class:`~zmat.protein.Complex`).

    Args:
        path: ``.pdb`` / ``.ent`` (PDB format) or ``.cif`` / ``.mmcif`` / ``.bcif``.
        chain: a chain ID or a list of them; default all chains.
        model: model number, 1-based as in the file (``MODEL 1``); default 1.
        altloc: biotite's altloc choice (``"first"``, ``"occupancy"``, or a letter).
        hydrogens: keep the file's hydrogens and complete the missing ones
            (True, or a :class:`~zmat.protein.Protonation` naming the choices).
        ligands: keep HETATM residues other than water, bonds from the CCD.

    Returns:
        :class:`Protein` over the heavy atoms of the standard residues; a
        :class:`~zmat.protein.Complex` over every kept atom when the structure
        has nucleotides or in-chain modified residues (MSE, 5MU...), or
        ``hydrogens`` or ``ligands`` is set
        (``docs/allatom.md``).

    Raises:
        ValueError: no standard residue left after filtering; unknown chain.

    Example:
        >>> import zmat
        >>> p = from_pdb("tests/data/1aki.pdb")
        >>> xyz = zmat.to_xyz(p.internal, p.table)  # p.xyz up to a rigid motion
    """
    atoms = io.read_atoms(path, model=model, altloc=altloc)
    return from_structure(atoms, chain=chain, hydrogens=hydrogens, ligands=ligands)


def from_structure(atoms, chain=None, hydrogens=False, ligands=False) -> Protein:
    """A :class:`Protein` from a ``biotite.structure.AtomArray`` (see :func:`from_pdb`)."""
    if hydrogens or ligands or needs_complex(atoms, chain):
        return Complex(parse_complex(atoms, chain=chain, hydrogens=hydrogens, ligands=ligands))
    lay, xyz, res_ids, ins_codes, res_chain_ids = io.parse_atoms(atoms, chain=chain)
    return Protein(
        lay, torch.from_numpy(xyz), res_ids=res_ids, ins_codes=ins_codes, res_chain_ids=res_chain_ids
    )
