"""``ASUGS``: one-pass sequential clustering of a stream (Tsiligkaridis and Forsythe 2015),
scikit-learn style with ``partial_fit``; the numba loop is ``kernels.asugs``.

``StreamState`` is the whole state of a stream (class statistics and caches, ids, the records
seen, the RNG state) as plain arrays: the estimator keeps one, and the ``asugs`` engine of the
pass loop (``pipeline.engines.asugs``) hands one from chunk to chunk.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pipeline.core.config import check_scale, keep_params
from pipeline.core.seeds import as_seed_sequence, seed_state
from pipeline.estimators.base import MixtureEstimator
from pipeline.families import Family, FloatArray, ProductFamily
from pipeline.models.asugs import (
    DEFAULT_LAM,
    EB_RECORDS,
    PM_INTERVAL,
    PRIOR_SCALE,
    PRUNE_WEIGHT,
    StreamParams,
    StreamState,
    advance,
    check_stream_params,
    choose_prior,
)


class ASUGS(MixtureEstimator):
    """ASUGS: adaptive sequential updating and greedy search (Tsiligkaridis and Forsythe 2015,
    Algorithm 1), with the pruning and merging of ASUGS-PM (Section 6), for any family.

    Each record is seen once, in order: it joins the class, or a new one, with the largest
    m(h) L_{i,h}(y_i) (eq. 1), L the family's posterior predictive, while the concentration adapts
    as alpha_i = k_i / (lambda + log i). ``partial_fit`` continues the stream over batches; ``fit``
    is one pass over X.

    Parameters
    ----------
    lam : float or None, default=0.3
        lambda > 0, the rate of the exponential prior on alpha; None runs SUGS with ``alpha``.
    select : {"greedy", "sample"}, default="greedy"
        Step (b): the arg max of q or a draw from q.
    prune_merge : bool, default=True
        ASUGS-PM: every so often prune classes holding less than ``prune_weight`` of the records
        seen since they opened, then merge pairs while a merge raises log p(X, z | alpha).
    family : "auto", str, dict, Family or ProductFamily, default="auto"
        As ``MAPDP``; "auto" fits the prior to X in ``fit``, to the first batch in
        ``partial_fit``.
    alpha : float or None, default=None
        SUGS's fixed concentration (only with ``lam=None``).
    prior_scale : float in (0, 1) or None, default=None
        None chooses scale and strength by empirical Bayes on the stream's first records
        (``pipeline.models.asugs.choose_prior``); a number fixes the scale with a0 = d + 2.
    pm_interval : int, default=250
        Records between the first pruning/merging rounds, then geometrically more.
    prune_weight : float in [0, 1), default=0.01
        0 keeps every class (merging only).
    random_state : int, SeedSequence, Generator or None
        Seeds the draws of ``select="sample"``.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        Class of each record of the last batch, merges applied; -1 where its class was pruned.
    n_clusters_ : int
    cluster_stats_ : ndarray of shape (n_clusters, n_stats)
    cluster_sizes_ : ndarray of shape (n_clusters,)
    pruned_stats_ : ndarray of shape (n_stats,)
        Statistics of the pruned classes.
    alpha_ : float
        alpha_n after the last record (SUGS: the fixed alpha).
    prior_scale_, prior_strength_ : float
        The prior scale and strength (a0 - d - 1) of ``family_``.
    alpha_history_ : ndarray of shape (n_seen_,)
        alpha_i after each record i of the stream.
    n_seen_, n_pruned_, n_merged_ : int
    log_joint_ : float
        The stream's sequential log joint.
    family_, schema_, n_features_in_, feature_names_in_ : as ``MAPDP``.
    """

    _always_informative: ClassVar[bool] = False
    # a saved model keeps the records seen, so that a loaded one streams on where it stopped
    _model_attrs: ClassVar[tuple[str, ...]] = (*MixtureEstimator._model_attrs, "n_seen_")
    _model_extras: ClassVar[tuple[str, ...]] = (
        "pruned_stats_",
        "n_pruned_",
        "n_merged_",
        "prior_scale_",
        "prior_strength_",
    )

    def __init__(
        self,
        lam: float | None = DEFAULT_LAM,
        select: str = "greedy",
        prune_merge: bool = True,
        family: Any = "auto",
        alpha: float | None = None,
        prior_scale: float | None = None,
        pm_interval: int = PM_INTERVAL,
        prune_weight: float = PRUNE_WEIGHT,
        random_state: Any = None,
    ):
        keep_params(self, locals())

    def _check_params(self) -> StreamParams:
        if self.prior_scale is not None:
            check_scale(self.prior_scale)
        return check_stream_params(
            self.lam, self.alpha, self.select, self.prune_merge, self.pm_interval, self.prune_weight
        )

    def fit(self, X: Any, y: Any = None) -> ASUGS:
        """``MixtureEstimator.fit``: one pass over the records of X (n_samples, n_features) in
        order, from an empty stream (y is ignored); returns self."""
        self._stream: StreamState | None = None
        return super().fit(X)  # type: ignore[no-any-return]

    def partial_fit(self, X: Any, y: Any = None) -> ASUGS:
        """Continue the stream with the records of X (n_samples, n_features), in order (y is
        ignored); returns self. The first call learns the columns and the family; later batches
        must have the same, or a ValueError names what differs."""
        sp = self._check_params()
        if getattr(self, "_stream", None) is None and hasattr(self, "cluster_stats_"):
            # a model read back from disk: the stream goes on from its clusters
            self.start_from(self)
        if getattr(self, "_stream", None) is None:
            Xa = self._encode_fit(X)
        else:
            Xa = self._encode_predict(X)
        self._fit(Xa, sp)
        return self

    def start_from(self, model: Any) -> ASUGS:
        """Continue from a fitted model's clusters (``cluster_stats_``, columns and family, of
        any ``MixtureEstimator`` with clusters) instead of an empty stream; returns self."""
        params = self._check_params()
        for name in ("cluster_stats_", "family_", "schema_"):
            if not hasattr(model, name):
                raise ValueError(
                    f"{type(model).__name__} has no {name}: a stream starts from a fitted model "
                    "with clusters"
                )
        fam = model.family_
        self.family_ = fam
        self.schema_ = model.schema_
        self.n_features_in_ = int(model.n_features_in_)
        if hasattr(model, "feature_names_in_"):
            self.feature_names_in_ = model.feature_names_in_
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        rng = seed_state(as_seed_sequence(self.random_state))
        n_seen = getattr(model, "n_seen_", None)
        self._stream = StreamState.from_clusters(
            model.cluster_stats_, fam, rng, None if n_seen is None else int(n_seen)
        )
        self._params = params
        st = self._stream
        if hasattr(model, "pruned_stats_"):
            # an ASUGS model's own stream: what it pruned and how often stay counted
            st.pruned = np.array(model.pruned_stats_, dtype=np.float64)
            st.n_pruned = int(getattr(model, "n_pruned_", 0))
            st.n_merged = int(getattr(model, "n_merged_", 0))
        self._alpha_parts: list[FloatArray] = [np.zeros(0)]
        self.labels_ = np.zeros(0, dtype=np.int64)
        self._set_fitted(st, params)
        return self

    def _set_fitted(self, st: StreamState, params: StreamParams) -> None:
        fam = self.family_
        stats = st.cluster_stats
        self.cluster_stats_ = stats
        self.cluster_sizes_ = np.rint(stats[:, 0]).astype(np.int64)
        self.n_clusters_ = int(st.K)
        self.pruned_stats_ = st.pruned.copy()
        self.alpha_ = params.concentration(st.K, st.n_seen)
        self.n_seen_ = int(st.n_seen)
        self.n_pruned_ = int(st.n_pruned)
        self.n_merged_ = int(st.n_merged)
        self.log_joint_ = float(st.log_joint)
        self._cache = st.cache[: st.K].copy()
        self._empty_cache = fam.empty_cache()

    def _fit(self, Xa: FloatArray, params: StreamParams) -> None:
        if getattr(self, "_stream", None) is None:
            rng = seed_state(as_seed_sequence(self.random_state))
            self._new_prior(Xa, params, rng)
            self._stream = StreamState.empty(self.family_, rng)
            self._params = params
            self._alpha_parts = []
        elif params != self._params:
            raise ValueError(
                "the parameters changed since the stream started; call fit to start a new one"
            )
        assert self._stream is not None
        st, z, trace = advance(self._stream, Xa, self.family_, params, trace=True)
        self._alpha_parts.append(trace)
        rows = st.rows_of_ids()
        self.labels_ = np.where(z >= 0, rows[np.maximum(z, 0)], -1).astype(np.int64)
        self._set_fitted(st, params)

    def _prior_scale(self) -> float | None:
        """``PRIOR_SCALE`` when the prior is to be chosen (``_new_prior`` rescales it)."""
        return PRIOR_SCALE if self.prior_scale is None else float(self.prior_scale)

    def _new_prior(self, Xa: FloatArray, params: StreamParams, rng: Any) -> None:
        """A new stream's prior: ``family_``, or ``choose_prior``'s on Xa's first records."""
        if isinstance(self.family, (Family, ProductFamily)) or not hasattr(self, "family_"):
            for name in ("prior_scale_", "prior_strength_"):
                if hasattr(self, name):
                    delattr(self, name)
            return
        if self.prior_scale is None:
            self.family_, scale, strength = choose_prior(
                self.family_, PRIOR_SCALE, Xa[:EB_RECORDS], params, rng
            )
        else:
            scale, strength = float(self.prior_scale), 1.0
        self.prior_scale_ = scale
        self.prior_strength_ = strength

    @property
    def alpha_history_(self) -> FloatArray:
        """alpha_i after each record i of the stream (n_seen_,)."""
        if not hasattr(self, "_alpha_parts"):
            raise AttributeError("alpha_history_ exists after fit or partial_fit")
        if len(self._alpha_parts) != 1:
            # the batches' pieces are joined when asked for, not at every batch
            self._alpha_parts = [np.concatenate(self._alpha_parts)]
        return self._alpha_parts[0]
