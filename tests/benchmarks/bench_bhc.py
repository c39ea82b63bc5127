"""Measured figures for BHC on summaries, Bayes K-means BHC and the bounds (Xu et al. 2009).

Runs only under ``make bench`` (marker ``bench``); prints tables, asserts nothing about time.
Also runnable directly: ``.venv/bin/python tests/benchmarks/bench_bhc.py``.

1. BHC on 1,000 and 10,000 summaries (GaussianNW, 10 dimensions): wall time.
2. Bayes K-means BHC vs BHC on 600 abalone records (Xu et al. 2009, Section 6.3 / Fig. 8): time
ratio
   and the difference in log p(D | T) and in the eq. 9 bound.
3. Gaps between eq. 9, Theorem 1 and the exact marginal (eq. 5) over 50 random sets of 3-9
   records (Section 6.2 / Fig. 7).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pytest

from kernels import bhc as kbhc
from pipeline.estimators.bhc import BHC
from pipeline.families import GaussianNW
from pipeline.models.exact import exact_log_marginal
from tests.benchmarks.common import DATA

ABALONE = DATA / "abalone.csv"


def _summaries(m: int, d: int = 10, per: int = 20, n_true: int = 40, seed: int = 0):
    """m summaries of `per` records each, drawn from n_true Gaussian clusters in d dims."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=6.0, size=(n_true, d))
    owner = rng.integers(0, n_true, size=m)
    X = centres[np.repeat(owner, per)] + rng.normal(size=(m * per, d))
    fam = GaussianNW.empirical_bayes(X).as_product()
    Xa = fam.arrange(X)
    stats = fam.stats_of(Xa, np.repeat(np.arange(m), per), m)
    return stats, fam


def bench_summaries() -> pd.DataFrame:
    rows = []
    warm, fam = _summaries(200)
    for parallel in (False, True):  # load the compiled kernels
        kbhc.bhc(warm, fam.spec, fam.prior, 0.0, 16, 1 if parallel else 2**62)
    for m in (1_000, 10_000):
        stats, fam = _summaries(m)
        for parallel in (False, True):
            load = os.getloadavg()[0]
            t0, c0 = time.perf_counter(), time.process_time()
            model = BHC(family=fam, parallel=parallel).fit_summaries(stats)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            rows.append(
                {
                    "summaries": m,
                    "dims": 10,
                    "parallel": parallel,
                    "wall s": round(dt, 2),
                    "cpu s (all threads)": round(dc, 2),
                    "load avg before": round(load, 1),
                    "clusters": model.n_clusters_,
                    "log p(D|T)": round(model.log_evidence_, 1),
                    "eq. 9 bound": round(model.lower_bound_, 1),
                }
            )
    return pd.DataFrame(rows)


def bench_abalone(n: int = 600, seeds: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = pd.read_csv(ABALONE)
    X = df.drop(columns=["sex", "label"]).to_numpy(dtype=np.float64)
    X = X[np.random.default_rng(0).choice(len(X), size=n, replace=False)]
    fam = GaussianNW.empirical_bayes(X)
    BHC(family=fam).fit(X[:20])
    BHC(family=fam, method="bayes-kmeans", random_state=0).fit(X[:20])
    t0, c0 = time.perf_counter(), time.process_time()
    full = BHC(family=fam).fit(X)
    t_full, c_full = time.perf_counter() - t0, time.process_time() - c0
    rows = [
        {
            "method": "BHC",
            "seed": "-",
            "kmeans sweeps": "-",
            "tree leaves": n,
            "wall s": round(t_full, 3),
            "cpu s": round(c_full, 3),
            "clusters": full.n_clusters_,
            "log p(D|T)": round(full.log_evidence_, 2),
            "eq. 9 bound": round(full.lower_bound_, 2),
            "Thm 1 bound": round(full.alt_lower_bound_, 2),
        }
    ]
    summary = []
    for sweeps in (0, 10):
        ratios, dev, dlb = [], [], []
        for seed in range(seeds):
            t0, c0 = time.perf_counter(), time.process_time()
            fast = BHC(family=fam, method="bayes-kmeans", random_state=seed, kmeans_sweeps=sweeps)
            fast.fit(X)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            ratios.append(c_full / dc)
            dev.append(fast.log_evidence_ - full.log_evidence_)
            dlb.append(fast.lower_bound_ - full.lower_bound_)
            rows.append(
                {
                    "method": "Bayes K-means BHC",
                    "seed": seed,
                    "kmeans sweeps": sweeps,
                    "tree leaves": fast.tree_.n_leaves,
                    "wall s": round(dt, 3),
                    "cpu s": round(dc, 3),
                    "clusters": fast.n_clusters_,
                    "log p(D|T)": round(fast.log_evidence_, 2),
                    "eq. 9 bound": round(fast.lower_bound_, 2),
                    "Thm 1 bound": round(fast.alt_lower_bound_, 2),
                }
            )
        summary.append(
            {
                "kmeans sweeps": sweeps,
                "speed-up (BHC cpu s / BK-BHC cpu s), median": round(float(np.median(ratios)), 1),
                "log p(D|T) BK-BHC - BHC, median": round(float(np.median(dev)), 2),
                "min": round(float(np.min(dev)), 2),
                "max": round(float(np.max(dev)), 2),
                "eq. 9 bound BK-BHC - BHC, median": round(float(np.median(dlb)), 2),
            }
        )
    return pd.DataFrame(rows), pd.DataFrame(summary)


def bench_bounds(n_sets: int = 50, seed: int = 2009) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for trial in range(n_sets):
        n = int(rng.integers(3, 10))
        d = int(rng.integers(1, 3))
        if trial % 2:
            X = rng.normal(size=(n, d))
        else:
            X = rng.normal(size=(n, d)) * 0.7 + 4.0 * rng.integers(0, 2, size=(n, 1))
        fam = GaussianNW.empirical_bayes(X)
        model = BHC(family=fam).fit(X)
        exact = exact_log_marginal(X, 1.0, fam)
        rows.append(
            {
                "n": n,
                "exact - eq. 9": exact - model.lower_bound_,
                "exact - Thm 1": exact - model.alt_lower_bound_,
                "Thm 1 - eq. 9": model.alt_lower_bound_ - model.lower_bound_,
                "|exact - log p(D|T)|": abs(exact - model.log_evidence_),
            }
        )
    df = pd.DataFrame(rows)
    return df.groupby("n").agg(["mean", "max"]).round(4)


@pytest.mark.bench
def test_bench_bhc():
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    print("\n== BHC on summaries (GaussianNW, 10 dims) ==")
    print(bench_summaries().to_string(index=False))
    rows, summary = bench_abalone()
    print("\n== Bayes K-means BHC vs BHC, 600 abalone records (7 numeric columns) ==")
    print(rows.to_string(index=False))
    print(summary.to_string(index=False))
    print("\n== bound gaps (log scale) over 50 random sets, by number of records ==")
    print(bench_bounds().to_string())


if __name__ == "__main__":
    test_bench_bhc()
