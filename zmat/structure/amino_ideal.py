"""Ideal geometry of amino acids inside a :class:`~zmat.protein.Complex`.

The counterpart of ``Protein.ideal_internal`` for the all-atom tree: a heavy
atom whose row is its template's canonical row (``zmat/protein/topology.py``:
same bond and angle references; the dihedral reference the template's, or a
sibling in an ``OFFSET`` row) gets the template's ideal bond length and angle,
and either its fixed dihedral or its torsion (phi, psi, omega, chi1..chi4).
A hydrogen whose row lies within its residue gets the CCD ideal values
(rotors keep their measured dihedral), as nucleotides do
(``zmat/structure/nucleic_ideal.py``). Everything else keeps its measured value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..protein.build import close_proline_rings
from ..protein.layout import ProlineRing, SharedTensors
from ..protein.topology import RESIDUES, TORSION_NAMES
from .modified import aliases, own_name
from .nucleic_ideal import ccd_row_values, heavy_neighbours

__all__ = ["AminoIdeal", "amino_ideal", "apply"]


@dataclass(frozen=True)
class AminoIdeal(SharedTensors, ProlineRing):
    """Constants ``(atom, column, value)``, torsion slots ``(atom, residue,
    torsion)``, and ``proline_rows`` ``(P, 4)``: atoms CA, CB, CG, CD of the
    prolines whose ring rows all get the template's values (CA's bond and CB's
    length and angle constants, CG's chi1 and CD's chi2 rows), where
    :func:`apply` closes the ring (``zmat.protein.build.close_proline_rings``)."""

    const_idx: np.ndarray
    const_val: np.ndarray
    tors_idx: np.ndarray
    tors_res: np.ndarray
    tors_name: np.ndarray
    proline_rows: np.ndarray


def amino_ideal(parsed, linked_prev: np.ndarray) -> AminoIdeal:
    """The :class:`AminoIdeal` plan of a parsed complex (``linked_prev``: the
    previous residue of each residue when linked, else -1)."""
    refs, res, names = parsed.refs, parsed.residue, parsed.atom_names
    R = len(parsed.res_names)
    nxt = np.full(R, -1, np.int64)
    nxt[linked_prev[linked_prev >= 0]] = np.flatnonzero(linked_prev >= 0)
    index = {}
    for i in range(len(names)):
        index[int(res[i]), str(names[i])] = i
    const, tors = [], []
    heavy_nb = heavy_neighbours(parsed)
    for k in np.flatnonzero(parsed.family == "protein").tolist():
        res_name = str(parsed.res_names[k])
        t = RESIDUES[str(parsed.res_types[k])]
        own = {0: k, -1: int(linked_prev[k]), 1: int(nxt[k])}

        def atom(spec: str, own=own, res_name=res_name) -> int:
            off = {"-": -1, "+": 1}.get(spec[:1], 0)
            r = own[off]
            return index.get((r, spec[1:] if off else own_name(res_name, spec)), -1) if r >= 0 else -1

        for j, name in enumerate(t.atoms):
            i = atom(name)
            if i < 0:
                continue
            b, a, d = (atom(s) if s else -1 for s in t.rows[j])
            if name == "O" and d < 0:
                d = atom("OXT")
            if refs[i, 0] != b or refs[i, 1] != a or b < 0 or a < 0:
                continue
            r, theta, phi = t.ideal[j]
            # a modified residue's renamed atoms (MSE's Se) keep their own bond and angle
            if not {name, *t.rows[j][:2]} & set(aliases(res_name)):
                const += [(i, 0, r), (i, 1, theta)]
            if refs[i, 2] != d or d < 0:
                continue  # another dihedral reference: the measured value stays
            if t.torsion[j] is not None:
                torsion, off = t.torsion[j]
                if own[off] >= 0:
                    tors.append((i, int(parsed.polymer_index[own[off]]), torsion))
            elif not math.isnan(phi):
                const.append((i, 2, phi))
        const += ccd_row_values(parsed, k, heavy_nb)
    return AminoIdeal(
        proline_rows=_proline_rows(parsed, index, const, tors),
        const_idx=np.array([(i, c) for i, c, _ in const], np.int64).reshape(-1, 2),
        const_val=np.array([v for *_, v in const], np.float64),
        tors_idx=np.array([x[0] for x in tors], np.int64),
        tors_res=np.array([x[1] for x in tors], np.int64),
        tors_name=np.array([x[2] for x in tors], np.int64),
    )


def _proline_rows(parsed, index: dict, const: list, tors: list) -> np.ndarray:
    """``AminoIdeal.proline_rows`` (``index``: atom of ``(residue, name)``)."""
    fixed = {(i, c) for i, c, _ in const}
    torsion_of = {i: name for i, _, name in tors}
    chi1, chi2 = TORSION_NAMES.index("chi1"), TORSION_NAMES.index("chi2")
    rows = []
    for k in np.flatnonzero((parsed.family == "protein") & (parsed.res_types == "PRO")).tolist():
        ca, cb, cg, cd = (index.get((k, name), -1) for name in ("CA", "CB", "CG", "CD"))
        if min(ca, cb, cg, cd) < 0 or torsion_of.get(cg) != chi1 or torsion_of.get(cd) != chi2:
            continue
        if {(ca, 0), (cb, 0), (cb, 1), (cg, 0), (cg, 1), (cd, 0)} <= fixed:
            rows.append((ca, cb, cg, cd))
    return np.array(rows, np.int64).reshape(-1, 4)


def apply(plan: AminoIdeal, internal: torch.Tensor, torsions: dict, measured: dict) -> torch.Tensor:
    """``internal`` with the plan's ideal values and the torsions (``(L,)`` tensors,
    keys among ``TORSION_NAMES``; missing keys and NaN: ``measured``)."""
    cols = [internal[:, c] for c in range(3)]
    ci = torch.from_numpy(plan.const_idx)
    cv = torch.from_numpy(plan.const_val).to(internal.dtype)
    for c in range(3):
        sel = ci[:, 1] == c
        cols[c] = cols[c].index_put((ci[sel, 0],), cv[sel])
    if len(plan.tors_idx):
        vals = []
        for name in TORSION_NAMES:
            m = measured[name].to(internal.dtype)
            t = torsions.get(name)
            vals.append(m if t is None else torch.where(torch.isnan(t), m, t.to(internal.dtype)))
        tv = torch.stack(vals, -1)
        t = tv[torch.from_numpy(plan.tors_res), torch.from_numpy(plan.tors_name)]
        idx = torch.from_numpy(plan.tors_idx)
        # a torsion that is NaN (e.g. psi of a C-terminus, which places OXT) keeps the row's value
        cols[2] = cols[2].index_put((idx,), torch.where(torch.isnan(t), cols[2][idx], t))
    return close_proline_rings(plan, torch.stack(cols, -1))
