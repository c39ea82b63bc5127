"""Incremental BHC (Lee and Choi 2015, Section 2.3) over leaf summaries, tree-guided MCMC's default
initialisation, and the prior and leaf pieces the samplers of ``pipeline.estimators.tgmcmc``
share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kernels import alloc as prior_kernels
from kernels import ibhc as ibhc_kernels
from kernels import partition as kpartition
from kernels.obs import product as kproduct
from pipeline.core import config
from pipeline.core.seeds import as_seed_sequence, seed_state
from pipeline.families import Family, ProductFamily, as_product, check_summaries
from pipeline.models.tree import Tree, tree_dtype

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

PRIORS = ("dp", "nggp")


def seed_sequence(random_state: Any) -> np.random.SeedSequence:
    """``as_seed_sequence`` restricted to None, an int or a SeedSequence."""
    if random_state is None or isinstance(random_state, np.random.SeedSequence):
        return as_seed_sequence(random_state)
    if isinstance(random_state, int | np.integer):
        return as_seed_sequence(int(random_state))
    raise ValueError(f"random_state must be None, an int or a SeedSequence; got {random_state!r}")


def prior_array(prior: str, alpha: float, sigma: float) -> FloatArray:
    """The kernels' description (kind, alpha, sigma) of a partition prior, validated."""
    config.check_choice(prior, PRIORS, "prior")
    alpha = config.check_positive(alpha, "alpha")
    if prior == "nggp":
        if not 0.0 < sigma < 1.0:
            raise ValueError(f"sigma must lie in (0, 1) for the NGGP; got {sigma}")
        return np.array([prior_kernels.NGGP, float(alpha), float(sigma)])
    return np.array([prior_kernels.DP, float(alpha), 0.0])


def leaf_log_marginals(stats: FloatArray, family: ProductFamily) -> FloatArray:
    """log p(X_i) of every leaf (L,) from its statistics row (``kernels.obs.product``)."""
    st = np.ascontiguousarray(stats, dtype=np.float64)
    return np.asarray(kproduct.log_marginals(st, family.spec, family.prior), dtype=np.float64)


@dataclass
class IBHCResult:
    """Output of ``run_ibhc``.

    Attributes
    ----------
    labels : ndarray of shape (L,)
        Tree (cluster) of each leaf, numbered by first leaf.
    log_bound : float
        The lower bound of eq. 10 on log P(dX, du) (on log p(X) for the DP).
    u : float
    tree : pipeline.models.tree.Tree
        The forest: leaves first, then internal nodes; fields ``BASE_FIELDS`` and ``IBHC_FIELDS``.
    """

    labels: IntArray
    log_bound: float
    u: float
    tree: Tree


IBHC_FIELDS = ("log_phi",)
"""The field an IBHC forest adds to ``pipeline.models.tree.BASE_FIELDS``: log phi (Lee and Choi
2015, eq. 8); ``log_d`` is eq. 9's dissimilarity, -inf at leaves."""


def _tree_table(ni: IntArray, nf: FloatArray, st: FloatArray, roots: IntArray, L: int) -> Tree:
    """The forest ``kernels.ibhc.ibhc`` left as a ``Tree``: leaf i is node i, then the rest."""
    live: list[int] = []
    stack = [int(r) for r in roots]
    while stack:
        v = stack.pop()
        live.append(v)
        if ni[v, ibhc_kernels.LEAF] < 0:
            stack.append(int(ni[v, ibhc_kernels.LEFT]))
            stack.append(int(ni[v, ibhc_kernels.RIGHT]))
    new_id = {}
    internal = [v for v in live if ni[v, ibhc_kernels.LEAF] < 0]
    for v in live:
        if ni[v, ibhc_kernels.LEAF] >= 0:
            new_id[v] = int(ni[v, ibhc_kernels.LEAF])
    for k, v in enumerate(sorted(internal)):
        new_id[v] = L + k
    table = np.zeros(len(live), dtype=tree_dtype(*IBHC_FIELDS))
    stats = np.zeros((len(live), st.shape[1]))
    for v in live:
        j = new_id[v]
        leaf = ni[v, ibhc_kernels.LEAF] >= 0
        p = int(ni[v, ibhc_kernels.PARENT])
        row = table[j]
        row["node"] = j
        row["parent"] = -1 if p < 0 else new_id[p]
        row["left"] = -1 if leaf else new_id[int(ni[v, ibhc_kernels.LEFT])]
        row["right"] = -1 if leaf else new_id[int(ni[v, ibhc_kernels.RIGHT])]
        row["n_leaves_below"] = int(ni[v, ibhc_kernels.NLEAF])
        row["n"] = float(st[v, 0])
        row["log_d"] = float(nf[v, ibhc_kernels.LOGD])
        row["log_phi"] = float(nf[v, ibhc_kernels.LOGPHI])
        stats[j] = st[v]
    return Tree(table, stats)


