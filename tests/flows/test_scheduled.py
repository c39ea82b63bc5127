"""The ``scheduled-clustering`` flow over dated partitions: v1 then v2 (warm-started, rolling
window), a bad partition in between reported and skipped, a rerun that changes nothing; the
``dpmm serve`` deployment and ``infra/prefect.yaml``'s."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr

from flows.cli import build_parser, main
from flows.cli import serve as cli_serve
from flows.scheduled import CRON, DEPLOYMENT, scheduled_clustering
from pipeline.estimators.model import load_model
from pipeline.ops import schedule
from tests.flows.test_run_model import write_mixed

REPO = Path(__file__).resolve().parents[2]
LOCAL = {"processes": False, "n_workers": 2, "dashboard_address": None, "progress": False}
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]


pytestmark = pytest.mark.usefixtures("prefect_harness")


def _partition(root: Path, day: str, seed: int, bad: bool = False) -> None:
    d = root / f"date={day}"
    d.mkdir(parents=True)
    df = write_mixed(d.parent / f".{day}.csv", 600, seed)
    (d.parent / f".{day}.csv").unlink()
    if bad:
        df.loc[17, "shop"] = "harbour"  # a shop the model never saw
    df.to_parquet(d / "part-0.parquet")


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _listed(models: Path) -> list[str]:
    """What MODELS shows: the writers' places in progress are hidden."""
    return sorted(p.name for p in models.iterdir() if not p.name.startswith("."))


def test_two_days_a_bad_one_between_and_a_rerun(tmp_path: Path) -> None:
    src = tmp_path / "in"
    for seed, day in enumerate(DAYS):
        _partition(src, day, seed, bad=day == "2026-01-02")
    models, scores = tmp_path / "models", tmp_path / "scores"
    kw = {"input": str(src), "models": str(models), "chunk_rows": 200, **LOCAL}

    first = scheduled_clustering(until=DAYS[0], **kw)
    assert first["published"] == {DAYS[0]: "v1"} and first["rejected"] == {}
    assert (models / "LATEST").read_text().strip() == "v1"
    v1 = load_model(models / "v1" / "model")
    assert not scores.exists()  # nothing to score day 1 with

    second = scheduled_clustering(until=DAYS[1], **kw)
    assert second["published"] == {} and second["skipped"] == [DAYS[0]]
    assert "column 'shop': row 17 has category 'harbour'" in second["rejected"][DAYS[1]]
    assert str(src / f"date={DAYS[1]}" / "part-0.parquet") in second["rejected"][DAYS[1]]
    # the published model stays the last good one; nothing of the bad day is left
    assert (models / "LATEST").read_text().strip() == "v1"
    assert _listed(models) == ["LATEST", "rejected", "v1"]
    assert not (scores / f"date={DAYS[1]}").exists()

    third = scheduled_clustering(**kw)
    assert third["published"] == {DAYS[2]: "v2"}
    assert third["skipped"] == DAYS[:2]
    assert (models / "LATEST").read_text().strip() == "v2"
    version = yaml.safe_load((models / "v2" / "version.json").read_text())
    assert version["warm_start"] == "v1" and version["window"] == [DAYS[0], DAYS[2]]
    assert version["n_rows"] == 1200
    run = yaml.safe_load((models / "v2" / "run.json").read_text())
    assert run["init"]["init"] == "warm"
    # day 3 was scored with v1, the model published when it arrived
    df3 = __import__("pandas").read_parquet(src / f"date={DAYS[2]}" / "part-0.parquet")
    np.testing.assert_array_equal(
        zarr.open_array(str(scores / f"date={DAYS[2]}" / "labels.zarr" / "log_density"))[:],
        v1.score_samples(df3),
    )
    # v1 is kept, whole
    np.testing.assert_array_equal(
        load_model(models / "v1" / "model").cluster_stats_, v1.cluster_stats_
    )
    assert _listed(models) == ["LATEST", "rejected", "v1", "v2"]

    # a publish interrupted before the pointer switch is completed by the next run
    (models / "LATEST").write_text("v1\n")
    assert schedule.Registry(models).finish_publish() == 2
    assert (models / "LATEST").read_text().strip() == "v2"
    before = _snapshot(tmp_path)
    again = scheduled_clustering(**kw)
    assert again["published"] == {} and again["rejected"] == {}
    assert again["skipped"] == DAYS
    assert _snapshot(tmp_path) == before


