"""zmat.protein.layout: the vectorised layout equals the original per-atom
implementation (kept below, verbatim, as the reference) on sequences, batches,
missing atoms, chain breaks, forests and real files."""

import dataclasses
import string
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from test_protein_io import reference_disulfides

import zmat
import zmat.protein as zp
from zmat._align import rmsd
from zmat.protein.layout import N_TORSIONS
from zmat.protein.topology import CHI_ATOMS, OMEGA, PHI, PSI, RESIDUES
from zmat.table import OFFSET, POSITIONAL, PROPER

DATA = Path(__file__).parent / "data"
ALL20 = "ARNDCQEGHILKMFPSTWYV"
FIELDS = "res_names atom_names elements residue_index refs bonds ideal ideal_mask torsion_slot torsion_atoms"
FIELDS = (FIELDS + " bonded").split()


# ------------------------------------------- the original implementation
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


# ------------------------------------------------------------------ tests
def assert_same_layout(got, want):
    for f in FIELDS:
        g, w = getattr(got, f), getattr(want, f)
        assert g.dtype == w.dtype, f
        assert g.shape == w.shape, f
        if g.dtype.kind == "f":
            assert np.array_equal(g, w, equal_nan=True), f
        else:
            assert np.array_equal(g, w), f


def _random_sequence(rng, n):
    return "".join(rng.choice(list(ALL20), n))


@pytest.mark.parametrize("seq", ["A", "G", "P", "GP", "PG", ALL20, ALL20[::-1] * 3, "W" * 7])
def test_sequences_equal_reference(seq):
    zp.protein_layout.cache_clear()
    got = zp.protein_layout(seq)
    assert_same_layout(got, reference_layout(zp.one_to_three(seq)))
    assert_same_layout(zp.layout_of(zp.one_to_three(seq)), got)
    assert_same_layout(zp.protein_layout(seq.lower()), got)


def test_empty_and_unknown():
    assert zp.layout_of([]).n_atoms == 0
    with pytest.raises(ValueError, match="'XYZ' is not one"):
        zp.layout_of(["ALA", "XYZ"])
    with pytest.raises(ValueError, match="'B' at position 1"):
        zp.protein_layout("AB")
    with pytest.raises(ValueError, match="position 1"):
        zp.protein_layout("Aé")


