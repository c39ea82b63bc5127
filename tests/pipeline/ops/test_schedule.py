"""The bookkeeping of scheduled clustering (``pipeline.ops.schedule``): partitions, the rolling
window, versions and the pointer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core import outputs, storage
from pipeline.ops import schedule


def test_partitions_are_dated_directories_in_date_order(tmp_path: Path) -> None:
    for name in ("date=2026-01-03", "date=2026-01-01", "date=2026-02-30", "other", "date=x"):
        (tmp_path / name).mkdir()
    (tmp_path / "date=2026-01-02").write_text("a file, not a partition")
    got = schedule.partitions(tmp_path)
    assert got == [
        ("2026-01-01", tmp_path / "date=2026-01-01"),
        ("2026-01-03", tmp_path / "date=2026-01-03"),
    ]
    with pytest.raises(ValueError, match="no such input directory"):
        schedule.partitions(tmp_path / "missing")


def test_window_keeps_the_last_accepted_days() -> None:
    days = [f"2026-01-0{i}" for i in range(1, 8)]
    done = {"2026-01-01", "2026-01-02", "2026-01-04", "2026-01-05"}  # 03 was rejected
    assert schedule.window_dates(days, done, "2026-01-06", 3) == [
        "2026-01-04",
        "2026-01-05",
        "2026-01-06",
    ]
    assert schedule.window_dates(days, done, "2026-01-06", 10) == [
        "2026-01-01",
        "2026-01-02",
        "2026-01-04",
        "2026-01-05",
        "2026-01-06",
    ]
    # a later day already done is not part of an earlier day's window
    assert schedule.window_dates(days, done | {"2026-01-07"}, "2026-01-03", 7)[-1] == "2026-01-03"


def test_versions_pointer_and_interrupted_publish(tmp_path: Path) -> None:
    models = tmp_path / "models"
    reg = schedule.Registry(models)
    assert reg.versions() == [] and reg.latest() is None and reg.finish_publish() is None
    staged = reg.stage()
    assert staged.parent == models / ".staging"  # a writer's own place, hidden
    (staged / "model").mkdir()
    reg.publish(staged, {"date": "2026-01-01"})
    assert reg.latest() == models / "v1" and reg.done() == {"2026-01-01": 1}
    assert not staged.exists()
    # a version renamed into place whose pointer did not move
    assert reg.write_version(reg.stage(), {"date": "2026-01-02"}) == models / "v2"
    assert reg.latest() == models / "v1"
    assert reg.finish_publish() == 2 and reg.latest() == models / "v2"
    # the pointer never moves back
    assert reg.advance(1) is False and (models / "LATEST").read_text() == "v2\n"
    # a version in progress is not a version; a stray v3 folder is no version and is skipped
    reg.stage()
    (models / "v3").mkdir()
    (models / "v3" / "junk").write_text("not ours")
    assert reg.versions() == [1, 2]
    assert reg.publish(reg.stage(), {"date": "2026-01-03"}) == models / "v4"
    assert (models / "v3" / "junk").read_text() == "not ours"
    (models / "LATEST").write_text("v9\n")
    with pytest.raises(ValueError, match="not a published version"):
        reg.latest()


def test_rejections_record_the_partition_and_error(tmp_path: Path) -> None:
    part = tmp_path / "date=2026-01-01"
    part.mkdir()
    (part / "a.parquet").write_bytes(b"PAR1")
    reg = schedule.Registry(tmp_path / "models")
    assert reg.rejected("2026-01-01") is None
    rec = reg.reject("2026-01-01", part, "column 'x': row 3 is NaN")
    assert reg.rejected("2026-01-01") == rec
    assert rec["fingerprint"] == schedule.fingerprint(part)
    assert rec["error"] == "column 'x': row 3 is NaN"


# -- the same bookkeeping on object storage without rename: a real S3-compatible server --------
# (fsspec's memory:// names keys with a leading "/", which RemotePath does not model)


@pytest.fixture
def mem(s3_bucket: str) -> str:
    """A new empty bucket of the test's own on the moto server (``s3_bucket``), as a URL."""
    return f"s3://{s3_bucket}"


def _put(url: str, data: bytes = b"x") -> None:
    storage.location(url).write_bytes(data)


