"""The ``asugs`` engine (one streaming pass over the chunks, in order, the state carried from
chunk to chunk) and the ``asugs`` / ``asugs-sample`` starts of the MAP-DP passes, on real Dask
workers and zarr stores, against the in-memory ``pipeline.ASUGS``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from sklearn.metrics import normalized_mutual_info_score

from pipeline import ASUGS
from pipeline.core.config import FitParams
from pipeline.data.ingest import ingest
from pipeline.data.store import Store, iter_chunks
from pipeline.distributed import loop
from pipeline.distributed.summaries import identity_stage2
from pipeline.distributed.writeout import write_out
from pipeline.engines import get_engine
from pipeline.engines.asugs import AsugsState
from tests.conftest import local_client
from tests.engine_contract import read_record_array


def mixture(n: int, seed: int = 0, d: int = 3, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 8.0, size=(k, d))
    y = rng.integers(0, k, size=n)
    return means[y] + rng.normal(size=(n, d)), y


def run_engine(
    client: Any, tmp: Path, X: np.ndarray, chunk_rows: int, holdout: float = 0.1, **kw: Any
) -> tuple[loop.RunContext, AsugsState]:
    store = Store(tmp / "data")
    info = ingest(X, store, client=client, chunk_rows=chunk_rows, holdout=holdout)
    options = kw.pop("options", {})
    ctx = loop.context(store, tmp / "state", info, FitParams(engine="asugs", seed=3, **kw))
    ctx.options.update(options)
    state = loop.run_passes(client, ctx)
    assert isinstance(state, AsugsState)
    return ctx, state


def training_rows(ctx: loop.RunContext) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(ctx.data.array("X")[:])
    hold = np.asarray(ctx.data.array("holdout")[:], dtype=bool)
    return X, hold


@pytest.mark.parametrize(("chunk_rows", "alpha"), [(250, "learn"), (1000, "learn"), (333, 0.7)])
def test_the_pass_equals_the_estimator_streaming_the_chunks_in_order(
    client, tmp_path: Path, chunk_rows: int, alpha: Any
) -> None:
    X, _ = mixture(2000)
    ctx, state = run_engine(
        client, tmp_path, X, chunk_rows, alpha=alpha, options={"lam": 2.0, "pm_interval": 40}
    )
    assert state.pass_no == 1 and state.converged
    Xs, hold = training_rows(ctx)
    lam = 2.0 if alpha == "learn" else None
    a = None if alpha == "learn" else alpha
    est = ASUGS(lam=lam, alpha=a, family=ctx.info.family, pm_interval=40)
    for _c, lo, hi in iter_chunks(ctx.info):
        est.partial_fit(Xs[lo:hi][~hold[lo:hi]])
    np.testing.assert_array_equal(state.stats, est.cluster_stats_)
    assert state.alpha == est.alpha_
    assert state.stream.n_seen == ctx.info.n_train == est.n_seen_
    # the write-out: each training row's class as the estimator's, every row scored by eq. 3.4
    mapping = identity_stage2(state.stats, ctx.info.family)
    labels = tmp_path / "labels.zarr"
    summary = write_out(client, ctx, get_engine("asugs"), state, mapping, labels)
    got = zarr.open_array(str(labels / "label"))[:]
    whole = ASUGS(lam=lam, alpha=a, family=ctx.info.family, pm_interval=40).fit(Xs[~hold])
    np.testing.assert_array_equal(got[~hold], whole.labels_)
    np.testing.assert_array_equal(got[hold], whole.predict(Xs[hold]))
    logd = zarr.open_array(str(labels / "log_density"))[:]
    np.testing.assert_allclose(logd, whole.score_samples(Xs), rtol=1e-12)
    assert summary.n_heldout == int(hold.sum())


def test_the_chunks_run_in_order_whatever_the_workers(tmp_path: Path) -> None:
    X, y = mixture(3000, seed=2)
    got = []
    for n in (1, 3):
        with local_client(n) as c:
            ctx, state = run_engine(c, tmp_path / f"w{n}", X, 200, holdout=0.0)
            got.append(state.stats)
            z = read_record_array(ctx, "z", state)
            rows = state.stream.rows_of_ids()
            assert normalized_mutual_info_score(y, rows[z]) > 0.95
    np.testing.assert_array_equal(got[0], got[1])


def test_the_pass_record(client, tmp_path: Path) -> None:
    X, _ = mixture(1500, seed=2)
    ctx, state = run_engine(client, tmp_path, X, 500)
    (rec,) = state.history
    assert rec["stop"] == "one pass" and rec["n_seen"] == ctx.info.n_train
    assert rec["n_clusters"] == state.n_clusters
    assert rec["pruned_records"] + state.nk.sum() == ctx.info.n_train
    assert np.isfinite(rec["objective"])


def test_bad_engine_options_are_refused(client, tmp_path: Path) -> None:
    X, _ = mixture(300, seed=3)
    with pytest.raises(ValueError, match="lam must be a positive"):
        run_engine(client, tmp_path, X, 100, options={"lam": 0.0})


# -- the asugs starts of MAP-DP ---------------------------------------------------------------


@pytest.mark.parametrize("init", ["asugs", "asugs-sample"])
def test_mapdp_passes_start_from_an_asugs_pass(client, tmp_path: Path, init: str) -> None:
    X, y = mixture(4000, seed=4, k=6)
    store = Store(tmp_path / "data")
    info = ingest(X, store, client=client, chunk_rows=500, holdout=0.0)
    params = FitParams(engine="mapdp", init=init, init_sample=1000, seed=1)
    ctx = loop.context(store, tmp_path / "state", info, params)
    start = loop.start(client, ctx)
    rec = start.init_record
    assert rec is not None and rec["init"] == init
    assert rec["asugs_records"] == (info.n_train if init == "asugs" else 1000)
    assert start.warm is not None and start.n_clusters == rec["asugs_clusters"]
    state = loop.run_passes(client, ctx, state=start)
    assert state.converged
    # the ASUGS statistics left after pass 1: the clusters hold the data's own
    assert state.nk.sum() == info.n_train
    z = read_record_array(ctx, "z", state)
    assert normalized_mutual_info_score(y, z) > 0.95
    # the "asugs" start's stream is the engine's over the same chunks
    if init == "asugs":
        eng_ctx = loop.context(store, tmp_path / "eng", info, FitParams(engine="asugs", seed=1))
        eng = loop.run_passes(client, eng_ctx)
        np.testing.assert_array_equal(start.warm, eng.stats)
