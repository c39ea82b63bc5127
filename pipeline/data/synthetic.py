"""Seeded synthetic data: the full-covariance Gaussian mixtures the benchmarks and demo use."""

from __future__ import annotations

import numpy as np
import pandas as pd
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
    n: int, d: int = 10, k: int = 20, seed: int = 0, spread: float = 5.0, block: int = 0
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


# the random effects (intercept, slope, informative covariates) of each subgroup
LONGITUDINAL_MEANS = np.array(
    [
        [40.0, 0.0, -2.0, -1.5],
        [34.0, -1.2, -3.0, -0.5],
        [46.0, 0.8, -1.0, -2.5],
        [38.0, 1.5, 1.0, 0.5],
    ]
)
LONGITUDINAL_SDS = np.array([1.2, 0.25, 0.35, 0.35])


def sample_longitudinal(
    n_subjects: int,
    waves: int = 5,
    seed: int = 0,
    missing: float = 0.15,
    noise: float = 1.5,
    k: int = 4,
    first: int = 0,
) -> pd.DataFrame:
    """ELSA-like longitudinal data: a quality-of-life score over up to ``waves`` waves of each
    subject, each wave missing with probability ``missing`` (every subject keeps one).

    Each subject's random effects (intercept, slope per wave, ``depression``, ``adl``) are drawn
    around its subgroup's ``LONGITUDINAL_MEANS``; ``memory`` and ``fluency`` drive nothing (the
    uninformative set of Table 5).

    Returns
    -------
    DataFrame with columns subject, wave, qol, depression, adl, memory, fluency, subgroup; one
    row per observed wave, in order.
    """
    rng = np.random.default_rng([seed, first, 7])
    g = rng.integers(0, k, size=n_subjects)
    beta = LONGITUDINAL_MEANS[g] + rng.normal(size=(n_subjects, 4)) * LONGITUDINAL_SDS
    seen = rng.random((n_subjects, waves)) >= missing
    seen[np.arange(n_subjects), rng.integers(0, waves, size=n_subjects)] = True
    subj, wave = np.nonzero(seen)
    n = subj.size
    dep = rng.normal(size=n) + 0.3 * rng.normal(size=n_subjects)[subj]
    adl = rng.normal(size=n)
    mem = rng.normal(size=n)
    flu = rng.normal(size=n)
    b = beta[subj]
    qol = b[:, 0] + b[:, 1] * wave + b[:, 2] * dep + b[:, 3] * adl + noise * rng.normal(size=n)
    return pd.DataFrame(
        {
            "subject": first + subj,
            "wave": wave.astype(np.float64),
            "qol": qol,
            "depression": dep,
            "adl": adl,
            "memory": mem,
            "fluency": flu,
            "subgroup": g[subj],
        }
    )
