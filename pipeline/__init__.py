"""dpmm-pipeline: Bayesian nonparametric clustering at scale.

The public API (``pipeline.estimators.registry.PUBLIC``), loaded lazily so that ``import
pipeline`` stays light: the estimators ``MAPDP``, ``ASUGS``, ``BHC``, ``TreeGuidedMCMC``,
``DPMeans``, ``CollapsedGibbs``, ``UncollapsedGibbs``, ``MixedEffectsDP``, ``MAPiHMM`` and
``IHMMGibbs`` with their base ``MixtureEstimator``; ``GridSearch``; ``exact_log_marginal``;
``save_model`` / ``load_model``; and ``families``, the likelihood families.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

__version__ = "0.1.0"


def numba_cache_dir(root: Path | None = None) -> Path | None:
    """The numba cache directory of every process of the pipeline: ``numba`` under
    ``kernels/__pycache__`` if writable, else under ``~/.cache/dpmm-pipeline``; None if neither.

    One directory serves every version of the kernels: each cached kernel is stamped with the
    sources it can hold (``kernels._cache``), so an edit recompiles only the kernels it reaches.
    """
    if root is None:
        spec = importlib.util.find_spec("kernels")
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(next(iter(spec.submodule_search_locations)))
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpmm-pipeline"
    for base in (root / "__pycache__", user):
        try:
            where = base / "numba"
            where.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(where, os.W_OK):
            return where
    return None


# before the kernels are imported: their locator (``kernels._cache``) reads NUMBA_CACHE_DIR then,
# also where numba itself was imported first (it reads the variable once, at its import); Dask's
# worker processes inherit it. A cache chosen by the user (make, the image) is kept.
if not os.environ.get("NUMBA_CACHE_DIR"):
    _where = numba_cache_dir()
    if _where is not None:
        os.environ["NUMBA_CACHE_DIR"] = str(_where)


def __getattr__(name: str) -> Any:
    # the public names are ``pipeline.estimators.registry.PUBLIC``'s, imported on first use
    if name == "__all__" or not name.startswith("_"):
        from pipeline.estimators import registry

        # a name asked for while the registry itself is being imported is not one of them yet
        public: dict[str, Any] = getattr(registry, "PUBLIC", {})
        if name == "__all__":
            return sorted(public)
        if name in public:
            globals()[name] = public[name]
            return public[name]
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
