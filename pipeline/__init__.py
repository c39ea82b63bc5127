"""dpmm-pipeline: Bayesian nonparametric clustering at scale.

The public API, loaded lazily so that ``import pipeline`` stays light:

* ``MAPDP`` - MAP-DP (Raykov et al. 2016, Algorithm 1), scikit-learn style;
* ``ASUGS`` - one-pass streaming ASUGS / ASUGS-PM / SUGS with ``partial_fit`` (Tsiligkaridis
  and Forsythe);
* ``BHC`` - Bayesian hierarchical clustering with its lower bounds (Xu et al. 2009);
* ``TreeGuidedMCMC`` - tree-guided MCMC for DP and NGGP mixtures (Lee and Choi 2015);
* ``DPMeans``, ``CollapsedGibbs``, ``UncollapsedGibbs`` - reference methods (the Gibbs samplers of
  seed 003, Algorithms 3 and 2);
* ``MixedEffectsDP`` - the semiparametric mixed-effects model of seed 000 Section 7;
* ``MAPiHMM``, ``IHMMGibbs`` - the infinite HMM of seed 000 Section 6 (MAP and Gibbs);
* ``MixtureEstimator`` - the base class of all of them (fit template, encoding, predict checks);
* ``GridSearch`` - hyperparameters by K-fold held-out log predictive density on Dask, in
  scikit-learn's ``GridSearchCV`` conventions (seed 000, Appendix A, option 4);
* ``exact_log_marginal`` - the DPM marginal likelihood by enumeration of partitions;
* ``save_model`` / ``load_model`` - fitted models as a directory of JSON and arrays, no pickle
  (``estimator.save(path)`` is ``save_model``);
* ``families`` - the likelihood families (``GaussianNW``, ``NormalGamma``, ``Categorical``, ...).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "MAPDP": "pipeline.mapdp",
    "MAPiHMM": "pipeline.ihmm",
    "IHMMGibbs": "pipeline.ihmm",
    "ASUGS": "pipeline.asugs",
    "BHC": "pipeline.bhc",
    "TreeGuidedMCMC": "pipeline.tgmcmc",
    "DPMeans": "pipeline.baselines",
    "CollapsedGibbs": "pipeline.baselines",
    "UncollapsedGibbs": "pipeline.baselines",
    "MixtureEstimator": "pipeline.base",
    "MixedEffectsDP": "pipeline.mixed_effects_estimator",
    "exact_log_marginal": "pipeline.exact",
    "GridSearch": "pipeline.search",
    "families": "pipeline.families",
    "load_model": "pipeline.model",
    "save_model": "pipeline.model",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if name == "families" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
