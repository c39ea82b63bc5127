"""Fill the numba cache before ``pytest -n 3`` starts its workers (``make test``'s step).

Each test process compiles a kernel the first time it runs one unless the cache
(``NUMBA_CACHE_DIR``) has it; with an empty cache each process of ``pytest -n 3`` compiled the
same kernels, often at the same time. Here a tiny table of each family and a tiny fit of each
model (the samplers and BHC also on a mixed table, their other spec type, and
the variants the suite fits) run once, spread over one process per core, so that the test
processes load every common kernel from the cache instead. What a test compiles beyond these
still compiles there (in a fresh clone on 2026-11-30: 162 cached specialisations before these
steps covered the other tables and variants, 31 after).

``python -m tests.warm [STEP ...]`` runs every step (or those named) and prints each step's
seconds; a failing step fails the command. Every step also makes the test processes' Prefect
database meanwhile (``tests.prefect_db.template``).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from typing import Any

import numpy as np


def _records(n: int = 60) -> np.ndarray:
    """(n, 2) records of two Gaussian blobs."""
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(0.0, 1.0, (n // 2, 2)), rng.normal(6.0, 1.0, (n // 2, 2))])


def _table(kind: str, n: int = 60) -> Any:
    """A tiny DataFrame of one kind: (n, 2) columns of one family, the mixed one with missing
    cells, the frame one of three families and none missing."""
    import pandas as pd

    rng = np.random.default_rng(1)
    g = np.arange(n) % 2
    gauss = _records(n)
    columns = {
        "gaussian": {"a": gauss[:, 0], "b": gauss[:, 1]},
        "binary": {"a": (rng.random(n) < 0.2 + 0.6 * g).astype(int), "b": g},
        "categorical": {"a": np.array(["x", "y", "z"])[g + rng.integers(0, 2, n)], "b": g + 5},
        "counts": {"a": rng.poisson(2 + 8 * g), "b": rng.poisson(1 + 4 * g)},
    }
    if kind == "integer":
        # values on a grid: the Normal-Wishart with recording cells
        return pd.DataFrame(np.round(2.0 * gauss), columns=["a", "b"])
    if kind not in ("frame", "mixed"):
        return pd.DataFrame(columns[kind])
    # Gaussian, categorical and binary columns: none missing in the frame (what every model
    # takes), some Gaussian cells in the mixed one
    df = pd.DataFrame(
        {"x": gauss[:, 0], "c": columns["categorical"]["a"], "y": columns["binary"]["a"]}
    )
    if kind == "mixed":
        df.loc[rng.random(n) < 0.1, "x"] = np.nan
    return df


def mapdp_on(kind: str) -> Callable[[], None]:
    """A fit, predict and score of MAPDP on ``_table(kind)``."""

    def step() -> None:
        from pipeline import MAPDP
        from pipeline.families.stats import Stats

        X = _table(kind)
        m = MAPDP(random_state=0).fit(X)
        m.predict(X)
        m.score_samples(X)
        # the clusters' means and covariances of a run's summaries and report
        Stats(m.cluster_stats_, m.family_).moments(m.family_)

    return step


#: the tables besides Gaussian records that the suite fits every sampler and BHC to: a table of
#: mixed columns (``family="auto"``), the int64 spec (``kernels.obs.product``), which values on a
#: grid (the Normal-Wishart with recording cells) share there (``ProductFamily.widened``)
MODEL_KINDS = {
    name: ("frame",) for name in ("BHC", "CollapsedGibbs", "TreeGuidedMCMC", "UncollapsedGibbs")
}


def model(name: str, kind: str = "records") -> Callable[[], None]:
    """The registry's model ``name`` fitted on a tiny table (the same as the registry's tests;
    ``kind``: Gaussian records, a mixed ``frame`` or ``integer`` values), then its predict and
    scores."""

    def step() -> None:
        from pipeline.data.synthetic import sample_longitudinal
        from pipeline.estimators.registry import MODELS

        cls = MODELS[name].estimator
        kw: dict[str, Any] = {}
        if name == "MixedEffectsDP":
            df = sample_longitudinal(40, seed=1)
            est = cls(random_state=0)
            args: tuple[Any, ...] = (df[["wave", "depression", "adl"]], df["qol"], df["subject"])
        else:
            est = cls(random_state=0) if "random_state" in cls().get_params() else cls()
            if "n_iter" in est.get_params():
                est.set_params(n_iter=8, burn_in=2)
            if name == "DPMeans":
                est.set_params(n_clusters=2)
            if "n_sweeps" in est.get_params():
                est.set_params(n_sweeps=10, burn_in=2)
            args = (_records(),)
            if kind == "frame":
                est.set_params(family="auto")
                args = (_table("frame"),)
            elif kind == "integer":
                args = (np.round(2.0 * _records()),)
            if name in ("MAPiHMM", "IHMMGibbs"):
                kw = {"lengths": [20, 20, 20]}
        est.fit(*args, **kw)
        est.predict(*args, **kw)
        if hasattr(est, "score_samples") and not kw:
            est.score_samples(*args)

    return step


def variants() -> None:
    """What the suite fits beyond the defaults: tree-guided MCMC's other samplers and the NGGP
    prior, BHC's threaded scores and the tempered infinite HMM."""
    from pipeline.estimators.bhc import BHC
    from pipeline.estimators.ihmm import MAPiHMM
    from pipeline.estimators.tgmcmc import METHODS, TreeGuidedMCMC

    X = _records()
    for method in METHODS[1:]:
        for prior in ("dp", "nggp"):
            TreeGuidedMCMC(prior=prior, method=method, n_iter=8, burn_in=2, random_state=0).fit(X)
    BHC(parallel=True).fit(X).predict(X)
    for Xh in (X, np.round(2.0 * X)):
        for temper in (1.0, 0.5):
            MAPiHMM(temper=temper, random_state=0).fit(Xh, lengths=[20, 20, 20])


