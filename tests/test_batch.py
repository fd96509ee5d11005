"""Ragged batches: flat rows with ptr/batch offsets, padded views, forests of tables."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import random_internal, tables

import zmat
from zmat.batch import Ragged, ZMatrixBatch, collate, concatenate_tables


def test_ragged_offsets_pad_unpad_unbatch():
    r = Ragged([3, 0, 2])
    assert r.ptr.tolist() == [0, 3, 3, 5] and r.index.tolist() == [0, 0, 0, 2, 2]
    assert r.batch().dtype == torch.long and r.total == 5 and r.n_max == 3
    x = torch.arange(10.0).reshape(5, 2).requires_grad_(True)
    padded, mask = r.pad(x, fill=-1.0)
    assert padded.shape == (3, 3, 2) and mask.tolist() == [[1, 1, 1], [0, 0, 0], [1, 1, 0]]
    assert (padded[~mask] == -1).all() and torch.equal(padded[mask], x)
    assert torch.equal(r.unpad(padded), x)
    padded.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    parts = r.unbatch(x.detach())
    assert [p.shape[0] for p in parts] == [3, 0, 2]
    # leading batch dimensions: pad along dim=-2
    y = torch.randn(4, 5, 3)
    p, _ = r.pad(y, dim=-2)
    assert p.shape == (4, 3, 3, 3) and torch.equal(r.unpad(p, dim=-3), y)


def test_ragged_bad_shapes():
    r = Ragged([2, 2])
    with pytest.raises(ValueError, match="4 rows along dim 0, got shape \\(5,\\)"):
        r.pad(torch.zeros(5))
    with pytest.raises(ValueError, match="padded tensor must have \\(2, 2\\)"):
        r.unpad(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="non-negative"):
        Ragged([2, -1])
    with pytest.raises(ValueError, match="empty"):
        concatenate_tables([])


@given(st.lists(tables(max_atoms=8), min_size=1, max_size=4), st.integers(0, 2**16))
def test_forest_of_tables_places_each_structure_as_alone(refs_list, seed):
    table, atoms = concatenate_tables(refs_list)
    assert table.n_atoms == atoms.total == sum(len(r) for r in refs_list)
    internals = [random_internal(len(r), seed=seed + k) for k, r in enumerate(refs_list)]
    x = zmat.to_xyz(torch.cat(internals), table)
    for r, c, part in zip(refs_list, internals, atoms.unbatch(x), strict=True):
        assert (part - zmat.to_xyz(c, r)).abs().max() < 1e-10


def test_zmatrix_batch_and_collate():
    water = zmat.ZMatrix.from_string("O\nH 1 0.96\nH 1 0.96 2 104.5")
    chain = zmat.ZMatrix(
        ["C"] * 5, random_internal(5), [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1]]
    )
    zb = collate([water, chain, water])
    assert isinstance(zb, ZMatrixBatch) and len(zb) == 3 and len(zb.symbols) == 11
    parts = zb.unbatch(zb.to_xyz())
    for z, p in zip([water, chain, water], parts, strict=True):
        assert torch.allclose(p, z.to_xyz(), atol=1e-12)
    t, atoms = collate([water.table, chain.table])
    expected = np.where(chain.table.refs >= 0, chain.table.refs + 3, -1)
    assert np.array_equal(t.refs[3:], expected) and atoms.ptr.tolist() == [0, 3, 8]
    with pytest.raises(ValueError, match="empty"):
        collate([])
    with pytest.raises(TypeError, match=r"cannot batch ZMatrix objects with \['ConstructionTable'\]"):
        collate([water, chain.table])


def test_collate_dispatches_on_the_batchable_protocol():
    """Any type with a ``batch`` classmethod batches itself (no sniffing for ``quads``)."""

    class Frames:
        def __init__(self, n):
            self.n = n

        @classmethod
        def batch(cls, items):
            return ("frames", sum(x.n for x in items))

    assert isinstance(Frames(1), zmat.batch.Batchable) and isinstance(
        zmat.ZMatrix.from_string("O"), zmat.batch.Batchable
    )
    assert collate([Frames(2), Frames(3)]) == ("frames", 5)


def test_zmat_imports_without_rdkit():
    """``import zmat`` works without RDKit; ``import zmat.rdkit`` names the extra to install."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['rdkit'] = None\n"
        "import zmat\n"
        "try:\n    import zmat.rdkit\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'zmat[rdkit]'" in out


_PLANNED = ("refs", "kind", "parent", "offset_of", "offset_chain", "dfs_order", "dfs_pos", "subtree_end")
_PLANNED += ("dfs_parent", "dfs_depth", "dfs_segment", "max_depth", "constant_anchors")


def assert_planned_as_validated(fast: zmat.ConstructionTable) -> None:
    ref = zmat.ConstructionTable(fast.refs)
    for name in _PLANNED:
        assert np.array_equal(getattr(fast, name), getattr(ref, name)), name
    assert [a.tolist() for a in fast.stage_atoms] == [a.tolist() for a in ref.stage_atoms]


# a methyl group: three hydrogens as offsets of each other (offset chain of width 3)
METHYL = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [1, 0, 2], [1, 0, 3], [1, 0, 4]]


@given(st.lists(tables(max_atoms=8), min_size=1, max_size=5), st.data())
def test_trusted_batches_plan_what_validation_plans(refs_list, data):
    """concatenate_tables (packed pieces, no re-validation) and taking components
    of its result (``ConstructionTable.take``, any order and repeats) give the
    arrays that validating the offset references from scratch gives, with
    pieces of different offset-chain widths."""
    refs_list = [*refs_list, METHYL]
    table, atoms = concatenate_tables(refs_list)
    assert_planned_as_validated(table)
    index = np.array(data.draw(st.lists(st.integers(0, len(refs_list) - 1), min_size=1, max_size=6)))
    taken = table.take(atoms.ptr, index)
    assert_planned_as_validated(taken)
    expected, _ = concatenate_tables([refs_list[i] for i in index])
    assert np.array_equal(taken.refs, expected.refs)
    sub, rows = atoms.take(index)
    assert sub.sizes.tolist() == [len(refs_list[i]) for i in index] and len(rows) == sub.total
