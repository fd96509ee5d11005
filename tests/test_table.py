"""ConstructionTable: validation messages and the plan."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import chain_table, tables

import zmat
from zmat.table import OFFSET, PLANAR, POSITIONAL, PROPER, ConstructionTable


@pytest.mark.parametrize(
    "refs, match",
    [
        ([[-1, -1, -1], [5, -1, -1]], r"row 1: bond reference 5 is out of range for a table of 2 atoms"),
        ([[-1, -1, -1], [0, -2, -1], [0, -1, -1]], r"row 1: angle reference -2 is out of range"),
        ([[-1, -1, -1], [1, -1, -1]], r"row 1: atom 1 refers to itself"),
        ([[-1, -1, -1], [0, -1, -1], [1, 1, -1]], r"row 2: repeated reference in \(1, 1, -1\)"),
        ([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 0, 2]], r"row 3: repeated reference"),
        ([[-1, -1, -1], [0, -1, -1], [1, -1, 0]], r"row 2: dihedral reference 0 is given but the angle"),
        ([[-1, 0, -1], [0, -1, -1]], r"row 0: angle reference 0 is given but the bond reference is missing"),
        ([[1, -1, -1], [2, -1, -1], [0, -1, -1]], r"cycle through atoms 0 -> 1 -> 2 -> 0"),
        ([[1, -1, -1], [0, -1, -1]], r"cycle through atoms 0 -> 1 -> 0"),
        ([[-1, -1, -1], [2, -1, -1], [3, -1, -1], [1, -1, -1]], r"cycle through atoms 1 -> 2 -> 3 -> 1"),
        ([[-1, -1], [0, -1]], r"shape \(N, 3\).*got shape \(2, 2\)"),
        ([-1, -1, -1], r"shape \(N, 3\).*got shape \(3,\)"),
        ([], r"empty"),
    ],
)
def test_bad_tables_raise_with_row(refs, match):
    with pytest.raises(ValueError, match=match):
        zmat.ConstructionTable(refs)


def test_chemcoord_sentinel_gets_a_hint():
    sentinel = -9223372036854775807
    with pytest.raises(ValueError, match="chemcoord"):
        zmat.ConstructionTable([[sentinel, sentinel, sentinel], [0, sentinel, sentinel]])


@pytest.mark.parametrize("bad", [np.zeros((3, 3)), torch.zeros(3, 3), np.ones((2, 3), bool)])
def test_non_integer_dtype_is_a_type_error(bad):
    with pytest.raises(TypeError, match="integer"):
        zmat.ConstructionTable(bad)


def test_accepts_lists_arrays_tensors_and_tables():
    rows = chain_table(6)
    ref = zmat.ConstructionTable(rows)
    for refs in (rows, np.array(rows), np.array(rows, np.int32), torch.tensor(rows), ref):
        t = zmat.ConstructionTable(refs)
        assert t == ref and t.refs.dtype == np.int64


def test_bad_table_error_is_raised_by_to_xyz_too():
    with pytest.raises(ValueError, match="row 1"):
        zmat.to_xyz(torch.zeros(2, 3), [[-1, -1, -1], [1, -1, -1]])


def test_chain_is_all_proper_and_one_segment():
    t = zmat.ConstructionTable(chain_table(50))
    assert (t.kind[3:] == PROPER).all()
    assert t.constant_anchors and len(t.stage_atoms) == 1
    assert t.n_levels == 50 and t.max_depth == 49


def test_row_kinds():
    rows = [
        [-1, -1, -1],  # 0 root
        [0, -1, -1],  # 1 bond on root: rigid
        [1, 0, -1],  # 2 planar on a bond atom: rigid
        [2, 1, 0],  # 3 proper
        [2, 1, 3],  # 4 offset (sibling 3)
        [2, 1, 4],  # 5 offset of an offset
        [3, 0, 5],  # 6 positional
        [6, 3, -1],  # 7 planar, not rigid (6 is not a bond-only atom)
    ]
    t = zmat.ConstructionTable(rows)
    assert t.kind[3] == PROPER and t.kind[4] == OFFSET and t.kind[5] == OFFSET
    assert t.kind[6] == POSITIONAL and t.kind[7] == PLANAR
    assert list(t.parent) == [-1, 0, 1, 2, 2, 2, -1, -1]
    assert list(t.offset_chain[5][:3]) == [5, 4, 3]
    assert "positional=1" in repr(t)


def test_rows_may_point_forward():
    # atom 0 is built last, from atoms defined in later rows
    rows = [[1, 2, 3], [-1, -1, -1], [1, -1, -1], [2, 1, -1]]
    t = zmat.ConstructionTable(rows)
    assert list(t.construction_order)[-1] == 0


@given(tables(max_atoms=15))
def test_plan_is_consistent(rows):
    t = zmat.ConstructionTable(rows)
    n = t.n_atoms
    # topological order: every reference comes first
    seen = set()
    for i in t.construction_order:
        assert all(r in seen for r in t.refs[i] if r >= 0)
        seen.add(i)
    # dfs preorder: subtrees are contiguous, parents precede children
    assert sorted(t.dfs_order) == list(range(n))
    for p in range(n):
        q = t.dfs_parent[p]
        if q >= 0:
            assert q < p <= t.subtree_end[q] - 1
    # every atom belongs to exactly one stage
    assert sorted(np.concatenate(t.stage_atoms)) == list(range(n))


_PLANNED = ("refs", "kind", "parent", "offset_of", "offset_chain", "dfs_order", "dfs_pos", "subtree_end")
_PLANNED += ("dfs_parent", "dfs_depth", "dfs_segment")


@settings(max_examples=25)
@given(pieces=st.lists(tables(min_atoms=1, max_atoms=9), min_size=1, max_size=5))
def test_concatenate_equals_validating_the_offset_refs(pieces):
    """The fast path (offsetting validated pieces) plans exactly what
    validating and planning the concatenated array does."""
    sizes = np.array([len(p) for p in pieces])
    offsets = np.cumsum(sizes) - sizes
    flat = np.concatenate(
        [np.where(np.array(p) >= 0, np.array(p) + o, -1) for p, o in zip(pieces, offsets, strict=True)]
    )
    ref = ConstructionTable(flat)
    fast = ConstructionTable.concatenate([ConstructionTable(p) for p in pieces[:-1]] + [pieces[-1]])
    for name in _PLANNED:
        assert np.array_equal(getattr(fast, name), getattr(ref, name)), name
    assert fast.max_depth == ref.max_depth and fast.constant_anchors == ref.constant_anchors
    assert [a.tolist() for a in fast.stage_atoms] == [a.tolist() for a in ref.stage_atoms]
    assert fast == ref and fast.n_levels == ref.n_levels


@settings(max_examples=25)
@given(
    pieces=st.lists(tables(min_atoms=1, max_atoms=9), min_size=1, max_size=4),
    index=st.lists(st.integers(0, 3), min_size=1, max_size=12),
)
def test_concatenate_with_index_equals_the_list(pieces, index):
    index = [k % len(pieces) for k in index]
    tables = [ConstructionTable(p) for p in pieces]
    by_list = ConstructionTable.concatenate([tables[k] for k in index])
    by_index = ConstructionTable.concatenate(tables, index=np.array(index))
    for name in _PLANNED:
        assert np.array_equal(getattr(by_index, name), getattr(by_list, name)), name
    assert [a.tolist() for a in by_index.stage_atoms] == [a.tolist() for a in by_list.stage_atoms]


def test_concatenate_index_is_checked():
    water = ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
    with pytest.raises(ValueError, match="index out of range for 1 tables"):
        ConstructionTable.concatenate([water], index=[0, 1])
    with pytest.raises(ValueError, match="1-D integer array"):
        ConstructionTable.concatenate([water], index=[[0]])


def test_concatenate_validates_raw_pieces_and_rejects_empty_input():
    with pytest.raises(ValueError, match="non-empty sequence"):
        ConstructionTable.concatenate([])
    with pytest.raises(ValueError, match="row 1: atom 1 refers to itself"):
        ConstructionTable.concatenate([[[-1, -1, -1]], [[-1, -1, -1], [1, -1, -1]]])


def test_a_table_from_its_plan_is_the_planned_table():
    from zmat.table import TablePlan

    t = ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]])
    for plan in (TablePlan.of(t), lambda: TablePlan.of(t)):  # given, or made on first use
        copy = ConstructionTable.from_plan(plan, t.n_atoms)
        assert copy == t and copy.n_atoms == 4 and copy.n_levels == t.n_levels
        for name in ConstructionTable._ARRAYS:
            a, b = getattr(copy, name), getattr(t, name)
            assert (
                [list(x) for x in a] == [list(x) for x in b]
                if name == "stage_atoms"
                else np.array_equal(a, b)
            )
        x = zmat.to_xyz(torch.rand(4, 3, dtype=torch.float64) + 0.5, copy)
        assert torch.isfinite(x).all()
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr(ConstructionTable.from_plan(lambda: TablePlan.of(t), 4), "nope")  # noqa: B009


def test_a_planned_table_is_freed_without_the_cycle_collector():
    """No table -> plan -> table cycle: a fresh batch's table and plans are
    freed (their memory reused) as soon as the caller drops them."""
    import gc
    import weakref

    gc.disable()
    try:
        t = ConstructionTable(chain_table(40))
        C = (torch.rand(40, 3, dtype=torch.float64) + 0.5).requires_grad_(True)
        zmat.to_xyz(C, t).sum().backward()
        zmat.to_xyz(C.expand(3, 40, 3), t).sum().backward()  # the batched plans too
        ref = weakref.ref(t)
        del t
        assert ref() is None
    finally:
        gc.enable()


def test_pickle_drops_device_plans():
    import pickle

    table = ConstructionTable(chain_table(6))
    c = torch.rand(6, 3, dtype=torch.float64) + 0.5
    want = zmat.to_xyz(c, table)  # plans the table for the CPU
    assert any(k.startswith("_plans ") for k in vars(table))
    copy = pickle.loads(pickle.dumps(table))
    assert not any(k.startswith("_plans ") for k in vars(copy))
    assert copy == table
    torch.testing.assert_close(zmat.to_xyz(c, copy), want, rtol=0, atol=0)


def test_a_device_spelled_as_a_string_or_a_device_shares_one_plan():
    table = ConstructionTable(chain_table(6))
    calls = []

    def build(t, device):
        calls.append(device)
        return object()

    plans = [table.cached(build, d) for d in ("cpu", torch.device("cpu"), "cpu", torch.device("cpu"))]
    assert calls == [torch.device("cpu")]  # built once, for a torch.device
    assert all(p is plans[0] for p in plans)


def test_lazy_arrays_are_safe_to_read_from_threads():
    # a trusted table's array made on first access: threads that ask at once
    # all get it (one may make it again), none sees a missing attribute
    import threading
    import time

    from zmat.table import TablePlan

    base = ConstructionTable(chain_table(5))

    def slow_plan():
        time.sleep(0.05)
        return TablePlan.of(base)

    table = ConstructionTable.from_plan(slow_plan, base.n_atoms)
    got, errors = [], []

    def read():
        try:
            got.append(table.refs)
        except AttributeError as error:
            errors.append(error)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 4 and all(np.array_equal(g, base.refs) for g in got)
    assert "_make_plan" not in vars(table)


def _plain_preorder(parent):
    """Recursive depth-first preorder, children in index order: the definition."""
    n = len(parent)
    kids = [[] for _ in range(n + 1)]
    for i, p in enumerate(parent):
        kids[p if p >= 0 else n].append(i)
    order, end = [], [0] * n
    stack = [(c, False) for c in reversed(kids[n])]
    while stack:
        i, done = stack.pop()
        if done:
            end[i] = len(order)
            continue
        order.append(i)
        stack.append((i, True))
        stack.extend((c, False) for c in reversed(kids[i]))
    return order, end


@settings(max_examples=200)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_preorder_is_the_depth_first_order(links, rnd):
    from zmat.table import _preorder

    n = len(links)
    perm = list(range(n))
    rnd.shuffle(perm)
    parent = np.full(n, -1)
    for k in range(1, n):  # roots where links[k] < 0.2; stars and chains come up often
        if links[k] >= 0.2:
            parent[perm[k]] = perm[int(links[k] * k) % k]
    order, end = _preorder(parent)
    want_order, want_end = _plain_preorder(parent)
    assert order.tolist() == want_order and end.tolist() == want_end


@pytest.mark.parametrize("shape", ["roots", "star", "planar star", "chain"])
def test_wide_and_deep_tables_are_planned(shape):
    # issue 20: scipy's depth_first_order in _preorder was quadratic in the number of
    # roots or of one atom's children (300k roots: ~100 s); now log-depth numpy rounds
    n = 300_000
    refs = np.full((n, 3), -1, np.int64)
    i = np.arange(n)
    if shape == "star":
        refs[1:, 0] = 0
    elif shape == "planar star":
        refs[1, 0], refs[2:, 0], refs[2:, 1] = 0, 1, 0
    elif shape == "chain":
        refs[1:, 0], refs[2:, 1], refs[3:, 2] = i[:-1], i[:-2], i[:-3]
    t = zmat.ConstructionTable(refs)
    assert t.subtree_end[0] == (1 if shape == "roots" else n) and sorted(t.dfs_order[:5]) == [0, 1, 2, 3, 4]


def test_one_based_table_gets_a_hint():
    # issue 24: "atom 0 refers to itself" alone did not say what was wrong
    with pytest.raises(ValueError, match=r"itself.*0-based atom indices with -1 for none.*refs - 1"):
        zmat.ConstructionTable([[0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 2, 1]])
    with pytest.raises(ValueError, match=r"row 1: atom 1 refers to itself.*1-based"):
        zmat.ConstructionTable([[-1, -1, -1], [1, -1, -1], [2, 1, -1], [3, 2, 1]])
    with pytest.raises(ValueError, match=r"repeated reference") as bad:  # not 1-based either: no hint
        zmat.ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 1, -1]])
    assert "1-based" not in str(bad.value)


def test_import_zmat_leaves_dynamo_and_scipy_unloaded():
    # issue 24: `import zmat` took ~2 s, most of it torch._dynamo (imported by
    # torch.compiler.assume_constant_result at import time) and scipy's sparse/spatial
    import subprocess
    import sys

    code = (
        "import sys, zmat; "
        "print(sorted(m for m in ('torch._dynamo', 'scipy.sparse', 'scipy.spatial') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_plans_are_still_constants_for_dynamo():
    # the mark torch.compiler.assume_constant_result sets, set without importing Dynamo
    from zmat.table import _build_constant

    assert getattr(_build_constant, "_dynamo_marked_constant", False)


def test_table_plan_concatenates_and_takes_as_planning_the_whole():
    """``TablePlan``: pack/unpack round-trips, and concatenating / taking
    components (one shift of the fields that index atoms or positions) gives
    the arrays of the whole planned from its rows."""
    from zmat.table import TablePlan

    chain = ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [2, 1, 3], [2, 1, 4]])
    water = ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
    ring = ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 0]])
    pieces = [chain, water, ring, water]

    def arrays(plan):
        return plan.arrays() if isinstance(plan, TablePlan) else {k: getattr(plan, k) for k in plan._ARRAYS}

    def same(a, b):
        for k in ConstructionTable._ARRAYS:
            x, y = a[k], b[k]
            if k == "stage_atoms":
                assert [v.tolist() for v in x] == [v.tolist() for v in y], k
            else:
                assert np.array_equal(x, y), k

    same(arrays(TablePlan.unpack(TablePlan.of(chain).pack())), arrays(chain))
    refs, at = [], 0
    for t in pieces:
        refs.append(np.where(t.refs >= 0, t.refs + at, -1))
        at += t.n_atoms
    whole = ConstructionTable(np.concatenate(refs))
    packed = [TablePlan.of(t).pack() for t in pieces]
    same(arrays(TablePlan.concatenate(packed)), arrays(whole))
    ptr = np.append(0, np.cumsum([t.n_atoms for t in pieces]))
    index = np.array([2, 0, 0, 1])
    taken = TablePlan.take(TablePlan.concatenate(packed).pack(), ptr, index)
    same(arrays(taken), arrays(ConstructionTable.concatenate([pieces[i] for i in index])))
