"""`batched_group.broadcast_rows`: what `np.broadcast_to(value, (k, width))` reads, without its
set-up where none is needed (issue 27 item 3: a client step served alone called it ~4 times)."""
from __future__ import annotations

import numpy as np
import pytest

from fedmodel.runtime.batched_group import broadcast_rows


@pytest.mark.parametrize("value, k", [(np.arange(4.0), 1), (np.arange(4.0), 3), (2.5, 2),
                                      (np.arange(8.0).reshape(2, 4), 2), (np.arange(4), 1)])
def test_same_rows_as_broadcast_to(value, k):
    out = broadcast_rows(value, k, 4)
    assert out.shape == (k, 4) and out.dtype == np.float64
    np.testing.assert_array_equal(out, np.broadcast_to(np.asarray(value, float), (k, 4)))


def test_no_copy_where_none_is_needed():
    stack, row = np.arange(8.0).reshape(2, 4), np.arange(4.0)
    assert broadcast_rows(stack, 2, 4) is stack
    assert np.shares_memory(broadcast_rows(row, 1, 4), row)


def test_wrong_width_is_refused_as_numpy_refuses_it():
    with pytest.raises(ValueError):
        broadcast_rows(np.arange(3.0), 1, 4)
