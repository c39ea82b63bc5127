"""Tree-guided MCMC for NRM mixtures (Lee and Choi 2015) and its reference samplers, over leaf
summaries.

``TreeGuidedMCMC`` samples partitions of *leaves* under a DP or NGGP mixture with a conjugate
likelihood family. A leaf is either one record (``fit(X)``) or a summary, the additive sufficient
statistics of a group of records held together (``fit_summaries(stats, family)``); a leaf
summarising n records is an atomic block of size n. Three samplers share the priors and leaves:

``method="tgmcmc"``
    tree-guided MCMC (``kernels.tgmcmc``): G global split/merge moves guided by the clusters'
    trees, one sweep of local moves, u resampled (NGGP).
``method="gibbs"``
    the marginal Gibbs sampler (``kernels.samplers``).
``method="split-merge"``
    Jain and Neal's restricted Gibbs split-merge sampler, G moves then one Gibbs sweep.

Every sampler leaves p(Pi, u | X) exactly invariant (tgMCMC through canonical trees); the running
chain is ``pipeline.models.tgmcmc.Chain``, the default start incremental BHC
(``pipeline.models.ibhc.run_ibhc``, Lee and Choi 2015, Section 2.3).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kernels import alloc as prior_kernels
from kernels.alloc import nggp
from pipeline.core import config
from pipeline.core.seeds import seed_state
from pipeline.estimators.base import MixtureEstimator
from pipeline.families import Family, ProductFamily
from pipeline.models.ibhc import canonical, leaf_log_marginals, prior_array, run_ibhc, seed_sequence
from pipeline.models.tgmcmc import Chain, ChainSettings, coclustering, effective_sample_size

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

METHODS = ("tgmcmc", "gibbs", "split-merge")
INITS = ("ibhc", "top", "one", "singletons")
_MOVES = {"tgmcmc": ("all", "global", "local"), "gibbs": ("all",), "split-merge": ("all", "global")}


class TreeGuidedMCMC(MixtureEstimator):
    """Posterior sampling of partitions of leaves under a DP or NGGP mixture (Lee and Choi 2015).

    Parameters
    ----------
    prior : {"dp", "nggp"}
        Dirichlet process (u integrated out) or normalized generalized gamma process (u sampled).
    alpha : float
        Concentration (mass) parameter, > 0.
    sigma : float
        NGGP discount, 0 < sigma < 1 (ignored for the DP).
    family : str, dict, Family or ProductFamily
        Likelihood family with its prior; a name or mapping (as ``MAPDP``'s) fits the prior to X.
    method : {"tgmcmc", "gibbs", "split-merge"}
    n_iter : int
        Iterations in total, burn-in included (tgMCMC: G global moves, ``n_local`` local moves and
        an update of u; Gibbs: one scan; split-merge: G moves and one Gibbs scan).
    burn_in : int
        Iterations discarded before samples are kept.
    thin : int
        Keep every ``thin``-th iteration after burn-in.
    G : int
        Global (or split-merge) moves per iteration (Lee and Choi 2015: G = 20).
    D : int
        Rounds of SampleSub choosing the leaf of a local move (Lee and Choi 2015: D = 2).
    n_local : int or None
        Local moves per sweep; default ceil(n_leaves / 2^D).
    local : {"uniform", "tree"}
        A local move's leaf picked uniformly, or through the trees with the Metropolis-Hastings
        correction (Lee and Choi 2015, Section 3.3; slower).
    tree : {"seqinsert", "cascade"}
        The clusters' canonical trees: leaves inserted by SeqInsert, or put on top of each other
        (Lee and Choi 2015, Section 4.1).
    max_depth : int
        Levels SeqInsert may descend.
    split_new : bool
        Whether StocInsert may open new clusters during a split.
    dissimilarity : {"tree", "hypothesis"}
        d(c, c') from the trees' potentials (Lee and Choi 2015) or single-cluster potentials.
    redraw : bool
        Redraw the order that shapes the canonical trees every iteration (else once per chain).
    moves : {"all", "global", "local"}
        Restrict tgMCMC to one move type.
    n_launch : int
        Intermediate restricted Gibbs scans of the split-merge sampler.
    init : {"ibhc", "top", "one", "singletons"} or array-like of shape (n_leaves,)
        Initial partition: IBHC (three passes, best bound of eq. 10), one "put on top" pass, one
        cluster, one cluster per leaf, or given labels.
    n_u_steps : int
        Slice-sampling updates of u per iteration (NGGP).
    random_state : None, int or numpy.random.SeedSequence
    prior_scale, tune : as ``MAPDP``

    Attributes
    ----------
    samples_ : ndarray of shape (n_kept, n_leaves)
        Kept partitions, clusters numbered in order of their first leaf.
    log_joint_ : ndarray of shape (n_iter,)
        log p(X, Pi, u) after every iteration (Lee and Choi 2015, eq. 4).
    log_joint_marginal_ : ndarray of shape (n_iter,)
        log p(X, Pi) with u integrated out.
    n_clusters_trace_, u_trace_ : ndarray of shape (n_iter,)
    acceptance_rate_, mean_log_acceptance_ : dict
        Accepted / proposed, and mean of min(log r, 0), per move type.
    labels_ : ndarray of shape (n_leaves,)
        The kept sample with the highest ``log_joint_marginal_``.
    coclustering_ : ndarray of shape (n_leaves, n_leaves)
        Fraction of kept samples in which two leaves share a cluster.
    ess_n_clusters_ : float
        Effective sample size of the number of clusters.
    init_labels_ : ndarray of shape (n_leaves,)
    cluster_stats_ : ndarray of shape (n_clusters, n_stats)
        Statistics of the clusters of ``labels_``, for the DPM predictive (``prior="dp"``).
    cluster_sizes_ : ndarray of shape (n_clusters,)
    family_, n_leaves_, n_clusters_, alpha_, n_features_in_, feature_names_in_
    """

    # a given prior needs no data to be set, and one leaf is a (trivial) chain
    _always_informative = False
    _widened_spec = True
    _model_extras: ClassVar[tuple[str, ...]] = ("ess_n_clusters_",)

    def __init__(
        self,
        prior: str = "dp",
        alpha: float = 1.0,
        sigma: float = 0.5,
        family: str | Family | ProductFamily = "gaussian",
        method: str = "tgmcmc",
        n_iter: int = 200,
        burn_in: int = 50,
        thin: int = 1,
        G: int = 20,
        D: int = 2,
        n_local: int | None = None,
        local: str = "uniform",
        tree: str = "seqinsert",
        max_depth: int = 32,
        split_new: bool = True,
        dissimilarity: str = "tree",
        redraw: bool = True,
        moves: str = "all",
        n_launch: int = 5,
        init: str | ArrayLike = "ibhc",
        n_u_steps: int = 5,
        random_state: Any = None,
        prior_scale: float | None = None,
        tune: str | None = None,
    ) -> None:
        config.keep_params(self, locals())

    def _fit(self, Xa: FloatArray, pp: FloatArray) -> None:
        """Sample partitions of the encoded records: each record is a leaf."""
        self._sample(self._record_leaves(Xa), self.family_, pp)

    def fit_summaries(
        self, stats: ArrayLike, family: Family | ProductFamily | None = None
    ) -> TreeGuidedMCMC:
        """Sample partitions of leaf summaries ``stats`` (n_leaves, n_stats) of ``family``
        (default the ``family`` parameter, then an object); ``stats[:, 0]`` are record counts."""
        pp = self._check_params()
        st, prod = self._summaries_input(stats, family)
        self._sample(st, prod, pp)
        return self

    def _sample(self, st: FloatArray, prod: ProductFamily, pp: FloatArray) -> None:
        chain = self._start(st, prod, pp)
        n_kept = len(range(self.burn_in, self.n_iter, self.thin))
        out_z = np.zeros((n_kept, chain.L), dtype=np.int64)
        out_lj = np.zeros(self.n_iter)
        out_K = np.zeros(self.n_iter, dtype=np.int64)
        out_u = np.zeros(self.n_iter)
        chain.run(self.n_iter, self.burn_in, self.thin, out_z, out_lj, out_K, out_u)
        self._finish(
            chain,
            prod,
            out_z,
            out_lj,
            out_K,
            out_u,
            kept_idx=np.arange(self.burn_in, self.n_iter, self.thin),
        )

    def _check_params(self) -> FloatArray:
        """Every parameter that needs no data; returns the kernels' prior array."""
        pp = prior_array(self.prior, self.alpha, self.sigma)
        n_iter = config.check_int(self.n_iter, "n_iter")
        if not 0 <= int(self.burn_in) < n_iter:
            raise ValueError(f"burn_in must lie in [0, n_iter); got {self.burn_in}")
        config.check_int(self.thin, "thin")
        config.check_choice(self.method, METHODS, "method")
        if self.moves not in _MOVES[self.method]:
            raise ValueError(
                f"moves must be one of {_MOVES[self.method]} for {self.method!r}; "
                f"got {self.moves!r}"
            )
        for name in ("G", "D", "n_launch", "n_u_steps"):
            config.check_int(getattr(self, name), name, minimum=0)
        if self.n_local is not None:
            config.check_int(self.n_local, "n_local", minimum=0)
        config.check_int(self.max_depth, "max_depth")
        config.check_choice(self.local, ("tree", "uniform"), "local")
        config.check_choice(self.dissimilarity, ("tree", "hypothesis"), "dissimilarity")
        config.check_choice(self.tree, ("cascade", "seqinsert"), "tree")
        if isinstance(self.init, str):
            config.check_choice(self.init, INITS, "init")
        self._check_tuning()
        return pp

    def _start(self, st: FloatArray, prod: ProductFamily, pp: FloatArray) -> Chain:
        L = st.shape[0]
        n_local = math.ceil(L / 2 ** int(self.D)) if self.n_local is None else int(self.n_local)
        lm = leaf_log_marginals(st, prod)
        seq = seed_sequence(self.random_state)
        s_init, s_rank, s_chain = seq.spawn(3)
        n_tot = float(st[:, 0].sum())
        z0, u0 = self._initial_labels(st, prod, s_init)
        state = seed_state(s_chain)
        if pp[0] == prior_kernels.NGGP:
            u0 = float(prior_kernels.sample_u(state, u0, n_tot, float(z0.max() + 1), pp, 20))
        rank = np.random.default_rng(s_rank).permutation(L).astype(np.int64)
        self._settings = ChainSettings(
            self.method, int(self.G), int(self.D), n_local, self.moves, int(self.n_launch),
            int(self.n_u_steps), int(self.max_depth), self.local == "tree", self.tree,
            bool(self.split_new), self.dissimilarity == "tree", bool(self.redraw),
        )  # fmt: skip
        chain = Chain(self._settings, st, lm, z0, pp, prod, u0, rank, state)
        self.init_labels_ = z0
        self.n_leaves_ = L
        self._pp = pp
        self._n_records = n_tot
        return chain

    def _initial_labels(
        self, st: FloatArray, prod: ProductFamily, seq: np.random.SeedSequence
    ) -> tuple[IntArray, float]:
        """Initial labels and u (u = 1 unless IBHC chose one)."""
        L = st.shape[0]
        init = self.init
        if isinstance(init, str):
            if init not in INITS:
                raise ValueError(f"init must be one of {INITS} or labels; got {init!r}")
            if init == "one":
                return np.zeros(L, dtype=np.int64), 1.0
            if init == "singletons":
                return np.arange(L, dtype=np.int64), 1.0
            res = run_ibhc(
                st, prod, self.prior, self.alpha, self.sigma,
                mode="ibhc" if init == "ibhc" else "top", n_restarts=3 if init == "ibhc" else 1,
                random_state=seq,
            )  # fmt: skip
            return res.labels, res.u
        z = np.asarray(init)
        if z.shape != (L,) or not np.issubdtype(z.dtype, np.integer):
            raise ValueError(f"init labels must be integers of shape ({L},)")
        return canonical(z), 1.0

    def _finish(
        self,
        chain: Chain,
        prod: ProductFamily,
        out_z: IntArray,
        out_lj: FloatArray,
        out_K: IntArray,
        out_u: FloatArray,
        kept_idx: IntArray,
    ) -> None:
        self.samples_ = out_z
        self.log_joint_ = out_lj
        self.n_clusters_trace_ = out_K
        self.u_trace_ = out_u
        self.log_joint_marginal_ = self._marginal_joint(out_lj, out_K, out_u)
        acc = chain.acc
        names = ("split", "merge", "local") if chain.method == "tgmcmc" else ("split", "merge")
        if chain.method == "gibbs":
            self.acceptance_rate_ = {"gibbs": 1.0}
            self.mean_log_acceptance_ = {"gibbs": 0.0}
        else:
            self.acceptance_rate_ = {
                nm: float(acc[k, 1] / acc[k, 0]) if acc[k, 0] > 0 else float("nan")
                for k, nm in enumerate(names)
            }
            self.mean_log_acceptance_ = {
                nm: float(acc[k, 2] / (acc[k, 0] - acc[k, 3]))
                if acc[k, 0] > acc[k, 3]
                else float("nan")
                for k, nm in enumerate(names)
            }
        self.n_proposed_ = {nm: int(acc[k, 0]) for k, nm in enumerate(names)}
        self._chain = chain
        if out_z.shape[0] > 0:
            kept_marg = self.log_joint_marginal_[kept_idx]
            self.labels_ = out_z[int(np.argmax(kept_marg))].copy()
            self.coclustering_ = coclustering(out_z)
            self.ess_n_clusters_ = effective_sample_size(out_K[kept_idx])
        else:
            self.labels_ = self.init_labels_.copy()
            self.coclustering_ = coclustering(self.init_labels_[None, :])
            self.ess_n_clusters_ = 0.0
        self._set_clusters(self.labels_, float(self.alpha), leaf_stats=chain.stats)

    def _has_density(self) -> bool:
        return bool(self.prior == "dp")

    def _predict_encoded(self, Xa: FloatArray) -> IntArray:
        """The DPM's MAP cluster of each record given ``labels_`` (eq. 3.5), -1 for a new one
        (the DP only: the NGGP's predictive needs u)."""
        if self.prior != "dp":
            raise ValueError("predict needs prior='dp' (the NGGP predictive is not implemented)")
        return super()._predict_encoded(Xa)

    def _marginal_joint(self, lj: FloatArray, K: IntArray, u: FloatArray) -> FloatArray:
        """log p(X, Pi) from log p(X, Pi, u): remove eq. 4's u terms, add the u integral."""
        pp = self._pp
        if pp[0] == prior_kernels.DP:
            return lj.copy()
        n = self._n_records
        s = float(pp[2])
        out = np.empty_like(lj)
        cache: dict[int, float] = {}
        for t in range(lj.shape[0]):
            k = int(K[t])
            if k not in cache:
                cache[k] = float(nggp.log_u_integral(n, float(k), pp[1], s))
            ut = float(u[t])
            u_terms = float(nggp.log_u_factor(n, ut, pp[1], s)) + (k * s - n) * math.log1p(ut)
            out[t] = lj[t] - u_terms + cache[k]
        return out
