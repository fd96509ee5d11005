"""A padded batch's construction table assembled from per-residue-type pieces.

A :class:`~zmat.protein.ProteinBatch` is a forest of full-atom chains, so every
array of its :class:`~zmat.table.ConstructionTable` (rows, classification,
depth-first order, subtree ends, depths) is a stamp of one small *piece* per
residue: the residue's type and its place in the chain (first, middle, last,
only residue). The pieces are taken once, at first use, from the validated
general path (``layout_from_types`` + ``ConstructionTable``) on short example
chains, every atom reference written as ``(residue offset, slot)``; a batch is
then assembled by vectorised offsetting, with no validation or planning of its
own (a chain stamped from valid pieces is what the general path would build).

Why the depth-first order is a stamp: in a chain, residue ``k``'s atoms are
placed before (its *head*: ``N, CA, C, O``) and after (its *tail*: the side
chain) the subtree of the rest of the chain, so one protein's preorder is
``head_0, head_1, ..., head_{L-1}, tail_{L-1}, ..., tail_0``; a padding atom is
its own tree, after its protein's. The pieces check that shape when they are
taken, and ``tests/test_protein_build.py`` compares every array with the
general path's on random batches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .. import _kernel
from .._segments import per_row, segment_ids, starts
from ..table import BOND, OFFSET, PLANAR, ROOT, ConstructionTable, TablePlan
from .layout import N_TORSIONS, TORSION_NAMES, TYPES, layout_from_types

__all__ = ["Stamp", "batch_arrays", "batch_plan", "batch_table", "kernel_arrays", "stamp"]

FIRST, MIDDLE, LAST, ONLY = range(4)
#: the piece of a padding atom (a one-atom tree, a ROOT row): the last one
PAD = 4 * len(TYPES)
_PAD_PIECE = {
    "atom_name": np.array([""], "U4"),
    "element": np.array([""], "U2"),
    "ideal": np.zeros((1, 3)),
    "ideal_mask": np.zeros((1, 3), bool),
    "tors_off": np.zeros(1, np.int64),
    "tors": np.full(1, -1, np.int64),
    "kind": np.full(1, ROOT, np.int64),
    "off": np.zeros((1, 3), np.int64),
    "slot": np.full((1, 3), -1, np.int64),
    "in_head": np.ones(1, bool),
    "rank": np.zeros(1, np.int64),
    "end_tail": np.zeros(1, bool),
    "end": np.ones(1, np.int64),
    "depth": np.zeros(1, np.int64),
    "head": 1,
    "next_depth": 0,
}
NONE = -(1 << 40)  # a missing reference's delta: below -1 whatever the atom index
BEYOND = 1 << 40  # the link delta of a row that is not OFFSET: above any atom index


@dataclass(frozen=True)
class _Pieces:
    """Pieces of every ``type * 4 + place`` (then ``PAD``), their atoms concatenated.

    ``short_chains``: no offset chain has more than one link, whatever the
    neighbours. Per piece: ``start``, ``size`` (atoms), ``ring`` (a proline's CA, CB, CG,
    CD as piece atoms, -1 for other types), ``head`` (atoms before the rest of
    the chain in depth-first order), ``next_depth`` (depth of the next
    residue's ``N`` below this one's). Per piece atom: ``kind``; ``delta``
    ``(atoms * S, 3)``: row ``a * S + s`` holds the references of piece atom
    ``a`` minus its own index when the previous residue has ``s`` atoms
    (``NONE`` where missing), its column ``bond`` contiguous; ``link``, per
    piece atom, the dihedral reference of an OFFSET row (else ``BEYOND``)
    minus its own index (it never depends on the previous residue);
    ``in_head``, ``rank`` (position in the head or in the tail), ``end_tail``
    and ``end`` (subtree end relative to the head's or the tail's start),
    ``depth`` (below the residue's ``N``); the layout's ``atom_name``,
    ``element``, ``ideal``, ``ideal_mask``, and its torsion slot as the
    torsion ``tors`` (-1: none) of the residue at ``tors_off`` (``tors_code``
    ``tors_off * 7 + tors``, ``NONE`` for none).

    In depth-first order (:func:`kernel_arrays`): ``seq``, per piece its head
    atoms then its tail atoms, each by rank (piece atoms); per piece atom
    ``parent_where``: ``rank * 4 + code``, its parent is in its residue's head
    (code 0), tail (1), the previous residue's head (2: see ``prev_rank``,
    per piece the rank in its head of the one atom the next residue's root
    hangs on; rank 0), none (3), at ``rank`` there; ``flags`` (8 bytes as one
    uint64: the kernel's keep rows, then its trig rows); per piece
    ``has_offset``.
    """

    short_chains: bool
    start: np.ndarray
    size: np.ndarray
    ring: np.ndarray
    head: np.ndarray
    next_depth: np.ndarray
    kind: np.ndarray
    delta: np.ndarray
    bond: np.ndarray
    link: np.ndarray
    atom_name: np.ndarray
    element: np.ndarray
    ideal: np.ndarray
    ideal_mask: np.ndarray
    tors_off: np.ndarray
    tors: np.ndarray
    tors_code: np.ndarray
    in_head: np.ndarray
    rank: np.ndarray
    end_tail: np.ndarray
    end: np.ndarray
    depth: np.ndarray
    seq: np.ndarray
    parent_where: np.ndarray
    prev_rank: np.ndarray
    flags: np.ndarray
    has_offset: np.ndarray


def _piece(t: int, place: int) -> dict:
    """The piece of type ``t`` at ``place``, cut from an example chain."""
    n_res, r = {FIRST: (3, 0), MIDDLE: (3, 1), LAST: (3, 2), ONLY: (1, 0)}[place]
    lay = layout_from_types(np.full(n_res, t))
    table = ConstructionTable(lay.refs)
    res = lay.residue_index
    a0 = np.searchsorted(res, np.arange(n_res + 1))  # first atom of every residue
    atoms = np.arange(a0[r], a0[r + 1])
    kind = table.kind[atoms]
    x = table.refs[atoms]
    xs = np.maximum(x, 0)
    off = np.where(x >= 0, res[xs] - r, 0)
    slot = np.where(x >= 0, xs - a0[res[xs]], -1)
    if (np.abs(off) > 1).any() or (slot[off != 0] > 3).any():
        raise RuntimeError(f"{TYPES[t].name}: a reference beyond the neighbours' backbone")
    # every row a rigid child of its bond reference (or a ROOT), offsets on their d
    rigid = (table.parent[atoms] == np.where(kind == ROOT, -1, x[:, 0])).all()
    if not rigid or not (table.offset_of[atoms] == np.where(kind == OFFSET, x[:, 2], -1)).all():
        raise RuntimeError(f"{TYPES[t].name}: a row that is not a rigid child")
    pos = table.dfs_pos[atoms]
    later = table.dfs_pos[a0[r + 1] :]
    split = later.min() if len(later) else pos.max() + 1
    in_head = pos < split
    h0, n_head = pos.min(), int(in_head.sum())
    t0 = later.max() + 1 if len(later) else h0 + n_head
    rank = np.where(in_head, pos - h0, pos - t0)
    if (
        not (np.sort(pos[in_head]) == h0 + np.arange(n_head)).all()
        or not (np.sort(rank[~in_head]) == np.arange(len(atoms) - n_head)).all()
    ):
        raise RuntimeError(f"{TYPES[t].name}: the residue is not a head and a tail in depth-first order")
    end = table.subtree_end[pos]
    end_tail = end > h0 + n_head
    depth = table.dfs_depth[pos]
    n_depth = table.dfs_depth[table.dfs_pos[a0[r + 1]]] if r + 1 < n_res else 0
    tors = lay.torsion_slot[atoms]
    return {
        "atom_name": lay.atom_names[atoms],
        "element": lay.elements[atoms],
        "ideal": lay.ideal[atoms],
        "ideal_mask": lay.ideal_mask[atoms],
        "tors_off": np.where(tors >= 0, tors // N_TORSIONS - r, 0),
        "tors": np.where(tors >= 0, tors % N_TORSIONS, -1),
        "kind": kind,
        "off": off,
        "slot": slot,
        "in_head": in_head,
        "rank": rank,
        "end_tail": end_tail,
        "end": np.where(end_tail, end - t0, end - h0),
        "depth": depth - depth[0],
        "head": n_head,
        "next_depth": n_depth - depth[0],
    }


def _ring(piece: dict, t: int) -> tuple:
    """A proline piece's CA, CB, CG, CD (CG, CD: the atoms of its own chi1, chi2;
    CA, CB: 4 and 1 atoms before CG in template order), else -1s."""
    if TYPES[t].name != "PRO":
        return (-1,) * 4
    own = piece["tors_off"] == 0
    col = (TORSION_NAMES.index("chi1"), TORSION_NAMES.index("chi2"))
    cg, cd = (int(np.flatnonzero(own & (piece["tors"] == c))[0]) for c in col)
    if tuple(piece["atom_name"][[cg - 4, cg - 1, cg, cd]]) != ("CA", "CB", "CG", "CD"):
        raise RuntimeError("PRO: the ring atoms are not CA, CB, CG, CD in template order")
    return cg - 4, cg - 1, cg, cd


def _short_chains(pieces: list[dict]) -> bool:
    """Whether no OFFSET row's dihedral reference can be an OFFSET row itself
    (then every offset chain ends after one link): the reference is in the
    piece, or a slot of a neighbour, which may be of any piece."""
    offset_at = {}  # slot -> whether some piece has an OFFSET row there
    for p in pieces:
        for slot, k in enumerate(p["kind"]):
            offset_at[slot] = offset_at.get(slot, False) or k == OFFSET
    for p in pieces:
        for a in np.flatnonzero(p["kind"] == OFFSET):
            off, slot = p["off"][a, 2], p["slot"][a, 2]
            if p["kind"][slot] == OFFSET if off == 0 else offset_at[slot]:
                return False
    return True


@functools.cache
def _pieces() -> _Pieces:
    types = [t for t in range(len(TYPES)) for place in range(4)]
    pieces = [_piece(t, place) for t in range(len(TYPES)) for place in range(4)] + [_PAD_PIECE]
    size = np.array([len(p["kind"]) for p in pieces], np.int64)
    S = int(size.max()) + 1

    def cat(name):
        return np.concatenate([p[name] for p in pieces])

    # a reference (offset, slot) of piece atom j is atom j itself plus
    # slot - j, + the piece's size (next residue), - the previous residue's size
    off, slot = cat("off")[:, None], cat("slot")[:, None]  # (atoms, 1, 3)
    j = np.concatenate([np.arange(n) for n in size])[:, None, None]
    own = per_row(size, size)[:, None, None]
    prev = np.arange(S)[None, :, None]  # (1, S, 1): the previous residue's size
    delta = slot - j + np.where(off == 1, own, 0) - np.where(off == -1, prev, 0)
    delta = np.where(slot >= 0, delta, NONE).reshape(-1, 3)
    offset = np.repeat(cat("kind") == OFFSET, S)
    link = np.where(offset, delta[:, 2], BEYOND).reshape(-1, S)
    if (link != link[:, :1]).any():
        raise RuntimeError("an offset row whose dihedral reference is in the previous residue")
    return _Pieces(
        short_chains=_short_chains(pieces[:-1]),
        start=starts(size),
        size=size,
        ring=np.array([_ring(p, t) for p, t in zip(pieces, types, strict=False)] + [(-1,) * 4], np.int64),
        head=np.array([p["head"] for p in pieces], np.int64),
        next_depth=np.array([p["next_depth"] for p in pieces], np.int64),
        kind=cat("kind"),
        delta=delta,
        bond=np.ascontiguousarray(delta[:, 0]),
        link=np.ascontiguousarray(link[:, 0]),
        atom_name=cat("atom_name"),
        element=cat("element"),
        ideal=cat("ideal"),
        ideal_mask=cat("ideal_mask"),
        tors_off=cat("tors_off"),
        tors=cat("tors"),
        # beside the residue's base slot; NONE (far below -1) for no torsion
        tors_code=np.where(cat("tors") >= 0, cat("tors_off") * N_TORSIONS + cat("tors"), NONE),
        in_head=cat("in_head"),
        rank=cat("rank"),
        end_tail=cat("end_tail"),
        end=cat("end"),
        depth=cat("depth"),
        has_offset=np.array([(p["kind"] == OFFSET).any() for p in pieces]),
        **_dfs_fields(pieces, size),
    )


def _dfs_fields(pieces: list[dict], size: np.ndarray) -> dict:
    """``_Pieces``' depth-first fields (see there) of ``pieces``."""
    seq, code, rank, flags, prev_rank = [], [], [], [], []
    hang = set()  # slots of the previous residue that a root hangs on
    # the kinds of each slot in the pieces that can follow another (middle, last)
    follow = [p for i, p in enumerate(pieces[:-1]) if i % 4 in (MIDDLE, LAST)]
    for p, a0 in zip(pieces, starts(size), strict=True):
        in_head, kind, off, slot = p["in_head"], p["kind"], p["off"], p["slot"]
        seq.append(a0 + np.lexsort((p["rank"], ~in_head)))
        b_off, b = off[:, 0], np.maximum(slot[:, 0], 0)
        if (b_off == 1).any():
            raise RuntimeError("an atom whose parent is in the next residue")
        hang.update(slot[b_off == -1, 0].tolist())
        code.append(np.select([kind == ROOT, b_off == -1, ~in_head[b]], [3, 2, 1], 0))
        rank.append(np.where((b_off == 0) & (kind != ROOT), p["rank"][b], 0))
        d_off, d = off[:, 2], np.maximum(slot[:, 2], 0)
        link_kind = np.where(kind == OFFSET, kind[np.minimum(d, len(kind) - 1)], ROOT)
        for a in np.flatnonzero((kind == OFFSET) & (d_off != 0)):
            kinds = {int(q["kind"][d[a]]) for q in follow} if d_off[a] == 1 else {-1}
            if len(kinds) != 1 or -1 in kinds:
                raise RuntimeError("an offset row whose dihedral reference's kind varies with the neighbour")
            link_kind[a] = kinds.pop()
        f = np.zeros((len(kind), 8), np.uint8)
        f[:, :6] = np.stack(
            [kind != ROOT, kind > BOND, kind > PLANAR, link_kind > PLANAR, kind > BOND, kind > PLANAR], 1
        )
        flags.append(f)
    if len(hang) != 1:
        raise RuntimeError(f"roots hang on several slots of the previous residue: {sorted(hang)}")
    (hang,) = hang
    for p in pieces:
        prev_rank.append(p["rank"][hang] if len(p["kind"]) > hang and p["in_head"][hang] else -1)
    return {
        "seq": np.concatenate(seq),
        "parent_where": np.concatenate(rank).astype(np.int64) * 4 + np.concatenate(code),
        "prev_rank": np.array(prev_rank, np.int64),
        "flags": np.concatenate(flags).view(np.uint64).reshape(-1),
    }


