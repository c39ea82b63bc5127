"""One place for the defaults and the validation of every fit's parameters.

The command line (``flows.cli``), the Prefect flows, ``fit_distributed`` and the estimators take
their defaults from here and check their values with these functions, so that a default or a
message is written once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.core import storage
from pipeline.core.persist import register

DEFAULT_CHUNK_ROWS = 100_000
PRIOR_SAMPLE = 50_000
INIT_SAMPLE = 20_000
#: the DP concentration N0 of the mixture models (``MAPDP``, ``MixedEffectsDP``, ``dpmm run``,
#: ``cluster``, ``longitudinal``): "learn" is its MAP value under ``ALPHA_PRIOR`` (eq. A.1)
ALPHA = "learn"
#: the distributed pass loop's stop rule (``FitParams``): ``MAX_PASSES`` passes, or a pass that
#: lowers the objective by at most ``TOL`` relative, or moves at most ``MIN_CHANGE`` of the records
MAX_PASSES = 50
TOL = 1e-5
MIN_CHANGE = 1e-3
#: an in-memory fit's stop rule (``MAPDP``, ``MAPiHMM``, ``dpmm cluster``, ``dpmm cv``'s fold
#: fits), not the pass loop's: an in-memory iteration costs milliseconds where a pass reads the
#: whole store (``tests/flows/test_defaults.py`` lists the difference)
MAX_ITER = 100
TOL_IN_MEMORY = 1e-6
#: restarts of an in-memory MAP-DP fit, "auto": ``AUTO_RESTARTS`` up to ``AUTO_RESTARTS_ROWS``
#: records, else 1, each judged on the ``RESTART_HOLDOUT`` share it leaves out (``MAPDP``)
N_RESTARTS = "auto"
AUTO_RESTARTS, AUTO_RESTARTS_ROWS, RESTART_HOLDOUT = 3, 20_000, 0.2
#: ``dpmm serve``'s deployment (``flows.scheduled``): its name, its schedule (every day at 02:00
#: UTC, as in infra/prefect.yaml) and the partitions (days) of each refit's window
DEPLOYMENT = "dpmm-scheduled"
CRON = "0 2 * * *"
WINDOW = 7
#: seconds after which the lock on ``MODELS/LATEST`` of a model registry's writer that crashed
#: (on another host, or paused) stops blocking the others (``pipeline.ops.registry``); the lock is
#: held for one read and one rename, milliseconds
REGISTRY_LEASE = 60.0
#: object storage's retry policy (``pipeline.core.storage.retry_policy``): set there, since the
#: storage layer sits below this module (persisting ``FitParams`` reads and writes through it)
STORAGE_ATTEMPTS = storage.STORAGE_ATTEMPTS
#: Gamma(shape, rate) prior on the concentration N0 when it is learned (eq. A.1): shape 2 keeps
#: the mode away from 0 at K = 1; rate 5 (prior mean 0.4) stops singleton clusters of outlying
#: records from raising N0, which opens more (ionosphere: 39 clusters with rate 1, 26 with 5)
ALPHA_PRIOR = (2.0, 5.0)
#: ``family="auto"``'s covariance (``Schema.choose_structure``): held-out density on at most
#: ``EVIDENCE_ROWS`` rows in ``EVIDENCE_FOLDS`` folds, given ``EVIDENCE_MIN`` rows and
#: ``EVIDENCE_PER_COL`` per column (else diagonal: with fewer, full covariance wins on density by
#: merging the clusters, as on tissue expression, 80 genes on 189 rows: NMI 0.52 full, 0.87
#: diagonal, and sonar, 60 columns on 208 rows: 0.09 and 0.14)
EVIDENCE_ROWS, EVIDENCE_FOLDS, EVIDENCE_MIN, EVIDENCE_PER_COL = 2_000, 3, 60, 10
#: the empirical-Bayes prior scales (the share of the data's covariance one cluster is expected
#: to carry) that a MAP-DP fit of up to ``AUTO_RESTARTS_ROWS`` records with no ``prior_scale``
#: chooses among on the structure's sample (``SCALE_ROWS``), by the objective its default fit
#: ends with (``Schema.choose_scale``): on the 23 real tables 18 at or above BGMM against 16
#: with the fixed 0.3, mean NMI 0.560 against 0.546
#: (``bench_real.py::test_prior_scale_by_objective``)
PRIOR_SCALES = (0.5, 0.3, 0.2, 0.15, 0.1, 0.05)
#: rows of the structure's sample the scale is chosen on (at least ``EVIDENCE_PER_COL`` per
#: column): six default fits on 1,000 rows cost half what they do on 2,000 (digits, 1,797 x 61:
#: the fit 23.9 -> 12.3 s), and on the real tables of more rows the choice was the same but
#: satellite's (0.3 -> 0.5, objectives 0.05% apart; NMI 0.553 -> 0.549)
SCALE_ROWS = 1_000
N_FOLDS = 10
#: the infinite HMM's top-level concentration M0 (Raykov et al. 2016, Section 6)
GAMMA = 2.0
INITS = ("auto", "sample", "sequential", "one-cluster", "seeds", "asugs", "asugs-sample")
MAX_SEEDS = 100
#: the engines of the pass loop by name (``pipeline.engines`` maps each to its module)
ENGINES = ("mapdp", "kmeans", "mixed_effects", "ihmm", "asugs")
#: the engines whose records are subjects (whole groups), not single records
SUBJECT_ENGINES = ("mixed_effects",)
#: the engines whose records are single records (``dpmm run --engine``)
MIXTURE_ENGINES = tuple(e for e in ENGINES if e not in SUBJECT_ENGINES)
#: where a fit's passes run; "gpu" takes the engines with a GPU version (``pipeline.engines.gpu``)
DEVICES = ("cpu", "gpu")
GPU_ENGINES = ("mapdp", "kmeans")
#: ASUGS's lambda (``pipeline.models.asugs.DEFAULT_LAM``): the paper does not give its value; 0.3 (a
#: prior mean of alpha of 1 / lambda = 3.3) found as many or more of the true classes than 1.0
#: on every data set of ``bench_asugs`` and the tests
ASUGS_LAM = 0.3
#: how a grid search picks its cell (``pipeline.estimators.search``)
SELECT = ("best", "one-se")
#: ``GridSearch`` also takes "given": the estimator's own parameters unless a candidate beats
#: them on evidence (``dpmm cv``'s grid has no estimator of its own to keep)
SEARCH_SELECT = (*SELECT, "given")
#: the values ``tune="cv"`` tries (``pipeline.estimators.tuning``), one hyperparameter at a time: 3
#: concentrations, then 4 prior scales (after the family variants)
TUNE_GRID: dict[str, list[Any]] = {"alpha": [0.1, 1.0, 10.0], "prior_scale": [0.5, 0.3, 0.1, 0.03]}


def keep_params(estimator: Any, given: dict[str, Any]) -> None:
    """Store an estimator's ``__init__`` arguments (``given``: its ``locals()``) as given."""
    estimator.__dict__.update({k: given[k] for k in estimator._get_param_names()})


