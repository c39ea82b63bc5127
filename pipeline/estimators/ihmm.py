"""``MAPiHMM`` and ``IHMMGibbs``: the infinite hidden Markov model of Raykov et al. 2016, Section 6,
scikit-learn style, with hmmlearn's convention for many sequences in one array (``lengths``).

Emissions are the project's likelihood families (``family="auto"`` picks one per column as
``MAPDP`` does); the kernels are ``kernels.ihmm``, the runs ``pipeline.models.ihmm`` (the Gibbs
sampler) and ``pipeline.models.ihmm_map`` (MAP-iHMM).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar, Self

import numpy as np
import pandas as pd
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from pipeline.core import config
from pipeline.core.config import check_scale
from pipeline.core.diagnose import DegenerateFitWarning, sequence_fit
from pipeline.core.errors import InputError
from pipeline.core.seeds import as_seed_sequence
from pipeline.estimators.base import MixtureEstimator
from pipeline.families import FloatArray
from pipeline.models.ihmm import (
    M_COUNTS,
    PRIOR_SCALE,
    HmmState,
    IntArray,
    check_temper,
    decode,
    log_likelihood,
    run_gibbs,
    starts_of,
)
from pipeline.models.ihmm_map import fit_map_ihmm

#: a column of the DataFrame form (sequence ids, time stamps), or None
Name = str | None


def sequence_order(
    df: pd.DataFrame, sequence_column: str, time_column: str | None
) -> tuple[IntArray, IntArray, pd.Index]:
    """Rows of a long table grouped into sequences, ordered by time within each.

    Sequences come in the order of their first row. A ``time_column`` must be strictly
    increasing within each sequence as the rows come: checked, not sorted (an unsorted file is
    more often a wrong join than a wish). Errors name the column and the 0-based row.

    Returns
    -------
    order : ndarray of shape (n_rows,), int64
        Row i of the sequence-ordered data is row order[i] of df.
    lengths : ndarray of shape (n_sequences,), int64
    ids : Index
        Sequence id of each sequence.
    """
    if sequence_column not in df.columns:
        raise InputError(f"sequence column {sequence_column!r} is not a column of the data")
    seq = df[sequence_column]
    missing = seq.isna().to_numpy()
    if missing.any():
        row = int(np.flatnonzero(missing)[0])
        raise InputError(f"column {sequence_column!r}, row {row}: missing sequence id")
    codes, ids = pd.factorize(seq, sort=False)
    if time_column is not None:
        if time_column not in df.columns:
            raise InputError(f"time column {time_column!r} is not a column of the data")
        tcol = df[time_column]
        if tcol.isna().any():
            row = int(np.flatnonzero(tcol.isna().to_numpy())[0])
            raise InputError(f"column {time_column!r}, row {row}: missing time stamp")
        if pd.api.types.is_datetime64_any_dtype(tcol):
            tv = tcol.to_numpy().astype("datetime64[ns]").astype(np.int64).astype(np.float64)
        else:
            num = pd.to_numeric(tcol, errors="coerce")
            if num.isna().any():
                row = int(np.flatnonzero(num.isna().to_numpy())[0])
                raise InputError(
                    f"column {time_column!r}, row {row}: time stamp {tcol.iloc[row]!r} is not "
                    "a number or a date"
                )
            tv = num.to_numpy(dtype=np.float64)
    order = np.argsort(codes, kind="stable").astype(np.int64)
    lengths = np.bincount(codes, minlength=len(ids)).astype(np.int64)
    if time_column is not None:
        ts = tv[order]
        cs = codes[order]
        same = cs[1:] == cs[:-1]
        dup = same & (ts[1:] == ts[:-1])
        back = same & (ts[1:] < ts[:-1])
        for bad, what in ((dup, "duplicated time stamp"), (back, "time goes backwards")):
            if bad.any():
                row = int(order[np.flatnonzero(bad)[0] + 1])
                raise InputError(
                    f"column {time_column!r}, row {row}: {what} within sequence "
                    f"{ids[cs[np.flatnonzero(bad)[0] + 1]]!r} (rows of a sequence must be in "
                    "strictly increasing time)"
                )
    return order, lengths, pd.Index(ids)


def check_lengths(lengths: Any, n: int) -> IntArray:
    """hmmlearn's ``lengths``: positive integers summing to the number of rows."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.shape[0] == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError("lengths must be a non-empty 1-D array of integers")
    if arr.min() < 1:
        raise ValueError(f"lengths must be >= 1, got {int(arr.min())}")
    if int(arr.sum()) != n:
        raise ValueError(f"lengths sum to {int(arr.sum())} but X has {n} rows")
    return arr.astype(np.int64)


