"""The layout oracle: zmat.protein's original per-atom layout code, kept verbatim.

Why it is kept: ``zmat.protein.layout`` builds a protein's table, bonds,
ideal geometry and torsion slots with vectorised numpy; this is the
implementation it replaced, one atom at a time, written straight from the
residue templates. ``tests/test_protein_layout.py`` compares the two on
sequences, random damage, batches and real files, and
``tests/test_protein_io.py`` compares the disulfide search. It is test code
only: never imported by ``zmat``, and not to be "optimised" (its value is that
it is the obvious version).
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

import zmat.protein as zp
from zmat.protein.layout import N_TORSIONS
from zmat.protein.topology import CHI_ATOMS, OMEGA, PHI, PSI, RESIDUES

__all__ = ["reference_disulfides", "reference_from_structure", "reference_layout"]


def reference_disulfides(xyz, lay):
    sg = np.nonzero((lay.atom_names == "SG") & (lay.res_names[lay.residue_index] == "CYS"))[0]
    if len(sg) < 2:
        return np.zeros((0, 2), np.int64)
    d = np.linalg.norm(xyz[sg, None] - xyz[None, sg], axis=-1)
    i, j = np.nonzero(np.triu(d < zp.io.DISULFIDE_MAX, 1))
    return np.stack([sg[i], sg[j]], 1)


def _sibling_type(template) -> set[str]:
    """Atoms whose canonical dihedral reference is a sibling (OFFSET rows)."""
    rows = dict(zip(template.atoms, template.rows, strict=True))
    out = {"O", "CB"}
    for at, (b, _, d) in rows.items():
        if at in ("N", "CA", "C", "O", "CB", "OXT"):
            continue
        if rows[b][1] != d:
            out.add(at)
    return out


_SIBLING = {name: _sibling_type(t) for name, t in RESIDUES.items()}
_NEIGHBORS = {}
for _name, _t in RESIDUES.items():
    nb: dict[str, list[str]] = {a: [] for a in _t.atoms}
    for x, y in _t.bonds:
        nb[x].append(y)
        nb[y].append(x)
    nb["N"].insert(0, "-C")
    nb["C"].append("+N")
    _NEIGHBORS[_name] = nb


def reference_layout(
    res_names: Sequence[str],
    present: Sequence[Sequence[str]] | None = None,
    bonded: Sequence[bool] | None = None,
    linked: Sequence[bool] | None = None,
    extra_bonds: np.ndarray | None = None,
):
    """Build the :class:`Layout` of a list of residues.

    Args:
        res_names: ``L`` three-letter names of standard residues.
        present: per residue, the heavy-atom names it has (any order; names
            not in the template are ignored). Default: every template atom,
            with ``OXT`` only on the last residue of each peptide-bonded run.
        bonded: ``(L,)`` bools, residue ``k`` peptide-bonded to ``k - 1``
            (``bonded[0]`` is ignored). Default: all True.
        linked: ``(L,)`` bools, residue ``k`` continues the tree of ``k - 1``.
            Default: all True (one tree); batches pass False at each protein's
            start (a forest).
        extra_bonds: optional ``(E, 2)`` atom-index pairs added to ``bonds``
            (disulfides).

    Raises:
        ValueError: for an unknown residue name.
    """
    L = len(res_names)
    templates = []
    for k, r in enumerate(res_names):
        if r not in RESIDUES:
            raise ValueError(f"residue {k}: {r!r} is not one of the 20 standard amino acids")
        templates.append(RESIDUES[r])
    bonded_ = np.ones(L, bool) if bonded is None else np.asarray(bonded, bool).copy()
    linked_ = np.ones(L, bool) if linked is None else np.asarray(linked, bool).copy()
    if L:
        bonded_[0] = False
        linked_[0] = False
    bonded_ &= linked_  # a peptide bond implies the same tree

    # ---- atoms, in template order
    amap: list[dict[str, int]] = []
    atom_names: list[str] = []
    elements: list[str] = []
    res_of: list[int] = []
    for k, t in enumerate(templates):
        if present is None:
            last = k == L - 1 or not bonded_[k + 1]
            have = set(t.atoms) if last else set(t.atoms) - {"OXT"}
        else:
            have = set(present[k])
        m = {}
        for name, el in zip(t.atoms, t.elements, strict=True):
            if name in have:
                m[name] = len(atom_names)
                atom_names.append(name)
                elements.append(el)
                res_of.append(k)
        amap.append(m)
    n = len(atom_names)

    def resolve(k: int, spec: str, link: np.ndarray) -> int:
        if spec.startswith("-"):
            return amap[k - 1].get(spec[1:], -1) if k > 0 and link[k] else -1
        if spec.startswith("+"):
            return amap[k + 1].get(spec[1:], -1) if k + 1 < L and link[k + 1] else -1
        return amap[k].get(spec, -1) if spec else -1

    # ---- tree parents (every parent precedes its child)
    parent = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    group_start = 0
    for k, t in enumerate(templates):
        if not linked_[k] and amap[k]:
            group_start = min(amap[k].values())
        nbrs = _NEIGHBORS[t.name]
        for name, v in amap[k].items():
            p = resolve(k, t.rows[t.index(name)][0], linked_)
            if p < 0:
                for spec in nbrs[name]:
                    q = resolve(k, spec, linked_)
                    if 0 <= q < v:
                        p = q
                        break
            if p < 0 and v > group_start:
                p = _virtual_parent(v, k, amap, linked_, depth, group_start)
            parent[v] = p
            depth[v] = depth[p] + 1 if p >= 0 else 0

    # ---- rows
    refs = np.full((n, 3), -1, np.int64)
    planar_child = np.full(n, -1, np.int64)
    first_child = np.full(n, -1, np.int64)  # of a root: the BOND row
    second_child = np.full(n, -1, np.int64)
    for v in range(n):
        p = parent[v]
        if p >= 0 and depth[v] == 2 and planar_child[p] < 0:
            planar_child[p] = v
        if p >= 0 and depth[v] == 1:
            if first_child[p] < 0:
                first_child[p] = v
            elif second_child[p] < 0:
                second_child[p] = v
    for k, t in enumerate(templates):
        sib = _SIBLING[t.name]
        for name, v in amap[k].items():
            p = parent[v]
            if p < 0:
                continue
            pp = parent[p]
            if pp < 0:  # a root's later children: on its first child (a tree without N)
                c1 = first_child[p]
                q = planar_child[c1] if c1 != v else -1
                if c1 == v:
                    refs[v] = (p, -1, -1)
                elif q >= 0:
                    refs[v] = (p, c1, q)
                else:
                    s2 = second_child[p]
                    refs[v] = (p, c1, -1) if s2 == v else (p, c1, s2)
                continue
            ppp = parent[pp]
            if ppp < 0 and first_child[pp] != p:  # under a later child of the root
                refs[v] = (p, pp, first_child[pp])
                continue
            if ppp < 0:  # depth 2: one PLANAR child, its siblings OFFSET on it
                q = planar_child[p]
                refs[v] = (p, pp, -1) if q == v else (p, pp, q)
                continue
            d = ppp
            if name in sib:
                s = amap[k].get("OXT", -1) if name == "O" else -1
                if s < 0:
                    s = resolve(k, t.rows[t.index(name)][2], linked_)
                if s >= 0 and parent[s] == p and _anchors(s, res_of, res_names, atom_names):
                    if depth[s] >= 3 or planar_child[p] == s:
                        d = s
            refs[v] = (p, pp, d)

    # ---- canonical rows, ideal values, torsion slots
    ideal = np.empty((n, 3), np.float64)
    ideal_mask = np.zeros((n, 3), bool)
    slot = np.full(n, -1, np.int64)
    for k, t in enumerate(templates):
        for name, v in amap[k].items():
            i = t.index(name)
            row = t.rows[i]
            can = [resolve(k, s, bonded_) for s in row]
            if name == "O" and "OXT" in amap[k]:
                can[2] = amap[k]["OXT"]
            ok = True
            for c in range(3):
                ok = ok and can[c] >= 0 and refs[v, c] == can[c]
                ideal_mask[v, c] = ok
            ideal[v] = t.ideal[i]
            tors = t.torsion[i]
            if tors is not None and ideal_mask[v, 2]:
                slot[v] = (k + tors[1]) * N_TORSIONS + tors[0]

    # ---- torsion atoms
    tat = np.full((L, N_TORSIONS, 4), -1, np.int64)
    for k, t in enumerate(templates):
        m = amap[k]
        g = [m.get(x, -1) for x in ("N", "CA", "C")]
        if k > 0 and bonded_[k]:
            tat[k, PHI] = (amap[k - 1].get("C", -1), *g)
        if k + 1 < L and bonded_[k + 1]:
            nxt = amap[k + 1]
            tat[k, PSI] = (*g, nxt.get("N", -1))
            tat[k, OMEGA] = (g[1], g[2], nxt.get("N", -1), nxt.get("CA", -1))
        for c, quad in enumerate(CHI_ATOMS[t.name]):
            tat[k, 3 + c] = [m.get(x, -1) for x in quad]
    tat[(tat < 0).any(-1)] = -1

    # ---- bonds
    bonds = []
    for k, t in enumerate(templates):
        m = amap[k]
        bonds.extend((m[x], m[y]) for x, y in t.bonds if x in m and y in m)
        if k > 0 and bonded_[k] and "C" in amap[k - 1] and "N" in m:
            bonds.append((amap[k - 1]["C"], m["N"]))
    bonds_arr = np.asarray(bonds, np.int64).reshape(-1, 2)
    if extra_bonds is not None and len(extra_bonds):
        bonds_arr = np.concatenate([bonds_arr, np.asarray(extra_bonds, np.int64).reshape(-1, 2)])

    return zp.Layout(
        res_names=np.asarray(res_names, dtype="U3"),
        atom_names=np.asarray(atom_names, dtype="U4"),
        elements=np.asarray(elements, dtype="U2"),
        residue_index=np.asarray(res_of, np.int64),
        refs=refs,
        bonds=bonds_arr,
        ideal=ideal,
        ideal_mask=ideal_mask,
        torsion_slot=slot,
        torsion_atoms=tat,
        bonded=bonded_,
    )


def _anchors(s: int, res_of, res_names, atom_names) -> bool:
    """True if atom ``s`` is not itself placed as an offset of a sibling."""
    return atom_names[s] not in _SIBLING[res_names[res_of[s]]]


def _virtual_parent(v, k, amap, linked, depth, group_start) -> int:
    """A nearby earlier atom to hang ``v`` on when no bonded atom precedes it."""
    cands = [amap[k].get(x, -1) for x in ("C", "CA", "N")]
    if k > 0 and linked[k]:
        cands += [amap[k - 1].get(x, -1) for x in ("C", "CA", "N")]
    for q in cands:
        if group_start <= q < v and depth[q] >= 2:
            return q
    for q in range(v - 1, group_start - 1, -1):
        if depth[q] >= 2:
            return q
    return v - 1


def reference_from_structure(atoms, chain=None):
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
    res_names = atoms.res_name[starts[:-1]].tolist()
    names = atoms.atom_name.tolist()
    coord = atoms.coord.astype(np.float64)
    present, where = [], []
    for k in range(L):
        tmpl = set(RESIDUES[res_names[k]].atoms)
        d = {}
        for i in range(starts[k], starts[k + 1]):
            if names[i] in tmpl and names[i] not in d:
                d[names[i]] = i
        present.append(d)
        where.append(d)

    # peptide bonds: same chain, C and N present, short enough
    chain_ids = atoms.chain_id[starts[:-1]]
    bonded = np.zeros(L, bool)
    for k in range(1, L):
        c, n = where[k - 1].get("C"), where[k].get("N")
        if chain_ids[k] == chain_ids[k - 1] and c is not None and n is not None:
            bonded[k] = np.linalg.norm(coord[c] - coord[n]) <= zp.io.PEPTIDE_BOND_MAX

    lay0 = reference_layout(res_names, present=[list(d) for d in present], bonded=bonded)
    # file index of every layout atom
    src = np.empty(lay0.n_atoms, np.int64)
    ri, an = lay0.residue_index, lay0.atom_names
    for j in range(lay0.n_atoms):
        src[j] = where[ri[j]][an[j]]
    xyz = coord[src]
    lay0 = dataclasses.replace(lay0, bonds=np.concatenate([lay0.bonds, reference_disulfides(xyz, lay0)]))
    return zp.Protein(
        lay0,
        torch.from_numpy(xyz),
        res_ids=atoms.res_id[starts[:-1]],
        ins_codes=atoms.ins_code[starts[:-1]],
        res_chain_ids=chain_ids,
    )
