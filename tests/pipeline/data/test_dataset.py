"""The dataset store (``pipeline.data.store``: folds, groups, format version) and its sharing by key
(``pipeline.data.dataset.open_dataset``) on a real ``distributed.LocalCluster`` and real zarr."""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from pipeline.core.config import N_FOLDS
from pipeline.core.errors import InputError
from pipeline.data import dataset as ds
from pipeline.data.ingest import ingest
from pipeline.data.store import (
    FORMAT_VERSION,
    HOLDOUT_SALT,
    Store,
    fold_of,
    holdout_mask_of,
    input_positions,
    iter_chunks,
    row_uniform,
)


@pytest.fixture
def small_csv_blocks(monkeypatch):
    """Many CSV pieces, so that groups and bad rows straddle the staged pieces."""
    from pipeline.data import sources as store_mod

    monkeypatch.setattr(store_mod, "CSV_BLOCK_BYTES", 512)


def grouped_frame(n_groups: int, max_size: int, seed: int = 0) -> pd.DataFrame:
    """Rows of groups of random sizes 1..max_size, shuffled; the group of a row is also coded
    in its "x" column (x = 10 * group + noise) so that a mixed-up row shows."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_size + 1, size=n_groups)
    g = np.repeat(np.arange(n_groups), sizes)
    df = pd.DataFrame(
        {
            "x": 10.0 * g + rng.uniform(0, 1, size=g.shape[0]),
            "subject": [f"S{i}" for i in g],
            "w": rng.normal(size=g.shape[0]),
            "truth": g % 3,
        }
    )
    return df.sample(frac=1.0, random_state=seed).reset_index(drop=True)


# -- folds ---------------------------------------------------------------------------------------


def test_folds_are_deterministic_and_roughly_uniform():
    rows = np.arange(200_000)
    f = fold_of(rows, 10)
    assert f.dtype == np.int16
    np.testing.assert_array_equal(f, fold_of(rows, 10))
    counts = np.bincount(f, minlength=10)
    assert counts.shape == (10,)
    # binomial counts: 5 standard deviations around 20,000
    assert np.all(np.abs(counts - 20_000) < 5 * math.sqrt(200_000 * 0.1 * 0.9))
    # the fold is min(floor(u * F), F - 1) of the hold-out hash
    u = row_uniform(rows, HOLDOUT_SALT)
    floor = np.minimum(np.floor(u * 7), 6).astype(np.int16)
    np.testing.assert_array_equal(fold_of(rows, 7), floor)
    assert np.all(fold_of(rows, 1) == 0)
    with pytest.raises(ValueError, match=r"n_folds must be an integer in \[1, 32767\], got 0"):
        fold_of(rows, 0)


@pytest.mark.parametrize("n_folds", [2, 3, 5, 7, 10, 13, 100])
def test_fold_zero_is_the_holdout_of_one_over_f(n_folds: int):
    rows = np.arange(1_000_000)
    np.testing.assert_array_equal(fold_of(rows, n_folds) == 0, holdout_mask_of(rows, 1 / n_folds))


def test_folds_do_not_depend_on_the_chunking_or_the_format(client, tmp_path: Path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(1000, 2))
    pd.DataFrame(X, columns=["a", "b"]).to_csv(tmp_path / "x.csv", index=False)
    folds = []
    for i, (src, chunk_rows) in enumerate(
        [(X, 70), (X, 256), (str(tmp_path / "x.csv"), 333), (str(tmp_path / "x.csv"), 1000)]
    ):
        store = Store(tmp_path / f"s{i}")
        info = ingest(src, store, client=client, chunk_rows=chunk_rows, holdout=0.1)
        assert info.n_folds == N_FOLDS
        assert info.n_stored == info.n_rows == 1000
        assert not store.exists("group") and not store.exists("row")
        np.testing.assert_array_equal(input_positions(store, info), np.arange(1000))
        fold = np.asarray(store.array("fold")[:])
        hold = np.asarray(store.array("holdout")[:])
        # today's held-out rows, unchanged; with holdout = 1/F they are fold 0
        np.testing.assert_array_equal(hold, holdout_mask_of(np.arange(1000), 0.1))
        np.testing.assert_array_equal(hold, fold == 0)
        folds.append(fold)
    for f in folds[1:]:
        np.testing.assert_array_equal(f, folds[0])
    np.testing.assert_array_equal(folds[0], fold_of(np.arange(1000), N_FOLDS))


def test_n_folds_is_stored(client, tmp_path: Path):
    X = np.random.default_rng(2).normal(size=(300, 2))
    store = Store(tmp_path / "s")
    info = ingest(X, store, client=client, chunk_rows=100, n_folds=3, holdout=1 / 3)
    assert info.n_folds == 3
    fold = np.asarray(store.array("fold")[:])
    assert set(np.unique(fold)) == {0, 1, 2}
    np.testing.assert_array_equal(np.asarray(store.array("holdout")[:]), fold == 0)
    with pytest.raises(ValueError, match="n_folds"):
        ingest(X, Store(tmp_path / "s2"), client=client, n_folds=1.5)


def test_a_short_wide_table_is_stored_in_chunks_of_its_rows(client, tmp_path: Path):
    """Fewer rows than ``chunk_rows`` (its default, 100,000): every per-row array is one chunk
    of the table's rows, on each way in (an array, a CSV staged in pieces, groups, a dropped
    constant column). zarr stores the last chunk whole: a 10-row table of 5,000 columns wrote
    a 4 GB chunk, which every pass read."""
    n, d = 12, 2000
    rng = np.random.default_rng(3)
    df = pd.DataFrame(rng.normal(size=(n, d)), columns=[f"g{j}" for j in range(d)])
    df.to_csv(tmp_path / "x.csv", index=False)
    grouped = df.assign(sid=np.arange(n) // 3)
    sources = {
        "array": (df.to_numpy(), {}),
        "csv": (str(tmp_path / "x.csv"), {}),
        "groups": (grouped, {"group_column": "sid"}),
        "constant": (df.assign(k=1.0), {"strict": False}),
    }
    for name, (src, kw) in sources.items():
        store = Store(tmp_path / name)
        info = ingest(src, store, client=client, holdout=0.25, **kw)
        assert info.n_stored == n and info.n_cols == d, name
        for arr in ("X", "fold", "holdout"):
            assert store.array(arr).chunks[0] == n, (name, arr)
        raw = n * d * 8
        stored = sum(f.stat().st_size for f in (store.path / "X").rglob("*") if f.is_file())
        assert raw <= stored < raw + 4096, (name, stored)
        np.testing.assert_array_equal(np.asarray(store.array("X")[:]).shape, (n, d))


# -- groups --------------------------------------------------------------------------------------


def check_grouped_store(store: Store, df: pd.DataFrame, holdout: float, n_folds: int) -> None:
    """Every property of a grouped store of ``df`` (grouped by "subject", labels "truth")."""
    info = store.info
    R = info.chunk_rows
    n = df.shape[0]
    first_seen = list(dict.fromkeys(df["subject"]))
    assert info.grouped and info.group_column == "subject"
    assert info.group_ids == first_seen
    assert info.n_groups == len(first_seen)
    assert info.n_rows == n
    assert info.names == ["x", "w"]
    counts = np.asarray(info.chunk_counts)
    assert np.all(counts >= 1) and np.all(counts <= R)
    assert counts.sum() == n
    assert info.n_stored == (info.n_chunks - 1) * R + counts[-1]
    group = np.asarray(store.array("group")[:])
    row = np.asarray(store.array("row")[:])
    fold = np.asarray(store.array("fold")[:])
    hold = np.asarray(store.array("holdout")[:])
    X = np.asarray(store.array("X")[:])
    y = np.asarray(store.array("y")[:])
    for name, arr in (("group", group), ("row", row), ("fold", fold), ("X", X)):
        assert arr.shape[0] == info.n_stored, name
    valid = np.zeros(info.n_stored, dtype=bool)
    chunk_of_group: dict[int, set[int]] = {}
    for c, a, b in iter_chunks(info):
        assert (a, b) == (c * R, c * R + counts[c])
        valid[a:b] = True
        for g in np.unique(group[a:b]):
            chunk_of_group.setdefault(int(g), set()).add(c)
        # groups in order of first appearance, packed greedily: the next chunk's first group
        # would not have fitted
        if c + 1 < info.n_chunks:
            nxt = int(group[(c + 1) * R])
            assert counts[c] + int(np.sum(group == nxt)) > R
    # padding: nothing but fill values
    assert np.all(group[~valid] == -1) and np.all(row[~valid] == -1)
    # every group in exactly one chunk
    assert sorted(chunk_of_group) == list(range(info.n_groups))
    assert all(len(cs) == 1 for cs in chunk_of_group.values())
    # row maps back to the input exactly: a permutation of the input rows
    r = row[valid]
    np.testing.assert_array_equal(np.sort(r), np.arange(n))
    g = group[valid]
    np.testing.assert_array_equal(np.asarray(info.group_ids, dtype=object)[g], df["subject"][r])
    # groups in code order, each group's rows in input order
    assert np.all(np.diff(g) >= 0)
    same = np.diff(g) == 0
    assert np.all(np.diff(r)[same] > 0)
    # X rows are the input's rows (columns in the store's order: all gaussian, as given)
    np.testing.assert_array_equal(X[valid], df[["x", "w"]].to_numpy()[r])
    at = input_positions(store, info)
    np.testing.assert_array_equal(X[at], df[["x", "w"]].to_numpy())
    np.testing.assert_array_equal(row[at], np.arange(n))
    np.testing.assert_array_equal(y[valid], df["truth"].to_numpy()[r])
    # fold and holdout are the group's, drawn from its code
    np.testing.assert_array_equal(fold[valid], fold_of(g, n_folds))
    np.testing.assert_array_equal(hold[valid], holdout_mask_of(g, holdout))
    for code in range(info.n_groups):
        at = g == code
        assert np.unique(fold[valid][at]).size == 1
        assert np.unique(hold[valid][at]).size == 1
    assert info.n_train == int(np.sum(~hold[valid]))
    # the prior's sample: stored positions of training rows, their rows in schema order
    sr = np.asarray(info.sample_rows)
    assert np.all(valid[sr]) and not np.any(hold[sr])
    np.testing.assert_array_equal(np.asarray(info.sample), X[sr])


def test_grouped_ingest_of_a_shuffled_csv(client, tmp_path: Path, small_csv_blocks):
    df = grouped_frame(n_groups=60, max_size=25, seed=3)
    assert df.shape[0] > 500
    df.to_csv(tmp_path / "x.csv", index=False)
    store = Store(tmp_path / "s")
    info = ingest(
        str(tmp_path / "x.csv"),
        store,
        client=client,
        chunk_rows=40,
        holdout=0.2,
        n_folds=5,
        family="gaussian",
        group_column="subject",
        label_column="truth",
    )
    assert info.n_chunks > 10
    check_grouped_store(store, df, holdout=0.2, n_folds=5)
    assert not (store.path / "staging").exists()


def test_grouped_ingest_of_frames_and_parquet(client, tmp_path: Path):
    df = grouped_frame(n_groups=30, max_size=12, seed=4)
    df.to_parquet(tmp_path / "x.parquet", row_group_size=50)
    sources = [df, str(tmp_path / "x.parquet"), dd.from_pandas(df, npartitions=3)]
    for i, src in enumerate(sources):
        store = Store(tmp_path / f"s{i}")
        ingest(
            src,
            store,
            client=client,
            chunk_rows=30,
            holdout=0.1,
            family="gaussian",
            group_column="subject",
            label_column="truth",
        )
        check_grouped_store(store, df, holdout=0.1, n_folds=N_FOLDS)


def test_numeric_group_keys_are_kept_as_numbers(client, tmp_path: Path):
    df = pd.DataFrame({"a": np.arange(12.0) ** 1.5, "sid": [7, 3, 7, 9, 3, 3, 7, 9, 9, 1, 1, 3]})
    store = Store(tmp_path / "s")
    info = ingest(df, store, client=client, chunk_rows=4, group_column="sid")
    assert info.group_ids == [7, 3, 9, 1]
    assert all(type(v) is int for v in info.group_ids)
    assert info.chunk_counts == [3, 4, 3, 2]
    np.testing.assert_array_equal(
        np.asarray(store.array("row")[:]), [0, 2, 6, -1, 1, 4, 5, 11, 3, 7, 8, -1, 9, 10]
    )
    # the group column is not a feature
    assert info.schema.columns == ["a"]


def test_csv_group_keys_are_text_in_every_block(client, tmp_path: Path, small_csv_blocks):
    # digits-only blocks would parse as numbers, and "007" as 7: keys are read as text
    keys = ["007", "7", "12"] * 60 + ["S1"] * 3
    df = pd.DataFrame({"a": np.linspace(0.0, 1.0, len(keys)), "g": keys})
    df.to_csv(tmp_path / "x.csv", index=False)
    store = Store(tmp_path / "s")
    info = ingest(str(tmp_path / "x.csv"), store, client=client, chunk_rows=70, group_column="g")
    assert info.group_ids == ["007", "7", "12", "S1"]
    assert info.chunk_counts == [60, 60, 63]
    assert sorted(p.name for p in (store.path / "X" / "c").iterdir()) == ["0", "1", "2"]


def test_a_group_larger_than_a_chunk_is_refused(client, tmp_path: Path):
    df = pd.DataFrame({"a": np.arange(30.0), "subject": ["S1"] * 5 + ["S17"] * 25})
    df.to_csv(tmp_path / "x.csv", index=False)
    with pytest.raises(
        ValueError,
        match=r"x.csv: group 'S17' of column 'subject' has 25 rows, more than "
        r"--chunk-rows 20",
    ):
        ingest(
            str(tmp_path / "x.csv"),
            Store(tmp_path / "s"),
            client=client,
            chunk_rows=20,
            group_column="subject",
        )


@pytest.mark.parametrize("missing", [np.nan, ""])
def test_a_missing_group_value_names_the_column_and_row(
    client, tmp_path: Path, small_csv_blocks, missing
):
    df = grouped_frame(n_groups=40, max_size=10, seed=5)
    df["subject"] = df["subject"].astype(object)
    df.loc[173, "subject"] = missing
    df.to_csv(tmp_path / "x.csv", index=False)
    with pytest.raises(InputError, match=r"x.csv: column 'subject': row 173 has no group value"):
        ingest(
            str(tmp_path / "x.csv"),
            Store(tmp_path / "s"),
            client=client,
            chunk_rows=50,
            group_column="subject",
        )
    # a DataFrame's pieces know their first row: the task names the frame's row itself
    with pytest.raises(InputError, match=r"DataFrame: column 'subject': row 173 has no group"):
        ingest(df, Store(tmp_path / "s"), client=client, chunk_rows=50, group_column="subject")


def test_group_column_needs_named_columns(client, tmp_path: Path):
    X = np.random.default_rng(6).normal(size=(20, 2))
    with pytest.raises(InputError, match=r"--group-column 'g' needs an input with column names"):
        ingest(X, Store(tmp_path / "s"), client=client, group_column="g")
    df = pd.DataFrame(X, columns=["a", "b"])
    with pytest.raises(InputError, match=r"no column 'g' for the groups; columns: a, b"):
        ingest(df, Store(tmp_path / "s"), client=client, group_column="g")
    with pytest.raises(ValueError, match=r"group column and the label column are both 'a'"):
        ingest(df, Store(tmp_path / "s"), client=client, group_column="a", label_column="a")


# -- format version --------------------------------------------------------------------------


def test_format_json_and_another_version_is_refused(client, tmp_path: Path):
    X = np.random.default_rng(7).normal(size=(50, 2))
    store = Store(tmp_path / "s")
    ingest(X, store, client=client, chunk_rows=20)
    meta = json.loads((store.path / "format.json").read_text())
    assert meta["format"] == "dpmm-dataset" and meta["version"] == FORMAT_VERSION == 3
    assert meta["chunk_rows"] == 20 and meta["n_folds"] == N_FOLDS
    assert Store.open_checked(store.path).info.n_rows == 50
    # a store of version 1 (grouped stores without their groups' moments) is ingested again
    meta["version"] = 1
    (store.path / "format.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError) as err:
        Store.open_checked(store.path)
    msg = str(err.value)
    assert str(store.path) in msg and "version 1" in msg and f"version {FORMAT_VERSION}" in msg
    assert "ingest the data again" in msg
    (store.path / "format.json").unlink()
    with pytest.raises(ValueError, match=r"no format.json"):
        Store.open_checked(store.path)


# -- ingest once, shared ---------------------------------------------------------------------


def write_csv(path: Path, n: int = 400, seed: int = 8) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(rng.normal(size=(n, 3)), columns=["a", "b", "c"])
    df.to_csv(path, index=False)
    return df


def test_a_second_open_reuses_the_store(client, tmp_path: Path):
    src = tmp_path / "x.csv"
    write_csv(src)
    root = tmp_path / "root"
    store, info, reused = ds.open_dataset(str(src), client=client, root=root, chunk_rows=150)
    assert not reused
    assert store.path.parent == root and store.path.name.startswith("x_csv-")
    assert info.n_rows == 400 and info.n_chunks == 3
    assert sorted(p.name for p in root.iterdir()) == [store.path.name]
    meta = store.read_format()
    assert meta["key"] == store.path.name
    marker = store.path / "marker"
    marker.write_text("left by the test")
    stamp = (store.path / "info.json").stat().st_mtime_ns
    x_stamp = (store.path / "X" / "zarr.json").stat().st_mtime_ns

    store2, info2, reused2 = ds.open_dataset(str(src), client=client, root=root, chunk_rows=150)
    assert reused2
    assert store2.path == store.path
    assert marker.read_text() == "left by the test"
    assert (store.path / "info.json").stat().st_mtime_ns == stamp
    assert (store.path / "X" / "zarr.json").stat().st_mtime_ns == x_stamp
    assert info2.n_rows == info.n_rows
    np.testing.assert_array_equal(info2.sample_rows, info.sample_rows)

    # another option: another key
    store3, _, reused3 = ds.open_dataset(
        str(src), client=client, root=root, chunk_rows=150, n_folds=5
    )
    assert not reused3 and store3.path != store.path
    # the file touched: another key, and the old store is left as it is
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    store4, _, reused4 = ds.open_dataset(str(src), client=client, root=root, chunk_rows=150)
    assert not reused4 and store4.path not in (store.path, store3.path)
    assert marker.exists()
    assert len(list(root.iterdir())) == 3


def test_an_explicit_path_is_reused_while_its_key_matches(client, tmp_path: Path):
    src = tmp_path / "x.csv"
    write_csv(src)
    target = tmp_path / "mine"
    store, _, reused = ds.open_dataset(str(src), client=client, chunk_rows=100, path=target)
    assert not reused and store.path == target
    _, _, reused = ds.open_dataset(str(src), client=client, chunk_rows=100, path=target)
    assert reused
    store, info, reused = ds.open_dataset(str(src), client=client, chunk_rows=300, path=target)
    assert not reused and store.path == target and info.chunk_rows == 300
    assert store.read_format()["chunk_rows"] == 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "x.csv"]


def test_the_key_covers_the_input_and_every_option(tmp_path: Path):
    src = tmp_path / "x.csv"
    write_csv(src)
    base = dict(
        family="auto",
        chunk_rows=100,
        holdout=0.0,
        n_folds=10,
        prior_sample=50_000,
        label_column=None,
        group_column=None,
    )
    fp = ds.fingerprint(src)
    key = ds.dataset_key(fp, ds.ingest_options(**base))
    assert key == ds.dataset_key(ds.fingerprint(str(src)), ds.ingest_options(**base))
    changes = dict(
        family="gaussian",
        chunk_rows=101,
        holdout=0.1,
        n_folds=5,
        prior_sample=10,
        label_column="c",
        group_column="c",
        dtype="float32",
    )
    keys = {key}
    for name, value in changes.items():
        keys.add(ds.dataset_key(fp, ds.ingest_options(**{**base, name: value})))
    write_csv(src, n=401)  # another size
    keys.add(ds.dataset_key(ds.fingerprint(src), ds.ingest_options(**base)))
    assert len(keys) == len(changes) + 2
    # as ``dpmm run`` asks (holes kept, constant columns dropped), the dtype still counts
    run = {**base, "missing": True, "strict": False}
    assert ds.ingest_options(**run) != ds.ingest_options(**{**run, "dtype": "float32"})
    # a directory: every file counts
    d = tmp_path / "pq"
    d.mkdir()
    pd.DataFrame({"a": [1.0, 2.0]}).to_parquet(d / "p0.parquet")
    k1 = ds.dataset_key(ds.fingerprint(d), ds.ingest_options(**base))
    pd.DataFrame({"a": [3.0, 4.0]}).to_parquet(d / "p1.parquet")
    assert ds.dataset_key(ds.fingerprint(d), ds.ingest_options(**base)) != k1
    with pytest.raises(InputError, match=r"nope.csv: no such file or directory"):
        ds.fingerprint(tmp_path / "nope.csv")


def test_a_store_of_another_version_at_the_key_is_refused(client, tmp_path: Path):
    src = tmp_path / "x.csv"
    write_csv(src)
    store, _, _ = ds.open_dataset(str(src), client=client, root=tmp_path / "root")
    meta = store.read_format()
    meta["version"] = FORMAT_VERSION + 1
    (store.path / "format.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError) as err:
        ds.open_dataset(str(src), client=client, root=tmp_path / "root")
    msg = str(err.value)
    assert str(store.path) in msg
    assert f"version {FORMAT_VERSION + 1}" in msg and f"version {FORMAT_VERSION}" in msg


def test_bad_input_in_a_later_chunk_leaves_no_store(client, tmp_path: Path, small_csv_blocks):
    src = tmp_path / "x.csv"
    df = write_csv(src, n=300)
    df.loc[250, "b"] = np.nan
    df.to_csv(src, index=False)
    root = tmp_path / "root"
    with pytest.raises(InputError, match=r"x.csv: column 'b': row 250 is NaN"):
        ds.open_dataset(str(src), client=client, root=root, chunk_rows=50)
    assert list(root.iterdir()) == []
    # grouped: the error comes from the gathering step's plan
    g = grouped_frame(n_groups=10, max_size=30, seed=9)
    g.to_csv(src, index=False)
    with pytest.raises(InputError, match=r"has \d+ rows, more than --chunk-rows 5"):
        ds.open_dataset(
            str(src),
            client=client,
            root=root,
            chunk_rows=5,
            family="gaussian",
            group_column="subject",
            label_column="truth",
        )
    assert list(root.iterdir()) == []


def test_a_stale_partial_is_removed(client, tmp_path: Path):
    src = tmp_path / "x.csv"
    write_csv(src)
    root = tmp_path / "root"
    root.mkdir()
    opts = ds.ingest_options(
        family="auto",
        chunk_rows=200,
        holdout=0.0,
        n_folds=N_FOLDS,
        prior_sample=50_000,
        label_column=None,
        group_column=None,
    )
    key = ds.dataset_key(ds.fingerprint(src), opts)
    # a crashed ingest's partial: a pid that no process has (beyond the kernel's pid_max)
    stale = root / f".{key}.partial-{2**22 + 1}"
    (stale / "X").mkdir(parents=True)
    # a live process's partial (our parent stands for a concurrent ingest) is kept
    live = root / f".{key}.partial-{os.getppid()}-0a1b2c3d"
    live.mkdir()
    # a leftover of a process that had our pid, which no thread of ours writes: removed
    ours = root / f".{key}.partial-{os.getpid()}-deadbeef"
    ours.mkdir()
    store, _, reused = ds.open_dataset(str(src), client=client, root=root, chunk_rows=200)
    assert not reused and store.path == root / key
    assert not stale.exists() and not ours.exists()
    assert live.exists()
    assert sorted(p.name for p in root.iterdir()) == sorted([key, live.name])


def test_concurrent_opens_of_one_key_give_one_store(client, tmp_path: Path):
    src = tmp_path / "x.csv"
    write_csv(src, n=2000)
    root = tmp_path / "root"
    with ThreadPoolExecutor(3) as pool:
        outs = list(
            pool.map(
                lambda _: ds.open_dataset(str(src), client=client, root=root, chunk_rows=300),
                range(3),
            )
        )
    paths = {store.path for store, _, _ in outs}
    assert len(paths) == 1
    assert [p.name for p in root.iterdir()] == [next(iter(paths)).name]
    assert all(info.n_rows == 2000 for _, info, _ in outs)
    _, info, reused = ds.open_dataset(str(src), client=client, root=root, chunk_rows=300)
    assert reused and info.n_rows == 2000


def test_in_memory_inputs(client, tmp_path: Path):
    X = np.random.default_rng(10).normal(size=(120, 2))
    store, info, reused = ds.open_dataset(X, client=client, chunk_rows=50)
    try:
        assert not reused and info.n_rows == 120
        assert store.path.name.startswith("dpmm-dataset-")
        np.testing.assert_array_equal(np.asarray(store.array("X")[:]), X)
    finally:
        import shutil

        shutil.rmtree(store.path)
    target = tmp_path / "mine"
    store, info, reused = ds.open_dataset(X, client=client, chunk_rows=50, path=target)
    assert not reused and store.path == target and info.n_chunks == 3
    # again: in-memory data has no fingerprint, so it is ingested again, replacing the store
    store, info, reused = ds.open_dataset(X[:60], client=client, chunk_rows=50, path=target)
    assert not reused and info.n_rows == 60
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    # a folder that is not a store is never replaced
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"docs: exists and is not a dataset store"):
        ds.open_dataset(X, client=client, path=tmp_path / "docs")
    assert (tmp_path / "docs" / "notes.txt").read_text() == "mine"
    # bad in-memory input leaves nothing
    bad = X.copy()
    bad[100, 1] = np.inf
    with pytest.raises(ValueError, match=r"row 100"):
        ds.open_dataset(bad, client=client, chunk_rows=50, path=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    assert not any(p.name.startswith(".bad") for p in tmp_path.iterdir())


def test_default_root_follows_the_environment(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("DPMM_DATA_DIR", str(tmp_path / "data"))
    assert ds.default_root() == tmp_path / "data"
    monkeypatch.delenv("DPMM_DATA_DIR")
    assert ds.default_root() == Path.home() / ".cache" / "dpmm" / "datasets"


def test_read_table_reads_as_ingest_reads(tmp_path: Path, monkeypatch):
    """``pipeline.data.sources.read_table`` (``dpmm cluster``) reads a file through ingest's pieces
    (``pipeline.data.sources.read_file``): CSV in many pieces, TSV, Parquet directories, 2-D and
    structured ``.npy`` give the file's records exactly."""
    from pipeline.data import sources

    monkeypatch.setattr(sources, "CSV_BLOCK_BYTES", 100)  # many CSV pieces
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"a": rng.normal(size=40), "b": rng.integers(0, 5, size=40)})
    df.to_csv(tmp_path / "x.csv", index=False)
    df.to_csv(tmp_path / "x.tsv", sep="\t", index=False)
    (tmp_path / "pq.parquet").mkdir()
    df.iloc[:25].to_parquet(tmp_path / "pq.parquet" / "part-0.parquet")
    df.iloc[25:].to_parquet(tmp_path / "pq.parquet" / "part-1.parquet")
    for name in ("x.csv", "x.tsv", "pq.parquet"):
        got = sources.read_table(tmp_path / name)
        pd.testing.assert_frame_equal(got.reset_index(drop=True), df, check_dtype=False)
    np.save(tmp_path / "x.npy", df.to_numpy(dtype=float))
    got = sources.read_table(tmp_path / "x.npy")
    assert list(got.columns) == ["x0", "x1"]
    np.testing.assert_array_equal(got.to_numpy(), df.to_numpy(dtype=float))
    rec = np.zeros(40, dtype=[("a", "f8"), ("b", "i8")])
    rec["a"], rec["b"] = df["a"], df["b"]
    np.save(tmp_path / "rec.npy", rec)
    pd.testing.assert_frame_equal(sources.read_table(tmp_path / "rec.npy"), df, check_dtype=False)
    assert sources.read_table(tmp_path / "x.csv", columns=["b"]).columns.tolist() == ["b"]


