"""``dpmm run --cluster slurm|pbs``: the dask-jobqueue cluster built from a config file, checked
through the job script it would submit (``cluster.job_script()``); no batch system needed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from flows.cli import main
from pipeline.distributed.hpc import allowed_keys, open_cluster, read_config

SLURM = """
cores: 8
memory: 32GiB
queue: compute
account: proj42
walltime: "02:30:00"
job_extra_directives: ["--exclusive", "--constraint=avx2"]
job_script_prologue: ["module load python/3.11"]
jobs: 3
"""

PBS = """
cores: 4
memory: 16GB
queue: workq
walltime: "01:00:00"
resource_spec: select=1:ncpus=4:mem=16GB
job_extra_directives: ["-j oe"]
"""


def worker_command(script: str) -> list[str]:
    """The worker's command line: the script's last non-comment line."""
    lines = [ln for ln in script.splitlines() if ln.strip() and not ln.startswith("#")]
    return shlex.split(lines[-1])


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_slurm_job_script(tmp_path: Path):
    cfg = tmp_path / "slurm.yaml"
    cfg.write_text(SLURM + f"shared_temp_directory: {tmp_path}\n")
    with open_cluster("slurm", cfg, warm=["kmeans"]) as cluster:
        script = cluster.job_script()
        address = cluster.scheduler_address
        # the scheduler (in this process) batches its messages to the workers briefly
        plugins = set(cluster.scheduler.plugins)
    assert "dpmm-short-batches" in plugins
    directives = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    for expected in (
        "#SBATCH -p compute",
        "#SBATCH -A proj42",
        "#SBATCH -t 02:30:00",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=32G",  # jobqueue rounds to the batch system's unit (34.4e9 bytes)
        "#SBATCH --exclusive",
        "#SBATCH --constraint=avx2",
    ):
        assert expected in directives, (expected, directives)
    assert "module load python/3.11" in script
    assert "export DPMM_WARM_ENGINES=kmeans" in script
    argv = worker_command(script)
    # one single-threaded worker process per core, each loading the kernels at start
    assert option(argv, "--nworkers") == "8" and option(argv, "--nthreads") == "1"
    assert option(argv, "--preload") == "pipeline.distributed.worker_setup"
    assert "--nanny" in argv and address in argv
    # the prologue runs before the worker starts
    assert script.index("module load") < script.index("--preload")


def test_pbs_job_script(tmp_path: Path):
    cfg = tmp_path / "pbs.yaml"
    cfg.write_text(PBS + f"shared_temp_directory: {tmp_path}\n")
    with open_cluster("pbs", cfg) as cluster:
        script = cluster.job_script()
    directives = [ln for ln in script.splitlines() if ln.startswith("#PBS")]
    for expected in (
        "#PBS -q workq",
        "#PBS -l select=1:ncpus=4:mem=16GB",
        "#PBS -l walltime=01:00:00",
        "#PBS -j oe",
    ):
        assert expected in directives, (expected, directives)
    argv = worker_command(script)
    assert option(argv, "--nworkers") == "4" and option(argv, "--nthreads") == "1"
    assert option(argv, "--preload") == "pipeline.distributed.worker_setup"
    assert "DPMM_WARM_ENGINES" not in script  # no engine named: the worker warms them all


def test_own_keys_and_processes(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "cores: 6\nmemory: 12GB\nprocesses: 2\nworker_extra_args: ['--lifetime', '1h']\n"
        "security: false\n"
    )
    with open_cluster("slurm", cfg) as cluster:
        argv = worker_command(cluster.job_script())
    assert option(argv, "--nworkers") == "2" and option(argv, "--nthreads") == "3"
    assert option(argv, "--lifetime") == "1h" and argv.count("--preload") == 1
    # security: false: plain TCP
    assert argv[argv.index("distributed.cli.dask_worker") + 1].startswith("tcp://")
    assert "--tls-ca-file" not in argv
    assert {"cores", "memory", "queue", "walltime", "job_extra_directives", "jobs"} <= set(
        allowed_keys("slurm")
    )


def test_tls_by_default(tmp_path: Path):
    """The scheduler listens on the batch system's network: TLS with this run's certificates,
    handed to the workers through shared_temp_directory; the run's own client joins with the
    client certificate (the flow's ``Client(address)`` finds it in Dask's configuration), a
    client of another authority is turned away."""
    import dask
    from distributed import Client
    from distributed.security import Security

    from pipeline.distributed.hpc import client_tls_config

    cfg = tmp_path / "c.yaml"
    shared = tmp_path / "shared"
    shared.mkdir()
    cfg.write_text(f"cores: 2\nmemory: 4GB\nshared_temp_directory: {shared}\n")
    with open_cluster("slurm", cfg) as cluster:
        address = cluster.scheduler_address
        argv = worker_command(cluster.job_script())
        assert address.startswith("tls://") and address in argv
        for opt in ("--tls-ca-file", "--tls-cert", "--tls-key"):
            f = Path(option(argv, opt))
            assert f.parent.parent == shared and f.parent.stat().st_mode & 0o077 == 0
            assert f.read_text().startswith("-----BEGIN"), opt
        with dask.config.set(client_tls_config(cluster)), Client(address, timeout=30) as c:
            assert c.scheduler_info()["address"] == address
        # a client with certificates of another authority is turned away
        other = Security.temporary()
        with pytest.raises((OSError, TimeoutError)), Client(address, security=other, timeout=3):
            pass
    assert not list(shared.iterdir())  # the workers' copies of the credentials are removed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cores: 4\nmemory: 8GB\nqueu: x\n", "unknown key 'queu'"),
        ("cores: 4\nmemory: 8GB\njob_extra: ['-x']\n", "use 'job_extra_directives'"),
        ("memory: 8GB\n", "'cores' is required"),
        ("cores: 0\nmemory: 8GB\n", "'cores' must be a positive integer"),
        ("cores: 4\nmemory: 8GB\njobs: two\n", "'jobs' must be a positive integer"),
        ("cores: 4\nmemory: 8GB\njob_extra_directives: --exclusive\n", "list of strings"),
        ("- cores\n", "expected a mapping"),
        ("cores: [4\n", "not YAML"),
    ],
)
def test_bad_configs_are_one_line(tmp_path: Path, text: str, message: str, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        read_config("slurm", cfg)
    inp = tmp_path / "in.csv"
    inp.write_text("a,b\n1,2\n3,4\n")
    argv = ["run", str(inp), "--out", str(tmp_path / "out"), "--cluster", "slurm"]
    code = main([*argv, "--cluster-config", str(cfg)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_cluster_option_pairs(tmp_path: Path, capsys):
    inp = tmp_path / "in.csv"
    inp.write_text("a,b\n1,2\n3,4\n")
    base = ["run", str(inp), "--out", str(tmp_path / "out")]
    for extra, message in (
        (["--cluster", "pbs"], "needs --cluster-config"),
        (["--cluster-config", str(tmp_path / "x.yaml")], "only with --cluster slurm or pbs"),
        (["--cluster", "slurm", "--cluster-config", str(tmp_path / "x.yaml")], "no such file"),
    ):
        code = main([*base, *extra])
        err = capsys.readouterr().err
        assert code == 2 and message in err, err


SBATCH = """#!/bin/sh
# stand-in for SLURM's sbatch on a machine without SLURM: runs the job script here, in the
# background, in a session of its own (the job id), as a one-node allocation would
set -e
job_dir="$(dirname "$0")/jobs"
mkdir -p "$job_dir"
cp "$1" "$job_dir/submitted.sh"
setsid sh "$job_dir/submitted.sh" > "$job_dir/job.log" 2>&1 < /dev/null &
echo "Submitted batch job $!"
"""

SCANCEL = """#!/bin/sh
# stand-in for scancel: ends the job's session
kill -TERM -- "-$1" 2>/dev/null || true
"""


@pytest.mark.slow
def test_dpmm_run_on_slurm_jobs(tmp_path: Path):
    """``dpmm run --cluster slurm``: the job script the cluster submits really starts the
    workers (here through a stand-in ``sbatch`` that runs it on this machine), they join the
    scheduler over TLS, the flow runs on them, and the jobs and credentials are gone after."""
    import os
    import subprocess
    import sys
    import time

    import numpy as np
    import pandas as pd
    import psutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", SBATCH), ("scancel", SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    cfg = tmp_path / "slurm.yaml"
    cfg.write_text(
        "cores: 1\nmemory: 2GB\nwalltime: '00:20:00'\ninterface: lo\n"
        f"shared_temp_directory: {shared}\njobs: 1\n"
    )
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 600)
    X = 12.0 * np.eye(3)[y] + rng.normal(size=(600, 3))
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["truth"] = y
    df.to_csv(tmp_path / "in.csv", index=False)
    exe = Path(sys.executable).with_name("dpmm")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flows.cli"]
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
    }
    argv = ["run", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out"), "--chunk-rows", "200"]
    argv += ["--label-column", "truth", "--no-report", "--quiet"]
    proc = subprocess.run(
        [*cmd, *argv, "--cluster", "slurm", "--cluster-config", str(cfg)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    log = (tmp_path / "bin" / "jobs" / "job.log").read_text()
    assert proc.returncode == 0, proc.stderr + "\n--- job log ---\n" + log
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["metrics"]["nmi"] > 0.95, run["metrics"]
    script = (tmp_path / "bin" / "jobs" / "submitted.sh").read_text()
    assert (
        "#SBATCH -t 00:20:00" in script and "--tls-cert" in script and "tls://127.0.0.1:" in script
    )
    # the run cancelled its job (scancel) and removed the workers' credentials
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(
        "distributed.cli.dask_worker" in " ".join(p.info["cmdline"] or [])
        and str(shared) in " ".join(p.info["cmdline"] or [])
        for p in psutil.process_iter(["cmdline"])
    ):
        time.sleep(0.5)
    assert not any(
        str(shared) in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
    )
    assert not list(shared.iterdir())
