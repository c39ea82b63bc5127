"""Seeded synthetic data: the full-covariance Gaussian mixtures the benchmarks and demo use."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def mixture_params(
    d: int = 10, k: int = 20, seed: int = 0, spread: float = 5.0
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Means (k, d), covariance factors (k, d, d) and weights (k,) of a random mixture.

    Means are N(0, spread^2 I); each covariance is A A^T with A = I + N(0, 0.3^2) entries, so
    clusters are elliptical and correlated; weights are Dirichlet(5) so sizes differ.
    """
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=spread, size=(k, d))
    factors = np.eye(d)[None, :, :] + rng.normal(scale=0.3, size=(k, d, d))
    weights = rng.dirichlet(np.full(k, 5.0))
    return means, factors, weights


def sample_mixture(
    n: int,
    d: int = 10,
    k: int = 20,
    seed: int = 0,
    spread: float = 5.0,
    block: int = 0,
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """n records (n, d) of the mixture ``mixture_params(d, k, seed)`` and their true labels.

    ``block`` selects an independent stream of records of the same mixture, so a large data set
    can be generated chunk by chunk: block b uses seed (seed, b).
    """
    means, factors, weights = mixture_params(d, k, seed, spread)
    rng = np.random.default_rng([seed, block, 1])
    y = rng.choice(k, size=n, p=weights).astype(np.int64)
    eps = rng.normal(size=(n, d))
    X = means[y] + np.einsum("nij,nj->ni", factors[y], eps)
    return X, y
