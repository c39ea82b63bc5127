"""The semiparametric mixed-effects model of seed 000 Section 7 (the estimator ``MixedEffectsDP`` is
in ``pipeline.estimators.mixed_effects``).

y_i = X_i beta_i + eps_i (eq. 7.1), eps_i ~ N(0, tau^-1 I), the random effects beta_i drawn from a
Dirichlet-process mixture of Gaussians N(mu_k, R_k^-1) with a Normal-Wishart prior on (mu_k, R_k)
(Appendix B's m0, c0, B0, a0), tau ~ Gamma(a_tau, b_tau). Fitted by iterated conditional modes
without collapsing the cluster parameters (``kernels.mixed_effects`` has the objective and why
every step lowers it): per subject the joint mode of its cluster and its beta_i (eq. 7.2), per
cluster the Normal-Wishart mode of (mu_k, R_k), then tau (eq. 7.3) and the concentration
(eq. A.1). A pass of the sweep returns additive statistics only (per cluster: count, sum of
beta_i, sum of beta_i beta_i^T; the residual sum of squares and the number of observations), so
the same driver step (``update``) serves this in-memory estimator and the distributed engine
(``pipeline.engines.mixed_effects``).

The driver step also merges two clusters when that lowers the objective with the beta_i fixed
(computed from the statistics alone): chunks of a distributed pass may each open a cluster for
the same subgroup, and the merge joins them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from scipy.special import gammaln

from kernels import mixed_effects as kme
from pipeline.core.config import (
    ALPHA_PRIOR,
    INIT_SAMPLE,
    check_alpha,
    check_positive,
)
from pipeline.core.errors import InputError
from pipeline.core.persist import register
from pipeline.models.concentration import log_gamma_prior, map_concentration

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
LOG_2PI = math.log(2.0 * math.pi)
DEFAULT_SHRINK = 10.0
DEFAULT_TAU_PRIOR = (1.0, 1e-3)
MIXED_INITS = ("auto", "one-cluster")
GAUSSIAN_PASSES = 30


class ArrayEq:
    """Field-by-field equality for dataclasses holding arrays (checkpoints compare states)."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for k, v in vars(self).items():
            w = getattr(other, k)
            if isinstance(v, np.ndarray) or isinstance(w, np.ndarray):
                if not np.array_equal(v, w):
                    return False
            elif v != w:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]


# -- the prior -----------------------------------------------------------------------------------


@register
@dataclass(eq=False)
class MixedPrior(ArrayEq):
    """Priors of the model: Normal-Wishart (m0 (p,), c0, T0 = B0^-1 (p, p), a0 > p) on each
    cluster's (mu_k, R_k); Gamma(a_tau, b_tau) (shape, rate) on tau; Gamma(alpha_a, alpha_b) on
    a learned concentration."""

    m0: FloatArray
    c0: float
    T0: FloatArray
    a0: float
    a_tau: float
    b_tau: float
    alpha_a: float = ALPHA_PRIOR[0]
    alpha_b: float = ALPHA_PRIOR[1]

    @property
    def p(self) -> int:
        return int(np.asarray(self.m0).shape[0])

    @property
    def logdet_T0(self) -> float:
        return float(np.linalg.slogdet(self.T0)[1])

    def mode(self) -> tuple[FloatArray, FloatArray, float]:
        """The prior's joint mode (mu0, R0, log|R0|): mu0 = m0, R0 = (a0 - p) B0."""
        R0 = (self.a0 - self.p) * np.linalg.inv(self.T0)
        R0 = 0.5 * (R0 + R0.T)
        return np.asarray(self.m0, dtype=np.float64).copy(), R0, float(np.linalg.slogdet(R0)[1])

    def log_nw(self, mu: FloatArray, R: FloatArray, logdet_R: float) -> float:
        return float(
            kme.nw_log_density(mu, R, logdet_R, self.m0, self.c0, self.T0, self.a0, self.logdet_T0)
        )


