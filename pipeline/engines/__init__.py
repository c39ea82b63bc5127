"""The engines of the pass loop, by name (``pipeline.engines.base`` has the protocol).

Adding a model: a module ``pipeline/engines/NAME.py`` whose ``ENGINE`` is an ``Engine``, its
kernels under ``kernels/``, and its name in ``pipeline.core.config.ENGINES``. The pass loop,
the flow, the command line's ``--engine`` choices and the workers' warm-up all read this registry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pipeline.core.config import ENGINES, GPU_ENGINES, SUBJECT_ENGINES

__all__ = [
    "ENGINES",
    "ENGINE_MODULES",
    "GPU_ENGINES",
    "MIXTURE_ENGINES",
    "SUBJECT_ENGINES",
    "get_engine",
]

if TYPE_CHECKING:
    from pipeline.engines.base import Engine

#: each engine's module: ``pipeline/engines/NAME.py`` for every name in ``ENGINES``
ENGINE_MODULES: dict[str, str] = {name: f"pipeline.engines.{name}" for name in ENGINES}
MIXTURE_ENGINES: tuple[str, ...] = tuple(e for e in ENGINES if e not in SUBJECT_ENGINES)


def get_engine(name: str, device: str = "cpu") -> Engine:
    """The engine registered as ``name``; with ``device="gpu"`` its GPU version, whose own name
    is ``NAME-gpu`` (``pipeline.engines.gpu``; the chunk tasks find it by that name)."""
    if device == "gpu":
        name = f"{name}-gpu"
    if name.endswith("-gpu") and name[:-4] in GPU_ENGINES:
        gpu: Engine = importlib.import_module("pipeline.engines.gpu").ENGINES[name]
        return gpu
    if name not in ENGINE_MODULES:
        raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
    engine: Engine = importlib.import_module(ENGINE_MODULES[name]).ENGINE
    return engine
