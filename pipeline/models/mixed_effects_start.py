"""The start of the mixed-effects model of Raykov et al. 2016, Section 7 (the model, its records and
the sweep are ``pipeline.models.mixed_effects``): everything before the first ICM pass.

Over the chunks of subjects (``MapChunks``): the subjects' pooled least-squares moments and a
hash sample of subjects; in memory on the sample: the Gaussian random-effects model (one
cluster: what MixedLM fits) by EM, the empirical-Bayes prior from it (Appendix A, option 1),
the first partition, by MAP-DP on the sample's conditional means in the Gaussian fit (or
Algorithm 1's single cluster), and the ICM passes of the sample to the stop rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels import mixed_effects as kme
from pipeline.core.config import (
    ALPHA_PRIOR,
    EVIDENCE_FOLDS,
    INIT_SAMPLE,
    MAX_PASSES,
    MIN_CHANGE,
    TOL,
    check_alpha,
    check_positive,
)
from pipeline.core.diagnose import clearly_better
from pipeline.models.mixed_effects import (
    FloatArray,
    GaussianFit,
    IntArray,
    MixedModel,
    MixedPrior,
    OLSMoments,
    StartState,
    SubjectFit,
    Subjects,
    SweepStats,
    fit_subjects,
    predictive_components,
    update,
)

DEFAULT_SHRINK = 10.0
#: ``shrink="auto"`` (the default of ``MixedEffectsDP`` and ``dpmm longitudinal``): the
#: candidates of ``choose_shrink``, ``DEFAULT_SHRINK`` first, the one kept without clear evidence
SHRINK = "auto"
SHRINKS = (DEFAULT_SHRINK, 3.0, 1.5)
DEFAULT_TAU_PRIOR = (1.0, 1e-3)
MIXED_INITS = ("auto", "one-cluster")
#: ``choose_shrink``'s subjects: about ``EVIDENCE_SUBJECTS`` of the start's sample (each
#: candidate costs ``EVIDENCE_FOLDS`` starts on two thirds of them); under
#: ``EVIDENCE_MIN_SUBJECTS`` (3 folds of 4) no candidate is compared
EVIDENCE_SUBJECTS, EVIDENCE_MIN_SUBJECTS = 500, 12
GAUSSIAN_PASSES = 30

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
    from pipeline.core.seeds import SAMPLE_SALT, row_uniform

    if n_codes <= size:
        return np.ones(codes.shape[0], dtype=bool)
    return row_uniform(codes, SAMPLE_SALT) < size / n_codes  # type: ignore[no-any-return]


def _floor_cov(cov: FloatArray, rel: float = 1e-6) -> FloatArray:
    cov = 0.5 * (cov + cov.T)
    w, V = np.linalg.eigh(cov)
    return (V * np.maximum(w, max(float(w.max()), 1e-12) * rel)) @ V.T  # type: ignore[no-any-return]


def fit_gaussian(
    map_chunks: MapChunks, mom: OLSMoments, max_iter: int = GAUSSIAN_PASSES, tol: float = 1e-6
) -> GaussianFit:
    """Maximum likelihood of the one-cluster model by EM over the chunks (``gaussian_estep``),
    from the pooled least-squares fit and a covariance above the truth (EM for variance
    components started too small crawls), until -log p(y) falls by at most ``tol`` relative."""
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
    ``GaussianNW.empirical_bayes``: m0 its mean, a0 = p + 2, a cluster carrying 1/shrink of its
    covariance, c0 = 1 / (shrink - 1); ``tau_prior``'s rate None is 1e-3 / tau."""
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
    """The start's partition of the sampled subjects: one restart of MAP-DP on their random
    effects' conditional means under the model's own prior; labels 0..K-1."""
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
    sample, its counts the sample's."""
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


def take(sub: Subjects, pick: NDArray[np.bool_]) -> Subjects:
    """The subjects of ``sub`` where ``pick`` (G,) is True, in their order."""
    return Subjects(
        sub.XtX[pick],
        sub.Xty[pick],
        sub.yty[pick],
        sub.n_obs[pick],
        sub.train[pick],
        sub.codes[pick],
    )


