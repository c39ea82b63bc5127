"""Algorithm 1 of Raykov et al. 2016 in memory (``run_mapdp``: sweeps, split and merge moves,
learned concentration) and the seeding helpers shared by every sampler.

Kept apart from the scikit-learn estimator (``pipeline.estimators.mapdp``) so that Dask workers
running
the distributed passes never import scikit-learn: a worker process's first task would pay for
it (about a second) before sweeping a single record.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits

from kernels import mapdp as kmapdp
from kernels import partition as kpartition
from pipeline.core import config
from pipeline.core.diagnose import degenerate_fit, stop_reason
from pipeline.core.seeds import RESTART_SALT, row_uniform
from pipeline.families import FAMILIES, FloatArray, ProductFamily
from pipeline.models.concentration import log_gamma_prior, map_concentration

IntArray = NDArray[np.int64]
# the logdens of a sweep that scores nothing
_NO_SCORES = np.empty(0)


@dataclass
class MapdpResult:
    """One MAP-DP run: labels 0..K-1 and the cluster statistics (K, S)."""

    labels: IntArray
    stats: FloatArray
    alpha: float
    objective: float
    history: list[float] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = False
    seconds: float = 0.0
    # with missing cells (``fit_missing``): the completed records (N, D) the statistics are of
    completed: FloatArray | None = None

    @property
    def nk(self) -> FloatArray:
        """Cluster sizes (K,): the statistics' counts."""
        return np.ascontiguousarray(self.stats[:, 0])


#: above this many columns ``principal_axis`` iterates instead of decomposing the covariance
EIGH_MAX_COLS = 64
POWER_STEPS = 30


def principal_axis(Xc: FloatArray) -> FloatArray | None:
    """The direction of largest variance of the centred rows Xc (n, d), shape (d,), or None when
    they are not finite: the covariance's top eigenvector up to ``EIGH_MAX_COLS`` columns, else
    ``POWER_STEPS`` power iterations (a split only needs a rough direction)."""
    d = Xc.shape[1]
    if d <= EIGH_MAX_COLS:
        cov = Xc.T @ Xc / Xc.shape[0]
        if not np.all(np.isfinite(cov)):
            return None
        return np.linalg.eigh(cov)[1][:, -1]
    if not np.all(np.isfinite(Xc)):
        return None
    var = np.einsum("ij,ij->j", Xc, Xc)
    v = np.zeros(d)
    v[int(np.argmax(var))] = 1.0
    for _ in range(POWER_STEPS):
        w = Xc.T @ (Xc @ v)
        norm = float(np.linalg.norm(w))
        if not norm > 0:
            break
        v = w / norm
    return v


def try_split(
    Xa: FloatArray,
    members: IntArray,
    family: ProductFamily,
    log_alpha: float,
    empty_c: FloatArray,
    max_sweeps: int = 10,
) -> tuple[float, IntArray, FloatArray] | None:
    """A split move for one cluster: two halves along its principal axis, refined by MAP-DP
    sweeps restricted to them. Returns (gain, side, stats2): the decrease of E (eq. 3.3), side
    (n_members,) in {0, 1} and the halves' statistics (2, S); None when a half empties."""
    n = members.shape[0]
    if n < 4:
        return None
    Xs = np.ascontiguousarray(Xa[members])
    Xc = Xs - Xs.mean(axis=0)
    axis = principal_axis(Xc)
    if axis is None:
        return None
    side = (Xc @ axis > 0).astype(np.int64)
    if side.min() == side.max():
        return None
    stats2 = family.stats_of(Xs, side, 2)
    cache2 = family.cache_of(stats2)
    nk2 = stats2[:, 0].copy()
    order = np.arange(n, dtype=np.int64)
    n_slots = 2
    for _ in range(max_sweeps):
        # N0 = 0 (log N0 = -inf): a new cluster is never an option inside the restricted sweep
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
            0.0,
            _NO_SCORES,
        )
        if changed == 0:
            break
    if n_slots != 2 or nk2[0] == 0 or nk2[1] == 0:
        return None
    gain = -float(kpartition.merge_gap(stats2[0], stats2[1], family.spec, family.prior, log_alpha))
    return gain, side, stats2[:2].copy()


SplitMemo = dict[tuple[int, int], tuple[IntArray, tuple[float, IntArray, FloatArray] | None]]


