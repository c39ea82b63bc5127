"""The bookkeeping of scheduled clustering (``pipeline.schedule``): partitions, the rolling
window, versions and the pointer."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import schedule


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
    reg = schedule.Registry(tmp_path / "models")
    assert reg.versions() == [] and reg.latest() is None and reg.finish_publish() is None
    n, staged = reg.stage()
    assert n == 1 and staged.name == ".v1.partial"
    (staged / "model").mkdir()
    reg.publish(n, staged, {"date": "2026-01-01"})
    assert reg.latest() == tmp_path / "models" / "v1" and reg.done() == {"2026-01-01": 1}
    # a version renamed into place whose pointer switch did not happen
    n, staged = reg.stage()
    (staged / "version.json").write_text('{"version": 2, "date": "2026-01-02"}')
    staged.rename(tmp_path / "models" / "v2")
    assert reg.latest() == tmp_path / "models" / "v1"
    assert reg.finish_publish() == 2 and reg.latest() == tmp_path / "models" / "v2"
    # a half-built version (no version.json) is not a version
    n, staged = reg.stage()
    assert n == 3 and reg.versions() == [1, 2]
    (tmp_path / "models" / "LATEST").write_text("v9\n")
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
