"""MixedEffectsDP (Raykov et al. 2016, Section 7): the conditional modes against closed forms
computed here independently, the objective never rising, the one-cluster fit against statsmodels'
MixedLM, the held-out density against numerical integration, and the bad input of the issue."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import integrate, optimize, stats
from sklearn.base import clone
from sklearn.metrics import normalized_mutual_info_score

from kernels import mixed_effects as kme
from pipeline import MixedEffectsDP
from pipeline.core.errors import InputError
from pipeline.data.synthetic import sample_longitudinal
from tests.reference import two_stage_baseline

COVS = ["wave", "depression", "adl"]
DATA = Path(__file__).resolve().parents[2] / "data"


def spd(rng: np.random.Generator, p: int) -> np.ndarray:
    A = rng.normal(size=(p, p))
    return A @ A.T + p * np.eye(p)


# -- the conditional modes -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_eq_7_2_mode_and_the_integrated_likelihood(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, p = int(rng.integers(1, 7)), int(rng.integers(1, 4))
    X = rng.normal(size=(n, p))
    y = rng.normal(size=n)
    tau = float(rng.gamma(2.0, 1.0))
    mu = rng.normal(size=p)
    R = spd(rng, p)
    beta = np.empty(p)
    scratch = (np.empty((p, p)), np.empty((p, p)), np.empty(p))
    cost = kme.subject_cost(
        X.T @ X, X.T @ y, y @ y, float(n), tau, mu, R, np.linalg.slogdet(R)[1], beta, *scratch
    )
    # eq. 7.2: the mean (= mode) of N((tau X'X + R)^-1 (tau X'y + R mu), (tau X'X + R)^-1)
    expect = np.linalg.solve(tau * X.T @ X + R, tau * X.T @ y + R @ mu)
    np.testing.assert_allclose(beta, expect, rtol=1e-10, atol=1e-12)
    # beta integrated out: N(y | X mu, X R^-1 X' + I / tau)
    cov = X @ np.linalg.inv(R) @ X.T + np.eye(n) / tau
    ref = stats.multivariate_normal(X @ mu, cov).logpdf(y)
    assert -cost == pytest.approx(ref, rel=1e-10, abs=1e-10)


@pytest.mark.parametrize(("a", "b", "rss", "n"), [(1.0, 0.01, 37.5, 40), (3.0, 2.0, 0.4, 7)])
def test_eq_7_3_mode(a: float, b: float, rss: float, n: int) -> None:
    # the conditional Gamma(a + n/2, b + rss/2) maximised numerically
    post = stats.gamma(a + n / 2, scale=1.0 / (b + rss / 2))
    res = optimize.minimize_scalar(
        lambda t: -post.logpdf(t), bounds=(1e-9, 100.0), method="bounded", options={"xatol": 1e-10}
    )
    assert kme.tau_mode(rss, float(n), a, b) == pytest.approx(res.x, rel=1e-6)


def test_normal_wishart_mode_in_one_dimension() -> None:
    """p = 1: the mode of N(mu | m0, 1/(c0 r)) Wishart(r | B0, a0) prod_i N(beta_i | mu, 1/r),
    found by numerical optimisation, against ``nw_mode``."""
    rng = np.random.default_rng(3)
    beta = rng.normal(2.0, 0.7, size=9)
    m0, c0, B0, a0 = np.array([0.5]), 0.3, 0.8, 3.0

    def neg(v: np.ndarray) -> float:
        mu, r = v[0], math.exp(v[1])
        lp = stats.norm(m0[0], 1 / math.sqrt(c0 * r)).logpdf(mu)
        lp += stats.wishart(df=a0, scale=B0).logpdf(r)
        lp += stats.norm(mu, 1 / math.sqrt(r)).logpdf(beta).sum()
        return float(-lp)

    # the mode in (mu, r): optimise over log r, a change of variable without a Jacobian
    res = optimize.minimize(
        neg,
        x0=[0.0, 0.0],
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000},
    )
    mu, R, L = np.empty(1), np.empty((1, 1)), np.empty((1, 1))
    T0 = np.array([[1.0 / B0]])
    s, ss = np.array([beta.sum()]), np.array([[beta @ beta]])
    logdet = kme.nw_mode(float(beta.size), s, ss, m0, c0, T0, a0, mu, R, L)
    assert mu[0] == pytest.approx(res.x[0], abs=1e-5)
    assert R[0, 0] == pytest.approx(math.exp(res.x[1]), rel=1e-5)
    assert logdet == pytest.approx(math.log(R[0, 0]))
    ln = kme.nw_log_density(mu, R, logdet, m0, c0, T0, a0, math.log(1.0 / B0))
    ref = stats.norm(m0[0], 1 / math.sqrt(c0 * R[0, 0])).logpdf(mu[0])
    ref += stats.wishart(df=a0, scale=B0).logpdf(R[0, 0])
    assert ln == pytest.approx(ref, rel=1e-10)


# -- the fit -----------------------------------------------------------------------------------


def fit(df: pd.DataFrame, **kw: object) -> MixedEffectsDP:
    return MixedEffectsDP(**kw).fit(df[COVS], df["qol"], df["subject"])  # type: ignore[arg-type]


def test_recovers_the_subgroups() -> None:
    df = sample_longitudinal(1200, seed=2)
    m = fit(df)
    truth = df.groupby("subject")["subgroup"].first().to_numpy()
    assert normalized_mutual_info_score(truth, m.labels_) > 0.85
    assert m.n_clusters_ == 4
    # tau's standard error here is about 8%: a subject of n_i waves leaves n_i - 4 residual
    # degrees of freedom, about 360 in all
    assert m.noise_precision_ == pytest.approx(1 / 1.5**2, rel=0.2)
    assert m.labels_.shape == (1200,) and m.random_effects_.shape == (1200, 4)
    assert m.cluster_means_.shape == (4, 4) and m.cluster_covariances_.shape == (4, 4, 4)
    assert m.cluster_sizes_.sum() == 1200
    np.testing.assert_allclose(
        m.fixed_effects_, m.cluster_sizes_ @ m.cluster_means_ / m.cluster_sizes_.sum()
    )
    assert m.coef_names_ == ["intercept", *COVS]
    assert m.n_iter_ == len(m.objective_history_) >= 1
    assert m.alpha_ > 0
    # held-out subjects keep the default prior, under which the subgroups form
    assert m.shrink_ == 10.0 and m.shrink_evidence_["chosen"] == 10.0
    heldout = m.shrink_evidence_["heldout"]
    assert max(heldout, key=heldout.get) == "10.0"


def test_shrink_auto_chooses_by_held_out_subjects() -> None:
    """``shrink="auto"`` on one group of subjects: the default prior pulls the group's
    covariance towards a tenth of its spread, a wider one predicts held-out subjects clearly
    better and is chosen (the evidence recorded, ``choose_shrink``); a given shrink is not
    compared; under 12 subjects the default is kept without a comparison; a shrink of 1 or a
    word is refused."""
    from pipeline.models.mixed_effects_start import SHRINKS

    df = sample_longitudinal(300, seed=4, k=1)
    m = fit(df)
    ev = m.shrink_evidence_
    assert m.n_clusters_ == 1 and m.shrink_ < 10.0 and ev["chosen"] == m.shrink_
    assert set(ev["heldout"]) == {str(s) for s in SHRINKS}
    assert ev["heldout"][str(m.shrink_)] > ev["heldout"]["10.0"]
    assert ev["subjects"] == 300 and ev["folds"] == 3
    assert fit(df, shrink=m.shrink_).labels_.tolist() == m.labels_.tolist()
    given = fit(df, shrink=3.0)
    assert given.shrink_ == 3.0 and given.shrink_evidence_ == {"chosen": 3.0}
    small = fit(df[df["subject"].isin(df["subject"].unique()[:11])])
    assert small.shrink_ == 10.0 and "11 subjects, under 12" in small.shrink_evidence_["note"]
    for bad in (1.0, "wide", True):
        with pytest.raises(ValueError, match="shrink must be 'auto' or a number > 1"):
            fit(df, shrink=bad)


@pytest.mark.parametrize("seed", range(12))
def test_the_objective_never_increases(seed: int) -> None:
    rng = np.random.default_rng(seed)
    df = sample_longitudinal(
        int(rng.integers(30, 300)),
        waves=int(rng.integers(2, 6)),
        seed=seed,
        missing=float(rng.uniform(0, 0.5)),
        noise=float(rng.uniform(0.3, 4.0)),
        k=int(rng.integers(1, 5)),
    )
    alpha = "learn" if seed % 2 else float(rng.uniform(0.1, 5.0))
    init = "one-cluster" if seed % 3 == 0 else "auto"
    m = fit(df, alpha=alpha, init=init, tol=0.0, min_change=0.0, max_iter=15)
    e = m.objective_history_
    assert all(np.isfinite(e))
    assert all(b <= a + 1e-9 * abs(a) for a, b in itertools.pairwise(e)), e
    # and the Gaussian fit's EM lowered -log p(y)
    g = m.gaussian_.history
    assert all(b <= a + 1e-9 * abs(a) for a, b in itertools.pairwise(g)), g


def test_one_cluster_agrees_with_statsmodels_mixedlm() -> None:
    """With one subgroup and a concentration that opens no cluster, the model is the Gaussian
    linear mixed model: its fixed effects and tau agree with MixedLM's maximum likelihood fit
    (random intercept, slope and covariate effects) within MixedLM's standard errors."""
    import statsmodels.api as sm

    df = sample_longitudinal(400, seed=4, k=1)
    m = fit(df, alpha=1e-8, alpha_prior=(1.0, 1.0), init="one-cluster", tol=1e-10, max_iter=200)
    assert m.n_clusters_ == 1
    exog = sm.add_constant(df[COVS])
    res = sm.MixedLM(df["qol"], exog, groups=df["subject"], exog_re=exog).fit(
        reml=False, method="lbfgs"
    )
    fe = res.fe_params.to_numpy()
    se = res.bse_fe.to_numpy()
    assert np.all(np.abs(m.fixed_effects_ - fe) <= 2 * se), (m.fixed_effects_, fe, se)
    # the noise variance: its standard error is about sigma^2 sqrt(2 / df) for df residual
    # degrees of freedom (n_obs - p n_subjects at most)
    n_obs = len(df)
    scale = float(res.scale)
    se_scale = scale * math.sqrt(2.0 / (n_obs - 4 * 400 / 2))
    assert abs(1.0 / m.noise_precision_ - scale) <= 2 * se_scale, (1 / m.noise_precision_, scale)