class _SequenceEstimator(MixtureEstimator):
    """Shared by the two iHMM estimators: sequences in, encoded records in sequence order."""

    #: what a saved model keeps (``pipeline.estimators.model``): the MAP state (emission statistics,
    #: transition and start counts, kappa) that ``predict`` and ``score_samples`` decode with,
    #: and the fitted attributes derived from it
    _model_attrs: ClassVar[tuple[str, ...]] = (
        *MixtureEstimator._model_attrs,
        "n_states_",
        "state_",
        "gamma_",
        "state_stats_",
        "state_sizes_",
        "kappa_",
        "transition_counts_",
        "start_counts_",
        "transmat_",
        "startprob_",
    )
    _model_extras: ClassVar[tuple[str, ...]] = (
        "objective_",
        "objective_history_",
        "n_iter_",
        "restart_objectives_",
        "temper_",
        "residual_autocorrelation_",
    )

    def _sequences(
        self, X: Any, lengths: Any, sequence_column: str | None, time_column: str | None
    ) -> tuple[Any, IntArray | None, IntArray]:
        """(features, permutation to sequence order or None, starts)."""
        if sequence_column is not None:
            if not isinstance(X, pd.DataFrame):
                raise ValueError("sequence_column needs X as a pandas DataFrame")
            if lengths is not None:
                raise ValueError("give lengths or sequence_column, not both")
            order, seq_lengths, _ids = sequence_order(X, sequence_column, time_column)
            drop = [sequence_column] + ([time_column] if time_column else [])
            feats = X.drop(columns=drop).iloc[order].reset_index(drop=True)
            return feats, order, starts_of(seq_lengths, len(X))
        n = len(X) if hasattr(X, "__len__") else np.asarray(X).shape[0]
        checked = None if lengths is None else check_lengths(lengths, n)
        return X, None, starts_of(checked, n)

    def fit(  # type: ignore[override]
        self, X: Any, lengths: Any = None, sequence_column: Name = None, time_column: Name = None
    ) -> Self:
        """Fit to the sequences of X (``_run``: MAP-iHMM's restarts, or the Gibbs sampler).

        Parameters
        ----------
        X : array-like or DataFrame of shape (n_samples, n_features)
        lengths : array-like of int, optional
            Lengths of the sequences X holds one after the other (hmmlearn's convention); None:
            X is one sequence.
        sequence_column : str, optional
            DataFrame form: the column of sequence ids (rows of a sequence need not be adjacent).
        time_column : str, optional
            DataFrame form: time stamps, strictly increasing within each sequence.

        Returns
        -------
        self
        """
        alpha, gamma = self._fit_params()
        feats, order, starts = self._sequences(X, lengths, sequence_column, time_column)
        Xa = self._encode_fit(feats)
        labels, st = self._run(Xa, starts, alpha, gamma)
        self.alpha_ = alpha
        self.gamma_ = gamma
        # labels come in sequence order; order is a permutation of the input's rows
        self.labels_ = labels if order is None else labels[np.argsort(order)]
        self._set_model(st)
        return self

    def _fit_params(self) -> tuple[float, float]:
        """alpha (N0) and gamma (M0), once every parameter is checked."""
        alpha = config.check_positive(self.alpha, "alpha")  # type: ignore[attr-defined]
        gamma = config.check_positive(self.gamma, "gamma")  # type: ignore[attr-defined]
        if self.prior_scale is not None:  # type: ignore[attr-defined]
            check_scale(self.prior_scale)  # type: ignore[attr-defined]
        self._check_run()
        return alpha, gamma

    def _check_run(self) -> None:
        """The parameters of the run itself."""

    def _run(
        self, Xa: FloatArray, starts: IntArray, alpha: float, gamma: float
    ) -> tuple[IntArray, HmmState]:
        """The fit on the encoded records Xa (N, D) of the sequences ``starts`` (n_seq + 1,):
        labels (N,) in sequence order and the MAP state; sets the run's own attributes."""
        raise NotImplementedError

    def _set_model(self, st: HmmState) -> None:
        """The fitted attributes of the MAP state ``st`` (``alpha_`` and ``family_`` set)."""
        self.state_ = st
        K = st.n_states
        self.n_states_ = K
        self.n_clusters_ = K
        self.state_stats_ = st.stats
        self.state_sizes_ = np.rint(st.nk).astype(np.int64)
        self.cluster_stats_ = st.stats
        self.cluster_sizes_ = self.state_sizes_
        self.kappa_ = np.append(st.kappa, st.ku)
        self.transition_counts_ = st.trans
        self.start_counts_ = st.start
        self.startprob_, self.transmat_ = st.transitions(self.alpha_)
        self._cache = self.family_.cache_of(st.stats)
        self._empty_cache = self.family_.empty_cache()

    def _encode_sequences(
        self, X: Any, lengths: Any, sequence_column: Name, time_column: Name
    ) -> tuple[FloatArray, IntArray | None, IntArray]:
        # state_, not labels_: a loaded model has no training labels (``pipeline.estimators.model``)
        check_is_fitted(self, "state_")
        feats, order, starts = self._sequences(X, lengths, sequence_column, time_column)
        return self._encode_predict(feats), order, starts

    def predict(  # type: ignore[override]
        self, X: Any, lengths: Any = None, sequence_column: Name = None, time_column: Name = None
    ) -> IntArray:
        """Most probable state of every time step of new sequences (Viterbi under the MAP
        transition matrix and the predictive emissions, eq. 6.4); -1 where an unrepresented
        state is the most probable. Parameters as ``fit``'s.

        Returns
        -------
        labels : ndarray of shape (n_samples,), in the rows' order
        """
        Xa, order, starts = self._encode_sequences(X, lengths, sequence_column, time_column)
        # the emissions tempered as in the fit (``MAPiHMM``'s ``temper``; 1 for the others)
        temper = float(getattr(self, "temper_", 1.0))
        path, _best = decode(Xa, starts, self.state_, self.family_, self.alpha_, temper)
        path = np.where(path == self.n_states_, -1, path)
        if order is not None:
            out = np.empty_like(path)
            out[order] = path
            return out
        return path

    def score_samples(  # type: ignore[override]
        self, X: Any, lengths: Any = None, sequence_column: Name = None, time_column: Name = None
    ) -> FloatArray:
        """Held-out log likelihood log p(x_1..x_T) of each sequence by the forward algorithm
        under the MAP model (transition matrix (N_pk + N0 kappa_k) / (N_p. + N0) with the
        unrepresented states as one more state, posterior-predictive emissions).

        Returns
        -------
        log_likelihood : ndarray of shape (n_sequences,)
            In order of the sequences (of their first row in the DataFrame form).
        """
        Xa, _order, starts = self._encode_sequences(X, lengths, sequence_column, time_column)
        return log_likelihood(Xa, starts, self.state_, self.family_, self.alpha_)

    def score(  # type: ignore[override]
        self, X: Any, lengths: Any = None, sequence_column: Name = None, time_column: Name = None
    ) -> float:
        """Total log likelihood of the sequences of X (hmmlearn's ``score``)."""
        return float(np.sum(self.score_samples(X, lengths, sequence_column, time_column)))

    def fit_predict(  # type: ignore[override]
        self, X: Any, lengths: Any = None, **kwargs: Any
    ) -> IntArray:
        return np.asarray(self.fit(X, lengths, **kwargs).labels_)

    def state_summary(self) -> pd.DataFrame:
        """One row per state: size, log marginal and each family's posterior parameters."""
        from pipeline.families.schema import cluster_table

        check_is_fitted(self, "state_stats_")
        return cluster_table(self.state_stats_, self.alpha_, self.family_, self.schema_)