def canonical(z: ArrayLike) -> IntArray:
    """A copy of z numbered in order of first appearance (``kernels.partition``)."""
    out = np.array(z, dtype=np.int64)
    kpartition.canonical_labels(out, out)
    return out


def run_ibhc(
    stats: ArrayLike,
    family: Family | ProductFamily,
    prior: str = "dp",
    alpha: float = 1.0,
    sigma: float = 0.5,
    *,
    mode: str = "ibhc",
    u: float | None = None,
    n_restarts: int = 1,
    random_state: Any = None,
) -> IBHCResult:
    """Incremental BHC (Lee and Choi 2015, Section 2.3) over leaf summaries.

    Each restart inserts the leaves in a fresh random order; between restarts u is resampled given
    the last partition (NGGP), and the forest with the highest bound (eq. 10) is returned.

    Parameters
    ----------
    stats : array-like of shape (n_leaves, n_stats)
        Leaf statistics in the family's layout.
    family : Family or ProductFamily
    prior, alpha, sigma : the partition prior (``"dp"`` or ``"nggp"``).
    mode : {"ibhc", "no-split", "top"}
        SeqInsert with splits (IBHC), SeqInsert alone, or each leaf put on top of its closest
        tree (Lee and Choi 2015, Section 4.1).
    u : float, optional
        Auxiliary variable of Theorem 1 (NGGP) for the first pass; default 1.
    n_restarts : int
    random_state : None, int or SeedSequence
    """
    prod = as_product(family)
    st = check_summaries(stats, prod)
    pp = prior_array(prior, alpha, sigma)
    modes = {
        "ibhc": ibhc_kernels.SEQ_SPLIT,
        "no-split": ibhc_kernels.SEQ_NOSPLIT,
        "top": ibhc_kernels.TOP,
    }
    if mode not in modes:
        raise ValueError(f"mode must be one of {tuple(modes)}; got {mode!r}")
    if n_restarts < 1:
        raise ValueError(f"n_restarts must be >= 1; got {n_restarts}")
    L = st.shape[0]
    lm = leaf_log_marginals(st, prod)
    n_tot = float(st[:, 0].sum())
    u_cur = float(u) if u is not None else 1.0
    if not u_cur > 0:
        raise ValueError(f"u must be > 0; got {u}")
    seq = seed_sequence(random_state)
    rng = np.random.default_rng(seq.spawn(1)[0])
    state = seed_state(seq.spawn(1)[0])
    best: IBHCResult | None = None
    for _ in range(n_restarts):
        order = rng.permutation(L).astype(np.int64)
        ni, nf, fst, _free, _meta, roots = ibhc_kernels.ibhc(
            st, lm, order, u_cur, pp, prod.spec, prod.prior, modes[mode], 4 * L
        )
        bound = float(ibhc_kernels.log_lower_bound(roots, nf, fst, u_cur, pp))
        if best is None or bound > best.log_bound:
            z = canonical(np.asarray(ibhc_kernels.forest_labels(roots, ni, L)))
            best = IBHCResult(z, bound, u_cur, _tree_table(ni, nf, fst, roots, L))
        if pp[0] == prior_kernels.NGGP:
            u_cur = float(prior_kernels.sample_u(state, u_cur, n_tot, float(len(roots)), pp, 10))
    assert best is not None
    return best