def sample_subjects(sub: Subjects, n_total: int, size: int) -> Subjects:
    """A chunk's part of the start's hash sample of training subjects (``sample_mask``): their
    moments and codes, in the chunk's order."""
    return take(sub, sub.train & sample_mask(sub.codes, n_total, size))


def check_shrink(shrink: Any) -> str | float:
    """``shrink`` checked: "auto", or a number above 1 as a float; ``ValueError`` otherwise."""
    if isinstance(shrink, str) and shrink == SHRINK:
        return SHRINK
    try:
        value = float(shrink)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(shrink, bool) or not value > 1.0:
        raise ValueError(f"shrink must be 'auto' or a number > 1, got {shrink!r}")
    return value


def heldout_subjects(
    sample: Subjects, fold: IntArray, n_folds: int, shrink: float, fit: Callable[..., Any]
) -> FloatArray:
    """Each subject's log predictive density (S,) (``predictive_components``, random effects
    integrated out) under ``fit(subjects, shrink)``'s model of the other folds' subjects."""
    out = np.full(sample.codes.shape[0], np.nan)
    for f in range(n_folds):
        held = fold == f
        st, res = fit(take(sample, ~held), shrink)
        mu, R, ld, log_w = predictive_components(res.model, st.prior)
        out[held] = kme.mixture_log_predictive(
            sample.XtX[held], sample.Xty[held], sample.yty[held], sample.n_obs[held],
            res.model.tau, mu, R, ld, log_w,
        )[1]  # fmt: skip
    return out


def choose_shrink(sample: Subjects, fit: Callable[..., Any]) -> tuple[float, dict[str, Any]]:
    """``shrink="auto"``: each of ``SHRINKS`` scored by the held-out log predictive density of
    about ``EVIDENCE_SUBJECTS`` subjects of the start's sample in ``EVIDENCE_FOLDS`` folds (both
    by a hash of the subject's code; ``fit(subjects, shrink)`` is the start on the others); the
    best is kept if it beats ``DEFAULT_SHRINK`` by more than the standard error of the subjects'
    paired differences (``clearly_better``), else ``DEFAULT_SHRINK``. Under
    ``EVIDENCE_MIN_SUBJECTS`` subjects, ``DEFAULT_SHRINK`` without a comparison.

    The default prior expects a cluster to carry a tenth of the random effects' covariance,
    which lets subgroups form; where the subjects make one group, its Normal-Wishart prior pulls
    that group's covariance towards a tenth of the truth, and a new subject's density falls
    below the one-Gaussian model's (``lme4::sleepstudy``). Returns the shrink and the evidence
    (subjects, folds, mean held-out density per subject by shrink, chosen)."""
    from pipeline.core.seeds import FOLD_SALT, row_uniform

    # one hash uniform per subject, of its own salt: the sample was drawn by SAMPLE_SALT's, so
    # that one is below the sample's share for every subject here and would pick them all
    share = min(1.0, EVIDENCE_SUBJECTS / max(sample.codes.shape[0], 1))
    u = row_uniform(sample.codes, FOLD_SALT)
    keep = u < share
    ev = take(sample, keep)
    S = ev.codes.shape[0]
    if S < EVIDENCE_MIN_SUBJECTS:
        return DEFAULT_SHRINK, {
            "subjects": S, "chosen": DEFAULT_SHRINK,
            "note": f"{S} subjects, under {EVIDENCE_MIN_SUBJECTS}: the default, not compared",
        }  # fmt: skip
    # the kept subjects' uniforms, rescaled to [0, 1), cut into the folds
    fold = np.minimum(u[keep] / share * EVIDENCE_FOLDS, EVIDENCE_FOLDS - 1).astype(np.int64)
    dens = {s: heldout_subjects(ev, fold, EVIDENCE_FOLDS, s, fit) for s in SHRINKS}
    best = max(SHRINKS, key=lambda s: float(np.nanmean(dens[s])))
    chosen = best if clearly_better(dens[best] - dens[DEFAULT_SHRINK]) else DEFAULT_SHRINK
    return chosen, {
        "subjects": S,
        "folds": EVIDENCE_FOLDS,
        "heldout": {str(s): float(np.nanmean(d)) for s, d in dens.items()},
        "chosen": chosen,
    }