def test_held_out_density_against_numerical_integration() -> None:
    """One subject, one covariate (no intercept): the mixture over the fitted clusters and a
    new one, each a new subject's beta under its posterior, integrated out by quadrature."""
    rng = np.random.default_rng(0)
    n_sub = 60
    g = rng.integers(0, 2, size=n_sub)
    beta = np.where(g == 0, 1.0, -2.0) + 0.2 * rng.normal(size=n_sub)
    rows = [(i, t, beta[i] * t + 0.5 * rng.normal()) for i in range(n_sub) for t in (1.0, 2.0, 3.0)]
    df = pd.DataFrame(rows, columns=["subject", "t", "y"])
    m = MixedEffectsDP(fit_intercept=False).fit(df[["t"]], df["y"], df["subject"])
    x_new = np.array([0.5, 1.5, 2.5])
    y_new = np.array([0.8, 1.1, 2.9])
    got = m.score_samples(x_new[:, None], y_new, np.zeros(3))
    tau = m.noise_precision_
    mus = [*m.cluster_means_[:, 0], m.prior_.mode()[0][0]]
    # a new subject's beta under each posterior: the mode's variance T / (a - 1) widened to
    # (1 + 1 / c) T / (a - 2) (mean and variance uncertain; p = 1)
    pr = m.prior_
    c = np.append(pr.c0 + m.cluster_sizes_, pr.c0)
    a = np.append(pr.a0 + m.cluster_sizes_, pr.a0)
    modes = np.append(m.cluster_covariances_[:, 0, 0], 1.0 / pr.mode()[1][0, 0])
    vs = modes * (c + 1) / c * (a - 1) / (a - 2)
    ws = np.array([*m.cluster_sizes_, m.alpha_]) / (m.cluster_sizes_.sum() + m.alpha_)

    def density(b: float) -> float:
        lik = np.prod(stats.norm(b * x_new, 1 / math.sqrt(tau)).pdf(y_new))
        prior = sum(w * stats.norm(mu, math.sqrt(v)).pdf(b) for w, mu, v in zip(ws, mus, vs))
        return float(lik * prior)

    ref, _ = integrate.quad(density, -20, 20, points=mus, limit=200, epsabs=1e-14)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(math.log(ref), rel=1e-7)
    assert m.score(x_new[:, None], y_new, np.zeros(3)) == pytest.approx(got[0])


