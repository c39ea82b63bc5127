"""``MAPDP``: the scikit-learn-style estimator around the MAP-DP kernels (seed 000)."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from sklearn.base import BaseEstimator, ClusterMixin, DensityMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from kernels import mapdp as kmapdp
from pipeline.concentration import log_gamma_prior, map_concentration
from pipeline.families import Family, FloatArray, ProductFamily
from pipeline.schema import Schema, as_frame

IntArray = NDArray[np.int64]

AUTO_RESTARTS_MAX_N = 20_000


def seed_state(seq: np.random.SeedSequence) -> NDArray[np.uint64]:
    """A kernel RNG state (uint64 array of shape (1,)) from a SeedSequence."""
    return np.asarray(seq.generate_state(1, dtype=np.uint64), dtype=np.uint64)


def as_seed_sequence(random_state: Any) -> np.random.SeedSequence:
    """``random_state`` (None, int, SeedSequence or Generator) as a SeedSequence."""
    if isinstance(random_state, np.random.SeedSequence):
        return random_state
    if isinstance(random_state, np.random.Generator):
        return np.random.SeedSequence(int(random_state.integers(2**63)))
    if isinstance(random_state, np.random.RandomState):
        return np.random.SeedSequence(int(random_state.randint(2**31)))
    return np.random.SeedSequence(random_state)


@dataclass
class MapdpResult:
    """One MAP-DP run: labels 0..K-1 and the cluster statistics (K, S)."""

    labels: IntArray
    stats: FloatArray
    nk: FloatArray
    alpha: float
    objective: float
    history: list[float] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = False
    seconds: float = 0.0


def try_split(
    Xa: FloatArray,
    members: IntArray,
    family: ProductFamily,
    log_alpha: float,
    empty_c: FloatArray,
    max_sweeps: int = 10,
) -> tuple[float, IntArray, FloatArray] | None:
    """A split move for one cluster: two halves along its principal axis, refined by MAP-DP
    sweeps restricted to the two halves (no new cluster), scored by the exact objective.

    Returns
    -------
    (gain, side, stats2) or None
        ``gain`` is the decrease of E (eq. 3.3) if the cluster is replaced by the two halves
        (= -merge_gap of the halves), ``side`` (n_members,) in {0, 1}, ``stats2`` (2, S).
        None when the cluster is too small or a half empties.
    """
    n = members.shape[0]
    if n < 4:
        return None
    Xs = np.ascontiguousarray(Xa[members])
    Xc = Xs - Xs.mean(axis=0)
    cov = Xc.T @ Xc / n
    if not np.all(np.isfinite(cov)):
        return None
    axis = np.linalg.eigh(cov)[1][:, -1]
    side = (Xc @ axis > 0).astype(np.int64)
    if side.min() == side.max():
        return None
    stats2 = family.stats_of(Xs, side, 2)
    cache2 = family.cache_of(stats2)
    nk2 = stats2[:, 0].copy()
    order = np.arange(n, dtype=np.int64)
    n_slots = 2
    for _ in range(max_sweeps):
        # log N0 = -inf: a new cluster is never an option inside the restricted sweep
        stats2, cache2, nk2, n_slots, changed = kmapdp.sweep(
            Xs,
            order,
            side,
            stats2,
            cache2,
            nk2,
            n_slots,
            family.spec,
            family.prior,
            empty_c,
            -math.inf,
        )
        if changed == 0:
            break
    if n_slots != 2 or nk2[0] == 0 or nk2[1] == 0:
        return None
    gain = -float(kmapdp.merge_gap(stats2[0], stats2[1], family.spec, family.prior, log_alpha))
    return gain, side, stats2[:2].copy()


def split_merge(
    Xa: FloatArray, z: IntArray, stats: FloatArray, family: ProductFamily, alpha: float
) -> tuple[FloatArray, bool]:
    """One round of split moves (``try_split`` on every cluster) then greedy merges
    (``kernels.mapdp.greedy_merge``); a move is taken only if it lowers E (eq. 3.3).

    ICM sweeps cannot split a cluster that holds two groups, nor merge two clusters, one
    record at a time; these moves can, and keep the objective monotone. ``z`` is relabelled in
    place; returns the new statistics (K', S) and whether anything changed.
    """
    log_alpha = math.log(alpha)
    empty_c = family.empty_cache()
    K = stats.shape[0]
    rows = [stats[k] for k in range(K)]
    changed = False
    order = np.argsort(z, kind="stable")
    bounds = np.searchsorted(z[order], np.arange(K + 1))
    for k in range(K):
        members = order[bounds[k] : bounds[k + 1]]
        res = try_split(Xa, members, family, log_alpha, empty_c)
        if res is not None and res[0] > 1e-9:
            _gain, side, stats2 = res
            rows[k] = stats2[0]
            rows.append(stats2[1])
            z[members[side == 1]] = len(rows) - 1
            changed = True
    new_stats = np.vstack(rows)
    target, merged, n_merges = kmapdp.greedy_merge(
        new_stats, new_stats[:, 0].copy(), family.spec, family.prior, log_alpha
    )
    if n_merges:
        z[:] = target[z]
        changed = True
    return merged, changed


def run_mapdp(
    Xa: FloatArray,
    family: ProductFamily,
    order: IntArray,
    alpha: float,
    learn_alpha: bool,
    alpha_prior: tuple[float, float],
    max_iter: int,
    tol: float,
    init: str,
    callback: Callable[[int, float, int], None] | None = None,
    max_moves: int = 10,
) -> MapdpResult:
    """Algorithm 1 of seed 000 on arranged records ``Xa`` (N, D), visiting them in ``order``.

    Each iteration is one ``kernels.mapdp.sweep``; with ``learn_alpha`` the concentration is then
    set to the mode of eq. A.1 given N and K. The objective is -log p(X, z | N0) (eq. 3.3), plus
    -log p(N0) when N0 is learned, so that both steps can only lower it. When the sweeps have
    converged, up to ``max_moves`` rounds of split and merge moves (``split_merge``) are tried;
    if one is taken, sweeping resumes. Every step lowers the objective or leaves it.
    """
    t0 = time.perf_counter()
    N = Xa.shape[0]
    spec, prior = family.spec, family.prior
    empty_c = family.empty_cache()
    if init == "one-cluster":
        # Algorithm 1 starts with K = 1 and every record in it
        z = np.zeros(N, dtype=np.int64)
        stats = family.stats_of(Xa, z, 1)
        nk = np.array([float(N)])
        n_slots = 1
    elif init == "sequential":
        z = np.full(N, -1, dtype=np.int64)
        stats = np.zeros((8, family.n_stats))
        nk = np.zeros(8)
        n_slots = 0
    else:
        raise ValueError(f"init must be 'one-cluster' or 'sequential', got {init!r}")
    cache = family.cache_of(stats)
    a, b = alpha_prior

    def energy(stats_: FloatArray, nk_: FloatArray, n_slots_: int, alpha_: float) -> float:
        e = float(kmapdp.objective(stats_, nk_, n_slots_, spec, prior, alpha_))
        return e - log_gamma_prior(alpha_, a, b) if learn_alpha else e

    history: list[float] = []
    e_old = math.inf
    converged = False
    moves = 0
    it = 0
    for it in range(1, max_iter + 1):
        stats, cache, nk, n_slots, n_changed = kmapdp.sweep(
            Xa, order, z, stats, cache, nk, n_slots, spec, prior, empty_c, math.log(alpha)
        )
        stats, cache, nk = kmapdp.compact(z, stats, cache, nk, n_slots)
        n_slots = stats.shape[0]
        if learn_alpha:
            alpha = map_concentration(N, n_slots, a, b, start=alpha)
        e_new = energy(stats, nk, n_slots, alpha)
        stalled = n_changed == 0 or e_old - e_new < tol * abs(e_new)
        if stalled and moves < max_moves:
            moves += 1
            stats, moved = split_merge(Xa, z, stats, family, alpha)
            if moved:
                n_slots = stats.shape[0]
                nk = stats[:, 0].copy()
                cache = family.cache_of(stats)
                if learn_alpha:
                    alpha = map_concentration(N, n_slots, a, b, start=alpha)
                e_new = energy(stats, nk, n_slots, alpha)
                stalled = False
        history.append(e_new)
        if callback is not None:
            callback(it, e_new, n_slots)
        if stalled:
            converged = True
            break
        e_old = e_new
    return MapdpResult(
        labels=z,
        stats=stats,
        nk=nk,
        alpha=alpha,
        objective=history[-1],
        history=history,
        n_iter=it,
        converged=converged,
        seconds=time.perf_counter() - t0,
    )


class MAPDP(ClusterMixin, DensityMixin, BaseEstimator):
    """MAP-DP: approximate MAP inference for Dirichlet process mixtures (seed 000, Algorithm 1).

    Iterated conditional modes on the collapsed DPM: every record in turn goes to the cluster, or
    a new one, that maximises the complete-data likelihood (eq. 3.3); cluster parameters are
    integrated out and sufficient statistics are updated incrementally.

    Parameters
    ----------
    alpha : float or "learn", default="learn"
        DP concentration N0. A float keeps it fixed; "learn" sets it after every iteration to
        the MAP value under a Gamma(``alpha_prior``) prior (eq. A.1), starting from 1.
    family : "auto", str, dict, Family or ProductFamily, default="auto"
        Likelihood family per column (``pipeline.schema`` documents the "auto" rules). A
        ``Family``/``ProductFamily`` instance fixes the prior instead of the empirical-Bayes
        default and applies to numeric arrays.
    n_restarts : int or "auto", default="auto"
        Runs over random permutations of the records; the lowest objective wins. "auto" is 3
        up to ``AUTO_RESTARTS_MAX_N`` (20,000) records and 1 above: on large data the split and
        merge moves already took every restart we measured to the same optimum, and each
        restart costs a full fit.
    max_iter : int, default=100
        Maximum iterations (sweeps) per run.
    tol : float, default=1e-6
        A run stops when an iteration lowers the objective by less than ``tol * |objective|``
        (relative, as the distributed passes) or moves no record.
    init : {"sequential", "one-cluster"}, default="sequential"
        "sequential" starts with no cluster and assigns records in visiting order (the first
        iteration is then a sequential MAP pass); "one-cluster" starts with every record in one
        cluster, as Algorithm 1 writes it. Iterated conditional modes rarely leaves that start:
        a single record never gains by leaving a cluster that holds all the data.
    alpha_prior : (float, float), default=(2.0, 1.0)
        Shape and rate of the Gamma prior on N0 when ``alpha="learn"``. A shape above 1 keeps
        the mode of eq. A.1 away from 0 when K = 1, which would otherwise be absorbing.
    random_state : int, SeedSequence, Generator or None
        Seeds the permutations; a fixed value makes ``fit`` reproducible.
    verbose : int, default=0
        1 prints one line per iteration.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        Cluster of each training record, 0..K-1.
    n_clusters_ : int
    n_iter_ : int
        Iterations of the winning run.
    objective_ : float
        -log p(X, z | N0) of the winning run (plus -log p(N0) when learned).
    objective_history_ : list of float
        Objective after each iteration of the winning run; never increases.
    restart_objectives_ : list of float
    alpha_ : float
        Concentration used (the learned one with ``alpha="learn"``).
    cluster_sizes_ : ndarray of shape (n_clusters,)
    cluster_stats_ : ndarray of shape (n_clusters, n_stats)
        Additive sufficient statistics of each cluster.
    family_ : ProductFamily
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a DataFrame.
    """

    def __init__(
        self,
        alpha: float | str = "learn",
        family: Any = "auto",
        n_restarts: int | str = "auto",
        max_iter: int = 100,
        tol: float = 1e-6,
        init: str = "sequential",
        alpha_prior: tuple[float, float] = (2.0, 1.0),
        random_state: Any = None,
        verbose: int = 0,
    ):
        self.alpha = alpha
        self.family = family
        self.n_restarts = n_restarts
        self.max_iter = max_iter
        self.tol = tol
        self.init = init
        self.alpha_prior = alpha_prior
        self.random_state = random_state
        self.verbose = verbose

    # -- input -------------------------------------------------------------------------------
    def _check_params(self) -> tuple[float, bool]:
        if isinstance(self.alpha, str):
            if self.alpha != "learn":
                raise ValueError(f"alpha must be a positive float or 'learn', got {self.alpha!r}")
            alpha, learn = 1.0, True
        else:
            alpha, learn = float(self.alpha), False
            if not (alpha > 0 and math.isfinite(alpha)):
                raise ValueError(f"alpha must be a positive finite float, got {self.alpha!r}")
        if self.n_restarts != "auto" and (
            isinstance(self.n_restarts, str) or int(self.n_restarts) < 1
        ):
            raise ValueError(f"n_restarts must be 'auto' or >= 1, got {self.n_restarts!r}")
        if int(self.max_iter) < 1:
            raise ValueError(f"max_iter must be >= 1, got {self.max_iter}")
        if not self.tol >= 0:
            raise ValueError(f"tol must be >= 0, got {self.tol}")
        a, b = self.alpha_prior
        if not (a > 0 and b > 0):
            raise ValueError(f"alpha_prior must be two positive numbers, got {self.alpha_prior}")
        return alpha, learn

    def _encode_fit(self, X: Any) -> FloatArray:
        family = self.family
        if isinstance(family, (Family, ProductFamily)):
            df, from_frame = as_frame(X)
            schema = Schema.infer(df, "gaussian", from_frame)
            Xe = schema.encode(df, fitting=True)
            prod = family.as_product() if isinstance(family, Family) else family
            if prod.n_cols != Xe.shape[1]:
                raise ValueError(
                    f"X has {Xe.shape[1]} features, but the family given models {prod.n_cols}"
                )
            schema.check_informative(Xe)
            schema.check_values(prod, Xe)
        else:
            df, from_frame = as_frame(X)
            schema = Schema.infer(df, family, from_frame)
            Xe = schema.encode(df, fitting=True)
            schema.check_informative(Xe)
            prod = schema.build_family(Xe)
        self.schema_ = schema
        self.family_ = prod
        self.n_features_in_ = Xe.shape[1]
        if from_frame:
            self.feature_names_in_ = np.asarray(schema.columns, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return prod.arrange(Xe)

    def _encode_predict(self, X: Any) -> FloatArray:
        check_is_fitted(self, "family_")
        df, from_frame = as_frame(X)
        df = self.schema_.check_columns(df, from_frame, type(self).__name__)
        Xe = self.schema_.encode(df, fitting=False)
        self.schema_.check_values(self.family_, Xe)
        return self.family_.arrange(Xe)

    # -- fitting -----------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None) -> MAPDP:
        """Fit MAP-DP to X.

        Parameters
        ----------
        X : array-like or DataFrame of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self
        """
        import dask

        if dask.is_dask_collection(X):
            # the distributed code path: one Dask task per chunk per pass (pipeline.distributed)
            from pipeline.distributed import fit_estimator

            return fit_estimator(self, X)
        alpha0, learn = self._check_params()
        Xa = self._encode_fit(X)
        N = Xa.shape[0]
        seq = as_seed_sequence(self.random_state)
        best: MapdpResult | None = None
        objectives = []
        n_restarts = (
            (3 if N <= AUTO_RESTARTS_MAX_N else 1)
            if self.n_restarts == "auto"
            else int(self.n_restarts)
        )
        for r, child in enumerate(seq.spawn(n_restarts)):
            order = np.random.default_rng(child).permutation(N).astype(np.int64)
            cb = None
            if self.verbose:

                def cb(it: int, e: float, k: int, r: int = r) -> None:
                    print(f"restart {r} iteration {it}: objective {e:.6g}, {k} clusters")

            res = run_mapdp(
                Xa,
                self.family_,
                order,
                alpha0,
                learn,
                tuple(self.alpha_prior),  # type: ignore[arg-type]
                int(self.max_iter),
                float(self.tol),
                self.init,
                cb,
            )
            objectives.append(res.objective)
            if best is None or res.objective < best.objective:
                best = res
        assert best is not None
        if not best.converged:
            warnings.warn(
                f"MAP-DP did not converge in max_iter={self.max_iter} iterations; "
                "increase max_iter or tol",
                ConvergenceWarning,
                stacklevel=2,
            )
        self.labels_ = best.labels
        self.cluster_stats_ = best.stats
        self.cluster_sizes_ = best.nk.astype(np.int64)
        self.n_clusters_ = int(best.stats.shape[0])
        self.n_iter_ = best.n_iter
        self.objective_ = best.objective
        self.objective_history_ = best.history
        self.restart_objectives_ = objectives
        self.alpha_ = best.alpha
        self._cache = self.family_.cache_of(best.stats)
        self._empty_cache = self.family_.empty_cache()
        return self

    def fit_predict(self, X: Any, y: Any = None, **kwargs: Any) -> IntArray:
        """Fit and return ``labels_``."""
        return self.fit(X).labels_

    # -- prediction --------------------------------------------------------------------------
    def _predict_both(self, X: Any) -> tuple[IntArray, FloatArray]:
        Xa = self._encode_predict(X)
        labels, logdens = kmapdp.predict(
            Xa,
            self.cluster_stats_,
            self._cache,
            self.cluster_sizes_.astype(np.float64),
            self.family_.spec,
            self.family_.prior,
            self._empty_cache,
            float(self.alpha_),
        )
        return labels, logdens

    def predict(self, X: Any) -> IntArray:
        """MAP cluster of each record of X (eq. 3.5); -1 where a new cluster is most probable.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        return self._predict_both(X)[0]

    def score_samples(self, X: Any) -> FloatArray:
        """Log mixture predictive density of each record of X (eq. 3.4).

        Returns
        -------
        log_density : ndarray of shape (n_samples,)
        """
        return self._predict_both(X)[1]

    def score(self, X: Any, y: Any = None) -> float:
        """Mean log predictive density of X (eq. 3.4): the held-out likelihood per record."""
        return float(np.mean(self.score_samples(X)))

    # -- summaries ---------------------------------------------------------------------------
    def cluster_summary(self) -> pd.DataFrame:
        """One row per cluster: size, weight, and each family's posterior parameters."""
        check_is_fitted(self, "family_")
        names = self.schema_.names_of(self.family_)
        rows = []
        for k in range(self.n_clusters_):
            row: dict[str, Any] = {"cluster": k, "size": int(self.cluster_sizes_[k])}
            row["weight"] = self.cluster_sizes_[k] / (self.cluster_sizes_.sum() + self.alpha_)
            for (fam, _cols), nm, sl in zip(self.family_.groups, names, self._stat_slices()):
                row.update(fam.posterior_summary(self.cluster_stats_[k, sl], nm))
            rows.append(row)
        return pd.DataFrame(rows)

    def _stat_slices(self) -> list[slice]:
        spec = self.family_.spec
        return [slice(int(r[3]), int(r[3] + r[4])) for r in spec]

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        tags.non_deterministic = False
        return tags
