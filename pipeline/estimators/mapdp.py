"""``MAPDP``: the scikit-learn-style estimator around the MAP-DP kernels (Raykov et al. 2016)."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from sklearn.exceptions import ConvergenceWarning

from pipeline.core import config
from pipeline.core.diagnose import DegenerateFitWarning, degenerate_fit
from pipeline.core.seeds import as_seed_sequence
from pipeline.estimators.base import MixtureEstimator, check_missing
from pipeline.estimators.tuning import tune_cv
from pipeline.families import FloatArray
from pipeline.models import mapdp as mm
from pipeline.models.mapdp import auto_restarts, set_fitted


class MAPDP(MixtureEstimator):
    """MAP-DP: approximate MAP inference for Dirichlet process mixtures (Raykov et al. 2016,
    Algorithm 1).

    Iterated conditional modes on the collapsed DPM: every record in turn goes to the cluster, or
    a new one, that maximises the complete-data likelihood (eq. 3.3).

    Parameters
    ----------
    alpha : float or "learn", default="learn"
        DP concentration N0; "learn" sets it after every iteration to its MAP value under a
        Gamma(``alpha_prior``) prior (eq. A.1), starting from 1.
    family : "auto", str, dict, Family or ProductFamily, default="auto"
        Likelihood family per column (rules in ``pipeline.families.schema``); an instance fixes
        the prior and applies to numeric arrays.
    n_restarts : int or "auto", default="auto"
        Runs over random permutations, each of the records but a hash share (``config``'s
        ``RESTART_HOLDOUT``); the one whose clusters give those the highest mean log predictive
        density (eq. 3.4) continues on all (the objective is flat; its lowest point need not be
        the better partition). "auto": 3 up to 20,000 records, else 1 (large tables are taken to
        the same optimum by the split and merge moves).
    max_iter : int, default=100
        Maximum iterations (sweeps) per run.
    tol : float, default=1e-6
        A run stops when an iteration lowers the objective by at most ``tol * |objective|`` or
        moves no record.
    init : {"sequential", "one-cluster"}, default="sequential"
        "sequential" starts with no cluster and assigns records in visiting order;
        "one-cluster" starts as Algorithm 1 writes it, a start ICM rarely leaves. On a dask
        collection the start is in-memory MAP-DP on a sample instead.
    alpha_prior : (float, float), default=(2.0, 5.0)
        Shape and rate of the Gamma prior on N0 (``config.ALPHA_PRIOR``); a shape above 1 keeps
        the mode of eq. A.1 away from the absorbing 0 when K = 1.
    random_state : int, SeedSequence, Generator or None
        Seeds the permutations.
    verbose : int, default=0
        1 prints one line per iteration.
    prior_scale : float in (0, 1) or None, default=None
        Share of the data's (co)variance one cluster is expected to carry, for the
        empirical-Bayes prior of the Gaussian columns. None: up to 20,000 records, where the
        covariance structure is chosen by evidence (``schema_.structure``), the scale of
        ``config.PRIOR_SCALES`` whose default fit of the first ``config.SCALE_ROWS`` rows of the
        same sample ends with the lowest objective -log p(X, z, N0) and is not degenerate
        (``structure["scale"]``, the objectives in ``structure["scales"]``); elsewhere each
        family's default.
    missing : {"latent", "refuse"}, default="latent"
        "latent": a missing cell is a latent variable set by ICM alongside the assignments
        (``pipeline.models.mapdp.fit_missing``); ``predict`` marginalises it out exactly.
        "refuse": a missing cell is an error naming its column and row.
    strict : bool, default=False
        A column holding one value is dropped with a warning (``schema_.dropped``);
        ``strict=True`` refuses it.
    tune : {None, "cv"}, default=None
        "cv" first chooses the concentration and the prior scale, one at a time, by 5-fold
        held-out log predictive density (Raykov et al. 2016, Appendix A) over
        ``pipeline.estimators.tuning.TUNE_GRID`` with ``GridSearch(select="given")``, then fits
        all of X with the choice (``best_params_``, ``cv_results_``); about 40 fold fits.
    device : {"cpu", "gpu"}, default="cpu"
        "gpu" fits with the distributed passes on NVIDIA GPUs (``pipeline.engines.gpu``); needs
        numba-cuda and a GPU (``DeviceError`` otherwise) and continuous columns.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        Cluster of each training record, 0..K-1.
    n_clusters_ : int
    n_iter_ : int
        Iterations of the winning run.
    objective_ : float
        -log p(X, z | N0) of the winning run (plus -log p(N0) when learned).
    objective_history_ : list of float
        Objective after each iteration of the winning run; never increases.
    restart_objectives_ : list of float
        Each restart's objective (on the records it was fitted to).
    restart_heldout_ : list of float
        Each restart's mean held-out log density (empty with one restart).
    alpha_ : float
        Concentration used (the learned one with ``alpha="learn"``).
    cluster_sizes_ : ndarray of shape (n_clusters,)
    cluster_stats_ : ndarray of shape (n_clusters, n_stats)
        Additive sufficient statistics of each cluster.
    family_ : ProductFamily
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a DataFrame.
    """

    _scale_by_objective: ClassVar[bool] = True
    _model_extras: ClassVar[tuple[str, ...]] = (
        "n_iter_",
        "objective_",
        "objective_history_",
        "restart_objectives_",
        "restart_heldout_",
    )

    def __init__(
        self,
        alpha: float | str = config.ALPHA,
        family: Any = "auto",
        n_restarts: int | str = config.N_RESTARTS,
        max_iter: int = config.MAX_ITER,
        tol: float = config.TOL_IN_MEMORY,
        init: str = "sequential",
        alpha_prior: tuple[float, float] = config.ALPHA_PRIOR,
        random_state: Any = None,
        verbose: int = 0,
        prior_scale: float | None = None,
        tune: str | None = None,
        missing: str = "latent",
        strict: bool = False,
        device: str = "cpu",
    ):
        config.keep_params(self, locals())

    def _check_params(self) -> tuple[float, bool, tuple[float, float]]:
        alpha, learn = config.check_alpha(self.alpha)
        check_missing(self.missing)
        if self.n_restarts != "auto":
            if isinstance(self.n_restarts, str):
                raise ValueError(f"n_restarts must be 'auto' or >= 1, got {self.n_restarts!r}")
            config.check_int(self.n_restarts, "n_restarts")
        config.check_int(self.max_iter, "max_iter")
        config.check_tol(self.tol)
        self._check_tuning()
        return alpha, learn, config.check_alpha_prior(self.alpha_prior)

    def fit(self, X: Any, y: Any = None) -> MAPDP:
        """Fit MAP-DP to X, array-like, DataFrame or Dask collection of shape (n_samples,
        n_features); y is ignored. Returns self."""
        import dask

        config.check_choice(self.device, config.DEVICES, "device")
        if self.tune is not None:
            self._check_params()
            return tune_cv(self, X)
        if dask.is_dask_collection(X) or self.device == "gpu":
            self._check_params()
            # the distributed code path: passes over the chunks on Dask (pipeline.distributed.fit)
            from pipeline.distributed.fit import fit_estimator

            return fit_estimator(self, X)
        return super().fit(X)

    def _fit(self, Xa: FloatArray, params: tuple[float, bool, tuple[float, float]]) -> None:
        alpha0, learn, alpha_prior = params
        N = Xa.shape[0]
        n_restarts = auto_restarts(N) if self.n_restarts == "auto" else int(self.n_restarts)
        args = (alpha0, learn, alpha_prior, int(self.max_iter), float(self.tol), self.init)
        seq = as_seed_sequence(self.random_state)
        best, objectives, self.restart_heldout_ = mm.fit_restarts(
            Xa, self.family_, seq, n_restarts, args, bool(self.verbose)
        )
        if not best.converged:
            warnings.warn(
                f"MAP-DP did not converge in max_iter={self.max_iter} iterations; "
                "increase max_iter or tol",
                ConvergenceWarning,
                stacklevel=2,
            )
        set_fitted(self, best, objectives, self.family_)
        bad = degenerate_fit(self.n_clusters_, N)
        if bad is not None:
            warnings.warn(f"MAPDP: {bad}", DegenerateFitWarning, stacklevel=3)