@register
@dataclass(eq=False)
class OLSMoments(ArrayEq):
    """The additive moments of ``kernels.mixed_effects.ols_moments`` (sum of two chunks' is the
    moments of their union)."""

    count: float
    rss: float
    dof: float
    n_obs: float
    s: FloatArray
    ss: FloatArray
    inv_sum: FloatArray
    XtX: FloatArray
    Xty: FloatArray
    yty: float

    @classmethod
    def of(
        cls,
        XtX: FloatArray,
        Xty: FloatArray,
        yty: FloatArray,
        n_obs: FloatArray,
        train: NDArray[np.bool_],
    ) -> OLSMoments:
        out = kme.ols_moments(XtX, Xty, yty, n_obs, train)
        vals: list[Any] = [float(v) if np.ndim(v) == 0 else np.asarray(v) for v in out]
        return cls(*vals)

    def __add__(self, other: OLSMoments) -> OLSMoments:
        pairs = zip(vars(self).values(), vars(other).values(), strict=True)
        vals: list[Any] = [a + b for a, b in pairs]
        return OLSMoments(*vals)

    def start_tau(self) -> float:
        """tau to start from: the within-subject least-squares precision, else the pooled one."""
        if self.dof > 0 and self.rss > 0:
            return self.dof / self.rss
        sol = np.linalg.lstsq(self.XtX, self.Xty, rcond=None)[0]
        rss = max(self.yty - float(sol @ self.Xty), 1e-12 * max(self.yty, 1.0))
        return max(self.n_obs - len(sol), 1.0) / rss


# -- the model and the driver's step -----------------------------------------------------------


