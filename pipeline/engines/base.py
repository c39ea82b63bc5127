"""The engine protocol: what the pass loop (``pipeline.distributed.loop``) asks of a model.

A pass sweeps every chunk of the dataset store (several consecutive chunks to a Dask task,
``pipeline.core.tasks.map_chunks``), then a reduce on the driver::

    state = engine.init_state(ctx, client)                    # sample fit, or a given start
    repeat:
        msg = engine.pass_input(state, ctx, p, scores_into)   # scattered once per pass
        results = [engine.chunk_step(chunk, msg) for chunk]   # on the workers
        # (a sequential engine: chunk by chunk in order, msg = engine.carry(msg, result))
        state, record = engine.reduce(state, results, ctx)    # sum deltas, global update
    until record["stop"] or max_passes

``chunk_step`` reads its ``Chunk``, writes this pass's per-record state itself (double-buffered,
so a re-executed task is idempotent) and returns only additive deltas, which ``reduce`` adds in
chunk order. An engine declares its per-record arrays (``record_arrays``); a new model is a new
engine module plus its kernels and one line in ``pipeline.engines.BY_NAME``.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from pipeline.core import diagnose
from pipeline.data.chunk_io import read_rows, write_rows
from pipeline.data.labels import WriteResult, emit_chunk

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline.core.config import FitParams
    from pipeline.data.store import Store, StoreInfo
    from pipeline.families import FloatArray


@dataclass(frozen=True)
class RecordArray:
    """A per-record array of an engine's state: ``name`` (buffers ``name0``, ``name1``), its
    dtype, the value before any pass wrote it, and its width (0: one value per record)."""

    name: str
    dtype: str
    fill: Any
    width: int = 0


class LoopState(Protocol):
    """What the pass loop reads of an engine's state."""

    pass_no: int
    converged: bool
    history: list[dict[str, Any]]

    @property
    def objective(self) -> float: ...


@dataclass
class RunContext:
    """Where a fit runs: the dataset store (read-only, shared by fits), the run's state store
    (per-record state and checkpoints), what ingest learned and the parameters."""

    data: Store
    state: Store
    info: StoreInfo
    params: FitParams
    progress: bool = False
    # engine-specific settings beyond FitParams (none for the mixture engines)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Chunk:
    """One chunk's view for a worker task: rows a..b of the stores, chunk number c, pass p."""

    data: str
    state: str
    c: int
    a: int
    b: int
    p: int

    def read(self, name: str, reuse: bool = False) -> np.ndarray:
        """Rows a..b of an array of the dataset store; ``reuse``: ``read_rows``'."""
        return read_rows(os.path.join(self.data, name), self.a, self.b, reuse)

    # X and holdout are read once per task; callers never write into them
    @cached_property
    def X(self) -> FloatArray:
        """The chunk's records as float64, read into a reusable array (``chunk_io.scratch``)."""
        return np.ascontiguousarray(self.read("X", reuse=True), dtype=np.float64)

    @cached_property
    def holdout(self) -> np.ndarray:
        return self.read("holdout")

    def previous(self, name: str) -> np.ndarray:
        """The per-record array ``name`` as pass p - 1 wrote it."""
        path = os.path.join(self.state, f"{name}{(self.p - 1) % 2}")
        return read_rows(path, self.a, self.b)

    def write(self, name: str, values: np.ndarray) -> None:
        """Write this pass's per-record array ``name`` (the other buffer)."""
        path = os.path.join(self.state, f"{name}{self.p % 2}")
        write_rows(path, self.a, self.b, values)

    def emit(
        self,
        labels: str,
        X: FloatArray,
        hold: np.ndarray,
        label: np.ndarray,
        logdens: FloatArray,
        plot_rate: float,
        has_y: bool,
    ) -> WriteResult:
        """This chunk's write-out into the ``labels`` group (``pipeline.data.labels.emit_chunk``
        at its rows): records X (N, d), held-out flags, final labels and log densities (N,)."""
        return emit_chunk(
            self.data, labels, self.c, self.a, X, hold, label, logdens, plot_rate, has_y
        )