# -- the run's prior ------------------------------------------------------------------------


def test_each_run_refits_the_prior_to_the_stores_sample_at_its_scale(client, tmp_path: Path):
    """The store keeps the prior's sample; ``loop.context`` refits the empirical-Bayes prior at
    the run's ``prior_scale``, else the engine's (asugs: its own choice; mapdp: the one of
    lowest objective on the covariance's sample, ``Schema.choose_scale``), else the family
    default (0.3); a prior given to ingest is kept whatever the run asks."""
    from dataclasses import replace

    from pipeline.core.config import FitParams
    from pipeline.distributed import loop
    from pipeline.families import FAMILIES, GaussianNW

    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(0, 1, (300, 3)), rng.normal(6, 1, (300, 3))])
    store = Store(tmp_path / "s")
    info = ingest(X, store, client=client, chunk_rows=200)
    assert not info.prior_fixed

    def prior_of(params: FitParams) -> np.ndarray:
        ctx = loop.context(store, tmp_path / f"state-{params.engine}", info, params)
        return ctx.info.family.prior

    # the covariance ``family="auto"`` chose at ingest (``Schema.choose_structure``)
    chosen_family = FAMILIES[info.schema.structure["chosen"]]

    def expected(scale: float | None) -> np.ndarray:
        return chosen_family.empirical_bayes(info.sample, scale=scale).as_product().prior

    run = loop.context(store, tmp_path / "state-mapdp", info, FitParams()).info
    chosen_scale = run.schema.structure["scale"]
    np.testing.assert_allclose(run.family.prior, expected(chosen_scale), rtol=1e-12)
    np.testing.assert_allclose(prior_of(FitParams(engine="kmeans")), expected(None), rtol=1e-12)
    np.testing.assert_allclose(prior_of(FitParams(prior_scale=0.05)), expected(0.05), rtol=1e-12)
    np.testing.assert_allclose(
        prior_of(FitParams(engine="asugs", prior_scale=0.1)), expected(0.1), rtol=1e-12
    )
    # the asugs engine without a scale: the prior ``pipeline.ASUGS`` chooses on the sample
    from pipeline.engines.asugs import ENGINE as ASUGS_ENGINE

    chosen = ASUGS_ENGINE.run_info(info, FitParams(engine="asugs")).family.prior
    np.testing.assert_allclose(prior_of(FitParams(engine="asugs")), chosen, rtol=1e-12)
    assert not np.allclose(expected(None), expected(0.1))
    # a stale prior in the store (ingested under another default) is not what a run uses
    stale = replace(info, family=chosen_family.empirical_bayes(info.sample, scale=0.5).as_product())
    ctx = loop.context(store, tmp_path / "state-stale", stale, FitParams())
    np.testing.assert_allclose(ctx.info.family.prior, expected(chosen_scale), rtol=1e-12)
    # a given prior is kept
    given = GaussianNW.empirical_bayes(X, scale=0.5)
    fixed = ingest(X, Store(tmp_path / "f"), client=client, chunk_rows=200, family=given)
    assert fixed.prior_fixed
    ctx = loop.context(Store(tmp_path / "f"), tmp_path / "state-f", fixed, FitParams())
    np.testing.assert_allclose(ctx.info.family.prior, given.as_product().prior, rtol=1e-12)
    with pytest.raises(ValueError, match="prior_scale must be in"):
        FitParams(prior_scale=1.5).checked()