def _memo_split(
    Xa: FloatArray,
    members: IntArray,
    family: ProductFamily,
    log_alpha: float,
    empty_c: FloatArray,
    memo: SplitMemo | None,
) -> tuple[float, IntArray, FloatArray] | None:
    """``try_split``, remembered across the rounds of one run by the cluster's members (the
    restricted sweeps see only them and the prior); only the gain is computed again."""
    if memo is None:
        return try_split(Xa, members, family, log_alpha, empty_c)
    key = (int(members.shape[0]), hash(members.tobytes()))
    hit = memo.get(key)
    if hit is not None and np.array_equal(hit[0], members):
        res = hit[1]
        if res is None:
            return None
        _, side, stats2 = res
        gap = kpartition.merge_gap(stats2[0], stats2[1], family.spec, family.prior, log_alpha)
        return -float(gap), side, stats2
    res = try_split(Xa, members, family, log_alpha, empty_c)
    memo[key] = (members.copy(), res)
    return res


def split_merge(
    Xa: FloatArray,
    z: IntArray,
    stats: FloatArray,
    family: ProductFamily,
    alpha: float,
    memo: SplitMemo | None = None,
) -> tuple[FloatArray, bool]:
    """One round of split moves (``try_split``) then greedy merges, each taken only if it lowers
    E (eq. 3.3): moves one-record ICM sweeps cannot make. ``z`` is relabelled in place; returns
    the new statistics (K', S) and whether anything changed. ``memo``: see ``_memo_split``."""
    log_alpha = math.log(alpha)
    empty_c = family.empty_cache()
    K = stats.shape[0]
    rows = [stats[k] for k in range(K)]
    changed = False
    order = np.argsort(z, kind="stable")
    bounds = np.searchsorted(z[order], np.arange(K + 1))
    for k in range(K):
        members = order[bounds[k] : bounds[k + 1]]
        res = _memo_split(Xa, members, family, log_alpha, empty_c, memo)
        if res is not None and res[0] > 1e-9:
            _gain, side, stats2 = res
            rows[k] = stats2[0]
            rows.append(stats2[1])
            z[members[side == 1]] = len(rows) - 1
            changed = True
    new_stats = np.vstack(rows)
    target, merged, n_merges = kpartition.greedy_merge(
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
    z0: IntArray | None = None,
) -> MapdpResult:
    """Algorithm 1 of Raykov et al. 2016 on arranged records ``Xa`` (N, D), visiting them in
    ``order``, from labels ``z0`` (N,) or ``init``.

    Each iteration is one ``kernels.mapdp.sweep``, then with ``learn_alpha`` the mode of eq. A.1.
    The objective is eq. 3.3 (plus -log p(N0) when learned); after convergence up to
    ``max_moves`` rounds of split and merge moves are tried. Every step lowers it or leaves it.
    """
    t0 = time.perf_counter()
    N = Xa.shape[0]
    spec, prior = family.spec, family.prior
    empty_c = family.empty_cache()
    if z0 is not None:
        # a warm start from labels 0..K-1 (the missing cells' ICM rounds, ``fit_missing``)
        z = np.array(z0, dtype=np.int64)
        stats = family.stats_of(Xa, z, int(z.max()) + 1)
        nk = stats[:, 0].copy()
        n_slots = stats.shape[0]
    elif init == "one-cluster":
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
    memo: SplitMemo = {}
    it = 0
    for it in range(1, max_iter + 1):
        stats, cache, nk, n_slots, n_changed = kmapdp.sweep(
            Xa, order, z, stats, cache, nk, n_slots, spec, prior, empty_c, alpha, _NO_SCORES
        )
        stats, cache, nk = kmapdp.compact(z, stats, cache, nk, n_slots)
        n_slots = stats.shape[0]
        if learn_alpha:
            alpha = map_concentration(N, n_slots, a, b, start=alpha)
        e_new = energy(stats, nk, n_slots, alpha)
        stalled = stop_reason(e_old, e_new, n_changed, tol) is not None
        if stalled and moves < max_moves:
            moves += 1
            stats, moved = split_merge(Xa, z, stats, family, alpha, memo)
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
        alpha=alpha,
        objective=history[-1],
        history=history,
        n_iter=it,
        converged=converged,
        seconds=time.perf_counter() - t0,
    )


#: at most this many rounds of imputation and sweeps (``fit_missing``)
MAX_ICM_ROUNDS = 10


