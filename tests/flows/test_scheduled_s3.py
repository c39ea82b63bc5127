"""The ``scheduled-clustering`` flow and ``dpmm serve`` with INPUT, MODELS and the scores on
object storage: a real S3-compatible server (moto's server mode on 127.0.0.1, ``s3_server`` in
tests/conftest.py). Versions become visible by their manifest, the pointer is one object PUT
last; v1 then v2 (warm-started), a bad partition in between, a publish interrupted before the
pointer completed by the next run, a rerun that changes no object, a half-written version that
stays invisible; bad URLs are one line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from flows.cli import main
from flows.scheduled import scheduled_clustering
from pipeline.core import outputs, storage
from pipeline.estimators.model import load_model
from pipeline.ops import schedule
from tests.flows.test_run_model import write_mixed

LOCAL = {"processes": False, "n_workers": 2, "dashboard_address": None, "progress": False}
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"]


pytestmark = pytest.mark.usefixtures("prefect_harness")


def _partition(tmp_path: Path, root: str, day: str, seed: int, bad: bool = False) -> pd.DataFrame:
    df = write_mixed(tmp_path / f"{day}.csv", 400, seed)
    if bad:
        df.loc[17, "shop"] = "harbour"  # a shop the model never saw
    with storage.location(f"{root}/date={day}/part-0.parquet").open("wb") as fh:
        df.to_parquet(fh, index=False)
    # a marker the writer of the partition leaves: not records
    storage.location(f"{root}/date={day}/_SUCCESS").write_bytes(b"")
    return df


def _objects(url: str) -> dict[str, tuple[int, str]]:
    """Every object under ``url``: key -> (size, ETag)."""
    loc = storage.location(url)
    assert isinstance(loc, storage.RemotePath)
    loc.fs.invalidate_cache()
    if not loc.exists():
        return {}
    return {k: (int(v["size"]), str(v.get("ETag"))) for k, v in loc.files().items()}


def _text(url: str) -> str:
    return storage.location(url).read_text()


@pytest.mark.slow
def test_scheduled_flow_on_s3(
    s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    b = f"s3://{s3_bucket}"
    src, models, scores = f"{b}/in", f"{b}/models", f"{b}/scores"
    frames = {
        day: _partition(tmp_path, src, day, seed, bad=day == DAYS[1])
        for seed, day in enumerate(DAYS[:3])
    }
    kw = {"input": src, "models": models, "chunk_rows": 200, **LOCAL}

    first = scheduled_clustering(until=DAYS[0], **kw)
    assert first["published"] == {DAYS[0]: "v1"} and first["rejected"] == {}
    assert first["latest"] == f"{models}/v1"
    assert _text(f"{models}/LATEST").strip() == "v1"
    manifest = json.loads(_text(f"{models}/v1/{outputs.MANIFEST}"))
    listed = set(manifest["objects"])
    assert {"version.json", "run.json", "clusters.parquet", "model/model.json"} <= listed
    # nothing of the refit's scratch (its run prefix, the dataset store) is in the version
    assert not any(k.startswith(("run/", "datasets/")) for k in _objects(f"{models}/v1"))
    v1 = load_model(f"{models}/v1/model")
    version = json.loads(_text(f"{models}/v1/version.json"))
    assert version["window"] == [DAYS[0]] and version["warm_start"] is None
    assert version["n_rows"] == 400
    # the fingerprint: the partition's objects with their size and ETag
    fp = {rel: (size, stamp) for rel, size, stamp in version["fingerprint"]}
    assert set(fp) == {"part-0.parquet", "_SUCCESS"}
    assert fp["part-0.parquet"] == _objects(f"{src}/date={DAYS[0]}/part-0.parquet")["."]
    for name in ("version.json", "run.json"):
        assert "testing" not in _text(f"{models}/v1/{name}")  # no credential recorded
    assert _objects(scores) == {}  # nothing to score day 1 with

    second = scheduled_clustering(until=DAYS[1], **kw)
    assert second["published"] == {} and second["skipped"] == [DAYS[0]]
    msg = second["rejected"][DAYS[1]]
    assert "column 'shop': row 17 has category 'harbour'" in msg
    assert f"{src}/date={DAYS[1]}/part-0.parquet" in msg
    # the published model stays the last good one; nothing of the bad day is left
    assert _text(f"{models}/LATEST").strip() == "v1"
    tops = {k.split("/")[0] for k in _objects(models)}
    assert tops == {"LATEST", "rejected", "v1"}
    rec = json.loads(_text(f"{models}/rejected/date={DAYS[1]}.json"))
    assert rec["error"] == msg and rec["partition"] == f"{src}/date={DAYS[1]}"
    assert not outputs.committed(storage.location(f"{scores}/date={DAYS[1]}"))

    third = scheduled_clustering(**kw)
    assert third["published"] == {DAYS[2]: "v2"} and third["skipped"] == DAYS[:2]
    assert _text(f"{models}/LATEST").strip() == "v2"
    version = json.loads(_text(f"{models}/v2/version.json"))
    assert version["warm_start"] == "v1" and version["window"] == [DAYS[0], DAYS[2]]
    assert version["n_rows"] == 800
    run = json.loads(_text(f"{models}/v2/run.json"))
    assert run["init"]["init"] == "warm"
    assert run["parameters"]["warm_start"] == f"{models}/v1/model"
    # day 3 was scored with v1, the model published when it arrived
    scored = storage.location(f"{scores}/date={DAYS[2]}")
    assert outputs.committed(scored)
    np.testing.assert_array_equal(
        zarr.open_array(f"{scored}/labels.zarr/log_density", mode="r")[:],
        v1.score_samples(frames[DAYS[2]]),
    )
    np.testing.assert_array_equal(
        load_model(f"{models}/v1/model").cluster_stats_, v1.cluster_stats_
    )

    # a publish interrupted after the version's manifest, before the pointer: v3 is complete
    # and visible, LATEST stays on v2 until the next run completes the switch
    frames[DAYS[3]] = _partition(tmp_path, src, DAYS[3], 3)

    advance = schedule.Registry.advance

    def crash(self: schedule.Registry, n: int) -> bool:
        if n == 3:
            raise KeyboardInterrupt("killed before the pointer")
        return advance(self, n)

    with monkeypatch.context() as m:
        m.setattr(schedule.Registry, "advance", crash)
        with pytest.raises(KeyboardInterrupt):
            scheduled_clustering(**kw)
    assert _text(f"{models}/LATEST").strip() == "v2"
    assert outputs.committed(storage.location(f"{models}/v3"))
    reg = schedule.Registry(models)
    assert reg.versions() == [1, 2, 3] and reg.latest() == storage.location(f"{models}/v2")

    # a half-written version (objects, no manifest) is no version
    storage.location(f"{models}/v4/model/model.json").write_text("{")
    assert reg.versions() == [1, 2, 3]

    fourth = scheduled_clustering(**kw)
    assert fourth["published"] == {} and fourth["skipped"] == DAYS
    assert fourth["latest"] == f"{models}/v3"
    assert _text(f"{models}/LATEST").strip() == "v3"
    assert json.loads(_text(f"{models}/v3/version.json"))["warm_start"] == "v2"

    # a rerun for days already done changes nothing, here through ``dpmm serve --once``
    before = (_objects(models), _objects(scores), _objects(src))
    capfd.readouterr()
    argv = ["serve", src, "--models", models, "--once", "--workers", "1"]
    assert main(argv) == 0, capfd.readouterr().err
    assert (_objects(models), _objects(scores), _objects(src)) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["serve", "s3://no-such-bucket-x/in", "--models", "{b}/models"],
            "INPUT s3://no-such-bucket-x/in: the bucket 'no-such-bucket-x' does not exist",
        ),
        (
            ["serve", "{b}/in", "--models", "s3://no-such-bucket-x/models"],
            "--models s3://no-such-bucket-x/models: the bucket 'no-such-bucket-x' does not exist",
        ),
        (
            ["serve", "{b}/in", "--models", "{b}/models", "--once"],
            "{b}/in: holds no date=YYYY-MM-DD partitions",
        ),
        (
            ["serve", "{b}/missing", "--models", "{b}/models", "--once"],
            "{b}/missing: no such input prefix of date=YYYY-MM-DD partitions",
        ),
    ],
)
def test_serve_bad_urls_exit_2_with_one_line(
    s3_bucket: str, argv: list[str], message: str, capfd
) -> None:
    b = f"s3://{s3_bucket}"
    storage.location(f"{b}/in/date=x/part-0.parquet").write_bytes(b"not a partition")
    before = _objects(b)
    capfd.readouterr()
    code = main([a.format(b=b) for a in argv])
    lines = capfd.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"dpmm: error: {message.format(b=b)}"), lines
    assert _objects(b) == before


def test_serve_refuses_a_pointer_to_no_version(s3_bucket: str, capfd) -> None:
    b = f"s3://{s3_bucket}"
    storage.location(f"{b}/in/date=2026-01-01/part-0.parquet").write_bytes(b"x")
    storage.location(f"{b}/models/v2/model/model.json").write_bytes(b"{}")  # no manifest
    storage.location(f"{b}/models/LATEST").write_text("v2\n")
    before = _objects(b)
    capfd.readouterr()
    assert main(["serve", f"{b}/in", "--models", f"{b}/models", "--once"]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert lines == [f"dpmm: error: {b}/models/LATEST: names 'v2', not a published version"]
    assert _objects(b) == before


def test_serve_deployment_takes_urls() -> None:
    from flows.cli import build_parser
    from flows.cli import serve as cli_serve

    argv = ["serve", "s3://b/in", "--models", "s3://b/models", "--scores", "s3://b/scores"]
    dep = cli_serve.deployment(build_parser().parse_args(argv))
    assert dep.parameters["input"] == "s3://b/in"
    assert dep.parameters["models"] == "s3://b/models"
    assert dep.parameters["scores"] == "s3://b/scores"
    # one run at a time (concurrent runs are safe, but would refit the same days twice)
    assert dep.concurrency_limit == 1
