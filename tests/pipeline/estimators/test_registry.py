"""The registry of models (``pipeline.estimators.registry``), walked: every model has its
estimator, its engine, a saved-model round trip on a tiny fit and its ``dpmm`` command, or says
why it has none; ``pipeline``'s public names are the registry's."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.base import BaseEstimator

import pipeline
from flows.cli.app import build_parser
from pipeline.data.synthetic import sample_longitudinal
from pipeline.engines import BY_NAME, get_engine
from pipeline.estimators.model import load_model, save_model
from pipeline.estimators.registry import MODELS, PUBLIC


def _records() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(0.0, 1.0, (30, 2)), rng.normal(6.0, 1.0, (30, 2))])


def _sequences(cls: type) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    return cls(random_state=0), (_records(),), {"lengths": [20, 20, 20]}


def _subjects(cls: type) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    df = sample_longitudinal(40, seed=1)
    return cls(random_state=0), (df[["wave", "depression", "adl"]], df["qol"], df["subject"]), {}


# a tiny fit of each model: the estimator, and the arguments of its fit and predict
TINY: dict[str, Callable[[type], tuple[Any, tuple[Any, ...], dict[str, Any]]]] = {
    "MAPDP": lambda cls: (cls(n_restarts=1, random_state=0), (_records(),), {}),
    "ASUGS": lambda cls: (cls(random_state=0), (_records(),), {}),
    "MAPiHMM": _sequences,
    "IHMMGibbs": lambda cls: (
        cls(n_sweeps=10, burn_in=2, random_state=0),
        (_records(),),
        {"lengths": [20, 20, 20]},
    ),
    "MixedEffectsDP": _subjects,
    "BHC": lambda cls: (cls(), (_records(),), {}),
    "TreeGuidedMCMC": lambda cls: (
        cls(n_iter=8, burn_in=2, G=2, random_state=0),
        (_records(),),
        {},
    ),
    "DPMeans": lambda cls: (cls(n_clusters=2), (_records(),), {}),
    "CollapsedGibbs": lambda cls: (cls(n_iter=10, burn_in=2, random_state=0), (_records(),), {}),
    "UncollapsedGibbs": lambda cls: (
        cls(n_iter=10, burn_in=2, random_state=0),
        (_records(),),
        {},
    ),
}


def test_every_model_has_a_tiny_fit_here() -> None:
    assert set(TINY) == set(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_has_its_estimator_engine_and_command_or_says_why_not(name: str) -> None:
    model = MODELS[name]
    assert model.estimator.__name__ == name
    assert issubclass(model.estimator, BaseEstimator)
    assert callable(model.estimator.fit) and callable(model.estimator.save)
    if model.engine is None or model.command is None:
        assert model.why, f"{name} has no engine or no command and does not say why"
    if model.engine is not None:
        assert get_engine(model.engine) is BY_NAME[model.engine]
    if model.command is not None:
        # ``dpmm`` has the command, and the command each option named
        command, *options = shlex.split(model.command)
        sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        assert command in sub.choices
        known = sub.choices[command]._option_string_actions
        assert all(o in known for o in options if o.startswith("-"))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_saved_loads_back_and_predicts_the_same(name: str, tmp_path: Path) -> None:
    est, args, kw = TINY[name](MODELS[name].estimator)
    est.fit(*args, **kw)
    save_model(est, tmp_path / "m")
    loaded = load_model(tmp_path / "m", expect=MODELS[name].estimator)
    assert type(loaded) is type(est)
    assert loaded.get_params() == est.get_params()
    assert loaded.n_clusters_ == est.n_clusters_
    np.testing.assert_array_equal(loaded.predict(*args, **kw), est.predict(*args, **kw))


def test_the_public_names_are_the_registrys() -> None:
    assert pipeline.__all__ == sorted(PUBLIC)
    for name, value in PUBLIC.items():
        assert getattr(pipeline, name) is value
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = pipeline.nope
