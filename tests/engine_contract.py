"""The contract every engine of the pass loop keeps (``pipeline.engines.base``), as one test
class that each engine's test subclasses (zarr-python's style): the Dask result equals a serial
in-process run of the same engine, 1, 2 and 4 workers give the same state, the objective never
rises when one chunk holds the data (the sweep is then exact coordinate descent), a re-executed
chunk task is idempotent, a resumed run equals an uninterrupted one, a checkpoint reads back, and
the write-out scores every row."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import zarr

from pipeline.core.config import FitParams
from pipeline.data.ingest import ingest
from pipeline.data.store import Store, input_positions, iter_chunks
from pipeline.distributed import loop
from pipeline.distributed.summaries import identity_stage2
from pipeline.distributed.writeout import write_out
from pipeline.engines import get_engine
from pipeline.engines.base import Chunk, LoopState, RunContext
from tests.conftest import local_client


def blobs(n: int, seed: int = 0, d: int = 3, k: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 6.0, size=(k, d))
    return means[rng.integers(0, k, size=n)] + rng.normal(size=(n, d))


def serial_passes(ctx: RunContext) -> LoopState:
    """The reference: the engine's own methods called in this process, chunk by chunk in
    order, with no Dask and no pass loop (a sequential engine's chunks each get the previous
    one's ``carry``)."""
    engine = get_engine(ctx.params.engine, ctx.params.device)
    state = engine.init_state(ctx, None)
    data, st = str(ctx.data.path), str(ctx.state.path)
    while not state.converged and state.pass_no < ctx.params.max_passes:
        p = state.pass_no + 1
        msg = engine.pass_input(state, ctx, p, None)
        results = []
        for c, a, b in iter_chunks(ctx.info):
            results.append(engine.chunk_step(Chunk(data, st, c, a, b, p), msg))
            if engine.sequential:
                msg = engine.carry(msg, results[-1])
        state, _ = engine.reduce(state, results, ctx, None)
    return state


def read_record_array(ctx: RunContext, name: str, state: LoopState) -> np.ndarray:
    """The per-record array ``name`` as the last pass wrote it (its pass-parity copy)."""
    return np.asarray(ctx.state.array(f"{name}{state.pass_no % 2}")[:])


def record_arrays(ctx: RunContext, state: LoopState) -> dict[str, np.ndarray]:
    arrays = get_engine(ctx.params.engine, ctx.params.device).record_arrays_of(ctx)
    return {r.name: read_record_array(ctx, r.name, state) for r in arrays}


def assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


class EngineContract:
    """Subclass with ``engine`` (a registered name) and optionally ``init``, ``alpha`` and
    ``device``."""

    engine: ClassVar[str]
    device: ClassVar[str] = "cpu"
    init: ClassVar[str] = "sequential"
    alpha: ClassVar[float | str] = "learn"

    def params(self, **kw: Any) -> FitParams:
        kw.setdefault("seed", 5)
        kw.setdefault("max_passes", 8)
        kw.setdefault("device", self.device)
        return FitParams(engine=self.engine, init=self.init, alpha=self.alpha, **kw).checked()

    def context(
        self, client: Any, tmp: Path, name: str, n: int = 1200, chunk_rows: int = 300, **kw: Any
    ) -> RunContext:
        store = Store(tmp / f"{name}-data")
        info = ingest(
            blobs(n, seed=len(name)), store, client=client, chunk_rows=chunk_rows, holdout=0.1
        )
        return loop.context(store, tmp / f"{name}-state", info, self.params(**kw))

    def test_distributed_equals_serial(self, client, tmp_path: Path) -> None:
        ctx = self.context(client, tmp_path, "a")
        state = loop.run_passes(client, ctx)
        ref_ctx = loop.context(ctx.data, tmp_path / "ref-state", ctx.info, ctx.params)
        ref = serial_passes(ref_ctx)
        assert state.pass_no == ref.pass_no >= 1
        assert state.objective == ref.objective
        assert_same_arrays(record_arrays(ctx, state), record_arrays(ref_ctx, ref))

    def test_same_state_with_1_2_4_workers(self, tmp_path: Path) -> None:
        got = []
        for n in (1, 2, 4):
            with local_client(n) as c:
                ctx = self.context(c, tmp_path, f"w{n}")
                state = loop.run_passes(c, ctx)
                got.append((state.objective, record_arrays(ctx, state)))
        for objective, arrays in got[1:]:
            assert objective == got[0][0]
            assert_same_arrays(arrays, got[0][1])

    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_objective_never_rises_in_one_chunk(self, client, tmp_path: Path, seed: int) -> None:
        ctx = self.context(client, tmp_path, f"one{seed}", n=600, chunk_rows=600, seed=seed)
        state = loop.run_passes(client, ctx)
        e = [h["objective"] for h in state.history]
        assert all(np.isfinite(e))
        assert all(b <= a + 1e-9 * abs(a) for a, b in itertools.pairwise(e)), e

    def test_a_re_executed_chunk_task_is_idempotent(self, client, tmp_path: Path) -> None:
        ctx = self.context(client, tmp_path, "idem")
        engine = get_engine(ctx.params.engine, ctx.params.device)
        state = loop.run_pass(client, ctx, loop.start(client, ctx))
        msg = engine.pass_input(state, ctx, state.pass_no + 1, None)
        c, a, b = next(iter(iter_chunks(ctx.info)))
        args = (engine.name, str(ctx.data.path), str(ctx.state.path), c, a, b, msg)
        first = loop.chunk_task(*args)
        written = {
            r.name: np.asarray(zarr.open_array(str(ctx.state.path / f"{r.name}{msg.p % 2}"))[:])
            for r in engine.record_arrays_of(ctx)
        }
        again = loop.chunk_task(*args)
        for name, before in written.items():
            after = zarr.open_array(str(ctx.state.path / f"{name}{msg.p % 2}"))[:]
            np.testing.assert_array_equal(before, after)
        for field in ("n_changed", "n_train"):
            assert getattr(first, field) == getattr(again, field)
        for field, value in vars(first).items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, getattr(again, field), err_msg=field)

    def test_a_resumed_run_equals_an_uninterrupted_one(
        self, client, tmp_path: Path, crash_after_pass
    ) -> None:
        ref_ctx = self.context(client, tmp_path, "whole", tol=0.0, min_change=0.0, max_passes=3)
        ref = loop.run_passes(client, ref_ctx)
        ctx = self.context(client, tmp_path, "crash", tol=0.0, min_change=0.0, max_passes=3)
        with crash_after_pass(1):
            loop.run_passes(client, ctx)
        resumed = loop.run_passes(client, ctx)
        assert resumed.pass_no == ref.pass_no
        assert resumed.objective == ref.objective
        assert_same_arrays(record_arrays(ctx, resumed), record_arrays(ref_ctx, ref))

    def test_a_checkpoint_reads_back(self, client, tmp_path: Path) -> None:
        ctx = self.context(client, tmp_path, "ck", max_passes=2)
        state = loop.run_passes(client, ctx)
        back = loop.load_checkpoint(ctx)
        assert type(back) is type(state)
        for field, value in vars(state).items():
            other = getattr(back, field)
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, other, err_msg=field)
            elif field != "scored":
                assert value == other, field
        # another parameter set does not resume from it
        other = loop.context(ctx.data, ctx.state.path, ctx.info, self.params(seed=99))
        assert loop.load_checkpoint(other) is None

    def test_the_write_out_scores_every_row(self, client, tmp_path: Path) -> None:
        ctx = self.context(client, tmp_path, "wo")
        engine = get_engine(ctx.params.engine, ctx.params.device)
        state: Any = loop.run_passes(client, ctx)
        k = getattr(state, "n_clusters", 1)
        mapping = identity_stage2(np.zeros((k, 1)), ctx.info.family)
        summary = write_out(client, ctx, engine, state, mapping, tmp_path / "labels.zarr")
        logd = zarr.open_array(str(tmp_path / "labels.zarr" / "log_density"))[:]
        # a grouped store's chunks end in padding rows that no one writes
        assert logd.shape == (ctx.info.n_stored,)
        assert np.isfinite(logd[input_positions(ctx.data, ctx.info)]).all()
        assert summary.n_heldout == ctx.info.n_rows - ctx.info.n_train > 0
