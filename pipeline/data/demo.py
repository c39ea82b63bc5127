"""A seeded demo data set: records from a full-covariance Gaussian mixture with true labels."""

from __future__ import annotations

import numpy as np
import pandas as pd

LABEL_COLUMN = "true_label"


def make_demo(
    n_rows: int = 5000,
    n_features: int = 4,
    n_clusters: int = 6,
    separation: float = 8.0,
    random_state: int | None = 0,
) -> pd.DataFrame:
    """Records from a mixture of ``n_clusters`` full-covariance Gaussians, with their labels.

    Means at least ``separation`` apart, covariances randomly rotated, unequal weights
    (Dirichlet(4, ..., 4), at least 2% of the rows each).

    Returns
    -------
    DataFrame of shape (n_rows, n_features + 1)
        Columns ``x0 .. x{d-1}`` and ``true_label`` (0 .. n_clusters - 1).
    """
    if n_rows < n_clusters:
        raise ValueError(f"n_rows = {n_rows} must be at least n_clusters = {n_clusters}")
    rng = np.random.default_rng(random_state)
    d = n_features
    box = separation * n_clusters ** (1.0 / d) * 1.5
    means = np.empty((0, d))
    while means.shape[0] < n_clusters:
        m = rng.uniform(-box, box, size=d)
        if means.shape[0] == 0 or np.min(np.linalg.norm(means - m, axis=1)) >= separation:
            means = np.vstack([means, m])
    covs = []
    for _ in range(n_clusters):
        q, _r = np.linalg.qr(rng.normal(size=(d, d)))
        scales = rng.uniform(0.4, 1.0, size=d)
        covs.append(q @ np.diag(scales**2) @ q.T)
    weights = rng.dirichlet(np.full(n_clusters, 4.0))
    weights = np.maximum(weights, 0.02)
    weights /= weights.sum()
    labels = rng.choice(n_clusters, size=n_rows, p=weights)
    labels[:n_clusters] = np.arange(n_clusters)  # every cluster is present
    rng.shuffle(labels)
    X = np.empty((n_rows, d))
    for k in range(n_clusters):
        idx = np.flatnonzero(labels == k)
        X[idx] = rng.multivariate_normal(means[k], covs[k], size=idx.size)
    df = pd.DataFrame(np.round(X, 6), columns=[f"x{j}" for j in range(d)])
    df[LABEL_COLUMN] = labels.astype(np.int64)
    return df