class Engine(ABC):
    """One model of the pass loop (module docstring). Engines are stateless singletons; their
    methods run on the driver except ``chunk_step`` and ``score_chunk``, which run in workers."""

    name: ClassVar[str]
    record_arrays: ClassVar[tuple[RecordArray, ...]] = ()
    # its chunk tasks may write the final output in a pass that changes nothing
    fused_write_out: ClassVar[bool] = False
    # its chunks are one stream: a pass runs the chunk tasks in order, each given
    # ``carry(input, result)`` of the previous one instead of one message for all
    sequential: ClassVar[bool] = False
    # its state has clusters with per-record labels that the summaries pass can split
    summaries: ClassVar[bool] = False
    # the empirical-Bayes prior scale the engine was measured with, when ``FitParams`` gives
    # none (None: the family's ``DEFAULT_SCALE``)
    prior_scale: ClassVar[float | None] = None
    # it takes records with missing cells; the others refuse them before pass 1
    takes_missing: ClassVar[bool] = False

    def run_info(self, info: StoreInfo, params: FitParams) -> StoreInfo:
        """``info`` with the run's empirical-Bayes prior (``StoreInfo.with_prior_scale``) at
        ``params.prior_scale``, else the engine's ``prior_scale``, else the family default."""
        scale = params.prior_scale
        if scale is None:
            scale = self.prior_scale
        return info.with_prior_scale(scale)

    @abstractmethod
    def init_state(self, ctx: RunContext, client: Any) -> LoopState:
        """The state before pass 1 (``FitParams.start``: a sample fit, a given start...)."""

    @abstractmethod
    def pass_input(self, state: LoopState, ctx: RunContext, p: int, scores_into: str | None) -> Any:
        """What every chunk task of pass ``p`` receives (scattered once). ``scores_into``: a
        write-out group the tasks may fill when their pass changes nothing."""

    @abstractmethod
    def chunk_step(self, chunk: Chunk, msg: Any) -> Any:
        """Worker side of a pass: sweep the chunk, write its per-record state, return deltas
        (an object with ``c``, ``n_changed``, ``n_train``, ``seconds``)."""

    def carry(self, msg: Any, result: Any) -> Any:
        """Sequential engines: the next chunk's input from this chunk's input and result."""
        raise NotImplementedError(f"engine {self.name!r} is not sequential")

    @abstractmethod
    def reduce(
        self, state: LoopState, results: list[Any], ctx: RunContext, scores_into: str | None
    ) -> tuple[LoopState, dict[str, Any]]:
        """Driver side: add the deltas (in chunk order), global updates, the objective from
        statistics, the stop rule; the new state and the pass's record (with ``"stop"``)."""

    @abstractmethod
    def write_input(self, state: LoopState, mapping: np.ndarray, ctx: RunContext) -> Any:
        """What every write-out task receives (``mapping``: stage 2's cluster of each)."""

    @abstractmethod
    def score_chunk(self, chunk: Chunk, labels: str, msg: Any) -> Any:
        """Worker side of the write-out: each row's final label and log predictive density
        written to the ``labels`` group; returns the chunk's ``WriteResult``."""

    def record_arrays_of(self, ctx: RunContext) -> tuple[RecordArray, ...]:
        """The per-record arrays of a fit (default ``record_arrays``); an engine whose float
        state's width depends on the fit (the number of random effects, say) adds it here."""
        return self.record_arrays

    def written_by_pass(self, state: LoopState, labels: str, mapping: np.ndarray) -> Any:
        """The write-out results when the last pass already wrote ``labels`` exactly as the
        write-out would (None: the write-out tasks run)."""
        return None

    def warm_up(self) -> None:  # noqa: B027
        """Load the kernels a worker will call, as one step (or override ``warm_steps``)."""

    def warm_steps(self) -> list[tuple[str, Callable[[], None]]]:
        """The warm-up as named steps, each loading (or compiling) a group of kernels; default
        ``warm_up`` as one step named after the engine. Preloaded workers compile each step in
        one process and load it in the others, so a step's name is unique unless two engines
        share the step. With threads as workers (``warm_here_with_helper``) this process
        compiles the first and the last step, its helper those in between."""
        return [(self.name, self.warm_up)]


def check_missing(engine: Engine, info: StoreInfo) -> None:
    """An ``InputError`` naming the first missing cell's column and row when the store has one
    and ``engine`` does not take them."""
    if info.first_missing is None or engine.takes_missing:
        return
    from pipeline.core.errors import InputError

    row, col = info.first_missing
    raise InputError(
        f"{info.source}: column {col!r}: row {row} is missing (NaN), and the {engine.name} "
        "engine does not take missing cells: the MAP-DP engine (--engine mapdp, on the CPU) "
        "does, or --missing refuse names every such cell as an error"
    )


def stop_reason(
    e_old: float, e_new: float, changed: int, n_train: int, params: FitParams
) -> str | None:
    """``pipeline.core.diagnose.stop_reason`` with the run's ``tol``, stalled also when at most
    ``min_change * n_train`` records changed cluster."""
    return diagnose.stop_reason(e_old, e_new, changed, params.tol, params.min_change * n_train)