# -- inputs ------------------------------------------------------------------------------------


def test_numpy_pandas_and_row_order_give_the_same_fit() -> None:
    df = sample_longitudinal(300, seed=5)
    a = fit(df)
    b = MixedEffectsDP().fit(df[COVS].to_numpy(), df["qol"].to_numpy(), df["subject"].to_numpy())
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.random_effects_, b.random_effects_)
    # rows of a subject need not be contiguous nor sorted; ids may be text
    shuffled = df.sample(frac=1.0, random_state=1)
    shuffled = shuffled.assign(subject="s" + shuffled["subject"].astype(str).str.zfill(4))
    c = fit(shuffled)
    assert normalized_mutual_info_score(a.labels_, c.labels_) > 0.95
    assert list(c.subjects_[:2]) == ["s0000", "s0001"]


def test_the_fit_follows_the_units_of_the_response_and_covariates() -> None:
    """The same data in other units (the response in thousandths or thousands, wave in months)
    gives the same partition: the objective's NW term is unit-free (``kme.nw_log_prior``)."""
    df = sample_longitudinal(300, seed=3)
    a = fit(df)
    assert a.n_clusters_ > 1
    for fy, fw in [(1e3, 1.0), (1e-3, 12.0)]:
        other = df.assign(qol=df["qol"] * fy, wave=df["wave"] * fw)
        b = fit(other)
        assert normalized_mutual_info_score(a.labels_, b.labels_) == pytest.approx(1.0)


