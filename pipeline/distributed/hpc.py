"""A Dask cluster of batch jobs on an HPC system (``dpmm run --cluster slurm|pbs
--cluster-config FILE``), built by dask-jobqueue.

The config file is YAML with dask-jobqueue's own keys (``SLURMCluster`` / ``PBSCluster``), for
example::

    cores: 32              # cores per job: one single-threaded worker process each
    memory: 120GiB         # memory per job, shared by its worker processes
    queue: normal
    walltime: "04:00:00"
    account: proj123       # SLURM account / PBS project
    job_extra_directives: ["--exclusive"]
    job_script_prologue: ["module load python/3.11", "source /opt/dpmm/.venv/bin/activate"]
    interface: ib0         # the network the compute nodes reach the scheduler on
    shared_temp_directory: /scratch/me/dask   # seen by the login and the compute nodes
    jobs: 4                # this pipeline's key: how many jobs to submit (default 1)

Every job runs ``processes`` single-threaded worker processes (default one per core) with the
preload ``pipeline.distributed.worker_setup``. The scheduler runs in the ``dpmm`` process with
``pipeline.distributed.scheduler_setup`` and listens on ``interface``, not 127.0.0.1, so by
default the cluster speaks TLS (``security: true``: temporary certificates in
``shared_temp_directory``, which the compute nodes must see, removed when the cluster closes;
``hpc_client`` joins with the client's); ``security: false`` turns it off on a trusted network.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KINDS = ("slurm", "pbs")
#: keys of the config file that are this pipeline's, not dask-jobqueue's
OWN_KEYS = ("jobs",)
#: dask-jobqueue's deprecated spellings, refused with the key to use instead
DEPRECATED = {
    "extra": "worker_extra_args",
    "job_extra": "job_extra_directives",
    "env_extra": "job_script_prologue",
}
_NOT_CONFIG = {"self", "scheduler", "name", "config_name", "base_class_kwargs"}
PRELOAD = "pipeline.distributed.worker_setup"


def _classes(kind: str) -> tuple[Any, Any]:
    if kind == "slurm":
        from dask_jobqueue import SLURMCluster
        from dask_jobqueue.slurm import SLURMJob

        return SLURMCluster, SLURMJob
    if kind == "pbs":
        from dask_jobqueue import PBSCluster
        from dask_jobqueue.pbs import PBSJob

        return PBSCluster, PBSJob
    raise ValueError(f"--cluster {kind!r}: expected one of {', '.join(KINDS)}")


def allowed_keys(kind: str) -> list[str]:
    """The keys a config file of ``kind`` may hold: the job class's keyword arguments and the
    cluster's ``scheduler_options``, plus ``OWN_KEYS``."""
    _, job_cls = _classes(kind)
    keys = set(OWN_KEYS) | {"scheduler_options", "shared_temp_directory"}
    for cls in job_cls.__mro__:
        if "__init__" in vars(cls):
            keys |= set(inspect.signature(cls.__init__).parameters)
    return sorted(keys - _NOT_CONFIG - set(DEPRECATED))


def read_config(kind: str, path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked config of ``path`` (``ValueError`` naming the file and an unknown key)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"--cluster-config {p}: no such file") from None
    except OSError as err:
        raise ValueError(f"--cluster-config {p}: cannot be read ({err.strerror})") from None
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"--cluster-config {p}: not YAML ({' '.join(str(err).split())})") from None
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise ValueError(
            f"--cluster-config {p}: expected a mapping of keys, got {type(cfg).__name__}"
        )
    allowed = allowed_keys(kind)
    for key in cfg:
        if key in DEPRECATED:
            raise ValueError(
                f"--cluster-config {p}: key {key!r} is deprecated in dask-jobqueue; use "
                f"{DEPRECATED[key]!r}"
            )
        if key not in allowed:
            raise ValueError(
                f"--cluster-config {p}: unknown key {key!r} for --cluster {kind}; known keys: "
                f"{', '.join(allowed)}"
            )
    for key in ("cores", "memory"):
        if cfg.get(key) in (None, ""):
            raise ValueError(f"--cluster-config {p}: {key!r} is required (per job)")
    cores = cfg["cores"]
    if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1:
        raise ValueError(f"--cluster-config {p}: 'cores' must be a positive integer, got {cores!r}")
    jobs = cfg.get("jobs", 1)
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"--cluster-config {p}: 'jobs' must be a positive integer, got {jobs!r}")
    for key in ("job_extra_directives", "job_script_prologue", "worker_extra_args"):
        if key in cfg and not (
            isinstance(cfg[key], list) and all(isinstance(v, str) for v in cfg[key])
        ):
            raise ValueError(f"--cluster-config {p}: {key!r} must be a list of strings")
    return cfg


