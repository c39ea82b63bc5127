"""The family interface (``Family``), the product of families over disjoint column groups
(``ProductFamily``: log terms add; every family is used through one), and the checks and
conversions of what a family is given."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kernels.obs import product
from pipeline.core.persist import register

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
        """Whether a column is recorded on a grid (kernels then compiled with the cells' code)."""
        return False

    @classmethod
    @abstractmethod
    def empirical_bayes(cls, X: FloatArray) -> Family:
        """The default prior fitted to X (n, n_cols): Raykov et al. 2016, Appendix A, option 1."""

    def check_values(self, X: FloatArray, names: Sequence[str]) -> None:  # noqa: B027
        """Raise ``ValueError`` naming the column and row of a value outside the support."""

    @abstractmethod
    def posterior_summary(self, s: FloatArray, names: Sequence[str]) -> dict[str, Any]:
        """Posterior parameters / means of one cluster from its statistics row, for reports."""

    def restrict(self, cols: Sequence[int]) -> tuple[Family, list[int]]:
        """``(family, stat_index)``: the family of the columns ``cols`` alone, with this prior's
        marginal on them (so its predictive is this one's marginalised exactly over the other
        columns), and ``s[stat_index]`` its statistics row of a row s of this family."""
        raise NotImplementedError(f"{type(self).__name__} does not take missing values")

    def impute(self, X: FloatArray, s: FloatArray) -> FloatArray:
        """X (m, n_cols) with its NaN cells set to their conditional mode given the row's observed
        cells under the cluster of statistics row s (S,): the ICM step of a latent cell."""
        raise NotImplementedError(f"{type(self).__name__} does not take missing values")

    def as_product(self) -> ProductFamily:
        return ProductFamily([(self, list(range(self.n_cols)))])

    def log_marginal(self, X: ArrayLike) -> float:
        """log p(X) of the rows of X (n, n_cols), parameters integrated out under the prior."""
        return self.as_product().log_marginal(_as_2d(X, self.n_cols))

    def log_predictive(self, x: ArrayLike, X: ArrayLike | None = None) -> float:
        """log p(x | X): the posterior predictive density of one record x (n_cols,) given the
        records X (n, n_cols); the prior predictive when X is None or empty."""
        xs = _as_2d(np.asarray(x, dtype=np.float64).reshape(1, -1), self.n_cols, "x")
        Xs = np.empty((0, self.n_cols)) if X is None else _as_2d(X, self.n_cols)
        return self.as_product().log_predictive(xs[0], Xs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_cols={self.n_cols})"


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
class ProductFamily:
    """A product of families over disjoint column groups: log terms add.

    Parameters
    ----------
    groups : sequence of (Family, list of column indices)
        Column indices refer to the encoded float matrix the kernels see.
    """

    #: a copy of ``widened``'s (its spec int64 where the family set's own would be int16)
    is_widened: bool = False

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
        # the kernels read each group's columns as a slice: the matrix is put in group order once
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
        # the integer type of the spec is the family set the kernels compile for: int32 when
        # every group is a Gaussian, Normal-Wishart without recording cells or Normal-Gamma (so a
        # full and a diagonal covariance share one compiled sweep), int16 when every group is
        # Normal-Wishart and some have cells (and offsets fit), else int64 (all seven)
        codes = spec[:, 0]
        nw_cells = any(
            fam.has_cells for fam, _cols in self.groups if fam.code == product.GAUSSIAN_NW
        )
        dtype = product.ANY_DTYPE
        if (
            bool(np.all((codes == product.GAUSSIAN_NW) | (codes == product.NORMAL_GAMMA)))
            and not nw_cells
        ):
            dtype = product.GAUSSIAN_DTYPE
        elif bool(np.all(codes == product.GAUSSIAN_NW)):
            if int((spec[:, 1::2] + spec[:, 2::2]).max()) <= np.iinfo(np.int16).max:
                dtype = product.NW_CELLS_DTYPE
        self.spec = spec.astype(dtype)
        self.prior = np.concatenate(priors).astype(np.float64)
        self.n_stats = stat
        self.n_cache = cac

    def widened(self) -> ProductFamily:
        """This product for the samplers and tree methods: a copy whose spec is int64 (every
        family) where it is the cells' int16, else this product. The int16 kernels exist for the
        packed Normal-Wishart paths of the MAP-DP and iHMM sweeps, which the samplers and trees
        do not take: there they only compiled each of their kernels a third time."""
        if self.spec.dtype != product.NW_CELLS_DTYPE:
            return self
        out = copy.copy(self)
        out.spec = self.spec.astype(product.ANY_DTYPE)
        out.is_widened = True
        return out

    def arrange(self, X: FloatArray) -> FloatArray:
        """Columns of X (n, n_cols) in group order, C-contiguous float64."""
        X = np.asarray(X, dtype=np.float64)
        if np.array_equal(self.column_order, np.arange(X.shape[1])):
            return np.ascontiguousarray(X)  # already in group order: no copy of a C array
        return np.ascontiguousarray(X[:, self.column_order])

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
        """Statistics (K, S) of arranged records Xa (n, D) grouped by z (n,) (None: one group)."""
        if z is None:
            z = np.zeros(Xa.shape[0], dtype=np.int64)
        return product.build_stats(Xa, np.asarray(z, dtype=np.int64), K, self.spec, self.n_stats)

    def log_marginal_stats(self, s: FloatArray) -> float:
        return float(product.log_marginal(np.asarray(s, dtype=np.float64), self.spec, self.prior))

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

    def to_state(self) -> dict[str, Any]:
        """The constructor's argument: ``{"groups": [(family, column indices), ...]}``, and
        ``"widened": True`` for a ``widened`` copy."""
        state: dict[str, Any] = {"groups": [(fam, list(cols)) for fam, cols in self.groups]}
        if self.is_widened:
            state["widened"] = True
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ProductFamily:
        """The product family of ``to_state``'s groups, rebuilt (and checked) by ``__init__``,
        widened again if it was."""
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
        widened = state.get("widened", False)
        if not isinstance(widened, bool):
            raise ValueError(f"widened must be true or false, got {widened!r}")
        prod = cls(groups)
        return prod.widened() if widened else prod

    def restrict(self, observed: NDArray[np.bool_]) -> tuple[ProductFamily, NDArray[np.int64]]:
        """The product family of the observed arranged columns and where their statistics lie.

        Parameters
        ----------
        observed : ndarray of bool, shape (n_cols,)
            Which arranged columns are observed; at least one.

        Returns
        -------
        family : ProductFamily
            Over the observed columns, renumbered 0..d'-1; groups with none are left out.
        stat_index : ndarray of shape (S',)
            ``stats[:, stat_index]`` are the restricted family's statistics rows.
        """
        observed = np.asarray(observed, dtype=bool)
        groups: list[tuple[Family, list[int]]] = []
        index: list[int] = []
        col = 0
        for r, (fam, _cols) in zip(self.spec, self.groups):
            c0, stat0 = int(r[product.COL0]), int(r[product.STAT0])
            local = [j for j in range(fam.n_cols) if observed[c0 + j]]
            if not local:
                continue
            sub, idx = (
                (fam, list(range(fam.stat_size())))
                if len(local) == fam.n_cols
                else (fam.restrict(local))
            )
            groups.append((sub, list(range(col, col + len(local)))))
            index.extend(stat0 + i for i in idx)
            col += len(local)
        if not groups:
            raise ValueError("a record needs at least one observed column")
        return ProductFamily(groups), np.asarray(index, dtype=np.int64)

    def impute(self, Xa: FloatArray, stats: FloatArray, z: NDArray[np.int64]) -> FloatArray:
        """Arranged records Xa (n, n_cols) with every NaN cell set to its conditional mode given
        the row's observed cells and its cluster (``Family.impute``); z (n,) are the clusters
        (rows of ``stats`` (K, S)), -1 for a record in none (the prior's mode)."""
        out = np.array(Xa, dtype=np.float64)
        miss = np.isnan(out)
        rows = np.flatnonzero(miss.any(axis=1))
        if rows.size == 0:
            return out
        full = np.vstack([stats, np.zeros((1, self.n_stats))])
        zz = np.where(z[rows] < 0, full.shape[0] - 1, z[rows])
        for r, (fam, _cols), sl in zip(self.spec, self.groups, self.stat_slices()):
            c0, n_c = int(r[product.COL0]), int(r[product.NCOL])
            block = out[rows, c0 : c0 + n_c]
            hit = np.isnan(block).any(axis=1)
            for k in np.unique(zz[hit]):
                sel = hit & (zz == k)
                block[sel] = fam.impute(block[sel], full[k, sl])
            out[rows, c0 : c0 + n_c] = block
        return out

    def stat_slices(self) -> list[slice]:
        """Where each group's part lies in a statistics row, in group order."""
        return [
            slice(int(r[product.STAT0]), int(r[product.STAT0] + r[product.NSTAT]))
            for r in self.spec
        ]

    def signature(self) -> str:
        """What two statistics arrays must share to be added (bnpy's container check): the
        family's repr and a hash of its ``spec``, ``column_order`` and prior."""
        import hashlib

        h = hashlib.sha256()
        # the spec as int64 whatever its kernel dtype, so that signatures stay what they were
        for part in (self.spec.astype(np.int64), self.column_order, self.prior):
            h.update(np.ascontiguousarray(part).tobytes())
        return f"{self!r}#{h.hexdigest()[:16]}"

    def __repr__(self) -> str:
        parts = ", ".join(f"{type(f).__name__}{cols}" for f, cols in self.groups)
        return f"ProductFamily({parts})"


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
    """``family`` as a ``ProductFamily`` (a ``Family`` becomes a one-group product); a
    ``ValueError`` for anything else."""
    if isinstance(family, ProductFamily):
        return family
    if isinstance(family, Family):
        return family.as_product()
    raise ValueError(
        f"family must be 'gaussian', a Family or a ProductFamily; got {type(family).__name__}"
    )