def test_a_list_of_tables_is_one_input(client, tmp_path: Path, small_csv_blocks):
    """A list of CSV and Parquet files (a window of dated partitions, ``pipeline.ops.schedule``) is
    ingested as the concatenation of their records in the order given; a bad row is named by
    its own file and row; an array file in a list is refused; the list's dataset fingerprint
    changes when one of its files does."""
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"a": rng.normal(size=90), "b": rng.normal(size=90)})
    df.iloc[:30].to_csv(tmp_path / "d1.csv", index=False)
    (tmp_path / "d2").mkdir()
    df.iloc[30:50].to_parquet(tmp_path / "d2" / "part-0.parquet")
    df.iloc[50:].to_parquet(tmp_path / "d3.parquet", row_group_size=15)
    files = [str(tmp_path / "d1.csv"), str(tmp_path / "d2"), str(tmp_path / "d3.parquet")]
    got, ref = Store(tmp_path / "list"), Store(tmp_path / "frame")
    info = ingest(files, got, client=client, chunk_rows=25, family="gaussian")
    ingest(df, ref, client=client, chunk_rows=25, family="gaussian")
    assert info.n_rows == 90 and info.source.startswith("3 files (")
    for name in ("X", "fold", "holdout"):
        np.testing.assert_array_equal(got.array(name)[:], ref.array(name)[:])
    fp = ds.fingerprint(files)
    assert fp["path"] == [str(Path(f).resolve()) for f in files]
    # the same size, another mtime: another fingerprint
    os.utime(tmp_path / "d3.parquet", ns=(1, 1))
    assert ds.fingerprint(files) != fp and ds.is_path_source(files)

    bad = df.iloc[50:].copy()
    bad.iloc[7, 1] = np.nan
    bad.to_parquet(tmp_path / "d3.parquet", row_group_size=15)
    with pytest.raises(InputError, match=r"d3\.parquet: column 'b': row 7 is NaN"):
        ingest(files, Store(tmp_path / "bad"), client=client, chunk_rows=25, family="gaussian")
    np.save(tmp_path / "x.npy", df.to_numpy())
    with pytest.raises(InputError, match=r"x\.npy: a list of inputs holds tables"):
        ingest([files[0], str(tmp_path / "x.npy")], Store(tmp_path / "npy"), client=client)
