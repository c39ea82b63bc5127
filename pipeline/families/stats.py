"""The one currency: additive sufficient statistics carried with their family's signature.

``Stats`` holds K rows (K, S) of one observation model's statistics (row[0] the count) with the
signature of the family that made them, so that rows of another family or prior refuse to add:
merging is addition, removing subtraction. The kernels take the plain array (``Stats.array``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kernels.obs import product as kproduct
from pipeline.core.persist import register
from pipeline.families import FloatArray, ProductFamily


@register
class Stats:
    """K rows of additive sufficient statistics (K, S) of one family.

    Parameters
    ----------
    array : ndarray of shape (K, S)
    family : ProductFamily or str
        The family that made the rows, or its ``signature``.
    """

    __slots__ = ("array", "signature")

    def __init__(self, array: Any, family: ProductFamily | str) -> None:
        arr = np.asarray(array, dtype=np.float64)
        if arr.ndim == 1:
            arr = arr.reshape(1, -1)
        if arr.ndim != 2:
            raise ValueError(f"statistics must have shape (K, S), got {arr.shape}")
        self.array: FloatArray = np.ascontiguousarray(arr)
        self.signature: str = family if isinstance(family, str) else family.signature()

    @classmethod
    def zeros(cls, family: ProductFamily, K: int) -> Stats:
        return cls(np.zeros((int(K), family.n_stats)), family)

    @classmethod
    def of(cls, family: ProductFamily, X: FloatArray, z: Any = None, K: int = 1) -> Stats:
        """The statistics of the records X (n, D), arranged, by block z (n,) (default: one)."""
        return cls(family.stats_of(X, z, K), family)

    def _check(self, other: Stats) -> None:
        if not isinstance(other, Stats):
            raise TypeError(f"statistics add to statistics, not {type(other).__name__}")
        if other.signature != self.signature:
            raise ValueError(
                "statistics of different families, column groups or priors do not add: "
                f"{self.signature} and {other.signature}"
            )
        if other.array.shape != self.array.shape:
            raise ValueError(
                f"statistics of shapes {self.array.shape} and {other.array.shape} do not add"
            )

    def __add__(self, other: Stats) -> Stats:
        self._check(other)
        return Stats(self.array + other.array, self.signature)

    def __sub__(self, other: Stats) -> Stats:
        self._check(other)
        return Stats(self.array - other.array, self.signature)

    def __getitem__(self, rows: Any) -> Stats:
        return Stats(np.atleast_2d(self.array[rows]), self.signature)

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Stats)
            and other.signature == self.signature
            and np.array_equal(other.array, self.array)
        )

    def __hash__(self) -> int:  # mutable arrays: identity, as numpy's
        return id(self)

    def __repr__(self) -> str:
        return f"Stats(K={len(self)}, n={float(self.n.sum()):g}, {self.signature})"

    @staticmethod
    def concat(parts: Sequence[Stats]) -> Stats:
        """The rows of ``parts`` one after the other (all of one family)."""
        if not parts:
            raise ValueError("nothing to concatenate")
        first = parts[0]
        for p in parts[1:]:
            if p.signature != first.signature:
                first._check(p)  # raises the mismatch
        return Stats(np.vstack([p.array for p in parts]), first.signature)

    def total(self) -> Stats:
        """One row: the sum of all rows."""
        return Stats(self.array.sum(axis=0, keepdims=True), self.signature)

    def merged(self, mapping: Any) -> Stats:
        """Rows added by ``mapping`` (K,) -> 0..K2-1: the statistics of merged blocks."""
        mapping = np.asarray(mapping, dtype=np.int64)
        K2 = int(mapping.max()) + 1 if mapping.size else 0
        out = np.zeros((K2, self.array.shape[1]))
        np.add.at(out, mapping, self.array)
        return Stats(out, self.signature)

    @property
    def n(self) -> FloatArray:
        """The count of each row (K,): the cluster sizes."""
        return np.ascontiguousarray(self.array[:, 0])

    def moments(self, family: ProductFamily) -> tuple[FloatArray, FloatArray]:
        """Mean (K, D) and covariance (K, D, D) of each row's records in arranged column order,
        NaN where the statistics do not determine them (``kernels.obs.product.moments``)."""
        if family.signature() != self.signature:
            raise ValueError(f"these statistics are not of {family!r}")
        K, D = len(self), family.n_cols
        mean = np.empty((K, D))
        cov = np.empty((K, D, D))
        for k in range(K):
            mean[k], cov[k] = kproduct.moments(self.array[k], family.spec, family.prior, D)
        return mean, cov

    def to_state(self) -> dict[str, Any]:
        return {"array": self.array, "signature": self.signature}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Stats:
        array, sig = state.get("array"), state.get("signature")
        if not isinstance(array, np.ndarray) or not isinstance(sig, str):
            raise ValueError("Stats needs an array and a signature")
        return cls(array, sig)
