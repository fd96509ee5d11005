"""PDB / mmCIF files in and out (through biotite), as plain data.

Reading: :func:`read_atoms` loads a file into a ``biotite.structure.AtomArray``
and :func:`parse_atoms` turns one into the pieces of a
:class:`~zmat.protein.Protein` (:class:`ParsedAtoms`): the heavy atoms of the
20 standard residues (hydrogens, waters, ligands and non-standard residues
are skipped), their layout (peptide bonds where ``C(i)-N(i+1)`` is short,
disulfides from :func:`disulfide_bonds`) and coordinates in layout order.
Writing: :func:`atom_array` and :func:`write_atoms`. This module never
builds a ``Protein`` (``zmat.protein.from_pdb`` / ``Protein.to_pdb`` do), so
``structure.py`` can use it without an import circle.

biotite is the optional extra ``protein``: it is imported inside the
functions that need it, so ``import zmat.protein`` works without it.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import NamedTuple

import numpy as np

from .._segments import segment_ids
from ..table import ConstructionTable
from .layout import (
    N_SLOTS,
    SLOT_C,
    SLOT_N,
    Layout,
    layout_from_types,
    residue_types,
    template_slots,
)
from .topology import RESIDUES

__all__ = ["ParsedAtoms", "atom_array", "disulfide_bonds", "parse_atoms", "read_atoms", "write_atoms"]

#: C(i)-N(i+1) distances above this (Angstrom) are chain breaks.
PEPTIDE_BOND_MAX = 2.0
#: SG-SG distances below this (Angstrom) are disulfide bonds.
DISULFIDE_MAX = 2.5
#: Atoms closer than this (Angstrom) coincide: ``from_pdb`` warns.
COINCIDENT_MAX = 0.01


class ParsedAtoms(NamedTuple):
    """A structure's standard heavy atoms (N atoms, L residues)."""

    layout: Layout  #: with the disulfides in ``bonds``
    xyz: np.ndarray  #: ``(N, 3)`` float64, layout order
    res_ids: np.ndarray  #: ``(L,)`` residue numbers as in the file
    ins_codes: np.ndarray  #: ``(L,)`` insertion codes
    res_chain_ids: np.ndarray  #: ``(L,)`` chain of each residue


def read_atoms(path, model: int | None = None, altloc: str = "first"):
    """A ``biotite.structure.AtomArray`` of one model of a PDB or mmCIF file.

    Args:
        path: ``.pdb`` / ``.ent`` (PDB format) or ``.cif`` / ``.mmcif`` / ``.bcif``.
        model: model number, 1-based as in the file (``MODEL 1``); default 1.
        altloc: biotite's altloc choice (``"first"``, ``"occupancy"``, or a letter).
    """
    path = os.fspath(path)
    model = 1 if model is None else int(model)
    letter = altloc not in ("first", "occupancy", "all")
    if letter and not (isinstance(altloc, str) and len(altloc) == 1 and altloc.isalnum()):
        raise ValueError(f"altloc must be 'first', 'occupancy', 'all' or one altloc letter, got {altloc!r}")
    choice = "all" if letter else altloc
    low = path.lower()
    if low.endswith((".cif", ".mmcif", ".bcif")):
        from biotite.structure.io import pdbx

        f = pdbx.BinaryCIFFile.read(path) if low.endswith(".bcif") else pdbx.CIFFile.read(path)
        atoms = pdbx.get_structure(f, model=model, altloc=choice)
    else:
        from biotite.structure.io import pdb

        atoms = pdb.PDBFile.read(path).get_structure(model=model, altloc=choice)
    return _pick_altloc(atoms, altloc) if letter else atoms


