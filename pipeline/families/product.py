"""The product of families over disjoint column groups (log terms add), and the checks and
conversions of what a family is given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kernels.obs import product
from pipeline.core.persist import register
from pipeline.families.base import (
    _SPEC_WIDTH,
    Family,
    FloatArray,
)


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
        # the integer type of the spec is the family set the kernels compile for: int32 when
        # every group is Normal-Wishart without recording cells (one family's kernels, without
        # the cells' code), int16 with cells (and offsets that fit), else int64 (all seven)
        dtype = product.ANY_DTYPE
        if bool(np.all(spec[:, 0] == product.GAUSSIAN_NW)):
            if not any(fam.has_cells for fam, _cols in self.groups):
                dtype = product.NW_ONLY_DTYPE
            elif int((spec[:, 1::2] + spec[:, 2::2]).max()) <= np.iinfo(np.int16).max:
                dtype = product.NW_CELLS_DTYPE
        self.spec = spec.astype(dtype)
        self.prior = np.concatenate(priors).astype(np.float64)
        self.n_stats = stat
        self.n_cache = cac

    # -- arrays for the kernels --------------------------------------------------------------
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

    # -- on disk (``pipeline.core.persist``) --------------------------------------------------------
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

    def stat_slices(self) -> list[slice]:
        """Where each group's part lies in a statistics row, in group order."""
        return [
            slice(int(r[product.STAT0]), int(r[product.STAT0] + r[product.NSTAT]))
            for r in self.spec
        ]

    def signature(self) -> str:
        """What two statistics arrays must share to be added (bnpy's container check): the same
        groups of families over the same columns (``spec``, ``column_order``) and the same
        prior. A short text: the family's repr and a hash of those arrays."""
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
