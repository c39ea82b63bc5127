"""Families of counts, categories and rates (Raykov et al. 2016, Appendix B): categorical
(Dirichlet), Poisson and exponential (Gamma), binomial, Bernoulli and geometric (Beta)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kernels.obs import product
from pipeline.core.persist import register
from pipeline.families.base import (
    Family,
    FloatArray,
    _as_data,
    _check_names,
    _good_column_means,
    _not_count,
    _raise_first_bad,
    _require_positive,
    _vectors,
)

#: the strength of the empirical-Bayes Beta and Dirichlet priors, a share of the records
DISCRETE_SHARE = 0.05


def discrete_strength(n: int) -> float:
    """The pseudo-records kappa = max(1, ``DISCRETE_SHARE`` n) of the empirical-Bayes Beta and
    Dirichlet priors fitted to n records (``Categorical``, ``Binomial``, ``Bernoulli``).

    A cluster's frequencies are pulled half-way back to the data's when it holds kappa records,
    so a cluster much smaller than ``DISCRETE_SHARE`` of the records cannot stand out on its
    binary and categorical columns alone (with one pseudo-record, 189 clusters on 200 rows of
    the StatLog DNA table). It is a belief about the smallest cluster worth reporting.
    """
    return max(1.0, DISCRETE_SHARE * float(n))


@register
@dataclass(repr=False)
class Categorical(Family):
    """One categorical column with codes 0..C-1 and a Dirichlet(alpha) prior.

    The predictive is the one-draw Dirichlet-multinomial; kernel ``kernels/obs/categorical.py``.
    The encoded column holds the integer code as a float.

    Parameters
    ----------
    alpha : array-like of shape (C,)
        Dirichlet concentrations, all > 0.

    Notes
    -----
    Empirical Bayes (``empirical_bayes``):
    alpha_c = kappa (n_c + 1 / C) / (n + 1): the data's frequencies after one pseudo-record
    spread over the categories, with strength kappa = ``discrete_strength(n)``.
    """

    alpha: ArrayLike
    code: ClassVar[int] = product.CATEGORICAL
    name: ClassVar[str] = "categorical"
    n_cols: int = field(init=False, default=1)

    def __post_init__(self) -> None:
        try:
            alpha = np.asarray(self.alpha, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"Categorical: alpha must be numeric, got {self.alpha!r}") from err
        if alpha.ndim != 1 or alpha.shape[0] < 1:
            raise ValueError(
                f"Categorical: alpha must have shape (C,) with C >= 1, got {alpha.shape}"
            )
        if not np.all(np.isfinite(alpha) & (alpha > 0)):
            raise ValueError(f"Categorical: alpha must be finite and > 0, got {alpha.tolist()}")
        self.alpha = alpha
        self.n_cols = 1

    @property
    def n_categories(self) -> int:
        return int(np.asarray(self.alpha).shape[0])

    def prior_array(self) -> FloatArray:
        alpha = np.asarray(self.alpha, dtype=np.float64)
        A = float(alpha.sum())
        lnorm = math.lgamma(A) - sum(math.lgamma(float(a)) for a in alpha)
        return np.concatenate([alpha, [A, lnorm]]).astype(np.float64)

    def stat_size(self) -> int:
        return 1 + self.n_categories

    def cache_size(self) -> int:
        return self.n_categories + 1

    def _bad(self, X: FloatArray, C: int) -> NDArray[np.bool_]:
        with np.errstate(invalid="ignore"):
            return _not_count(X) | ~(X < C)

    @classmethod
    def empirical_bayes(cls, X: FloatArray, n_categories: int | None = None) -> Categorical:
        """See the class docstring; C = ``n_categories``, by default the largest code + 1."""
        X = _as_data(X, 1)
        n = X.shape[0]
        if n == 0:
            raise ValueError("Categorical.empirical_bayes needs at least one row")
        ok = ~_not_count(X[:, 0])
        if n_categories is None:
            C = int(X[ok, 0].max()) + 1 if ok.any() else 1
        else:
            C = int(n_categories)
            if C < 1:
                raise ValueError(f"Categorical: n_categories must be >= 1, got {n_categories}")
            ok &= X[:, 0] < C
        counts = np.bincount(X[ok, 0].astype(np.int64), minlength=C).astype(np.float64)
        kappa = discrete_strength(int(counts.sum()))
        return cls(alpha=kappa * (counts + 1.0 / C) / (counts.sum() + 1.0))

    def check_values(self, X: FloatArray, names: Sequence[str]) -> None:
        X = _as_data(X, 1)
        names = _check_names(names, 1)
        C = self.n_categories
        _raise_first_bad(
            X, self._bad(X, C), names, f"categorical codes must be integers in 0..{C - 1}"
        )

    def restrict(self, cols: Sequence[int]) -> tuple[Categorical, list[int]]:
        """One column: observed, it is the whole family (``Family.restrict``)."""
        if list(cols) != [0]:
            raise ValueError(f"Categorical has one column; cannot restrict to {list(cols)}")
        return self, list(range(self.stat_size()))

    def impute(self, X: FloatArray, s: FloatArray) -> FloatArray:
        """A missing code set to the cluster's most probable category (argmax alpha_c + n_c)."""
        C = self.n_categories
        mode = float(np.argmax(np.asarray(self.alpha) + np.asarray(s)[1 : 1 + C]))
        return np.where(np.isnan(X), mode, X)

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior mean probability of each category, keys ``"name:p[c]"``."""
        (nm,) = _check_names(names, 1)
        s = np.asarray(s, dtype=np.float64)
        alpha = np.asarray(self.alpha, dtype=np.float64)
        post = alpha + s[1 : 1 + alpha.shape[0]]
        post = post / post.sum()
        return {f"{nm}:p[{c}]": float(v) for c, v in enumerate(post)}


@dataclass(repr=False)
class _RateFamily(Family):
    """Shared layout of Poisson, Exponential and Geometric: per-column (a, b) priors; subclasses
    set ``code``, ``name``, ``_support`` and, for other supports than counts, ``_bad``."""

    a: ArrayLike
    b: ArrayLike
    n_cols: int = 0
    _support: ClassVar[str]
    # the width of the kernel's per-column table of count predictives (0: none)
    _table: ClassVar[int] = 0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        d, v = _vectors(owner, self.n_cols, a=self.a, b=self.b)
        _require_positive(owner, a=v["a"], b=v["b"])
        self.a, self.b = v["a"], v["b"]
        self.n_cols = d

    def prior_array(self) -> FloatArray:
        return np.concatenate([np.asarray(self.a), np.asarray(self.b)]).astype(np.float64)

    def stat_size(self) -> int:
        return 1 + self.n_cols

    def cache_size(self) -> int:
        return (2 + self._table) * self.n_cols + 1

    @staticmethod
    def _bad(X: FloatArray) -> NDArray[np.bool_]:
        """True where a value is outside the support (default: not a non-negative integer)."""
        return _not_count(X)

    @classmethod
    def _rows(cls, X: FloatArray) -> FloatArray:
        """X as data for ``empirical_bayes``; raises for no rows."""
        X = _as_data(X)
        if X.shape[0] == 0:
            raise ValueError(f"{cls.__name__}.empirical_bayes needs at least one row")
        return X

    def check_values(self, X: FloatArray, names: Sequence[str]) -> None:
        X = _as_data(X, self.n_cols)
        names = _check_names(names, self.n_cols)
        _raise_first_bad(X, self._bad(X), names, self._support)

    def restrict(self, cols: Sequence[int]) -> tuple[_RateFamily, list[int]]:
        """The columns ``cols`` alone: independent columns keep their priors and statistics."""
        o = np.asarray(cols, dtype=np.int64)
        d = self.n_cols
        blocks = (self.stat_size() - 1) // d
        sub = type(self)(a=np.asarray(self.a)[o], b=np.asarray(self.b)[o])
        return sub, [0, *[1 + b * d + j for b in range(blocks) for j in o.tolist()]]

    def _predictive_mean(self, s: FloatArray) -> FloatArray:
        """The predictive mean of each column under the statistics row s (d,)."""
        raise NotImplementedError

    def _posterior(self, s: FloatArray) -> tuple[FloatArray, FloatArray]:
        """a + n and b + sum x (d,) each under the statistics row s (Exponential, Geometric)."""
        s = np.asarray(s, dtype=np.float64)
        return np.asarray(self.a) + s[0], np.asarray(self.b) + s[1 : 1 + self.n_cols]

    def impute(self, X: FloatArray, s: FloatArray) -> FloatArray:
        """NaN cells set to the predictive mean given the cluster (rounded for counts): these
        predictives' modes sit at 0 for every cluster."""
        mean = self._predictive_mean(np.asarray(s, dtype=np.float64))
        return np.where(np.isnan(X), mean[None, :], X)


