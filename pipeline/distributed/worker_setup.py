"""Dask worker preload for the ``LocalCluster`` the pipeline starts (``dask_client``).

A new worker loads the run's engine's kernels (``WARM_ENV``; unset: all) while it starts, each
warm-up step compiled by one process only when the numba cache is empty (``dpmm demo`` from an
empty cache: 25.4 s against 36.2 s); first it sets the allocator (``tune_malloc``) and slows the
event loop's health check (``scheduler_setup.slow_ticks``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pipeline.engines import warmup
from pipeline.families import ProductFamily

logger = logging.getLogger(__name__)

# comma-separated engine names whose kernels a worker loads when it starts
WARM_ENV = "DPMM_WARM_ENGINES"


def warm_stage2_bhc() -> None:
    """Load the kernels of the summaries' moments and of stage 2's BHC for the toy family, in a
    worker while another compiles the sweep rather than in the driver after stage 1."""
    from pipeline.families.stats import Stats
    from pipeline.models.bhc import fit_tree

    X, family = warmup.toy_family()
    z = (X[:, 0] > 0).astype(np.int64) * 3 + np.arange(X.shape[0]) % 3
    stats = family.stats_of(X, z, 6)
    Stats(stats, family).moments(family)
    fit_tree(stats, family.widened(), 0.0)  # as stage 2 and ``BHC`` fit it, with its bounds


# warm-up steps of a stage 2, by the name ``dask_client(warm=...)`` gives it next to the engine
STAGE2_STEPS: dict[str, Callable[[], None]] = {"bhc": warm_stage2_bhc}


def stage2_step(name: str) -> str:
    """The warm-up step (its lock's key) of stage 2 ``name``."""
    return f"stage2-{name}"


def warm_engines() -> list[str]:
    """The engines (and stage 2) a worker loads: ``WARM_ENV``'s names, else every engine."""
    from pipeline.engines import ENGINES

    names = [n.strip() for n in os.environ.get(WARM_ENV, "").split(",") if n.strip()]
    known = [n for n in names if n in ENGINES or n in STAGE2_STEPS or n in warmup.spec_kinds()]
    return known if names else list(ENGINES)


def warm_names(engines: list[str], family: ProductFamily | None) -> list[str]:
    """The warm-up list of a run of ``engines`` on records of ``family`` (None: Normal-Wishart
    only), with ``warmup.EVERY_FAMILY`` or ``warmup.NW_CELLS`` when its spec is of their type."""
    kind = [
        k for k, t in warmup.spec_kinds().items() if family is not None and family.spec.dtype == t
    ]
    return [*engines, *kind]


def warm_kernels(
    names: list[str] | None = None,
    every_product: bool = False,
    helper: bool = False,
    more_stage2: warmup.Steps | None = None,
) -> None:
    """Load every kernel a chunk task or the sample start of the engines ``names`` (default
    ``warm_engines()``) calls, and those of a stage 2 named there, for Gaussian records;
    ``every_product`` also for every other spec type (``dpmm warm``: a round each, in
    ``warmup.run_rounds``; by default every stage 2 too, which a run's driver calls, and the
    steps ``more_stage2`` in the same rounds: stage 2's tree-guided MCMC,
    ``pipeline.ops.stage2.MCMC_STEP``, which a worker never runs); ``helper``: compile, do not
    load."""
    every = every_product and not names
    names = names or warm_engines() + (list(STAGE2_STEPS) if every_product else [])
    kinds = warmup.spec_kinds()
    engines = [n for n in names if n not in kinds]
    kind = [kinds[n] for n in names if n in kinds]
    if every_product:
        steps, stage2 = _steps_of(engines)
        stage2 += more_stage2 or []
        cells = kinds[warmup.NW_CELLS]
        # stage 2 takes a cells' family widened (``warm_stage2_bhc``): the every-family round's
        warmup.run_rounds(
            [
                (t, [_OBS, _MARGINALS, *(stage2 if t != cells else []), *steps])
                for t in [None, *kinds.values()]
            ]
        )
    else:
        with warmup.toy_spec(kind[0] if kind else None):
            _warm_steps(engines, helper)
    marker = warmup.warm_marker(names, every)
    # a cache that cannot be written (an image's, read-only) has its kernels, not a marker
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


# the observation models' warm-up steps (``warmup``), which every engine's steps call
_OBS = ("observation-models", warmup.warm_observation_models)
_MARGINALS = ("observation-marginals", warmup.warm_observation_marginals)
_FACTORS = ("observation-factors", warmup.warm_observation_factors)


def _steps_of(names: list[str]) -> tuple[warmup.Steps, warmup.Steps]:
    """The warm-up steps of the engines among ``names``, and those of the stages 2 there."""
    from pipeline.engines import get_engine

    steps = [s for n in names if n not in STAGE2_STEPS for s in get_engine(n).warm_steps()]
    return steps, [(stage2_step(n), STAGE2_STEPS[n]) for n in names if n in STAGE2_STEPS]


def _warm_steps(names: list[str], helper: bool = False) -> None:
    steps, stage2 = _steps_of(names)
    load = not helper
    if not stage2:
        # every engine's sweep calls the observation models: loaded first, they are compiled
        # once; the process that finds them taken waits, then compiles the marginals or a step
        warmup.compile_once(*_OBS)
        warmup.run_steps([_MARGINALS, *steps], load)
    elif helper:
        # this process compiles the observation models and the engine's sweep and start, then
        # starts its flow; the helper takes the factors' change, the marginals, the reduce and
        # stage 2 meanwhile
        warmup.run_steps([_FACTORS, _MARGINALS, *steps[1:-1], *stage2, _OBS, *steps], load)
    else:
        # a stage 2 (BHC over summaries) calls the marginals, not the sweep's kernels: the
        # process that finds the observation models taken compiles the marginals and stage 2
        # meanwhile, then each goes on to the engine's steps
        warmup.run_steps([_OBS, _MARGINALS, *stage2, *steps], load)


def warm_here(names: list[str] | None = None, helper: bool = False) -> None:
    """``warm_kernels(names)`` in this process; a failure only costs the speed-up."""
    try:
        warm_kernels(names, helper=helper)
    except Exception:
        logger.warning("dpmm worker warm-up failed", exc_info=True)


#: seconds the helper of ``warm_here_with_helper`` gets to finish once this process is done
HELPER_GRACE = 10.0
_HELPER = (
    "import sys; from pipeline.distributed.worker_setup import warm_here; "
    "warm_here(sys.argv[1:], True)"
)


@contextlib.contextmanager
def warm_here_with_helper(names: list[str]) -> Iterator[None]:
    """``warm_here(names)`` for workers that are threads of this process (``dpmm demo``, ``dpmm
    run --threads``), with a second process compiling alongside when the kernels are not cached;
    the run goes on inside.

    Numba compiles under one lock per process, so a forked helper (``_start_helper``) takes the
    warm-up steps this one is not at and writes them to the numba cache. Stage 2's step runs
    last and is awaited by the stage itself (``warmup.await_step``), so the helper's longest step
    overlaps the run. With a warm cache, or one core, no helper starts; if it fails, this process
    compiles what it left. It is waited for (``HELPER_GRACE``, then killed) when the run is over.
    """
    finish = None
    if (os.cpu_count() or 1) > 1 and not warmup.kernels_cached(names):
        finish = _start_helper(names)
    try:
        warm_here([n for n in names if n not in STAGE2_STEPS] if finish else names)
        yield
    finally:
        if finish is not None:
            finish(HELPER_GRACE)


def _start_helper(names: list[str]) -> Callable[[float], None] | None:
    """Start the helper of ``warm_here_with_helper``: a fork when this process runs no other
    thread (the pipeline already imported), else a new interpreter. Returns the function that
    waits for it (then kills it), or None if none started."""
    if hasattr(os, "fork") and threading.active_count() == 1:
        _import_warm_up(names)
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns of any other thread of the OS process (OpenBLAS's pool):
                # no Python thread holds a lock here (checked above), and the child compiles
                warnings.filterwarnings("ignore", ".*multi-threaded.*", DeprecationWarning)
                pid = os.fork()
        except OSError:
            logger.warning("dpmm warm-up helper did not start", exc_info=True)
            return None
        if pid == 0:
            code = 1
            try:
                # quiet: the command's output and its run's log are the command's
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                sys.stdout = sys.stderr = open(os.devnull, "w")
                logging.disable(logging.CRITICAL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not a handler of the command's
                warm_here(names, helper=True)
                code = 0
            finally:
                # neither the command's exit handlers nor a flush of its buffers run here
                os._exit(code)
        return lambda grace: _wait_forked(pid, grace)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HELPER, *names],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        logger.warning("dpmm warm-up helper did not start", exc_info=True)
        return None

    def finish(grace: float) -> None:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    return finish


def _import_warm_up(names: list[str]) -> None:
    """Import the modules of the warm-up steps of ``names`` before the helper forks."""
    from pipeline.engines import get_engine

    for name in names:
        if name in STAGE2_STEPS:
            # what stage 2's step (``warm_stage2_bhc``) calls
            from pipeline.models import bhc  # noqa: F401
        elif name not in warmup.spec_kinds():
            get_engine(name)


def _wait_forked(pid: int, grace: float) -> None:
    """Wait up to ``grace`` seconds for the forked child ``pid`` to exit, then kill it."""
    end = time.monotonic() + grace
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:  # reaped already
            return
        if time.monotonic() >= end:
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


#: glibc's ``mallopt`` parameters (malloc.h) and the values a worker process sets
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 64 << 20


def tune_malloc() -> bool:
    """Keep a worker's chunk-sized arrays on the heap, where the next task reuses them: glibc
    ``mallopt`` with allocations under ``MMAP_THRESHOLD`` (4 MiB) from the heap and up to
    ``TRIM_THRESHOLD`` (64 MiB) of free heap kept. Returns whether it was set (False where the
    C library has no ``mallopt``).

    Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_``, which also fixes glibc's mmap threshold at
    128 KiB, so every array of a task faulted in afresh (2,200-2,700 page faults a
    100,000-record MAP-DP task against 2). Arrays of 4 MiB and more stay mappings of their own,
    on transparent huge pages.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def dask_setup(worker: Any) -> None:
    """Called by Dask when the worker starts."""
    from pipeline.core.logs import LOG_ENV, stderr_to, to_file
    from pipeline.distributed.scheduler_setup import slow_ticks

    # a command that keeps its log lines in a file (not --verbose): its workers' go there too,
    # not to the terminal it shares with them (a failed task's "Compute Failed" and traceback),
    # and so does anything else a worker process prints (LOG_ENV is set for worker processes
    # only: this preload never runs in the command's own process)
    if path := os.environ.get(LOG_ENV):
        # a batch job's worker may run where that file cannot be (another machine's folder)
        with contextlib.suppress(OSError):
            to_file(path)
            stderr_to(path)
    slow_ticks(worker)
    tune_malloc()
    warm_here()
