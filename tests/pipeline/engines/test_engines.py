"""Every registered engine, and a toy engine with float per-record state, keep the engine
contract (``tests/engine_contract.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.data.ingest import ingest
from pipeline.data.store import Store
from pipeline.data.synthetic import sample_longitudinal
from pipeline.distributed import loop
from pipeline.engines import BY_NAME, ENGINES, get_engine
from pipeline.engines.base import RunContext
from tests.engine_contract import EngineContract
from tests.pipeline.engines import test_ihmm_engine  # its engine's contract class (grouped stores)


class TestMapdpEngine(EngineContract):
    engine = "mapdp"


class TestMapdpEngineFixedAlpha(EngineContract):
    engine = "mapdp"
    alpha = 1.0


class TestKmeansEngine(EngineContract):
    engine = "kmeans"
    init = "seeds"


class TestAsugsEngine(EngineContract):
    """One streaming pass: the contract's multi-pass checks hold trivially (one pass)."""

    engine = "asugs"


class TestSugsEngine(EngineContract):
    engine = "asugs"
    alpha = 0.5


class TestToyEngine(EngineContract):
    """An engine the registry learns at run time: a new model touches no file of the loop."""

    engine = "toy"

    @pytest.fixture(autouse=True)
    def _registered(self, monkeypatch):
        from pipeline.core import config
        from tests import toy_engine

        monkeypatch.setitem(BY_NAME, "toy", toy_engine.ENGINE)
        monkeypatch.setattr(config, "ENGINES", (*config.ENGINES, "toy"))


class TestMixedEffectsEngine(EngineContract):
    """Longitudinal data in a grouped store: subjects are groups, the last column the response
    (the engine's default), every chunk whole subjects."""

    engine = "mixed_effects"

    def context(
        self, client: Any, tmp: Path, name: str, n: int = 1200, chunk_rows: int = 300, **kw: Any
    ) -> RunContext:
        df = sample_longitudinal(n // 4, seed=len(name))
        df = df[["subject", "wave", "depression", "adl", "qol"]]
        store = Store(tmp / f"{name}-data")
        info = ingest(
            df,
            store,
            client=client,
            family="gaussian",
            chunk_rows=chunk_rows,
            holdout=0.1,
            group_column="subject",
        )
        return loop.context(store, tmp / f"{name}-state", info, self.params(**kw))


def test_every_registered_engine_is_tested():
    tested = {
        c.engine
        for c in (
            TestMapdpEngine,
            TestKmeansEngine,
            TestAsugsEngine,
            TestMixedEffectsEngine,
            test_ihmm_engine.TestIhmmEngine,
        )
    }
    assert tested == set(ENGINES)


def test_the_registry_holds_every_configured_engine_and_its_gpu_versions():
    """``config.ENGINES`` (which checks a run's parameters) and ``BY_NAME`` name the same engines,
    each under its own name; every engine of ``GPU_ENGINES`` has its GPU version."""
    from pipeline.core.config import GPU_ENGINES

    assert set(ENGINES) | {f"{e}-gpu" for e in GPU_ENGINES} == set(BY_NAME)
    assert all(engine.name == name for name, engine in BY_NAME.items())
    assert get_engine("mapdp", "gpu") is BY_NAME["mapdp-gpu"]


def test_an_unknown_engine_is_a_clear_error():
    with pytest.raises(ValueError, match="engine must be one of"):
        get_engine("nope")


def test_a_checkpoint_written_by_format_version_1_reads_back():
    """``tests/data/checkpoint_v1``: a MAP-DP checkpoint (2 passes over 300 records of three
    blobs) written by format version 1 of ``pipeline.core.persist``. A change that can no longer
    read it must raise the format version."""
    from pathlib import Path

    from pipeline.core.config import FitParams
    from pipeline.data.store import Store
    from pipeline.distributed import loop
    from pipeline.engines.base import RunContext
    from pipeline.engines.mixture_state import PassState

    here = Store(Path(__file__).resolve().parents[2] / "data" / "checkpoint_v1")
    params = FitParams(
        seed=3, init="sequential", max_passes=2, alpha_prior=(2.0, 1.0)
    )  # 2026-11-26 default
    info: Any = None  # a checkpoint does not depend on the data
    state = loop.load_checkpoint(RunContext(here, here, info, params))
    assert isinstance(state, PassState)
    assert state.pass_no == 2 and state.n_clusters == 3 and not state.converged
    assert state.objective == pytest.approx(1230.3877390242928, rel=1e-12)
    assert state.nk.sum() == 277  # the training records of 300 (about 10% held out)
    assert [h["pass"] for h in state.history] == [1, 2]
