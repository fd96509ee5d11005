"""Tests of zmat._neighbors: the cell list behind the clash loss's neighbour search."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zmat._neighbors import build_cell_list, cell_list_pairs


def brute_pairs(pos, group, cutoff, valid):
    """Unordered pairs of valid points of one group closer than ``cutoff`` (itertools)."""
    out = set()
    for a, b in itertools.combinations(range(len(pos)), 2):
        if valid[a] and valid[b] and group[a] == group[b] and float((pos[a] - pos[b]).norm()) < cutoff:
            out.add((a, b))
    return out


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(0, 80),
    side=st.floats(0.1, 30.0),
    cutoff=st.floats(0.5, 6.0),
    n_groups=st.integers(1, 3),
    max_rows=st.one_of(st.none(), st.integers(1, 200)),
    seed=st.integers(0, 2**16),
)
def test_pairs_are_a_superset_without_duplicates(m, side, cutoff, n_groups, max_rows, seed):
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(m, 3, generator=g, dtype=torch.float64) * side
    group = torch.randint(0, n_groups, (m,), generator=g)
    valid = torch.rand(m, generator=g) > 0.2
    if m:
        pos[0, 1] = float("nan")  # non-finite points never pair
    i, j = cell_list_pairs(pos, group, cutoff, valid, max_rows=max_rows)
    found = [(min(a, b), max(a, b)) for a, b in zip(i.tolist(), j.tolist(), strict=True)]
    assert len(found) == len(set(found))  # each unordered pair once
    assert all(a != b for a, b in found)
    assert all(valid[a] and valid[b] and group[a] == group[b] and a != 0 for a, b in found)
    ok = valid & torch.isfinite(pos).all(-1)
    assert brute_pairs(pos, group, cutoff, ok) <= set(found)


def test_one_crowded_cell_gives_each_pair_once():
    pos = torch.rand(50, 3, dtype=torch.float64) * 0.1
    i, j = cell_list_pairs(pos, torch.zeros(50, dtype=torch.long), 2.0)
    assert len(i) == 50 * 49 // 2  # not twice that: no duplicate rows to filter
    assert len({(min(a, b), max(a, b)) for a, b in zip(i.tolist(), j.tolist(), strict=True)}) == len(i)


def test_chunks_cover_every_row_once():
    g = torch.Generator().manual_seed(28)
    pos = torch.rand(300, 3, generator=g, dtype=torch.float64) * 14
    cells = build_cell_list(pos, torch.zeros(300, dtype=torch.long), 3.0)
    total = int(cells.count.sum())
    for max_rows in (1, 7, 100, total, 10 * total):
        chunks = cells.chunks(max_rows)
        covered = torch.zeros(cells.count.numel(), dtype=torch.long)
        for lo, hi, _ in chunks:
            covered[lo:hi] += 1
        assert covered.max() == 1 and (cells.count[covered == 0] == 0).all()  # each slot once
        assert [int(cells.count[lo:hi].sum()) for lo, hi, _ in chunks] == [r for _, _, r in chunks]
        largest = int(cells.count.max())
        assert all(r <= max_rows + largest for _, _, r in chunks)  # the memory bound


@pytest.mark.parametrize("cutoff", [0.0, -1.0])
def test_non_positive_cutoff_and_no_valid_point(cutoff):
    pos = torch.zeros(4, 3)
    i, _ = cell_list_pairs(pos, torch.zeros(4, dtype=torch.long), cutoff)
    assert len(i) == 6  # coincident points: still candidates (the caller filters)
    none = torch.zeros(4, dtype=torch.bool)
    i, _ = cell_list_pairs(pos, torch.zeros(4, dtype=torch.long), 2.0, none)
    assert len(i) == 0