def _pick_altloc(atoms, letter: str):
    """Atoms without an altloc ID, and those of altloc ``letter``; a residue that
    has alternate locations but not ``letter`` keeps its first one (as ``"first"``)."""
    import biotite.structure as struc

    ids = atoms.altloc_id
    plain = np.isin(ids, ["", " ", ".", "?"])
    starts = struc.get_residue_starts(atoms, add_exclusive_stop=True)
    res_of = segment_ids(np.diff(starts))
    has_letter = np.bincount(res_of, weights=ids == letter, minlength=len(starts) - 1) > 0
    first = struc.filter_first_altloc(atoms, ids)
    keep = plain | np.where(has_letter[res_of], ids == letter, first)
    out = atoms[keep]
    out.del_annotation("altloc_id")
    return out


def parse_atoms(atoms, chain=None) -> ParsedAtoms:
    """The standard heavy atoms of an ``AtomArray``, on their layout.

    Atoms are in template order within each residue (the first atom of a name
    in a residue wins), residues in file order; consecutive residues of one
    chain are peptide-bonded when their ``C-N`` distance is at most
    ``PEPTIDE_BOND_MAX``.

    Args:
        atoms: ``biotite.structure.AtomArray``.
        chain: a chain ID or a list of them; default all chains.

    Raises:
        ValueError: no standard residue left after filtering; unknown chain.
    """
    import biotite.structure as struc

    if not isinstance(atoms, struc.AtomArray):
        hint = " (take one model: stack[0])" if isinstance(atoms, struc.AtomArrayStack) else ""
        raise TypeError(f"atoms must be a biotite.structure.AtomArray{hint}, got {type(atoms).__name__}")
    atoms = _standard_heavy_atoms(atoms, chain)
    starts = struc.get_residue_starts(atoms, add_exclusive_stop=True)
    L = len(starts) - 1
    types = residue_types(atoms.res_name[starts[:-1]].tolist())
    coord = atoms.coord.astype(np.float64)
    res_of = segment_ids(np.diff(starts))  # residue of each file atom
    where = _slot_map(res_of, template_slots(types[res_of], np.asarray(atoms.atom_name)), L)
    chain_ids = atoms.chain_id[starts[:-1]]
    bonded = _peptide_bonds(coord, where, chain_ids)
    lay = layout_from_types(types, present=where[:L] >= 0, bonded=bonded)
    # file index of every layout atom (atoms in residue order, template order within)
    xyz = coord[where[:L][where[:L] >= 0]]
    lay = dataclasses.replace(lay, bonds=np.concatenate([lay.bonds, disulfide_bonds(xyz, lay)]))
    res_ids = atoms.res_id[starts[:-1]]

    def label(i: int) -> str:
        k = lay.residue_index[i]
        return f"{chain_ids[k]} {lay.res_names[k]} {res_ids[k]} {lay.atom_names[i]}"

    if warn_coincident(xyz, label):
        lay = _reroute_degenerate_rows(lay, xyz)
    return ParsedAtoms(lay, xyz, atoms.res_id[starts[:-1]], atoms.ins_code[starts[:-1]], chain_ids)


def chain_mask(atoms, chain) -> np.ndarray:
    """``(n,)`` bool: the atoms of ``chain`` (an id or ids; ``None``: all), every id checked."""
    if chain is None:
        return np.ones(atoms.array_length(), bool)
    chains = [chain] if isinstance(chain, str) else list(chain)
    missing = set(chains) - set(atoms.chain_id.tolist())
    if missing:
        have = sorted(set(atoms.chain_id))
        raise ValueError(f"chain(s) {sorted(missing)} not in the structure (it has {have})")
    return np.isin(atoms.chain_id, chains)


def _standard_heavy_atoms(atoms, chain):
    """The atoms of standard residues, no hydrogens, of ``chain`` (default all)."""
    keep = np.isin(atoms.res_name, list(RESIDUES)) & ~np.isin(np.char.upper(atoms.element), ["H", "D"])
    atoms = atoms[keep & chain_mask(atoms, chain)]
    if atoms.array_length() == 0:
        raise ValueError("no standard amino-acid residue in the structure")
    return atoms


