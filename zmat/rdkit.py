"""Molecules in torsion space: RDKit Mols in, rotatable bonds as the degrees of freedom.

``import zmat.rdkit`` needs RDKit (the optional extra ``zmat[rdkit]``);
``import zmat`` does not.

:class:`TorsionSpace` holds a molecule (one RDKit conformer) whose only
degrees of freedom are the torsions of its rotatable bonds; every bond
length, bond angle, ring, stereocentre and double bond stays as in the
conformer. It is a z-matrix whose construction table (rows in the Mol's atom
order) is built so that each rotatable bond is exactly one dihedral:

* A spanning tree of the bond graph is walked breadth first (neighbours in
  increasing index) from a *root*: in the largest fragment, the largest
  rigid group (atoms joined by non-rotatable bonds), its lowest-index atom of
  degree 1 (else its lowest-index atom). Ring closures are the bonds the
  tree leaves out; they stay closed because nothing inside a ring moves.
  Further fragments (salts, solvent) are attached by a virtual edge from
  their atom nearest to the root's rigid group, to that group, so nothing
  moves between fragments (ETKDG may place counter-ions on top of each
  other; attaching to the root's group keeps them apart in the table).
* Atom ``i`` with tree parent ``p`` is placed from ``p`` and ``p``'s own
  references: the first child of ``p`` by ``(p, b_p, a_p)`` (a *proper* row of
  :mod:`zmat.table`), every other child by ``(p, b_p, first child)`` (an
  *offset* row: its dihedral is relative to its first sibling). So changing
  the dihedral of the first child of ``q`` rotates ``q``'s whole subtree
  rigidly about the bond ``p-q``: for a rotatable bond ``p-q`` that row is its
  one degree of freedom, and all other internal coordinates are frozen.

Rotatable bonds (``rotatable=``):

* ``None`` (default): RDKit's strict pattern :data:`STRICT_SMARTS` (the SMARTS
  of ``rdMolDescriptors.CalcNumRotatableBonds`` with
  ``NumRotatableBondsOptions.Strict``, ``Code/GraphMol/Descriptors/Lipinski.cpp``:
  single or aromatic acyclic bonds, no triple bonds, no terminal atoms, no
  CF3/CCl3/CBr3/tBu/CH3 ends, no amide-like C(=X)-N/O/S bonds), and, so that
  a Mol with explicit hydrogens has the same torsions as without, each end
  needs a heavy-atom neighbour besides the other end (no OH/NH2/SH rotors);
* a SMARTS string: the first two atoms of each match; matches on ring bonds
  are ignored;
* a sequence of ``(b, c)`` atom index pairs, used as given (any bond order);
  a pair that is not a bond, or a bond in a ring, raises ``ValueError``.

Quads: torsion ``k`` is the dihedral ``(a, b, c, d)`` of :attr:`TorsionSpace.quads`;
``b-c`` is the bond oriented so that ``c``'s side moves (the side away from
the root, which stays fixed in the Mol's frame: exactly the side
``rdMolTransforms.SetDihedralRad(conf, a, b, c, d, value)`` moves). ``a`` is
the neighbour of ``b`` (``d`` of ``c``) with the highest atomic number, lowest
index on ties.

Two ways to place the atoms, same result to rounding (tested):

* ``method="rigid"`` (default): the moving side of each rotatable bond is a
  rigid body. The rotations by ``torsions - self.torsions`` about the
  conformer's bond axes (Rodrigues) are composed from the root outwards, one
  vectorised step per nesting level of rotatable bonds (a handful), and every
  atom takes the motion of its innermost torsion (one GEMM). It needs no
  construction table, so :meth:`TorsionSpace.batch` of different molecules is
  a few numpy concatenations. On plain CPU float tensors the same math runs
  in zmat's compiled kernel (``zmat/csrc/torsions.cpp``: one pass per
  conformer, forward and gradient; the torch ops stay the reference and serve
  double backward, other devices and ``ZMAT_NO_KERNEL=1``).
* ``method="table"``: the frozen internal coordinates with the torsions
  scattered into their rows, one :func:`zmat.to_xyz` call on the table above;
  zmat places the molecule in its canonical frame (root at the origin) and a
  fixed rigid motion, fitted once on the conformer, maps it back.

Frame: positions come back in the conformer's own frame. The root's rigid
group never moves, so ``to_xyz(torsions)`` reproduces the conformer and
changing torsion ``k`` gives what ``SetDihedralRad`` gives, to rounding
(``tests/test_rdkit.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

try:
    from rdkit import Chem
    from rdkit.Geometry import Point3D
except ImportError as err:  # pragma: no cover - exercised only without RDKit
    raise ImportError(
        "zmat.rdkit needs RDKit: install it with `pip install 'zmat[rdkit]'` (or `pip install rdkit`)"
    ) from err

from ._align import kabsch_rotation, superpose
from ._rigid_torsions import RigidTorsions, moving_sides
from ._table_torsions import TableTorsions
from ._torsion_arrays import TorsionArrays
from .batch import Ragged, concatenate_tables
from .table import ConstructionTable
from .transform import dihedrals, to_internal, to_xyz

__all__ = ["STRICT_SMARTS", "TorsionSpace", "rotatable_bonds", "torsion_table", "zmatrix_from_mol"]

_END = "!$(*#*)&!D1&!$(C(F)(F)F)&!$(C(Cl)(Cl)Cl)&!$(C(Br)(Br)Br)&!$(C([CH3])([CH3])[CH3])&!$([CH3])"
_AMIDE = (
    "&!$([CD3](=[N,O,S])-!@[#7,O,S!D1])&!$([#7,O,S!D1]-!@[CD3]=[N,O,S])"
    "&!$([CD3](=[N+])-!@[#7!D1])&!$([#7!D1]-!@[CD3]=[N+])"
)
#: RDKit's strict rotatable-bond SMARTS (``Lipinski.cpp``, ``NumRotatableBondsOptions.Strict``).
STRICT_SMARTS = f"[{_END}{_AMIDE}]-,:;!@[{_END}]"


# ------------------------------------------------------------------ input
def _positions(mol, conf_id: int) -> np.ndarray:
    """``(N, 3)`` float64 positions of conformer ``conf_id``; checks the Mol."""
    if not isinstance(mol, Chem.Mol):
        raise TypeError(f"expected an RDKit Chem.Mol, got {type(mol).__name__}")
    if mol.GetNumAtoms() == 0:
        raise ValueError("the Mol has no atoms")
    dummies = [a.GetIdx() for a in mol.GetAtoms() if a.GetAtomicNum() == 0]
    if dummies:
        raise ValueError(f"the Mol has dummy atoms (atomic number 0) at indices {dummies}; remove them first")
    if mol.GetNumConformers() == 0:
        raise ValueError("the Mol has no conformer: embed one first (e.g. AllChem.EmbedMolecule)")
    ids = [c.GetId() for c in mol.GetConformers()]
    if conf_id != -1 and conf_id not in ids:
        raise ValueError(f"the Mol has no conformer with id {conf_id} (ids: {ids})")
    pos = np.asarray(mol.GetConformer(conf_id).GetPositions(), np.float64)
    if not np.isfinite(pos).all():
        raise ValueError(f"conformer {conf_id} has non-finite positions")
    return pos


def _bonds(mol) -> np.ndarray:
    return np.array([(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()], np.int64).reshape(
        -1, 2
    )


def rotatable_bonds(mol, rotatable=None) -> np.ndarray:
    """``(k, 2)`` int64 array of the rotatable bonds ``(b, c)`` (see the module docstring).

    Pattern matches come sorted (``b < c``, rows in increasing order); an
    explicit list keeps its order.

    Raises:
        ValueError: a pair that is not a bond of the Mol, a ring bond, a bond
            with a terminal atom (nothing to rotate), a bad SMARTS.
    """
    n = mol.GetNumAtoms()
    ring = _ring_bonds(n, _bonds(mol))  # RDKit's ring info leaves out rings closed by dative bonds
    if rotatable is None or isinstance(rotatable, str):
        smarts = STRICT_SMARTS if rotatable is None else rotatable
        patt = Chem.MolFromSmarts(smarts)
        if patt is None or patt.GetNumAtoms() < 2:
            raise ValueError(f"rotatable: {smarts!r} is not a SMARTS of at least two atoms")
        pairs = set()
        for match in mol.GetSubstructMatches(patt, uniquify=False, maxMatches=100_000):
            bond = mol.GetBondBetweenAtoms(match[0], match[1])
            if bond is None or tuple(sorted(match[:2])) in ring:
                continue
            pairs.add(tuple(sorted(match[:2])))
        deg = [a.GetDegree() for a in mol.GetAtoms()]
        pairs = {p for p in pairs if min(deg[p[0]], deg[p[1]]) >= 2}
        if rotatable is None:
            pairs = {p for p in pairs if all(_heavy_beyond(mol, *e) for e in (p, p[::-1]))}
        return np.array(sorted(pairs), np.int64).reshape(-1, 2)
    pairs = np.asarray(rotatable)
    if pairs.size == 0:
        return np.zeros((0, 2), np.int64)
    if pairs.dtype.kind not in "iu" or pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"rotatable must be None, a SMARTS or (k, 2) atom index pairs, got {pairs!r}")
    for k, (b, c) in enumerate(pairs.tolist()):
        if not (0 <= b < n and 0 <= c < n):
            raise ValueError(f"rotatable[{k}] = ({b}, {c}): atom index out of range for {n} atoms")
        bond = mol.GetBondBetweenAtoms(b, c)
        if bond is None:
            raise ValueError(f"rotatable[{k}] = ({b}, {c}) is not a bond of the Mol")
        if (min(b, c), max(b, c)) in ring:
            raise ValueError(
                f"rotatable[{k}] = ({b}, {c}) is a ring bond (rings closed by dative bonds count); "
                "ring bonds cannot be rotated"
            )
        for x in (b, c):
            if mol.GetAtomWithIdx(x).GetDegree() < 2:
                raise ValueError(f"rotatable[{k}] = ({b}, {c}): atom {x} has no other neighbour to rotate")
    if len({tuple(sorted(p)) for p in pairs.tolist()}) != len(pairs):
        raise ValueError("rotatable lists a bond twice")
    return pairs.astype(np.int64)


def _ring_bonds(n: int, edges: np.ndarray) -> set[tuple[int, int]]:
    """The bonds ``(i, j)``, ``i < j``, that lie on a cycle of the bond graph (every bond
    that is not a bridge; Tarjan's low-link, iterative), dative bonds included."""
    adj: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for k, (i, j) in enumerate(edges.tolist()):
        adj[i].append((j, k))
        adj[j].append((i, k))
    disc, low, bridge = [-1] * n, [0] * n, np.zeros(len(edges), bool)
    clock = 0
    for s in range(n):
        if disc[s] >= 0:
            continue
        disc[s] = low[s] = clock
        clock += 1
        stack = [(s, -1, iter(adj[s]))]
        while stack:
            v, via, nbrs = stack[-1]
            for w, k in nbrs:
                if k == via:
                    continue
                if disc[w] < 0:
                    disc[w] = low[w] = clock
                    clock += 1
                    stack.append((w, k, iter(adj[w])))
                    break
                low[v] = min(low[v], disc[w])
            else:
                stack.pop()
                if stack:
                    u = stack[-1][0]
                    low[u] = min(low[u], low[v])
                    bridge[via] = low[v] > disc[u]
    return {
        (min(i, j), max(i, j)) for (i, j), br in zip(edges.tolist(), bridge.tolist(), strict=True) if not br
    }


def _check_bonds_apart(mol, pos: np.ndarray) -> None:
    """Bonded atoms must not coincide: a bond of length 0 has no direction to rotate about
    or to measure from (an all-zero conformer used to give NaN coordinates)."""
    e = _bonds(mol)
    if not len(e):
        return
    length = np.linalg.norm(pos[e[:, 0]] - pos[e[:, 1]], axis=-1)
    short = np.flatnonzero(length < 1e-4)
    if len(short):
        i, j = e[short[0]]
        raise ValueError(
            f"the conformer has {len(short)} bonds of length ~0, e.g. atoms {i} and {j} coincide "
            f"({length[short[0]]:.1e} A): embed it first (e.g. AllChem.EmbedMolecule)"
        )


def _heavy_beyond(mol, b: int, c: int) -> bool:
    """Does atom ``b`` have a heavy-atom neighbour other than ``c``?"""
    return any(x.GetAtomicNum() > 1 and x.GetIdx() != c for x in mol.GetAtomWithIdx(b).GetNeighbors())


# ------------------------------------------------------------------ table
def _components(n: int, edges: np.ndarray) -> np.ndarray:
    g = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    return connected_components(g, directed=False)[1]


def _spanning_tree(pos: np.ndarray, edges: np.ndarray, rot: np.ndarray):
    """Breadth-first spanning forest joined into one tree: ``(order, parent)``.

    See the module docstring for the root and for how fragments are joined.
    """
    n = len(pos)
    nbrs = [[] for _ in range(n)]
    for i, j in edges.tolist():
        nbrs[i].append(j)
        nbrs[j].append(i)
    nbrs = [sorted(x) for x in nbrs]
    frag = _components(n, edges)
    rot_keys = {tuple(sorted(p)) for p in rot.tolist()}
    rigid_edges = np.array([e for e in edges.tolist() if tuple(sorted(e)) not in rot_keys], np.int64)
    group = _components(n, rigid_edges.reshape(-1, 2))
    frag_size, group_size = np.bincount(frag), np.bincount(group)
    # largest fragment, then its largest rigid group (ties: lowest atom index, argmax takes the first)
    big = np.lexsort((np.arange(n), -group_size[group], -frag_size[frag]))[0]
    members = np.nonzero(group == group[big])[0]
    terminal = [i for i in members.tolist() if len(nbrs[i]) == 1]
    root = terminal[0] if terminal else int(members[0])
    parent = np.full(n, -1, np.int64)
    built = np.zeros(n, bool)
    fixed = group == group[root]
    order: list[int] = []
    start, par = root, -1
    while True:
        built[start], parent[start] = True, par
        queue = deque([start])
        while queue:
            i = queue.popleft()
            order.append(i)
            for j in nbrs[i]:
                if not built[j]:
                    built[j], parent[j] = True, i
                    queue.append(j)
        if built.all():
            return np.array(order, np.int64), parent
        # next fragment: its atom nearest to the fixed part (ties: lowest indices)
        todo, anchor = np.nonzero(~built)[0], np.nonzero(fixed)[0]
        dist = np.linalg.norm(pos[todo][:, None] - pos[anchor][None], axis=-1)
        # ETKDG may embed fragments on top of each other: never hang an atom on one it coincides with
        dist[dist < 1e-4] = np.inf if (dist >= 1e-4).any() else 0.0
        t, a = np.unravel_index(np.argmin(dist), dist.shape)
        start, par = int(todo[t]), int(anchor[a])


def torsion_table(mol, rotatable=None, conf_id: int = -1):
    """The torsion-space construction table of a Mol (see the module docstring).

    Returns:
        ``(refs, quads, dof)``: ``(N, 3)`` int64 table rows in the Mol's atom
        order; ``(k, 4)`` quads ``(a, b, c, d)``, ``c``'s side moving;
        ``(k,)`` the row whose dihedral is torsion ``k``'s degree of freedom.
    """
    pos = _positions(mol, conf_id)
    rot = rotatable_bonds(mol, rotatable)
    order, parent = _spanning_tree(pos, _bonds(mol), rot)
    n = len(pos)
    children = [[] for _ in range(n)]
    for i in order[1:].tolist():  # breadth-first order: children in visiting order
        children[parent[i]].append(i)
    refs = np.full((n, 3), -1, np.int64)
    root = int(order[0])
    rc = children[root]
    for k, c in enumerate(rc):  # the root's children: bond, planar, then full rows
        refs[c] = (root, rc[0], rc[1]) if k >= 2 else (root, rc[0] if k else -1, -1)
    for p in order.tolist():
        kids = children[p]
        if p == root or not kids:
            continue
        b_p, a_p = refs[p, 0], refs[p, 1]
        if a_p < 0:  # p is the root's first child: its own angle reference is missing
            a_p = rc[1] if len(rc) > 1 else -1
        refs[kids[0]] = (p, b_p, a_p)
        for c in kids[1:]:
            refs[c] = (p, b_p, kids[0])
    # orient every rotatable bond parent -> child and pick its quad and its row
    quads, dof = [], []
    for b, c in rot.tolist():
        if parent[c] != b:
            b, c = c, b
        kids = children[c]
        if not kids:
            raise ValueError(f"bond ({b}, {c}) moves nothing: it closes a ring the Mol's ring info misses")
        if refs[kids[0], 2] < 0:
            raise ValueError(f"bond ({b}, {c}) has no dihedral reference on atom {b}'s side")
        quads.append((_heaviest(mol, b, c), b, c, _heaviest(mol, c, b)))
        dof.append(kids[0])
    return refs, np.array(quads, np.int64).reshape(-1, 4), np.array(dof, np.int64)


def _check_rebuilt(rebuilt: torch.Tensor, pos: torch.Tensor) -> None:
    """The table must rebuild the conformer; it cannot where reference atoms coincide."""
    err = (rebuilt - pos).norm(dim=-1)
    if err.max() > 1e-6:
        i = int(err.argmax())
        raise ValueError(
            f"the conformer cannot be rebuilt from its internal coordinates (atom {i} off by "
            f"{float(err[i]):.2g} A): atoms coincide or references are collinear, e.g. fragments "
            "embedded on top of each other; embed the fragments apart"
        )


def _heaviest(mol, b: int, c: int) -> int:
    """The neighbour of ``b`` other than ``c`` with the highest atomic number (lowest index on ties)."""
    cands = [(-x.GetAtomicNum(), x.GetIdx()) for x in mol.GetAtomWithIdx(b).GetNeighbors() if x.GetIdx() != c]
    return min(cands)[1]


class MolZMatrix(NamedTuple):
    """One conformer as plain z-matrix data; :meth:`zmat.ZMatrix.from_rdkit` makes the object."""

    symbols: list[str]
    internal: torch.Tensor  # (N, 3) float64
    table: ConstructionTable
    title: str
    charge: int


def zmatrix_from_mol(mol, conf_id: int = -1) -> MolZMatrix:
    """Z-matrix data (float64, rows in the Mol's atom order) of one conformer.

    Its table is the torsion-space table (module docstring): each rotatable
    bond of RDKit's strict pattern is the dihedral of one row.
    """
    refs, _, _ = torsion_table(mol, None, conf_id)
    table = ConstructionTable(refs)
    pos = torch.as_tensor(_positions(mol, conf_id))
    internal = to_internal(pos, table)
    rebuilt = to_xyz(internal, table)
    _check_rebuilt(superpose(rebuilt, pos), pos)
    symbols = [a.GetSymbol() for a in mol.GetAtoms()]
    title = mol.GetProp("_Name") if mol.HasProp("_Name") else ""
    return MolZMatrix(symbols, internal, table, title, Chem.GetFormalCharge(mol))


# ------------------------------------------------------ Mols in and out
def _space_of(mol, conf_id: int, rotatable) -> tuple[Chem.Mol, ConstructionTable, TorsionArrays]:
    """Conformer ``conf_id`` of ``mol`` in torsion space: a copy of the Mol
    holding that conformer, the torsion-space table and the arrays."""
    pos = torch.as_tensor(_positions(mol, conf_id))
    _check_bonds_apart(mol, pos.numpy())
    refs, quads, dof = torsion_table(mol, rotatable, conf_id)
    table = ConstructionTable(refs)
    internal = to_internal(pos, table)
    rotation, shift = _to_mol_frame(internal, table, pos)
    torsions = dihedrals(pos, torch.as_tensor(quads))
    owner, bond_parent, level = moving_sides(table, quads)
    arrays = TorsionArrays(
        positions=pos.numpy(),
        internal=internal.numpy(),
        owner=owner,
        quads=quads,
        dof=dof,
        torsions=torsions.numpy(),
        delta=(torsions - internal[dof, 2]).numpy(),
        bond_parent=bond_parent,
        level=level,
        rotation=rotation.numpy()[None],
        shift=shift.numpy()[None],
        n_atoms=np.array([len(pos)]),
        n_torsions=np.array([len(quads)]),
    ).check()
    return Chem.Mol(mol, confId=mol.GetConformer(conf_id).GetId()), table, arrays


def _to_mol_frame(internal: torch.Tensor, table: ConstructionTable, pos: torch.Tensor):
    """The one rigid motion ``x R^T + s`` from zmat's canonical frame to the conformer's: ``(R, s)``."""
    canonical = to_xyz(internal, table)
    p, q = canonical - canonical.mean(0), pos - pos.mean(0)
    rot = kabsch_rotation(p, q)
    shift = pos.mean(0) - canonical.mean(0) @ rot.T
    _check_rebuilt(canonical @ rot.T + shift, pos)
    return rot, shift


def _with_conformers(mol, xyz: np.ndarray):
    """A copy of ``mol`` whose conformers (ids ``0..C-1``) are ``xyz`` (``(C, n, 3)``)."""
    new = Chem.Mol(mol)
    new.RemoveAllConformers()
    for cid, pos in enumerate(xyz):
        conf = Chem.Conformer(mol.GetNumAtoms())
        for i, (px, py, pz) in enumerate(pos.tolist()):
            conf.SetAtomPosition(i, Point3D(px, py, pz))
        conf.SetId(cid)
        new.AddConformer(conf, assignId=False)
    return new


# ------------------------------------------------------------ the space
class TorsionSpace:
    """Molecules whose degrees of freedom are the torsions of their rotatable bonds.

    Build one with :meth:`from_mol`, several different molecules in one with
    :meth:`batch`. A batch is the same object over the flat atoms of all its
    molecules (``atoms``: :class:`~zmat.batch.Ragged`, PyG's ``ptr``/``batch``)
    and their flat torsions (``torsion_index``).

    Its jobs live in their own modules: the arrays and their batching in
    :mod:`zmat._torsion_arrays`, the two placements in
    :mod:`zmat._rigid_torsions` and :mod:`zmat._table_torsions`; this class
    adds the Mols (in: :meth:`from_mol`; out: :meth:`to_mols`) and the table.

    Attributes:
        mols: the RDKit Mols (copies), one per molecule.
        quads: ``(K, 4)`` int64 tensor of flat atom indices ``(a, b, c, d)``;
            ``b-c`` the rotatable bond, ``c``'s side moves.
        torsions: ``(K,)`` float64 tensor, the conformers' dihedrals of ``quads``
            (radians, IUPAC sign).
        table: the :class:`~zmat.ConstructionTable` over the ``N`` atoms.
        internal: ``(N, 3)`` float64 tensor, the frozen internal coordinates.
        atoms, torsion_index: :class:`~zmat.batch.Ragged` offsets of atoms and torsions.
        arrays: every array (:class:`zmat._torsion_arrays.TorsionArrays`, numpy);
            ``positions``, ``delta``, ``rotation``, ``shift`` are tensors of
            theirs, ``dof``, ``owner``, ``bond_parent``, ``level`` the arrays.

    Example:
        >>> from rdkit import Chem
        >>> from rdkit.Chem import AllChem
        >>> mol = Chem.AddHs(Chem.MolFromSmiles("CCCCO"))
        >>> AllChem.EmbedMolecule(mol, randomSeed=0)
        0
        >>> ts = TorsionSpace.from_mol(mol)
        >>> ts.quads.shape, ts.to_xyz(ts.torsions + 0.5).shape
        (torch.Size([2, 4]), torch.Size([15, 3]))
    """

    def __init__(self, mols, table, arrays: TorsionArrays) -> None:
        """Use :meth:`from_mol`, :meth:`batch` or :meth:`take`.

        ``mols`` and ``table``: the Mols and the table, or functions making
        them (a batch's: on first use).
        """
        self.arrays = a = arrays
        self.atoms, self.torsion_index = Ragged(a.n_atoms), Ragged(a.n_torsions)
        self._mols, self._table = mols, table
        self.quads, self.torsions = torch.from_numpy(a.quads), torch.from_numpy(a.torsions)
        self.positions, self.internal = torch.from_numpy(a.positions), torch.from_numpy(a.internal)
        self.delta = torch.from_numpy(a.delta)
        self.rotation, self.shift = torch.from_numpy(a.rotation), torch.from_numpy(a.shift)
        self.dof, self.owner, self.bond_parent, self.level = a.dof, a.owner, a.bond_parent, a.level
        self._rigid: RigidTorsions | None = None  # the routes, made on first use
        self._placed: TableTorsions | None = None

    @property
    def table(self) -> ConstructionTable:
        """The :class:`~zmat.ConstructionTable` over the ``N`` atoms (a forest for a batch)."""
        if not isinstance(self._table, ConstructionTable):  # a batch's: made on first use
            self._table = self._table()
        return self._table

    @property
    def mols(self) -> list:
        """The RDKit Mols, one per molecule (copies holding the conformer used)."""
        if callable(self._mols):
            self._mols = self._mols()
        return self._mols

    def __getstate__(self) -> dict:
        """Pickled with its Mols, table and arrays, without its per-device plans."""
        return {"mols": self.mols, "table": self.table, "arrays": self.arrays}

    def __setstate__(self, state: dict) -> None:
        if "arrays" not in state:
            raise ValueError("this TorsionSpace was pickled by an older zmat: make it again with from_mol")
        self.__init__(state["mols"], state["table"], state["arrays"])

    def __repr__(self) -> str:
        n, k = len(self.positions), len(self.quads)
        return f"TorsionSpace(molecules={len(self.atoms.sizes)}, atoms={n}, torsions={k})"

    @classmethod
    def from_mol(cls, mol, conf_id: int = -1, rotatable=None) -> TorsionSpace:
        """The torsion space of conformer ``conf_id`` of ``mol``.

        Args:
            mol: an RDKit ``Chem.Mol`` with at least one conformer (hydrogens
                are kept as given).
            conf_id: the conformer (``-1``: the default one).
            rotatable: ``None`` (RDKit's strict pattern), a SMARTS, or ``(k, 2)``
                atom index pairs; see the module docstring.

        Raises:
            ValueError: no atoms, no conformer, dummy atoms, bonded atoms that
                coincide, a requested bond that is not in the Mol or is in a ring
                (rings closed by dative bonds, which RDKit's ring info leaves out,
                count).
            TypeError: ``mol`` is not a ``Chem.Mol``.
        """
        copy, table, arrays = _space_of(mol, conf_id, rotatable)
        return cls([copy], table, arrays)

    @classmethod
    def batch(cls, spaces: Sequence[TorsionSpace]) -> TorsionSpace:
        """Torsion spaces of different molecules as one (flat atoms and torsions).

        The arrays are :meth:`TorsionArrays.concatenate
        <zmat._torsion_arrays.TorsionArrays.concatenate>`d (each space packs its
        own once and keeps them, so a batch of a data set's spaces is a handful
        of concatenations whatever their number); the Mols and the table
        (:func:`zmat.batch.concatenate_tables`) are made on first use.
        """
        if len(spaces) == 0:
            raise ValueError("cannot batch an empty list of torsion spaces")
        spaces = list(spaces)
        return cls(
            lambda: [m for s in spaces for m in s.mols],
            lambda: concatenate_tables([s.table for s in spaces])[0],
            TorsionArrays.concatenate([s.arrays for s in spaces]),
        )

    def take(self, index) -> TorsionSpace:
        """Molecules ``index`` of this space (in that order; repeats allowed) as a new batch.

        For a data set held as one batch (``TorsionSpace.batch(spaces)``, built
        once): each training step's batch is then a few vectorised gathers
        (:meth:`TorsionArrays.take <zmat._torsion_arrays.TorsionArrays.take>`),
        its table (:meth:`zmat.ConstructionTable.take`, built on first use)
        included, with no loop over molecules.

        Args:
            index: ``(B,)`` integer array-like of molecule indices in ``[-M, M)``.

        Raises:
            ValueError: an empty or out-of-range ``index``.

        Example:
            >>> from rdkit import Chem
            >>> from rdkit.Chem import AllChem
            >>> mols = [Chem.AddHs(Chem.MolFromSmiles(s)) for s in ("CCCCO", "OCCN", "CCOCC")]
            >>> codes = [AllChem.EmbedMolecule(m, randomSeed=0) for m in mols]
            >>> data = TorsionSpace.batch([TorsionSpace.from_mol(m) for m in mols])
            >>> data.take([2, 0]).atoms.sizes.tolist()
            [15, 15]
        """
        m = len(self.atoms.sizes)
        idx = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index).reshape(-1)
        if idx.size == 0 or idx.dtype.kind not in "iu" or ((idx < -m) | (idx >= m)).any():
            raise ValueError(f"index must be a non-empty integer array in [-{m}, {m}), got {idx.tolist()}")
        idx = idx.astype(np.int64) % m
        parent_ptr, table = self.atoms.ptr, self._table
        return type(self)(
            lambda: [self.mols[i] for i in idx.tolist()],
            lambda: (table if isinstance(table, ConstructionTable) else self.table).take(parent_ptr, idx),
            self.arrays.take(idx),
        )

    # ---------------------------------------------------------- transforms
    @property
    def _rigid_body(self) -> RigidTorsions:
        """The ``"rigid"`` route (:mod:`zmat._rigid_torsions`), made on first use
        (a plain attribute: a cached_property's lock costs a fresh batch microseconds)."""
        if self._rigid is None:
            self._rigid = RigidTorsions(self.arrays)
        return self._rigid

    @property
    def _table_route(self) -> TableTorsions:
        """The ``"table"`` route (:mod:`zmat._table_torsions`), made on first use
        (given the table itself, not this space: no reference cycle, so a
        step's batch is freed as soon as it is dropped)."""
        if self._placed is None:
            self._placed = TableTorsions(self.arrays, self.table)
        return self._placed

    def place(self, internal: torch.Tensor) -> torch.Tensor:
        """Positions in the Mol frames of ``(..., N, 3)`` internal coordinates on :attr:`table`."""
        return self._table_route.place(internal)

    def to_xyz(self, torsions: torch.Tensor, method: str = "rigid") -> torch.Tensor:
        """Positions for given torsion values.

        Args:
            torsions: ``(..., K)`` float tensor, radians, flat over the batch's
                molecules (a padded ``(..., M, k_max)`` tensor converts with
                ``self.torsion_index.unpad(t, dim=-2)``).
            method: ``"rigid"`` (default): each rotatable bond's moving side is
                a rigid body; the rotations by ``torsions - self.torsions`` about
                the conformer's bond axes are composed from the root outwards
                (one vectorised step per nesting level of rotatable bonds) and
                applied to the conformer. ``"table"``: the frozen internal
                coordinates with the torsions scattered into their rows, one
                :func:`zmat.to_xyz` call on :attr:`table`. Same result to
                rounding.

        Returns:
            ``(..., N, 3)`` positions in the Mol's atom order and the conformer's
            frame; the dihedral of ``quads[k]`` equals ``torsions[..., k]`` (mod
            2 pi). Differentiable (first and second order).
        """
        if not isinstance(torsions, torch.Tensor) or not torsions.dtype.is_floating_point:
            raise TypeError(f"torsions must be a float tensor, got {type(torsions).__name__}")
        k = len(self.dof)
        if torsions.ndim < 1 or torsions.shape[-1] != k:
            raise ValueError(f"torsions must have shape (..., {k}), got {tuple(torsions.shape)}")
        if method == "rigid":
            return self._rigid_body(torsions)
        if method != "table":
            raise ValueError(f"unknown method {method!r}; choose 'rigid' or 'table'")
        return self._table_route(torsions)

    def from_xyz(self, xyz: torch.Tensor) -> torch.Tensor:
        """``(..., N, 3)`` positions -> ``(..., K)`` torsions (dihedrals of ``quads``)."""
        n = len(self.positions)
        if xyz.ndim < 2 or xyz.shape[-2:] != (n, 3):
            raise ValueError(f"xyz must have shape (..., {n}, 3), got {tuple(xyz.shape)}")
        return dihedrals(xyz, self.quads.to(xyz.device))

    def to_mols(self, xyz: torch.Tensor) -> list:
        """Copies of the Mols with the given positions as their conformers.

        Args:
            xyz: ``(N, 3)`` or ``(C, N, 3)`` flat positions (``C`` conformers each).

        Returns:
            one ``Chem.Mol`` per molecule, with ``C`` conformers (ids ``0..C-1``),
            ready for ``Chem.SDWriter``.
        """
        x = xyz.detach().to("cpu", torch.float64)
        x = x[None] if x.ndim == 2 else x
        if x.ndim != 3 or x.shape[-2:] != (len(self.positions), 3):
            raise ValueError(f"xyz must have shape (C, {len(self.positions)}, 3), got {tuple(xyz.shape)}")
        parts = self.atoms.unbatch(x, dim=1)
        return [_with_conformers(mol, part.numpy()) for mol, part in zip(self.mols, parts, strict=True)]
