"""Proteins read from PDB / mmCIF files (through biotite), and written back.

:func:`from_pdb` keeps the heavy atoms of the 20 standard residues (first model
and first altloc by default; hydrogens, waters, ligands and non-standard
residues are skipped) and returns a :class:`Protein`: coordinates, a
construction table over exactly those atoms, their internal coordinates and the
backbone and side-chain torsions.

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
import os
from collections.abc import Sequence

import numpy as np
import torch

from ..transform import dihedrals, to_internal
from . import atom37
from .layout import (
    _ALL_NAMES,
    _LETTERS,
    _N_SLOTS,
    _SC,
    _SLOT_OF_NAME,
    _SN,
    N_TORSIONS,
    Layout,
    layout_from_types,
    residue_types,
)
from .topology import RESIDUES, TORSION_NAMES

__all__ = ["Protein", "from_pdb", "from_structure"]

#: C(i)-N(i+1) distances above this (Angstrom) are chain breaks.
PEPTIDE_BOND_MAX = 2.0
#: SG-SG distances below this (Angstrom) are disulfide bonds.
DISULFIDE_MAX = 2.5


class Protein:
    """Heavy atoms of a protein, with a construction table and torsions.

    Made by :func:`from_pdb`, :func:`from_structure` or
    ``zmat.protein.Protein.from_sequence``. N atoms, L residues.

    Attributes:
        sequence: one-letter sequence (``str`` of length L).
        xyz: ``(N, 3)`` float64 tensor of positions (Angstrom).
        atom_names, elements: ``(N,)`` string arrays.
        residue_index: ``(N,)`` int64 tensor, each atom's residue (0..L-1).
        chain_id: ``(N,)`` string array, each atom's chain.
        res_names, res_ids, ins_codes, res_chain_ids: ``(L,)`` residue
            annotations as in the file.
        layout: the :class:`~zmat.protein.layout.Layout` (rows, bonds,
            torsion bookkeeping).
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
        self.sequence = _LETTERS[residue_types(lay.res_names.tolist())].tobytes().decode("ascii")
        self.atom_names = lay.atom_names
        self.elements = lay.elements
        self.residue_index = torch.as_tensor(lay.residue_index)
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
        quads = torch.as_tensor(self.layout.torsion_atoms, device=xyz.device)
        return dihedrals(xyz, quads)

    @functools.cached_property
    def radii(self) -> torch.Tensor:
        from ..clash import alphafold_radii

        return alphafold_radii(self.elements.tolist(), dtype=torch.float64)

    @property
    def bonds(self) -> torch.Tensor:
        return torch.as_tensor(self.layout.bonds)

    def exclusions(self, depth: int = 3) -> torch.Tensor:
        """``(P, 2)`` int64 atom pairs within ``depth`` covalent bonds (ring
        closures, peptide bonds and disulfides included), for ``zmat.clash_loss``."""
        from ..clash import exclusions_from_bonds

        return exclusions_from_bonds(self.layout.bonds, self.n_atoms, depth=depth)

    # -------------------------------------------------------- rebuilding
    def ideal_internal(self, torsions=None) -> torch.Tensor:
        """Internal coordinates with ideal bond lengths and angles.

        Every chemical row (``layout.ideal_mask``) gets the ideal bond length,
        bond angle and fixed dihedral (``zmat.protein.topology``) and its
        torsion from ``torsions``; rows across chain breaks and virtual links
        keep the measured values, as do torsions given as NaN. With the
        default ``torsions`` (this structure's own) this is the torsion-only
        rebuild of the structure.

        Args:
            torsions: ``(..., L, 7)`` tensor or dict of ``(..., L)`` tensors;
                default ``self.torsions``.

        Returns:
            ``(..., N, 3)``, differentiable in ``torsions``.
        """
        from .build import fill_internal

        if torsions is None:
            torsions = self.torsion_tensor()
        return fill_internal(self.layout, torsions, base=self.internal)

    # ------------------------------------------------------------- output
    def to_structure(self, xyz=None):
        """A ``biotite.structure.AtomArray`` of these atoms (``xyz`` overrides)."""
        import biotite.structure as struc

        coord = self.xyz if xyz is None else xyz
        coord = torch.as_tensor(coord).detach().cpu().to(torch.float64).numpy()
        if coord.shape != (self.n_atoms, 3):
            raise ValueError(f"xyz must have shape ({self.n_atoms}, 3), got {coord.shape}")
        arr = struc.AtomArray(self.n_atoms)
        arr.coord = coord.astype(np.float32)
        ri = self.layout.residue_index
        arr.chain_id = self.res_chain_ids[ri]
        arr.res_id = self.res_ids[ri]
        arr.ins_code = self.ins_codes[ri]
        arr.res_name = self.res_names[ri]
        arr.atom_name = self.atom_names
        arr.element = self.elements
        arr.hetero = np.zeros(self.n_atoms, bool)
        return arr

    def to_pdb(self, path, xyz=None) -> None:
        """Write a PDB file (or mmCIF if ``path`` ends in ``.cif``).

        Args:
            path: output file.
            xyz: optional ``(N, 3)`` coordinates to write instead of ``self.xyz``
                (a sample, a rebuild); a tensor with grad is detached.
        """
        arr = self.to_structure(xyz)
        if str(path).lower().endswith((".cif", ".mmcif")):
            from biotite.structure.io import pdbx

            f = pdbx.CIFFile()
            pdbx.set_structure(f, arr)
            f.write(str(path))
        else:
            from biotite.structure.io import pdb

            f = pdb.PDBFile()
            f.set_structure(arr)
            f.write(str(path))

    # --------------------------------------------------------- factories
    @classmethod
    def from_sequence(cls, sequence: str, xyz=None) -> Protein:
        """A protein of ``sequence`` with every heavy atom (``OXT`` at the end).

        Args:
            sequence: one-letter codes.
            xyz: ``(N, 3)`` coordinates; default: built from ideal geometry with
                the default torsions (``zmat.protein.build``).
        """
        from .build import protein_layout, to_xyz_from_torsions

        lay = protein_layout(sequence)
        if xyz is None:
            L = lay.n_residues
            nan = torch.full((L, N_TORSIONS), torch.nan, dtype=torch.float64)
            xyz = to_xyz_from_torsions(nan, sequence).detach()
        return cls(lay, xyz)

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


