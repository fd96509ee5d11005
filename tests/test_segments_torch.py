"""The torch twins of the ragged helpers (``zmat._segments``: ``starts_t``,
``segment_ids_t``, ``per_row_t``, ``segment_arange_t``) against their numpy
originals, empty segments and an empty batch included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zmat import _segments as seg

SIZES = [[3, 0, 2, 5, 0, 1], [0, 0], [4], []]


@pytest.mark.parametrize("sizes", SIZES)
def test_twins_equal_the_numpy_helpers(sizes):
    s = np.array(sizes, np.int64)
    t = torch.from_numpy(s)
    total = int(s.sum())
    np.testing.assert_array_equal(seg.starts_t(t).numpy(), seg.starts(s))
    for given in (None, total):
        ids = seg.segment_ids_t(t, given)
        np.testing.assert_array_equal(ids.numpy(), seg.segment_ids(s))
        np.testing.assert_array_equal(seg.segment_arange_t(t, given).numpy(), seg.segment_arange(s))
        np.testing.assert_array_equal(seg.segment_arange_t(t, given, ids).numpy(), seg.segment_arange(s))
        values = torch.arange(10, 10 + len(s))
        np.testing.assert_array_equal(seg.per_row_t(values, t, given).numpy(), seg.per_row(values.numpy(), s))
    np.testing.assert_array_equal(
        seg.per_row_t(torch.arange(len(s)), 2).numpy(), np.repeat(np.arange(len(s)), 2)
    )