def _slot_map(res_of: np.ndarray, slot: np.ndarray, L: int) -> np.ndarray:
    """``(L + 1, N_SLOTS)`` file index of each residue's template slot, -1 where
    absent (row ``L``: a residue without atoms); the first atom of a name wins."""
    sel = np.nonzero(slot >= 0)[0]
    _, first = np.unique(res_of[sel] * N_SLOTS + slot[sel], return_index=True)
    sel = sel[first]
    where = np.full((L + 1, N_SLOTS), -1, np.int64)
    where[res_of[sel], slot[sel]] = sel
    return where


def _peptide_bonds(coord: np.ndarray, where: np.ndarray, chain_ids: np.ndarray) -> np.ndarray:
    """``(L,)`` residue ``k`` peptide-bonded to ``k - 1``: same chain, ``C`` and
    ``N`` present, at most ``PEPTIDE_BOND_MAX`` apart."""
    c, n = where[:-2, SLOT_C], where[1:-1, SLOT_N]
    ok = (chain_ids[1:] == chain_ids[:-1]) & (c >= 0) & (n >= 0)
    dist = np.linalg.norm(coord[np.maximum(c, 0)] - coord[np.maximum(n, 0)], axis=-1)
    return np.concatenate([[False], ok & (dist <= PEPTIDE_BOND_MAX)])


def warn_coincident(xyz: np.ndarray, label) -> bool:
    """Warn (naming them, ``label(i)``: atom ``i``'s chain, residue and name) about atoms closer
    than ``COINCIDENT_MAX``: internal coordinates through such atoms (a zero bond, an undefined
    angle or dihedral) do not rebuild them. True when there are any."""
    from scipy.spatial import cKDTree  # imported when used: slow to import (import zmat)

    ok = np.flatnonzero(np.isfinite(xyz).all(1))  # atoms without a position are not compared
    ij = ok[cKDTree(xyz[ok]).query_pairs(COINCIDENT_MAX, output_type="ndarray").reshape(-1, 2)]
    if not len(ij):
        return False
    ij = ij[np.lexsort((ij[:, 1], ij[:, 0]))]
    shown = "; ".join(f"{label(i)} / {label(j)}" for i, j in ij[:5])
    more = f" and {len(ij) - 5} more pairs" if len(ij) > 5 else ""
    warnings.warn(
        f"{len(ij)} pairs of atoms coincide (closer than {COINCIDENT_MAX} A): {shown}{more}; bond "
        "lengths, angles and torsions through them are undefined (torsions there are NaN or "
        "arbitrary); the construction rows go around them",
        UserWarning,
        stacklevel=4,
    )
    return True


def _reroute_degenerate_rows(lay: Layout, xyz: np.ndarray) -> Layout:
    """:func:`reroute_degenerate` on a layout's rows; such rows are no longer canonical (no
    ideal values, no torsion)."""
    refs = reroute_degenerate(lay.refs, xyz)
    changed = (refs != lay.refs).any(1)
    if not changed.any():
        return lay
    mask = lay.ideal_mask.copy()
    mask[changed, 1:] = False
    slot = np.where(changed, -1, lay.torsion_slot)
    return dataclasses.replace(lay, refs=refs, ideal_mask=mask, torsion_slot=slot)


