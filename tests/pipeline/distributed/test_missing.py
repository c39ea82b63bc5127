"""Missing cells and constant columns in the distributed fit (issue 36): the MAP-DP engine's
passes fill missing cells by iterated conditional modes and keep the engine contract, the
write-out scores a record with holes on its observed cells exactly, constant columns are
dropped and recorded, and the other engines refuse missing cells with one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from sklearn.metrics import normalized_mutual_info_score as nmi

from pipeline.core.config import FitParams
from pipeline.core.errors import InputError
from pipeline.data.ingest import ingest
from pipeline.data.store import Store
from pipeline.distributed import loop
from pipeline.distributed.fit import fit_distributed
from pipeline.distributed.summaries import identity_stage2
from pipeline.distributed.writeout import write_out
from pipeline.engines import get_engine
from pipeline.engines.base import RunContext
from pipeline.families import GaussianNW
from tests.engine_contract import EngineContract, blobs
from tests.pipeline.estimators.test_real_defaults import _mixture
from tests.reference import dpm_observed_log_density


def holes(X: np.ndarray, share: float = 0.1, seed: int = 1) -> np.ndarray:
    """X with ``share`` of its cells removed at random (NaN)."""
    Xm = X.copy()
    Xm[np.random.default_rng(seed).random(X.shape) < share] = np.nan
    return Xm


class TestMapdpEngineMissingCells(EngineContract):
    """The engine contract with 10% of the cells missing: the filled cells are per-record
    state (the ``fill`` buffers), so a retried task and a resumed run give identical results."""

    engine = "mapdp"

    def context(
        self, client: Any, tmp: Path, name: str, n: int = 1200, chunk_rows: int = 300, **kw: Any
    ) -> RunContext:
        store = Store(tmp / f"{name}-data")
        info = ingest(
            holes(blobs(n, seed=len(name))),
            store,
            client=client,
            chunk_rows=chunk_rows,
            holdout=0.1,
            missing=True,
        )
        assert info.train_missing
        ctx = loop.context(store, tmp / f"{name}-state", info, self.params(**kw))
        assert "fill" in [r.name for r in get_engine("mapdp").record_arrays_of(ctx)]
        return ctx


def test_ten_percent_missing_cells_cluster_as_well_as_complete_data(client) -> None:
    """Issue 36: 10% of the cells removed at random, NMI within 0.02 of the complete data's,
    through the distributed fit (sample start, passes, several chunks)."""
    X, y = _mixture(0)
    full = fit_distributed(X, client=client, chunk_rows=200, random_state=0)
    part = fit_distributed(holes(X), client=client, chunk_rows=200, random_state=0)
    assert part.info.train_missing and sum(part.info.missing_cells.values()) > 0
    assert np.all(part.labels >= 0)
    assert nmi(y, part.labels) >= nmi(y, full.labels) - 0.02
    # the statistics are those of the completed records: as many as the training rows
    assert part.nk.sum() == pytest.approx(part.info.n_train)


def test_write_out_density_of_a_record_with_holes_is_the_observed_marginal(
    client, tmp_path: Path
) -> None:
    """A held-out record with missing cells is scored by the DP mixture of the clusters'
    Student-t predictives marginalised onto its observed dimensions (SciPy), at 1e-8."""
    X, _ = _mixture(2, n=400, d=4, k=3)
    X = X + 1e-7 * np.random.default_rng(3).normal(size=X.shape)  # off any recording grid
    Xm = holes(X, 0.15, seed=4)
    store = Store(tmp_path / "data")
    info = ingest(Xm, store, client=client, chunk_rows=150, holdout=0.25, missing=True)
    params = FitParams(engine="mapdp", init="sample", seed=5, max_passes=8).checked()
    ctx = loop.context(store, tmp_path / "state", info, params)
    state: Any = loop.run_passes(client, ctx)
    mapping = identity_stage2(np.zeros((state.n_clusters, 1)), ctx.info.family)
    labels = tmp_path / "labels.zarr"
    write_out(client, ctx, get_engine("mapdp"), state, mapping, labels)
    logd = zarr.open_array(str(labels / "log_density"))[:]
    hold = np.asarray(store.array("holdout")[:])
    Xs = np.asarray(store.array("X")[:])
    fam = ctx.info.family.groups[0][0]
    assert isinstance(fam, GaussianNW) and len(ctx.info.family.groups) == 1
    stats, alpha = state.stats, state.alpha
    checked = 0
    for i in np.flatnonzero(hold & np.isnan(Xs).any(axis=1))[:8]:
        want = dpm_observed_log_density(fam, stats, alpha, Xs[i])
        assert logd[i] == pytest.approx(want, rel=1e-8, abs=1e-8)
        checked += 1
    assert checked >= 3
    assert np.isfinite(logd).all()


def test_a_constant_column_is_dropped_and_recorded(client, tmp_path: Path) -> None:
    X = blobs(600, seed=1)
    X = np.column_stack([X[:, :1], np.full(600, 7.0), X[:, 1:]])
    with pytest.raises(InputError, match="column 'x1' is constant"):
        ingest(X, Store(tmp_path / "a"), client=client, chunk_rows=200)
    store = Store(tmp_path / "b")
    info = ingest(X, store, client=client, chunk_rows=200, strict=False)
    assert info.schema.dropped == {"x1": 7.0}
    assert info.n_cols == 3 and info.family.n_cols == 3
    assert store.array("X").shape == (600, 3)
    np.testing.assert_array_equal(
        np.asarray(store.array("X")[:]), info.family.arrange(np.delete(X, 1, axis=1))
    )
    assert info.moments.n == 600 and info.moments.total.shape == (3,)
    assert any("x1" in note for note in info.notes)


@pytest.mark.parametrize("engine", ["kmeans", "asugs"])
def test_other_engines_refuse_missing_cells_naming_mapdp(client, engine: str) -> None:
    X = holes(blobs(300, seed=2), 0.05)
    with pytest.raises(InputError) as err:
        fit_distributed(X, client=client, engine=engine, chunk_rows=100, random_state=0)
    msg = str(err.value)
    assert "\n" not in msg and "(NaN)" in msg and "--engine mapdp" in msg, msg


def test_summaries_are_of_the_completed_records(client, tmp_path: Path) -> None:
    """``--summaries``: the sub-clusters' statistics add up to the stage-1 clusters' (those
    of the completed records), holes included."""
    from pipeline.distributed.summaries import split_summaries

    store = Store(tmp_path / "data")
    info = ingest(holes(blobs(900, seed=3)), store, client=client, chunk_rows=300, missing=True)
    params = FitParams(engine="mapdp", init="sample", seed=5, max_passes=4).checked()
    ctx = loop.context(store, tmp_path / "state", info, params)
    state: Any = loop.run_passes(client, ctx)
    split = split_summaries(client, ctx, state, 12)
    assert np.isfinite(split.state.stats).all()
    np.testing.assert_allclose(split.state.stats.sum(axis=0), state.stats.sum(axis=0), rtol=1e-9)
