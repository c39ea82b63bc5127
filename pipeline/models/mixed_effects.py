"""The semiparametric mixed-effects model of Raykov et al. 2016, Section 7 (the estimator
``MixedEffectsDP`` is in ``pipeline.estimators.mixed_effects``).

y_i = X_i beta_i + eps_i (eq. 7.1), eps_i ~ N(0, tau^-1 I), beta_i from a DP mixture of Gaussians
with a Normal-Wishart prior (Appendix B), tau ~ Gamma(a_tau, b_tau); fitted by uncollapsed ICM
(``kernels.mixed_effects``). A sweep returns additive statistics only, so one driver step
(``update``: modes, eq. 7.3, eq. A.1, and merges that lower the objective) serves this in-memory
model and the distributed engine. The start is ``pipeline.models.mixed_effects_start``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from scipy.special import gammaln

from kernels import mixed_effects as kme
from pipeline.core.config import ALPHA_PRIOR
from pipeline.core.errors import InputError
from pipeline.core.persist import register
from pipeline.models.concentration import log_gamma_prior, map_concentration

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


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
            kme.nw_log_prior(mu, R, logdet_R, self.m0, self.c0, self.T0, self.a0, self.logdet_T0)
        )


@register
@dataclass(eq=False)
class OLSMoments(ArrayEq):
    """The additive moments of ``kernels.mixed_effects.ols_moments``."""

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


@dataclass
class SweepStats:
    """What a sweep of subjects returns, additive over chunks: per slot the count, sums of
    E[beta_i] and E[beta_i beta_i^T] and log NW; the expected residual sum of squares, the
    observations and sum_i -log N(y_i | ...) of the training subjects."""

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
    """E at the sweep's assignments and the parameters it used (the model's and its new ones)."""
    keep = stats.n > 0
    n, a, n_all = stats.n[keep], model.alpha, float(stats.n.sum())
    crp = gammaln(a) - gammaln(n_all + a) + len(n) * math.log(a) + gammaln(n).sum()
    e = stats.nll - float(crp)  # -log p(z | N0), eq. 2.3
    e -= float(stats.log_nw[keep].sum())
    e -= log_gamma_prior(model.tau, prior.a_tau, prior.b_tau)
    if learn_alpha:
        e -= log_gamma_prior(model.alpha, prior.alpha_a, prior.alpha_b)
    return float(e)


def update(
    stats: SweepStats, model: MixedModel, prior: MixedPrior, learn_alpha: bool, merge: bool = True
) -> tuple[MixedModel, IntArray, float, int]:
    """The driver's step after a sweep: E at the sweep's assignments, then the M-step (empty
    clusters dropped, pairs merged while that lowers the EM bound, the Normal-Wishart modes, tau
    by eq. 7.3, the concentration by eq. A.1).

    Returns
    -------
    model : MixedModel
    mapping : (S,) int64
        Cluster of each slot in the new model (-1: an empty slot).
    objective : float
        E before the M-step.
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
    """The stop rule, in subjects: E fell by at most ``tol * |E|`` (or rose) *and* at most
    ``min_change * n_train`` subjects changed cluster; unlike the mixtures, the parameters keep
    moving towards each other's modes with no subject moving."""
    if changed > min_change * n_train or not math.isfinite(e_old):
        return None
    if e_old - e_new <= tol * abs(e_new):
        return "objective"
    return None


def predictive_components(model: MixedModel, prior: MixedPrior) -> tuple[Any, ...]:
    """Components of the eq. 3.4 analogue: the fitted clusters with weights N_k / (N + N0) and a
    new cluster from the prior, weight N0 / (N + N0). Each precision (K + 1, p, p) is that of a
    new subject's beta under its cluster's Normal-Wishart posterior (c_k = c0 + N_k, a_k = a0 +
    N_k), not of the mode: covariance (1 + 1 / c_k) T_k / (a_k - p - 1), the mean's and the
    covariance's uncertainty added; on 16-50 subjects the mode's (T_k / (a_k - p)) understated
    the spread of new subjects (held-out density below lme4's on ``lme4::sleepstudy``)."""
    mu0, R0, ld0 = prior.mode()
    N = float(model.n.sum())
    p = prior.p
    c = np.append(prior.c0 + model.n, prior.c0)
    a = np.append(prior.a0 + model.n, prior.a0)
    # the modes' precisions are (a_k - p) T_k^-1; a given a0 <= p + 1 has no finite covariance
    f = c / (c + 1.0) * np.where(a > p + 1.0, (a - p - 1.0) / (a - p), 1.0)
    mu = np.concatenate([model.mu, mu0[None]])
    R = np.concatenate([model.R, R0[None]]) * f[:, None, None]
    ld = np.append(model.logdet_R, ld0) + p * np.log(f)
    log_w = np.log(np.concatenate([model.n, [model.alpha]])) - math.log(N + model.alpha)
    return mu, R, ld, log_w


