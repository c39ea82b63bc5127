"""``pipeline.core.storage`` against a real S3-compatible server (moto's server mode on 127.0.0.1,
``s3_server`` in tests/conftest.py): paths and URLs, visibility by manifest, records, models and
shared dataset stores on object storage, and the one-line errors of a bad URL."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import zarr

from pipeline.core import outputs, persist, storage
from pipeline.core.errors import InputError
from pipeline.data.dataset import open_dataset
from pipeline.estimators.mapdp import MAPDP
from pipeline.estimators.model import load_model, save_model


def test_locations_of_paths_and_urls(tmp_path: Path) -> None:
    assert storage.location(str(tmp_path)) == tmp_path
    assert storage.location(f"file://{tmp_path}") == tmp_path
    assert storage.location(tmp_path / "x") == tmp_path / "x"
    r = storage.location("s3://bkt/a/b/")
    assert isinstance(r, storage.RemotePath)
    assert str(r) == "s3://bkt/a/b" and r.name == "b" and r.bucket == "bkt"
    assert str(r.parent) == "s3://bkt/a" and str(r / "c.json") == "s3://bkt/a/b/c.json"
    assert (r / "c" / "d").relative_to(r) == "c/d"
    with pytest.raises(ValueError, match="bad name"):
        r / "../x"
    assert storage.is_url("gs://b/x") and not storage.is_url("file:///x")
    assert not storage.is_url(str(tmp_path))
    assert storage.redact("s3://key:secret@bkt/x") == "s3://bkt/x"


def test_unknown_scheme_and_missing_package_name_the_url() -> None:
    with pytest.raises(InputError, match=r"^foo://b/x: unknown storage scheme foo://"):
        storage.check_reachable("foo://b/x")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match=r"^gs://b/x: gs:// needs the gcsfs package"):
            storage.check_reachable("gs://b/x")


def test_missing_bucket_and_missing_credentials(s3_bucket: str, monkeypatch) -> None:
    with pytest.raises(InputError, match=r"^--out s3://no-such-bucket/o: the bucket"):
        storage.check_reachable("s3://no-such-bucket/o", "--out")
    storage.check_reachable(f"s3://{s3_bucket}/o")
    import s3fs

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(InputError, match=rf"^s3://{s3_bucket}/o: no credentials for s3://"):
            storage.check_reachable(f"s3://{s3_bucket}/o")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_files_commit_and_visibility(s3_bucket: str) -> None:
    out = storage.location(f"s3://{s3_bucket}/runs/out")
    assert isinstance(out, storage.RemotePath)
    storage.write_atomic(out / "a.json", b'{"a": 1}')
    (out / "sub" / "b.bin").write_bytes(b"xyz")
    assert (out / "a.json").read_text() == '{"a": 1}' and out.is_dir()
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "sub"]
    # written but not committed: invisible to readers, at any depth
    assert not outputs.committed(out)
    for loc in (out, out / "sub", out / "sub" / "b.bin"):
        with pytest.raises(InputError, match="not a committed output"):
            outputs.require_visible(loc)
    outputs.commit(out, kind="test")
    doc = json.loads((out / outputs.MANIFEST).read_text())
    assert doc["objects"] == {"a.json": 8, "sub/b.bin": 3} and doc["kind"] == "test"
    for loc in (out, out / "sub", out / "sub" / "b.bin"):
        outputs.require_visible(loc)
    with pytest.raises(InputError, match="not a committed output"):
        outputs.require_visible(out / "other")
    outputs.uncommit(out)
    assert not out.exists() and not outputs.committed(out)
    # a local directory is visible once it exists (it is renamed into place)
    outputs.require_visible(Path("/nonexistent"))


def test_replacing_a_committed_output_never_shows_half_of_either(
    s3_bucket: str, monkeypatch
) -> None:
    """``outputs.replace``: the old output stays visible until the staged one is committed; a
    swap interrupted half-way leaves OUT invisible (never a mix) and ``finish_replace``
    completes it."""
    b = f"s3://{s3_bucket}"
    out = storage.location(f"{b}/rep/out")
    assert isinstance(out, storage.RemotePath)
    (out / "old.bin").write_bytes(b"old")
    (out / "same.json").write_bytes(b"1")
    outputs.commit(out, kind="run")
    staged = outputs.staging(out)
    assert staged is not None and str(staged) == f"{b}/rep/.out.partial"
    assert outputs.staging(storage.RemotePath(f"{b}")) is None
    for rel, data in (("new/a.bin", b"aa"), ("new/b.bin", b"bbb"), ("same.json", b"22")):
        (staged / rel).write_bytes(data)
    # staged but not swapped: OUT is still the old output, whole
    assert not outputs.finish_replace(out)
    assert sorted(json.loads((out / outputs.MANIFEST).read_text())["objects"]) == [
        "old.bin",
        "same.json",
    ]
    # the swap fails after its first copy
    fs = staged.fs  # fsspec caches file systems: the one the swap copies with
    real_copy = fs.copy
    calls = []

    def failing_copy(src, dst, **kw):
        calls.append(src)
        if len(calls) > 1:
            raise OSError("connection reset")
        return real_copy(src, dst, **kw)

    monkeypatch.setattr(fs, "copy", failing_copy)
    with pytest.raises(OSError, match="connection reset"):
        outputs.replace(staged, out, kind="run")
    monkeypatch.undo()
    assert outputs.committed(staged) and not outputs.committed(out)
    with pytest.raises(InputError, match="not a committed output"):
        outputs.require_visible(out / "new" / "a.bin")
    # the next command on OUT completes the swap
    assert outputs.finish_replace(out)
    doc = json.loads((out / outputs.MANIFEST).read_text())
    assert doc["objects"] == {"new/a.bin": 2, "new/b.bin": 3, "same.json": 2}
    assert doc["kind"] == "run"
    assert (out / "same.json").read_bytes() == b"22" and not (out / "old.bin").exists()
    assert not staged.exists() and not outputs.finish_replace(out)


def test_records_and_models_on_s3(s3_bucket: str, tmp_path: Path) -> None:
    d = storage.location(f"s3://{s3_bucket}/rec")
    obj = {"x": np.arange(5.0), "p": [1, "a", None]}
    persist.save(d, "r", obj)
    assert persist.exists(d, "r") and not persist.exists(d, "s")
    back = persist.load(d, "r")
    np.testing.assert_array_equal(back["x"], obj["x"]) and back["p"] == obj["p"]
    persist.remove(d, "r")
    assert not persist.exists(d, "r")

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(-5, 1, (60, 2)), rng.normal(5, 1, (60, 2))])
    est = MAPDP(random_state=0).fit(X)
    url = f"s3://{s3_bucket}/models/m1"
    save_model(est, url)
    assert outputs.committed(storage.location(url))
    with pytest.raises(FileExistsError):
        save_model(est, url)
    back = load_model(url)
    np.testing.assert_array_equal(back.predict(X), est.predict(X))
    # a prefix of someone else's objects is never replaced
    other = f"s3://{s3_bucket}/data"
    storage.location(f"{other}/keep.csv").write_text("a\n1\n")
    with pytest.raises(FileExistsError, match="not a model"):
        save_model(est, other, overwrite=True)
    assert storage.location(f"{other}/keep.csv").exists()
    # a model written but not committed is not read
    with pytest.raises(InputError, match="not a committed output"):
        load_model(other)
    np.testing.assert_allclose(back.score_samples(X), est.score_samples(X))


def test_dataset_store_on_s3_is_shared_and_committed(s3_bucket: str, client, tmp_path) -> None:
    rng = np.random.default_rng(1)
    df = pd.DataFrame(rng.normal(size=(500, 3)), columns=["a", "b", "c"])
    src = f"s3://{s3_bucket}/in.parquet"
    with storage.location(src).open("wb") as fh:
        df.to_parquet(fh, index=False, row_group_size=120)
    root = f"s3://{s3_bucket}/datasets"
    store, info, reused = open_dataset(src, client=client, root=root, chunk_rows=100)
    assert not reused and info.n_rows == 500 and info.source == src
    X = zarr.open_array(str(store.path / "X"), mode="r")[:]
    np.testing.assert_array_equal(X[:, np.argsort(info.family.column_order)], df.to_numpy())
    # the store is its own committed attempt under the key; no staging left
    assert outputs.committed(store.path) and store.path.name.startswith("attempt-")
    assert not (store.path / "staging").exists()
    again, _, reused = open_dataset(src, client=client, root=root, chunk_rows=100)
    assert reused and again.path == store.path
    # an uncommitted attempt (a crashed ingest) is never opened
    key = store.path.parent
    stray = key / "attempt-99991231T000000-deadbeef"
    (stray / "format.json").write_text("{}")
    again, _, reused = open_dataset(src, client=client, root=root, chunk_rows=100)
    assert reused and again.path == store.path
    # a bad input leaves nothing behind
    bad = f"s3://{s3_bucket}/bad.csv"
    storage.location(bad).write_text("a,b\n1,2\n3,4\n5,\n7,8\n")
    # compared whole: a filter on "bad" also matched the good store's key when its hex hash
    # happened to hold "bad"
    before = set(storage.location(root).files())
    with pytest.raises(InputError, match=rf"s3://{s3_bucket}/bad.csv"):
        open_dataset(bad, client=client, root=root, chunk_rows=100)
    assert set(storage.location(root).files()) == before


def test_two_local_writers_of_one_output_each_stage_their_own(tmp_path: Path) -> None:
    """Two never-resumed writers of one OUT (two ``dpmm score``, or two runs scoring one day)
    stage in places of their own; the first to publish renames its copy into place, the other
    is refused with one line (or, with ``--overwrite``, swapped in atomically: a reader sees
    one whole output or the other, never none); a partial whose writer died is removed by the
    next writer."""
    import os
    import threading

    out = tmp_path / "out"
    dead = tmp_path / f".out{outputs.PARTIAL}{2**22 + 1}-0a1b2c3d"
    dead.mkdir()
    a, resumed = outputs.prepare_output(out, None, False)
    b, _ = outputs.prepare_output(out, None, False)
    assert not resumed and a != b and a.is_dir() and b.is_dir() and not dead.exists()
    for w in (a, b):
        (w / "who").write_text(w.name)
    outputs.publish_output(a, out, False, kind="score")
    with pytest.raises(InputError, match=r"out: already exists \(pass --overwrite"):
        outputs.publish_output(b, out, False, kind="score")
    assert (out / "who").read_text() == a.name and b.is_dir()
    seen: set[str] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                seen.add((out / "who").read_text())
            except FileNotFoundError:
                seen.add("missing")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(50):
            w, _ = outputs.prepare_output(out, None, True)
            (w / "who").write_text(str(i))
            outputs.publish_output(w, out, True, kind="score")
    finally:
        stop.set()
        reader.join()
    assert (out / "who").read_text() == "49" and "missing" not in seen and len(seen) > 1
    os.rename(b, tmp_path / "kept")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "out"]


def test_a_full_device_that_names_no_file_is_named_by_the_fullest_place(
    full_disk: Any, tmp_path: Path
) -> None:
    """A failed ``write`` (ENOSPC without a file name, here behind another error) is one
    message naming, among the places the command writes, the one on the device with the least
    space free; a URL is no such place, and with no local place the message names none."""
    with full_disk(tmp_path / "small", 1 << 20) as disk:
        with open(disk.path / "filler", "wb") as fh, pytest.raises(OSError) as full:
            while True:
                fh.write(bytes(1 << 16))
                fh.flush()
        assert full.value.errno == errno.ENOSPC and full.value.filename is None
        try:
            raise RuntimeError("a task failed") from full.value
        except RuntimeError as wrapped:
            err = storage.no_space(wrapped, [tmp_path / "d", disk.path / "out", "s3://b/out"])
        assert err is not None
        assert str(err).startswith(f"no space left on device under {disk.path / 'out'} (")
        assert str(err).endswith(" MiB free there now) (free some, then run again)")
        alone = storage.no_space(full.value, ["s3://b/out"])
        assert str(alone) == "no space left on device (free some, then run again)"
    assert storage.no_space(ValueError("not a device")) is None