@register
@dataclass(repr=False)
class Poisson(_RateFamily):
    """Independent Poisson count columns, a Gamma(a, rate b) prior on each rate; negative
    binomial predictive (``kernels/obs/poisson_gamma.py``).

    Parameters
    ----------
    a, b : float or array-like of shape (d,)
        Shape and rate of the Gamma prior (a pseudo-sum of counts over b pseudo-records).
    n_cols : int, optional
        d; by default the length of the array parameters (1 if both are scalars).

    Notes
    -----
    Empirical Bayes (``empirical_bayes``):
    Per column: b = 1 and a = the column mean (moment matching), floored at 1 / (n + 1).
    """

    code: ClassVar[int] = product.POISSON_GAMMA
    name: ClassVar[str] = "poisson"
    _support: ClassVar[str] = "Poisson counts must be non-negative integers"
    _table: ClassVar[int] = product.COUNT_TABLE

    def stat_size(self) -> int:
        return 1 + 2 * self.n_cols

    @classmethod
    def empirical_bayes(cls, X: FloatArray) -> Poisson:
        X = cls._rows(X)
        n = X.shape[0]
        _cnt, mean = _good_column_means(X, _not_count(X))
        return cls(a=np.maximum(mean, 1.0 / (n + 1.0)), b=np.ones(X.shape[1]))

    def _predictive_mean(self, s: FloatArray) -> FloatArray:
        d = self.n_cols
        return np.round((np.asarray(self.a) + s[1 : 1 + d]) / (np.asarray(self.b) + s[0]))

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior mean rate (a + sum x) / (b + n) per column, keys ``"name:rate"``."""
        names = _check_names(names, self.n_cols)
        s = np.asarray(s, dtype=np.float64)
        d = self.n_cols
        rate = (np.asarray(self.a) + s[1 : 1 + d]) / (np.asarray(self.b) + s[0])
        return {f"{nm}:rate": float(rate[j]) for j, nm in enumerate(names)}


@register
@dataclass(repr=False)
class Binomial(Family):
    """Independent binomial count columns with known numbers of trials, Beta(a, b) priors.

    The predictive is beta-binomial; kernel ``kernels/obs/beta_binomial.py`` (its statistics hold
    a histogram over 0..max(n_trials), so keep the numbers of trials moderate).

    Parameters
    ----------
    n_trials : int or array-like of shape (d,)
        Number of trials per column, a positive integer.
    a, b : float or array-like of shape (d,)
        Beta prior on the success probability (pseudo-successes and pseudo-failures).
    n_cols : int, optional
        d; by default the length of the array parameters (1 if all are scalars).

    Notes
    -----
    Empirical Bayes (``empirical_bayes``):
    Per column: a = kappa N p, b = kappa N (1 - p), N the trials and p = (sum x + 1/2) / (n N + 1)
    the smoothed success rate, kappa = ``discrete_strength(n)``; ``n_trials`` defaults to the
    column maximum (at least 1).
    """

    n_trials: ArrayLike
    a: ArrayLike
    b: ArrayLike
    n_cols: int = 0
    code: ClassVar[int] = product.BETA_BINOMIAL
    name: ClassVar[str] = "binomial"

    def __post_init__(self) -> None:
        owner = type(self).__name__
        d, v = _vectors(owner, self.n_cols, n_trials=self.n_trials, a=self.a, b=self.b)
        N = v["n_trials"]
        if not np.all((N >= 1) & (np.floor(N) == N)):
            raise ValueError(f"{owner}: n_trials must be positive integers, got {N.tolist()}")
        _require_positive(owner, a=v["a"], b=v["b"])
        self.n_trials, self.a, self.b = N, v["a"], v["b"]
        self.n_cols = d

    def _width(self) -> int:
        """H = max n_trials + 1: the per-column histogram width of the statistics."""
        return int(np.max(np.asarray(self.n_trials))) + 1

    def prior_array(self) -> FloatArray:
        N = np.asarray(self.n_trials, dtype=np.float64)
        H = self._width()
        table = np.zeros((self.n_cols, H))
        for j, Nj in enumerate(N):
            for v in range(int(Nj) + 1):
                table[j, v] = math.lgamma(Nj + 1.0) - math.lgamma(v + 1.0) - math.lgamma(Nj - v + 1)
        return np.concatenate(
            [N, np.asarray(self.a), np.asarray(self.b), table.reshape(-1)]
        ).astype(np.float64)

    def stat_size(self) -> int:
        return 1 + self.n_cols + self.n_cols * self._width()

    def cache_size(self) -> int:
        return 2 * self.n_cols + 1 + self.n_cols * self._width()

    def _bad(self, X: FloatArray) -> NDArray[np.bool_]:
        with np.errstate(invalid="ignore"):
            return _not_count(X) | (X > np.asarray(self.n_trials)[None, :])

    @classmethod
    def _fit(cls, X: FloatArray, N: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(a, b) of the empirical-Bayes rule for counts X (n, d) out of N (d,) trials."""
        with np.errstate(invalid="ignore"):
            bad = _not_count(X) | (X > N[None, :])
        cnt, mean = _good_column_means(X, bad)
        p = (cnt * mean + 0.5) / (cnt * N + 1.0)
        kappa = np.array([discrete_strength(int(c)) for c in cnt])
        return kappa * N * p, kappa * N * (1.0 - p)

    @classmethod
    def empirical_bayes(cls, X: FloatArray, n_trials: ArrayLike | None = None) -> Binomial:
        """See the class docstring."""
        X = _as_data(X)
        n, d = X.shape
        if n == 0:
            raise ValueError(f"{cls.__name__}.empirical_bayes needs at least one row")
        if n_trials is None:
            good = np.where(_not_count(X), 0.0, X)
            N = np.maximum(good.max(axis=0), 1.0)
        else:
            N = np.array(np.broadcast_to(np.asarray(n_trials, dtype=np.float64), (d,)))
        a, b = cls._fit(X, N)
        return cls(n_trials=N, a=a, b=b)

    def check_values(self, X: FloatArray, names: Sequence[str]) -> None:
        X = _as_data(X, self.n_cols)
        names = _check_names(names, self.n_cols)
        bad = self._bad(X)
        if not bad.any():
            return
        _rows, cols = np.nonzero(bad)
        N = int(np.asarray(self.n_trials)[int(cols[0])])
        what = (
            "Bernoulli values must be 0 or 1"
            if isinstance(self, Bernoulli)
            else f"binomial counts must be integers in 0..{N} (the number of trials)"
        )
        _raise_first_bad(X, bad, names, what)

    def restrict(self, cols: Sequence[int]) -> tuple[Binomial, list[int]]:
        """The columns ``cols`` alone: their priors, and their count histograms within the width."""
        o = np.asarray(cols, dtype=np.int64)
        d, H = self.n_cols, self._width()
        a, b = np.asarray(self.a)[o], np.asarray(self.b)[o]
        N = np.asarray(self.n_trials)[o]
        sub = Bernoulli(a=a, b=b) if isinstance(self, Bernoulli) else Binomial(n_trials=N, a=a, b=b)
        H2 = sub._width()
        hist = [1 + d + j * H + v for j in o.tolist() for v in range(H2)]
        return sub, [0, *(1 + o).tolist(), *hist]

    def impute(self, X: FloatArray, s: FloatArray) -> FloatArray:
        """NaN cells set to the count nearest the predictive mean N a_n / (a_n + b_n)."""
        d = self.n_cols
        s = np.asarray(s, dtype=np.float64)
        N = np.asarray(self.n_trials)
        an = np.asarray(self.a) + s[1 : 1 + d]
        bn = np.asarray(self.b) + s[0] * N - s[1 : 1 + d]
        mode = np.round(N * an / (an + bn))
        return np.where(np.isnan(X), mode[None, :], X)

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior mean success probability per column, keys ``"name:p"``."""
        names = _check_names(names, self.n_cols)
        s = np.asarray(s, dtype=np.float64)
        d = self.n_cols
        N = np.asarray(self.n_trials)
        an = np.asarray(self.a) + s[1 : 1 + d]
        bn = np.asarray(self.b) + s[0] * N - s[1 : 1 + d]
        return {f"{nm}:p": float(an[j] / (an[j] + bn[j])) for j, nm in enumerate(names)}


@register
@dataclass(repr=False)
class Bernoulli(Binomial):
    """Independent 0/1 columns with Beta(a, b) priors: ``Binomial`` with one trial.

    Empirical Bayes: a = kappa p, b = kappa (1 - p) with p = (sum x + 1/2) / (n + 1), the smoothed
    frequency of ones, and kappa = ``discrete_strength(n)`` (the ``Binomial`` rule with N = 1).
    """

    n_trials: ArrayLike = field(init=False, default=1.0)
    name: ClassVar[str] = "bernoulli"

    @classmethod
    def empirical_bayes(cls, X: FloatArray, n_trials: ArrayLike | None = None) -> Bernoulli:
        """See the class docstring; ``n_trials`` may only be None or 1."""
        X = _as_data(X)
        n, d = X.shape
        if n == 0:
            raise ValueError("Bernoulli.empirical_bayes needs at least one row")
        if n_trials is not None and not np.all(np.asarray(n_trials) == 1):
            raise ValueError(f"Bernoulli: n_trials must be 1, got {n_trials!r}")
        a, b = cls._fit(X, np.ones(d))
        return cls(a=a, b=b)


@register
@dataclass(repr=False)
class Exponential(_RateFamily):
    """Independent exponential columns (x >= 0), a Gamma(a, rate b) prior on each rate; Lomax
    predictive (``kernels/obs/exponential_gamma.py``).

    Parameters
    ----------
    a, b : float or array-like of shape (d,)
        Shape (pseudo-records) and rate (pseudo-sum of x) of the Gamma prior.
    n_cols : int, optional
        d; by default the length of the array parameters (1 if both are scalars).

    Notes
    -----
    Empirical Bayes (``empirical_bayes``):
    Per column: a = 1 and b = the column mean (moment matching), 1 for an all-zero column.
    """

    code: ClassVar[int] = product.EXPONENTIAL_GAMMA
    name: ClassVar[str] = "exponential"
    _support: ClassVar[str] = "exponential values must be finite and >= 0"

    @staticmethod
    def _bad(X: FloatArray) -> NDArray[np.bool_]:
        with np.errstate(invalid="ignore"):
            return ~(np.isfinite(X) & (X >= 0))

    @classmethod
    def empirical_bayes(cls, X: FloatArray) -> Exponential:
        X = cls._rows(X)
        _cnt, mean = _good_column_means(X, cls._bad(X))
        return cls(a=np.ones(X.shape[1]), b=np.where(mean > 0, mean, 1.0))

    def _predictive_mean(self, s: FloatArray) -> FloatArray:
        # the Lomax mean b_n / (a_n - 1), finite from a_n > 1 (b_n / a_n below)
        an, bn = self._posterior(s)
        return bn / np.where(an > 1.0, an - 1.0, an)

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior mean rate (a + n) / (b + sum x) per column, keys ``"name:rate"``."""
        names = _check_names(names, self.n_cols)
        an, bn = self._posterior(s)
        return {f"{nm}:rate": float(an[j] / bn[j]) for j, nm in enumerate(names)}


