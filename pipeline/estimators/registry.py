"""The models, by name: each one's estimator, the engine of its distributed pass loop and its
``dpmm`` command, or why it has none.

The one map from a model's name to its code, in static imports: ``pipeline``'s lazy public names,
the estimators a saved model may load into and the registry test read it (adding a model:
docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline import families
from pipeline.estimators.asugs import ASUGS
from pipeline.estimators.base import MixtureEstimator
from pipeline.estimators.baselines import CollapsedGibbs, DPMeans, UncollapsedGibbs
from pipeline.estimators.bhc import BHC
from pipeline.estimators.ihmm import IHMMGibbs, MAPiHMM
from pipeline.estimators.mapdp import MAPDP
from pipeline.estimators.mixed_effects import MixedEffectsDP
from pipeline.estimators.model import load_model, save_model
from pipeline.estimators.search import GridSearch
from pipeline.estimators.tgmcmc import TreeGuidedMCMC
from pipeline.models.exact import exact_log_marginal

_REFERENCE = "a reference method for in-memory comparisons, not scaled out"


@dataclass(frozen=True)
class Model:
    """One model: its estimator (a ``MixtureEstimator``, or ``BaseEstimator``), the name of its
    engine in ``pipeline.engines.BY_NAME`` and the ``dpmm`` subcommand that fits it (each or
    None), and ``why`` one is missing ("" when it has both)."""

    estimator: type
    engine: str | None
    command: str | None
    why: str = ""


MODELS: dict[str, Model] = {
    m.estimator.__name__: m
    for m in (
        Model(MAPDP, "mapdp", "run"),
        Model(ASUGS, "asugs", "run --engine asugs"),
        Model(MAPiHMM, "ihmm", "hmm"),
        Model(MixedEffectsDP, "mixed_effects", "longitudinal"),
        Model(BHC, None, "run --stage2 bhc", "stage 2 over stage 1's cluster summaries"),
        Model(
            TreeGuidedMCMC,
            None,
            "run --stage2 bhc --mcmc 100",
            "stage 2, after BHC, over stage 1's cluster summaries",
        ),
        Model(DPMeans, None, None, _REFERENCE),
        Model(CollapsedGibbs, None, None, _REFERENCE),
        Model(UncollapsedGibbs, None, None, _REFERENCE),
        Model(IHMMGibbs, None, None, _REFERENCE),
    )
}

#: ``pipeline``'s public names (its lazy attributes): every model's estimator, and the rest
PUBLIC: dict[str, Any] = {
    **{name: m.estimator for name, m in MODELS.items()},
    "MixtureEstimator": MixtureEstimator,
    "GridSearch": GridSearch,
    "exact_log_marginal": exact_log_marginal,
    "families": families,
    "load_model": load_model,
    "save_model": save_model,
}
