"""Bayesian hierarchical clustering of records or of cluster summaries (Xu et al. 2009).

A leaf summarising n records enters the BHC recursion with d = alpha Gamma(n) and pi = 1, so the
tree's p(D | T) and bounds are about the DPM restricted to partitions that keep every summary
whole; ``fit(X)`` makes each record a one-record summary.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kernels import bayes_kmeans as kbk
from kernels import bhc as kbhc
from pipeline.core import config
from pipeline.core.seeds import as_seed_sequence
from pipeline.estimators.base import MixtureEstimator
from pipeline.families import Family, ProductFamily
from pipeline.models.bhc import N_TOP, alternative_bound, fit_tree, relocations

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

_METHODS = ("bhc", "bayes-kmeans")


"""The fields a BHC tree adds to ``pipeline.models.tree.BASE_FIELDS`` (n_nodes = 2M - 1): log r_k =
log p(H_1^k | D_k) (eq. 8, 0 at leaves); log pi_k (Section 3; a leaf of n records has
d = alpha Gamma(n), pi = 1); log p(D_k | T_k) (eq. 7); log p(D_k | H_1^k) (eq. 6, the log marginal
of the node's statistics); log omega_k, the posterior probability that D_k is one block of the
partition (r_k times prod over the strict ancestors i of (1 - r_i)). Leaves are nodes 0 .. M-1 in
input order; the node made by the t-th merge is M + t, so the root is 2M - 2."""


class BHC(MixtureEstimator):
    """Bayesian hierarchical clustering and its DPM bounds (Xu, Heller & Ghahramani 2009).

    Parameters
    ----------
    alpha : float, default 1.0
        DP concentration.
    family : str, dict, Family or ProductFamily, default 'gaussian'
        As ``MAPDP``'s; ``fit_summaries`` needs an instance.
    method : {'bhc', 'bayes-kmeans'}, default 'bhc'
        Greedy BHC (Section 3) on the leaves, or Bayes K-means BHC (Section 5): BHC on the groups
        Bayes K-means makes of the leaves, O(M k + k^2).
    random_state : None, int, SeedSequence or Generator
        Visiting order and initial clusters of Bayes K-means.
    alt_start : int or None, default None
        Starting node of the alternative-tree algorithm (Fig. 4); None: every internal node.
    k_init : int or None, default None
        Clusters Bayes K-means opens from its first leaves; None: ceil(sqrt(M)).
    kmeans_sweeps : int, default 0
        Bayes K-means reassignment sweeps after its single pass (O(M k) each).
    n_top : int, default 16
        Candidate partners cached per node (memory O(M n_top)); does not change the result.
    parallel : bool, default False
        Score candidate pairs on numba's threads (slower on a shared machine; same result).
    prior_scale, tune : as ``MAPDP``

    Attributes
    ----------
    labels_ : ndarray of shape (n_leaves,), int64
        Cluster of each leaf: the tree cut at r_k = 0.5.
    tree_ : pipeline.models.tree.Tree
        Fields ``BHC_FIELDS`` after the common ones, ``stats`` every node's statistics.
    log_evidence_ : float
        log p(D | T) at the root (eq. 7).
    lower_bound_ : float
        log of the lower bound of eq. 9 on the DPM marginal likelihood.
    alt_lower_bound_ : float
        log of Theorem 1's bound (eq. 9 plus eq. 12's increments).
    alt_increments_ : ndarray of shape (2M - 1, 2)
        log delta_LB of the two alternative trees at each node (-inf where none).
    n_clusters_ : int
    cluster_nodes_ : ndarray of shape (n_clusters_,), int64
        Tree node of each cluster.
    leaf_groups_ : ndarray of shape (n_leaves,), int64
        Tree leaf holding each input leaf.
    family_, n_leaves_in_, n_features_in_, feature_names_in_
    """

    # a given prior needs no data to be set, and one leaf is a (trivial) tree
    _always_informative = False
    _widened_spec = True
    # the predictive of a BHC model is the tree's (``_score_encoded``), not the flat one
    _model_attrs: ClassVar[tuple[str, ...]] = ("n_clusters_", "tree_", "cluster_nodes_")
    _model_extras: ClassVar[tuple[str, ...]] = (
        "n_leaves_in_",
        "log_evidence_",
        "lower_bound_",
        "alpha_",
    )

    def __init__(
        self,
        alpha: float = 1.0,
        family: str | Family | ProductFamily = "gaussian",
        method: str = "bhc",
        random_state: Any = None,
        alt_start: int | None = None,
        k_init: int | None = None,
        kmeans_sweeps: int = 0,
        n_top: int = N_TOP,
        parallel: bool = False,
        prior_scale: float | None = None,
        tune: str | None = None,
    ) -> None:
        config.keep_params(self, locals())

    def _check_params(self) -> float:
        alpha = config.check_positive(self.alpha, "alpha")
        config.check_choice(self.method, _METHODS, "method")
        config.check_int(self.kmeans_sweeps, "kmeans_sweeps", minimum=0)
        config.check_int(self.n_top, "n_top")
        if self.k_init is not None:
            config.check_int(self.k_init, "k_init")
        self._check_tuning()
        return alpha

    def _fit(self, Xa: FloatArray, alpha: float) -> None:
        """Every encoded record becomes a one-record leaf."""
        self._fit_stats(self._record_leaves(Xa), self.family_, alpha)

    def fit_summaries(self, stats: ArrayLike, family: Family | ProductFamily | None = None) -> BHC:
        """Fit on leaf summaries: rows of additive sufficient statistics of ``family``.

        Parameters
        ----------
        stats : array-like of shape (n_leaves, S)
            ``stats[:, 0]`` is the number of records each leaf summarises (> 0).
        family : Family or ProductFamily, optional
            The family (with its prior) the rows belong to; default ``self.family``.

        Returns
        -------
        self
        """
        alpha = self._check_params()
        st, fam = self._summaries_input(stats, family)
        self._fit_stats(st, fam, alpha)
        return self

    def _fit_stats(self, stats: FloatArray, fam: ProductFamily, alpha: float) -> None:
        self.alpha_ = float(alpha)
        log_alpha = math.log(alpha)
        m = stats.shape[0]
        if self.method == "bayes-kmeans":
            rng = np.random.default_rng(as_seed_sequence(self.random_state))
            order = rng.permutation(m).astype(np.int64)
            k_init = math.ceil(math.sqrt(m)) if self.k_init is None else int(self.k_init)
            if not 1 <= k_init <= m:
                raise ValueError(f"k_init must be in [1, {m}], got {k_init}")
            groups, leaves = kbk.bayes_kmeans(
                stats, fam.spec, fam.prior, log_alpha, order, k_init, int(self.kmeans_sweeps)
            )
        else:
            groups = np.arange(m, dtype=np.int64)
            leaves = stats
        self.n_leaves_in_ = m
        self.leaf_groups_ = groups
        # None, not a huge int: the serial kernels are then compiled without the threaded ones
        par = int(kbhc.MIN_PARALLEL) if self.parallel else None
        cut = fit_tree(leaves, fam, log_alpha, int(self.n_top), par, self.alt_start)
        self.tree_ = cut.tree
        self.labels_ = cut.labels[groups]
        self.cluster_nodes_ = cut.nodes
        self.n_clusters_ = int(cut.nodes.shape[0])
        self.log_evidence_ = cut.log_evidence
        self.lower_bound_ = cut.lower_bound
        self.alt_lower_bound_, self.alt_increments_ = cut.alt_lower_bound, cut.alt_increments

    def alternative_bound(
        self, start: int | None = None, path_only: bool = False
    ) -> tuple[float, FloatArray]:
        """Theorem 1's lower bound from relocations starting at node ``start`` (Section 4).

        Parameters
        ----------
        start : int or None
            Starting internal node l; None: the lowest, M.
        path_only : bool
            False: relocate at l, l + 1, ..., root in merge order, as Fig. 4 iterates; True: only
            on the path from l to the root, as Section 4's text reads. Both include the root
            (needed for the exact marginal of three leaves, Section 6.2) and are valid bounds.

        Returns
        -------
        log_bound : float
            log of eq. 9 plus the sum of the increments delta_LB (eq. 12).
        log_delta : ndarray of shape (2M - 1, 2)
            log delta_LB of each node's two alternative trees (-inf where none).
        """
        relocate = relocations(self.tree_, start, path_only)
        log_alpha = math.log(float(self.alpha))
        return alternative_bound(self.tree_, self.family_, log_alpha, self.lower_bound_, relocate)

    def _score_encoded(self, Xa: FloatArray) -> FloatArray:
        """log p(x | D, T) of encoded records Xa (n_samples, n_features) under the tree, shape
        (n_samples,): the DPM predictive of the tree-consistent partitions averaged with
        Heller & Ghahramani's (2005, Section 4) weights omega_k,
        sum_k omega_k n_k / (N + alpha) p(x | D_k) + alpha / (N + alpha) p(x); it integrates
        to one (Xu et al. 2009 use but do not state it)."""
        fam = self.family_
        tree = self.tree_
        # the fit's concentration (a tuned one; a model saved before ``alpha_`` has the parameter)
        alpha = float(self.alpha_ if hasattr(self, "alpha_") else self.alpha)
        log_norm = math.log(float(tree.n[-1]) + alpha)
        log_w = tree.log_omega + np.log(tree.n) - log_norm
        log_w_new = math.log(alpha) - log_norm
        return kbhc.log_predictive_density(Xa, tree.stats, log_w, fam.spec, fam.prior, log_w_new)

    def _predict_encoded(self, Xa: FloatArray) -> IntArray:
        """argmax_c log n_c + log p(x | D_c) over the clusters of ``labels_`` for each encoded
        record of ``Xa``, shape (n_samples,), int64; a new cluster is not offered."""
        fam = self.family_
        stats = np.ascontiguousarray(self.tree_.stats[self.cluster_nodes_])
        lp = kbhc.log_predictive_matrix(Xa, stats, fam.spec, fam.prior)
        return np.argmax(lp + np.log(stats[:, 0])[None, :], axis=1).astype(np.int64)
