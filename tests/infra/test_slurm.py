"""``dpmm run`` and ``dpmm cv --cluster slurm`` on a real single-node SLURM (the ``slurm``
fixture): the workers are batch jobs ``sbatch`` submitted; the labels, and the cell ``cv``
chooses, are the local cluster's, also when a job is cancelled (``scancel``) in the middle of a
pass or reaches its walltime there (the run submits a job in its place)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import zarr

from flows.cli import main
from pipeline.distributed import loop

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm", "prefect_harness")]

RUN = ["--chunk-rows", "1000", "--seed", "3", "--no-report", "--quiet", "--init", "sequential"]


def labels_of(out: Path) -> np.ndarray:
    return np.asarray(zarr.open_array(str(out / "labels.zarr" / "label"), mode="r")[:])


def config(tmp: Path, name: str, jobs: int, walltime: str = "00:10:00") -> Path:
    """A cluster config of one-core jobs named ``name`` on this machine's loopback."""
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(
        f"cores: 1\nmemory: 1GB\nwalltime: '{walltime}'\ninterface: lo\njob_name: {name}\n"
        f"shared_temp_directory: {tmp}\njobs: {jobs}\n"
    )
    return cfg


def jobs_named(name: str) -> dict[str, str]:
    """The batch system's jobs called ``name``: id -> state (finished ones included)."""
    proc = subprocess.run(
        ["squeue", "-h", "-t", "all", "-n", name, "-o", "%i %T"],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(line.split() for line in proc.stdout.splitlines())


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)
    return got


def dpmm(argv: list[str], cwd: Path) -> int:
    """``dpmm ARGV`` in this process, from ``cwd`` (where ``sbatch`` puts the jobs' logs)."""
    old = Path.cwd()
    os.chdir(cwd)
    try:
        # a pass that loses a worker says so with a warning, which the tests' filter would raise
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return main(argv)
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Seven blobs in 24,000 x 3 records and the labels of a local run of them."""
    tmp = tmp_path_factory.mktemp("slurm-data")
    rng = np.random.default_rng(7)
    means = 8.0 * np.vstack([np.zeros(3), np.eye(3), -np.eye(3)])
    y = rng.integers(0, len(means), size=24000)
    X = means[y] + rng.normal(size=(len(y), 3))
    pd.DataFrame(X, columns=["a", "b", "c"]).to_csv(tmp / "in.csv", index=False)
    ref = tmp / "ref"
    assert dpmm(["run", str(tmp / "in.csv"), "--out", str(ref), *RUN, "--threads"], tmp) == 0
    run = json.loads((ref / "run.json").read_text())
    assert run["metrics"]["passes"] >= 3
    return {"input": tmp / "in.csv", "labels": labels_of(ref), "passes": run["metrics"]["passes"]}


def run_on_slurm(data: dict[str, Any], tmp: Path, cfg: Path) -> dict[str, Any]:
    out = tmp / "out"
    argv = ["run", str(data["input"]), "--out", str(out), *RUN]
    assert dpmm([*argv, "--cluster", "slurm", "--cluster-config", str(cfg)], tmp) == 0
    run = json.loads((out / "run.json").read_text())
    np.testing.assert_array_equal(labels_of(out), data["labels"])
    assert run["metrics"]["passes"] == data["passes"]
    return run


def no_jobs_left(name: str) -> None:
    """The run cancelled its jobs, and removed the workers' credentials."""
    wait_for(
        lambda: not {"PENDING", "RUNNING", "COMPLETING"} & set(jobs_named(name).values()),
        60,
        f"jobs {name} still queued or running: {jobs_named(name)}",
    )


def test_run_on_slurm_gives_the_local_labels(data: dict[str, Any], tmp_path: Path) -> None:
    run_on_slurm(data, tmp_path, config(tmp_path, "dpmm-plain", jobs=2))
    assert len(jobs_named("dpmm-plain")) == 2
    no_jobs_left("dpmm-plain")
    assert not list(tmp_path.glob(".dpmm-tls-*"))
    # the jobs' own logs: two workers over TLS, at least one joined (the run starts with the
    # first worker, and a short one may end before the second job's worker registers)
    logs = [p.read_text() for p in tmp_path.glob("slurm-*.out")]
    assert len(logs) == 2 and all("tls://" in t for t in logs), logs
    assert any("Registered to: " in t and "tls://" in t for t in logs), logs