def from_pdb(path, chain=None, model: int | None = None, altloc: str = "first") -> Protein:
    """Read a PDB or mmCIF file into a :class:`Protein`.

    Args:
        path: ``.pdb`` / ``.ent`` (PDB format) or ``.cif`` / ``.mmcif`` / ``.bcif``.
        chain: a chain ID or a list of them; default all chains.
        model: model number, 1-based as in the file (``MODEL 1``); default 1.
        altloc: biotite's altloc choice (``"first"``, ``"occupancy"``, or a letter).

    Returns:
        :class:`Protein` over the heavy atoms of the standard residues.

    Raises:
        ValueError: no standard residue left after filtering; unknown chain.

    Example:
        >>> p = from_pdb("tests/data/1aki.pdb")
        >>> xyz = zmat.to_xyz(p.internal, p.table)  # p.xyz up to a rigid motion
    """
    path = os.fspath(path)
    model = 1 if model is None else int(model)
    low = path.lower()
    if low.endswith((".cif", ".mmcif", ".bcif")):
        from biotite.structure.io import pdbx

        f = pdbx.BinaryCIFFile.read(path) if low.endswith(".bcif") else pdbx.CIFFile.read(path)
        arr = pdbx.get_structure(f, model=model, altloc=altloc)
    else:
        from biotite.structure.io import pdb

        arr = pdb.PDBFile.read(path).get_structure(model=model, altloc=altloc)
    return from_structure(arr, chain=chain)