def start(
    map_chunks: MapChunks,
    n_train: int,
    alpha: float | str,
    shrink: str | float = SHRINK,
    tau_prior: tuple[float, float | None] = (DEFAULT_TAU_PRIOR[0], None),
    alpha_prior: tuple[float, float] = ALPHA_PRIOR,
    prior_overrides: dict[str, Any] | None = None,
    init: str = "auto",
    seed: int = 0,
    init_sample: int = INIT_SAMPLE,
    max_iter: int = MAX_PASSES,
    tol: float = TOL,
    min_change: float = MIN_CHANGE,
) -> tuple[StartState, SubjectFit]:
    """Everything before the first ICM pass over all subjects (``map_chunks(fn, *args)`` runs
    ``fn(subjects, *args)`` on every chunk): the pooled least-squares moments, then, in memory on
    a hash sample of at most ``init_sample`` subjects, ``shrink="auto"``'s choice
    (``choose_shrink``), then ``fit_sample``, so that the passes over all subjects only refine
    it.

    Returns
    -------
    StartState
        The Gaussian fit, the prior, the sample's model and clusters, the shrink's evidence.
    SubjectFit
        The sample's fit, its subjects in chunk order.
    """
    moms = map_chunks(start_moments)
    mom = moms[0]
    for other in moms[1:]:
        mom = mom + other
    parts = map_chunks(sample_subjects, n_train, init_sample)
    sample = Subjects(
        *(np.concatenate([getattr(q, f) for q in parts]) for f in Subjects.__dataclass_fields__)
    )

    def fit(subjects: Subjects, value: float, moments: OLSMoments | None = None) -> Any:
        return fit_sample(
            subjects, start_moments(subjects) if moments is None else moments, alpha, value,
            tau_prior, alpha_prior, prior_overrides, init, seed, max_iter, tol, min_change,
        )  # fmt: skip

    shrink = check_shrink(shrink)
    evidence: dict[str, Any] = {}
    if shrink == SHRINK:
        shrink, evidence = choose_shrink(sample, fit)
    st, res = fit(sample, float(shrink), mom)
    st.shrink = evidence or {"chosen": float(shrink)}
    return st, res


def fit_sample(
    sample: Subjects,
    mom: OLSMoments,
    alpha: float | str,
    shrink: float,
    tau_prior: tuple[float, float | None],
    alpha_prior: tuple[float, float],
    prior_overrides: dict[str, Any] | None,
    init: str,
    seed: int,
    max_iter: int,
    tol: float,
    min_change: float,
) -> tuple[StartState, SubjectFit]:
    """``start`` on the subjects ``sample`` in memory, the pooled least-squares moments ``mom``
    given: the Gaussian random-effects fit (EM), the empirical prior at ``shrink``, the first
    partition and the ICM passes to the stop rule."""

    def local(fn: Callable[..., Any], *args: Any) -> list[Any]:
        return [fn(sample, *args)]

    g = fit_gaussian(local, mom)
    prior = override_prior(empirical_prior(g, shrink, tau_prior, alpha_prior), prior_overrides)
    R = np.linalg.inv(g.cov)
    R = 0.5 * (R + R.T)
    n_s = sample.codes.shape[0]
    codes, m, V = posterior_sample(sample, g.mu, R, g.tau, n_s, n_s)
    order = np.argsort(codes, kind="stable")
    codes, m, V = codes[order], m[order], V[order]
    if init == "one-cluster":
        labels = np.zeros(codes.shape[0], dtype=np.int64)
    else:
        labels = start_clusters(m, prior, alpha, seed)
    model = start_model(m, V, labels, prior, g.tau, alpha)
    learn = check_alpha(alpha)[1]
    fit = fit_subjects(
        sample, StartState(g, prior, model, codes, labels), learn, max_iter, tol, min_change
    )
    return StartState(g, prior, fit.model, codes, fit.z[order]), fit


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