@register
@dataclass(repr=False)
class Geometric(_RateFamily):
    """Independent geometric columns on {0, 1, 2, ...} (failures before the first success),
    p(x | theta) = theta (1 - theta)^x, with a Beta(a, b) prior on theta.

    Kernel ``kernels/obs/geometric_beta.py``.

    Parameters
    ----------
    a, b : float or array-like of shape (d,)
        Beta prior (pseudo-records and pseudo-sum of x).
    n_cols : int, optional
        d; by default the length of the array parameters (1 if both are scalars).

    Notes
    -----
    Empirical Bayes (``empirical_bayes``):
    Per column: a = 1 and b = the column mean (moment matching), floored at 1 / (n + 1).
    """

    code: ClassVar[int] = product.GEOMETRIC_BETA
    name: ClassVar[str] = "geometric"
    _support: ClassVar[str] = "geometric counts must be non-negative integers"
    _table: ClassVar[int] = product.COUNT_TABLE

    @classmethod
    def empirical_bayes(cls, X: FloatArray) -> Geometric:
        X = cls._rows(X)
        n = X.shape[0]
        _cnt, mean = _good_column_means(X, _not_count(X))
        return cls(a=np.ones(X.shape[1]), b=np.maximum(mean, 1.0 / (n + 1.0)))

    def _predictive_mean(self, s: FloatArray) -> FloatArray:
        # failures before a success: b_n / (a_n - 1), finite from a_n > 1 (b_n / a_n below)
        an, bn = self._posterior(s)
        return np.round(bn / np.where(an > 1.0, an - 1.0, an))

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior mean success probability (a + n) / (a + b + n + sum x), keys ``"name:p"``."""
        names = _check_names(names, self.n_cols)
        an, bn = self._posterior(s)
        return {f"{nm}:p": float(an[j] / (an[j] + bn[j])) for j, nm in enumerate(names)}
