"""The distributed stage 1 (``pipeline.distributed.fit``) and ingest (``pipeline.data.ingest``) on a
real
``distributed.LocalCluster`` and real zarr stores: determinism across worker counts, agreement
with the in-memory MAP-DP, every input format, bad input, held-out scoring, a killed worker."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import zarr
from distributed import Client, LocalCluster
from sklearn.metrics import normalized_mutual_info_score

from pipeline.core import config
from pipeline.core.config import FitParams
from pipeline.core.errors import InputError
from pipeline.data.ingest import ingest
from pipeline.data.store import Store
from pipeline.distributed import fit as dist
from pipeline.distributed import loop
from pipeline.distributed.summaries import identity_stage2, split_summaries, summary_counts
from pipeline.distributed.writeout import label_scores
from pipeline.distributed.writeout import write_out as _write_out
from pipeline.engines import get_engine, warmup
from pipeline.engines.base import stop_reason
from pipeline.engines.mixture import ChunkResult, reduce_pass
from pipeline.engines.mixture_start import sample_state
from pipeline.engines.mixture_state import PassState, init_sample_rows, read_labels
from pipeline.estimators.mapdp import MAPDP
from pipeline.families.stats import Stats
from tests.conftest import COUNT_ONLY, local_client


def blobs(n: int, seed: int = 0, d: int = 3, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """k well-separated Gaussian clusters in d dimensions."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 8.0, size=(k, d))
    y = rng.integers(0, k, size=n)
    X = means[y] + rng.normal(size=(n, d)) @ np.diag(rng.uniform(0.5, 1.5, size=d))
    return X, y


def ctx_of(store: Store, info, params: FitParams):
    """A fit's context: the dataset store and a state store beside it."""
    return loop.context(store, store.path.with_name(store.path.name + "-state"), info, params)


def write_out(client, ctx, state, mapping, labels):
    return _write_out(client, ctx, get_engine(ctx.params.engine), state, mapping, labels)


def _fit(X, client, **kw):
    kw.setdefault("chunk_rows", 400)
    kw.setdefault("random_state", 7)
    return dist.fit_distributed(X, client=client, **kw)


def test_same_labels_with_1_2_4_workers():
    X, _ = blobs(2400, seed=1)
    labels = []
    for n in (1, 2, 4):
        with local_client(n) as c:
            labels.append(_fit(X, c, engine="mapdp").labels)
    assert np.array_equal(labels[0], labels[1])
    assert np.array_equal(labels[0], labels[2])


def test_dask_array_matches_in_memory_mapdp(client):
    X, y = blobs(3000, seed=2)
    mem = MAPDP(n_restarts=1, init="sequential", random_state=0).fit(X)
    est = MAPDP(n_restarts=1, init="sequential", random_state=0)
    dist.fit_estimator(est, da.from_array(X, chunks=(500, 3)), client=client)
    assert abs(est.objective_ - mem.objective_) <= 0.01 * abs(mem.objective_)
    assert normalized_mutual_info_score(mem.labels_, est.labels_) >= 0.98
    assert normalized_mutual_info_score(y, est.labels_) >= 0.95
    assert est.labels_.shape == (3000,)
    assert est.cluster_sizes_.sum() == 3000
    # the fitted estimator predicts as an in-memory one
    assert est.predict(X[:50]).shape == (50,)
    hist = np.asarray(est.objective_history_)
    assert hist[-1] <= hist[0]


def test_bayes_kmeans_engine(client):
    X, y = blobs(3000, seed=3, k=5)
    res = _fit(X, client, engine="kmeans")
    assert res.converged
    assert normalized_mutual_info_score(y, res.labels) >= 0.95
    assert res.stats[:, 0].sum() == 3000


def test_statistics_are_those_of_the_labels(client):
    X, _ = blobs(1500, seed=4)
    res = _fit(X, client)
    fam = res.info.family
    direct = fam.stats_of(fam.arrange(X), res.labels, res.stats.shape[0])
    np.testing.assert_allclose(res.stats, direct, rtol=1e-9, atol=1e-6)


def test_a_float32_store_gives_the_float64_partition(client, tmp_path: Path):
    """``dtype="float32"`` (``dpmm run --dtype float32``): the store holds float32 records, the
    fit the float64 one's partition on well-separated clusters, and statistics stay float64:
    those of the float32 records summed in float64 (rtol 1e-9)."""
    X, _ = blobs(1500, seed=4)
    r64 = _fit(X, client, store_path=tmp_path / "a")
    r32 = _fit(X, client, store_path=tmp_path / "b", dtype="float32")
    assert Store(tmp_path / "b").array("X").dtype == np.float32
    assert Store(tmp_path / "a").array("X").dtype == np.float64
    assert np.array_equal(r32.labels, r64.labels)
    assert r32.stats.dtype == np.float64
    fam = r32.info.family
    X32 = fam.arrange(X).astype(np.float32).astype(np.float64)
    direct = fam.stats_of(X32, r32.labels, r32.stats.shape[0])
    np.testing.assert_allclose(r32.stats, direct, rtol=1e-9, atol=1e-6)
    with pytest.raises(ValueError, match="dtype"):
        _fit(X, client, store_path=tmp_path / "c", dtype="float16")


