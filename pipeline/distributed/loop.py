"""The pass loop: drives any engine (``pipeline.engines``) over the chunks of a dataset store.

A pass runs ``chunk_task`` (``Engine.chunk_step``) on every chunk, then the engine's reduce on the
driver (a sequential engine's chunks as a chain: ``sweep_chunks``); the loop checkpoints the state
after every pass in the run's state store, stops on the engine's stop rule or ``max_passes``, and
resumes from a checkpoint of the same parameters. The state store holds the engine's
double-buffered per-record arrays; the dataset store is only read, so fits can share it.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import zarr

from pipeline.core import storage
from pipeline.core.config import FitParams
from pipeline.core.tasks import chain_chunks, map_chunks, on_scattered
from pipeline.data.chunk_io import open_group, record_codec
from pipeline.data.store import Store, StoreInfo, iter_chunks, stored_chunk_rows
from pipeline.engines import get_engine
from pipeline.engines.base import Chunk, Engine, LoopState, RunContext, check_missing

CHECKPOINT = "checkpoint"


def chunk_task(engine: str, data: str, state: str, c: int, a: int, b: int, msg: Any) -> Any:
    """One chunk of one pass: the engine's ``chunk_step`` on rows a..b."""
    return get_engine(engine).chunk_step(Chunk(data, state, c, a, b, msg.p), msg)


def carry_task(engine: str, msg: Any, result: Any) -> Any:
    """The input of a sequential engine's next chunk task: ``Engine.carry``."""
    return get_engine(engine).carry(msg, result)


def sweep_chunks(
    client: Any, engine: Engine, ctx: RunContext, msg_f: Any, desc: str | None
) -> list[Any]:
    """The chunk tasks' results of one pass, in chunk order (``map_chunks``; for a sequential
    engine ``chain_chunks``, each task waiting for the previous one's ``carry``); ``desc``: the
    progress bar's, None for none."""
    head = (engine.name, str(ctx.data.path), str(ctx.state.path))
    chunks = list(iter_chunks(ctx.info))
    if not engine.sequential:
        return map_chunks(client, chunk_task, chunks, head, (msg_f,), desc)
    carry = functools.partial(carry_task, engine.name)
    return chain_chunks(client, chunk_task, carry, chunks, head, msg_f, desc)


def score_task(
    engine: str, data: str, state: str, labels: str, c: int, a: int, b: int, p: int, msg: Any
) -> Any:
    """One chunk of the write-out after pass ``p - 1``: the engine's ``score_chunk``."""
    return get_engine(engine).score_chunk(Chunk(data, state, c, a, b, p), labels, msg)


def create_record_arrays(ctx: RunContext, engine: Engine) -> None:
    """Both buffers of every per-record array of the engine, unless they exist (a resume)."""
    info = ctx.info
    path = ctx.state.path
    path.mkdir(parents=True, exist_ok=True)
    open_group(str(path), mode="a")
    n = info.n_stored
    for rec in engine.record_arrays_of(ctx):
        for k in (0, 1):
            name = f"{rec.name}{k}"
            if (path / name / "zarr.json").exists():
                continue
            shape: tuple[int, ...] = (n,) if rec.width == 0 else (n, rec.width)
            chunks: tuple[int, ...] = (stored_chunk_rows(n, info.chunk_rows), *shape[1:])
            zarr.create_array(
                str(path / name),
                shape=shape,
                chunks=chunks,
                dtype=rec.dtype,
                fill_value=rec.fill,
                compressors=record_codec(),
                overwrite=True,
            )


def context(
    data: Store,
    state: Store | storage.Where,
    info: StoreInfo,
    params: FitParams,
    progress: bool = False,
) -> RunContext:
    """The ``RunContext`` of a fit with its state store ready and the run's prior; an
    ``InputError`` for missing cells the engine does not take."""
    st = state if isinstance(state, Store) else Store(state)
    params = params.checked()
    engine = get_engine(params.engine, params.device)
    check_missing(engine, info)
    ctx = RunContext(data, st, with_prior_scale(info, params), params, progress)
    create_record_arrays(ctx, engine)
    return ctx


