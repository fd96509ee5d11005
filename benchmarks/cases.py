"""The problems every implementation is timed on.

A :class:`Problem` is a construction table and a batch of internal
coordinates ``C`` (float64, CPU; the runner converts dtype and device):

* ``chain``: a linear chain of ``size`` atoms, rows ``(i-1, i-2, i-3)``,
  bond lengths 1.4-1.6 A, angles 103-120 degrees, random dihedrals. Depth =
  ``size``: the worst case for sequential methods.
* ``molecules``: one random branched molecule of ``size`` atoms (a tree of
  valence <= 4, proper, sibling-dihedral and positional rows mixed, like a
  table chosen automatically for a real molecule) and ``batch`` conformers of
  it (dihedrals perturbed).
* ``protein``: a full-atom protein (heavy atoms) read with
  ``zmat.protein.from_pdb`` from ``tests/data/*.pdb``; ``size`` is the number
  of residues. When no file has about that many residues, the largest smaller
  one is tiled into a single chain (copies shifted in space, joined by peptide
  bonds) and its internal coordinates measured with ``zmat.to_internal``;
  below every file's length, the first residues of the smallest. The
  batch holds conformers: the file's, then dihedrals perturbed by 0.1 rad.
* ``protein-mix``: ``batch`` *different* sequences of about ``size`` residues
  in one structure (a forest table, the way zmat batches different
  molecules): rotations of the tiled chain of ``protein``.

Everything is seeded; a problem is built once per worker process.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import zmat

__all__ = ["CASES", "Problem", "Unavailable", "chain_table", "make", "molecule_table"]

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
#: case -> unit of ``size``
CASES = {"chain": "atoms", "molecules": "atoms", "protein": "residues", "protein-mix": "residues"}


class Unavailable(RuntimeError):
    """A case that cannot be built here (e.g. ``zmat.protein`` missing)."""


@dataclass
class Problem:
    case: str
    size: int
    batch: int
    atoms: int  # per structure (protein-mix: mean over the sequences)
    refs: np.ndarray  # (N_total, 3) raw table, for first-call timing
    table: zmat.ConstructionTable
    C: torch.Tensor  # (B, N_total, 3) float64; protein-mix: (1, N_total, 3)
    sequences: list[str] = field(default_factory=list)  # one per structure (proteins)
    residues: int = 0  # per structure, actual
    note: str = ""
    atom_names: np.ndarray | None = None  # (atoms,) of one structure, in the table's order (proteins)


# ------------------------------------------------------------------ chains
def chain_table(n: int) -> np.ndarray:
    """``(n, 3)`` table of a linear chain: row ``i`` is ``(i-1, i-2, i-3)``, -1 below 0."""
    i = np.arange(n)[:, None]
    refs = i - np.arange(1, 4)[None, :]
    return np.where(refs >= 0, refs, -1).astype(np.int64)


def _random_internal(rng, batch: int, n: int) -> torch.Tensor:
    r = rng.uniform(1.4, 1.6, (batch, n))
    theta = rng.uniform(1.8, 2.1, (batch, n))
    phi = rng.uniform(-math.pi, math.pi, (batch, n))
    return torch.from_numpy(np.stack([r, theta, phi], -1))


def chain(n: int, batch: int, seed: int = 0) -> Problem:
    refs = chain_table(n)
    C = _random_internal(np.random.default_rng(seed), batch, n)
    return Problem("chain", n, batch, n, refs, zmat.ConstructionTable(refs), C, note="linear chain")


# --------------------------------------------------------------- molecules
def molecule_table(n: int, rng) -> np.ndarray:
    """A random molecule-like table: a tree of valence <= 4, rows in construction order."""
    parent = np.full(n, -1)
    degree = np.zeros(n, int)
    nbrs: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        free = [j for j in range(i) if degree[j] < 4]
        p = int(rng.choice(free))
        parent[i] = p
        degree[[i, p]] += 1
        nbrs[i].append(p)
        nbrs[p].append(i)
    refs = np.full((n, 3), -1, np.int64)
    for i in range(1, n):
        b = int(parent[i])
        refs[i, 0] = b
        if i == 1:
            continue
        a = int(parent[b]) if b > 0 else next(j for j in nbrs[0] if j < i)
        refs[i, 1] = a
        if i == 2:
            continue
        d = int(parent[a]) if a > 0 and parent[a] != b else -1
        if d < 0:  # no proper dihedral reference: a sibling, else any placed atom
            near = [j for j in nbrs[a] + nbrs[b] if j < i and j not in (a, b)]
            d = near[0] if near else next(j for j in range(i) if j not in (a, b))
        refs[i, 2] = d
    return refs


def molecules(n: int, batch: int, seed: int = 0) -> Problem:
    rng = np.random.default_rng(seed)
    refs = molecule_table(n, rng)
    base = _random_internal(rng, 1, n)
    base[..., 0] = torch.from_numpy(rng.uniform(1.0, 1.6, (1, n)))
    C = base.repeat(batch, 1, 1)
    C[..., 2] += torch.from_numpy(rng.normal(0.0, 0.3, (batch, n)))
    return Problem(
        "molecules", n, batch, n, refs, zmat.ConstructionTable(refs), C, note=f"{batch} conformers"
    )


# ---------------------------------------------------------------- proteins
@functools.cache
def _pdb_lengths() -> dict[str, int]:
    """Residues with a CA in the first model of each ``tests/data/*.pdb`` (a cheap text scan)."""
    out = {}
    for path in sorted(DATA.glob("*.pdb")):
        n = 0
        with open(path) as f:
            for line in f:
                if line.startswith("ENDMDL"):
                    break
                if line.startswith("ATOM") and line[12:16] == " CA " and line[16] in " A":
                    n += 1
        if n:
            out[path.stem] = n
    if not out:
        raise Unavailable(f"no protein PDB file in {DATA}")
    return out


@functools.cache
def _pdb_protein(name: str):
    try:
        from zmat.protein.structure import from_pdb
    except ImportError as e:
        raise Unavailable(f"zmat.protein is not importable ({e})") from None
    return from_pdb(DATA / f"{name}.pdb")


def _tiled(p, n_res: int, start: int = 0):
    """Residues ``start, start+1, ...`` of ``p`` cyclically, ``n_res`` of them, as one chain.

    Returns ``(table, xyz, sequence, atom names)``. Chain breaks of the file are kept; each
    wrap-around shifts the copy by its extent + 10 A along x and joins it with
    a (long) peptide bond, which only changes values, not the work.
    """
    from zmat.protein.layout import layout_of

    L = len(p)
    ri = p.layout.residue_index
    names = p.atom_names
    per_res = [np.nonzero(ri == k)[0] for k in range(L)]
    shift = float(p.xyz[:, 0].max() - p.xyz[:, 0].min()) + 10.0
    order = [(start + k) % L for k in range(n_res)]
    copy = [(start + k) // L for k in range(n_res)]
    present = []
    for j, k in enumerate(order):
        atoms = [str(a) for a in names[per_res[k]] if a != "OXT" or j == n_res - 1]
        present.append(atoms)
    bonded = [bool(p.layout.bonded[k]) or (j > 0 and k == 0) for j, k in enumerate(order)]
    lay = layout_of([str(p.res_names[k]) for k in order], present=present, bonded=bonded)
    pos = {}  # (residue in the tiled chain, atom name) -> coordinates
    xyz = p.xyz.numpy()
    for j, k in enumerate(order):
        for i in per_res[k]:
            pos[j, str(names[i])] = xyz[i] + np.array([shift * copy[j], 0.0, 0.0])
    out = np.zeros((lay.n_atoms, 3))
    for a in range(lay.n_atoms):
        key = (int(lay.residue_index[a]), str(lay.atom_names[a]))
        # an OXT added at the end of a tile that had none in the file: next to O
        out[a] = pos.get(key, pos.get((key[0], "O"), np.zeros(3)) + 1.2)
    seq = "".join(p.sequence[k] for k in order)
    return lay.refs, torch.from_numpy(out), seq, lay.atom_names


def _source(n_res: int):
    """``(name, protein, how)``: a whole file of about ``n_res`` residues (``"file"``), else
    the first residues of the shortest longer one (``"cut"``), else the longest tiled (``"tile"``)."""
    lengths = _pdb_lengths()
    name = min(lengths, key=lambda k: abs(math.log(lengths[k] / n_res)))
    how = "file"
    if not 0.8 <= lengths[name] / n_res <= 1.25:
        longer = [k for k in lengths if lengths[k] > n_res]
        if longer:
            name, how = min(longer, key=lengths.get), "cut"
        else:
            name, how = max(lengths, key=lengths.get), "tile"
    return name, _pdb_protein(name), how


def _conformers(C: torch.Tensor, batch: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    C = C.unsqueeze(0).repeat(batch, 1, 1)
    C[1:, :, 2] += torch.from_numpy(rng.normal(0.0, 0.1, C[1:].shape[:-1]))  # conformer 0: the file's
    return C


def protein(n_res: int, batch: int, seed: int = 0) -> Problem:
    name, p, how = _source(n_res)
    if how == "file":
        refs, C, seq, names = p.table.refs, p.internal, p.sequence, p.atom_names
        note = f"{name}.pdb ({len(p)} res)"
    else:
        k = max(1, round(n_res / len(p)))
        n = n_res if how == "cut" else k * len(p)
        refs, xyz, seq, names = _tiled(p, n)
        C = zmat.to_internal(xyz, refs)
        note = f"{name}.pdb, first {n} res" if how == "cut" else f"{name}.pdb ({len(p)} res) tiled x{k}"
    table = zmat.ConstructionTable(refs)
    return Problem(
        "protein",
        n_res,
        batch,
        table.n_atoms,
        refs,
        table,
        _conformers(C, batch, seed),
        sequences=[seq] * batch,
        residues=len(seq),
        note=note,
        atom_names=np.asarray(names),
    )


def protein_mix(n_res: int, batch: int, seed: int = 0) -> Problem:
    name, p, _ = _source(n_res)
    L = len(p)
    rng = np.random.default_rng(seed)
    starts = rng.choice(L, size=batch, replace=batch > L)
    refs_all, xyz_all, seqs, offset = [], [], [], 0
    for s in starts:
        refs, xyz, seq, _ = _tiled(p, n_res, int(s))
        refs_all.append(np.where(refs >= 0, refs + offset, -1))
        xyz_all.append(xyz)
        seqs.append(seq)
        offset += len(refs)
    refs = np.concatenate(refs_all)
    table = zmat.ConstructionTable(refs)
    C = zmat.to_internal(torch.cat(xyz_all), table).unsqueeze(0)
    return Problem(
        "protein-mix",
        n_res,
        batch,
        table.n_atoms // batch,
        refs,
        table,
        C,
        sequences=seqs,
        residues=n_res,
        note=f"{batch} different sequences from {name}.pdb, one forest table",
    )


_MAKERS = {"chain": chain, "molecules": molecules, "protein": protein, "protein-mix": protein_mix}


@functools.lru_cache(maxsize=4)
def make(case: str, size: int, batch: int) -> Problem:
    """The problem ``case`` at ``size`` (atoms or residues) with ``batch`` structures.

    Raises:
        ValueError: unknown case.
        Unavailable: the case needs something this environment lacks.
    """
    if case not in _MAKERS:
        raise ValueError(f"unknown case {case!r}; choose from {sorted(_MAKERS)}")
    return _MAKERS[case](size, batch)
