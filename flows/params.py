"""A flow's parameters turned into the configuration of a fit: ``fit_params`` (stage 1's
``FitParams``, for every flow whose passes run the pass loop) and ``run_config`` (the
``RunConfig`` of a flow that ingests its input as ``dpmm run`` does: ``flows.cluster``,
``flows.hmm``). Both check what they are given (``pipeline.core.config``), so that bad parameters
are a ``ValueError`` before anything starts."""

from __future__ import annotations

from typing import Any

from pipeline.core.config import FitParams
from pipeline.core.seeds import seed_entropy
from pipeline.ops import run as dist

__all__ = ["fit_params", "run_config"]


def fit_params(random_state: int | None, **fit: Any) -> FitParams:
    """Stage 1's parameters, checked.

    Parameters
    ----------
    random_state : int or None
        The flow's seed: the run's entropy is ``seed_entropy(random_state)`` (None: fresh).
    **fit
        The other fields of ``FitParams`` (engine, alpha, init, max_passes, tol, ...).
    """
    return FitParams(seed=seed_entropy(random_state), **fit).checked()


def run_config(
    out: str,
    random_state: int | None,
    fit: dict[str, Any],
    *,
    chunk_rows: int,
    holdout: float,
    family: Any,
    overwrite: bool,
    report: bool,
    **more: Any,
) -> dist.RunConfig:
    """The run's configuration, with its stage-1 parameters ``fit_params(random_state, **fit)``.

    Parameters
    ----------
    out : str
        The output directory or URL.
    random_state : int or None
        The flow's seed (``fit_params``).
    fit : dict
        The fields of ``FitParams`` but the seed.
    chunk_rows, holdout, family, overwrite, report
        As ``RunConfig``.
    **more
        The other fields of ``RunConfig`` (label_column, group_column, summaries, ...).
    """
    return dist.RunConfig(
        out=str(out),
        chunk_rows=int(chunk_rows),
        holdout=float(holdout),
        family=family,
        params=fit_params(random_state, **fit),
        overwrite=overwrite,
        report=report,
        **more,
    )