def test_every_input_format_gives_the_same_store(client, tmp_path: Path):
    X, _ = blobs(1000, seed=5)
    cols = ["a", "b", "c"]
    df = pd.DataFrame(X, columns=cols)
    (tmp_path / "pq").mkdir()
    df.to_csv(tmp_path / "x.csv", index=False)
    df.to_parquet(tmp_path / "x.parquet", row_group_size=300)
    df.iloc[:600].to_parquet(tmp_path / "pq" / "part0.parquet")
    df.iloc[600:].to_parquet(tmp_path / "pq" / "part1.parquet")
    np.save(tmp_path / "x.npy", X)
    zarr.create_array(str(tmp_path / "x.zarr"), data=X, chunks=(250, 3))
    sources = {
        "csv": str(tmp_path / "x.csv"),
        "parquet": str(tmp_path / "x.parquet"),
        "parquet-dir": str(tmp_path / "pq"),
        "npy": str(tmp_path / "x.npy"),
        "zarr": str(tmp_path / "x.zarr"),
        "pandas": df,
        "numpy": X,
        "dask-frame": dd.from_pandas(df, npartitions=3),
        "dask-array": da.from_array(X, chunks=(333, 3)),
    }
    ref = None
    for name, src in sources.items():
        store = Store(tmp_path / f"store-{name}")
        info = ingest(src, store, client=client, chunk_rows=256, holdout=0.25)
        got = np.asarray(store.array("X")[:])
        hold = np.asarray(store.array("holdout")[:])
        assert info.n_rows == 1000 and info.n_chunks == 4, name
        assert store.array("X").chunks == (256, 3)
        assert store.array("fold").chunks == (256,)
        if ref is None:
            ref = (got, hold, info.n_train)
        np.testing.assert_allclose(got, ref[0], rtol=1e-12, err_msg=name)
        assert np.array_equal(hold, ref[1]), name
        assert info.n_train == ref[2] == int((~hold).sum())
        assert info.moments.n == info.n_train
    assert 150 < int(ref[1].sum()) < 350  # about a quarter held out


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        # with family="gaussian" every column must be a number ("auto" would make it categorical)
        ("a,b\n1,2\n3,4\n5,nan\n7,8\n", "x.csv: column 'b': row 2 is NaN"),
        ("a,b\n1,2\n3,4\n5,inf\n7,8\n", "x.csv: column 'b': row 2 is inf"),
        ("a,b\n1,2\n3,x\n5,6\n", "x.csv: column 'b': row 1 has 'x', which is not a number"),
        ("a,b\n1,2\n1,4\n1,6\n", "column 'a' is constant"),
        ("", "x.csv: the file is empty"),
        ("a,b\n", "x.csv: X has no rows"),
        ("a,b\n1,2\n3,4,5\n5,6\n", "x.csv: line 3 has 3 fields, expected 2"),
    ],
)
def test_bad_csv(client, tmp_path: Path, body: str, expect: str):
    path = tmp_path / "x.csv"
    path.write_text(body)
    with pytest.raises(ValueError) as err:
        ingest(str(path), Store(tmp_path / "s"), client=client, chunk_rows=2, family="gaussian")
    msg = str(err.value)
    assert expect in msg
    assert "\n" not in msg
    assert str(path) in msg


def test_bad_row_in_a_later_chunk_names_the_file_row(client, tmp_path: Path, monkeypatch):
    from pipeline.data import sources as store_mod

    monkeypatch.setattr(store_mod, "CSV_BLOCK_BYTES", 64)  # many CSV pieces
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(60, 2)), columns=["a", "b"])
    df.loc[47, "a"] = np.nan
    df.to_csv(tmp_path / "x.csv", index=False)
    with pytest.raises(InputError, match=r"x.csv: column 'a': row 47 is NaN"):
        ingest(str(tmp_path / "x.csv"), Store(tmp_path / "s"), client=client, chunk_rows=7)


def test_ingest_reads_csv_with_the_one_csv_parser(client, tmp_path: Path, monkeypatch):
    """Ingest pieces go through ``pipeline.data.io.parse_csv``, as ``read_table`` does: a TSV is
    split at tabs, a gzip file is read whole, and a record with a field too many in a later
    piece is named by its line in the file."""
    import gzip

    from pipeline.data import sources

    monkeypatch.setattr(sources, "CSV_BLOCK_BYTES", 64)  # many CSV pieces
    rng = np.random.default_rng(1)
    df = pd.DataFrame(rng.normal(size=(50, 2)), columns=["a", "b"])
    df.to_csv(tmp_path / "x.tsv", sep="\t", index=False)
    with gzip.open(tmp_path / "x.csv.gz", "wt") as f:
        df.to_csv(f, index=False)
    for i, name in enumerate(("x.tsv", "x.csv.gz")):
        info = ingest(str(tmp_path / name), Store(tmp_path / f"s{i}"), client=client, chunk_rows=9)
        assert info.n_rows == 50 and info.schema.columns == ["a", "b"]
        np.testing.assert_allclose(
            np.asarray(Store(tmp_path / f"s{i}").array("X")[:]),
            info.family.arrange(df.to_numpy()),
            rtol=1e-12,
        )
    lines = (tmp_path / "x.tsv").read_text().splitlines()
    lines[40] += "\t7"  # line 41 of the file: three fields
    (tmp_path / "bad.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"bad.tsv: line 41 has 3 fields, expected 2"):
        ingest(str(tmp_path / "bad.tsv"), Store(tmp_path / "s9"), client=client, chunk_rows=9)


def test_bad_counts_and_corrupt_files(client, tmp_path: Path):
    df = pd.DataFrame({"n": [1, 2, 3, -1, 2], "x": [0.1, 0.5, 0.3, 0.2, 0.9]})
    df.to_parquet(tmp_path / "c.parquet")
    with pytest.raises(ValueError, match=r"c.parquet: column 'n': row 3 has -1.0"):
        ingest(
            str(tmp_path / "c.parquet"),
            Store(tmp_path / "s1"),
            client=client,
            family={"n": "poisson"},
        )
    df["n"] = [1, 2, 2.5, 1, 2]
    with pytest.raises(ValueError, match=r"column 'n': row 2 has 2.5"):
        ingest(df, Store(tmp_path / "s2"), client=client, family={"n": "poisson"}, chunk_rows=2)
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ValueError, match=r"bad.parquet: not a Parquet file \(bad magic bytes\)"):
        ingest(str(tmp_path / "bad.parquet"), Store(tmp_path / "s3"), client=client)
    X, _ = blobs(300)
    arr = zarr.create_array(str(tmp_path / "x.zarr"), data=X, chunks=(100, 3))
    assert arr.shape == (300, 3)
    chunk = next(p for p in (tmp_path / "x.zarr").rglob("*") if p.is_file() and "c" in p.parts)
    chunk.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"x.zarr: rows from \d+ cannot be read"):
        ingest(str(tmp_path / "x.zarr"), Store(tmp_path / "s4"), client=client, chunk_rows=100)


