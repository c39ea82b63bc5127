"""dpmm-pipeline: Bayesian nonparametric clustering at scale.

The public API (``pipeline.estimators.registry.PUBLIC``), loaded lazily so that ``import
pipeline`` stays light: the estimators ``MAPDP``, ``ASUGS``, ``BHC``, ``TreeGuidedMCMC``,
``DPMeans``, ``CollapsedGibbs``, ``UncollapsedGibbs``, ``MixedEffectsDP``, ``MAPiHMM`` and
``IHMMGibbs`` with their base ``MixtureEstimator``; ``GridSearch``; ``exact_log_marginal``;
``save_model`` / ``load_model``; and ``families``, the likelihood families.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

__version__ = "0.1.0"


def numba_cache_dir(root: Path | None = None) -> Path | None:
    """A numba cache directory named after the kernels' sources: ``numba-<hash>`` under
    ``kernels/__pycache__`` if writable, else under ``~/.cache/dpmm-pipeline``; None if neither.

    numba's ``cache=True`` checks only a function's own file, not the kernels it inlines, so
    after an edit a cached caller could run a stale callee; a directory per version of the
    sources cannot be stale.
    """
    if root is None:
        spec = importlib.util.find_spec("kernels")
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(next(iter(spec.submodule_search_locations)))
    h = hashlib.sha1(usedforsecurity=False)
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    name = f"numba-{h.hexdigest()[:16]}"
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpmm-pipeline"
    for base in (root / "__pycache__", user):
        try:
            where = base / name
            where.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(where, os.W_OK):
            return where
    return None


# before numba is imported (it reads NUMBA_CACHE_DIR once); Dask's worker processes inherit it.
# A cache chosen by the user (make, the image) is kept.
if not os.environ.get("NUMBA_CACHE_DIR") and "numba" not in sys.modules:
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
