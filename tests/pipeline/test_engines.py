"""Every registered engine, and a toy engine with float per-record state, keep the engine
contract (``tests/engine_contract.py``)."""

from __future__ import annotations

import pytest

from pipeline.engines import ENGINE_MODULES, ENGINES, get_engine
from tests.engine_contract import EngineContract


class TestMapdpEngine(EngineContract):
    engine = "mapdp"


class TestMapdpEngineFixedAlpha(EngineContract):
    engine = "mapdp"
    alpha = 1.0


class TestKmeansEngine(EngineContract):
    engine = "kmeans"
    init = "seeds"


class TestToyEngine(EngineContract):
    """An engine the registry learns at run time: a new model touches no file of the loop."""

    engine = "toy"

    @pytest.fixture(autouse=True)
    def _registered(self, monkeypatch):
        monkeypatch.setitem(ENGINE_MODULES, "toy", "tests.toy_engine")


def test_every_registered_engine_is_tested():
    tested = {c.engine for c in (TestMapdpEngine, TestKmeansEngine)}
    assert tested == set(ENGINES)


def test_an_unknown_engine_is_a_clear_error():
    with pytest.raises(ValueError, match="engine must be one of"):
        get_engine("nope")
