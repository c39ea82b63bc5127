"""Shared helpers of the benchmarks: where results go, and a table printer."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from sklearn.datasets import load_wine

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def out_dir() -> Path:
    p = Path(os.environ.get("BENCH_OUT", "bench-results"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def save(name: str, payload: Any) -> Path:
    path = out_dir() / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=float))
    return path


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def uci_sets() -> dict[str, tuple[pd.DataFrame, pd.Series]]:
    """Table 2 of Raykov et al. 2016: wine (scikit-learn's copy, numerically the UCI file), iris and
    breast cancer (``DATA``)."""
    out = {}
    w = load_wine(as_frame=True)
    out["wine"] = (w.data, w.target)
    for name, f in [("iris", "iris.csv"), ("breast cancer", "breast_cancer_wisconsin.csv")]:
        df = pd.read_csv(DATA / f)
        out[name] = (df.drop(columns="label"), df["label"])
    return out


def table(rows: list[dict[str, Any]]) -> str:
    return pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}")


def run_peak_rss(cmd: list[str], every: float = 0.05) -> tuple[int, float, int]:
    """Run ``cmd``; its exit code, wall seconds and the peak of the summed RSS of the process
    and all its descendants (Dask workers, Prefect's temporary server), sampled with psutil."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        total = 0
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = []
        for q in tree:
            try:
                total += q.memory_info().rss
            except psutil.Error:
                pass
        peak = max(peak, total)
        time.sleep(every)
    return proc.wait(), time.perf_counter() - t0, peak


class PeakSampler:
    """The peak of ``sample()`` (bytes in use), read every ``every`` seconds in a thread while
    the ``with`` block runs; subclasses say what is sampled."""

    def __init__(self, every: float = 0.05):
        import threading

        self.every = every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            time.sleep(self.every)

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