@dataclass(frozen=True)
class Stamp:
    """Where the pieces of a batch go. The padded layout is cut into *units*:
    the residues of protein 0, then its padding atoms one unit each, then
    protein 1's residues, ... (so unit ``u``'s atoms start at ``atom0[u]``,
    a padded index, with no gap). Per unit its ``piece``, ``size`` (atoms),
    ``tree`` (its tree's first unit; a padding atom is its own tree),
    ``last`` (its tree's last unit), ``pad`` (padded residue index ``b *
    L_max + k``, residues only); per atom ``unit``, ``pa`` (piece atom), made
    on first use."""

    n_max: int
    L_max: int
    n_res: np.ndarray
    n_atoms: np.ndarray
    piece: np.ndarray
    size: np.ndarray
    atom0: np.ndarray
    tree: np.ndarray
    last: np.ndarray
    pad: np.ndarray

    @functools.cached_property
    def unit(self) -> np.ndarray:
        return segment_ids(self.size)

    @functools.cached_property
    def pa(self) -> np.ndarray:
        out = np.take(_pieces().start[self.piece] - self.atom0, self.unit)
        out += np.arange(len(out))
        return out

    @property
    def N(self) -> int:
        return len(self.n_res) * self.n_max


def stamp(types: list[np.ndarray]) -> Stamp:
    """The :class:`Stamp` of sequences of residue ``types`` (each non-empty)."""
    P = _pieces()
    n_res = np.array([len(t) for t in types], np.int64)
    R = int(n_res.sum())
    res0 = starts(n_res)
    prot = segment_ids(n_res)
    place = np.full(R, MIDDLE)
    place[res0 + n_res - 1] = LAST
    place[res0] = np.where(n_res == 1, ONLY, FIRST)
    piece = np.concatenate(types) * 4 + place
    n_atoms = np.add.reduceat(P.size[piece], res0)
    n_max, L_max = int(n_atoms.max()), int(n_res.max())
    units = n_res + n_max - n_atoms  # a protein's residues and padding atoms
    u0 = starts(units)
    real = np.arange(R) + (u0 - res0)[prot]  # unit of every residue
    U = int(units.sum())
    unit_piece = np.full(U, PAD, np.int64)
    unit_piece[real] = piece
    tree, last = np.arange(U), np.arange(U)
    tree[real], last[real] = u0[prot], (u0 + n_res - 1)[prot]
    pad = np.zeros(U, np.int64)
    pad[real] = np.arange(R) + prot * L_max - res0[prot]
    size = P.size[unit_piece]
    return Stamp(
        n_max=n_max,
        L_max=L_max,
        n_res=n_res,
        n_atoms=n_atoms,
        piece=unit_piece,
        size=size,
        atom0=starts(size),
        tree=tree,
        last=last,
        pad=pad,
    )