def fit_missing(
    Xa: FloatArray, family: ProductFamily, fit: Callable[[FloatArray, IntArray | None], MapdpResult]
) -> MapdpResult:
    """MAP-DP with missing cells (NaN in ``Xa`` (N, D)) as latent variables set by iterated
    conditional modes, as Algorithm 1 sets the assignments (Raykov et al. 2016, Section 3).

    The cells start at the prior predictive's conditional mode; then, in turn, ``fit(X, z0)``
    sweeps with the cells fixed, each record with holes moves to its MAP cluster on its observed
    cells (``dpm_predict``), and each hole is set to its conditional mode given its cluster,
    until a round changes nothing or after ``MAX_ICM_ROUNDS``.
    """
    none = np.full(Xa.shape[0], -1, dtype=np.int64)
    Xf = family.impute(Xa, family.empty_stats(), none)
    res = fit(Xf, None)
    partial = np.flatnonzero(np.isnan(Xa).any(axis=1))
    for _ in range(MAX_ICM_ROUNDS):
        # records with missing cells choose their cluster on their observed cells: scored on
        # the completed record, records imputed onto one cluster's regression plane would make
        # a tight cluster of their own
        z = res.labels.copy()
        lab = dpm_predict(np.ascontiguousarray(Xa[partial]), res.stats, res.alpha, family)[0]
        z[partial] = np.where(lab >= 0, lab, z[partial])
        z = np.unique(z, return_inverse=True)[1].ravel().astype(np.int64)
        Xn = family.impute(Xa, family.stats_of(Xf, z, int(z.max()) + 1), z)
        if np.array_equal(Xn, Xf) and np.array_equal(z, res.labels):
            break
        Xf = Xn
        res = fit(Xf, z)
    res.completed = Xf
    return res


def auto_restarts(n: int) -> int:
    """The restarts of ``n_restarts="auto"`` for n records (``MAPDP``'s docstring)."""
    return config.AUTO_RESTARTS if n <= config.AUTO_RESTARTS_ROWS else 1


def fit_restarts(
    Xa: FloatArray,
    family: ProductFamily,
    seq: np.random.SeedSequence,
    n_restarts: int,
    run_args: tuple[float, bool, tuple[float, float], int, float, str],
    verbose: bool = False,
) -> tuple[MapdpResult, list[float], list[float]]:
    """``MAPDP``'s fit of arranged records Xa (N, D): ``n_restarts`` runs of ``run_mapdp``
    (``run_args``: alpha, learn_alpha, alpha_prior, max_iter, tol, init) over permutations drawn
    from ``seq``, each of the records but the ``config.RESTART_HOLDOUT`` hash share; the one whose
    clusters give that share the highest mean log predictive density (eq. 3.4) continues on all.
    Missing cells are set by ``fit_missing``. Returns the result, each restart's objective and
    its held-out score (empty with one restart)."""
    N = Xa.shape[0]
    objectives: list[float] = []
    scores: list[float] = []
    orders = [
        np.random.default_rng(child).permutation(N).astype(np.int64)
        for child in seq.spawn(n_restarts)
    ]
    hold = row_uniform(np.arange(N), RESTART_SALT) < config.RESTART_HOLDOUT
    keep = np.flatnonzero(~hold)

    def run(X: FloatArray, order: IntArray, r: int, z0: IntArray | None) -> MapdpResult:
        def cb(it: int, e: float, k: int) -> None:
            print(f"restart {r} iteration {it}: objective {e:.6g}, {k} clusters")

        return run_mapdp(X, family, order, *run_args, cb if verbose else None, z0=z0)

    def fit(X: FloatArray, z0: IntArray | None) -> MapdpResult:
        if z0 is not None or len(orders) == 1 or not 0 < keep.size < N:
            # one run, or a warm start of the winner (missing cells' later rounds)
            res = run(X, orders[0], 0, z0)
            objectives.extend([] if z0 is not None else [res.objective])
            return res
        where = np.cumsum(~hold) - 1  # a kept record's row among the kept
        for r, order in enumerate(orders):
            res = run(np.ascontiguousarray(X[keep]), where[order[~hold[order]]], r, None)
            objectives.append(res.objective)
            lab, ld = dpm_predict(np.ascontiguousarray(X[hold]), res.stats, res.alpha, family)
            scores.append(float(ld.mean()))
            if scores[-1] > max(scores[:-1], default=-np.inf):
                z = np.empty(N, dtype=np.int64)
                z[keep], z[hold] = res.labels, np.where(lab >= 0, lab, res.stats.shape[0])
                win = (order, np.unique(z, return_inverse=True)[1].ravel().astype(np.int64))
        return run(X, win[0], int(np.argmax(scores)), win[1])

    best = fit_missing(Xa, family, fit) if np.isnan(Xa).any() else fit(Xa, None)
    return best, objectives, scores