class MAPiHMM(_SequenceEstimator):
    """MAP-iHMM: approximate MAP inference for the infinite HMM (Raykov et al. 2016, Section 6.2).

    Iterated conditional modes on the direct-assignment HDP-HMM: every time step in turn goes to
    the state, or a new one, of eq. 6.7; then kappa takes the mode of eq. 6.6. Viterbi
    re-segmentation, merges and splits are tried between sweeps; every step is taken only if
    E(z, kappa) = -log p(X, z, kappa) falls, so ``objective_history_`` never increases.

    Parameters
    ----------
    alpha : float, default=1.0
        N0, the concentration of each row of the transition matrix around kappa.
    gamma : float, default=2.0 (``pipeline.core.config.GAMMA``)
        M0, the top-level concentration; sweeps open new states only for M0 > 1.
    family : "auto", str, dict, Family or ProductFamily, default="auto"
        Emission family per column, as ``MAPDP``'s.
    prior_scale : float in (0, 1) or None, default=0.1
        As ``MAPDP``'s (``config.IHMM_PRIOR_SCALE``, the scale the defaults were measured with).
    n_restarts : int, default=1
        Runs (the first from a sequential sweep, the others from random piecewise-constant
        labellings); the lowest objective wins.
    max_iter : int, default=100
        Maximum iterations (sweeps) per run.
    tol : float, default=1e-6
        Relative decrease of E below which an iteration counts as stalled (moves are then tried).
    m_counts : {"expectation", "urn"}, default="expectation"
        Table counts m_pk for the kappa step: their expectation (an EM step, E never increases)
        or the paper's draw by the urn of eq. 6.2.
    moves : bool, default=True
        Viterbi, merge and split moves.
    temper : "auto" or float in (0, 1], default="auto"
        Weight w of each record's emission (power likelihood), so that a sequence drifting within
        its states is not split into extra states. "auto" measures w from the residual
        autocorrelation of a first, untempered fit's states (``fit_map_ihmm``). A series with
        a trend drifts within every state and can end in one; that fit warns
        (``DegenerateFitWarning``, ``pipeline.core.diagnose.sequence_fit``).
    random_state : int, SeedSequence, Generator or None
    verbose : int, default=0

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        State of every time step, 0..K-1, in the rows' order.
    n_states_ : int
    transmat_ : ndarray of shape (n_states, n_states)
        MAP transition matrix of the represented states.
    startprob_ : ndarray of shape (n_states,)
    kappa_ : ndarray of shape (n_states + 1,)
        Global weights; the last is the unrepresented mass.
    objective_, objective_history_, n_iter_, restart_objectives_
        As ``MAPDP``'s (``objective_`` is tempered by ``temper_``).
    temper_ : float
    residual_autocorrelation_ : float
        rho of the first run's states (NaN unless measured).
    state_stats_ : ndarray of shape (n_states, n_stats)
    state_sizes_ : ndarray of shape (n_states,)
    transition_counts_ : ndarray of shape (n_states, n_states)
    start_counts_ : ndarray of shape (n_states,)
    family_ : ProductFamily
    alpha_, gamma_ : float
    """

    def __init__(
        self,
        alpha: float = config.IHMM_ALPHA,
        gamma: float = config.GAMMA,
        family: Any = "auto",
        prior_scale: float | None = PRIOR_SCALE,
        n_restarts: int = 1,
        max_iter: int = config.IHMM_MAX_ITER,
        tol: float = config.IHMM_TOL,
        m_counts: str = config.IHMM_M_COUNTS,
        moves: bool = True,
        temper: Any = config.IHMM_TEMPER,
        random_state: Any = None,
        verbose: int = 0,
    ):
        config.keep_params(self, locals())

    def _check_run(self) -> None:
        config.check_int(self.n_restarts, "n_restarts")
        config.check_int(self.max_iter, "max_iter")
        config.check_tol(self.tol)
        config.check_choice(self.m_counts, M_COUNTS, "m_counts")
        check_temper(self.temper)

    def _run(
        self, Xa: FloatArray, starts: IntArray, alpha: float, gamma: float
    ) -> tuple[IntArray, HmmState]:
        """The restarts and tempering of ``pipeline.models.ihmm_map.fit_map_ihmm``."""
        best, objectives, w, rho = fit_map_ihmm(
            Xa,
            starts,
            self.family_,
            alpha,
            gamma,
            as_seed_sequence(self.random_state),
            check_temper(self.temper),
            int(self.n_restarts),
            int(self.max_iter),
            float(self.tol),
            self.m_counts,
            bool(self.moves),
            bool(self.verbose),
        )
        if not best.converged:
            warnings.warn(
                f"MAP-iHMM did not converge in max_iter={self.max_iter} iterations",
                ConvergenceWarning,
                # the caller of fit
                stacklevel=3,
            )
        bad = sequence_fit(best.state.n_states, Xa.shape[0], w, rho)
        if bad:
            warnings.warn(f"MAPiHMM: {bad}", DegenerateFitWarning, stacklevel=3)
        self.objective_ = best.objective
        self.objective_history_ = best.history
        self.n_iter_ = best.n_iter
        self.restart_objectives_ = objectives
        self.temper_ = w
        self.residual_autocorrelation_ = rho
        return best.labels, best.state