def kernel_arrays(st: Stamp, n_threads: int | None = None) -> tuple[np.ndarray, ...]:
    """The compiled kernel's plan arrays of the batch's table
    (``zmat._kernel.KernelPlan``'s ``ints``, ``flags``, ``chunks`` and
    ``roots``, in depth-first order) stamped straight from the pieces: what
    a fresh batch's training step reads, and ``dfs_order`` / ``dfs_parent``
    of the table. ``n_threads``: the C stamp's (``zmat._kernel.stamp_plan``).

    A tree's preorder is its units' heads in order, then their tails in
    reverse order: ``2 U`` runs of piece atoms (``_Pieces.seq``), head of
    unit ``u`` run ``tree + u``, its tail run ``tree + 2 last + 1 - u``. Trees
    follow each other, so their roots are their first units' first atoms and
    the chunks come from those, not from a pass over the parents."""
    P = _pieces()
    k = 4 if P.has_offset[st.piece].any() else 3  # the offset chain's width + 2 (the table's)
    units = (st.piece, st.size, st.atom0, st.last)
    pieces = (P.head, P.start, P.prev_rank, P.seq, P.parent_where, P.link, P.flags)
    stamped = _kernel.stamp_plan(units, pieces, st.N, k, n_threads)
    ints, flags = stamped if stamped is not None else _kernel_arrays(st, k)
    roots = st.atom0[st.tree == np.arange(len(st.tree))]
    return ints, flags, _kernel.tree_chunks(roots, st.N), roots


