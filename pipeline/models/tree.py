"""One format for the trees the pipeline returns: BHC's (Xu et al. 2009) and IBHC's forests (Lee and
Choi 2015).

A ``Tree`` is a structured ndarray with one row per node, as hdbscan keeps its trees: leaves first
(node i is leaf i), then internal nodes, every parent after its children. ``to_numpy()`` gives the
array, ``to_pandas()`` a DataFrame of it, ``tree.left`` / ``tree["left"]`` a column. The fields
every tree has are ``BASE_FIELDS``; each algorithm adds its own after them (``tree_dtype``). The
statistics row of every node, a matrix, is kept beside the table (``stats``), not in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import pandas as pd

FloatArray = NDArray[np.float64]

BASE_FIELDS: list[tuple[str, type]] = [
    ("node", np.int64),
    ("parent", np.int64),
    ("left", np.int64),
    ("right", np.int64),
    ("n_leaves_below", np.int64),
    ("n", np.float64),
    ("log_d", np.float64),
]
"""node id; parent, left, right (-1 where there is none: a root's parent, a leaf's children); leaves
below the node (1 at a leaf); records below it; log d_k (BHC's d of Xu et al. 2009, Section 3, or
IBHC's dissimilarity of Lee and Choi 2015, eq. 9, -inf at leaves)."""


def tree_dtype(*extra: str) -> np.dtype[Any]:
    """The structured dtype of ``BASE_FIELDS`` followed by the float64 fields ``extra``."""
    return np.dtype(BASE_FIELDS + [(name, np.float64) for name in extra])


class Tree:
    """A tree or forest as a structured array, one row per node.

    Parameters
    ----------
    table : structured ndarray of shape (n_nodes,)
        With at least the fields of ``BASE_FIELDS``; ``table["node"]`` is 0..n_nodes-1.
    stats : ndarray of shape (n_nodes, S)
        Statistics row of every node (the sum of its leaves' rows).
    """

    def __init__(self, table: NDArray[Any], stats: FloatArray) -> None:
        missing = [name for name, _ in BASE_FIELDS if name not in (table.dtype.names or ())]
        if missing:
            raise ValueError(f"a tree table needs the fields {missing}")
        if stats.shape[0] != table.shape[0]:
            raise ValueError(
                f"stats has {stats.shape[0]} rows for a tree of {table.shape[0]} nodes"
            )
        self._table = table
        self.stats = stats

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self._table.dtype.names or ())

    def __getattr__(self, name: str) -> Any:
        # a column by attribute (``tree.log_r``), contiguous so that it can go to a kernel as is;
        # through __dict__, since a copy or an unpickling asks for attributes before __init__
        table = self.__dict__.get("_table")
        if table is not None and name in (table.dtype.names or ()):
            return np.ascontiguousarray(table[name])
        raise AttributeError(f"{type(self).__name__} has no attribute or field {name!r}")

    def __getitem__(self, key: Any) -> Any:
        return self._table[key]

    def __len__(self) -> int:
        return int(self._table.shape[0])

    @property
    def n_leaves(self) -> int:
        """Number of leaves."""
        return int(np.count_nonzero(self._table["left"] < 0))

    @property
    def roots(self) -> NDArray[np.int64]:
        """The root of every tree of the forest, in node order."""
        return np.flatnonzero(self._table["parent"] < 0).astype(np.int64)

    @property
    def root(self) -> int:
        """The root of a single tree (a forest of several trees raises ValueError)."""
        roots = self.roots
        if roots.shape[0] != 1:
            raise ValueError(f"a forest of {roots.shape[0]} trees has no single root")
        return int(roots[0])

    def __repr__(self) -> str:
        n = float(self._table["n"][self.roots].sum())
        return f"Tree(n_leaves={self.n_leaves}, n_trees={self.roots.shape[0]}, n_records={n:g})"

    def to_numpy(self) -> NDArray[Any]:
        """The structured array itself."""
        return self._table

    def to_pandas(self) -> pd.DataFrame:
        """The table as a DataFrame, one row per node, one column per field (``stats`` left
        out)."""
        import pandas as pd

        return pd.DataFrame({name: self._table[name] for name in self.fields})

    def linkage(self, heights: Literal["cumulative", "order"] = "cumulative") -> FloatArray:
        """The tree (a single tree of M leaves, node M + t the t-th merge) as a SciPy linkage
        matrix of shape (M - 1, 4), for ``scipy.cluster.hierarchy.dendrogram``.

        ``heights``: 'cumulative' (needs ``log_r``): a node's height is its children's highest
        plus -log r_k; 'order': t + 1. Both are monotonic.
        """
        if heights not in ("cumulative", "order"):
            raise ValueError(f"heights must be 'cumulative' or 'order', got {heights!r}")
        if heights == "cumulative" and "log_r" not in self.fields:
            raise ValueError("cumulative heights need the field log_r (a BHC tree)")
        M = self.n_leaves
        if len(self) != 2 * M - 1:
            raise ValueError(f"a linkage needs a single binary tree; this is {self!r}")
        t_ = self._table
        Z = np.zeros((M - 1, 4))
        h = np.zeros(len(self))
        for t in range(M - 1):
            k = M + t
            a, b = int(t_["left"][k]), int(t_["right"][k])
            if heights == "cumulative":
                h[k] = max(h[a], h[b]) + max(-float(t_["log_r"][k]), 0.0)
            else:
                h[k] = t + 1.0
            Z[t] = (a, b, h[k], t_["n_leaves_below"][k])
        return Z
