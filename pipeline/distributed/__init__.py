"""The distributed layer: the pass loop on Dask (``loop``), the Dask client and HPC clusters,
the workers' preload, write-out, summaries, and ``fit_distributed`` (``fit``), which is exported
here, where the README documents it. Imports the layers below (core ... engines)."""

from __future__ import annotations

from typing import Any

__all__ = ["fit_distributed"]


def __getattr__(name: str) -> Any:
    # loaded when asked for: the workers' imports of ``loop`` need neither ingest nor a client
    if name == "fit_distributed":
        from pipeline.distributed.fit import fit_distributed

        return fit_distributed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