# -- the subjects, and the records of the start (``pipeline.models.mixed_effects_start``) ----


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


@register
@dataclass(eq=False)
class GaussianFit(ArrayEq):
    """The Gaussian random-effects model (one cluster: what MixedLM fits), by EM: the mean and
    covariance of the random effects, tau, and -log p(y) per EM pass."""

    mu: FloatArray
    cov: FloatArray
    tau: float
    history: list[float] = field(default_factory=list)


@register
@dataclass(eq=False)
class StartState(ArrayEq):
    """The start of the ICM passes: the Gaussian fit, the prior, the first model, the start's
    cluster of each sampled subject (codes (S,) sorted, labels (S,)) and the prior's shrink with
    the evidence it was chosen by (``mixed_effects_start.choose_shrink``)."""

    gaussian: GaussianFit
    prior: MixedPrior
    model: MixedModel
    codes: IntArray
    labels: IntArray
    shrink: dict[str, Any] = field(default_factory=dict)


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


def check_within_subject(names: list[str], columns: list[Any], subjects: Any) -> None:
    """InputError for a covariate that varies within no subject: it duplicates the intercept
    inside every subject, so its random effect is not fitted by the subject's data."""
    frame = pd.DataFrame(dict(zip(names, columns, strict=True)))
    groups = frame.groupby(np.asarray(subjects), sort=False)
    repeated = (groups.size() > 1).to_numpy()
    if not repeated.any():
        return
    span = (groups.max() - groups.min()).to_numpy()[repeated]
    for j, nm in enumerate(names):
        if (span[:, j] == 0).all():
            raise InputError(
                f"covariate {nm!r} does not vary within any subject: a subject-level covariate "
                "(sex, treatment arm) is not supported, every coefficient is a random effect "
                "fitted within subjects; leave it out or fit each of its levels apart"
            )


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
    """One sweep of a set of subjects against the model (a chunk's work): their new cluster
    slots, eq. 7.2 modes, the number that changed cluster, and the additive statistics."""
    G, p = Xty.shape
    cap = model.n_clusters + int(train.sum()) + 1
    mu, R, ld, lnw, nk = model.slots(cap - model.n_clusters)
    mu0, R0, _ = prior.mode()
    z = z.copy()
    # zeros, not empty: an unused page of the new-cluster capacity costs nothing
    n, s, ss = np.zeros(cap), np.zeros((cap, p)), np.zeros((cap, p, p))
    beta = np.full((G, p), np.nan)
    n_slots, changed, rss, nob, nll = kme.sweep(
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
        n,
        s,
        ss,
        beta,
    )
    stats = SweepStats(
        n[:n_slots].copy(),
        s[:n_slots].copy(),
        ss[:n_slots].copy(),
        lnw[:n_slots].copy(),
        float(rss),
        float(nob),
        float(nll),
    )
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


def fit_subjects(
    sub: Subjects, st: StartState, learn_alpha: bool, max_iter: int, tol: float, min_change: float
) -> SubjectFit:
    """ICM passes over all subjects in memory (the distributed engine with one chunk)."""
    n_train = int(sub.train.sum())
    model, prior = st.model, st.prior
    z = start_labels(sub, st.codes, st.labels)
    e_old = math.inf
    for p in range(1, max_iter + 1):
        z, _, changed, stats = sweep_subjects(
            sub.XtX, sub.Xty, sub.yty, sub.n_obs, sub.train, z, model, prior
        )
        new, mapping, e, merges = update(stats, model, prior, learn_alpha)
        z = np.where(z >= 0, mapping[np.maximum(z, 0)], -1)
        moved = changed + int(merges > 0) * n_train
        stop = should_stop(e_old, e, moved, n_train, tol, min_change)
        new.history = [*model.history, icm_record(p, e, new, changed, merges, stop)]
        model = new
        e_old = e
        if stop is not None:
            break
    beta = final_effects(sub.XtX, sub.Xty, sub.yty, sub.n_obs, sub.train, z, model)
    return SubjectFit(model, z, beta)
