"""Public likelihood-family objects (seed 000, Appendix B) and the product family.

Each object holds its prior in the seed's parameterisation, checks the columns it is given, and
hands flat arrays to the numba kernels in ``kernels/obs``. ``log_marginal(X)`` and
``log_predictive(x, X)`` are the two questions every family answers; everything else in the
project (MAP-DP costs, BHC merge probabilities, Metropolis-Hastings ratios, held-out densities)
is built from them over additive sufficient statistics.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kernels.obs import product
from pipeline.persist import register

FloatArray = NDArray[np.float64]

_SPEC_WIDTH = 9


def _as_2d(X: ArrayLike, n_cols: int, what: str = "X") -> FloatArray:
    arr = np.asarray(X, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr.reshape(-1, n_cols) if n_cols > 1 else arr.reshape(-1, 1)
    if arr.ndim != 2 or arr.shape[1] != n_cols:
        raise ValueError(f"{what} must have shape (n_samples, {n_cols}); got {np.shape(X)}")
    return np.ascontiguousarray(arr)


class Family(ABC):
    """A conjugate exponential family over ``n_cols`` columns with its prior.

    Subclasses set ``code`` (the kernel dispatch code) and ``name`` and implement the layout
    methods; ``log_marginal`` and ``log_predictive`` come from the kernels.
    """

    code: ClassVar[int]
    name: ClassVar[str]
    n_cols: int

    # -- layout handed to the kernels ------------------------------------------------------
    @abstractmethod
    def prior_array(self) -> FloatArray:
        """The prior's parameters flattened as the kernel module documents."""

    @abstractmethod
    def stat_size(self) -> int:
        """Length S of a statistics row (``s[0]`` is the count n)."""

    @abstractmethod
    def cache_size(self) -> int:
        """Length C of a cache row."""

    # -- data ------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def empirical_bayes(cls, X: FloatArray) -> Family:
        """The default prior fitted to data X (n, n_cols): seed 000, Appendix A, option 1."""

    def check_values(self, X: FloatArray, names: Sequence[str]) -> None:  # noqa: B027
        """Raise ``ValueError`` naming the column and row of a value outside the support."""

    @abstractmethod
    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior parameters / means of one cluster from its statistics row, for reports."""

    # -- the two questions -----------------------------------------------------------------
    def as_product(self) -> ProductFamily:
        return ProductFamily([(self, list(range(self.n_cols)))])

    def log_marginal(self, X: ArrayLike) -> float:
        """log p(X): the marginal likelihood of the rows of X (n, n_cols), parameters integrated
        out under the prior."""
        return self.as_product().log_marginal(_as_2d(X, self.n_cols))

    def log_predictive(self, x: ArrayLike, X: ArrayLike | None = None) -> float:
        """log p(x | X): the posterior predictive density of one record x (n_cols,) given the
        records X (n, n_cols); the prior predictive when X is None or empty."""
        xs = _as_2d(np.asarray(x, dtype=np.float64).reshape(1, -1), self.n_cols, "x")
        Xs = np.empty((0, self.n_cols)) if X is None else _as_2d(X, self.n_cols)
        return self.as_product().log_predictive(xs[0], Xs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_cols={self.n_cols})"


@register
@dataclass(repr=False)
class GaussianNW(Family):
    """Multivariate Gaussian, unknown mean and full covariance, Normal-Wishart prior.

    Parameters exactly as seed 000, Appendix B: the precision is Wishart with scale matrix
    ``B0`` (d, d) and ``a0`` degrees of freedom (a0 > d - 1), the mean given the precision
    Lambda is Normal(m0, (c0 Lambda)^{-1}). The posterior is eq. B.1; the predictive is the
    Student-t with nu = a - d + 1, mu = m, Lambda = c nu / (c + 1) B.

    Parameters
    ----------
    m0 : array-like of shape (d,)
    c0 : float
    B0 : array-like of shape (d, d), symmetric positive definite
    a0 : float
    """

    m0: ArrayLike
    c0: float
    B0: ArrayLike
    a0: float
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

    def prior_array(self) -> FloatArray:
        d = self.n_cols
        T0 = np.linalg.inv(np.asarray(self.B0))
        T0 = 0.5 * (T0 + T0.T)
        logdet = float(np.linalg.slogdet(T0)[1])
        return np.concatenate(
            [np.asarray(self.m0), [self.c0, self.a0, logdet], T0.reshape(d * d)]
        ).astype(np.float64)

    def stat_size(self) -> int:
        return 1 + self.n_cols + self.n_cols**2

    def cache_size(self) -> int:
        return 2 * self.n_cols**2 + 2 * self.n_cols + 4

    @classmethod
    def empirical_bayes(cls, X: FloatArray, shrink: float = 10.0) -> GaussianNW:
        """The default prior from the data (seed 000, Appendix A, option 1, with one stated belief).

        m0 = the data mean; a0 = d + 2 (the weakest Wishart with a finite mean covariance);
        E[precision] = a0 B0 = (cov / shrink)^{-1}, i.e. a cluster is expected to carry
        1 / ``shrink`` of the data's (co)variance; c0 = 1 / (shrink - 1) so that the spread of
        cluster means, E[Sigma] / c0, accounts for the rest (total = within + between).
        ``shrink = 10`` is a prior belief, not a type-II maximum-likelihood value: maximising the
        marginal likelihood over the whole data treated as one cluster gives shrink = 1, which
        makes one cluster absorb everything.
        """
        X = np.asarray(X, dtype=np.float64)
        n, d = X.shape
        if not shrink > 1:
            raise ValueError(f"GaussianNW.empirical_bayes: shrink must be > 1, got {shrink}")
        m0 = X.mean(axis=0)
        cov = np.cov(X, rowvar=False).reshape(d, d) if n > 1 else np.eye(d)
        cov = 0.5 * (cov + cov.T) + 1e-9 * max(np.trace(cov) / d, 1e-300) * np.eye(d)
        a0 = d + 2.0
        c0 = 1.0 / (shrink - 1.0)
        B0 = np.linalg.inv(cov / shrink) / a0
        return cls(m0=m0, c0=c0, B0=0.5 * (B0 + B0.T), a0=a0)

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        d = self.n_cols
        n = s[0]
        c0, a0 = self.c0, self.a0
        m0 = np.asarray(self.m0)
        ck, ak = c0 + n, a0 + n
        mk = (c0 * m0 + s[1 : 1 + d]) / ck
        T = (
            np.linalg.inv(np.asarray(self.B0))
            + s[1 + d :].reshape(d, d)
            + c0 * np.outer(m0, m0)
            - ck * np.outer(mk, mk)
        )
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
class ProductFamily:
    """A product of families over disjoint column groups: log terms add.

    Parameters
    ----------
    groups : sequence of (Family, list of column indices)
        Column indices refer to the encoded float matrix the kernels see.
    """

    def __init__(self, groups: Sequence[tuple[Family, Sequence[int]]]):
        if not groups:
            raise ValueError("a product family needs at least one column group")
        self.groups: list[tuple[Family, list[int]]] = []
        cols_seen: list[int] = []
        for fam, cols in groups:
            cols = [int(c) for c in cols]
            if len(cols) != fam.n_cols:
                raise ValueError(
                    f"{type(fam).__name__} models {fam.n_cols} columns but was given {len(cols)}"
                )
            cols_seen.extend(cols)
            self.groups.append((fam, cols))
        if len(set(cols_seen)) != len(cols_seen):
            raise ValueError("a column may belong to one family only")
        self.n_cols = len(cols_seen)
        # the kernels read each group's columns as a contiguous slice, so the encoded matrix is
        # permuted into group order once (``column_order``)
        self.column_order = np.asarray(cols_seen, dtype=np.int64)
        spec = np.zeros((len(self.groups), _SPEC_WIDTH), dtype=np.int64)
        priors = []
        col = stat = pri = cac = 0
        for g, (fam, _cols) in enumerate(self.groups):
            p = fam.prior_array()
            spec[g] = [
                fam.code,
                col,
                fam.n_cols,
                stat,
                fam.stat_size(),
                pri,
                p.shape[0],
                cac,
                fam.cache_size(),
            ]
            priors.append(p)
            col += fam.n_cols
            stat += fam.stat_size()
            pri += p.shape[0]
            cac += fam.cache_size()
        self.spec = spec
        self.prior = np.concatenate(priors).astype(np.float64)
        self.n_stats = stat
        self.n_cache = cac

    # -- arrays for the kernels --------------------------------------------------------------
    def arrange(self, X: FloatArray) -> FloatArray:
        """Columns of X (n, n_cols) in group order, C-contiguous float64."""
        return np.ascontiguousarray(np.asarray(X, dtype=np.float64)[:, self.column_order])

    def empty_stats(self, k: int = 1) -> FloatArray:
        return np.zeros((k, self.n_stats))

    def cache_of(self, stats: FloatArray) -> FloatArray:
        """Cache rows (K, C) for statistics rows (K, S)."""
        stats = np.atleast_2d(stats)
        cache = np.zeros((stats.shape[0], self.n_cache))
        for k in range(stats.shape[0]):
            product.refresh(stats[k], cache[k], self.spec, self.prior)
        return cache

    def empty_cache(self) -> FloatArray:
        return self.cache_of(self.empty_stats())[0]

    def stats_of(
        self, Xa: FloatArray, z: NDArray[np.int64] | None = None, K: int = 1
    ) -> FloatArray:
        """Statistics (K, S) of arranged records Xa (n, D) grouped by z (n,) (all in one cluster
        if None)."""
        if z is None:
            z = np.zeros(Xa.shape[0], dtype=np.int64)
        return product.build_stats(Xa, np.asarray(z, dtype=np.int64), K, self.spec, self.n_stats)

    def log_marginal_stats(self, s: FloatArray) -> float:
        return float(product.log_marginal(np.asarray(s, dtype=np.float64), self.spec, self.prior))

    # -- the two questions -------------------------------------------------------------------
    def log_marginal(self, X: FloatArray) -> float:
        """log p(X) of the rows of X (n, n_cols) (columns in the caller's order)."""
        Xa = self.arrange(X)
        return self.log_marginal_stats(self.stats_of(Xa)[0])

    def log_predictive(self, x: FloatArray, X: FloatArray) -> float:
        """log p(x | X) for one record x (n_cols,) given records X (n, n_cols)."""
        Xa = self.arrange(np.atleast_2d(X).reshape(-1, self.n_cols))
        xa = self.arrange(np.asarray(x, dtype=np.float64).reshape(1, -1))[0]
        s = self.stats_of(Xa)[0]
        c = self.cache_of(s[None, :])[0]
        return float(product.log_predictive(xa, s, c, self.spec, self.prior))

    # -- on disk (``pipeline.persist``) --------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """The constructor's argument: ``{"groups": [(family, column indices), ...]}``."""
        return {"groups": [(fam, list(cols)) for fam, cols in self.groups]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ProductFamily:
        """The product family of ``to_state``'s groups, rebuilt (and checked) by ``__init__``."""
        groups = state.get("groups")
        if not isinstance(groups, list) or not all(
            isinstance(g, tuple)
            and len(g) == 2
            and isinstance(g[0], Family)
            and isinstance(g[1], list)
            and all(type(c) is int for c in g[1])
            for g in groups
        ):
            raise ValueError("groups must be a list of (Family, list of column indices) pairs")
        return cls(groups)

    def signature(self) -> tuple[Any, ...]:
        """What two statistics arrays must share to be added (bnpy's container check)."""
        return (self.spec.tobytes(), self.prior.tobytes())

    def __repr__(self) -> str:
        parts = ", ".join(f"{type(f).__name__}{cols}" for f, cols in self.groups)
        return f"ProductFamily({parts})"


# -- helpers for the families of independent columns -----------------------------------------


def _vectors(owner: str, n_cols: int, **params: ArrayLike) -> tuple[int, dict[str, FloatArray]]:
    """Each parameter as a finite float vector of shape (d,): scalars are broadcast; d is
    ``n_cols`` when given (> 0), otherwise the length of the 1-D parameters (1 if all scalar)."""
    if isinstance(n_cols, bool) or int(n_cols) != n_cols or n_cols < 0:
        raise ValueError(f"{owner}: n_cols must be a positive integer, got {n_cols!r}")
    arrs: dict[str, FloatArray] = {}
    for k, v in params.items():
        try:
            a = np.asarray(v, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{owner}: {k} must be numeric, got {v!r}") from err
        if a.ndim > 1:
            raise ValueError(f"{owner}: {k} must be a scalar or 1-D, got shape {a.shape}")
        arrs[k] = a
    sizes = {a.shape[0] for a in arrs.values() if a.ndim == 1}
    if not n_cols and len(sizes) > 1:
        lengths = ", ".join(f"{k} has {a.shape[0]}" for k, a in arrs.items() if a.ndim == 1)
        raise ValueError(f"{owner}: parameters of different lengths ({lengths} entries)")
    d = int(n_cols) if n_cols else (max(sizes) if sizes else 1)
    if d < 1:
        raise ValueError(f"{owner}: needs at least one column")
    out: dict[str, FloatArray] = {}
    for k, a in arrs.items():
        if a.ndim == 1 and a.shape[0] != d:
            raise ValueError(
                f"{owner}: {k} has {a.shape[0]} entries but the family has {d} columns"
            )
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{owner}: {k} must be finite, got {a.tolist()}")
        out[k] = np.array(np.broadcast_to(a, (d,)), dtype=np.float64)
    return d, out


def _require_positive(owner: str, **params: FloatArray) -> None:
    for k, a in params.items():
        if not np.all(a > 0):
            raise ValueError(f"{owner}: {k} must be > 0, got {np.asarray(a).tolist()}")


def _check_names(names: Sequence[str], n_cols: int) -> list[str]:
    names = [str(nm) for nm in names]
    if len(names) != n_cols:
        raise ValueError(f"expected {n_cols} column names, got {len(names)}")
    return names


def _raise_first_bad(
    X: FloatArray, bad: NDArray[np.bool_], names: Sequence[str], what: str
) -> None:
    """Raise ``ValueError`` for the first row (then leftmost column) where ``bad`` holds."""
    if not bad.any():
        return
    rows, cols = np.nonzero(bad)
    i, j = int(rows[0]), int(cols[0])
    v = float(X[i, j])
    raise ValueError(f"column '{names[j]}': row {i} has {v!r}; {what}")


def _as_data(X: ArrayLike, n_cols: int | None = None) -> FloatArray:
    arr = np.asarray(X, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1) if n_cols in (None, 1) else arr.reshape(-1, n_cols)
    if arr.ndim != 2 or (n_cols is not None and arr.shape[1] != n_cols):
        raise ValueError(f"X must have shape (n_samples, {n_cols or 'd'}); got {np.shape(X)}")
    return arr


def _good_column_means(X: FloatArray, bad: NDArray[np.bool_]) -> tuple[FloatArray, FloatArray]:
    """Per-column (number of good values, mean of the good values); mean 0 for none."""
    good = ~bad
    cnt = good.sum(axis=0).astype(np.float64)
    tot = np.where(good, X, 0.0).sum(axis=0)
    return cnt, np.divide(tot, cnt, out=np.zeros_like(tot), where=cnt > 0)


def _not_count(X: FloatArray) -> NDArray[np.bool_]:
    """True where X is not a finite non-negative integer."""
    with np.errstate(invalid="ignore"):
        return ~(np.isfinite(X) & (X >= 0) & (np.floor(X) == X))


@register
@dataclass(repr=False)
class NormalGamma(Family):
    """Gaussian with a diagonal covariance: an independent Normal-Gamma prior on each column.

    Per column j: the precision tau_j ~ Gamma(a0_j, rate b0_j), the mean
    mu_j | tau_j ~ Normal(m0_j, 1 / (c0_j tau_j)). The predictive is a product of Student-t
    densities (2 a_n degrees of freedom, location m_n, scale^2 = b_n (c_n + 1) / (a_n c_n));
    kernel ``kernels/obs/normal_gamma.py``.

    Parameters
    ----------
    m0, c0, a0, b0 : float or array-like of shape (d,)
        Prior mean, its strength (pseudo-records), the precision's shape and rate.
    n_cols : int, optional
        d; by default the length of the array parameters (1 if all are scalars).

    Empirical Bayes (``empirical_bayes``)
    -------------------------------------
    Per column: m0 = the column mean and b0 = a0 * (the column's maximum-likelihood variance),
    which are exactly the values maximising the marginal likelihood of the whole column as one
    cluster (Appendix A, option 1) given the strengths c0 = 1 (one pseudo-record for the mean) and
    a0 = 1 (two for the variance; maximising over the strengths too would send them to infinity).
    So the prior expects clusters as spread as the data, E[tau] = 1 / variance, and holds weakly.
    A variance of 0 is floored at 1e-12 max(1, mean^2).
    """

    m0: ArrayLike
    c0: ArrayLike
    a0: ArrayLike
    b0: ArrayLike
    n_cols: int = 0
    code: ClassVar[int] = product.NORMAL_GAMMA
    name: ClassVar[str] = "diag-gaussian"

    def __post_init__(self) -> None:
        d, v = _vectors("NormalGamma", self.n_cols, m0=self.m0, c0=self.c0, a0=self.a0, b0=self.b0)
        _require_positive("NormalGamma", c0=v["c0"], a0=v["a0"], b0=v["b0"])
        self.m0, self.c0, self.a0, self.b0 = v["m0"], v["c0"], v["a0"], v["b0"]
        self.n_cols = d

    def _params(self) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        return (
            np.asarray(self.m0, dtype=np.float64),
            np.asarray(self.c0, dtype=np.float64),
            np.asarray(self.a0, dtype=np.float64),
            np.asarray(self.b0, dtype=np.float64),
        )

    def prior_array(self) -> FloatArray:
        return np.concatenate(self._params()).astype(np.float64)

    def stat_size(self) -> int:
        return 1 + 2 * self.n_cols

    def cache_size(self) -> int:
        return 3 * self.n_cols + 1

    @classmethod
    def empirical_bayes(cls, X: FloatArray) -> NormalGamma:
        X = _as_data(X)
        n, d = X.shape
        if n == 0:
            raise ValueError("NormalGamma.empirical_bayes needs at least one row")
        bad = ~np.isfinite(X)
        cnt, mean = _good_column_means(X, bad)
        dev = np.where(bad, 0.0, X - mean)
        var = np.divide((dev * dev).sum(axis=0), cnt, out=np.zeros(d), where=cnt > 0)
        var = np.maximum(var, 1e-12 * np.maximum(1.0, mean * mean))
        a0 = np.ones(d)
        return cls(m0=mean, c0=np.ones(d), a0=a0, b0=a0 * var)

    def check_values(self, X: FloatArray, names: Sequence[str]) -> None:
        X = _as_data(X, self.n_cols)
        names = _check_names(names, self.n_cols)
        _raise_first_bad(X, ~np.isfinite(X), names, "Gaussian values must be finite")

    def posterior(self, s: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(m_n, c_n, a_n, b_n) per column from a statistics row s (1 + 2 d,)."""
        d = self.n_cols
        s = np.asarray(s, dtype=np.float64)
        m0, c0, a0, b0 = self._params()
        n, u, v = s[0], s[1 : 1 + d], s[1 + d : 1 + 2 * d]
        cn = c0 + n
        dev = u - n * m0
        bn = np.maximum(b0 + 0.5 * (v - 2.0 * m0 * u + n * m0 * m0 - dev * dev / cn), b0)
        return (c0 * m0 + u) / cn, cn, a0 + 0.5 * n, bn

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior means of each column's mean and (as a standard deviation) variance,
        E[1 / tau] = b_n / (a_n - 1)."""
        names = _check_names(names, self.n_cols)
        mn, _cn, an, bn = self.posterior(s)
        var = bn / np.maximum(an - 1.0, 1e-12)
        out: dict[str, Any] = {}
        for j, nm in enumerate(names):
            out[f"{nm}:mean"] = float(mn[j])
            out[f"{nm}:sd"] = float(math.sqrt(var[j]))
        return out


@register
@dataclass(repr=False)
class Categorical(Family):
    """One categorical column with codes 0..C-1 and a Dirichlet(alpha) prior.

    The predictive is the one-draw Dirichlet-multinomial (alpha_c + n_c) / (sum alpha + n);
    kernel ``kernels/obs/categorical.py``. The encoded column holds the integer code as a
    float.

    Parameters
    ----------
    alpha : array-like of shape (C,)
        Dirichlet concentrations, all > 0.

    Empirical Bayes (``empirical_bayes``)
    -------------------------------------
    alpha_c = (n_c + 1 / C) / (n + 1): the prior mean is the category frequencies of the data after
    adding one pseudo-record spread evenly over the C categories (so no category has probability
    0), and the total strength sum alpha = 1 is one record. (The marginal likelihood of the data
    as one cluster would be maximised by an infinitely strong prior at the frequencies.)
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
        return cls(alpha=(counts + 1.0 / C) / (counts.sum() + 1.0))

    def check_values(self, X: FloatArray, names: Sequence[str]) -> None:
        X = _as_data(X, 1)
        names = _check_names(names, 1)
        C = self.n_categories
        _raise_first_bad(
            X, self._bad(X, C), names, f"categorical codes must be integers in 0..{C - 1}"
        )

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
    """Shared layout of the per-column (a, b) families: Poisson, Exponential and Geometric.

    Each holds two positive prior vectors ``a`` and ``b`` of length d (the kernel's prior layout
    is a (d), b (d)), a cache of 2 d + 1 numbers, and one support rule for its values. Subclasses
    set ``code``, ``name``, ``_support`` (the message for a value outside the support) and, where
    the support is not the non-negative integers, ``_bad``.
    """

    a: ArrayLike
    b: ArrayLike
    n_cols: int = 0
    _support: ClassVar[str]

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
        return 2 * self.n_cols + 1

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


@register
@dataclass(repr=False)
class Poisson(_RateFamily):
    """Independent Poisson count columns, a Gamma(a, rate b) prior on each rate.

    The predictive is negative binomial with a_n = a + sum x successes and success probability
    b_n / (b_n + 1), b_n = b + n; kernel ``kernels/obs/poisson_gamma.py``.

    Parameters
    ----------
    a, b : float or array-like of shape (d,)
        Shape and rate of the Gamma prior (a pseudo-sum of counts over b pseudo-records).
    n_cols : int, optional
        d; by default the length of the array parameters (1 if both are scalars).

    Empirical Bayes (``empirical_bayes``)
    -------------------------------------
    Per column: b = 1 (one pseudo-record) and a = the column mean (moment matching: prior mean
    rate a / b = the mean count), floored at 1 / (n + 1) for an all-zero column.
    """

    code: ClassVar[int] = product.POISSON_GAMMA
    name: ClassVar[str] = "poisson"
    _support: ClassVar[str] = "Poisson counts must be non-negative integers"

    def stat_size(self) -> int:
        return 1 + 2 * self.n_cols

    @classmethod
    def empirical_bayes(cls, X: FloatArray) -> Poisson:
        X = cls._rows(X)
        n = X.shape[0]
        _cnt, mean = _good_column_means(X, _not_count(X))
        return cls(a=np.maximum(mean, 1.0 / (n + 1.0)), b=np.ones(X.shape[1]))

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

    Column j counts successes out of ``n_trials[j]``; the predictive is beta-binomial; kernel
    ``kernels/obs/beta_binomial.py`` (whose statistics include a histogram of each column's
    counts over 0..max(n_trials), so keep the numbers of trials moderate).

    Parameters
    ----------
    n_trials : int or array-like of shape (d,)
        Number of trials per column, a positive integer.
    a, b : float or array-like of shape (d,)
        Beta prior on the success probability (pseudo-successes and pseudo-failures).
    n_cols : int, optional
        d; by default the length of the array parameters (1 if all are scalars).

    Empirical Bayes (``empirical_bayes``)
    -------------------------------------
    Per column: a = N p, b = N (1 - p) with N the number of trials and p = (sum x + 1/2) /
    (n N + 1) the success rate of the data (smoothed by half a pseudo-success so it is never 0 or
    1): the prior mean is the data's success rate (moment matching) and a + b = N is one record's
    worth of trials. ``n_trials`` defaults to the column maximum (at least 1).
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
        return 2 * self.n_cols + 1

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
        return N * p, N * (1.0 - p)

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

    Empirical Bayes: a = p, b = 1 - p with p = (sum x + 1/2) / (n + 1), the smoothed frequency of
    ones (the ``Binomial`` rule with N = 1; a + b = 1 is one record).
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
    """Independent exponential columns (x >= 0), a Gamma(a, rate b) prior on each rate.

    The predictive is Lomax with shape a_n = a + n and scale b_n = b + sum x; kernel
    ``kernels/obs/exponential_gamma.py``.

    Parameters
    ----------
    a, b : float or array-like of shape (d,)
        Shape (pseudo-records) and rate (pseudo-sum of x) of the Gamma prior.
    n_cols : int, optional
        d; by default the length of the array parameters (1 if both are scalars).

    Empirical Bayes (``empirical_bayes``)
    -------------------------------------
    Per column: a = 1 (one pseudo-record) and b = the column mean (moment matching: prior mean
    rate a / b = 1 / mean), b = 1 for an all-zero column.
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

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior mean rate (a + n) / (b + sum x) per column, keys ``"name:rate"``."""
        names = _check_names(names, self.n_cols)
        s = np.asarray(s, dtype=np.float64)
        d = self.n_cols
        rate = (np.asarray(self.a) + s[0]) / (np.asarray(self.b) + s[1 : 1 + d])
        return {f"{nm}:rate": float(rate[j]) for j, nm in enumerate(names)}


@register
@dataclass(repr=False)
class Geometric(_RateFamily):
    """Independent geometric columns on {0, 1, 2, ...} (failures before the first success),
    p(x | theta) = theta (1 - theta)^x, with a Beta(a, b) prior on theta.

    The predictive is the ratio of beta functions B(a_n + 1, b_n + x) / B(a_n, b_n) with
    a_n = a + n, b_n = b + sum x; kernel ``kernels/obs/geometric_beta.py``.

    Parameters
    ----------
    a, b : float or array-like of shape (d,)
        Beta prior (pseudo-records and pseudo-sum of x).
    n_cols : int, optional
        d; by default the length of the array parameters (1 if both are scalars).

    Empirical Bayes (``empirical_bayes``)
    -------------------------------------
    Per column: a = 1 (one pseudo-record) and b = the column mean, so the prior mean of theta,
    a / (a + b) = 1 / (1 + mean), is the maximum-likelihood estimate (moment matching); b is
    floored at 1 / (n + 1) for an all-zero column.
    """

    code: ClassVar[int] = product.GEOMETRIC_BETA
    name: ClassVar[str] = "geometric"
    _support: ClassVar[str] = "geometric counts must be non-negative integers"

    @classmethod
    def empirical_bayes(cls, X: FloatArray) -> Geometric:
        X = cls._rows(X)
        n = X.shape[0]
        _cnt, mean = _good_column_means(X, _not_count(X))
        return cls(a=np.ones(X.shape[1]), b=np.maximum(mean, 1.0 / (n + 1.0)))

    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior mean success probability (a + n) / (a + b + n + sum x), keys ``"name:p"``."""
        names = _check_names(names, self.n_cols)
        s = np.asarray(s, dtype=np.float64)
        d = self.n_cols
        an = np.asarray(self.a) + s[0]
        bn = np.asarray(self.b) + s[1 : 1 + d]
        return {f"{nm}:p": float(an[j] / (an[j] + bn[j])) for j, nm in enumerate(names)}


def check_summaries(stats: ArrayLike, family: ProductFamily) -> FloatArray:
    """Leaf statistics (L, S) as a C-contiguous float array, checked: the family's width, at
    least one leaf, finite, every leaf summarising at least one record."""
    try:
        arr = np.ascontiguousarray(np.asarray(stats, dtype=np.float64))
    except (TypeError, ValueError) as err:
        raise ValueError(f"stats must be a numeric array: {err}") from err
    if arr.ndim != 2 or arr.shape[1] != family.n_stats:
        raise ValueError(
            f"stats must have shape (n_leaves, {family.n_stats}) for {family!r}; "
            f"got {np.shape(stats)}"
        )
    if arr.shape[0] < 1:
        raise ValueError("stats must hold at least one leaf")
    if not np.all(np.isfinite(arr)):
        raise ValueError("stats contains NaN or infinity")
    if not np.all(arr[:, 0] > 0):
        raise ValueError("every leaf must summarise n > 0 records (stats[:, 0] > 0)")
    return arr


def as_product(family: Family | ProductFamily) -> ProductFamily:
    """``family`` as a ``ProductFamily`` (a single ``Family`` becomes a one-group product).

    Raises ``ValueError`` for anything else.
    """
    if isinstance(family, ProductFamily):
        return family
    if isinstance(family, Family):
        return family.as_product()
    raise ValueError(
        f"family must be 'gaussian', a Family or a ProductFamily; got {type(family).__name__}"
    )


FAMILIES: dict[str, type[Family]] = {
    "gaussian": GaussianNW,
    "diag-gaussian": NormalGamma,
    "categorical": Categorical,
    "poisson": Poisson,
    "binomial": Binomial,
    "bernoulli": Bernoulli,
    "exponential": Exponential,
    "geometric": Geometric,
}
