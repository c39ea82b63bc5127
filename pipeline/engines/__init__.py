"""The engines of the pass loop, by name (``pipeline.engines.base`` has the protocol).

Adding a model: a module ``pipeline/engines/NAME.py`` whose ``ENGINE`` is an ``Engine``, its
kernels under ``kernels/``, and one line here. The pass loop, the flow, the command line's
``--engine`` choices and the workers' warm-up all read this registry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.engines.base import Engine

ENGINE_MODULES: dict[str, str] = {
    "mapdp": "pipeline.engines.mapdp",
    "kmeans": "pipeline.engines.kmeans",
    "mixed_effects": "pipeline.engines.mixed_effects",
    "ihmm": "pipeline.engines.ihmm",
    "asugs": "pipeline.engines.asugs",
}
ENGINES: tuple[str, ...] = tuple(ENGINE_MODULES)
# engines whose unit is a subject (a group of rows), not a record: not ``dpmm run``'s mixtures
SUBJECT_ENGINES: tuple[str, ...] = ("mixed_effects",)
MIXTURE_ENGINES: tuple[str, ...] = tuple(e for e in ENGINES if e not in SUBJECT_ENGINES)


def get_engine(name: str) -> Engine:
    """The engine registered as ``name``."""
    if name not in ENGINE_MODULES:
        raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
    engine: Engine = importlib.import_module(ENGINE_MODULES[name]).ENGINE
    return engine


def all_engines() -> list[Engine]:
    """Every registered engine (for the workers' warm-up)."""
    return [get_engine(name) for name in ENGINES]
