"""Fit-time checks of the encoded records (``Schema.check_informative``): its column minima and
maxima (``_column_extreme``, reduced in contiguous blocks) are NumPy's, NaN included."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.families.schema import _column_extreme


@pytest.mark.parametrize("n", [1, 63, 64, 65, 200])
def test_column_extremes_are_numpys(n: int) -> None:
    X = np.random.default_rng(n).normal(size=(n, 3))
    if n > 2:
        X[n // 2, 1] = np.nan
    for op, ref in ((np.minimum, np.min), (np.maximum, np.max)):
        np.testing.assert_array_equal(_column_extreme(X, op), ref(X, axis=0))
        np.testing.assert_array_equal(_column_extreme(np.asfortranarray(X), op), ref(X, axis=0))