def test_write_out_scores_heldout_rows(client, tmp_path: Path):
    X, y = blobs(2000, seed=6)
    store = Store(tmp_path / "store")
    info = ingest(X, store, client=client, chunk_rows=300, holdout=0.2)
    params = FitParams(seed=3).checked()
    ctx = ctx_of(store, info, params)
    state = loop.run_passes(client, ctx)
    assert state.stats[:, 0].sum() == info.n_train  # held-out rows were not fitted
    mapping = identity_stage2(state.stats, info.family)
    summary = write_out(client, ctx, state, mapping, tmp_path / "labels.zarr")
    label = zarr.open_array(str(tmp_path / "labels.zarr/label"))[:]
    logd = zarr.open_array(str(tmp_path / "labels.zarr/log_density"))[:]
    hold = zarr.open_array(str(tmp_path / "labels.zarr/holdout"))[:]
    assert label.shape == (2000,) and np.isfinite(logd).all()
    assert summary.n_heldout == int(hold.sum()) == info.n_rows - info.n_train
    assert summary.heldout_mean_log_density == pytest.approx(logd[hold].mean())
    assert normalized_mutual_info_score(y[hold], label[hold]) > 0.9
    assert normalized_mutual_info_score(y, label) > 0.95


@pytest.mark.parametrize("init", ["auto", "sequential"])
def test_a_pass_that_moves_nothing_does_the_write_out(client, tmp_path: Path, init: str):
    """The fused write-out (``run_pass(labels_out=...)``) writes exactly what the write-out
    tasks write: same labels, bit-identical eq. 3.4 densities, same summary. ("auto": the
    sample start covers every row and pass 1 confirms it; "sequential": several passes.)"""
    X, _ = blobs(2000, seed=6)
    store = Store(tmp_path / "store")
    info = ingest(X, store, client=client, chunk_rows=300, holdout=0.2)
    # stop only after a pass that moved nothing
    params = FitParams(seed=3, tol=0.0, min_change=0.0, init=init).checked()
    fused_path = tmp_path / "fused.zarr"
    ctx = ctx_of(store, info, params)
    state = loop.run_passes(client, ctx, labels_out=fused_path)
    assert state.history[-1]["n_changed"] == 0
    assert state.pass_no >= (2 if init == "sequential" else 1)
    assert state.scored is not None and len(state.scored) == info.n_chunks
    identity = identity_stage2(state.stats, info.family)
    fused = write_out(client, ctx, state, identity, fused_path)
    full = write_out(client, ctx, replace(state, scored=None), identity, tmp_path / "full.zarr")
    assert fused.by_pass == state.pass_no and full.by_pass is None
    for name in ("label", "log_density", "holdout"):
        a = zarr.open_array(str(fused_path / name))[:]
        b = zarr.open_array(str(tmp_path / "full.zarr" / name))[:]
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert fused.heldout_mean_log_density == full.heldout_mean_log_density
    assert fused.train_mean_log_density == full.train_mean_log_density
    assert fused.n_heldout == full.n_heldout == info.n_rows - info.n_train
    np.testing.assert_array_equal(fused.plot_X, full.plot_X)
    np.testing.assert_array_equal(fused.plot_labels, full.plot_labels)
    # a stage 2 that merges clusters changes the statistics: the tasks run again
    merged = np.zeros(state.n_clusters, dtype=np.int64)
    again = write_out(client, ctx, state, merged, fused_path)
    assert again.by_pass is None
    assert set(np.unique(zarr.open_array(str(fused_path / "label"))[:])) <= {-1, 0}


def test_worker_warm_up_runs():
    """The LocalCluster's worker preload swallows its errors (a failed warm-up only costs
    speed), so it is run here where an error shows."""
    from pipeline.distributed.worker_setup import warm_kernels

    warm_kernels()


def test_worker_warm_up_of_stage2_runs_second(monkeypatch, tmp_path: Path):
    """``DPMM_WARM_ENGINES=mapdp,bhc``: stage 2's BHC step runs (loads its kernels, so that
    the driver's stage 2 finds them cached) and comes right after the observation models and
    their marginals, so that a second worker takes the marginals and then stage 2 while the
    first compiles the sweep's kernels; the engine's steps come last: the sweep, the packed
    predictives and the reduce's kernels (which a process done with stage 2 takes meanwhile),
    and the sample start, which waits for them."""
    from pipeline.distributed import worker_setup

    monkeypatch.setenv(worker_setup.WARM_ENV, "mapdp, bhc, nosuch")
    # the steps are not run: no marker of a complete warm-up in the real cache
    monkeypatch.setattr(warmup, "warm_marker", lambda names, every=False: tmp_path / "marker")
    assert worker_setup.warm_engines() == ["mapdp", "bhc"]
    ran: list[str] = []
    loads: list[bool] = []

    def run_steps(steps, load=True):
        ran.extend(k for k, _ in steps)
        loads.append(load)

    monkeypatch.setattr(warmup, "run_steps", run_steps)
    worker_setup.warm_kernels()
    assert ran == [
        "observation-models",
        "observation-marginals",
        "stage2-bhc",
        "mapdp-sweep",
        "mixture-packed",
        "mixture-reduce",
        "mixture-start",
    ]
    assert loads == [True]
    # the helper of a command whose workers are its threads (``warm_here_with_helper``) takes
    # the Normal-Wishart factors' change, the marginals, the packed predictives, the reduce and
    # stage 2 before the observation models, the sweep and the start, which that command
    # compiles meanwhile, and loads nothing (duplicates are run once: ``run_steps``)
    ran.clear()
    worker_setup.warm_kernels(helper=True)
    assert list(dict.fromkeys(ran)) == [
        "observation-factors",
        "observation-marginals",
        "mixture-packed",
        "mixture-reduce",
        "stage2-bhc",
        "observation-models",
        "mapdp-sweep",
        "mixture-start",
    ]
    assert loads == [True, False]
    # the sample start waits on the sweep step's lock under this name
    from pipeline.engines.mixture import MAPDP_SWEEP_STEP

    assert MAPDP_SWEEP_STEP in ran
    worker_setup.STAGE2_STEPS["bhc"]()


