"""Model updates from new batches (``dpmm update``): one ASUGS-PM pass (Tsiligkaridis and Forsythe
2015) of new records into a fitted model's clusters (``pipeline.ASUGS.start_from``).

The updated model is the same kind of estimator, with the stream's clusters; its concentration is
set as that estimator sets it (eq. A.1's MAP for a learned one, unchanged when fixed, alpha_n for
``ASUGS``).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from kernels import mapdp as kmapdp
from pipeline.estimators.asugs import ASUGS
from pipeline.models.asugs import DEFAULT_LAM, PM_INTERVAL, PRUNE_WEIGHT
from pipeline.models.concentration import log_gamma_prior, map_concentration


def update_model(
    model: Any,
    X: Any,
    *,
    lam: float = DEFAULT_LAM,
    select: str = "greedy",
    prune_merge: bool = True,
    pm_interval: int = PM_INTERVAL,
    prune_weight: float = PRUNE_WEIGHT,
    random_state: Any = None,
) -> tuple[Any, ASUGS]:
    """The model updated by one ASUGS-PM pass of the records X (module docstring).

    Parameters
    ----------
    model : fitted estimator with clusters (``MAPDP``, ``ASUGS``, ...)
        Left unchanged.
    X : array-like or DataFrame of shape (n_samples, n_features)
        New records with the model's columns, encoded by its schema.
    lam, select, prune_merge, pm_interval, prune_weight, random_state : as ``ASUGS``.

    Returns
    -------
    new_model : the same kind of estimator, with the updated clusters and the new records'
        ``labels_`` (-1: a pruned class).
    stream : ASUGS
        The pass itself.
    """
    stream = ASUGS(
        lam=lam,
        select=select,
        prune_merge=prune_merge,
        family=getattr(model, "family_", "auto"),
        pm_interval=pm_interval,
        prune_weight=prune_weight,
        random_state=random_state,
    ).start_from(model)
    stream.partial_fit(X)
    if isinstance(model, ASUGS):
        return stream, stream
    new = copy.deepcopy(model)
    fam = model.family_
    stats = stream.cluster_stats_
    K = int(stats.shape[0])
    n = float(stats[:, 0].sum())
    alpha = float(model.alpha_)
    learned = getattr(model, "alpha", None) == "learn"
    a, b = (float(v) for v in getattr(model, "alpha_prior", (2.0, 1.0)))
    if learned:
        alpha = map_concentration(round(n), K, a, b, start=alpha)
    new.labels_ = stream.labels_
    new.cluster_stats_ = stats
    new.cluster_sizes_ = np.rint(stats[:, 0]).astype(np.int64)
    new.n_clusters_ = K
    new.alpha_ = alpha
    new._cache = fam.cache_of(stats)
    new._empty_cache = fam.empty_cache()
    if hasattr(new, "objective_"):
        nk = np.ascontiguousarray(stats[:, 0])
        e = float(kmapdp.objective(stats, nk, K, fam.spec, fam.prior, alpha))
        if learned:
            e -= log_gamma_prior(alpha, a, b)
        new.objective_ = e
    return new, stream
