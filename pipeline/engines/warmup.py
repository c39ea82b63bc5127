"""Loading the engines' numba kernels before their first real use (``Engine.warm_steps``) on toy
records: with an empty cache each step is compiled by one process only (``compile_once``), the
processes taking the steps nobody compiles yet, then loading each other's from the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.families import FloatArray, ProductFamily

#: names in the warm-up's list: its steps with the toy family's spec of another integer type
#: (``kernels.obs.product``): int64 for categorical or count columns, int16 for gridded Gaussians
EVERY_FAMILY = "every-family"


NW_CELLS = "nw-cells"
#: the name in the marker of a warm-up of every engine and stage 2 (``dpmm warm``, ``--portable``
#: included), which covers the warm-up of any engines
EVERY = "every"


def spec_kinds() -> dict[str, Any]:
    from kernels.obs.product import ANY_DTYPE, NW_CELLS_DTYPE

    return {EVERY_FAMILY: np.dtype(ANY_DTYPE), NW_CELLS: np.dtype(NW_CELLS_DTYPE)}


# the spec type of ``toy_family`` (None: its own int32); ``warm_kernels`` sets the others
_toy_spec_dtype: Any = None
# the round of ``run_rounds`` this process is in, which names its steps' locks (None: none)
_round: str | None = None


def toy_family() -> tuple[FloatArray, ProductFamily]:
    """40 records (40, 2) of two Gaussian blobs and their empirical-Bayes family, whose spec is
    int32 (Normal-Wishart-only kernels), or int64 / int16 with ``EVERY_FAMILY`` / ``NW_CELLS``
    in the warm-up's list."""
    from pipeline.families import GaussianNW

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(-4.0, 1.0, (20, 2)), rng.normal(4.0, 1.0, (20, 2))])
    family = GaussianNW.empirical_bayes(X).as_product()
    if _toy_spec_dtype is not None:
        family.spec = family.spec.astype(_toy_spec_dtype)
    return X, family


def warm_observation_models() -> None:
    """Load the observation models' kernels a sweep calls, once, so that the larger kernels that
    call them load rather than compile them and can compile in several processes at once."""
    from kernels.moments import column_summary
    from kernels.obs import product

    X, family = toy_family()
    column_summary(X)  # a table's first look at its columns (a fit's schema, an ingest)
    z = np.zeros(X.shape[0], dtype=np.int64)
    stats = product.build_stats(X, z, 2, family.spec, family.n_stats)
    cache = family.cache_of(stats)
    spec, prior = family.spec, family.prior
    scratch_s, scratch_c = np.empty_like(stats[0]), np.empty_like(cache[0])
    x, s, c = X[0], stats[0], cache[0]
    product.refresh(stats[1], cache[1], spec, prior)
    product.update(x, stats[1], cache[1], spec, prior, 1.0)
    product.add_stats(x, stats[1], spec, 1.0)
    product.log_predictive(x, s, c, spec, prior)
    product.log_predictive_loo(x, s, c, spec, prior, scratch_s, scratch_c)


def warm_observation_factors() -> None:
    """Load the Normal-Wishart factors' rank-one change on its own, to be loaded, not recompiled."""
    from kernels.obs import gaussian_nw

    d = 2
    rows = np.zeros((3, 2 * d * d + 2 * d + 4))
    x, s, c = rows[0, :d], rows[1, : 1 + d + d * d], rows[2]
    # L = U = I, m = b = 0, c_k = 1, a_k = d + 2: a valid cache row
    for i in range(d):
        c[i * d + i] = c[d * d + d + i * d + i] = 1.0
    c[2 * d * d + 2 * d] = 1.0
    c[2 * d * d + 2 * d + 1] = d + 2.0
    gaussian_nw._change_factors(x, s, c, 1.0, np.empty(4 * d), True)


def warm_observation_marginals() -> None:
    """Load the observation models' marginal likelihoods, which no sweep calls."""
    from kernels.obs import product

    # empty clusters' statistics: the records' are the other process's, in its step
    _, family = toy_family()
    stats = np.zeros((2, family.n_stats))
    spec, prior = family.spec, family.prior
    s, scratch_s = stats[0], np.empty_like(stats[0])
    product.log_marginal(s, spec, prior)
    product.log_marginals(stats, spec, prior)
    product.log_marginal_gap(s, stats[1], 0.0, 0.0, scratch_s, spec, prior)


def _kernels_dir() -> Path:
    """The kernels' sources (found without importing them)."""
    spec = importlib.util.find_spec("kernels")
    assert spec is not None and spec.submodule_search_locations is not None
    return Path(next(iter(spec.submodule_search_locations)))


def _sources() -> bytes:
    """A digest of the kernels' sources (their contents, as the kernels' stamps)."""
    root = _kernels_dir()
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(
            f"{path.relative_to(root)}\0".encode() + hashlib.sha256(path.read_bytes()).digest()
        )
    return h.digest()


def _marker_name(names: list[str], sources: bytes) -> str:
    h = hashlib.sha256(",".join(sorted(set(names))).encode() + sources)
    return f"dpmm-warm-{h.hexdigest()[:20]}.done"


def _cache_dir() -> Path:
    # numba keeps the kernels' cache in NUMBA_CACHE_DIR, else next to their sources
    given = os.environ.get("NUMBA_CACHE_DIR")
    return Path(given) if given else _kernels_dir() / "__pycache__"