def _kernel_arrays(st: Stamp, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`kernel_arrays` in numpy (the reference of the compiled one)."""
    P = _pieces()
    N, piece, size, tree, last = st.N, st.piece, st.size, st.tree, st.last
    take, U = np.take, len(piece)
    u = np.arange(U)
    head = take(P.head, piece)
    runs = np.empty((3, 2 * U), np.int64)  # per run: length, first in P.seq, unit
    run_len, run_first, run_unit = runs
    at_head, at_tail = tree + u, tree + 2 * last + 1 - u
    run_len[at_head], run_len[at_tail] = head, size - head
    first = take(P.start, piece)
    run_first[at_head], run_first[at_tail] = first, first + head
    run_unit[at_head], run_unit[at_tail] = u, u
    run_start = starts(run_len)
    # where a parent is, per unit: its head, its tail, the previous unit's hanging atom, none
    base = np.empty((U, 4), np.int64)
    base[:, 0], base[:, 1], base[:, 3] = run_start[at_head], run_start[at_tail], -1
    base[1:, 2] = base[:-1, 0] + take(P.prev_rank, piece[:-1])
    base[0, 2] = -1
    run = per_row(np.arange(2 * U), run_len)  # the run of every position
    ints = np.empty((k + 2, N), np.int64)
    order, parent = ints[k + 1], ints[k]
    pa = take(run_first - run_start, run, out=order)  # piece atom of every position
    pa += np.arange(N)
    pa = take(P.seq, pa)
    take(st.atom0 - first, run_unit, out=run_first)  # (run_first: no longer needed)
    take(run_first, run, out=order)
    order += pa
    np.multiply(run_unit, 4, out=run_unit)
    take(run_unit, run, out=parent)
    where = take(P.parent_where, pa)  # rank * 4 + code
    parent += where & 3
    take(base.reshape(-1), parent, out=parent)
    where >>= 2
    parent += where
    np.multiply(order, 3, out=ints[0])
    np.add(ints[0], 1, out=ints[1])
    np.add(ints[0], 2, out=ints[2])
    if k == 4:
        link = take(P.link, pa, out=ints[3])
        link += order
        np.minimum(link, N - 1, out=link)
        link *= 3
        link += 2
    bits = take(P.flags, pa).view(np.uint8).reshape(N, 8).T
    flags = np.ascontiguousarray(bits[:6] if k == 4 else bits[[0, 1, 2, 4, 5]]).view(bool)
    return ints, flags


def _offset_chains(link: np.ndarray, ar: np.ndarray, short: bool) -> np.ndarray:
    """``(N, L)`` offset chains (as ``ConstructionTable._classify`` makes them:
    every atom, then its offset reference's chain; ``N``: none) from every
    atom's link delta (``BEYOND``: not an OFFSET row). ``short``: no chain has
    a second link (``_Pieces.short_chains``), so none is looked for."""
    N = len(ar)
    chain = np.empty((N, 2), np.int64)
    col = chain[:, 1]
    np.add(link, ar, out=col)
    np.minimum(col, N, out=col)
    chain[:, 0] = ar
    links = None if short else np.append(col, N)
    nxt = None if short else np.take(links, col)
    if short or nxt.min() == N:  # no link of a link
        return chain if col.min() < N else chain[:, :1].copy()
    out = [ar, col]
    while nxt.min() < N:
        out.append(nxt)
        nxt = np.take(links, nxt)
    return np.stack(out, 1)


def _offset_of(chain: np.ndarray, n: int) -> np.ndarray:
    """Every atom's offset reference (-1: none) from its offset chain (``n``: none)."""
    if chain.shape[1] == 1:
        return np.full(n, -1, np.int64)
    return np.where(chain[:, 1] < n, chain[:, 1], -1)


def batch_table(st: Stamp, kernel: tuple | None = None) -> ConstructionTable:
    """The table of ``ProteinBatch(sequences)`` from its :class:`Stamp`.

    Its plan is made on first use (:func:`batch_plan`), and the compiled
    kernel's is stamped without it (:func:`kernel_arrays`, the table's
    ``kernel_arrays``; ``kernel``: those, made already, and the kernel's
    chunks): a fresh batch's training step on the CPU reads none."""
    made = kernel
    kernel = functools.cache(lambda: kernel_arrays(st)) if made is None else (lambda: made)
    table = ConstructionTable.from_plan(lambda: batch_plan(st, kernel()), st.N, constant_anchors=True)
    table.kernel_arrays = kernel
    return table


def batch_plan(st: Stamp, kernel: tuple[np.ndarray, np.ndarray]) -> TablePlan:
    """The :class:`~zmat.table.TablePlan` of the batch of :class:`Stamp` ``st``
    (``kernel``: its :func:`kernel_arrays`, which hold the depth-first order
    and parents)."""
    P = _pieces()
    N, piece, unit, pa = st.N, st.piece, st.unit, st.pa
    take = np.take  # per-atom gathers: faster than [] indexing
    ar = np.arange(N)
    order, dfs_parent = kernel[0][-1], kernel[0][-2]
    rows = pa * (P.delta.shape[0] // len(P.kind)) + take(np.append(0, st.size[:-1]), unit)
    refs = take(P.delta, rows, 0)  # np.take: several times faster than [] on rows
    refs += ar[:, None]
    parent = take(P.bond, rows)  # every row is a rigid child of its bond reference
    parent += ar
    pos = np.empty(N, np.int64)
    pos[order] = ar
    # subtree ends, relative to the start of the atom's head or tail run
    head = P.head[piece]
    heads, tails = np.cumsum(head), np.cumsum(st.size - head)
    tree_start = st.atom0[st.tree]
    before = (heads - head)[st.tree]  # heads before the tree's
    head_start = tree_start + heads - head - before
    tail_start = tree_start + heads[st.last] - before + tails[st.last] - tails
    end = np.where(take(P.end_tail, pa), take(tail_start, unit), take(head_start, unit))
    end += take(P.end, pa)
    unit_depth = starts(P.next_depth[piece])
    depth = take(unit_depth - unit_depth[st.tree], unit)
    depth += take(P.depth, pa)
    chain = _offset_chains(take(P.link, pa), ar, P.short_chains)
    return TablePlan(
        kind=take(P.kind, pa),
        dfs_depth=take(depth, order),
        stage=np.zeros(N, np.int64),  # every segment root is a ROOT row: one stage
        refs=np.maximum(refs, -1, out=refs),
        parent=np.maximum(parent, -1, out=parent),
        offset_of=_offset_of(chain, N),
        dfs_order=order,
        dfs_pos=pos,
        subtree_end=take(end, order),
        dfs_parent=dfs_parent,
        dfs_segment=take(tree_start, unit),  # a tree is one segment
        offset_chain=chain,
    )


#: the arrays the compiled fill reads (``fill_internal`` also ``ideal_mask``);
#: the others are made on first use
FORWARD = ("ideal", "torsion_slot", "proline_rows")


def _proline_rows(st: Stamp) -> np.ndarray:
    """``(P, 4)`` atoms CA, CB, CG, CD of every proline (``Layout.proline_rows``'
    convention), in residue order: per residue, no pass over the atoms."""
    P = _pieces()
    u = np.flatnonzero(np.take(P.ring[:, 2] >= 0, st.piece))
    return P.ring[st.piece[u]] + st.atom0[u, None]


def _fill_arrays(st: Stamp, n_threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``ideal`` ``(N, 3)`` and ``torsion_slot``, the flat torsion index
    ``residue * 7 + column`` of every atom (-1: none): in C where the kernel
    is loaded (on ``n_threads``, as ``zmat._kernel.stamp_atoms``), else in
    numpy (the reference)."""
    P = _pieces()
    pad7 = st.pad * N_TORSIONS
    units, pieces = (st.piece, st.size, st.atom0, pad7), (P.start, P.ideal, P.tors_code)
    stamped = _kernel.stamp_atoms(units, pieces, st.N, n_threads)
    if stamped is not None:
        return stamped
    slot = np.take(pad7, st.unit)
    slot += np.take(P.tors_code, st.pa)
    return np.take(P.ideal, st.pa, 0), np.maximum(slot, -1, out=slot)


def batch_arrays(st: Stamp, names=None) -> dict:
    """``ProteinBatch``'s padded per-atom arrays from its :class:`Stamp`:
    ``ideal``, ``ideal_mask``, ``torsion_slot`` (flat, ``(B * n_max, ...)``),
    ``proline_rows`` (flat atom indices),
    ``atom_mask``, ``atom_names``, ``elements``, ``residue_index``
    (``(B, n_max)``) and ``residue_mask`` (``(B, L_max)``); ``names``: only those."""
    P = _pieces()
    B = len(st.n_res)
    fill = functools.cache(lambda: _fill_arrays(st))
    makers = {
        "ideal": lambda: fill()[0],
        "ideal_mask": lambda: np.take(P.ideal_mask, st.pa, 0),
        "torsion_slot": lambda: fill()[1],
        "proline_rows": lambda: _proline_rows(st),
        "atom_mask": lambda: (st.piece != PAD)[st.unit].reshape(B, -1),
        "residue_mask": lambda: (
            np.bincount(st.pad[st.piece != PAD], minlength=B * st.L_max).astype(bool).reshape(B, -1)
        ),
        "atom_names": lambda: P.atom_name[st.pa].reshape(B, -1),
        "elements": lambda: P.element[st.pa].reshape(B, -1),
        "residue_index": lambda: np.where(st.piece != PAD, st.pad % st.L_max, -1)[st.unit].reshape(B, -1),
    }
    return {k: makers[k]() for k in (makers if names is None else names)}