def test_the_factors_step_compiles_what_update_calls(tmp_path: Path) -> None:
    """The helper's first step (``warm_observation_factors``) compiles
    ``gaussian_nw._change_factors`` for the argument types that ``update`` passes: when the
    observation models then compile, there is still that one specialisation (another would be
    a second compile on the cold demo's critical path). In a fresh process with an empty numba
    cache, so that ``update`` compiles (a cached one would not look for its callee)."""
    code = (
        "from pipeline.engines import warmup\n"
        "from kernels.obs import gaussian_nw as g\n"
        "warmup.warm_observation_factors()\n"
        "assert len(g._change_factors.signatures) == 1\n"
        "warmup.warm_observation_models()\n"
        "print(len(g._change_factors.signatures))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), **COUNT_ONLY}
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env
    )
    assert out.stdout.split() == ["1"]


def test_a_complete_warm_up_leaves_its_marker(monkeypatch, tmp_path: Path):
    """``kernels_cached``: true once a warm-up of the same engines completed with this numba
    cache (and these kernel sources); another cache, other engines or a failed warm-up have
    none (``warm_here_with_helper`` then starts a helper process to compile alongside)."""
    from pipeline.distributed import worker_setup

    marker = warmup.warm_marker
    assert marker(["bhc", "mapdp"]) == marker(["mapdp", "bhc"]) != marker(["mapdp"])
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert marker(["mapdp"]).parent == tmp_path
    assert not warmup.kernels_cached(["mapdp"])
    monkeypatch.setattr(warmup, "run_steps", lambda steps, load=True: None)
    monkeypatch.setattr(warmup, "compile_once", lambda key, step: None)
    worker_setup.warm_kernels(["mapdp"])
    assert warmup.kernels_cached(["mapdp"])
    assert not warmup.kernels_cached(["mapdp", "bhc"])

    def fail(steps, load=True):
        raise RuntimeError("compilation failed")

    monkeypatch.setattr(warmup, "run_steps", fail)
    worker_setup.warm_here(["mapdp", "bhc"])  # logged: it only costs the speed-up
    assert not warmup.kernels_cached(["mapdp", "bhc"])


def test_a_warm_up_of_every_engine_covers_any_run(monkeypatch, tmp_path: Path):
    """``dpmm warm`` warms every engine and stage 2 into the cache (``--portable``: into the
    shipped kernels), and a run of any engines then needs no helper process; a process told
    not to read the shipped kernels (``DPMM_SHIPPED_KERNELS=0``, as the suite) finds theirs
    not."""
    from kernels import _cache
    from pipeline.distributed import worker_setup

    cache, shipped = tmp_path / "cache", tmp_path / "shipped"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    monkeypatch.setattr(_cache, "SHIPPED", shipped)
    monkeypatch.setattr(warmup, "run_rounds", lambda rounds: None)
    runs = [["mapdp", "bhc"], ["ihmm"], ["kmeans", "asugs"]]
    for building in (False, True):
        monkeypatch.setattr(_cache, "building", building)
        worker_setup.warm_kernels(every_product=True)
        assert len(list((shipped if building else cache).iterdir())) == 1
    monkeypatch.setattr(_cache, "building", False)
    assert all(warmup.kernels_cached(names) for names in runs)
    for marker in cache.iterdir():
        marker.unlink()
    monkeypatch.setattr(_cache, "reading", True)
    assert all(warmup.kernels_cached(names) for names in runs)
    monkeypatch.setattr(_cache, "reading", False)
    assert not any(warmup.kernels_cached(names) for names in runs)


_HELPER_STARTS = """
import atexit, os, sys, threading
from pathlib import Path
from pipeline.distributed import worker_setup as ws
from pipeline.engines import warmup

out, mode = Path(sys.argv[1]), sys.argv[2]
os.cpu_count = lambda: 2
warmup.kernels_cached = lambda names: False


def seen(names=None, helper=False):
    (out / f"{'helper' if helper else 'command'}-{os.getpid()}").write_text(",".join(names))


ws.warm_here = seen
# a helper in a new interpreter does not have this module's stand-in: it gets its own
ws._HELPER = (
    f"import os, sys; open({str(out)!r} + f'/new-{{os.getpid()}}', 'w')"
    ".write(','.join(sys.argv[1:]))"
)
atexit.register(lambda: (out / f"atexit-{os.getpid()}").touch())
if mode == "thread":
    stop = threading.Event()
    threading.Thread(target=stop.wait).start()
with ws.warm_here_with_helper(["mapdp", "bhc"]):
    pass
if mode == "thread":
    stop.set()
print(os.getpid(), "pipeline.models.bhc" in sys.modules)
"""


@pytest.mark.parametrize("mode", ["fork", "thread"])
def test_the_warm_up_helper_is_a_fork_of_a_process_without_threads(tmp_path: Path, mode: str):
    """``warm_here_with_helper`` forks its helper, which then has the pipeline imported (the
    modules of the warm-up's steps are imported first) and leaves without the command's exit
    handlers (its Prefect server's stop); with another thread running (whose locks a fork would
    copy held) the helper is a new interpreter. Either way the command waits for it."""
    out = subprocess.run(
        [sys.executable, "-c", _HELPER_STARTS, str(tmp_path), mode],
        check=True,
        timeout=120,
        text=True,
        capture_output=True,
    )
    pid, imported = out.stdout.split()
    files = sorted(p.name for p in tmp_path.iterdir())
    helpers = [f for f in files if f.startswith("helper-" if mode == "fork" else "new-")]
    assert f"command-{pid}" in files and len(helpers) == 1 and not helpers[0].endswith(pid)
    # the command warms up the engine only; the helper takes stage 2 too
    assert (tmp_path / f"command-{pid}").read_text() == "mapdp"
    assert (tmp_path / helpers[0]).read_text() == "mapdp,bhc"
    assert [f for f in files if f.startswith("atexit-")] == [f"atexit-{pid}"]
    assert imported == ("True" if mode == "fork" else "False")


def test_a_forked_helper_is_waited_for_then_killed() -> None:
    """The command waits ``HELPER_GRACE`` for its forked helper once the run is over, then
    kills it; either way the child is reaped (no zombie left)."""
    from pipeline.distributed import worker_setup

    def child(code: str) -> int:
        return os.spawnv(os.P_NOWAIT, sys.executable, [sys.executable, "-c", code])

    pid = child("import time; time.sleep(120)")
    t0 = time.monotonic()
    worker_setup._wait_forked(pid, 0.5)
    assert time.monotonic() - t0 < 60  # killed, not waited out
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    pid = child("pass")
    worker_setup._wait_forked(pid, 60)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


