"""The engines of the pass loop, by name (``pipeline.engines.base`` has the protocol).

Adding a model: ``pipeline/engines/NAME.py`` with an ``Engine`` as ``ENGINE``, its kernels, its
module in ``BY_NAME`` and its name in ``pipeline.core.config.ENGINES`` (a test checks they agree).
"""

from __future__ import annotations

from pipeline.core.config import ENGINES, GPU_ENGINES, MIXTURE_ENGINES, SUBJECT_ENGINES
from pipeline.engines import asugs, gpu, ihmm, kmeans, mapdp, mixed_effects
from pipeline.engines.base import Engine

__all__ = ["BY_NAME", "ENGINES", "GPU_ENGINES", "MIXTURE_ENGINES", "SUBJECT_ENGINES", "get_engine"]

#: every engine by its name: the CPU engines, then their GPU versions (``NAME-gpu``)
BY_NAME: dict[str, Engine] = {
    **{m.ENGINE.name: m.ENGINE for m in (mapdp, kmeans, mixed_effects, ihmm, asugs)},
    **gpu.ENGINES,
}


def get_engine(name: str, device: str = "cpu") -> Engine:
    """The engine registered as ``name``; with ``device="gpu"`` its GPU version, whose own name
    is ``NAME-gpu`` (``pipeline.engines.gpu``; the chunk tasks find it by that name)."""
    if device == "gpu":
        name = f"{name}-gpu"
    if name not in BY_NAME or (name.endswith("-gpu") and name[:-4] not in GPU_ENGINES):
        raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
    return BY_NAME[name]
