"""A flow's parameters turned into the configuration of a fit, checked before anything starts:
``fit_params`` (stage 1's ``FitParams``) and ``run_config`` (a ``RunConfig``)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from pipeline.core.config import FitParams
from pipeline.core.seeds import seed_entropy
from pipeline.ops import run as dist

__all__ = ["fit_fields", "fit_params", "run_config"]

#: what a flow may set of ``FitParams`` (the seed comes from its ``random_state``)
_FIELDS = tuple(f.name for f in fields(FitParams) if f.name not in ("seed", "restart"))


def fit_params(random_state: int | None, **fit: Any) -> FitParams:
    """Stage 1's ``FitParams``, checked, seeded by ``seed_entropy(random_state)``."""
    return FitParams(seed=seed_entropy(random_state), **fit).checked()


def fit_fields(kwargs: dict[str, Any], **fixed: Any) -> dict[str, Any]:
    """The fields of ``FitParams`` among a flow's ``kwargs`` (its ``locals()``), ``fixed`` over."""
    return {**{k: kwargs[k] for k in _FIELDS if k in kwargs}, **fixed}


def run_config(kwargs: dict[str, Any], **fixed: Any) -> dist.RunConfig:
    """The run's configuration from a flow's parameters ``kwargs`` (its ``locals()``): the fields
    of ``RunConfig`` among them, with ``fixed`` over them, and its stage-1 ``fit_params``.
    """
    fit = fit_fields({**kwargs, **fixed})
    more = {k: _CASTS.get(k, lambda v: v)(v) for k, v in {**kwargs, **fixed}.items() if k in _RUN}
    return dist.RunConfig(**more, params=fit_params(kwargs["random_state"], **fit))


#: ``RunConfig``'s fields but its stage-1 parameters, and how a flow's value of each is cast
_RUN = tuple(f.name for f in fields(dist.RunConfig) if f.name != "params")
_CASTS: dict[str, Any] = {
    "out": str,
    "chunk_rows": int,
    "holdout": float,
    "n_folds": int,
    "summaries": int,
    "mcmc": int,
    "strict": bool,
    "warm_start": lambda v: None if v is None else str(v),
    "engine_options": lambda v: dict(v or {}),
}