_HOLD_A_STEP = """
import sys, time
from pathlib import Path
from pipeline.distributed import worker_setup
from pipeline.engines import warmup

def step():
    print("holding", flush=True)
    time.sleep(0.5)
    Path(sys.argv[1]).touch()

warmup.compile_once(worker_setup.stage2_step("bhc"), step)
"""


def test_await_step_waits_for_the_process_at_the_step(monkeypatch, tmp_path: Path) -> None:
    """``await_step`` (stage 2 in a command whose warm-up helper compiles it meanwhile) returns
    only once the process at that step is done with it, so that the kernels are then loaded
    from the cache, not compiled a second time; a step nobody is at does not wait."""
    from pipeline.distributed import worker_setup

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    done = tmp_path / "done"
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_STEP, str(done)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        assert not done.exists()
        warmup.await_step(worker_setup.stage2_step("bhc"))
        assert done.exists()
    finally:
        assert proc.wait(timeout=60) == 0
    warmup.await_step("a-step-nobody-is-at")
    # a cache directory where no lock file can be made (read-only, or not a directory): the
    # stage does not fail, it has nothing to wait for
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "file" / "cache"))
    warmup.await_step(worker_setup.stage2_step("bhc"))


_CACHE_HITS = """
import numba, sys
from pipeline.distributed import worker_setup
from pipeline.engines import warmup
assert warmup.kernels_cached(["mapdp", "bhc"]), "no marker of a complete warm-up"
worker_setup.warm_kernels(["mapdp", "bhc"])
hits = misses = 0
for name, mod in list(sys.modules.items()):
    if name.startswith("kernels"):
        for f in vars(mod).values():
            if isinstance(f, numba.core.registry.CPUDispatcher):
                hits += sum(f.stats.cache_hits.values())
                misses += sum(f.stats.cache_misses.values())
print(hits, misses)
"""


_WARM_WATCHED = """
from numba.core import event
compiled = []

class Seen(event.Listener):
    def on_start(self, ev):
        f = getattr(ev.data["dispatcher"], "py_func", None)
        compiled.append(getattr(f, "__qualname__", ""))

    def on_end(self, ev):
        pass

event.register("numba:compile", Seen())
from pipeline.distributed import worker_setup
from pipeline.engines import warmup
with worker_setup.warm_here_with_helper(["mapdp", "bhc"]):
    # the run's stage 2 waits for the helper at its kernels, then loads them
    warmup.await_step(worker_setup.stage2_step("bhc"))
    worker_setup.STAGE2_STEPS["bhc"]()
print(sum(n.startswith("ol_raise_with_shape_context") for n in compiled), len(compiled))
"""