def test_real_panel_chickweight_in_grams_and_kilograms() -> None:
    """The README's real example (``tests/data/panel_chickweight.md``): 50 chicks' weights,
    response ~ 1 + standardised day. Grams and kilograms give the same fit; before the unit-free
    NW term, grams times 1000 gave one cluster per chick."""
    df = pd.read_csv(DATA / "panel_chickweight.csv")
    day = pd.DataFrame({"time": (df["time"] - df["time"].mean()) / df["time"].std()})
    fits = [MixedEffectsDP().fit(day, df["weight_g"] * f, df["subject"]) for f in (1e-3, 1e3)]
    assert fits[0].n_clusters_ == fits[1].n_clusters_ < 5
    np.testing.assert_array_equal(fits[0].labels_, fits[1].labels_)


def test_real_panel_bodyweight_at_or_above_the_two_stage_baseline() -> None:
    """16 rats' weights on 3 diets (``tests/data/panel_bodyweight.md``), response ~ 1 +
    standardised day: the diets found at least as well as by the two-stage baseline (on
    2026-11-26: 2 clusters, NMI 0.800 against 0.730), the same in grams and kilograms (one
    cluster per rat before the unit-free NW term)."""
    df = pd.read_csv(DATA / "panel_bodyweight.csv")
    day = (df["time"] - df["time"].mean()) / df["time"].std()
    base, truth = two_stage_baseline(df, "weight_g", day)
    fits = [
        MixedEffectsDP().fit(day.to_frame("time"), df["weight_g"] * f, df["subject"])
        for f in (1.0, 1e-3)
    ]
    np.testing.assert_array_equal(fits[0].labels_, fits[1].labels_)
    assert normalized_mutual_info_score(truth, fits[0].labels_) >= base