@register
@dataclass(eq=False)
class MixedModel(ArrayEq):
    """The global part of a fit: clusters (statistics and modes), tau and the concentration."""

    n: FloatArray  # (K,)
    s: FloatArray  # (K, p)
    ss: FloatArray  # (K, p, p)
    mu: FloatArray  # (K, p)
    R: FloatArray  # (K, p, p)
    logdet_R: FloatArray  # (K,)
    log_nw: FloatArray  # (K,)
    tau: float
    alpha: float
    rss: float = 0.0
    n_obs: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_clusters(self) -> int:
        return int(self.n.shape[0])

    def slots(
        self, extra: int
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
        """Copies of the cluster arrays with room for ``extra`` new clusters (the sweep's)."""
        K, p = self.mu.shape
        mu = np.zeros((K + extra, p))
        R = np.zeros((K + extra, p, p))
        ld = np.zeros(K + extra)
        lnw = np.zeros(K + extra)
        nk = np.zeros(K + extra)
        mu[:K], R[:K], ld[:K], lnw[:K], nk[:K] = self.mu, self.R, self.logdet_R, self.log_nw, self.n
        return mu, R, ld, lnw, nk


def one_cluster_model(prior: MixedPrior, n_subjects: int, tau: float, alpha: float) -> MixedModel:
    """Algorithm 1's start: every subject in one cluster whose parameters are the prior's mode."""
    mu0, R0, ld0 = prior.mode()
    p = prior.p
    return MixedModel(
        np.array([float(n_subjects)]),
        np.zeros((1, p)),
        np.zeros((1, p, p)),
        mu0[None],
        R0[None],
        np.array([ld0]),
        np.array([prior.log_nw(mu0, R0, ld0)]),
        float(tau),
        float(alpha),
    )


def _cluster_mode(prior: MixedPrior, n: float, s: FloatArray, ss: FloatArray) -> tuple[Any, ...]:
    p = prior.p
    mu = np.empty(p)
    R = np.empty((p, p))
    ld = float(
        kme.nw_mode(n, s, ss, prior.m0, prior.c0, prior.T0, prior.a0, mu, R, np.empty((p, p)))
    )
    lnw = prior.log_nw(mu, R, ld)
    e = float(kme.cluster_energy(n, s, ss, mu, R, ld)) - lnw
    return mu, R, ld, lnw, e


def _crp_term(n: FloatArray, alpha: float, n_total: float) -> float:
    """-log p(z | N0), eq. 2.3."""
    return -float(
        gammaln(alpha) - gammaln(n_total + alpha) + len(n) * math.log(alpha) + gammaln(n).sum()
    )


@dataclass
class SweepStats:
    """What a sweep of a set of subjects returns (additive over chunks, slot by slot once the
    chunks' new clusters are given global slots): per slot the count, sum of E[beta_i], sum of
    E[beta_i beta_i^T] and log NW of the slot's parameters; the expected residual sum of squares,
    the number of observations and sum_i -log N(y_i | ...) of the training subjects."""

    n: FloatArray
    s: FloatArray
    ss: FloatArray
    log_nw: FloatArray
    rss: float
    n_obs: float
    nll: float


def objective_before(
    stats: SweepStats, model: MixedModel, prior: MixedPrior, learn_alpha: bool
) -> float:
    """E (``kernels.mixed_effects``) at the sweep's assignments and the parameters it used (the
    model's, and those of the clusters it opened)."""
    keep = stats.n > 0
    e = stats.nll + _crp_term(stats.n[keep], model.alpha, float(stats.n.sum()))
    e -= float(stats.log_nw[keep].sum())
    e -= log_gamma_prior(model.tau, prior.a_tau, prior.b_tau)
    if learn_alpha:
        e -= log_gamma_prior(model.alpha, prior.alpha_a, prior.alpha_b)
    return float(e)


def update(
    stats: SweepStats,
    model: MixedModel,
    prior: MixedPrior,
    learn_alpha: bool,
    merge: bool = True,
) -> tuple[MixedModel, IntArray, float, int]:
    """The driver's step after a sweep: the objective E at the sweep's assignments, then the
    M-step: drop empty clusters, merge pairs of clusters while a merge lowers the expected
    objective (the EM bound, so E cannot rise), the Normal-Wishart mode of each cluster, the mode
    of tau (eq. 7.3 with the expected residual sum of squares) and of the concentration (eq. A.1).

    Returns
    -------
    model : MixedModel
    mapping : (S,) int64
        Cluster of each slot in the new model (-1: an empty slot).
    objective : float
        E before the M-step (``objective_before``).
    n_merges : int
    """
    e = objective_before(stats, model, prior, learn_alpha)
    n, s, ss = stats.n, stats.s, stats.ss
    alpha = model.alpha
    keep = np.flatnonzero(n > 0)
    groups: list[list[int]] = [[int(k)] for k in keep]
    cn = [float(n[k]) for k in keep]
    cs = [s[k].copy() for k in keep]
    css = [ss[k].copy() for k in keep]
    modes = [_cluster_mode(prior, cn[j], cs[j], css[j]) for j in range(len(keep))]
    n_merges = 0
    while merge and len(groups) > 1:
        best, pair, merged = 0.0, (-1, -1), None
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                m = _cluster_mode(prior, cn[a] + cn[b], cs[a] + cs[b], css[a] + css[b])
                if not np.isfinite(m[4]):
                    continue
                gain = (
                    m[4]
                    - modes[a][4]
                    - modes[b][4]
                    + math.log(alpha)
                    - gammaln(cn[a] + cn[b])
                    + gammaln(cn[a])
                    + gammaln(cn[b])
                )
                if gain < best - 1e-9 * abs(m[4]):
                    best, pair, merged = gain, (a, b), m
        if merged is None:
            break
        a, b = pair
        groups[a] += groups[b]
        cn[a] += cn[b]
        cs[a] = cs[a] + cs[b]
        css[a] = css[a] + css[b]
        modes[a] = merged
        for lst in (groups, cn, cs, css, modes):
            del lst[b]  # type: ignore[attr-defined]
        n_merges += 1
    mapping = np.full(n.shape[0], -1, dtype=np.int64)
    for j, g in enumerate(groups):
        mapping[g] = j
    K = len(groups)
    p = prior.p
    N = float(sum(cn))
    tau = float(kme.tau_mode(stats.rss, stats.n_obs, prior.a_tau, prior.b_tau))
    if learn_alpha:
        alpha = map_concentration(round(N), K, prior.alpha_a, prior.alpha_b, start=alpha)
    new = MixedModel(
        np.array(cn, dtype=np.float64).reshape(K),
        np.array(cs, dtype=np.float64).reshape(K, p),
        np.array(css, dtype=np.float64).reshape(K, p, p),
        np.array([m[0] for m in modes]).reshape(K, p),
        np.array([m[1] for m in modes]).reshape(K, p, p),
        np.array([m[2] for m in modes], dtype=np.float64).reshape(K),
        np.array([m[3] for m in modes], dtype=np.float64).reshape(K),
        tau,
        float(alpha),
        float(stats.rss),
        float(stats.n_obs),
    )
    return new, mapping, e, n_merges


def should_stop(
    e_old: float, e_new: float, changed: int, n_train: int, tol: float, min_change: float
) -> str | None:
    """The stop rule, counted in subjects: the objective fell by at most ``tol * |E|`` (relative;
    a rise stops too) while at most ``min_change * n_train`` subjects changed cluster. Both are
    needed, unlike the mixture engines' rule (``pipeline.engines.base.stop_reason``): with no
    subject moving, beta_i, the clusters' parameters and tau still move towards each other's
    modes (as in EM), and stopping on the changes alone would stop short of those modes."""
    if changed > min_change * n_train or not math.isfinite(e_old):
        return None
    if e_old - e_new <= tol * abs(e_new):
        return "objective"
    return None


def predictive_components(model: MixedModel, prior: MixedPrior) -> tuple[Any, ...]:
    """Components of the eq. 3.4 analogue: the fitted clusters with weights N_k / (N + N0) and a
    new cluster at the prior's mode with weight N0 / (N + N0) (the cluster parameters are not
    collapsed, so a new cluster's are the prior's most probable ones)."""
    mu0, R0, ld0 = prior.mode()
    N = float(model.n.sum())
    mu = np.concatenate([model.mu, mu0[None]])
    R = np.concatenate([model.R, R0[None]])
    ld = np.concatenate([model.logdet_R, [ld0]])
    log_w = np.log(np.concatenate([model.n, [model.alpha]])) - math.log(N + model.alpha)
    return mu, R, ld, log_w


# -- the start: the Gaussian random-effects fit, the prior, the first partition -----------------


@dataclass
class Subjects:
    """A set of subjects' moments (a chunk's, or all of them in memory): X_i^T X_i (G, p, p),
    X_i^T y_i (G, p), y_i^T y_i and the number of observations (G,), whether each is fitted, and
    its subject code (the hash key of the start's sample)."""

    XtX: FloatArray
    Xty: FloatArray
    yty: FloatArray
    n_obs: FloatArray
    train: NDArray[np.bool_]
    codes: IntArray


MapChunks = Callable[..., list[Any]]


def start_moments(sub: Subjects) -> OLSMoments:
    return OLSMoments.of(sub.XtX, sub.Xty, sub.yty, sub.n_obs, sub.train)


def gaussian_estep(sub: Subjects, mu: FloatArray, R: FloatArray, tau: float) -> SweepStats:
    """E-step statistics of the one-cluster (Gaussian random effects) model: ``estep_sums`` with
    every training subject in the one cluster."""
    z = np.zeros(sub.Xty.shape[0], dtype=np.int64)
    beta = np.full(sub.Xty.shape, np.nan)
    ld = np.array([np.linalg.slogdet(R)[1]])
    out = kme.estep_sums(
        sub.XtX, sub.Xty, sub.yty, sub.n_obs, sub.train, z, mu[None], R[None], ld, tau, 1, beta
    )
    return SweepStats(out[0], out[1], out[2], np.zeros(1), *(float(v) for v in out[3:]))


def posterior_sample(
    sub: Subjects, mu: FloatArray, R: FloatArray, tau: float, n_total: int, size: int
) -> tuple[IntArray, FloatArray, FloatArray]:
    """The start's sample of training subjects (``sample_mask``) with the mean and covariance of
    their random effects' conditional (eq. 7.2) in the one-cluster fit: codes (S,), means (S, p),
    covariances (S, p, p)."""
    pick = sub.train & sample_mask(sub.codes, n_total, size)
    A = sub_precision(sub, R, tau, pick)
    V = np.linalg.inv(A)
    h = tau * sub.Xty[pick] + (R @ mu)[None]
    m = np.einsum("gab,gb->ga", V, h)
    return sub.codes[pick], np.asarray(m, dtype=np.float64), np.asarray(V, dtype=np.float64)


def sub_precision(sub: Subjects, R: FloatArray, tau: float, pick: NDArray[np.bool_]) -> FloatArray:
    """tau X_i^T X_i + R of the picked subjects (the conditional precision of eq. 7.2)."""
    return tau * sub.XtX[pick] + R[None]  # type: ignore[no-any-return]


def sample_mask(codes: IntArray, n_codes: int, size: int) -> NDArray[np.bool_]:
    """Subjects of the start's sample: all when there are at most ``size``, else those whose
    hash uniform of their code is below size / n (independent of the chunking)."""
    from pipeline.data.store import SAMPLE_SALT, row_uniform

    if n_codes <= size:
        return np.ones(codes.shape[0], dtype=bool)
    return row_uniform(codes, SAMPLE_SALT) < size / n_codes  # type: ignore[no-any-return]


@register
@dataclass(eq=False)
class GaussianFit(ArrayEq):
    """The Gaussian random-effects model (one cluster: what MixedLM fits), by EM: the mean and
    covariance of the random effects, tau, and -log p(y) per EM pass."""

    mu: FloatArray
    cov: FloatArray
    tau: float
    history: list[float] = field(default_factory=list)


def _floor_cov(cov: FloatArray, rel: float = 1e-6) -> FloatArray:
    cov = 0.5 * (cov + cov.T)
    w, V = np.linalg.eigh(cov)
    return (V * np.maximum(w, max(float(w.max()), 1e-12) * rel)) @ V.T  # type: ignore[no-any-return]


def fit_gaussian(
    map_chunks: MapChunks, mom: OLSMoments, max_iter: int = GAUSSIAN_PASSES, tol: float = 1e-6
) -> GaussianFit:
    """Maximum likelihood of the one-cluster model by EM over the chunks (``gaussian_estep``):
    mu = mean E[beta_i], Sigma = mean E[beta_i beta_i^T] - mu mu^T, tau = n_obs / E[RSS]. It
    starts from the pooled least-squares fit and the (noise-inflated) covariance of the subjects'
    own least-squares fits, so that the covariance shrinks from above: EM for variance
    components started too small crawls. Stops when -log p(y) falls by at most ``tol``
    relative."""
    p = mom.s.shape[0]
    mu = np.linalg.lstsq(mom.XtX, mom.Xty, rcond=None)[0]
    tau = mom.start_tau()
    if mom.count >= p + 1:
        m = mom.s / mom.count
        cov = (mom.ss - mom.count * np.outer(m, m)) / (mom.count - 1.0)
    else:
        cov = np.asarray(np.linalg.pinv(mom.XtX) * mom.n_obs / tau, dtype=np.float64)
    cov = _floor_cov(cov, 1e-3)
    history: list[float] = []
    for _ in range(max_iter):
        R = np.linalg.inv(cov)
        st = _add_stats(map_chunks(gaussian_estep, mu, 0.5 * (R + R.T), tau))
        history.append(st.nll)
        mu = st.s[0] / st.n[0]
        cov = _floor_cov(st.ss[0] / st.n[0] - np.outer(mu, mu))
        tau = st.n_obs / max(st.rss, 1e-300)
        if len(history) > 1 and history[-2] - history[-1] <= tol * abs(history[-1]):
            break
    return GaussianFit(np.asarray(mu, dtype=np.float64), cov, float(tau), history)


def _add_stats(results: list[SweepStats]) -> SweepStats:
    out = results[0]
    for r in results[1:]:
        out = SweepStats(
            out.n + r.n,
            out.s + r.s,
            out.ss + r.ss,
            out.log_nw,
            out.rss + r.rss,
            out.n_obs + r.n_obs,
            out.nll + r.nll,
        )
    return out


def empirical_prior(
    g: GaussianFit,
    shrink: float = DEFAULT_SHRINK,
    tau_prior: tuple[float, float | None] = (DEFAULT_TAU_PRIOR[0], None),
    alpha_prior: tuple[float, float] = ALPHA_PRIOR,
) -> MixedPrior:
    """The empirical-Bayes prior (Appendix A, option 1) from the Gaussian random-effects fit, as
    ``GaussianNW.empirical_bayes`` does for records: m0 = its mean, a0 = p + 2,
    E[R_k] = a0 B0 = (Sigma / shrink)^-1 (a cluster carries 1/shrink of the random effects'
    covariance Sigma), c0 = 1 / (shrink - 1) (the spread of the cluster means makes up the rest).
    ``tau_prior``'s rate None is 1e-3 / tau (weak, in y's units)."""
    p = g.mu.shape[0]
    a0 = p + 2.0
    T0 = a0 * g.cov / shrink
    a_tau, b_tau = tau_prior
    b = DEFAULT_TAU_PRIOR[1] / g.tau if b_tau is None else float(b_tau)
    return MixedPrior(
        g.mu.copy(), 1.0 / (shrink - 1.0), 0.5 * (T0 + T0.T), a0, float(a_tau), b, *alpha_prior
    )


def start_clusters(
    effects: FloatArray, prior: MixedPrior, alpha: float | str, seed: int
) -> IntArray:
    """The start's partition of the sampled subjects: collapsed MAP-DP (Algorithm 1,
    ``pipeline.models.mapdp.run_mapdp``, as one restart of ``MAPDP``) on their random effects'
    conditional means in the Gaussian fit, under
    the model's own Normal-Wishart prior; labels 0..K-1."""
    from pipeline.core.config import check_alpha
    from pipeline.core.seeds import as_seed_sequence
    from pipeline.families import GaussianNW, as_product
    from pipeline.models.mapdp import run_mapdp

    B0 = np.linalg.inv(prior.T0)
    fam = as_product(GaussianNW(m0=prior.m0, c0=prior.c0, B0=0.5 * (B0 + B0.T), a0=prior.a0))
    alpha0, learn = check_alpha(alpha)
    # as ``MAPDP(n_restarts=1, random_state=seed)``: the order is the first child seed's
    child = as_seed_sequence(seed).spawn(1)[0]
    order = np.random.default_rng(child).permutation(effects.shape[0]).astype(np.int64)
    ab = (float(prior.alpha_a), float(prior.alpha_b))
    res = run_mapdp(fam.arrange(effects), fam, order, alpha0, learn, ab, 100, 1e-6, "sequential")
    labels = np.asarray(res.labels, dtype=np.int64)
    return np.searchsorted(np.unique(labels), labels).astype(np.int64)


def start_model(
    m: FloatArray,
    V: FloatArray,
    labels: IntArray,
    prior: MixedPrior,
    tau: float,
    alpha: float | str,
) -> MixedModel:
    """The first model: the M-step (``update``, no merges) of the start's partition of the
    sample, from the conditional means and covariances of the Gaussian fit; its counts are the
    sample's (pseudo-counts for the first sweep)."""
    K = int(labels.max()) + 1
    p = prior.p
    n = np.bincount(labels, minlength=K).astype(np.float64)
    s = np.zeros((K, p))
    np.add.at(s, labels, m)
    ss = np.zeros((K, p, p))
    np.add.at(ss, labels, m[:, :, None] * m[:, None, :] + V)
    start_alpha, learn = check_alpha(alpha)
    placeholder = MixedModel(n, s, ss, s, ss, np.zeros(K), np.zeros(K), tau, start_alpha)
    stats = SweepStats(n, s, ss, np.zeros(K), 0.0, 0.0, 0.0)
    model = update(stats, placeholder, prior, learn, merge=False)[0]
    model.tau = float(tau)
    return model


@register
@dataclass(eq=False)
class StartState(ArrayEq):
    """The start of the ICM passes: the Gaussian fit, the prior, the first model, and the
    start's cluster of each sampled subject (codes (S,) sorted, labels (S,))."""

    gaussian: GaussianFit
    prior: MixedPrior
    model: MixedModel
    codes: IntArray
    labels: IntArray


def start(
    map_chunks: MapChunks,
    n_train: int,
    alpha: float | str,
    shrink: float = DEFAULT_SHRINK,
    tau_prior: tuple[float, float | None] = (DEFAULT_TAU_PRIOR[0], None),
    alpha_prior: tuple[float, float] = ALPHA_PRIOR,
    prior_overrides: dict[str, Any] | None = None,
    init: str = "auto",
    seed: int = 0,
    init_sample: int = INIT_SAMPLE,
) -> StartState:
    """Everything before the first ICM pass, over the chunks (``map_chunks(fn, *args)`` runs
    ``fn(subjects, *args)`` on every chunk's ``Subjects`` and returns the results in chunk
    order): the subjects' least-squares moments, the Gaussian random-effects fit (EM), the
    empirical prior, and the first partition ("auto": MAP-DP on a sample's conditional means;
    "one-cluster": Algorithm 1's single cluster)."""
    moms = map_chunks(start_moments)
    mom = moms[0]
    for other in moms[1:]:
        mom = mom + other
    g = fit_gaussian(map_chunks, mom)
    prior = override_prior(empirical_prior(g, shrink, tau_prior, alpha_prior), prior_overrides)
    R = np.linalg.inv(g.cov)
    R = 0.5 * (R + R.T)
    parts = map_chunks(posterior_sample, g.mu, R, g.tau, n_train, init_sample)
    codes = np.concatenate([c for c, _, _ in parts])
    m = np.concatenate([x for _, x, _ in parts])
    V = np.concatenate([v for _, _, v in parts])
    order = np.argsort(codes, kind="stable")
    codes, m, V = codes[order], m[order], V[order]
    if init == "one-cluster":
        labels = np.zeros(codes.shape[0], dtype=np.int64)
    else:
        labels = start_clusters(m, prior, alpha, seed)
    model = start_model(m, V, labels, prior, g.tau, alpha)
    return StartState(g, prior, model, codes, labels)


def override_prior(prior: MixedPrior, given: dict[str, Any] | None) -> MixedPrior:
    """The prior with the user's Normal-Wishart values ``{"m0", "c0", "B0", "a0"}`` in place of
    the empirical ones."""
    given = dict(given or {})
    unknown = set(given) - {"m0", "c0", "B0", "a0"}
    if unknown:
        raise ValueError(f"prior: unknown keys {sorted(unknown)} (m0, c0, B0, a0)")
    p = prior.p
    if "m0" in given:
        prior.m0 = np.asarray(given["m0"], dtype=np.float64).reshape(p)
    if "c0" in given:
        prior.c0 = check_positive(given["c0"], "prior c0")
    if "a0" in given:
        a0 = float(given["a0"])
        if not a0 > p:
            raise ValueError(f"prior a0 must exceed p = {p}, got {given['a0']!r}")
        prior.T0 = prior.T0 * a0 / prior.a0  # keep E[R] = a0 B0
        prior.a0 = a0
    if "B0" in given:
        B0 = np.asarray(given["B0"], dtype=np.float64).reshape(p, p)
        prior.T0 = np.asarray(np.linalg.inv(0.5 * (B0 + B0.T)), dtype=np.float64)
    return prior


# -- input checks shared by the estimator and ``dpmm longitudinal`` ---------------------


def _bad_value(values: Any, name: str, what: str) -> None:
    """InputError naming the first row of ``values`` that is not a finite number."""
    num = pd.to_numeric(pd.Series(np.asarray(values, dtype=object)), errors="coerce")
    arr = num.to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        r = int(bad[0])
        raw = np.asarray(values, dtype=object)[r]
        more = f" (and {bad.size - 1} more rows)" if bad.size > 1 else ""
        problem = "missing" if pd.isna(raw) else f"{raw!r} is not a finite number"
        raise InputError(f"{what} {name!r}, row {r}: {problem}{more}")


def _as_numeric_column(values: Any, name: str, what: str) -> FloatArray:
    arr = np.asarray(values)
    if arr.dtype.kind in "fiub":
        out = arr.astype(np.float64)
        if np.isfinite(out).all():
            return out
    _bad_value(values, name, what)
    return np.asarray(values, dtype=np.float64)


# -- the ICM loop shared by the estimator -----------------------------------------------------


@dataclass
class SubjectFit:
    model: MixedModel
    z: IntArray
    beta: FloatArray


def sweep_subjects(
    XtX: FloatArray,
    Xty: FloatArray,
    yty: FloatArray,
    n_obs: FloatArray,
    train: NDArray[np.bool_],
    z: IntArray,
    model: MixedModel,
    prior: MixedPrior,
) -> tuple[IntArray, FloatArray, int, SweepStats]:
    """One sweep of a set of subjects against the model (a chunk's work): their new clusters
    (slots: the model's K, then the clusters the sweep opened), their eq. 7.2 modes in those
    clusters, the number that changed cluster, and the additive statistics."""
    G, p = Xty.shape
    mu, R, ld, lnw, nk = model.slots(int(train.sum()) + 1)
    mu0, R0, _ = prior.mode()
    z = z.copy()
    n_slots, changed = kme.sweep(
        XtX,
        Xty,
        yty,
        n_obs,
        train,
        z,
        mu,
        R,
        ld,
        lnw,
        nk,
        model.n_clusters,
        prior.m0,
        prior.c0,
        prior.T0,
        prior.a0,
        prior.logdet_T0,
        mu0,
        R0,
        model.tau,
        math.log(model.alpha),
    )
    beta = np.full((G, p), np.nan)
    n, s, ss, rss, nob, nll = kme.estep_sums(
        XtX, Xty, yty, n_obs, train, z, mu, R, ld, model.tau, n_slots, beta
    )
    stats = SweepStats(n, s, ss, lnw[:n_slots].copy(), float(rss), float(nob), float(nll))
    return z, beta, int(changed), stats


def final_effects(
    XtX: FloatArray,
    Xty: FloatArray,
    yty: FloatArray,
    n_obs: FloatArray,
    train: NDArray[np.bool_],
    z: IntArray,
    model: MixedModel,
) -> FloatArray:
    """The eq. 7.2 modes of the subjects' random effects in their clusters given the final
    parameters (nan for subjects in no cluster)."""
    beta = np.full(Xty.shape, np.nan)
    kme.estep_sums(
        XtX,
        Xty,
        yty,
        n_obs,
        train & (z >= 0),
        np.maximum(z, 0),
        model.mu,
        model.R,
        model.logdet_R,
        model.tau,
        model.n_clusters,
        beta,
    )
    return beta


def start_labels(sub: Subjects, codes: IntArray, labels: IntArray) -> IntArray:
    """The first sweep's current cluster of each subject: the start's label for the sampled
    subjects, -1 (none yet) for the others."""
    z = np.full(sub.codes.shape[0], -1, dtype=np.int64)
    if codes.size:
        pos = np.clip(np.searchsorted(codes, sub.codes), 0, codes.size - 1)
        hit = (codes[pos] == sub.codes) & sub.train
        z[hit] = labels[pos[hit]]
    return z


def icm_record(
    p: int, e: float, new: MixedModel, changed: int, merges: int, stop: str | None
) -> dict[str, Any]:
    return {
        "pass": p,
        "objective": e,
        "n_clusters": new.n_clusters,
        "n_changed": changed,
        "merges": merges,
        "tau": new.tau,
        "alpha": new.alpha,
        "stop": stop,
    }