def choose_scale(Z: FloatArray, kind: str) -> dict[float, float]:
    """The objective (eq. 3.3 with -log p(N0)) that ``MAPDP``'s default fit (``fit_restarts``,
    seed 0) of the complete rows Z (n, d) of one Gaussian group ends with under the
    empirical-Bayes prior of ``kind`` ("gaussian" or "diag-gaussian") at each scale of
    ``config.PRIOR_SCALES``: -log p(Z, z, N0) at each prior's MAP partition, which compares the
    priors (``Schema.choose_scale`` keeps the lowest). A scale whose fit is degenerate
    (``degenerate_fit``: one cluster, or more than one per ``RECORDS_PER_CLUSTER`` rows) is
    left out: columns with point masses (glass's zeros) reward ever tighter clusters."""
    Z = np.ascontiguousarray(Z, dtype=np.float64)
    args = (1.0, True, config.ALPHA_PRIOR, config.MAX_ITER, config.TOL_IN_MEMORY, "sequential")

    def fit(s: float) -> MapdpResult:
        prior = FAMILIES[kind].empirical_bayes(Z, scale=s)  # type: ignore[call-arg]
        fam = ProductFamily([(prior, list(range(Z.shape[1])))])
        # each scale's own SeedSequence(0): spawn advances it, and every scale sees the same orders
        seq = np.random.SeedSequence(0)
        return fit_restarts(fam.arrange(Z), fam, seq, auto_restarts(len(Z)), args)[0]

    # the scales' fits are independent and their sweeps release the GIL: side by side, one
    # thread per core, with the same results. NumPy's BLAS on one thread, as on Dask's workers
    # (the nanny's pre-spawn-environ): the fits' calls are on d x d matrices, too small to
    # share, and a pool of BLAS threads only spins beside them. Digits' choice on two cores
    # (1,000 x 61): 6.8 s wall and 13.2 s CPU as it was, 6.4 and 6.4 with one BLAS thread, 3.4
    # and 6.5 side by side
    workers = min(len(config.PRIOR_SCALES), os.cpu_count() or 1)
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        fits = dict(zip(config.PRIOR_SCALES, pool.map(fit, config.PRIOR_SCALES), strict=True))
    return {
        s: res.objective
        for s, res in fits.items()
        if degenerate_fit(res.stats.shape[0], Z.shape[0]) is None
    }


def dpm_predict(
    Xa: FloatArray,
    stats: FloatArray,
    alpha: float,
    family: ProductFamily,
    cache: FloatArray | None = None,
    empty_c: FloatArray | None = None,
) -> tuple[IntArray, FloatArray]:
    """Eq. 3.5's MAP cluster (-1: a new one) and eq. 3.4's log predictive density of each
    arranged record of Xa (n, D) under clusters ``stats`` (K, S) and concentration ``alpha``.

    A record with missing cells is scored on its observed cells, every predictive marginalised
    exactly over the missing columns (``ProductFamily.restrict``); one with none observed has
    log density 0 and the largest cluster. ``cache`` (K, C) and ``empty_c`` (C,) may be passed.
    """
    nk = np.ascontiguousarray(stats[:, 0])
    miss = np.isnan(Xa)
    partial = miss.any(axis=1)
    n = Xa.shape[0]
    labels = np.empty(n, dtype=np.int64)
    logdens = np.empty(n)
    full = np.flatnonzero(~partial)
    if full.size:
        Xc = Xa if full.size == n else np.ascontiguousarray(Xa[full])
        lab, ld = kmapdp.predict(
            Xc,
            stats,
            family.cache_of(stats) if cache is None else cache,
            nk,
            family.spec,
            family.prior,
            family.empty_cache() if empty_c is None else empty_c,
            float(alpha),
        )
        if full.size == n:
            return lab, ld
        labels[full], logdens[full] = lab, ld
    rows_p = np.flatnonzero(partial)
    patterns, inverse = np.unique(miss[rows_p], axis=0, return_inverse=True)
    for p, pattern in enumerate(patterns):
        rows = rows_p[inverse.ravel() == p]
        if pattern.all():
            weights = np.append(nk, alpha)
            best = int(np.argmax(weights))
            labels[rows] = best if best < nk.shape[0] else -1
            logdens[rows] = 0.0
            continue
        sub, index = family.restrict(~pattern)
        st = np.ascontiguousarray(stats[:, index])
        lab, ld = kmapdp.predict(
            np.ascontiguousarray(Xa[np.ix_(rows, np.flatnonzero(~pattern))]),
            st,
            sub.cache_of(st),
            nk,
            sub.spec,
            sub.prior,
            sub.empty_cache(),
            float(alpha),
        )
        labels[rows], logdens[rows] = lab, ld
    return labels, logdens


def set_fitted(est: Any, best: Any, objectives: list[float], family: Any) -> None:
    """A mixture estimator's fitted attributes (``labels_``, ``cluster_stats_``, ...) from the
    winning run ``best`` (a ``DistributedResult``, or ``pipeline.models.mapdp.MapdpResult``: the
    same fields) and every restart's objective."""
    est.labels_ = best.labels
    est.cluster_stats_ = best.stats
    est.cluster_sizes_ = best.nk.astype(np.int64)
    est.n_clusters_ = int(best.stats.shape[0])
    est.n_iter_ = best.n_iter
    est.objective_ = best.objective
    est.objective_history_ = best.history
    est.restart_objectives_ = objectives
    est.alpha_ = best.alpha
    est._cache = family.cache_of(best.stats)
    est._empty_cache = family.empty_cache()