def test_predict_and_scores_on_new_subjects() -> None:
    df = sample_longitudinal(600, seed=6)
    train, test = df[df.subject < 500], df[df.subject >= 500]
    m = fit(train)
    lab = m.predict(test[COVS], test["qol"], test["subject"])
    truth = test.groupby("subject")["subgroup"].first().to_numpy()
    assert lab.shape == (100,)
    assert normalized_mutual_info_score(truth, lab) > 0.8
    s = m.score_samples(test[COVS], test["qol"], test["subject"])
    assert s.shape == (100,) and np.isfinite(s).all()
    assert m.score(test[COVS], test["qol"], test["subject"]) == pytest.approx(s.mean())
    proba = m.predict_proba(test[COVS], test["qol"], test["subject"])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    # the informative covariates predict better than the uninformative ones (Table 5)
    other = ["wave", "memory", "fluency"]
    m2 = MixedEffectsDP().fit(train[other], train["qol"], train["subject"])
    assert m2.score(test[other], test["qol"], test["subject"]) < m.score(
        test[COVS], test["qol"], test["subject"]
    )
    assert clone(m).get_params() == m.get_params()


def test_saved_model_predicts_and_scores_exactly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from pipeline.core.persist import PersistError
    from pipeline.estimators.model import load_model

    df = sample_longitudinal(300, seed=6)
    train, test = df[df.subject < 250], df[df.subject >= 250]
    for frame in (True, False):
        X_train, X_test = train[COVS], test[COVS]
        if not frame:
            X_train, X_test = X_train.to_numpy(), X_test.to_numpy()
        m = MixedEffectsDP(random_state=0).fit(X_train, train["qol"], train["subject"])
        path = m.save(tmp_path / f"model-{frame}")
        back = load_model(path, expect=MixedEffectsDP)
        args = (X_test, test["qol"], test["subject"])
        np.testing.assert_array_equal(back.score_samples(*args), m.score_samples(*args))
        np.testing.assert_array_equal(back.predict(*args), m.predict(*args))
        np.testing.assert_array_equal(back.predict_proba(*args), m.predict_proba(*args))
        for a in ("cluster_means_", "cluster_covariances_", "cluster_sizes_", "fixed_effects_"):
            np.testing.assert_array_equal(getattr(back, a), getattr(m, a))
        assert back.noise_precision_ == m.noise_precision_ and back.alpha_ == m.alpha_
        assert back.coef_names_ == m.coef_names_ and back.get_params() == m.get_params()
        assert back.objective_history_ == m.objective_history_
        assert hasattr(back, "feature_names_in_") and back.n_features_in_ == 3
    # new subjects must come with the fit's covariates
    with pytest.raises(InputError, match="covariates"):
        back.predict(test[COVS[:2]].to_numpy(), test["qol"], test["subject"])
    # a model whose arrays disagree with its schema is refused, naming the file
    js = path / "model.json"
    rec = json.loads(js.read_text())
    schema = rec["root"]["items"]["schema"]["fields"]
    dropped = schema["columns"]["items"].pop()  # one covariate fewer than the coefficients
    del schema["kinds"]["items"][dropped]
    js.write_text(json.dumps(rec))
    with pytest.raises(PersistError, match=r"model\.json: array model_ s has shape"):
        load_model(path)