def reroute_degenerate(refs: np.ndarray, xyz: np.ndarray) -> np.ndarray:
    """``(N, 3)`` rows in which those whose angle or dihedral reference is undefined at these
    coordinates (``x_a`` on ``x_b``, or ``x_d, x_a, x_b`` collinear) take, instead, the nearest
    ancestors of ``b`` that define them, so ``to_xyz(to_internal(xyz, rows), rows)`` still gives
    ``xyz``; ``refs`` itself where nothing changes or the new rows would have a cycle."""
    old, refs = refs, refs.copy()
    full = np.flatnonzero(
        (refs[:, 2] >= 0) & (np.linalg.norm(xyz - xyz[refs[:, 0]], axis=-1) > COINCIDENT_MAX)
    )
    bad = [int(v) for v in full if not _defines_frame(xyz, *refs[v])]
    if not bad:
        return old
    for v in bad:
        b = int(refs[v, 0])
        chain = []  # ancestors of b, nearest first
        q = int(refs[b, 0])
        while q >= 0 and len(chain) < 64:
            chain.append(q)
            q = int(refs[q, 0])
        pick = next(
            ((a, d) for i, a in enumerate(chain) for d in chain[i + 1 :] if _defines_frame(xyz, b, a, d)),
            None,
        )
        if pick is not None:
            refs[v, 1:] = pick
    try:
        ConstructionTable(refs)
    except ValueError:  # a cycle: keep the rows (the warning has been given)
        return old
    return refs


def _defines_frame(xyz: np.ndarray, b: int, a: int, d: int) -> bool:
    """``x_a`` apart from ``x_b`` and ``x_d, x_a, x_b`` not collinear."""
    u, w = xyz[b] - xyz[a], xyz[a] - xyz[d]
    nu, nw = np.linalg.norm(u), np.linalg.norm(w)
    if nu <= COINCIDENT_MAX or nw <= COINCIDENT_MAX:
        return False
    return float(np.linalg.norm(np.cross(u / nu, w / nw))) > 1e-3


def disulfide_bonds(xyz: np.ndarray, lay: Layout) -> np.ndarray:
    """``(E, 2)`` int64 SG-SG pairs of cysteines closer than ``DISULFIDE_MAX``,
    ``i < j``, in row-major order.

    Args:
        xyz: ``(N, 3)`` coordinates of the layout's atoms.
        lay: the :class:`~zmat.protein.layout.Layout`.
    """
    sg = np.nonzero((lay.atom_names == "SG") & (lay.res_names[lay.residue_index] == "CYS"))[0]
    if len(sg) < 2:
        return np.zeros((0, 2), np.int64)
    p = xyz[sg]
    from scipy.spatial import cKDTree  # imported when used: slow to import (import zmat)

    ij = cKDTree(p).query_pairs(DISULFIDE_MAX, output_type="ndarray").reshape(-1, 2)
    ij = np.sort(ij, axis=1)
    ij = ij[np.linalg.norm(p[ij[:, 0]] - p[ij[:, 1]], axis=-1) < DISULFIDE_MAX]  # strictly closer
    ij = ij[np.lexsort((ij[:, 1], ij[:, 0]))]
    return np.stack([sg[ij[:, 0]], sg[ij[:, 1]]], 1).astype(np.int64)


def atom_array(lay: Layout, xyz: np.ndarray, res_ids, ins_codes, res_chain_ids):
    """A ``biotite.structure.AtomArray`` of a layout's atoms.

    Args:
        lay: the :class:`~zmat.protein.layout.Layout` (N atoms, L residues).
        xyz: ``(N, 3)`` coordinates.
        res_ids, ins_codes, res_chain_ids: ``(L,)`` residue annotations.
    """
    import biotite.structure as struc

    arr = struc.AtomArray(lay.n_atoms)
    arr.coord = np.asarray(xyz).astype(np.float32)
    ri = lay.residue_index
    arr.chain_id = res_chain_ids[ri]
    arr.res_id = res_ids[ri]
    arr.ins_code = ins_codes[ri]
    arr.res_name = lay.res_names[ri]
    arr.atom_name = lay.atom_names.copy()  # the layout's arrays are read-only and shared
    arr.element = lay.elements.copy()
    arr.hetero = np.zeros(lay.n_atoms, bool)
    return arr


def write_atoms(arr, path) -> None:
    """Write an ``AtomArray`` as PDB, or mmCIF if ``path`` ends in ``.cif`` / ``.mmcif``."""
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
