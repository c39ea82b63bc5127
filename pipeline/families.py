"""Public likelihood-family objects (seed 000, Appendix B) and the product family.

Each object holds its prior in the seed's parameterisation, checks the columns it is given, and
hands flat arrays to the numba kernels in ``kernels/families``. ``log_marginal(X)`` and
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

from kernels.families import product
from kernels.mapdp import build_stats

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
        Xs = (
            np.empty((0, self.n_cols)) if X is None else _as_2d(X, self.n_cols)
        )
        return self.as_product().log_predictive(xs[0], Xs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_cols={self.n_cols})"


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
        return self.n_cols**2 + 2 * self.n_cols + 4

    @classmethod
    def empirical_bayes(cls, X: FloatArray) -> GaussianNW:
        """m0 = the data mean, c0 = 1 / n... see ``default_prior_notes``."""
        X = np.asarray(X, dtype=np.float64)
        n, d = X.shape
        m0 = X.mean(axis=0)
        cov = np.cov(X, rowvar=False).reshape(d, d) if n > 1 else np.eye(d)
        cov = 0.5 * (cov + cov.T) + 1e-9 * np.trace(cov) / d * np.eye(d)
        a0 = d + 2.0
        c0 = 10.0 / max(n, 1)
        # E[precision] = a0 B0 = cov^{-1}: the prior expects clusters as spread as the data
        B0 = np.linalg.inv(cov) / a0
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
        pass


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

    def stats_of(self, Xa: FloatArray, z: NDArray[np.int64] | None = None, K: int = 1) -> FloatArray:
        """Statistics (K, S) of arranged records Xa (n, D) grouped by z (n,) (all in one if None)."""
        if z is None:
            z = np.zeros(Xa.shape[0], dtype=np.int64)
        return build_stats(Xa, np.asarray(z, dtype=np.int64), K, self.spec, self.n_stats)

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

    def signature(self) -> tuple[Any, ...]:
        """What two statistics arrays must share to be added (bnpy's container check)."""
        return (self.spec.tobytes(), self.prior.tobytes())

    def __repr__(self) -> str:
        parts = ", ".join(f"{type(f).__name__}{cols}" for f, cols in self.groups)
        return f"ProductFamily({parts})"
