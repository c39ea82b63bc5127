"""Where an empty numba cache's compile time goes (issue 13, "Cold start and fixed costs").

The worker warm-up's steps of a Gaussian demo (``pipeline.distributed.worker_setup``: the
observation
models, their marginals, stage 2's BHC, the MAP-DP sweep, the sample start) run one after another
in a fresh process with an empty ``NUMBA_CACHE_DIR``. Reported: the CPU seconds of each step, the
seconds spent in LLVM (numba's ``numba:llvm_lock`` events), how many numba functions compiled and
the largest *exclusive* compile times (``numba:compile`` events minus their callees'). Numba
compiles every entry point with its whole call tree, so these are what a cut in the compile work
has to remove. Run with ``make bench`` (or ``pytest -m bench tests/benchmarks/bench_compile.py
-s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

from tests.benchmarks.common import save, table

pytestmark = pytest.mark.bench

_PROFILE = r"""
import json, sys, time
from collections import defaultdict
from numba.core import event

exclusive = defaultdict(float)
llvm = [0.0]


class Compiles(event.Listener):
    def __init__(self):
        self.stack = []

    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        self.stack.append([f"{f.__module__}.{f.__name__}", time.perf_counter(), 0.0])

    def on_end(self, ev):
        name, t0, inner = self.stack.pop()
        took = time.perf_counter() - t0
        exclusive[name] += took - inner
        if self.stack:
            self.stack[-1][2] += took


class Llvm(event.Listener):
    def __init__(self):
        self.depth, self.t0 = 0, 0.0

    def on_start(self, ev):
        if self.depth == 0:
            self.t0 = time.perf_counter()
        self.depth += 1

    def on_end(self, ev):
        self.depth -= 1
        if self.depth == 0:
            llvm[0] += time.perf_counter() - self.t0


event.register("numba:compile", Compiles())
event.register("numba:llvm_lock", Llvm())

from pipeline.distributed import worker_setup as ws
from pipeline.engines import get_engine
from pipeline.engines import warmup

steps = [
    ("observation-factors", warmup.warm_observation_factors),
    ("observation-models", warmup.warm_observation_models),
    ("observation-marginals", warmup.warm_observation_marginals),
    ("stage2-bhc", ws.STAGE2_STEPS["bhc"]),
    *get_engine("mapdp").warm_steps(),
]
cpu = {}
for name, step in steps:
    t0 = time.process_time()
    step()
    cpu[name] = time.process_time() - t0
top = sorted(exclusive.items(), key=lambda kv: -kv[1])[:12]
json.dump({"cpu": cpu, "llvm": llvm[0], "n_functions": len(exclusive), "top": top}, sys.stdout)
"""


def test_compile_profile() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        out = subprocess.run(
            [sys.executable, "-c", _PROFILE], check=True, capture_output=True, text=True, env=env
        )
    res = json.loads(out.stdout)
    total = sum(res["cpu"].values())
    steps = [{"step": k, "cpu_seconds": v} for k, v in res["cpu"].items()]
    steps.append({"step": "total", "cpu_seconds": total})
    print("\n" + table(steps))
    print(
        f"{res['n_functions']} numba functions compiled; {res['llvm']:.1f} s in LLVM "
        f"({res['llvm'] / total:.0%} of the total)"
    )
    print(table([{"function": n, "exclusive_seconds": s} for n, s in res["top"]]))
    save("compile", {**res, "total_cpu": total})
    assert res["n_functions"] > 0 and total > 0
