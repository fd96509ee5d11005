"""Ligands: their rotatable bonds, as torsions of the all-atom tree.

A ligand residue's bonds and bond orders come from its CCD entry
(``zmat/structure/ccd.py``). A bond ``b-c`` of a ligand is *rotatable* when it
is single (CCD order 1), in no ring (a bridge of the ligand's bond graph),
both ends have a heavy neighbour besides the other end (no methyl, hydroxyl
or amine rotors: those are hydrogen rows of their own), and it is not an
amide-like ``C(=X)-N/O/S`` bond (``X`` = O, S, N). That is RDKit's strict
rotatable-bond rule (``zmat.rdkit.STRICT_SMARTS``) in graph terms, without
RDKit.

Because a rotatable bond is a bridge, it is an edge of the construction tree;
its torsion is the dihedral column of the representative child of its far
end (``zmat/structure/allatom.py``), so setting it turns the far side rigidly
and keeps every ring, stereocentre and double bond.
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["rotatable_bonds", "torsion_rows"]


def _connected_without(adj: dict[int, list[int]], b: int, c: int) -> bool:
    """True when ``b`` still reaches ``c`` with the bond ``b-c`` removed (a ring bond)."""
    seen, queue = {b}, deque([b])
    while queue:
        u = queue.popleft()
        for v in adj[u]:
            if u == b and v == c:
                continue
            if v == c:
                return True
            if v not in seen:
                seen.add(v)
                queue.append(v)
    return False


def rotatable_bonds(atoms: np.ndarray, bonds: np.ndarray, orders: np.ndarray, elements: np.ndarray):
    """``(k, 2)`` rotatable bonds (module doc) among the bonds within ``atoms``.

    Args:
        atoms: the atom indices of one ligand residue.
        bonds: ``(E, 2)`` all bonds of the structure; ``orders`` ``(E,)`` biotite
            ``BondType`` codes; ``elements`` ``(N,)``.
    """
    inside = np.isin(bonds, atoms).all(1)
    sub, sub_orders = bonds[inside], orders[inside]
    adj: dict[int, list[int]] = {int(a): [] for a in atoms}
    double: dict[int, list[int]] = {int(a): [] for a in atoms}
    for (i, j), o in zip(sub.tolist(), sub_orders.tolist(), strict=True):
        adj[i].append(j)
        adj[j].append(i)
        if o in (2, 6):  # double, aromatic double
            double[i].append(j)
            double[j].append(i)
    heavy = elements != "H"

    def heavy_beyond(x: int, y: int) -> bool:
        return any(heavy[z] and z != y for z in adj[x])

    def amide(x: int, y: int) -> bool:
        return (
            elements[x] == "C"
            and elements[y] in ("N", "O", "S")
            and any(elements[z] in ("O", "S", "N") for z in double[x])
        )

    out = []
    for (i, j), o in zip(sub.tolist(), sub_orders.tolist(), strict=True):
        if o != 1 or not (heavy[i] and heavy[j]) or not (heavy_beyond(i, j) and heavy_beyond(j, i)):
            continue
        if amide(i, j) or amide(j, i) or _connected_without(adj, i, j):
            continue
        out.append((i, j))
    return np.array(out, np.int64).reshape(-1, 2)


def torsion_rows(rot: np.ndarray, parent: np.ndarray, refs: np.ndarray):
    """For rotatable bonds ``rot`` (tree edges), the atom whose row's dihedral
    column is the torsion (the PROPER child of the far end) and its quad
    ``(d, a, b, atom)``; bonds without such a row are left out.

    Returns:
        ``(rows (T,), quads (T, 4), kept (T,))`` int64, ``kept`` the index into ``rot``.
    """
    by_bond = np.argsort(refs[:, 0], kind="stable")  # the atoms on each bond reference, in order
    lo = np.searchsorted(refs[by_bond, 0], np.arange(len(refs)), side="left")
    hi = np.searchsorted(refs[by_bond, 0], np.arange(len(refs)), side="right")
    rows, quads, kept = [], [], []
    for t, (i, j) in enumerate(rot.tolist()):
        b, c = (i, j) if parent[j] == i else (j, i)
        if parent[c] != b or refs[c, 1] < 0:
            continue
        on_c = by_bond[lo[c] : hi[c]].tolist()  # the first atom whose row is (c, b, refs[c, 1])
        k = next((v for v in on_c if refs[v, 1] == b and refs[v, 2] == refs[c, 1]), None)
        if k is None:
            continue
        rows.append(k)
        quads.append((int(refs[k, 2]), b, c, k))
        kept.append(t)
    return np.array(rows, np.int64), np.array(quads, np.int64).reshape(-1, 4), np.array(kept, np.int64)