def engines() -> None:
    """The distributed engines' chunk tasks and sample starts for every spec type (the workers'
    own warm-up, ``pipeline.distributed.worker_setup``)."""
    from pipeline.distributed.worker_setup import warm_kernels

    warm_kernels(None, every_product=True)


def steps() -> dict[str, Callable[[], None]]:
    """Every step by name, the longest first so that the processes end together."""
    from pipeline.estimators.registry import MODELS

    out: dict[str, Callable[[], None]] = {"engines": engines, "variants": variants}
    kinds = ("mixed", "binary", "categorical", "counts", "gaussian", "integer")
    out.update({f"MAPDP-{k}": mapdp_on(k) for k in kinds})
    out.update({name: model(name) for name in sorted(MODELS) if name != "MAPDP"})
    out.update({f"{n}-{k}": model(n, k) for n, kinds in MODEL_KINDS.items() for k in kinds})
    # the samplers compile the most: their steps first
    first = [k for k in out if k.startswith(("TreeGuidedMCMC", "CollapsedGibbs", "variants"))]
    return {k: out[k] for k in [*first, *(k for k in out if k not in first)]}


def _run(name: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        # tiny tables: a fit may find one cluster, which is all a warm-up needs
        warnings.simplefilter("ignore")
        steps()[name]()
    return name, time.perf_counter() - t0


def main(names: list[str]) -> int:
    """Run the steps ``names`` (none: every step) in ``os.cpu_count()`` processes; the exit
    status."""
    from tests import prefect_db

    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with (
        ThreadPoolExecutor(1) as side,
        ProcessPoolExecutor(max_workers=os.cpu_count() or 2, mp_context=ctx) as pool,
    ):
        # the test processes' Prefect database, migrated meanwhile (a server process of its own)
        made = side.submit(prefect_db.template) if not names else None
        futures = [pool.submit(_run, name) for name in names or steps()]
        try:
            for done in as_completed(futures):
                name, took = done.result()
                print(f"warm: {name} {took:.1f} s", flush=True)
        except BaseException:
            # the steps not started yet would only delay the failure
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        if made is not None:
            made.result()
            print(f"warm: Prefect's database {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"warm: every step {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
