"""``pipeline.models.tree.Tree``, the one tree format of BHC and IBHC: its checks and its views."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.models.tree import Tree, tree_dtype


def forest() -> Tree:
    """Two trees over four leaves: (0, 1) -> 4, (4, 2) -> 5, and leaf 3 alone."""
    table = np.zeros(6, dtype=tree_dtype("log_r"))
    table["node"] = np.arange(6)
    table["parent"] = [4, 4, 5, -1, 5, -1]
    table["left"] = [-1, -1, -1, -1, 0, 4]
    table["right"] = [-1, -1, -1, -1, 1, 2]
    table["n_leaves_below"] = [1, 1, 1, 1, 2, 3]
    table["n"] = [1.0, 2.0, 1.0, 5.0, 3.0, 4.0]
    table["log_d"] = -np.inf
    return Tree(table, np.arange(12.0).reshape(6, 2))


def test_a_forest_has_roots_but_no_single_root_and_no_linkage():
    t = forest()
    assert t.n_leaves == 4 and len(t) == 6
    np.testing.assert_array_equal(t.roots, [3, 5])
    with pytest.raises(ValueError, match="forest of 2 trees"):
        _ = t.root
    with pytest.raises(ValueError, match="single binary tree"):
        t.linkage("order")
    assert repr(t) == "Tree(n_leaves=4, n_trees=2, n_records=9)"


def test_columns_are_contiguous_copies_and_pandas_leaves_out_stats():
    t = forest()
    left = t.left
    assert left.flags.c_contiguous and left.dtype == np.int64
    left[:] = 7  # a copy: the table is not changed
    assert t["left"][0] == -1
    df = t.to_pandas()
    assert list(df.columns) == list(t.fields) and "stats" not in df.columns


def test_bad_tables_are_rejected_with_the_reason():
    bare = np.zeros(3, dtype=[("left", np.int64), ("right", np.int64)])
    with pytest.raises(ValueError, match="needs the fields"):
        Tree(bare, np.zeros((3, 1)))
    with pytest.raises(ValueError, match="stats has 2 rows for a tree of 6 nodes"):
        Tree(forest().to_numpy(), np.zeros((2, 1)))
    with pytest.raises(ValueError, match="need the field log_r"):
        Tree(np.zeros(1, dtype=tree_dtype()), np.zeros((1, 1))).linkage()