def check_alpha(alpha: Any, what: str = "alpha") -> tuple[float, bool]:
    """A DP concentration: a positive finite number, or "learn" (MAP under its Gamma prior).

    Returns the starting value (1.0 when learned) and whether it is learned.
    """
    if isinstance(alpha, str):
        if alpha != "learn":
            raise ValueError(f"{what} must be a positive float or 'learn', got {alpha!r}")
        return 1.0, True
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a positive float or 'learn', got {alpha!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what} must be a positive finite float, got {alpha!r}")
    return value, False


def check_positive(value: Any, what: str) -> float:
    """A positive finite number (a concentration, a scale)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a positive finite number, got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    return v


def check_alpha_prior(prior: Any) -> tuple[float, float]:
    """The Gamma(a, b) prior of a learned concentration (eq. A.1): two positive numbers."""
    try:
        a, b = (float(v) for v in prior)
    except (TypeError, ValueError):
        raise ValueError(f"alpha_prior must be two positive numbers, got {prior!r}") from None
    if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"alpha_prior must be two positive numbers, got {prior!r}")
    return a, b


def check_int(value: Any, what: str, minimum: int = 1) -> int:
    """An integer of at least ``minimum``."""
    if isinstance(value, bool) or int(value) != value or int(value) < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_tol(value: Any, what: str = "tol") -> float:
    v = float(value)
    if not v >= 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return v


def check_fraction(value: Any, what: str) -> float:
    """A fraction in [0, 1)."""
    v = float(value)
    if not 0.0 <= v < 1.0:
        raise ValueError(f"{what} must be in [0, 1), got {value!r}")
    return v


def check_choice(value: Any, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise ValueError(f"{what} must be one of {choices}, got {value!r}")
    return str(value)


@register
@dataclass(frozen=True)
class FitParams:
    """Parameters of stage 1 (the pass loop), whatever the engine.

    engine : a registered engine name (``pipeline.engines.ENGINES``: "mapdp", "kmeans", ...).
    alpha : DP concentration N0, or "learn" (MAP under Gamma(alpha_prior), eq. A.1, after every
        pass).
    init : "sample" (in-memory MAP-DP with split / merge moves on a hash sample of
        ``init_sample`` training rows), "sequential" (no cluster: the first pass opens them),
        "one-cluster" (Algorithm 1's start), "seeds" (``n_seeds`` random training records as
        singleton clusters, Xu et al. 2009, Section 5), "asugs" (the clusters of one ASUGS-PM
        streaming pass over every chunk, Tsiligkaridis and Forsythe 2015: pass 1 assigns every
        record against them), "asugs-sample" (the same over the "sample" start's rows); "auto" is
        "sample".
    n_seeds : seeds of the "seeds" start; default min(ceil(sqrt(N)), 100).
    init_sample : rows of the "sample" start (at most the prior's sample of ingest).
    max_passes, tol, min_change : stop after ``max_passes`` passes, or when a pass lowers the
        objective by at most ``tol * |objective|`` (relative), or when at most
        ``min_change * N_train`` records changed cluster in the pass.
    seed : entropy of the SeedSequence all (restart, pass, chunk) seeds derive from.
    prior_scale : the share of the data's variance one cluster is expected to carry under the
        empirical-Bayes prior (``GaussianNW.empirical_bayes``), in (0, 1); None is the engine's
        own default (``Engine.prior_scale``, else the family's ``DEFAULT_SCALE``).
    device : "cpu", or "gpu": the passes on NVIDIA GPUs (``pipeline.engines.gpu``; engines
        ``GPU_ENGINES``).
    """

    engine: str = "mapdp"
    alpha: float | str = ALPHA
    alpha_prior: tuple[float, float] = ALPHA_PRIOR
    init: str = "auto"
    n_seeds: int | None = None
    init_sample: int = INIT_SAMPLE
    max_passes: int = MAX_PASSES
    tol: float = TOL
    min_change: float = MIN_CHANGE
    seed: int = 0
    restart: int = 0
    prior_scale: float | None = None
    device: str = "cpu"

    def checked(self) -> FitParams:
        check_choice(self.engine, ENGINES, "engine")
        check_choice(self.device, DEVICES, "device")
        if self.device == "gpu":
            check_choice(self.engine, GPU_ENGINES, "the engine of device='gpu'")
        check_choice(self.init, INITS, "init")
        check_alpha(self.alpha)
        check_int(self.max_passes, "max_passes")
        check_tol(self.tol)
        check_fraction(self.min_change, "min_change")
        check_int(self.init_sample, "init_sample")
        if self.n_seeds is not None:
            check_int(self.n_seeds, "n_seeds")
        check_alpha_prior(self.alpha_prior)
        if self.prior_scale is not None:
            check_scale(self.prior_scale)
        return self

    @property
    def learn_alpha(self) -> bool:
        return isinstance(self.alpha, str)

    @property
    def start(self) -> str:
        return "sample" if self.init == "auto" else self.init


def check_scale(scale: float) -> float:
    """A prior scale: the share of the data's variance a cluster carries, in (0, 1)."""
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"prior_scale must be a number in (0, 1), got {scale!r}") from None
    if not 0.0 < s < 1.0:
        raise ValueError(
            f"prior_scale must be in (0, 1) (the share of the data's variance one cluster is "
            f"expected to carry), got {scale!r}"
        )
    return s


# the infinite HMM
#: MAP-iHMM's N0 (``alpha``) of the estimators; the engine takes the run's ``alpha``
IHMM_ALPHA = 1.0
#: the empirical-Bayes prior scale of the iHMM's emissions (``MAPiHMM``, ``IHMMGibbs``, the
#: ``ihmm`` engine), below the mixtures' 0.3: their figures (Table 4, ``bench_ihmm``) were
#: measured with 0.1, and the engine failed to recover a simulated HMM's states under 0.3
IHMM_PRIOR_SCALE = 0.1
#: one MAP-iHMM run (``MAPiHMM`` and the engine's sample start): most iterations, the relative
#: fall of E below which an iteration stalls, the table counts of the kappa step
IHMM_MAX_ITER = MAX_ITER
IHMM_TOL = TOL_IN_MEMORY
IHMM_M_COUNTS = "expectation"
#: the emission weight w: "auto" measures the records' autocorrelation within their states
IHMM_TEMPER = "auto"