def with_prior_scale(info: StoreInfo, params: FitParams) -> StoreInfo:
    """``info`` with the run's empirical-Bayes prior (``Engine.run_info``)."""
    return get_engine(params.engine, params.device).run_info(info, params)


def save_checkpoint(ctx: RunContext, state: LoopState) -> None:
    """The state after a completed pass, replaced atomically."""
    ctx.state.save(CHECKPOINT, {"params": ctx.params, "state": state})


def load_checkpoint(ctx: RunContext) -> LoopState | None:
    """The last completed pass's state if the state store has one from the same parameters
    (the stop rule's parameters may differ: a resume may ask for more passes)."""
    if not ctx.state.exists(CHECKPOINT):
        return None
    ck = ctx.state.load(CHECKPOINT, dict)
    saved: FitParams = ck["params"]
    params = ctx.params
    same = replace(
        saved, max_passes=params.max_passes, tol=params.tol, min_change=params.min_change
    )
    if same != params:
        return None
    state: LoopState = ck["state"]
    return state


def clear_checkpoint(ctx: RunContext) -> None:
    """Forget the checkpoint (a restart from another seed over the same state store)."""
    ctx.state.remove(CHECKPOINT)


def run_pass(
    client: Any, ctx: RunContext, state: LoopState, labels_out: storage.Where | None = None
) -> LoopState:
    """One pass: every chunk's ``chunk_task``, then the engine's reduce; checkpoints the new
    state. With ``labels_out`` and an engine that fuses the write-out, a chunk task that changes
    nothing also writes its rows' labels and densities there."""
    from pipeline.data.labels import create_labels

    engine = get_engine(ctx.params.engine, ctx.params.device)
    info = ctx.info
    t0 = time.perf_counter()
    p = state.pass_no + 1
    scores_into = None
    if labels_out is not None and engine.fused_write_out:
        scores_into = str(labels_out)
        create_labels(scores_into, info, overwrite=False)
    msg = engine.pass_input(state, ctx, p, scores_into)
    results = on_scattered(
        client,
        [msg],
        lambda msg_f: sweep_chunks(
            client, engine, ctx, msg_f, f"pass {p}" if ctx.progress else None
        ),
        what=f"pass {p}",
    )
    new, record = engine.reduce(state, results, ctx, scores_into)
    seconds = time.perf_counter() - t0
    record["seconds"] = seconds
    record["records_per_second"] = info.n_train / seconds if seconds > 0 else math.inf
    save_checkpoint(ctx, new)
    if ctx.progress:
        print(
            f"pass {p}: objective {record['objective']:.6g}, "
            + "".join(
                f"{record[k]} {word}, "
                for k, word in (
                    ("n_clusters", "clusters"),
                    ("n_changed", "moved"),
                    ("merges", "merges"),
                )
                if k in record
            )
            + f"{record['records_per_second']:,.0f} records/s",
            file=sys.stderr,
        )
    return new


def start(client: Any, ctx: RunContext, resume: bool = True) -> LoopState:
    """The checkpointed state of a resumed fit, or the engine's state before pass 1."""
    state = load_checkpoint(ctx) if resume else None
    if state is None:
        return get_engine(ctx.params.engine, ctx.params.device).init_state(ctx, client)
    if ctx.progress:
        print(f"resuming after pass {state.pass_no}", file=sys.stderr)
    return state


def run_passes(
    client: Any,
    ctx: RunContext,
    resume: bool = True,
    labels_out: storage.Where | None = None,
    state: LoopState | None = None,
    step: Callable[[LoopState], LoopState] | None = None,
    on_pass: Callable[[LoopState], None] | None = None,
) -> LoopState:
    """Passes until the engine's stop rule or ``max_passes``: the one pass loop, from ``state``
    (default: the checkpoint or the engine's start), each run by ``step`` (default ``run_pass``),
    ``on_pass`` called after each."""
    if state is None:
        state = start(client, ctx, resume)

    def one(s: LoopState) -> LoopState:
        return run_pass(client, ctx, s, labels_out)

    step = step or one
    while not state.converged and state.pass_no < ctx.params.max_passes:
        state = step(state)
        if on_pass is not None:
            on_pass(state)
    return state