def test_serve_deployment_and_schedule() -> None:
    args = build_parser().parse_args(
        ["serve", "/data/in", "--models", "/data/models", "--cron", "*/5 * * * *", "--window", "3"]
    )
    dep = cli_serve.deployment(args)
    assert dep.name == DEPLOYMENT
    assert dep.flow_name == "scheduled-clustering"
    assert [s.schedule.cron for s in dep.schedules] == ["*/5 * * * *"]
    assert dep.parameters["input"] == "/data/in" and dep.parameters["window"] == 3
    assert cli_serve.CRON == CRON and cli_serve.DEPLOYMENT == DEPLOYMENT
    # every parameter is one the flow takes
    assert set(dep.parameters) <= set(inspect.signature(scheduled_clustering.fn).parameters)


def test_serve_refuses_a_bad_cron(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "in", "--models", "m", "--cron", "every day"]) == 2
    assert (
        capsys.readouterr().err.strip() == "dpmm: error: --cron 'every day': not a cron expression"
    )


@pytest.mark.parametrize("case", ["a file", "under a file", "dangling LATEST"])
def test_serve_refuses_models_it_cannot_write_or_a_dangling_pointer(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in"
    _partition(src, DAYS[0], 0)
    models = tmp_path / "models"
    if case == "a file":
        models.write_text("not a directory")
        message = f"--models {models}: cannot be written (a file, not a directory)"
    elif case == "under a file":
        models.write_text("not a directory")
        models = models / "sub"
        message = f"--models {models}: cannot be written (Not a directory)"
    else:
        (models / "v1").mkdir(parents=True)  # no version.json: not a version
        (models / "LATEST").write_text("v1\n")
        message = f"{models / 'LATEST'}: names 'v1', not a published version"
    before = _snapshot(tmp_path)
    assert main(["serve", str(src), "--models", str(models), "--once"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"dpmm: error: {message}"]
    assert _snapshot(tmp_path) == before


def test_infra_prefect_yaml_holds_the_scheduled_deployment() -> None:
    from prefect.flows import load_flow_from_entrypoint

    doc = yaml.safe_load((REPO / "infra" / "prefect.yaml").read_text())
    deps = {d["name"]: d for d in doc["deployments"]}
    dep = deps[DEPLOYMENT]
    assert [s["cron"] for s in dep["schedules"]] == [CRON]
    assert dep["concurrency_limit"] == 1  # one run at a time, as dpmm serve
    path, name = dep["entrypoint"].split(":")
    flow = load_flow_from_entrypoint(f"{REPO / path}:{name}")
    assert flow.name == "scheduled-clustering"
    assert set(dep["parameters"]) <= set(inspect.signature(flow.fn).parameters)
    # the cluster deployment still points at a real flow too
    path, name = deps["dpmm-cluster"]["entrypoint"].split(":")
    assert load_flow_from_entrypoint(f"{REPO / path}:{name}").name == "cluster"


def test_dpmm_serve_once_runs_the_flow_now(tmp_path: Path) -> None:
    src = tmp_path / "in"
    _partition(src, DAYS[0], 7)
    models = tmp_path / "models"
    argv = ["serve", str(src), "--models", str(models), "--once", "--workers", "1"]
    assert main([*argv, "--chunk-rows", "300"]) == 0
    assert (models / "LATEST").read_text().strip() == "v1"
    assert load_model(models / "v1" / "model").n_clusters_ >= 1


def test_a_partition_without_records_is_rejected_once(tmp_path: Path) -> None:
    """A partition holding only a marker (``_SUCCESS``) is rejected, not fitted on; unchanged,
    it is skipped on the next run; with records added it is tried again."""
    src = tmp_path / "in"
    (src / f"date={DAYS[0]}").mkdir(parents=True)
    (src / f"date={DAYS[0]}" / "_SUCCESS").write_bytes(b"")
    models = tmp_path / "models"
    kw = {"input": str(src), "models": str(models), "chunk_rows": 200, **LOCAL}
    first = scheduled_clustering(**kw)
    assert first["rejected"] == {
        DAYS[0]: f"{src / f'date={DAYS[0]}'}: the partition holds no records"
    }
    assert _listed(models) == ["rejected"]
    again = scheduled_clustering(**kw)
    assert again["skipped"] == [DAYS[0]] and again["rejected"] == {}
    # the records arrive: the partition's fingerprint changed, it is fitted
    df = write_mixed(tmp_path / "day.csv", 300, 0)
    df.to_parquet(src / f"date={DAYS[0]}" / "part-0.parquet")
    late = scheduled_clustering(**kw)
    assert late["published"] == {DAYS[0]: "v1"}
    assert (models / "LATEST").read_text().strip() == "v1"