def job_processes(job: str) -> list[Any]:
    import psutil

    procs = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SLURM_JOB_ID") == job:
                procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return procs


@pytest.mark.parametrize("fault", ["scancel", "walltime"])
def test_a_job_lost_mid_pass_gives_the_local_labels(
    data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Once pass 2 runs a chunk on a job's worker, that job is cancelled (``scancel``; the other
    job carries on), or (one job) stopped until SLURM ends it at its walltime of one minute; the
    run submits a job in its place and finishes with the undisturbed labels. Where pass 2 ends
    before a poll sees one of its chunks run (a quiet machine, a warm cache: the whole run takes
    seconds), the fault lands as it ends, before pass 3, so that it always lands."""
    name = f"dpmm-{fault}"
    cfg = config(tmp_path, name, *((2, "00:10:00") if fault == "scancel" else (1, "00:01:00")))
    lost: list[str] = []
    errors: list[BaseException] = []
    once = threading.Lock()
    run_passes = loop.run_passes

    def deliver(job: str) -> None:
        with once:
            if lost:
                return
            if fault == "scancel":
                subprocess.run(["scancel", job], check=True)
            else:
                for p in job_processes(job):
                    p.send_signal(signal.SIGSTOP)
            lost.append(job)

    def disturb(client: Any, jobs: dict[str, str]) -> None:
        def busy() -> str | None:
            if lost:
                return "delivered"
            for addr, keys in client.processing().items():
                if addr in jobs and any(str(k).startswith("chunk_task") for k in keys):
                    return str(jobs[addr])
            return None

        deliver(wait_for(busy, 120, "no worker ran a chunk of pass 2"))

    def passes_disturbed(client: Any, *args: Any, on_pass: Any = None, **kwargs: Any) -> Any:
        jobs: dict[str, str] = {}

        def after(state: Any) -> None:
            if on_pass is not None:
                on_pass(state)
            if state.pass_no == 1:
                jobs.update(client.run(lambda: os.environ["SLURM_JOB_ID"]))

                def guarded() -> None:
                    try:
                        disturb(client, jobs)
                    except BaseException as err:
                        errors.append(err)

                threading.Thread(target=guarded, daemon=True).start()
            elif not lost:
                deliver(str(next(iter(jobs.values()))))

        return run_passes(client, *args, on_pass=after, **kwargs)

    monkeypatch.setattr(loop, "run_passes", passes_disturbed)
    run_on_slurm(data, tmp_path, cfg)
    assert not errors, errors
    states = jobs_named(name)
    assert len(lost) == 1 and states[lost[0]] == ("CANCELLED" if fault == "scancel" else "TIMEOUT")
    if fault == "walltime":
        assert len(states) == 2, states  # the job in its place, without which no run ends
    no_jobs_left(name)


def test_cv_on_slurm_chooses_the_local_cell(tmp_path: Path) -> None:
    from flows.cv import run_cv_flow

    rng = np.random.default_rng(0)
    y = np.arange(240) % 3
    X = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])[y] + rng.normal(size=(240, 2))
    src = str(tmp_path / "in.csv")
    pd.DataFrame(X, columns=["a", "b"]).to_csv(src, index=False)
    grid = {"alphas": [0.1, 3.0], "scales": [0.3, 0.05], "families": ["gaussian"], "n_folds": 3}
    # the local cluster: threads of this process
    run_cv_flow(input=src, out=str(tmp_path / "local"), processes=False, progress=False, **grid)
    argv = ["cv", src, "--out", str(tmp_path / "slurm"), "--alpha", "0.1,3", "--prior-scale"]
    argv += ["0.3,0.05", "--family", "gaussian", "--folds", "3", "--quiet", "--cluster", "slurm"]
    assert dpmm([*argv, "--cluster-config", str(config(tmp_path, "dpmm-cv", 2))], tmp_path) == 0
    local, slurm = (pd.read_parquet(tmp_path / w / "cv.parquet") for w in ("local", "slurm"))
    assert local["chosen"].sum() == 1
    pd.testing.assert_series_equal(local["chosen"], slurm["chosen"])
    np.testing.assert_allclose(local["mean_log_density"], slurm["mean_log_density"], rtol=1e-12)
    assert len(jobs_named("dpmm-cv")) == 2
    no_jobs_left("dpmm-cv")
