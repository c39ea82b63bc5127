"""The family interface (``Family``) and the checks the families of independent columns share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    from pipeline.families.product import ProductFamily

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

    @property
    def has_cells(self) -> bool:
        """Whether some column is recorded on a grid whose cells' variance the kernels count
        (Gaussian families with a ``step``): such a prior needs the kernels compiled with the
        cells' code."""
        return False

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
        from pipeline.families.product import ProductFamily

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