def test_unusual_but_valid_subjects() -> None:
    """One observation, waves of different numbers, a covariate constant within a subject: the
    prior keeps every beta_i defined."""
    df = sample_longitudinal(300, seed=7, missing=0.4)
    one = df.groupby("subject").head(1).query("subject < 20")
    df = pd.concat([one, df[df.subject >= 20]])
    df.loc[df.subject == 25, "adl"] = 1.0  # constant within subject 25
    m = fit(df)
    assert np.isfinite(m.random_effects_).all()
    sizes = df.groupby("subject").size()
    assert sizes.min() == 1 and sizes.max() == 5
    # a single observation shrinks beta to its cluster's mean on the unidentified coordinates
    i = int(np.flatnonzero(m.subjects_ == 3)[0])
    k = m.labels_[i]
    dev = np.abs(m.random_effects_[i] - m.cluster_means_[k])
    assert np.all(dev <= 3 * np.sqrt(np.diag(m.cluster_covariances_[k])))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.assign(adl=3.0), "covariate 'adl' is constant"),
        (
            lambda d: d.assign(adl=(d.subject % 2).astype(float)),
            "covariate 'adl' does not vary within any subject",
        ),
        (lambda d: d.assign(qol=d.qol.where(d.index != 7)), "response 'qol', row 7: missing"),
        (
            lambda d: d.assign(adl=d.adl.astype(object).where(d.index != 5, "abc")),
            "covariate 'adl', row 5: 'abc' is not a finite number",
        ),
        (
            lambda d: d.assign(depression=d.depression.where(d.index != 3, np.inf)),
            "covariate 'depression', row 3",
        ),
        (
            lambda d: d.assign(subject=d.subject.astype(object).where(d.index != 4, None)),
            "groups, row 4: missing subject id",
        ),
    ],
)
def test_bad_input_names_the_column_and_row(change, message: str) -> None:  # type: ignore[no-untyped-def]
    df = change(sample_longitudinal(40, seed=8).reset_index(drop=True))
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        fit(df)


def test_the_response_listed_as_a_covariate_is_refused() -> None:
    df = sample_longitudinal(40, seed=8)
    with pytest.raises(InputError, match="'qol' is both the response and a covariate"):
        MixedEffectsDP().fit(df[["wave", "qol"]], df["qol"], df["subject"])


def test_predict_checks_the_columns() -> None:
    df = sample_longitudinal(60, seed=9)
    m = fit(df)
    with pytest.raises(InputError, match="columns"):
        m.predict(df[["wave", "adl", "depression"]], df["qol"], df["subject"])
    with pytest.raises(InputError, match="2 covariates"):
        m.predict(df[["wave", "adl"]].to_numpy(), df["qol"], df["subject"])


def test_shrink_evidence_is_a_share_of_a_large_sample() -> None:
    """The start's sample of a large run is drawn by a hash of the subject codes; the shrink's
    evidence takes about ``EVIDENCE_SUBJECTS`` of it by a hash of its own (by the sample's hash,
    every subject of the sample passed: 20,156 of a 1M-subject run, and the start took 25 s)."""
    from pipeline.models.mixed_effects import Subjects
    from pipeline.models.mixed_effects_start import EVIDENCE_SUBJECTS, start

    df = sample_longitudinal(6000, seed=7)
    X = np.column_stack([np.ones(len(df)), df[COVS].to_numpy()])
    subjects, codes = np.unique(df["subject"].to_numpy(), return_inverse=True)
    G = len(subjects)
    XtX, Xty, yty, n_obs = kme.subject_moments(X, df["qol"].to_numpy(), codes, G)
    sub = Subjects(XtX, Xty, yty, n_obs, np.ones(G, dtype=bool), np.arange(G, dtype=np.int64))
    st, _ = start(lambda fn, *a: [fn(sub, *a)], G, "learn", init_sample=2000)
    assert 0.8 * EVIDENCE_SUBJECTS < st.shrink["subjects"] < 1.2 * EVIDENCE_SUBJECTS