def from_structure(atoms, chain=None) -> Protein:
    """A :class:`Protein` from a ``biotite.structure.AtomArray`` (see :func:`from_pdb`)."""
    import biotite.structure as struc

    keep = np.isin(atoms.res_name, list(RESIDUES)) & ~np.isin(np.char.upper(atoms.element), ["H", "D"])
    if chain is not None:
        chains = [chain] if isinstance(chain, str) else list(chain)
        missing = set(chains) - set(atoms.chain_id.tolist())
        if missing:
            raise ValueError(
                f"chain(s) {sorted(missing)} not in the structure (it has {sorted(set(atoms.chain_id))})"
            )
        keep &= np.isin(atoms.chain_id, chains)
    atoms = atoms[keep]
    if atoms.array_length() == 0:
        raise ValueError("no standard amino-acid residue in the structure")
    starts = struc.get_residue_starts(atoms, add_exclusive_stop=True)
    L = len(starts) - 1
    res_names = atoms.res_name[starts[:-1]]
    types = residue_types(res_names.tolist())
    coord = atoms.coord.astype(np.float64)
    # template slot of every file atom (-1: not a template atom); the first
    # occurrence of a name in a residue wins
    res_of = np.repeat(np.arange(L), np.diff(starts))
    names = np.asarray(atoms.atom_name)
    nid = np.minimum(np.searchsorted(_ALL_NAMES, names), len(_ALL_NAMES) - 1)
    slot = np.where(_ALL_NAMES[nid] == names, _SLOT_OF_NAME[types[res_of], nid], -1)
    sel = np.nonzero(slot >= 0)[0]
    _, first = np.unique(res_of[sel] * _N_SLOTS + slot[sel], return_index=True)
    sel = sel[first]
    where = np.full((L + 1, _N_SLOTS), -1, np.int64)  # file index per (residue, slot); row L: none
    where[res_of[sel], slot[sel]] = sel

    # peptide bonds: same chain, C and N present, short enough
    chain_ids = atoms.chain_id[starts[:-1]]
    c, n = where[:-2, _SC], where[1:-1, _SN]
    ok = (chain_ids[1:] == chain_ids[:-1]) & (c >= 0) & (n >= 0)
    dist = np.linalg.norm(coord[np.maximum(c, 0)] - coord[np.maximum(n, 0)], axis=-1)
    bonded = np.concatenate([[False], ok & (dist <= PEPTIDE_BOND_MAX)])

    lay0 = layout_from_types(types, present=where[:L] >= 0, bonded=bonded)
    # file index of every layout atom (atoms in residue order, template order within)
    src = where[:L][where[:L] >= 0]
    xyz = coord[src]
    lay0.bonds = np.concatenate([lay0.bonds, _disulfides(xyz, lay0)])
    return Protein(
        lay0,
        torch.from_numpy(xyz),
        res_ids=atoms.res_id[starts[:-1]],
        ins_codes=atoms.ins_code[starts[:-1]],
        res_chain_ids=chain_ids,
    )


def _disulfides(xyz: np.ndarray, lay: Layout) -> np.ndarray:
    """``(E, 2)`` SG-SG pairs of cysteines closer than ``DISULFIDE_MAX``, ``i < j``
    in row-major order."""
    from scipy.spatial import cKDTree

    sg = np.nonzero((lay.atom_names == "SG") & (lay.res_names[lay.residue_index] == "CYS"))[0]
    if len(sg) < 2:
        return np.zeros((0, 2), np.int64)
    p = xyz[sg]
    ij = cKDTree(p).query_pairs(DISULFIDE_MAX, output_type="ndarray").reshape(-1, 2)
    ij = np.sort(ij, axis=1)
    ij = ij[np.linalg.norm(p[ij[:, 0]] - p[ij[:, 1]], axis=-1) < DISULFIDE_MAX]  # strictly closer
    ij = ij[np.lexsort((ij[:, 1], ij[:, 0]))]
    return np.stack([sg[ij[:, 0]], sg[ij[:, 1]]], 1).astype(np.int64)