@pytest.mark.slow
def test_warm_up_with_a_helper_process_fills_an_empty_cache(tmp_path: Path) -> None:
    """``warm_here_with_helper`` (``dpmm demo`` and ``dpmm run --threads``) on an empty numba
    cache: this process and its helper split the steps, and afterwards the cache holds every
    kernel of the run, which a new process then loads without compiling any. The first
    process never compiles numba's slice-assignment message (``kernels/__init__.py``)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def two_counts(script: str) -> tuple[int, int]:
        out = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            check=True,
            timeout=600,
            text=True,
            capture_output=True,
        )
        a, b = map(int, out.stdout.split())
        return a, b

    slice_errors, compiled = two_counts(_WARM_WATCHED)
    # the kernels copy arrays with loops (kernels.arrays): numba's slice-assignment error
    # message, 2.8 s of compiling, is never built
    assert slice_errors == 0 and compiled > 10
    hits, misses = two_counts(_CACHE_HITS)
    assert misses == 0 and hits > 10


def test_the_warm_up_follows_the_inputs_family(monkeypatch, tmp_path: Path) -> None:
    """A run on integer-valued records calls the int16 kernels (Normal-Wishart with the
    recording cells' code), one with categorical columns the int64 ones (every family): the CLI
    guesses the family from the input's first piece (``peek_family``) and names ``NW_CELLS`` or
    ``EVERY_FAMILY`` to the workers, whose steps then run on the toy family with that spec type
    and leave a marker of their own."""
    from kernels.obs.product import ANY_DTYPE, GAUSSIAN_DTYPE, NW_CELLS_DTYPE
    from pipeline.data.ingest import peek_family
    from pipeline.distributed import worker_setup

    rng = np.random.default_rng(0)
    cont = tmp_path / "cont.csv"
    pd.DataFrame(rng.normal(size=(50, 3)), columns=list("abc")).to_csv(cont, index=False)
    ints = tmp_path / "ints.csv"
    df = pd.DataFrame(rng.integers(0, 9, size=(50, 3)).astype(float), columns=list("abc"))
    df.assign(label=np.arange(50) % 2).to_csv(ints, index=False)
    cats = tmp_path / "cats.csv"
    df.assign(colour=np.where(np.arange(50) % 3 == 0, "red", "blue")).to_csv(cats, index=False)
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,x\n")
    assert peek_family(cont).spec.dtype == GAUSSIAN_DTYPE
    assert [type(f).__name__ for f, _ in peek_family(cont).groups] == ["GaussianNW"]
    # more columns than any structure sample has 10 rows for: diagonal, without a full prior
    wide = tmp_path / "wide.csv"
    d = config.EVIDENCE_ROWS // config.EVIDENCE_PER_COL + 1
    pd.DataFrame(rng.normal(size=(20, d))).round(3).to_csv(wide, index=False)
    assert [type(f).__name__ for f, _ in peek_family(wide).groups] == ["NormalGamma"]
    assert peek_family(wide).spec.dtype == GAUSSIAN_DTYPE
    grid = peek_family(ints, drop=("label", None))
    assert grid.spec.dtype == NW_CELLS_DTYPE and grid.n_cols == 3
    assert peek_family(cats).spec.dtype == ANY_DTYPE
    assert peek_family(bad, family="gaussian") is None
    assert peek_family(tmp_path / "missing.csv") is None
    assert worker_setup.warm_names(["mapdp"], peek_family(cont)) == ["mapdp"]
    assert worker_setup.warm_names(["mapdp"], None) == ["mapdp"]
    assert worker_setup.warm_names(["mapdp"], peek_family(cats)) == [
        "mapdp",
        warmup.EVERY_FAMILY,
    ]
    names = worker_setup.warm_names(["mapdp", "bhc"], grid)
    assert names == ["mapdp", "bhc", warmup.NW_CELLS]
    monkeypatch.setenv(worker_setup.WARM_ENV, ",".join(names))
    assert worker_setup.warm_engines() == names

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    seen: list[tuple[list[str], np.dtype]] = []

    def record(steps, load=True):
        seen.append(([k for k, _ in steps], warmup.toy_family()[1].spec.dtype))

    monkeypatch.setattr(warmup, "run_steps", record)
    worker_setup.warm_kernels(names)
    steps = ["observation-models", "observation-marginals", "stage2-bhc", "mapdp-sweep"]
    want = [*steps, "mixture-packed", "mixture-reduce", "mixture-start"]
    assert seen == [(want, np.dtype(NW_CELLS_DTYPE))]
    assert warmup.toy_family()[1].spec.dtype == GAUSSIAN_DTYPE
    assert warmup.kernels_cached(names)
    assert not warmup.kernels_cached(["mapdp", "bhc"])


def test_worker_warm_up_of_every_product_widens_the_toy_spec(monkeypatch, tmp_path: Path):
    """``warm_kernels(every_product=True)`` (the image's build): more rounds of the same steps
    with the toy family's spec as int64, the type every non-Gaussian product has, and as int16,
    that of Normal-Wishart columns on a grid, so that their kernels are cached too, each round's
    observation models first; the toy is Normal-Wishart only again afterwards. Stage 2 has no
    int16 round: its BHC takes such a family widened to int64 (``ProductFamily.widened``)."""
    from pipeline.distributed import worker_setup

    seen: list[tuple[str, str]] = []

    def step(key: str) -> tuple[str, Any]:
        return key, lambda: seen.append((key, warmup.toy_family()[1].spec.dtype.name))

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(worker_setup, "_OBS", step("obs"))
    monkeypatch.setattr(worker_setup, "_MARGINALS", step("marginals"))
    monkeypatch.setattr(
        worker_setup, "_steps_of", lambda names: ([step("sweep")], [step("stage2")])
    )
    worker_setup.warm_kernels(["mapdp", "bhc"], every_product=True)
    want = [(k, t) for t in ("int32", "int64") for k in ("obs", "marginals", "stage2", "sweep")]
    assert seen == [*want, *((k, "int16") for k in ("obs", "marginals", "sweep"))]
    assert warmup.toy_family()[1].spec.dtype == np.int32
    assert warmup.kernels_cached(["mapdp", "bhc"])


def test_a_round_whose_first_step_is_taken_is_put_off_not_waited_for(tmp_path: Path, monkeypatch):
    """``warmup.run_rounds``: while another process holds the int64 round's first step (its
    observation models) and the first round's sweep, this one goes on to the int16 round, then
    comes back for the int64 one, and waits for the sweep last, when it loads those steps; each
    later round's locks are its own (the first round's are those of a run's warm-up)."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    seen: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        # another process at those steps (flock: one lock per open file)
        with contextlib.ExitStack() as stack:
            for name in ("obs-int64", "sweep"):
                fh = stack.enter_context(open(tmp_path / f"dpmm-warm-{name}.lock", "a+b"))
                fcntl.flock(fh, fcntl.LOCK_EX)
            holding.set()
            release.wait(60)

    def step(key: str) -> tuple[str, Any]:
        def run() -> None:
            seen.append(f"{key}-{warmup.toy_family()[1].spec.dtype.name}")
            if seen[-1] == "obs-int16":
                release.set()

        return key, run

    other = threading.Thread(target=hold)
    other.start()
    assert holding.wait(60)
    warmup.run_rounds([(t, [step("obs"), step("sweep")]) for t in (None, np.int64, np.int16)])
    other.join(60)
    assert seen == [
        *("obs-int32", "obs-int16", "sweep-int16", "obs-int64", "sweep-int64", "sweep-int32")
    ]
    assert warmup.toy_family()[1].spec.dtype == np.int32


def test_checkpoint_resume_gives_the_same_labels(client, tmp_path: Path, crash_after_pass):
    X, _ = blobs(2000, seed=8)
    params = FitParams(seed=11, init="sequential").checked()
    runs = []
    for name, crash in (("a", None), ("b", 2)):
        store = Store(tmp_path / name)
        info = ingest(X, store, client=client, chunk_rows=250)
        if crash:
            with crash_after_pass(crash):
                loop.run_passes(client, ctx_of(store, info, params))
            assert loop.load_checkpoint(ctx_of(store, info, params)).pass_no == 2
        ctx = ctx_of(store, info, params)
        state = loop.run_passes(client, ctx)
        runs.append((state, read_labels(ctx, state)))
    assert runs[0][0].pass_no == runs[1][0].pass_no
    assert np.array_equal(runs[0][1], runs[1][1])
    np.testing.assert_array_equal(runs[0][0].stats, runs[1][0].stats)


@pytest.mark.parametrize("kill", ["one", "all"])
def test_killed_worker_gives_the_same_labels(tmp_path: Path, kill: str):
    """A worker process is killed in the middle of a pass, or every worker at once: the run
    completes with the labels of an undisturbed run (tasks are idempotent, deltas are summed
    in chunk order). With every worker gone the pass's scattered message is lost for good (the
    last copy may also go with one worker: Dask's memory manager drops copies no waiting task
    needs), so the pass scatters it again and runs again, with a warning."""
    X, _ = blobs(100_000, seed=9, d=4, k=6)
    params = FitParams(seed=5, max_passes=6, init="sequential").checked()
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        store = Store(tmp_path / "store")
        info = ingest(X, store, client=c, chunk_rows=500)
        ctx = ctx_of(store, info, params)
        quiet = loop.run_passes(c, ctx, resume=False)
        want = read_labels(ctx, quiet)

        killed: list[int] = []

        def kill_during_pass_2(state: PassState) -> None:
            if state.pass_no != 1:
                return
            pids = sorted(c.run(os.getpid).values())

            def killer() -> None:
                # wait until pass 2 has written its first chunk, then kill a worker
                chunks = ctx.state.path / "z0" / "c"
                deadline = time.time() + 30
                while not any(chunks.glob("*")) and time.time() < deadline:
                    time.sleep(0.002)
                for pid in pids[: 1 if kill == "one" else None]:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

            for f in (ctx.state.path / "z0").rglob("*"):
                if f.is_file() and "c" in f.relative_to(ctx.state.path / "z0").parts:
                    f.unlink()
            threading.Thread(target=killer, daemon=True).start()

        loop.clear_checkpoint(ctx)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = loop.run_passes(c, ctx, resume=False, on_pass=kill_during_pass_2)
        got = read_labels(ctx, state)
        assert len(killed) == (1 if kill == "one" else 2)
        lost = [str(w.message) for w in caught if "the last copy" in str(w.message)]
        if kill == "all":
            assert lost and lost[0].startswith("pass 2: a worker that left")
        assert os.getpid() not in killed
        assert np.array_equal(got, want)
        assert state.pass_no == quiet.pass_no


# -- the sample start, merge moves, stop rule, summaries, label scores -------------------------


def test_sample_start_converges_in_few_passes(client):
    """Stage 1 starts from in-memory MAP-DP on a hash sample smaller than the data: pass 0 has
    the right clusters already and the passes only refine them."""
    X, y = blobs(8000, seed=12, k=5)
    res = _fit(X, client, chunk_rows=1000, init="sample", random_state=3, max_passes=10)
    res_small = dist.fit_distributed(
        X, client=client, chunk_rows=1000, random_state=3, max_passes=10, prior_sample=1500
    )
    for r in (res, res_small):
        assert r.converged and r.n_iter <= 3
        assert normalized_mutual_info_score(y, r.labels) > 0.99
        assert r.stats.shape[0] == 5
    assert res_small.passes[-1]["stop"] in ("changes", "objective")


def test_init_sample_rows_are_a_deterministic_hash_subset(client, tmp_path: Path):
    X, _ = blobs(3000, seed=13)
    info = ingest(X, Store(tmp_path / "s"), client=client, chunk_rows=500, holdout=0.1)
    pos = init_sample_rows(info, 1000)
    assert pos.shape == (1000,) and np.all(np.diff(pos) > 0)
    assert np.array_equal(pos, init_sample_rows(info, 1000))
    assert init_sample_rows(info, 10**6).shape[0] == info.sample_rows.shape[0]
    state = sample_state(client, info, FitParams(seed=1, init_sample=1000).checked())
    assert state.init_rows.shape == (1000,)
    assert state.stats[:, 0].sum() == 1000
    assert state.init_record["init"] == "sample"


def _split_state(X: np.ndarray, fam, labels: np.ndarray, K: int) -> PassState:
    stats = fam.stats_of(fam.arrange(X), labels, K)
    hist = [{"objective": 1e9}]
    empty = np.zeros(0, dtype=np.int64)
    return PassState(1, stats, 1.0, np.arange(K), K, empty, history=hist)


def test_merge_moves_join_a_split_cluster(client):
    """A cluster cut in two (not opened in this pass) is merged back by the global merge moves
    after the pass, and the labels of both halves map to the merged cluster."""
    X, _y = blobs(1200, seed=14, k=3)
    res = _fit(X, client, chunk_rows=600)
    fam = res.info.family
    labels = res.labels.copy()
    k0 = int(labels[0])
    half = (labels == k0) & (np.arange(labels.size) % 2 == 0)
    labels[half] = res.stats.shape[0]
    K = res.stats.shape[0] + 1
    state = _split_state(X, fam, labels, K)
    results = [ChunkResult(0, Stats.zeros(fam, K), Stats.zeros(fam, 0), 0, 1200, 0.0)]
    params = FitParams(alpha=1.0).checked()
    new, record = reduce_pass(state, results, fam, params, 1200)
    assert record["merges"] == 1
    assert new.n_clusters == K - 1
    assert new.remap[k0] == new.remap[K - 1]
    assert record["objective"] < 1e9
    np.testing.assert_allclose(np.sort(new.stats[:, 0]), np.sort(res.stats[:, 0]))
    # a merge relabels the smaller half: that counts as changed records
    assert record["changed_fraction"] == pytest.approx(min(half.sum(), (labels == k0).sum()) / 1200)


def test_stop_rule_is_relative_objective_or_changed_fraction():
    p = FitParams(tol=1e-5, min_change=1e-3).checked()
    n = 100_000
    # pass 1 never stops on the objective (no previous value)
    assert stop_reason(np.inf, -5e6, n, n, p) is None
    # decrease 40 <= 1e-5 * 5e6 = 50: stop; decrease 60: go on (with many records moving)
    assert stop_reason(5e6 + 40, 5e6, 5000, n, p) == "objective"
    assert stop_reason(5e6 + 60, 5e6, 5000, n, p) is None
    assert stop_reason(-5e6 + 40, -5e6, 5000, n, p) == "objective"
    # an increase stops too
    assert stop_reason(5e6, 5e6 + 1, 5000, n, p) == "objective"
    # at most 0.1% of the records changed: stop, whatever the objective did
    assert stop_reason(5e6 + 1e6, 5e6, 100, n, p) == "changes"
    assert stop_reason(5e6 + 1e6, 5e6, 101, n, p) is None
    with pytest.raises(ValueError, match="min_change"):
        FitParams(min_change=1.0).checked()


def test_summaries_split_every_cluster_by_size(client, tmp_path: Path):
    X, _y = blobs(6000, seed=15, k=4)
    store = Store(tmp_path / "store")
    info = ingest(X, store, client=client, chunk_rows=700, holdout=0.1)
    ctx = ctx_of(store, info, FitParams(seed=2).checked())
    state = loop.run_passes(client, ctx)
    z1 = read_labels(ctx, state)
    split = split_summaries(client, ctx, state, 40)
    sub = split.state
    want = summary_counts(state.nk, 40)
    assert sub.n_clusters == int(want.sum()) == split.record["summaries"]
    assert abs(sub.n_clusters - 40) <= state.n_clusters
    z2 = read_labels(ctx, sub)
    train = z1 >= 0
    assert np.array_equal(z2 >= 0, train)
    # every sub-cluster lies inside its stage-1 cluster, and the statistics are its records'
    assert np.array_equal(split.parent[z2[train]], z1[train])
    fam = info.family
    direct = fam.stats_of(fam.arrange(X[train]), z2[train], sub.n_clusters)
    np.testing.assert_allclose(sub.stats, direct, rtol=1e-9, atol=1e-6)
    np.testing.assert_array_equal(np.bincount(split.parent), want)
    # slabs of about equal size within a cluster
    k = int(np.argmax(state.nk))
    sizes = sub.stats[split.parent == k, 0]
    assert sizes.min() > 0.5 * sizes.mean()
    # stage 2 = identity: the write-out labels are the summaries
    mapping = identity_stage2(sub.stats, fam)
    write_out(client, ctx, sub, mapping, tmp_path / "labels.zarr")
    label = zarr.open_array(str(tmp_path / "labels.zarr/label"))[:]
    assert np.array_equal(label[train], z2[train])


def test_summaries_of_a_non_gaussian_family_split_by_their_statistics(client, tmp_path: Path):
    rng = np.random.default_rng(16)
    lam = np.array([2.0, 20.0])[rng.integers(0, 2, size=3000)]
    df = pd.DataFrame({"a": rng.poisson(lam), "b": rng.normal(size=3000) + lam})
    store = Store(tmp_path / "store")
    info = ingest(df, store, client=client, chunk_rows=700, family={"a": "poisson"})
    ctx = ctx_of(store, info, FitParams(seed=2).checked())
    state = loop.run_passes(client, ctx)
    split = split_summaries(client, ctx, state, 10)
    assert split.state.n_clusters >= 8
    assert split.state.stats[:, 0].sum() == 3000


def test_label_scores_match_sklearn():
    from sklearn.metrics import adjusted_rand_score

    rng = np.random.default_rng(17)
    y = rng.integers(0, 5, size=3000)
    z = np.where(rng.random(3000) < 0.8, y, rng.integers(-1, 7, size=3000))
    parts = []
    for a in range(0, 3000, 700):  # chunks' contingency triples, added
        both, counts = np.unique(
            np.vstack([y[a : a + 700], z[a : a + 700]]), axis=1, return_counts=True
        )
        parts.append(np.vstack([both, counts]))
    got = label_scores(np.hstack(parts))
    assert got["nmi"] == pytest.approx(normalized_mutual_info_score(y, z), abs=1e-12)
    assert got["ari"] == pytest.approx(adjusted_rand_score(y, z), abs=1e-12)
    same = np.vstack([[3, 3], [0, 0], [5, 7]])
    assert label_scores(same) == {"nmi": 1.0, "ari": 1.0}
    # one cluster against several classes: nothing shared
    one = np.vstack([[0, 1, 2], [4, 4, 4], [5, 7, 9]])
    assert label_scores(one)["nmi"] == normalized_mutual_info_score([0, 1, 2], [4, 4, 4]) == 0.0


def test_label_column_is_left_out_and_stored(client, tmp_path: Path):
    X, y = blobs(1000, seed=18)
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["truth"] = np.where(y == 0, "zero", y.astype(str))  # strings: hashed codes
    store = Store(tmp_path / "s")
    info = ingest(df, store, client=client, chunk_rows=300, label_column="truth")
    assert info.schema.columns == ["a", "b", "c"] and info.label_column == "truth"
    codes = np.asarray(store.array("y")[:])
    assert normalized_mutual_info_score(y, codes) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no column 'nope'"):
        ingest(df, Store(tmp_path / "s2"), client=client, label_column="nope")
    with pytest.raises(ValueError, match="column names"):
        ingest(X, Store(tmp_path / "s3"), client=client, label_column="a")


def test_a_warm_start_from_a_fitted_model(client):
    """``warm_start``: pass 1 assigns the records against a fitted model's clusters, whose own
    statistics then leave: on a new sample of the same mixture it needs few passes, keeps the
    model's clusters, and its statistics are the new data's alone."""
    X, y = blobs(3000, seed=21, k=4)
    first = _fit(X, client, chunk_rows=500)
    fam = first.info.family
    X2 = blobs(3000, seed=21, k=4)[0] + np.random.default_rng(5).normal(0, 0.05, size=X.shape)
    warm = _fit(
        X2,
        client,
        chunk_rows=500,
        family=fam,
        warm_start=(Stats(first.stats, fam), first.alpha),
    )
    assert warm.passes[0].get("n_changed") == 3000  # every record assigned in pass 1
    assert warm.n_iter <= 3
    assert warm.stats[:, 0].sum() == 3000  # the model's own records left
    np.testing.assert_allclose(np.sort(warm.stats[:, 0]), np.sort(np.bincount(warm.labels)), atol=0)
    assert normalized_mutual_info_score(y, warm.labels) > 0.99
    with pytest.raises(ValueError, match="another family"):
        _fit(X2, client, chunk_rows=500, warm_start=(Stats(first.stats, fam), first.alpha))


def _profiled(dask_worker) -> bool:
    return "profile" in dask_worker.periodic_callbacks


def test_local_workers_run_without_the_profiler():
    """``dask_client``'s workers (threads here, worker processes in the fork server's test) do
    not sample their threads' stacks: Dask's profiler calls sys._current_frames() every 10 ms,
    which can deadlock CPython 3.11 before 3.11.9 (it hung a test run here on 3.11.7: every
    thread waiting for the GIL, the profiler's inside a garbage collection). The setting is the
    cluster's only: the process's Dask configuration is left as it was."""
    import dask

    from pipeline.distributed.client import PROFILE_KEY, dask_client

    before = dask.config.get(PROFILE_KEY)
    with dask_client(n_workers=2, processes=False, dashboard_address=None, quiet=True) as c:
        assert list(c.run(_profiled).values()) == [False, False]
    assert dask.config.get(PROFILE_KEY) == before
