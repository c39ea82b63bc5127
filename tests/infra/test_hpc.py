"""``dpmm run --cluster slurm|pbs``: the dask-jobqueue cluster built from a config file, checked
through the job script it would submit (``cluster.job_script()``); no batch system needed (runs
on a real SLURM: ``test_slurm.py``)."""

from __future__ import annotations

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


@pytest.mark.parametrize("command", ["run", "cv"])
def test_cluster_option_pairs(tmp_path: Path, capsys, command: str):
    """Every command that runs a flow takes --cluster (``dpmm cv`` too): a bad pair is one line,
    exit 2, before anything is written."""
    inp = tmp_path / "in.csv"
    inp.write_text("a,b\n1,2\n3,4\n")
    base = [command, str(inp), "--out", str(tmp_path / "out")]
    for extra, message in (
        (["--cluster", "pbs"], "needs --cluster-config"),
        (["--cluster-config", str(tmp_path / "x.yaml")], "only with --cluster slurm or pbs"),
        (["--cluster", "slurm", "--cluster-config", str(tmp_path / "x.yaml")], "no such file"),
    ):
        code = main([*base, *extra])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
