"""AlphaFold's atom37 / atom14 tensors -> :class:`~zmat.protein.Protein`.

The way back from :mod:`zmat.protein.atom37`: the atoms a mask selects become a
biotite ``AtomArray`` read by :func:`~zmat.protein.from_structure` (so chain
breaks and disulfides are found as for a PDB file), and the float64 positions
are then copied exactly, so ``to_atom37`` -> ``from_atom37`` round-trips.
"""

from __future__ import annotations

import numpy as np
import torch

from .atom37 import (
    ATOM_ORDER,
    ATOM_TYPES,
    RESTYPE_3,
    RESTYPE_ATOM37_MASK,
    UNK,
    atom14_to_atom37,
    check_positions,
)
from .structure import Protein, from_structure

__all__ = ["from_atom14", "from_atom37"]


def from_atom37(positions, aatype, mask, residue_index=None, chain_index=None):
    """A :class:`~zmat.protein.Protein` from atom37 tensors (one structure).

    Atoms are those with mask set (``OXT`` included); coordinates are kept
    exactly (float64), so ``from_atom37(*p.to_atom37()...)`` round-trips. A
    row without any atom (an unresolved residue) is left out: the Protein's
    residues are the rows that have atoms, in order.

    Args:
        positions: ``(L, 37, 3)``.
        aatype: ``(L,)`` residue types 0..19 (unknown residues cannot be held).
        mask: ``(L, 37)`` atom mask.
        residue_index: optional ``(L,)`` residue numbers (default ``1..L``);
            peptide bonds are found from distances, as for a PDB file. Every
            row is its own residue: equal consecutive numbers get insertion
            codes ``"A"``, ``"B"``, ... (``Protein.ins_codes``).
        chain_index: optional ``(L,)`` integer chain of each residue (0 -> ``"A"``).

    Raises:
        ValueError: for bad shapes, an unknown residue type, or a masked-in atom
            the residue type does not have (naming the residue and atom).
    """
    pos = torch.as_tensor(positions).detach().to("cpu", torch.float64)
    check_positions(pos, 37, "from_atom37")
    if pos.ndim != 3:
        raise ValueError(f"from_atom37: one structure (L, 37, 3) at a time, got {tuple(pos.shape)}")
    L = pos.shape[0]
    aa = torch.as_tensor(aatype).detach().cpu().numpy().astype(np.int64).reshape(-1)
    m = torch.as_tensor(mask).detach().cpu().numpy().astype(bool)
    if aa.shape != (L,) or m.shape != (L, 37):
        raise ValueError(f"from_atom37: aatype {aa.shape} / mask {m.shape} do not match L={L}")
    bad = np.nonzero((aa < 0) | (aa >= UNK))[0]
    if len(bad):
        raise ValueError(
            f"from_atom37: residue {bad[0]} has aatype {aa[bad[0]]}: a Protein holds only the 20 "
            "standard residues (0..19)"
        )
    allowed = RESTYPE_ATOM37_MASK[aa].copy()
    allowed[:, ATOM_ORDER["OXT"]] = True
    stray = np.argwhere(m & ~allowed)
    if len(stray):
        k, a = stray[0]
        raise ValueError(f"from_atom37: residue {k} ({RESTYPE_3[aa[k]]}) has no atom {ATOM_TYPES[a]}")
    return _protein_from_cells(pos, aa, m, residue_index, chain_index)


def _protein_from_cells(pos: torch.Tensor, aa: np.ndarray, m: np.ndarray, residue_index, chain_index):
    import biotite.structure as struc

    L = len(aa)
    res_ids = np.arange(1, L + 1) if residue_index is None else np.asarray(residue_index).reshape(L)
    chains = np.zeros(L, np.int64) if chain_index is None else np.asarray(chain_index).reshape(L)
    k, a = np.nonzero(m)  # residue-major, atom37 order within (template order comes from the layout)
    arr = struc.AtomArray(len(k))
    arr.coord = pos.numpy()[k, a]
    arr.res_id = res_ids[k]
    arr.ins_code = _insertion_codes(res_ids, chains)[k]
    arr.res_name = np.array(RESTYPE_3)[aa[k]]
    arr.atom_name = np.array(ATOM_TYPES)[a]
    arr.element = np.array([n[0] for n in ATOM_TYPES])[a]
    arr.chain_id = np.array([_chain_letter(int(c)) for c in chains])[k]
    arr.hetero = np.zeros(len(k), bool)
    p = from_structure(arr)
    # exact float64 positions, in the layout's order; residues without atoms are left out, so
    # the Protein's residue j is the j-th row that has atoms
    rows = np.unique(k)
    col = np.array([ATOM_ORDER[str(x)] for x in p.atom_names], np.int64)
    xyz = pos[torch.as_tensor(rows[np.asarray(p.residue_index)]), torch.as_tensor(col)]
    return Protein(p.layout, xyz, res_ids=p.res_ids, ins_codes=p.ins_codes, res_chain_ids=p.res_chain_ids)


def _insertion_codes(res_ids: np.ndarray, chains: np.ndarray) -> np.ndarray:
    """``(L,)`` insertion codes that keep every row its own residue: ``""``, then ``"A"``,
    ``"B"``, ... along a run of equal consecutive residue numbers (of one chain)."""
    L = len(res_ids)
    new_run = np.ones(L, bool)
    new_run[1:] = (res_ids[1:] != res_ids[:-1]) | (chains[1:] != chains[:-1])
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(L), 0))
    j = np.arange(L) - run_start  # position in the run
    letters = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    return np.where(j == 0, "", letters[(j - 1) % 26])


def _chain_letter(c: int) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return letters[c] if 0 <= c < len(letters) else str(c)


def from_atom14(positions, aatype, mask, residue_index=None, chain_index=None):
    """:func:`from_atom37` from atom14 tensors (``(L, 14, 3)``, ``(L,)``, ``(L, 14)``)."""
    pos = torch.as_tensor(positions).detach().to("cpu", torch.float64)
    check_positions(pos, 14, "from_atom14")
    m = torch.as_tensor(mask).bool().cpu()
    if m.shape != pos.shape[:-1]:
        raise ValueError(f"from_atom14: mask must have shape {tuple(pos.shape[:-1])}, got {tuple(m.shape)}")
    aa = torch.as_tensor(aatype).cpu().long()
    pos37, m37 = atom14_to_atom37(pos, aa, m)
    return from_atom37(pos37, aa, m37, residue_index=residue_index, chain_index=chain_index)
