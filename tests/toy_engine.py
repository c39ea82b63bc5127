"""A toy engine with float per-record state, for the engine contract tests: what a new model
needs (``pipeline.engines.base.Engine``) and nothing of the loop.

The model: one Gaussian with unit covariance and unknown mean (flat prior). Its per-record state
is each training record's residual x - mu (a float array of width D) against the mean the pass
was given; a chunk returns its count, sum and sum of squares (additive); the reduce takes the
mean and the objective 1/2 sum ||x - mu||^2 from those statistics alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pipeline.core.persist import register
from pipeline.data.labels import emit_chunk
from pipeline.engines.base import Chunk, Engine, RecordArray, RunContext, stop_reason

WIDTH = 3


@register
@dataclass
class ToyState:
    pass_no: int
    mean: np.ndarray
    history: list[dict[str, Any]] = field(default_factory=list)
    converged: bool = False

    @property
    def objective(self) -> float:
        return float(self.history[-1]["objective"]) if self.history else math.inf


@dataclass
class ToyInput:
    p: int
    mean: np.ndarray


@dataclass
class ToyResult:
    c: int
    n: float
    total: np.ndarray
    sq: float
    n_changed: int
    n_train: int
    seconds: float


class ToyEngine(Engine):
    name: ClassVar[str] = "toy"
    # the residual of each record: records of WIDTH columns only
    record_arrays: ClassVar[tuple[RecordArray, ...]] = (
        RecordArray("resid", "float64", float("nan"), WIDTH),
    )

    def init_state(self, ctx: RunContext, client: Any) -> ToyState:
        if ctx.info.n_cols != WIDTH:
            raise ValueError(f"the toy engine models {WIDTH} columns, got {ctx.info.n_cols}")
        return ToyState(0, np.zeros(WIDTH))

    def pass_input(self, state: Any, ctx: RunContext, p: int, scores_into: str | None) -> ToyInput:
        return ToyInput(p, state.mean)

    def chunk_step(self, chunk: Chunk, msg: ToyInput) -> ToyResult:
        t0 = time.perf_counter()
        X, hold = chunk.X, chunk.holdout
        before = chunk.previous("resid")
        resid = np.full(X.shape, np.nan)
        resid[~hold] = X[~hold] - msg.mean
        chunk.write("resid", resid)
        moved = int((~np.isclose(before[~hold], resid[~hold], equal_nan=False)).any(axis=1).sum())
        Xt = X[~hold]
        return ToyResult(
            chunk.c,
            float(Xt.shape[0]),
            Xt.sum(axis=0),
            float((Xt * Xt).sum()),
            moved,
            int(Xt.shape[0]),
            time.perf_counter() - t0,
        )

    def reduce(
        self, state: Any, results: list[Any], ctx: RunContext, scores_into: str | None
    ) -> tuple[ToyState, dict[str, Any]]:
        results = sorted(results, key=lambda r: r.c)
        n = sum(r.n for r in results)
        total = np.sum([r.total for r in results], axis=0)
        sq = sum(r.sq for r in results)
        mean = total / max(n, 1.0)
        e = 0.5 * (sq - n * float(mean @ mean))
        changed = sum(r.n_changed for r in results)
        record = {"pass": state.pass_no + 1, "objective": e, "n_changed": changed}
        record["stop"] = stop_reason(state.objective, e, changed, ctx.info.n_train, ctx.params)
        new = ToyState(
            state.pass_no + 1, mean, [*state.history, record], record["stop"] is not None
        )
        return new, record

    def write_input(self, state: Any, mapping: np.ndarray, ctx: RunContext) -> ToyInput:
        return ToyInput(state.pass_no + 1, state.mean)

    def score_chunk(self, chunk: Chunk, labels: str, msg: ToyInput) -> Any:
        X, hold = chunk.X, chunk.holdout
        d = X.shape[1]
        r = X - msg.mean
        logdens = -0.5 * (r * r).sum(axis=1) - 0.5 * d * math.log(2 * math.pi)
        label = np.zeros(X.shape[0], dtype=np.int64)
        return emit_chunk(chunk.data, labels, chunk.c, chunk.a, X, hold, label, logdens, 0.0, False)


ENGINE = ToyEngine()
