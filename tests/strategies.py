"""Hypothesis strategies: random valid construction tables and internal coordinates."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st


@st.composite
def tables(draw, min_atoms=1, max_atoms=12, forest=True, proper_bias=0.5, permute=True, plane_bias=0.3):
    """A random valid table (list of rows): chains, branches, offsets, forests,
    arbitrary references, rows permuted out of construction order. With
    probability ``plane_bias`` a non-proper full row takes as dihedral
    reference a sibling (references ``(b, a, ...)``) or a cousin (``(a, b, ...)``)
    where there is one: the rows whose anchor plane comes from ``d``'s frame."""
    n = draw(st.integers(min_atoms, max_atoms))
    rows: list[list[int]] = []
    tree: list[int] = []  # tree id of each constructed atom
    for k in range(n):
        members = [j for j in range(k) if tree and tree[j] == tree[-1]] if k else []
        new_root = k == 0 or (forest and draw(st.floats(0, 1)) < 0.12)
        if new_root:
            rows.append([-1, -1, -1])
            tree.append(k)
            continue
        # references from the current tree only (a forest stays a forest)
        b = draw(st.sampled_from(members))
        nref = min(len(members), 3)
        row = [b, -1, -1]
        if nref >= 2:
            rb = rows[b]
            choice = draw(st.floats(0, 1))
            if choice < proper_bias and rb[0] >= 0 and (nref < 3 or rb[1] >= 0):
                a = rb[0]
                d = rb[1] if nref >= 3 else -1
                if nref >= 3 and draw(st.booleans()):
                    # a sibling already anchored on b with the same angle reference: offset row
                    sibs = [j for j in range(k) if rows[j][0] == b and rows[j][1] == a]
                    if sibs:
                        d = draw(st.sampled_from(sibs))
                row = [b, a, d]
            else:
                others = [j for j in members if j != b]
                a = draw(st.sampled_from(others))
                row = [b, a, -1]
                if nref >= 3:
                    d = draw(st.sampled_from([j for j in others if j != a]))
                    kin = [j for j in range(k) if rows[j][:2] in ([b, a], [a, b])]
                    if kin and draw(st.floats(0, 1)) < plane_bias:
                        d = draw(st.sampled_from(kin))
                    row = [b, a, d]
        rows.append(row)
        tree.append(tree[-1])
    if not permute:
        return rows
    perm = draw(st.permutations(list(range(n))))  # construction index -> output row
    out = [None] * n
    for k, row in enumerate(rows):
        out[perm[k]] = [perm[r] if r >= 0 else -1 for r in row]
    return out


@st.composite
def internal_coordinates(draw, n, batch=(), linear=False, margin=0.15):
    """``(*batch, n, 3)`` float64 internal coordinates.

    With ``linear=True`` some angles are exactly 0 or pi, or within 1e-7 of
    them; otherwise angles stay ``margin`` away from 0 and pi.
    """
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    shape = (*batch, n)
    r = rng.uniform(0.8, 2.0, shape)
    theta = rng.uniform(margin, math.pi - margin, shape)
    if linear:
        special = np.array([0.0, math.pi, 1e-7, math.pi - 1e-7])
        pick = rng.random(shape) < 0.3
        theta = np.where(pick, rng.choice(special, shape), theta)
    phi = rng.uniform(-math.pi, math.pi, shape)
    return torch.tensor(np.stack([r, theta, phi], -1), dtype=torch.float64)


@st.composite
def straight_angles(draw, rows, batch=()):
    """``(*batch, n, 3)`` float64 internal coordinates with bond angles exactly
    0 or pi: on ~30% of the rows (every row kind), and on ~80% of the atoms
    that are another row's sibling or cousin dihedral reference (which then
    lies exactly on that row's axis). Other angles stay 0.15 from 0 and pi."""
    n = len(rows)
    c = draw(internal_coordinates(n, batch=batch)).numpy()
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    pick = rng.random((*batch, n)) < 0.3
    for b, a, d in rows:
        if d >= 0 and rows[d][:2] in ([b, a], [a, b]):
            pick[..., d] |= rng.random(batch) < 0.8
    special = rng.choice(np.array([0.0, math.pi]), (*batch, n))
    c[..., 1] = np.where(pick, special, c[..., 1])
    return torch.tensor(c)


def chain_table(n: int) -> list[list[int]]:
    """A linear chain: every row proper."""
    rows = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]]
    return (rows + [[i - 1, i - 2, i - 3] for i in range(3, n)])[:n]


def random_internal(n: int, batch=(), seed=0, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.rand(*batch, n, 3, generator=g, dtype=torch.float64)
    c = c * torch.tensor([1.0, 2.6, 2 * math.pi], dtype=torch.float64) + torch.tensor(
        [1.0, 0.25, -math.pi], dtype=torch.float64
    )
    return c.to(dtype)


def embedded_mols(smiles: dict, seed: int) -> dict:
    """``{name: Mol}``: each SMILES with hydrogens and one ETKDGv3 conformer (RDKit)."""
    from rdkit import Chem
    from rdkit.Chem import AllChem

    out = {}
    for name, s in smiles.items():
        mol = Chem.AddHs(Chem.MolFromSmiles(s))
        params = AllChem.ETKDGv3()
        params.randomSeed = seed
        assert AllChem.EmbedMolecule(mol, params) == 0, name
        out[name] = mol
    return out
