"""Gaussian families: full covariance with a Normal-Wishart prior, independent columns with
Normal-Gamma priors (Raykov et al. 2016, Appendix B)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray

from kernels.obs import product
from pipeline.core.config import check_scale
from pipeline.core.persist import register
from pipeline.families.base import (
    Family,
    FloatArray,
    _as_data,
    _check_names,
    _good_column_means,
    _raise_first_bad,
    _require_positive,
    _vectors,
)

#: the default prior scale of ``GaussianNW.empirical_bayes`` (its docstring says why)
DEFAULT_SCALE = 0.3


#: the finest recording grid ``recording_step`` looks for: 10^-MAX_DECIMALS
MAX_DECIMALS = 6
#: a grid step below this share of the column's standard deviation counts as continuous
MIN_STEP_RATIO = 1e-3


def spd_inverse(A: FloatArray) -> tuple[FloatArray, float]:
    """(A^{-1}, log|A|) of a symmetric positive-definite A (d, d) from its Cholesky factor:
    half the work of an LU inverse and a determinant of their own (5,000 columns: 2.5 s against
    6 s); ``np.linalg.LinAlgError`` when A is not positive definite."""
    c, info = scipy.linalg.lapack.dpotrf(A, lower=True)
    if info != 0:
        raise np.linalg.LinAlgError("the matrix is not positive definite")
    logdet = 2.0 * float(np.log(np.diagonal(c)).sum())
    inv, info = scipy.linalg.lapack.dpotri(c, lower=True)
    if info != 0:
        raise np.linalg.LinAlgError("the matrix is singular")
    # dpotri fills the lower triangle only
    inv = np.tril(inv)
    return inv + np.tril(inv, -1).T, logdet


def recording_step(X: FloatArray) -> FloatArray:
    """Per column of X (n, d), the grid step q its values are recorded on, shape (d,): 10^-k for
    the smallest k in 0..``MAX_DECIMALS`` with every finite value a multiple of it, else 0
    (continuous, also for a grid finer than ``MIN_STEP_RATIO`` of the standard deviation).

    The empirical-Bayes priors count each record with its cell's variance q^2 / 12 (Sheppard's
    correction): without it a cluster sharing a value of an integer column has an unbounded
    density there (MAP-DP's NMI on scikit-learn's digits: 0.33 without, 0.8 with).
    """
    X = np.asarray(X, dtype=np.float64)
    d = X.shape[1]
    step = np.zeros(d)
    for j in range(d):
        # the first values first: on a continuous column they fail every grid at once, and
        # each full test is a pass over the column (seven of them per column took half the
        # time of an ASUGS fit); the whole column is only read for a grid they all sit on
        head = X[:_GRID_PROBE, j]
        head = head[np.isfinite(head)]
        col: FloatArray | None = None
        for k in range(MAX_DECIMALS + 1):
            if head.size and not _on_grid(head, k):
                continue
            if col is None:
                col = X[:, j]
                col = col[np.isfinite(col)]
                if col.size == 0:
                    break
            if _on_grid(col, k):
                if 10.0**-k >= MIN_STEP_RATIO * float(np.std(col)):
                    step[j] = 10.0**-k
                break
    return step


#: values of a column ``recording_step`` tests on each grid before the rest of the column
_GRID_PROBE = 256


def _on_grid(col: FloatArray, k: int) -> bool:
    """Whether every value of col is a multiple of 10^-k, up to float rounding."""
    scaled = col * 10.0**k
    return bool(np.all(np.abs(scaled - np.round(scaled)) <= 1e-9 * np.maximum(1.0, np.abs(scaled))))


def _recording_cells(
    step: ArrayLike | None, d: int, owner: str
) -> tuple[FloatArray | None, FloatArray]:
    """``step`` (None, a scalar or (d,)) checked: the step per column (None stays None) and the
    cells' variances q^2 / 12, shape (d,)."""
    if step is None:
        return None, np.zeros(d)
    q = np.asarray(step, dtype=np.float64)
    if q.ndim > 1 or (q.ndim == 1 and q.shape[0] != d):
        raise ValueError(f"{owner}: step must be a scalar or have {d} entries, got shape {q.shape}")
    if not np.all(np.isfinite(q)) or np.any(q < 0):
        raise ValueError(f"{owner}: step must be finite and >= 0, got {q.tolist()}")
    q = np.array(np.broadcast_to(q, (d,)))
    return q, q**2 / 12.0