def test_partitions_fingerprint_and_window_files_on_an_object_store(mem: str) -> None:
    for name in ("date=2026-01-03", "date=2026-01-01", "date=2026-02-30", "other", "date=x"):
        _put(f"{mem}/in/{name}/part-0.parquet")
    _put(f"{mem}/in/date=2026-01-01/_SUCCESS", b"")
    _put(f"{mem}/in/date=2026-01-01/sub/.hidden")
    _put(f"{mem}/in/date=2026-01-02", b"an object, not a partition")
    got = schedule.partitions(f"{mem}/in")
    assert [(d, str(p)) for d, p in got] == [
        ("2026-01-01", f"{mem}/in/date=2026-01-01"),
        ("2026-01-03", f"{mem}/in/date=2026-01-03"),
    ]
    fp = schedule.fingerprint(got[0][1])
    assert [rel for rel, _size, _stamp in fp] == ["_SUCCESS", "part-0.parquet", "sub/.hidden"]
    assert [size for _rel, size, _stamp in fp] == [0, 1, 1]
    assert schedule.window_files(got) == [
        f"{mem}/in/date=2026-01-01/part-0.parquet",
        f"{mem}/in/date=2026-01-03/part-0.parquet",
    ]
    # a rewritten object changes the fingerprint, an untouched one does not
    assert schedule.fingerprint(got[0][1]) == fp
    _put(f"{mem}/in/date=2026-01-01/part-0.parquet", b"y")  # same size, new ETag
    assert schedule.fingerprint(got[0][1]) != fp
    with pytest.raises(ValueError, match="no such input prefix"):
        schedule.partitions(f"{mem}/missing")


def test_versions_are_visible_by_their_manifest_and_the_pointer_goes_last(mem: str) -> None:
    models = f"{mem}/models"
    reg = schedule.Registry(models)
    assert reg.versions() == [] and reg.latest() is None and reg.finish_publish() is None
    staged = reg.stage()
    assert str(staged).startswith(f"{models}/.staging/")  # a writer's own prefix
    _put(f"{staged}/model/model.json", b"{}")
    # objects written, no version: nothing published, no pointer
    assert reg.versions() == [] and reg.latest() is None
    v1 = reg.publish(staged, {"date": "2026-01-01"})
    assert str(v1) == f"{models}/v1" and reg.latest() == v1 and reg.done() == {"2026-01-01": 1}
    manifest = json.loads((v1 / outputs.MANIFEST).read_text())
    assert set(manifest["objects"]) == {"model/model.json", "version.json"}
    # the staging place and the claim are gone
    assert sorted(p.name for p in storage.location(models).iterdir()) == ["LATEST", "v1"]

    # interrupted after the version's manifest, before the pointer
    staged = reg.stage()
    _put(f"{staged}/model/model.json", b"{}")
    reg.write_version(staged, {"date": "2026-01-02"})
    assert reg.versions() == [1, 2] and reg.latest() == v1
    assert (storage.location(models) / "LATEST").read_text() == "v1\n"
    assert reg.finish_publish() == 2 and str(reg.latest()) == f"{models}/v2"
    assert reg.finish_publish() is None and reg.advance(1) is False

    # a half-written v3 (objects, no manifest): invisible, left alone, its number skipped
    _put(f"{models}/v3/model/model.json", b"half")
    assert reg.versions() == [1, 2] and str(reg.latest()) == f"{models}/v2"
    staged = reg.stage()
    _put(f"{staged}/model/model.json", b"{}")
    assert str(reg.publish(staged, {"date": "2026-01-03"})) == f"{models}/v4"
    assert _text(f"{models}/v3/model/model.json") == "half"
    # the pointer naming a version without a manifest is refused
    (storage.location(models) / "LATEST").write_text("v3\n")
    with pytest.raises(ValueError, match="not a published version"):
        reg.latest()


def _text(url: str) -> str:
    return storage.location(url).read_text()


def test_rejections_and_moves_on_an_object_store(mem: str) -> None:
    part = storage.location(f"{mem}/in/date=2026-01-01")
    _put(f"{part}/a.parquet", b"PAR1")
    reg = schedule.Registry(f"{mem}/models")
    assert reg.rejected("2026-01-01") is None
    rec = reg.reject("2026-01-01", part, "column 'x': row 3 is NaN")
    assert reg.rejected("2026-01-01") == rec
    assert rec["fingerprint"] == schedule.fingerprint(part)
    assert rec["partition"] == f"{mem}/in/date=2026-01-01"
    # a directory and a single object moved by copies, the source gone
    src = storage.location(f"{mem}/x/run")
    _put(f"{src}/model/a.json", b"a")
    _put(f"{src}/model/arrays/b.npy", b"bb")
    _put(f"{src}/run.json", b"{}")
    storage.move(src / "model", storage.location(f"{mem}/x/model"))
    storage.move(src / "run.json", storage.location(f"{mem}/x/run.json"))
    x = storage.location(f"{mem}/x")
    assert sorted(x.files()) == ["model/a.json", "model/arrays/b.npy", "run.json"]
    assert (x / "model" / "arrays" / "b.npy").read_bytes() == b"bb"
