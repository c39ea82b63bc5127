"""BHC's tree (Xu et al. 2009, Algorithm 1) over leaf summaries, as the project's ``Tree`` table:
the agglomeration of ``kernels.bhc.bhc`` and each node's fields, its cut and its bounds
(``fit_tree``). The estimator ``BHC`` (``pipeline.estimators.bhc``) and stage 2 fit their trees
here, stage 2 without the estimator's libraries (scikit-learn's import is most of a second of a
command's start-up)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.special import logsumexp

from kernels import bhc as kbhc
from pipeline.families import FloatArray, ProductFamily
from pipeline.models.tree import Tree, tree_dtype

BHC_FIELDS = ("log_r", "log_pi", "log_p", "log_ph1", "log_omega")
# candidate partners cached per node: memory O(M N_TOP), the same tree whatever its value
N_TOP = 16

IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class Cut:
    """A BHC tree cut at r_k = 0.5 (Xu et al. 2009, Section 3) and its bounds.

    Attributes
    ----------
    tree : Tree
        2M - 1 nodes, fields ``BHC_FIELDS`` after the common ones.
    labels : ndarray of shape (M,), int64
        Cluster of each leaf.
    nodes : ndarray of shape (K,), int64
        Tree node of each cluster.
    log_evidence : float
        log p(D | T) at the root (eq. 7).
    lower_bound : float
        log of eq. 9's bound on the DPM marginal likelihood.
    alt_lower_bound : float
        log of Theorem 1's bound (eq. 9 plus eq. 12's increments).
    alt_increments : ndarray of shape (2M - 1, 2)
        log delta_LB of each node's two alternative trees (-inf where none).
    """

    tree: Tree
    labels: IntArray
    nodes: IntArray
    log_evidence: float
    lower_bound: float
    alt_lower_bound: float
    alt_increments: FloatArray


def fit_tree(
    leaves: FloatArray,
    fam: ProductFamily,
    log_alpha: float,
    n_top: int = N_TOP,
    min_parallel: int | None = None,
    alt_start: int | None = None,
) -> Cut:
    """BHC over ``leaves`` (M, S), statistics rows of ``fam``: the tree (``build_tree``), its
    cut and its bounds, the alternative trees relocated from node ``alt_start`` on (None: every
    internal node; ``relocations``)."""
    tree = build_tree(leaves, fam, log_alpha, n_top, min_parallel)
    labels, nodes = kbhc.cut(tree.left, tree.right, tree.log_r, tree.n_leaves)
    lower = lower_bound(tree, log_alpha)
    alt, increments = alternative_bound(tree, fam, log_alpha, lower, relocations(tree, alt_start))
    return Cut(tree, labels, nodes, float(tree.log_p[tree.root]), lower, alt, increments)


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


def relocations(tree: Tree, start: int | None = None, path_only: bool = False) -> np.ndarray:
    """The nodes (2M - 1,) where the alternative-tree algorithm relocates (Section 4), from
    internal node ``start`` (None: the lowest, M): ``start``, ``start`` + 1, ..., the root in
    merge order, as Fig. 4 iterates, or with ``path_only`` the path from ``start`` to the root,
    as Section 4's text reads. Both include the root and are valid bounds."""
    M = tree.n_leaves
    root = tree.root
    relocate = np.zeros(len(tree), dtype=np.bool_)
    if M >= 3:
        l = M if start is None else int(start)
        if not M <= l <= root:
            raise ValueError(f"start must be an internal node id in [{M}, {root}], got {l}")
        if path_only:
            k = l
            while k >= 0:
                relocate[k] = True
                k = int(tree.parent[k])
        else:
            relocate[l:] = True
    return relocate


def alternative_bound(
    tree: Tree, fam: ProductFamily, log_alpha: float, lower: float, relocate: np.ndarray
) -> tuple[float, FloatArray]:
    """Theorem 1's bound: log of eq. 9 (``lower``, ``lower_bound``) plus the increments
    delta_LB (eq. 12) at the nodes ``relocate`` marks; and those increments (2M - 1, 2)."""
    log_delta = alternative_increments(tree, fam, log_alpha, relocate)
    terms = np.concatenate([[lower], log_delta[np.isfinite(log_delta)]])
    return float(logsumexp(terms)), log_delta


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
