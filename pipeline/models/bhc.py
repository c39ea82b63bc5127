"""BHC's tree (Xu et al. 2009, Algorithm 1) over leaf summaries, as the project's ``Tree`` table:
the agglomeration of ``kernels.bhc.bhc`` and each node's fields. The estimator ``BHC``
(``pipeline.estimators.bhc``) and stage 2 build their trees here."""

from __future__ import annotations

import numpy as np

from kernels import bhc as kbhc
from pipeline.families import FloatArray, ProductFamily
from pipeline.models.tree import Tree, tree_dtype

BHC_FIELDS = ("log_r", "log_pi", "log_p", "log_ph1", "log_omega")


def build_tree(
    leaves: FloatArray, fam: ProductFamily, log_alpha: float, n_top: int, min_parallel: int | None
) -> Tree:
    """The BHC tree of ``leaves`` (M, S), statistics rows of ``fam``, under the DP with
    log concentration ``log_alpha``: 2M - 1 nodes, leaves first; ``n_top`` candidate partners
    cached per node; the threaded kernels from ``min_parallel`` leaves up (None: serial)."""
    left, right, n, log_r, log_d, log_pi, log_p, log_ph1, node_stats = kbhc.bhc(
        leaves, fam.spec, fam.prior, log_alpha, n_top, min_parallel
    )
    cap = left.shape[0]
    M = (cap + 1) // 2
    table = np.zeros(cap, dtype=tree_dtype(*BHC_FIELDS))
    table["node"] = np.arange(cap)
    table["parent"] = -1
    table["n_leaves_below"] = 1
    for k in range(M, cap):
        table["parent"][left[k]] = k
        table["parent"][right[k]] = k
        table["n_leaves_below"][k] = (
            table["n_leaves_below"][left[k]] + table["n_leaves_below"][right[k]]
        )
    table["left"], table["right"], table["n"] = left, right, n
    table["log_d"], table["log_r"], table["log_pi"] = log_d, log_r, log_pi
    table["log_p"], table["log_ph1"] = log_p, log_ph1
    table["log_omega"] = kbhc.log_block_posterior(left, right, log_d, log_p, log_r)
    return Tree(table, node_stats)


def lower_bound(tree: Tree, log_alpha: float) -> float:
    """log of Theorem 1's lower bound on the marginal likelihood (eq. 9) at the root of
    ``tree``, built by ``build_tree`` under log concentration ``log_alpha``."""
    root = tree.root
    return float(kbhc.log_lower_bound(tree.log_d[root], tree.log_p[root], tree.n[root], log_alpha))


def alternative_increments(
    tree: Tree, fam: ProductFamily, log_alpha: float, relocate: np.ndarray
) -> FloatArray:
    """log delta_LB (eq. 12) of each node's two alternative trees, (2M - 1, 2), at the nodes
    ``relocate`` (2M - 1,) marks (Section 4); -inf where none."""
    return kbhc.alternative_tree_increments(
        tree.left,
        tree.right,
        tree.n,
        tree.log_d,
        tree.log_p,
        tree.stats,
        fam.spec,
        fam.prior,
        log_alpha,
        relocate,
    )
