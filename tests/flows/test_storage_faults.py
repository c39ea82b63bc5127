"""``dpmm`` under storage faults, as a user meets them (tests/faults.py): object storage failing
some requests (retried, each retry one line naming the object, same labels), or every request
for an object (exit status 3, one line naming it, nothing written); a full disk under OUT or
``--data-dir`` (exit status 3, one line, no partial output or store; a later run with space
succeeds); a damaged chunk of the dataset store (exit status 3, named, with what to do)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flows.cli import main
from flows.cluster import cluster
from pipeline.core import outputs, storage
from pipeline.core.config import STORAGE_ATTEMPTS
from tests.flows.test_object_storage import LOCAL, blobs, labels_of

pytestmark = pytest.mark.usefixtures("prefect_harness")


def said(err: str) -> list[str]:
    """The command's own lines (a worker's log may share its stderr)."""
    return [ln for ln in err.splitlines() if ln.startswith("dpmm: error")]


def test_dpmm_run_on_s3_retries_through_faults_to_the_same_labels(
    s3_bucket: str, failing_s3, tmp_path: Path, capfd
) -> None:
    """3% of the requests of ``dpmm run`` (INPUT, OUT and the dataset store on S3; worker
    processes) fail with 503, throttling or a dropped connection: the labels are those of the
    undisturbed run, and the retries are said, naming their objects."""
    b = f"s3://{s3_bucket}"
    df = blobs(1200, 0)
    with storage.location(f"{b}/in.parquet").open("wb") as fh:
        df.to_parquet(fh, index=False, row_group_size=400)
    df.to_parquet(tmp_path / "in.parquet", index=False, row_group_size=400)
    args = {"chunk_rows": 400, "random_state": 1, "report": False}
    cluster(str(tmp_path / "in.parquet"), str(tmp_path / "ref"), **args, **LOCAL)
    log = tmp_path / "run.log"
    argv = ["run", f"{b}/in.parquet", "--out", f"{b}/out", "--data-dir", f"{b}/data"]
    argv += ["--chunk-rows", "400", "--seed", "1", "--workers", "2", "--no-report"]
    with failing_s3(0.03, seed=3) as faults:
        code = main([*argv, "--quiet", "--log-file", str(log)])
    err = capfd.readouterr().err
    assert code == 0, err
    assert faults.total > 0
    np.testing.assert_array_equal(labels_of(f"{b}/out"), labels_of(tmp_path / "ref"))
    lines = [ln for ln in (err + log.read_text()).splitlines() if "; retry " in ln]
    assert lines and all(f"s3://{s3_bucket}/" in ln for ln in lines), lines[:5]
    # at most one line per fault (a dropped connection may be tried again unsaid, by aiohttp)
    assert len(lines) <= faults.total


def test_spent_retries_exit_3_naming_the_object_and_write_nothing(
    s3_bucket: str, failing_s3, tmp_path: Path, capfd
) -> None:
    b = f"s3://{s3_bucket}"
    df = blobs(600, 1)
    df.to_parquet(tmp_path / "in.parquet", index=False)
    cluster(str(tmp_path / "in.parquet"), f"{b}/out", chunk_rows=300, report=False, **LOCAL)
    capfd.readouterr()
    argv = ["score", f"{b}/out/model", str(tmp_path / "in.parquet"), "--out", f"{b}/scores"]
    with failing_s3(1.0, kinds=("503",), ops=("get",), match="/out/model/") as faults:
        code = main([*argv, "--quiet"])
    err = capfd.readouterr().err
    assert code == 3, err
    (line,) = said(err)
    assert line.startswith(f"dpmm: error: s3://{s3_bucket}/out/model/"), line
    assert f"still failing after {STORAGE_ATTEMPTS} attempts" in line
    assert faults.total == STORAGE_ATTEMPTS
    loc = storage.location(f"{b}/scores")
    assert not loc.exists() or not outputs.committed(loc)


@pytest.mark.slow
def test_a_full_disk_under_out_or_the_data_dir_exits_3_and_leaves_nothing(
    full_disk, tmp_path: Path, capfd
) -> None:
    """OUT on a full disk, then the dataset store: one line naming a file there, exit status
    3, no partial output or store left; with space again the same command succeeds. With
    ``--quiet`` that line is all the terminal shows: when the disk fills in a worker's task,
    its "Compute Failed" and traceback go to the run's log file."""
    df = blobs(30_000, 2)
    df.to_csv(tmp_path / "in.csv", index=False)
    base = ["run", str(tmp_path / "in.csv"), "--seed", "1", "--workers", "1", "--no-report"]
    with full_disk(tmp_path / "small", 256 << 10) as disk:
        log = tmp_path / "run.log"
        out = ["--out", str(disk.path / "out"), "--data-dir", str(tmp_path / "d")]
        code = main([*base, *out, "--quiet", "--log-file", str(log)])
        err = capfd.readouterr().err
        assert code == 3, err
        (line,) = err.splitlines()
        assert line.startswith("dpmm: error: no space left on device writing "), line
        assert str(disk.path) in line
        assert list(disk.path.iterdir()) == []
    # the store ingested before the disk filled is whole, and the next run reuses it
    code = main([*base, "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "d")])
    assert code == 0, capfd.readouterr().err
    ref = labels_of(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "run.json").read_text())["dataset"]["reused"]
    with full_disk(tmp_path / "small2", 256 << 10) as disk:
        code = main([*base, "--out", str(tmp_path / "o2"), "--data-dir", str(disk.path)])
        err = capfd.readouterr().err
        assert code == 3, err
        (line,) = said(err)
        assert line.startswith("dpmm: error: no space left on device writing "), line
        assert list(disk.path.iterdir()) == [] and not (tmp_path / "o2").exists()
    code = main([*base, "--out", str(tmp_path / "o3"), "--data-dir", str(tmp_path / "d3")])
    assert code == 0, capfd.readouterr().err
    np.testing.assert_array_equal(labels_of(tmp_path / "o3"), ref)


def test_a_damaged_chunk_of_the_dataset_store_is_named_with_what_to_do(
    tmp_path: Path, capfd
) -> None:
    df = blobs(1200, 4)
    df.to_csv(tmp_path / "in.csv", index=False)
    base = ["run", str(tmp_path / "in.csv"), "--chunk-rows", "400", "--seed", "1"]
    base += ["--workers", "1", "--no-report", "--data-dir", str(tmp_path / "d")]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0, capfd.readouterr().err
    (store,) = [p for p in (tmp_path / "d").iterdir() if p.is_dir()]
    chunk = store / "X" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0x01  # one bit of one number
    chunk.write_bytes(bytes(data))
    capfd.readouterr()
    assert main([*base, "--out", str(tmp_path / "b")]) == 3
    (line,) = said(capfd.readouterr().err)
    assert line.startswith(f"dpmm: error: {store / 'X'}: chunk 1 is damaged "), line
    assert f"remove the dataset store {store}" in line and not (tmp_path / "b").exists()
    storage.rmtree(store)
    assert main([*base, "--out", str(tmp_path / "b")]) == 0, capfd.readouterr().err
    np.testing.assert_array_equal(labels_of(tmp_path / "b"), labels_of(tmp_path / "a"))