def warm_marker(names: list[str], every: bool = False) -> Path:
    """The file a complete warm-up of ``names`` (``every``: of every engine and stage 2) leaves
    in the numba cache, named after the engines and the kernels' sources (their contents, as
    the kernels' stamps), so that changed kernels or another cache have none; where it compiles
    the shipped kernels (``kernels._cache.SHIPPED``, ``dpmm warm --portable``), theirs."""
    from kernels import _cache

    if _cache.building:
        return _cache.SHIPPED / _marker_name([EVERY], _sources())
    return _cache_dir() / _marker_name([EVERY] if every else names, _sources())


def kernels_cached(names: list[str]) -> bool:
    """Whether a warm-up of ``names``, or of every engine, completed with this cache and these
    kernel sources, or the shipped kernels hold every engine's."""
    from kernels import _cache

    sources = _sources()
    every = _marker_name([EVERY], sources)
    places = [_cache_dir() / _marker_name(names, sources), _cache_dir() / every]
    return any(p.exists() for p in places) or (_cache.reading and (_cache.SHIPPED / every).exists())


def portable_env() -> dict[str, str]:
    """The environment variables of a process that compiles the shipped kernels."""
    from kernels._cache import PORTABLE_ENV

    return dict(PORTABLE_ENV)


def clear_shipped() -> None:
    """Empty the shipped kernels' folder, before they are compiled afresh into it."""
    from kernels._cache import SHIPPED

    shutil.rmtree(SHIPPED, ignore_errors=True)
    SHIPPED.mkdir(parents=True)


@contextlib.contextmanager
def _step_lock(key: str, blocking: bool) -> Iterator[bool]:
    """Hold warm-up step ``key``'s lock file; False when not ``blocking`` and another holds it."""
    # the lock guards what is written into the numba cache, so it lives next to it
    where = Path(os.environ.get("NUMBA_CACHE_DIR") or tempfile.gettempdir())
    where.mkdir(parents=True, exist_ok=True)
    name = key if _round is None else f"{key}-{_round}"
    with open(where / f"dpmm-warm-{name}.lock", "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def compile_once(key: str, step: Callable[[], object]) -> None:
    """Run warm-up ``step`` under its lock: a process that finds another one at it waits and
    then loads the kernels that process put in the numba cache instead of compiling them too."""
    with _step_lock(key, blocking=True):
        step()


def await_step(key: str) -> None:
    """Wait until no process here is at warm-up step ``key``, then load rather than compile."""
    try:
        with _step_lock(key, blocking=True):
            pass
    except OSError:
        # no lock file can be made there (a read-only cache): no process compiles into it
        return


Steps = list[tuple[str, Callable[[], None]]]


def _run_free(steps: Steps) -> Steps:
    """Run those of the named warm-up steps no other process is at (a step shared by two
    engines once); returns the others."""
    held = []
    for key, step in dict(steps).items():
        with _step_lock(key, blocking=False) as mine:
            if mine:
                step()
            else:
                held.append((key, step))
    return held


def run_steps(steps: Steps, load: bool = True) -> None:
    """Run named warm-up steps, first those no other process runs, then the rest after waiting
    (``load`` False: only waiting); a step shared by two engines runs once."""
    for key, step in _run_free(steps):
        if load:
            compile_once(key, step)
        else:
            await_step(key)


def run_rounds(rounds: list[tuple[Any, Steps]]) -> None:
    """Run rounds of warm-up steps, each (spec type of ``toy_family``, its steps), and load them;
    a round's first step (the observation models, which its other steps call) before the rest.

    The first round also compiles what every spec type shares (the families' own kernels, the
    models that take no spec): a process waits for the other at its first step. The later
    rounds' kernels are each their own spec type's, and so are their steps' locks: a process
    that finds a later round's first step taken puts that round off instead of waiting. The
    steps another process holds are waited for (then loaded) only once every round has been
    tried, so that two processes compile a round each at once. ``dpmm warm`` on an empty cache
    on a 2-core machine, alternating with the rounds one after the other (each process waiting
    at each round's first step and for the other's longest): 207-214 s against 160 s (two runs
    each), the same CPU time.
    """
    (dtype, steps), later = rounds[0], rounds[1:]
    with _in_round(dtype):
        compile_once(*steps[0])
        held = [(dtype, _run_free(steps[1:]))]
    put_off: list[tuple[Any, Steps]] = []
    for dtype, steps in later:
        with _in_round(dtype):
            if _run_free(steps[:1]):
                put_off.append((dtype, steps))
            else:
                held.append((dtype, _run_free(steps[1:])))
    for dtype, steps in put_off:
        with _in_round(dtype):
            compile_once(*steps[0])
            held.append((dtype, _run_free(steps[1:])))
    for dtype, steps in held:
        with _in_round(dtype):
            for key, step in steps:
                compile_once(key, step)


@contextlib.contextmanager
def _in_round(dtype: Any) -> Iterator[None]:
    """Inside: ``toy_spec(dtype)``, and the steps' locks those of ``run_rounds``' round of
    ``dtype`` (None: the family's own spec, the locks of a run's warm-up)."""
    global _round
    _round = None if dtype is None else np.dtype(dtype).name
    try:
        with toy_spec(dtype):
            yield
    finally:
        _round = None


@contextlib.contextmanager
def toy_spec(dtype: Any) -> Iterator[None]:
    """``toy_family``'s spec of type ``dtype`` while inside."""
    global _toy_spec_dtype
    _toy_spec_dtype = dtype
    try:
        yield
    finally:
        _toy_spec_dtype = None
