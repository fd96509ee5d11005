"""All-atom structures: :class:`Complex`, what ``zmat.protein.from_pdb`` returns
for nucleic acids, hydrogens or ligands.

A :class:`Complex` holds every kept atom of a structure (see
``zmat/structure/allatom.py`` for what is kept, the tree and the rows), its
construction table, internal coordinates, bonds with bond orders, and the
torsions of its polymer residues: for amino acids ``phi, psi, omega,
chi1..chi4`` (as :class:`~zmat.protein.Protein`), for nucleotides ``alpha ..
zeta, chi`` and the sugar pucker ``pucker_phase, pucker_amplitude``
(``zmat/structure/nucleic.py``); every name is a key, NaN where a residue does
not have it.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..clash import exclusions_from_bonds, vdw_radii
from ..protein.atom37 import ATOM_ORDER, aatype_from_names, to_atom14, to_atom37
from ..protein.frames import superpose_on_atoms
from ..protein.io import write_atoms
from ..protein.topology import RESIDUES, TORSION_NAMES
from ..table import BOND, PLANAR, ROOT, ConstructionTable
from ..transform import dihedrals, to_internal, to_xyz
from .allatom import QUAD_NAMES, ComplexAtoms
from .amino_ideal import AminoIdeal, amino_ideal
from .amino_ideal import apply as apply_amino
from .complex_batch import ComplexBatch
from .modified import parent_name
from .nucleic import NUCLEIC_TORSIONS, pucker
from .nucleic_ideal import NucleicIdeal, nucleic_ideal
from .nucleic_ideal import apply as apply_ideal

__all__ = ["TORSION_KEYS", "Complex"]

#: The keys of ``Complex.torsions``.
TORSION_KEYS = TORSION_NAMES + NUCLEIC_TORSIONS
_NU = [QUAD_NAMES.index(f"nu{j}") for j in range(5)]
_PUCKER = ("pucker_phase", "pucker_amplitude")


class _ProteinView:
    """A Complex's amino-acid residues as ``zmat.protein.atom37``'s layout gather reads them
    (per atom its amino-acid residue, -1 for every other atom, hydrogens and extra atoms).
    A modified residue in a chain is its parent type (``res_types``), its atoms under the
    parent's names (MSE's ``SE`` in ``SD``'s slot, as AlphaFold's data pipeline puts it),
    those its parent lacks left out."""

    def __init__(self, c: Complex) -> None:
        prot = c.family == "protein"
        ri = c.parsed.residue
        names = c.atom_names.copy()
        heavy = (c.elements != "H") & ~c.parsed.extra
        keep = np.isin(names, list(ATOM_ORDER)) & heavy
        for k in np.flatnonzero(prot & (c.res_types != c.res_names)).tolist():
            own = np.flatnonzero(ri == k)
            names[own] = [parent_name(str(c.res_names[k]), str(a)) for a in names[own]]
            keep[own] = np.isin(names[own], RESIDUES[str(c.res_types[k])].atoms) & heavy[own]
        self.residue_index = np.where(prot[ri] & keep, (np.cumsum(prot) - 1)[ri], -1)
        self.atom_names, self.res_names, self.n_atoms = names, c.res_types[prot], c.n_atoms
        self._n = int(prot.sum())

    def __len__(self) -> int:
        return self._n


class Complex:
    """Every kept atom of a structure: polymers, hydrogens, ligands (N atoms).

    Attributes:
        xyz: ``(N, 3)`` float64 tensor (Angstrom).
        atom_names, elements: ``(N,)`` string arrays; ``added`` ``(N,)`` bool,
            True for a hydrogen zmat completed.
        residue_index: ``(N,)`` int64 tensor, each atom's residue (all residues,
            ligands included, file order).
        res_names, res_ids, ins_codes, res_chain_ids, hetero, family: per residue.
        res_types: ``(R,)`` the standard type each polymer residue is built as: its name,
            or an in-chain modified residue's CCD parent (``MSE`` -> ``MET``, ``5MU`` -> ``U``;
            ``zmat/structure/modified.py``), ``""`` for ligands.
        polymer: ``(R,)`` bool, the polymer residues (the L of ``torsions``), in-chain
            modified residues with a standard parent included.
        table: one-tree ``ConstructionTable``; ``internal`` ``(N, 3)``.
        bonds: ``(E, 2)`` int64 tensor, ``bond_orders`` ``(E,)`` biotite
            ``BondType`` codes.
        torsions: dict of ``(L,)`` float64 tensors over the polymer residues,
            keys ``TORSION_KEYS``, radians, NaN where absent.
        ligand_torsions: ``(T,)`` the torsions of the ligands' rotatable bonds
            (``zmat/structure/ligands.py``) and of modified residues' bonds beyond their
            parent's (SEP's ``CB-OG``, ``OG-P``: ``modified.beyond_parent``); ``ligand_quads``
            ``(T, 4)`` their atoms, ``ligand_residue`` ``(T,)`` their residue.
    """

    def __init__(self, parsed: ComplexAtoms) -> None:
        self.parsed = parsed
        self.xyz = torch.from_numpy(parsed.xyz.copy())
        self.atom_names = parsed.atom_names
        self.elements = parsed.elements
        self.added = parsed.added
        self.residue_index = torch.from_numpy(parsed.residue)
        self.res_names = parsed.res_names
        self.res_ids = parsed.res_ids
        self.ins_codes = parsed.ins_codes
        self.res_chain_ids = parsed.chain_ids
        self.hetero = parsed.hetero
        self.family = parsed.family
        self.res_types = parsed.res_types
        self.polymer = parsed.family != "ligand"
        self.chain_id = parsed.chain_ids[parsed.residue]
        self.bonds = torch.from_numpy(parsed.bonds)
        self.bond_orders = parsed.bond_orders
        self.quads = torch.from_numpy(parsed.quads)
        self.ligand_quads = torch.from_numpy(parsed.ligand_quads)
        self.ligand_residue = parsed.ligand_residue

    def __len__(self) -> int:
        return int(self.polymer.sum())

    @classmethod
    def batch(cls, items) -> ComplexBatch:
        """A :class:`~zmat.structure.complex_batch.ComplexBatch` of complexes (``zmat.collate``)."""
        return ComplexBatch(items)

    def __repr__(self) -> str:
        fam = {f: int((self.family == f).sum()) for f in ("protein", "nucleic", "ligand")}
        return f"Complex(atoms={self.n_atoms}, residues={fam}, hydrogens={int((self.elements == 'H').sum())})"

    @property
    def n_atoms(self) -> int:
        return len(self.atom_names)

    @functools.cached_property
    def table(self) -> ConstructionTable:
        return ConstructionTable(self.parsed.refs)

    @functools.cached_property
    def internal(self) -> torch.Tensor:
        return to_internal(self.xyz, self.table)

    @functools.cached_property
    def torsions(self) -> dict[str, torch.Tensor]:
        return self.measure_torsions(self.xyz)

    @functools.cached_property
    def ligand_torsions(self) -> torch.Tensor:
        return dihedrals(self.xyz, self.ligand_quads)

    def measure_torsions(self, xyz: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ``torsions`` dict of other coordinates ``(..., N, 3)``, differentiably."""
        d = dihedrals(xyz, self.quads.to(xyz.device))  # (..., L, Q)
        out = {name: d[..., k] for k, name in enumerate(QUAD_NAMES[:14])}
        out["pucker_phase"], out["pucker_amplitude"] = pucker(d[..., _NU])
        return {k: out[k] for k in TORSION_KEYS}

    @functools.cached_property
    def radii(self) -> torch.Tensor:
        """``(N,)`` float64 van der Waals radii (``zmat.clash.vdw_radii``)."""
        return vdw_radii(self.elements.tolist(), dtype=torch.float64)

    def exclusions(self, depth: int = 3) -> torch.Tensor:
        """``(P, 2)`` atom pairs within ``depth`` bonds, for ``zmat.clash_loss``."""
        return exclusions_from_bonds(self.bonds, self.n_atoms, depth=depth)

    def torsion_rows(self) -> dict[str, torch.Tensor]:
        """Per torsion key (dihedrals only), ``(L,)`` the atom whose row's
        dihedral column is that torsion (its row is the quad reversed), -1
        where the torsion is absent or not a row of this table; ``"ligand"``:
        ``(T,)`` the rows of ``ligand_torsions``."""
        q = self.parsed.quads
        refs = self.parsed.refs
        last = np.maximum(q[..., 3], 0)
        is_row = (q[..., 3] >= 0) & (refs[last] == q[..., 2::-1]).all(-1)
        rows = np.where(is_row, q[..., 3], -1)
        out = {name: torch.from_numpy(rows[:, k]) for k, name in enumerate(QUAD_NAMES[:14])}
        out["ligand"] = torch.from_numpy(self.parsed.ligand_rows)
        return out

    def internal_with_torsions(self, torsions: dict) -> torch.Tensor:
        """``internal`` with given torsions written into their rows' dihedral
        columns (NaN entries keep the measured value); differentiable in
        ``torsions``. OFFSET siblings follow.

        Args:
            torsions: dict of ``(L,)`` tensors, keys among the dihedral keys of
                ``TORSION_KEYS`` (not the pucker), and ``"ligand"``: ``(T,)``
                values of ``ligand_torsions``.

        Raises:
            ValueError: an unknown key, a wrong shape, or a value (not NaN) for a
                torsion that exists but is not a degree of freedom (a row rerouted
                around coincident atoms), naming chain, residue and torsion. Values of
                absent torsions (NaN in ``torsions``: termini, breaks) are ignored.
        """
        rows = self._row_index
        self._check_torsions(torsions, set(rows))
        out = self.internal
        phi = out[:, 2]
        for name, value in torsions.items():
            sel, idx = rows[name]  # fixed indices: no data-dependent indexing, no host sync
            v = torch.as_tensor(value, dtype=out.dtype)[sel]
            phi = phi.index_put((idx,), torch.where(torch.isnan(v), phi[idx], v))
        return torch.cat([out[:, :2], phi[:, None]], 1)

    def _check_torsions(self, torsions: dict, known: set) -> None:
        """Names and shapes, and no value for a torsion that is not a degree of freedom
        (values on an accelerator: one host sync; none on the CPU or while compiling)."""
        unknown = set(torsions) - known
        if unknown:
            raise ValueError(f"unknown torsion names {sorted(unknown)}; expected some of {sorted(known)}")
        for name, value in torsions.items():
            value = torch.as_tensor(value)
            shape = (len(self.parsed.ligand_rows),) if name == "ligand" else (len(self),)
            if value.shape != shape:
                raise ValueError(f"torsion {name!r} must have shape {shape}, got {tuple(value.shape)}")
            fixed = self._not_dof.get(name)
            if fixed is None or not len(fixed) or torch.compiler.is_compiling():
                continue
            # read through numpy: no dispatched op, so no host sync for CPU values
            given = value.detach().cpu().numpy()[fixed.numpy()]
            if np.isnan(given).all():
                continue
            res = int(fixed[np.flatnonzero(~np.isnan(given))[0]])
            k = int(np.flatnonzero(self.polymer)[res])
            raise ValueError(
                f"torsion {name!r} of chain {self.res_chain_ids[k]} residue {self.res_names[k]} "
                f"{self.res_ids[k]}{self.ins_codes[k]} (index {res}) is not a degree of freedom "
                "(its row goes around coincident atoms); give NaN there"
            )

    @functools.cached_property
    def _row_index(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per key, the entries that are rows and their atoms (``torsion_rows``, -1 dropped)."""
        out = {}
        for name, r in self.torsion_rows().items():
            sel = torch.nonzero(r >= 0)[:, 0]
            out[name] = (sel, r[sel])
        return out

    @functools.cached_property
    def _not_dof(self) -> dict[str, torch.Tensor]:
        """Per dihedral key, the residues whose torsion exists but is no row (absent ones,
        NaN in ``torsions``, are ignored, as ``Protein`` does)."""
        rows = self.torsion_rows()
        t = self.torsions
        return {k: torch.nonzero((r < 0) & ~t[k].isnan())[:, 0] for k, r in rows.items() if k != "ligand"}

    def internal_from_torsions(self, torsions: dict | None = None, geometry: str = "own") -> torch.Tensor:
        """Internal coordinates with other torsions, as ``Protein.internal_from_torsions``:
        ``"own"`` keeps every measured bond, angle and fixed dihedral
        (:meth:`internal_with_torsions`), ``"ideal"`` uses ideal geometry
        (:meth:`ideal_internal`). ``torsions``: dict of ``(L,)`` tensors; NaN or a missing
        key keeps the structure's own. With ``"own"``, ``pucker_phase`` /
        ``pucker_amplitude`` given (not NaN) for a nucleotide rebuild that residue's own
        rows ideally (:meth:`ideal_internal`, its other torsions its own) and keep every
        other row measured: a pucker edit of one residue changes no bond or angle outside it."""
        if geometry == "ideal":
            return self.ideal_internal(torsions)
        if geometry != "own":
            raise ValueError(f"geometry must be 'own' or 'ideal', got {geometry!r}")
        if torsions is None:
            return self.internal
        rings = {k: v for k, v in torsions.items() if k in _PUCKER}
        rest = {k: v for k, v in torsions.items() if k not in _PUCKER}
        out = self.internal_with_torsions(rest) if rest else self.internal
        if not rings:
            return out
        self._check_torsions(rings, set(_PUCKER))
        edited = torch.zeros(len(self), dtype=torch.bool, device=out.device)
        for v in rings.values():
            edited = edited | ~torch.as_tensor(v, device=out.device).isnan()
        ideal = self.ideal_internal({**rest, **rings})
        ri = self.parsed.residue
        nucleic = torch.from_numpy((self.family == "nucleic")[ri]).to(out.device)
        atoms = (
            nucleic & edited[torch.from_numpy(np.maximum(self.parsed.polymer_index, 0)[ri]).to(out.device)]
        )
        return torch.where(atoms[:, None], ideal, out)

    def xyz_from_torsions(self, torsions: dict | None = None, geometry: str = "own", method: str = "auto"):
        """``(N, 3)`` coordinates with other torsions in the file's frame: the tree's first
        three atoms (which no torsion moves) where they are in ``self.xyz``. A torsion edit
        moves only atoms of its own chain downstream of the rotated bond; with the
        structure's own torsions and ``"own"`` this is ``self.xyz``."""
        x = to_xyz(self.internal_from_torsions(torsions, geometry), self.table, method=method)
        kind = self.table.kind
        frame = tuple(int(np.flatnonzero(kind == k)[0]) for k in (ROOT, BOND, PLANAR))
        return superpose_on_atoms(x, self.xyz, frame)

    # --------------------------------------------------------- rebuilding
    @functools.cached_property
    def nucleic_plan(self) -> NucleicIdeal:
        rows = {k: v.numpy() for k, v in self.torsion_rows().items()}
        R = len(self.res_names)
        prev = np.where(self.parsed.linked, np.arange(R) - 1, -1)
        return nucleic_ideal(self.parsed, rows, prev)

    @functools.cached_property
    def amino_plan(self) -> AminoIdeal:
        R = len(self.res_names)
        return amino_ideal(self.parsed, np.where(self.parsed.linked, np.arange(R) - 1, -1))

    def ideal_internal(self, torsions: dict | None = None) -> torch.Tensor:
        """Internal coordinates with ideal geometry (``zmat/structure/nucleic_ideal.py``,
        ``zmat/structure/amino_ideal.py``).

        Amino-acid rows get the templates' ideal values and ``phi .. chi4``
        from ``torsions``; nucleotide rows CCD bond lengths, angles and fixed dihedrals,
        ``alpha..zeta, chi`` from ``torsions`` and the sugar ring from
        ``pucker_phase, pucker_amplitude``, closed exactly (delta follows the
        ring); missing keys and NaN entries take this structure's values, and
        every other row keeps its measured value. With the default this is
        the ideal-geometry rebuild of the structure from its own torsions and
        puckers.

        Args:
            torsions: dict of ``(L,)`` tensors, keys among ``TORSION_KEYS``.

        Returns:
            ``(N, 3)``, differentiable in the torsions and puckers.
        """
        torsions = {} if torsions is None else dict(torsions)
        self._check_torsions(torsions, set(TORSION_KEYS))
        c = apply_amino(self.amino_plan, self.internal, torsions, self.torsions)
        return apply_ideal(self.nucleic_plan, c, torsions, self.torsions)

    # ------------------------------------------------- AlphaFold's tensors
    @functools.cached_property
    def _protein_view(self) -> _ProteinView:
        return _ProteinView(self)

    @property
    def aatype(self) -> torch.Tensor:
        """``(P,)`` int64 AlphaFold residue types of the structure's P amino-acid residues
        (file order; in-chain modified residues as their parent, MSE as MET, as AlphaFold's
        data pipeline reads them; nucleotides and ligands are not among them)."""
        return torch.from_numpy(aatype_from_names(self._protein_view.res_names))

    def to_atom37(self, xyz=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(..., P, 37, 3)`` positions of the amino-acid residues and their ``(P, 37)`` mask,
        as ``Protein.to_atom37`` gives for the protein alone (hydrogens left out);
        ``xyz``: ``(..., N, 3)`` in this structure's atom order, default ``self.xyz``."""
        return to_atom37(self._protein_view, self.xyz if xyz is None else xyz)

    def to_atom14(self, xyz=None) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`to_atom37`, in atom14 (``OXT`` dropped)."""
        return to_atom14(self._protein_view, self.xyz if xyz is None else xyz)

    # ------------------------------------------------------------- output
    def to_structure(self, xyz=None):
        """A ``biotite.structure.AtomArray`` of every kept atom, with its bonds
        (``xyz`` overrides the coordinates)."""
        import biotite.structure as struc

        coord = self.xyz if xyz is None else xyz
        coord = torch.as_tensor(coord).detach().cpu().to(torch.float64).numpy()
        if coord.shape != (self.n_atoms, 3):
            raise ValueError(f"xyz must have shape ({self.n_atoms}, 3), got {coord.shape}")
        ri = self.parsed.residue
        arr = struc.AtomArray(self.n_atoms)
        arr.coord = coord.astype(np.float32)
        arr.chain_id = self.res_chain_ids[ri]
        arr.res_id = self.res_ids[ri]
        arr.ins_code = self.ins_codes[ri]
        arr.res_name = self.res_names[ri]
        arr.atom_name = self.atom_names.copy()
        arr.element = self.elements.copy()
        arr.hetero = self.hetero[ri]
        rows = np.column_stack([self.parsed.bonds, self.bond_orders]).astype(np.int64)
        arr.bonds = struc.BondList(self.n_atoms, rows)
        return arr

    def to_pdb(self, path, xyz=None) -> None:
        """Write PDB (bonds as ``CONECT``), or mmCIF for ``.cif`` / ``.mmcif`` (bonds with
        their orders: ``chem_comp_bond`` and ``struct_conn``), through biotite."""
        write_atoms(self.to_structure(xyz), path)