class IHMMGibbs(_SequenceEstimator):
    """The direct-assignment Gibbs sampler of the infinite HMM (Raykov et al. 2016, Section 6.1).

    Each sweep draws every z_t from eq. 6.3, then the table counts by the urn (eq. 6.2) and
    kappa from eq. 6.1, with ``MAPiHMM``'s kernels.

    Parameters
    ----------
    alpha, gamma, family, prior_scale : as ``MAPiHMM``.
    n_sweeps : int, default=1000
    burn_in : int, default=200
    random_state : int, SeedSequence, Generator or None

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        The kept sample with the lowest E(z, kappa).
    n_states_trace_, objective_trace_ : ndarray of shape (n_sweeps,)
    Others as ``MAPiHMM`` (of the retained sample).
    """

    def __init__(
        self,
        alpha: float = config.IHMM_ALPHA,
        gamma: float = config.GAMMA,
        family: Any = "auto",
        prior_scale: float | None = PRIOR_SCALE,
        n_sweeps: int = 1000,
        burn_in: int = 200,
        random_state: Any = None,
    ):
        config.keep_params(self, locals())

    def _check_run(self) -> None:
        config.check_int(self.n_sweeps, "n_sweeps")
        config.check_int(self.burn_in, "burn_in", minimum=0)
        if self.burn_in >= self.n_sweeps:
            raise ValueError(f"burn_in must be < n_sweeps, got {self.burn_in}")

    def _run(
        self, Xa: FloatArray, starts: IntArray, alpha: float, gamma: float
    ) -> tuple[IntArray, HmmState]:
        """``n_sweeps`` sweeps of ``run_gibbs``; the kept sample of lowest E."""
        fam = self.family_
        n_states = np.zeros(self.n_sweeps, dtype=np.int64)
        energy = np.zeros(self.n_sweeps)
        kept: dict[str, Any] = {"e": np.inf}

        def record(i: int, z: IntArray, st: HmmState) -> None:
            e = st.objective(fam, alpha, gamma)
            n_states[i] = st.n_states
            energy[i] = e
            if i >= self.burn_in and e < kept["e"]:
                kept.update(e=e, z=z.copy(), st=st)

        run_gibbs(
            Xa,
            starts,
            fam,
            alpha,
            gamma,
            int(self.n_sweeps),
            as_seed_sequence(self.random_state),
            record,
        )
        self.objective_ = float(kept["e"])
        self.n_states_trace_ = n_states
        self.objective_trace_ = energy
        return kept["z"], kept["st"]


def model_from_state(
    schema: Any,
    family: Any,
    st: HmmState,
    alpha: float,
    gamma: float,
    params: dict[str, Any],
    temper: float = 1.0,
    rho: float = math.nan,
) -> MAPiHMM:
    """The ``MAPiHMM`` of a distributed run's final state ``st`` (the ``ihmm`` engine's):
    ``predict`` / ``score_samples`` are the run's write-out (Viterbi labels, forward-algorithm
    log likelihoods) under these states; ``params`` are the estimator's, ``temper`` the run's
    emission weight w (``temper_``, which ``predict`` decodes with) measured from ``rho``."""
    est = MAPiHMM(**params)
    est.temper_ = float(temper)
    est.residual_autocorrelation_ = float(rho)
    est.schema_ = schema
    est.family_ = family
    est.n_features_in_ = len(schema.columns)
    if schema.from_frame:
        est.feature_names_in_ = np.asarray(schema.columns, dtype=object)
    est.alpha_ = float(alpha)
    est.gamma_ = float(gamma)
    est._set_model(st)
    return est