def _available_case_moments(
    X: FloatArray, miss: NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray]:
    """Mean (d,) and pairwise-complete covariance (d, d) of X (n, d) with missing cells
    ``miss``, made positive definite; a column with fewer than two values gets variance 1."""
    d = X.shape[1]
    good = ~miss
    cnt = good.sum(axis=0).astype(np.float64)
    m0 = np.divide(np.where(good, X, 0.0).sum(axis=0), cnt, out=np.zeros(d), where=cnt > 0)
    Xc = np.where(good, X - m0, 0.0)
    G = good.astype(np.float64)
    pairs = G.T @ G
    cov = np.divide(Xc.T @ Xc, pairs - 1.0, out=np.zeros((d, d)), where=pairs > 1.0)
    few = cnt < 2
    cov[few, :] = 0.0
    cov[:, few] = 0.0
    cov[few, few] = 1.0
    w, V = np.linalg.eigh(0.5 * (cov + cov.T))
    w = np.maximum(w, 1e-6 * max(float(w.mean()), 1e-300))
    return m0, (V * w) @ V.T


@register
@dataclass(repr=False)
class GaussianNW(Family):
    """Multivariate Gaussian, unknown mean and full covariance, Normal-Wishart prior.

    As Raykov et al. 2016, Appendix B: the precision Lambda is Wishart(``B0`` (d, d), ``a0``),
    a0 > d - 1, the mean given it Normal(m0, (c0 Lambda)^{-1}); the posterior is eq. B.1 and the
    predictive a Student-t.

    Parameters
    ----------
    m0 : array-like of shape (d,)
    c0 : float
    B0 : array-like of shape (d, d), symmetric positive definite
    a0 : float
    step : float, array-like of shape (d,) or None, default=None
        The grid each column is recorded on (``recording_step``): every record is counted with
        its cell's variance step^2 / 12 (Sheppard's correction). None or 0: continuous.
    """

    m0: ArrayLike
    c0: float
    B0: ArrayLike
    a0: float
    step: ArrayLike | None = None
    code: ClassVar[int] = product.GAUSSIAN_NW
    name: ClassVar[str] = "gaussian"
    n_cols: int = field(init=False)

    def __post_init__(self) -> None:
        m0 = np.atleast_1d(np.asarray(self.m0, dtype=np.float64))
        d = m0.shape[0]
        B0 = np.asarray(self.B0, dtype=np.float64).reshape(d, d)
        if not np.allclose(B0, B0.T):
            raise ValueError("GaussianNW: B0 must be symmetric")
        try:
            np.linalg.cholesky(B0)
        except np.linalg.LinAlgError as err:
            raise ValueError("GaussianNW: B0 must be positive definite") from err
        if not self.c0 > 0:
            raise ValueError(f"GaussianNW: c0 must be > 0, got {self.c0}")
        if not self.a0 > d - 1:
            raise ValueError(f"GaussianNW: a0 must exceed d - 1 = {d - 1}, got {self.a0}")
        self.m0 = m0
        self.B0 = B0
        self.c0 = float(self.c0)
        self.a0 = float(self.a0)
        self.n_cols = d
        self.step, self._h = _recording_cells(self.step, d, "GaussianNW")

    @property
    def has_cells(self) -> bool:
        return bool(self._h.any())

    def prior_array(self) -> FloatArray:
        d = self.n_cols
        T0, logdet_b0 = spd_inverse(np.asarray(self.B0))
        logdet = -logdet_b0
        return np.concatenate(
            [np.asarray(self.m0), [self.c0, self.a0, logdet], T0.reshape(d * d), self._h]
        ).astype(np.float64)

    def stat_size(self) -> int:
        return 1 + self.n_cols + self.n_cols**2

    def cache_size(self) -> int:
        # the recording cells' section (kernels.obs.gaussian_nw): V, log|G_k|, log|T_k|
        cells = self.n_cols**2 + 2 if self.has_cells else 0
        return 2 * self.n_cols**2 + 2 * self.n_cols + 4 + cells

    @classmethod
    def empirical_bayes(
        cls, X: FloatArray, shrink: float | None = None, scale: float | None = None
    ) -> GaussianNW:
        """The default prior from the data (Raykov et al. 2016, Appendix A, option 1, with one
        stated belief).

        m0 = the data mean; a0 = d + 2 (the weakest Wishart with a finite mean covariance);
        E[precision] = a0 B0 = (cov / shrink)^{-1}, i.e. a cluster is expected to carry
        1 / ``shrink`` of the data's (co)variance; c0 = 1 / (shrink - 1) so that the spread of
        cluster means accounts for the rest. Columns recorded on a grid get their ``step``.
        ``scale = 1 / shrink`` in (0, 1) is a prior belief (type-II maximum likelihood would
        give one cluster); the default ``DEFAULT_SCALE`` = 0.3 was measured on the UCI sets
        (issue 14), 0.1 over-segmenting every one of them.
        """
        X = np.asarray(X, dtype=np.float64)
        n, d = X.shape
        if scale is not None:
            shrink = 1.0 / check_scale(scale)
        elif shrink is None:
            shrink = 1.0 / DEFAULT_SCALE
        if not shrink > 1:
            raise ValueError(f"GaussianNW.empirical_bayes: shrink must be > 1, got {shrink}")
        miss = np.isnan(X)
        if miss.any():
            m0, cov = _available_case_moments(X, miss)
        elif n > 1:
            m0 = X.mean(axis=0)
            # np.cov's value with one centred copy of X instead of two
            Xc = X - m0
            cov = (Xc.T @ Xc) / (n - 1.0)
        else:
            m0 = X.mean(axis=0)
            cov = np.eye(d)
        step = recording_step(X)
        # the covariance of the records with their cells (what the likelihood counts)
        cov = cov + np.diag(step**2 / 12.0)
        cov = 0.5 * (cov + cov.T) + 1e-9 * max(np.trace(cov) / d, 1e-300) * np.eye(d)
        a0 = d + 2.0
        c0 = 1.0 / (shrink - 1.0)
        # spd_inverse's inverse is exactly symmetric
        B0 = spd_inverse(cov / shrink)[0] / a0
        return cls(m0=m0, c0=c0, B0=B0, a0=a0, step=step if step.any() else None)

    def posterior(self, s: FloatArray) -> tuple[FloatArray, FloatArray, float, float]:
        """(m_k, T_k, c_k, a_k) of eq. B.1' from a statistics row s (1 + d + d^2,)."""
        d = self.n_cols
        n = float(s[0])
        c0 = self.c0
        m0 = np.asarray(self.m0)
        ck = c0 + n
        mk = (c0 * m0 + s[1 : 1 + d]) / ck
        T = (
            np.linalg.inv(np.asarray(self.B0))
            + s[1 + d : 1 + d + d * d].reshape(d, d)
            + c0 * np.outer(m0, m0)
            - ck * np.outer(mk, mk)
            + n * np.diag(self._h)
        )
        return mk, T, ck, self.a0 + n

    def restrict(self, cols: Sequence[int]) -> tuple[GaussianNW, list[int]]:
        """The Normal-Wishart prior's marginal on the columns ``cols`` (``Family.restrict``):
        Wishart(((B0^{-1})_oo)^{-1}, a0 - (d - d')) on the block's precision (Gupta & Nagar
        2000, Theorem 3.3.9) and the mean's block, whose predictive is exactly the full
        predictive's marginal."""
        o = np.asarray(cols, dtype=np.int64)
        d = self.n_cols
        T0 = np.linalg.inv(np.asarray(self.B0))
        B0o = np.linalg.inv(T0[np.ix_(o, o)])
        sub = GaussianNW(
            m0=np.asarray(self.m0)[o],
            c0=self.c0,
            B0=0.5 * (B0o + B0o.T),
            a0=self.a0 - (d - o.shape[0]),
            step=None if self.step is None else np.asarray(self.step)[o],
        )
        index = [0, *(1 + o).tolist(), *(1 + d + (o[:, None] * d + o[None, :])).ravel().tolist()]
        return sub, index

    def impute(self, X: FloatArray, s: FloatArray) -> FloatArray:
        """NaN cells set to the conditional mode of the cluster's Student-t predictive given the
        row's observed cells, m_m + T_mo T_oo^{-1} (x_o - m_o)."""
        out = np.array(X, dtype=np.float64)
        mk, T, _ck, _ak = self.posterior(s)
        miss = np.isnan(out)
        patterns, inverse = np.unique(miss, axis=0, return_inverse=True)
        for p, pattern in enumerate(patterns):
            if not pattern.any():
                continue
            rows = np.flatnonzero(inverse.ravel() == p)
            m, o = np.flatnonzero(pattern), np.flatnonzero(~pattern)
            fill = np.broadcast_to(mk[m], (rows.shape[0], m.shape[0])).copy()
            if o.size:
                dev = out[np.ix_(rows, o)] - mk[o]
                coef = np.linalg.solve(T[np.ix_(o, o)], T[np.ix_(o, m)])
                fill += dev @ coef
            out[np.ix_(rows, m)] = fill
        return out

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        d = self.n_cols
        mk, T, _ck, ak = self.posterior(s)
        # posterior mean of the covariance, E[Lambda^{-1}] = T / (a - d - 1)
        cov = T / max(ak - d - 1.0, 1e-12)
        out: dict[str, Any] = {}
        for j, nm in enumerate(names):
            out[f"{nm}:mean"] = float(mk[j])
            out[f"{nm}:sd"] = float(math.sqrt(max(cov[j, j], 0.0)))
        return out

    def check_values(self, X: FloatArray, names: Sequence[str]) -> None:
        X = _as_data(X, self.n_cols)
        names = _check_names(names, self.n_cols)
        _raise_first_bad(X, ~np.isfinite(X), names, "Gaussian values must be finite")