@pytest.mark.parametrize("seed", range(12))
def test_random_layouts_equal_reference(seed):
    """Random residues, missing atoms, breaks, forests and extra bonds."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 40))
    names = zp.one_to_three(_random_sequence(rng, L))
    drop = [0.0, 0.05, 0.2, 0.6][seed % 4]
    present = None
    if drop:
        present = []
        for r in names:
            atoms = [a for a in RESIDUES[r].atoms if rng.random() > drop]
            if rng.random() < 0.3:
                atoms.append("XX")  # not a template atom: ignored
            rng.shuffle(atoms)
            present.append(atoms)
    bonded = rng.random(L) > [0.0, 0.1, 0.3][seed % 3] if seed % 5 else None
    linked = rng.random(L) > [0.0, 0.1, 0.5][seed % 3] if seed % 2 else None
    extra = rng.integers(0, 5, (3, 2)) if seed % 3 == 0 else None
    want = reference_layout(names, present, bonded, linked, extra)
    assert_same_layout(zp.layout_of(names, present, bonded, linked, extra), want)


def test_virtual_links_equal_reference():
    """Residues reduced to side chains: parents found by the virtual-link scan."""
    names = zp.one_to_three("WKRFYHEQMLIV")
    for keep in (["CB", "CG", "CD", "NE", "CZ"], ["CD1", "CE2", "CZ"], ["O", "NZ", "OH"]):
        present = [[a for a in RESIDUES[r].atoms if a in keep or a in ("N",)] for r in names]
        present[0] = ["CA"]
        for linked in (None, [k % 3 != 0 for k in range(len(names))]):
            want = reference_layout(names, present, None, linked)
            assert_same_layout(zp.layout_of(names, present, None, linked), want)
        nobb = [[a for a in RESIDUES[r].atoms if a not in ("N", "CA", "C")] for r in names]
        assert_same_layout(zp.layout_of(names, nobb), reference_layout(names, nobb))
    # the backward scan skips the depth-1 CB for the depth-2 O
    names, present = ["LYS", "ALA", "GLY"], [["CA", "C", "O", "CB"], ["CB"], ["O"]]
    got = zp.layout_of(names, present)
    assert_same_layout(got, reference_layout(names, present))
    assert got.refs[4, 0] == 2


@pytest.mark.parametrize("with_empty", [False, True])
def test_batch_equals_reference(with_empty):
    """ProteinBatch's layouts and padded arrays equal the original loop over
    the reference layouts."""
    rng = np.random.default_rng(7)
    seqs = [_random_sequence(rng, int(rng.integers(1, 60))) for _ in range(6)] + ["W"]
    if with_empty:
        seqs.insert(2, "")
    zp.protein_layout.cache_clear()
    batch = zp.ProteinBatch(seqs)
    layouts = [reference_layout(zp.one_to_three(s)) for s in seqs]
    for s, got, want in zip(seqs, batch.layouts, layouts, strict=True):
        assert_same_layout(got, want)
        assert_same_layout(zp.protein_layout(s), want)
    B, n, Lm = len(seqs), batch.N_max, batch.L_max
    assert n == max(lay.n_atoms for lay in layouts) and Lm == max(map(len, seqs))
    refs = np.full((B, n, 3), -1, np.int64)
    ideal = np.zeros((B, n, 3))
    mask = np.zeros((B, n, 3), bool)
    slot = np.full((B, n), -1, np.int64)
    atom_mask = torch.zeros(B, n, dtype=torch.bool)
    residue_mask = torch.zeros(B, Lm, dtype=torch.bool)
    atom_names = np.full((B, n), "", "U4")
    elements = np.full((B, n), "", "U2")
    residue_index = torch.full((B, n), -1, dtype=torch.long)
    for b, lay in enumerate(layouts):
        m = lay.n_atoms
        refs[b, :m] = np.where(lay.refs >= 0, lay.refs + b * n, -1)
        ideal[b, :m] = lay.ideal
        mask[b, :m] = lay.ideal_mask
        s = lay.torsion_slot
        k, t = s // N_TORSIONS, s % N_TORSIONS
        slot[b, :m] = np.where(s >= 0, ((b * Lm + k) * N_TORSIONS + t), -1)
        atom_mask[b, :m] = True
        residue_mask[b, : lay.n_residues] = True
        atom_names[b, :m] = lay.atom_names
        elements[b, :m] = lay.elements
        residue_index[b, :m] = lay.tensor("residue_index")
    assert np.array_equal(batch.table.refs, refs.reshape(-1, 3))
    assert np.array_equal(batch._flat.ideal, ideal.reshape(-1, 3), equal_nan=True)
    assert np.array_equal(batch._flat.ideal_mask, mask.reshape(-1, 3))
    assert np.array_equal(batch._flat.torsion_slot, slot.reshape(-1))
    assert batch._flat.n_residues == B * Lm
    assert torch.equal(batch.atom_mask, atom_mask) and torch.equal(batch.residue_mask, residue_mask)
    assert torch.equal(batch.residue_index, residue_index)
    assert np.array_equal(batch.atom_names, atom_names) and np.array_equal(batch.elements, elements)


def _assert_same_protein(got, want):
    assert_same_layout(got.layout, want.layout)
    assert np.array_equal(got.xyz.numpy(), want.xyz.numpy())
    for f in ("res_ids", "ins_codes", "res_chain_ids", "chain_id"):
        assert np.array_equal(getattr(got, f), getattr(want, f)), f
    assert got.sequence == want.sequence


@pytest.mark.parametrize("name", ["1l2y.pdb", "1aki.cif", "7pfl.pdb", "1igy.pdb", "3wip.pdb", "1ubi.pdb"])
def test_files_equal_reference(name):
    from biotite.structure.io import pdb, pdbx

    path = DATA / name
    if name.endswith(".cif"):
        arr = pdbx.get_structure(pdbx.CIFFile.read(path), model=1)
    else:
        arr = pdb.PDBFile.read(path).get_structure(model=1)
    _assert_same_protein(zp.from_structure(arr), reference_from_structure(arr))


@pytest.mark.parametrize("seed", range(6))
def test_damaged_structures_equal_reference(seed):
    """Dropped atoms, duplicated names, renamed and split chains."""
    import biotite.structure as struc

    arr = zp.from_pdb(DATA / "1ubi.pdb").to_structure()
    rng = np.random.default_rng(seed)
    keep = rng.random(arr.array_length()) > [0.02, 0.15, 0.5][seed % 3]
    keep[:3] = seed % 2 == 0
    arr = arr[keep]
    if seed >= 2:  # a duplicate of some atoms, placed right after their residue mates
        dup = arr[rng.random(arr.array_length()) < 0.05]
        dup.coord += 0.5
        arr = struc.concatenate([arr, dup])
        order = np.lexsort((np.arange(arr.array_length()), arr.res_id))
        arr = arr[order]
    if seed >= 4:  # second half in another chain, and a long C-N gap
        arr.chain_id[arr.res_id > 40] = "B"
        arr.coord[arr.res_id > 60] += 3.0
    _assert_same_protein(zp.from_structure(arr), reference_from_structure(arr))


def test_multichain_assembly_equals_reference():
    import biotite.structure as struc
    from biotite.structure.io import pdb

    arr = pdb.PDBFile.read(DATA / "1aki.pdb").get_structure(model=1)
    copies = []
    for i in range(5):
        a = arr.copy()
        a.chain_id[:] = string.ascii_uppercase[i]
        a.coord += 60.0 * i
        copies.append(a)
    arr = struc.concatenate(copies)
    _assert_same_protein(zp.from_structure(arr), reference_from_structure(arr))


def test_layout_all_rows_canonical():
    lay = zp.protein_layout(ALL20 * 3)
    t = lay.table
    assert not (t.kind == POSITIONAL).any()
    assert ((t.kind == PROPER) | (t.kind == OFFSET)).sum() == lay.n_atoms - 3
    assert lay.ideal_mask[3:].all()  # every row but the first three atoms' unused columns
    assert (lay.atom_names == "OXT").sum() == 1 and lay.atom_names[-1] == "OXT"
    # every torsion slot is used exactly once, except phi_0 and omega_{L-1}
    slots = np.sort(lay.torsion_slot[lay.torsion_slot >= 0])
    assert len(np.unique(slots)) == len(slots)


@pytest.mark.parametrize("seed", range(4))
def test_missing_atoms_fallbacks(seed):
    """Dropping random atoms (backbone included) keeps an exact, positional-free table."""
    p = zp.from_pdb(DATA / "1ubi.pdb")
    arr = p.to_structure()
    rng = np.random.default_rng(seed)
    keep = rng.random(arr.array_length()) > 0.15
    keep[:3] = seed % 2 == 0  # sometimes without the first N, CA, C
    q = zp.from_structure(arr[keep])
    assert not (q.table.kind == POSITIONAL).any()
    assert rmsd(zmat.to_xyz(q.internal, q.table), q.xyz) < 1e-6
    assert torch.isfinite(zmat.to_xyz(q.ideal_internal(), q.table)).all()


def test_layout_is_immutable_and_its_tensors_shared():
    """A cached layout cannot be changed through its fields or arrays."""
    lay = zp.protein_layout("MKCW")
    assert zp.protein_layout("MKCW") is lay
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.bonds = lay.bonds[:1]
    for f in FIELDS:
        arr = getattr(lay, f)
        with pytest.raises(ValueError, match="read-only"):
            arr[:1] = arr[:1]
    for lay_b in zp.ProteinBatch(["MKCW", "GA"]).layouts + [zp.from_pdb(DATA / "1aki.pdb").layout]:
        with pytest.raises(ValueError, match="read-only"):
            lay_b.refs[0, 0] = 1
    t = lay.tensor("torsion_atoms")
    assert lay.tensor("torsion_atoms") is t and lay.tensor("torsion_atoms", "cpu") is t
    assert t.dtype == torch.int64 and np.array_equal(t.numpy(), lay.torsion_atoms)
    assert lay.tensor("ideal").dtype == torch.float64 and lay.tensor("ideal_mask").dtype == torch.bool
    changed = dataclasses.replace(lay, bonds=lay.bonds[:2])
    assert len(changed.bonds) == 2 and len(lay.bonds) > 2 and not changed.bonds.flags.writeable


def test_layout_module_is_not_shadowed():
    import zmat.protein.layout as module

    assert zp.layout is module and module.layout_of is zp.layout_of