def cluster_kwargs(cfg: dict[str, Any], warm: list[str] | None = None) -> dict[str, Any]:
    """The jobqueue cluster's keyword arguments for the checked config ``cfg``: single-threaded
    workers, one per core by default, the preload, the engines to warm, a local dashboard."""
    from pipeline.distributed import scheduler_setup

    kw = {k: v for k, v in cfg.items() if k not in OWN_KEYS}
    kw.setdefault("processes", int(cfg["cores"]))
    # the scheduler listens on the batch system's network: TLS unless the config turns it off
    kw.setdefault("security", True)
    if kw["security"] is True:
        # where the workers' certificates go (open_cluster makes a private directory there)
        kw.setdefault("shared_temp_directory", os.getcwd())
    elif kw["security"] is False:
        kw["security"] = None  # dask-jobqueue's "no TLS"
    extra = list(kw.get("worker_extra_args") or [])
    if PRELOAD not in extra:
        extra += ["--preload", PRELOAD]
    kw["worker_extra_args"] = extra
    if warm:
        from pipeline.distributed.worker_setup import WARM_ENV

        kw["job_script_prologue"] = [
            *(kw.get("job_script_prologue") or []),
            f"export {WARM_ENV}={','.join(warm)}",
        ]
    # the workers reach the scheduler over the network; the dashboard stays on this machine
    kw["scheduler_options"] = {
        "dashboard_address": "127.0.0.1:8787",
        **(kw.get("scheduler_options") or {}),
    }
    # scheduler_setup's shorter message batches (the scheduler runs in this process)
    preload = list(kw["scheduler_options"].get("preload") or [])
    if scheduler_setup.PRELOAD not in preload:
        kw["scheduler_options"]["preload"] = [*preload, scheduler_setup.PRELOAD]
    return kw


@contextlib.contextmanager
def open_cluster(
    kind: str, path: str | os.PathLike[str], warm: list[str] | None = None
) -> Iterator[Any]:
    """A ``SLURMCluster`` / ``PBSCluster`` from the config file ``path``, not yet scaled; with TLS
    the workers' credentials go to a new private directory under ``shared_temp_directory``,
    removed with the cluster."""
    import shutil
    import tempfile

    kw = cluster_kwargs(read_config(kind, path), warm)
    cluster_cls, _ = _classes(kind)
    private = None
    if kw.get("security") is True:
        private = tempfile.mkdtemp(prefix=".dpmm-tls-", dir=kw["shared_temp_directory"])
        kw["shared_temp_directory"] = private
    try:
        cluster = cluster_cls(**kw)
        try:
            yield cluster
        finally:
            cluster.close()
            names = ("_job_ca_file", "_job_cert", "_job_key")  # dask-jobqueue's credential files
            for f in [v for k, v in vars(cluster).items() if k in names]:
                f.close()  # removed now: at exit, after the directory, they would each complain
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


@contextlib.contextmanager
def hpc_client(
    kind: str, path: str | os.PathLike[str], warm: list[str] | None = None
) -> Iterator[Any]:
    """A client of the jobqueue cluster of ``path``, its jobs cancelled when the block ends and
    replaced (``replace_ended_jobs``) when they end before."""
    import dask
    from distributed import Client
    from tornado.ioloop import PeriodicCallback

    from pipeline.distributed.scheduler_setup import short_batches

    with open_cluster(kind, path, warm) as cluster:
        cluster.scale(jobs=int(read_config(kind, path).get("jobs", 1)))
        joined: set[str] = set()
        keep = PeriodicCallback(lambda: replace_ended_jobs(cluster, joined), 2000)
        cluster.periodic_callbacks["dpmm-replace-jobs"] = keep  # stopped with the cluster
        cluster.loop.add_callback(keep.start)
        # the flow's own client finds the credentials in Dask's configuration
        with dask.config.set(client_tls_config(cluster)), Client(cluster) as client:
            short_batches(getattr(client, "scheduler_comm", None))
            yield client


async def replace_ended_jobs(cluster: Any, joined: set[str]) -> None:
    """Submit a job in place of each of ``cluster``'s jobs whose workers all joined and then all
    left the scheduler: one that reached its walltime, was preempted or cancelled (dask-jobqueue
    replaces none). ``joined``: the jobs seen with a worker, kept between calls."""
    names = {w["name"] for w in cluster.scheduler_info.get("workers", {}).values()}
    for job, spec in list(cluster.worker_spec.items()):
        if {f"{job}{s}" for s in spec.get("group", [""])} & names:
            joined.add(job)
        elif job in joined:
            # a new name: SpecCluster cancels the old name's job if not joined 15 s after it left
            cluster.worker_spec.update(cluster.new_worker_spec())
            del cluster.worker_spec[job]
            joined.discard(job)
            if (gone := cluster.workers.pop(job, None)) is not None:
                await gone.close()  # the batch system's cancel, should it still hold the job
            cluster.scale(jobs=len(cluster.worker_spec))


def client_tls_config(cluster: Any) -> dict[str, Any]:
    """Dask configuration (``distributed.comm.tls.*``) under which a ``Client(address)`` joins
    ``cluster`` with its client certificate; empty when the cluster does not use TLS."""
    security = getattr(cluster, "security", None)
    if security is None or not security.require_encryption:
        return {}
    tls = security.get_tls_config_for_role("client")
    return {
        "distributed.comm.require-encryption": True,
        "distributed.comm.tls.ca-file": tls["ca_file"],
        "distributed.comm.tls.client.cert": tls["cert"],
        "distributed.comm.tls.client.key": tls["key"],
    }