@register
@dataclass(repr=False)
class NormalGamma(Family):
    """Gaussian with a diagonal covariance: an independent Normal-Gamma prior on each column.

    Per column j: tau_j ~ Gamma(a0_j, rate b0_j), mu_j | tau_j ~ Normal(m0_j, 1 / (c0_j tau_j));
    the predictive is a product of Student-t densities (``kernels/obs/normal_gamma.py``).

    Parameters
    ----------
    m0, c0, a0, b0 : float or array-like of shape (d,)
        Prior mean, its strength (pseudo-records), the precision's shape and rate.
    n_cols : int, optional
        d; by default the length of the array parameters (1 if all are scalars).
    step : float, array-like of shape (d,) or None, default=None
        The grid each column is recorded on, as ``GaussianNW``'s.

    Notes
    -----
    Empirical Bayes (``empirical_bayes``):
    Per column: m0 = the mean, b0 = a0 * the maximum-likelihood variance (floored at
    1e-12 max(1, mean^2)), c0 = a0 = 1: the marginal likelihood's maximum for given strengths.
    """

    m0: ArrayLike
    c0: ArrayLike
    a0: ArrayLike
    b0: ArrayLike
    n_cols: int = 0
    step: ArrayLike | None = None
    code: ClassVar[int] = product.NORMAL_GAMMA
    name: ClassVar[str] = "diag-gaussian"

    def __post_init__(self) -> None:
        d, v = _vectors("NormalGamma", self.n_cols, m0=self.m0, c0=self.c0, a0=self.a0, b0=self.b0)
        _require_positive("NormalGamma", c0=v["c0"], a0=v["a0"], b0=v["b0"])
        self.m0, self.c0, self.a0, self.b0 = v["m0"], v["c0"], v["a0"], v["b0"]
        self.n_cols = d
        self.step, self._h = _recording_cells(self.step, d, "NormalGamma")

    @property
    def has_cells(self) -> bool:
        return bool(self._h.any())

    def _params(self) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        return (
            np.asarray(self.m0, dtype=np.float64),
            np.asarray(self.c0, dtype=np.float64),
            np.asarray(self.a0, dtype=np.float64),
            np.asarray(self.b0, dtype=np.float64),
        )

    def prior_array(self) -> FloatArray:
        return np.concatenate([*self._params(), self._h]).astype(np.float64)

    def stat_size(self) -> int:
        return 1 + 2 * self.n_cols

    def cache_size(self) -> int:
        return 3 * self.n_cols + 1

    @classmethod
    def empirical_bayes(cls, X: FloatArray, scale: float | None = None) -> NormalGamma:
        """The class docstring's prior; with ``scale`` in (0, 1), clusters are expected to carry
        that share of each column's variance instead (b0 = a0 scale var) and the cluster means
        the rest (c0 = scale / (1 - scale)), as ``GaussianNW.empirical_bayes``; columns recorded
        on a grid (``recording_step``) get their ``step``."""
        X = _as_data(X)
        n, d = X.shape
        if n == 0:
            raise ValueError("NormalGamma.empirical_bayes needs at least one row")
        bad = ~np.isfinite(X)
        cnt, mean = _good_column_means(X, bad)
        dev = np.where(bad, 0.0, X - mean)
        var = np.divide((dev * dev).sum(axis=0), cnt, out=np.zeros(d), where=cnt > 0)
        grid = recording_step(X)
        step = grid if grid.any() else None
        var = np.maximum(var + grid**2 / 12.0, 1e-12 * np.maximum(1.0, mean * mean))
        a0 = np.ones(d)
        if scale is not None:
            s = check_scale(scale)
            return cls(m0=mean, c0=np.full(d, s / (1.0 - s)), a0=a0, b0=a0 * s * var, step=step)
        return cls(m0=mean, c0=np.ones(d), a0=a0, b0=a0 * var, step=step)

    def check_values(self, X: FloatArray, names: Sequence[str]) -> None:
        X = _as_data(X, self.n_cols)
        names = _check_names(names, self.n_cols)
        _raise_first_bad(X, ~np.isfinite(X), names, "Gaussian values must be finite")

    def restrict(self, cols: Sequence[int]) -> tuple[NormalGamma, list[int]]:
        """The columns ``cols`` alone (``Family.restrict``): their priors, the columns being
        independent."""
        o = np.asarray(cols, dtype=np.int64)
        d = self.n_cols
        m0, c0, a0, b0 = self._params()
        step = None if self.step is None else np.asarray(self.step)[o]
        sub = NormalGamma(m0=m0[o], c0=c0[o], a0=a0[o], b0=b0[o], step=step)
        return sub, [0, *(1 + o).tolist(), *(1 + d + o).tolist()]

    def impute(self, X: FloatArray, s: FloatArray) -> FloatArray:
        """NaN cells set to their column's posterior mean m_n (independent columns)."""
        mn = self.posterior(s)[0]
        return np.where(np.isnan(X), mn[None, :], X)

    def posterior(self, s: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(m_n, c_n, a_n, b_n) per column from a statistics row s (1 + 2 d,)."""
        d = self.n_cols
        s = np.asarray(s, dtype=np.float64)
        m0, c0, a0, b0 = self._params()
        n, u, v = s[0], s[1 : 1 + d], s[1 + d : 1 + 2 * d]
        cn = c0 + n
        dev = u - n * m0
        bn = np.maximum(b0 + 0.5 * (v - 2.0 * m0 * u + n * m0 * m0 - dev * dev / cn), b0)
        return (c0 * m0 + u) / cn, cn, a0 + 0.5 * n, bn + 0.5 * n * self._h

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior means of each column's mean and standard deviation (b_n / (a_n - 1))."""
        names = _check_names(names, self.n_cols)
        mn, _cn, an, bn = self.posterior(s)
        var = bn / np.maximum(an - 1.0, 1e-12)
        out: dict[str, Any] = {}
        for j, nm in enumerate(names):
            out[f"{nm}:mean"] = float(mn[j])
            out[f"{nm}:sd"] = float(math.sqrt(var[j]))
        return out
