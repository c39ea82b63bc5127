"""Measured figures of the operations path (``make bench``; ``-m bench`` only).

On the 1,000,000 x 10 benchmark mixture of ``bench_distributed`` (day 1) and a new day's batch
of the same mixture (1,000,000 other records, ``mixture_npy(..., draw=1)``):

* ``dpmm run --warm-start`` against a cold start on the new day's batch: passes, time of the
  passes, of the pipeline (ingest + passes + write-out) and of the whole command, NMI of each;
  warm / cold ratios. The warm start is the day-1 run's ``OUT/model``.
* ``dpmm score`` on the new day's 1,000,000 records with the day-1 model: records per second of
  the whole flow and of its write-out, against the same model's in-memory ``score_samples``
  (one process) on the same records, as a ratio.

Each configuration runs once (the figures of ``bench_distributed`` are medians of three);
``BENCH_DATA`` keeps the data between runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from sklearn.metrics import normalized_mutual_info_score

from tests.benchmarks.bench_distributed import _nmi, _run, data_dir, mixture_npy, prefect_server
from tests.benchmarks.common import save, table

pytestmark = pytest.mark.bench

__all__ = ["data_dir", "prefect_server"]  # fixtures shared with bench_distributed

N = 1_000_000


def test_warm_start_and_score_throughput(data_dir: Path, prefect_server: float) -> None:
    from flows.score import run_score_flow
    from pipeline.estimators.model import load_model

    day1 = mixture_npy(data_dir / "mix1m.npy", N)
    day2 = mixture_npy(data_dir / "mix1m_day2.npy", N, draw=1)
    y2 = data_dir / "mix1m_day2_y.npy"
    common: dict[str, Any] = {"holdout": 0.01, "dashboard_address": None, "report": False}
    _run(day1, data_dir / "ops-day1", **common)
    model = data_dir / "ops-day1" / "model"

    rows = []
    for name, extra in (("cold", {}), ("warm", {"warm_start": str(model)})):
        run, wall, _peak = _run(day2, data_dir / f"ops-{name}", **common, **extra)
        t = run["timing"]
        rows.append(
            {
                "start": name,
                "passes": run["metrics"]["passes"],
                "init s": float((run.get("init") or {}).get("seconds") or 0.0),
                "passes s": t["passes"],
                "pipeline s": t["ingest"] + t["passes"] + t["write_out"],
                "seconds": wall,
                "clusters": run["metrics"]["n_clusters"],
                "NMI": _nmi(data_dir / f"ops-{name}", y2),
            }
        )
    cold, warm = rows
    for key in ("passes", "passes s", "pipeline s", "seconds"):
        warm[f"{key} / cold"] = warm[key] / cold[key] if cold[key] else float("nan")

    out = data_dir / "ops-scored"
    t0 = time.perf_counter()
    rec = run_score_flow(
        model=str(model),
        input=str(day2),
        out=str(out),
        overwrite=True,
        progress=False,
        dashboard_address=None,
    )
    wall = time.perf_counter() - t0
    est = load_model(model)
    X = np.load(day2, mmap_mode="r")
    t0 = time.perf_counter()
    ref = est.score_samples(np.asarray(X))
    in_memory = time.perf_counter() - t0
    logd = zarr.open_array(str(out / "labels.zarr" / "log_density"))[:]
    np.testing.assert_array_equal(logd, ref)
    label = zarr.open_array(str(out / "labels.zarr" / "label"))[:]
    score_row = {
        "records": N,
        "dpmm score s": wall,
        "records/s": N / wall,
        "write-out records/s": N / rec["timing"]["write_out"],
        "in-memory score_samples records/s": N / in_memory,
        "dpmm score / in-memory (time)": wall / in_memory,
        "NMI of labels": float(normalized_mutual_info_score(np.load(y2), label)),
    }
    print("\nwarm start against cold start, new day's 1,000,000 x 10 batch\n" + table(rows))
    print("\ndpmm score throughput, 1,000,000 x 10\n" + table([score_row]))
    save("operations", {"warm_vs_cold": rows, "score": score_row})
    assert warm["NMI"] > 0.9 and cold["NMI"] > 0.9
