"""Every default is written once (``pipeline.core.config``): each command's option defaults
(the parsers ``flows.cli.app.build_parser`` builds) against its estimator's ``get_params()``
and its flow's signature. A difference the two paths need is listed in ``KNOWN`` with its
reason, and the option's help names the estimator's value."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

import pytest

from flows.cli.app import build_parser
from pipeline.core import config
from pipeline.engines import get_engine
from pipeline.estimators.asugs import ASUGS
from pipeline.estimators.ihmm import MAPiHMM
from pipeline.estimators.mapdp import MAPDP
from pipeline.estimators.mixed_effects import MixedEffectsDP

#: command -> [(estimator, {option's dest: the estimator's parameter})]
SHARED: dict[str, list[tuple[type, dict[str, str]]]] = {
    "run": [
        (
            MAPDP,
            {
                "alpha": "alpha",
                "family": "family",
                "prior_scale": "prior_scale",
                "init": "init",
                "max_passes": "max_iter",
                "tol": "tol",
                "missing": "missing",
                "strict": "strict",
                "device": "device",
                "seed": "random_state",
            },
        ),
        (ASUGS, {"lam": "lam", "family": "family", "prior_scale": "prior_scale"}),
    ],
    "cluster": [
        (
            MAPDP,
            {
                "alpha": "alpha",
                "family": "family",
                "restarts": "n_restarts",
                "max_iter": "max_iter",
                "seed": "random_state",
                "missing": "missing",
                "strict": "strict",
            },
        )
    ],
    "cv": [(MAPDP, {"max_iter": "max_iter", "missing": "missing", "strict": "strict"})],
    "hmm": [
        (
            MAPiHMM,
            {
                "alpha": "alpha",
                "gamma": "gamma",
                "family": "family",
                "prior_scale": "prior_scale",
                "max_passes": "max_iter",
                "tol": "tol",
                "temper": "temper",
                "seed": "random_state",
            },
        )
    ],
    "longitudinal": [
        (
            MixedEffectsDP,
            {
                "alpha": "alpha",
                "shrink": "shrink",
                "max_passes": "max_iter",
                "tol": "tol",
                "min_change": "min_change",
                "seed": "random_state",
            },
        )
    ],
}

#: (command, option) -> why the distributed command's default is not the estimator's
KNOWN = {
    ("run", "init"): "MAPDP's in-memory start is sequential; on Dask that would be one more pass "
    "over the whole store, so the run starts from in-memory MAP-DP on a sample",
    ("run", "max_passes"): "a pass reads the whole store; an in-memory iteration is cheap",
    ("run", "tol"): "the pass loop also stops on --min-change; each keeps its pinned results",
    ("run", "seed"): "the same command run again gives the same result and resumes",
    ("hmm", "max_passes"): "a pass reads the whole store; an in-memory iteration is cheap",
    ("hmm", "tol"): "the pass loop also stops on --min-change; each keeps its pinned results",
    ("hmm", "seed"): "the same command run again gives the same result and resumes",
    ("longitudinal", "seed"): "the same command run again gives the same result and resumes",
}

#: a command's option whose None stands for the engine's own value, and where that is
ENGINE_OWN = {
    ("run", "prior_scale"): lambda: get_engine("mapdp").prior_scale,
    ("run", "lam"): lambda: config.ASUGS_LAM,
    ("hmm", "prior_scale"): lambda: get_engine("ihmm").prior_scale,
    ("cluster", "restarts"): lambda: config.N_RESTARTS,
}

#: the command's flow, by module and name (``flows.cli`` starts it with these defaults)
FLOWS = {
    "run": ("flows.cluster", "cluster"),
    "cv": ("flows.cv", "cv"),
    "hmm": ("flows.hmm", "hmm"),
    "longitudinal": ("flows.longitudinal", "longitudinal"),
    "score": ("flows.score", "score"),
    "serve": ("flows.scheduled", "scheduled_clustering"),
}
#: an option whose flow parameter has another name
FLOW_NAMES = {"seed": "random_state", "workers": "n_workers", "folds": "n_folds"}


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def option(command: str, dest: str) -> argparse.Action:
    return next(a for a in commands()[command]._actions if a.dest == dest)


def cli_default(command: str, dest: str) -> Any:
    value = option(command, dest).default
    own = ENGINE_OWN.get((command, dest))
    return own() if value is None and own is not None else value


CASES = [
    (command, est, dest, param)
    for command, pairs in SHARED.items()
    for est, names in pairs
    for dest, param in names.items()
]


@pytest.mark.parametrize(
    ("command", "est", "dest", "param"),
    CASES,
    ids=[f"{c}-{e.__name__}-{d}" for c, e, d, _ in CASES],
)
def test_cli_default_is_the_estimators(command: str, est: type, dest: str, param: str) -> None:
    ours, theirs = cli_default(command, dest), est().get_params()[param]
    if (command, dest) not in KNOWN:
        assert ours == theirs, (
            f"dpmm {command} --{dest} {ours!r} != {est.__name__}({param}={theirs!r})"
        )
        return
    # a known difference: still one (else drop it from KNOWN), and the help says so
    assert ours != theirs
    assert str(theirs) in str(option(command, dest).help), (command, dest)


def test_every_command_is_walked() -> None:
    """Every command with options of a model's is in SHARED or FLOWS; ``warm`` has none of a
    model's, only where it compiles to."""
    assert [a.dest for a in commands()["warm"]._actions if a.dest != "help"] == ["portable"]
    walked = {*SHARED, *FLOWS}
    assert {c for c in commands() if c not in ("demo", "update", "server", "warm")} <= walked


@pytest.mark.parametrize("command", sorted(FLOWS))
def test_cli_default_is_the_flows(command: str) -> None:
    import importlib

    module, name = FLOWS[command]
    fn = getattr(importlib.import_module(module), name)
    sig = inspect.signature(getattr(fn, "fn", fn)).parameters
    compared = 0
    for action in commands()[command]._actions:
        kw = action.dest if action.dest in sig else FLOW_NAMES.get(action.dest)
        if kw is None or kw not in sig or sig[kw].default is inspect.Parameter.empty:
            continue
        assert action.default == sig[kw].default, (command, action.dest)
        compared += 1
    assert compared >= 1


def test_config_holds_the_shared_defaults() -> None:
    """The values the tests above compare come from config, not from a copy."""
    assert MAPDP().get_params()["tol"] == config.TOL_IN_MEMORY
    assert MAPDP().get_params()["max_iter"] == config.MAX_ITER
    assert MAPDP().get_params()["alpha"] == config.ALPHA
    assert option("run", "tol").default == config.TOL
    assert option("hmm", "gamma").default == config.GAMMA == MAPiHMM().get_params()["gamma"]
    assert option("run", "chunk_rows").default == config.DEFAULT_CHUNK_ROWS
    assert option("serve", "window").default == config.WINDOW
