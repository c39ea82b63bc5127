"""The steps of ``dpmm hmm`` that are not the pass loop's: reading and checking the sequences,
and the outputs of an infinite HMM (state per row, log likelihood per sequence, states, the
transition matrix, run.json and the report).

The input is a long table, one row per time step, with a sequence-id and a time column (strictly
increasing within a sequence in file order: checked, not sorted); a missing id or time, a
duplicated or decreasing time and NaN in a feature are errors naming the row and column.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.core import outputs, storage
from pipeline.core.diagnose import sequence_fit
from pipeline.core.errors import InputError
from pipeline.core.outputs import versions, write_json
from pipeline.data.sources import read_table
from pipeline.data.store import Store, StoreInfo, input_positions
from pipeline.ops.page import Page, Picture, fmt, new_figure


def read_sequences(
    path: str, sequence_column: str, time_column: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The features with the sequence column (time column dropped), rows in file order, and the
    (sequence, time) of every row; ``InputError`` naming the row and column otherwise."""
    from pipeline.estimators.ihmm import sequence_order

    if sequence_column == time_column:
        raise InputError(f"the sequence and time columns are both {sequence_column!r}")
    df = read_table(path)
    for col, what in ((sequence_column, "--sequence-column"), (time_column, "--time-column")):
        if col not in df.columns:
            raise InputError(
                f"{path}: {what} {col!r} is not a column; columns are {list(df.columns)}"
            )
    try:
        sequence_order(df, sequence_column, time_column)
    except InputError as err:
        raise InputError(f"{path}: {err}") from None
    if df.shape[1] < 3:
        raise InputError(
            f"{path}: no feature columns besides {sequence_column!r} and {time_column!r}"
        )
    meta = df[[sequence_column, time_column]].copy()
    return df.drop(columns=[time_column]), meta


def hmm_outputs(
    partial: storage.Loc,
    data: Store,
    info: StoreInfo,
    state: Any,
    meta: pd.DataFrame,
    sequence_column: str,
    time_column: str,
) -> tuple[dict[str, Any], pd.DataFrame, np.ndarray]:
    """``rows.parquet``, ``sequences.parquet``, ``states.parquet`` and ``transitions.csv`` from
    the write-out in ``partial/labels.zarr``; returns the metrics for run.json, the rows' table
    and the transition matrix."""
    from pipeline.data.chunk_io import Checked, open_array
    from pipeline.families.schema import cluster_table

    def read(name: str) -> np.ndarray:
        path = str(partial / "labels.zarr" / name)
        return np.asarray(Checked(open_array(path), path)[:])

    pos = input_positions(data, info)
    state_of = read("label")[pos]
    logd = read("log_density")[pos]
    hold = read("holdout")[pos].astype(bool)
    rows = pd.DataFrame(
        {
            "row": np.arange(info.n_rows),
            sequence_column: meta[sequence_column].to_numpy(),
            time_column: meta[time_column].to_numpy(),
            "state": state_of,
            "log_density": logd,
            "heldout": hold,
        }
    )
    seqs = (
        rows.groupby(sequence_column, sort=False)
        .agg(
            length=("row", "size"),
            heldout=("heldout", "first"),
            log_likelihood=("log_density", "sum"),
        )
        .reset_index()
    )
    K = state.n_clusters
    alpha = state.alpha
    pi, A = state.hmm.transitions(alpha)
    table = cluster_table(state.stats, alpha, info.family, info.schema).rename(
        columns={"cluster": "state"}
    )
    table.insert(2, "kappa", state.kappa)
    table.insert(3, "self_transition", np.diag(A) if K else np.zeros(0))
    table.insert(4, "start_probability", pi)
    names = [f"state {k}" for k in range(K)]
    trans = pd.DataFrame(np.vstack([pi[None, :], A]), columns=names, index=["start", *names])
    # pandas wants a path: on object storage a local directory is uploaded
    with storage.local_dir(partial) as files:
        rows.to_parquet(files / "rows.parquet", index=False)
        seqs.to_parquet(files / "sequences.parquet", index=False)
        table.to_parquet(files / "states.parquet", index=False)
        trans.to_csv(files / "transitions.csv", index_label="from")
    held = seqs[seqs.heldout]
    return (
        {
            "n_states": int(K),
            "n_sequences": len(seqs),
            "n_heldout_sequences": len(held),
            "heldout_log_likelihood": float(held.log_likelihood.sum()) if len(held) else None,
            "heldout_log_likelihood_per_step": float(held.log_likelihood.sum() / held.length.sum())
            if len(held)
            else None,
            "train_log_likelihood_per_step": float(
                seqs[~seqs.heldout].log_likelihood.sum() / max(seqs[~seqs.heldout].length.sum(), 1)
            ),
            "kappa_unrepresented": float(state.ku),
            "sizes": [int(v) for v in np.rint(state.stats[:, 0])],
        },
        rows,
        A,
    )


def write_hmm_model(
    directory: storage.Loc,
    info: StoreInfo,
    state: Any,
    params: dict[str, Any],
    metadata: dict[str, Any],
) -> None:
    """``OUT/model``: the ``MAPiHMM`` of the run's final states with the estimator's ``params``,
    whose ``predict`` / ``score_samples`` are the write-out's."""
    from pipeline.estimators.ihmm import model_from_state
    from pipeline.estimators.model import write_model

    est = model_from_state(
        info.schema,
        info.family,
        state.hmm,
        state.alpha,
        state.gamma,
        params,
        state.temper,
        math.nan if state.rho is None else state.rho,
    )
    directory.mkdir(exist_ok=True)
    write_model(directory, est, engine="ihmm", metadata=metadata)


def sequences_figure(
    out: Path, rows: pd.DataFrame, X: pd.DataFrame, K: int, seq: str, time: str
) -> None:
    """``sequences.png``: the first feature of a few sequences against time, coloured by
    decoded state, the same colour for a state in every panel."""
    from matplotlib.lines import Line2D

    ids = rows[seq].drop_duplicates().to_numpy()[:6]
    fig = new_figure(12, 0.8 + 1.4 * max(len(ids), 1))
    fig.subplots_adjust(left=0.08, right=0.86, bottom=0.6 / fig.get_figheight(), top=0.92)
    feat = X.columns[0]
    seq_all = rows[seq].to_numpy()
    t_all, x_all, z_all = rows[time].to_numpy(), X[feat].to_numpy(), rows.state.to_numpy()
    for i, sid in enumerate(ids):
        ax = fig.add_subplot(max(len(ids), 1), 1, i + 1)
        m = seq_all == sid
        ax.plot(t_all[m], x_all[m], color="0.7", lw=0.8)
        ax.scatter(t_all[m], x_all[m], c=z_all[m] % 10, cmap="tab10", vmin=0, vmax=9, s=8)
        ax.set_ylabel(f"sequence {sid}", fontsize=7)
        ax.tick_params(labelsize=7)
    handles = [
        Line2D([], [], marker="o", ls="", color=f"C{k % 10}", label=f"state {k}")
        for k in range(min(K, 10))
    ]
    fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
    fig.suptitle(f"decoded states of {len(ids)} sequences ({feat} against {time})")
    fig.savefig(out / "sequences.png", dpi=100)


def states_figures(out: Path, A: np.ndarray, sizes: np.ndarray) -> None:
    """``transitions.png`` (the transition matrix as a heatmap) and ``sizes.png`` (steps per
    state)."""
    K = int(sizes.shape[0])
    fig = new_figure(5, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(A, cmap="viridis", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax)
    if K <= 30:
        ax.set_yticks(range(K))
    ax.set(xlabel="to state", ylabel="from state", title="MAP transition matrix")
    fig2 = new_figure(5, 4.2)
    ax2 = fig2.add_subplot(1, 1, 1)
    ax2.bar(np.arange(K), sizes, color=[f"C{k % 10}" for k in range(K)])
    ax2.set(xlabel="state", ylabel="time steps", title="state sizes")
    for a in (ax, ax2):
        if K <= 30:
            a.set_xticks(range(K))
    fig.savefig(out / "transitions.png", dpi=100)
    fig2.savefig(out / "sizes.png", dpi=100)


def hmm_page(run: dict[str, Any], A: np.ndarray, sizes: np.ndarray) -> Page:
    """The report of a ``dpmm hmm`` run (``pipeline.ops.page``)."""
    m = run["metrics"]
    p = run.get("parameters", {})
    K = int(sizes.shape[0])
    facts: list[tuple[str, Any]] = [
        ("input", run["input"]),
        (
            "time steps",
            f"{fmt(run['n_rows'])} in {fmt(m['n_sequences'])} sequences "
            f"({fmt(m.get('n_heldout_sequences'))} held out)",
        ),
        ("states", K),
        ("alpha, gamma", f"{fmt(p.get('alpha'))}, {fmt(p.get('gamma'))}"),
        ("passes", f"{m['passes']} ({'converged' if m.get('converged') else 'not converged'})"),
        ("objective", m.get("objective")),
        ("held-out log likelihood per step", m.get("heldout_log_likelihood_per_step")),
        ("fitted log likelihood per step", m.get("train_log_likelihood_per_step")),
        ("total time", f"{run['timing']['total']:.1f} s"),
    ]
    tw = run.get("temper") or {}
    n_steps = int(run.get("n_train") or run["n_rows"])
    warn = sequence_fit(K, n_steps, float(tw.get("w", 1.0)), tw.get("rho"))
    page = Page("dpmm hmm report", facts, [warn] if warn else [])
    sec = page.section("States over time")
    sec.text(
        "A few sequences' first feature against time, each step coloured by its decoded "
        "(Viterbi) state."
    )
    sec.pictures(Picture("sequences.png", wide=True))
    sec = page.section("The states")
    sec.pictures(Picture("transitions.png"), Picture("sizes.png"))
    total = max(float(sizes.sum()), 1e-300)
    sec.table(
        pd.DataFrame(
            {
                "state": np.arange(K),
                "time steps": np.rint(sizes).astype(np.int64),
                "share": [f"{v / total:.1%}" for v in sizes],
                "P(stay)": [f"{A[k, k]:.3f}" for k in range(K)],
                "most likely next": [
                    int(np.argmax(np.where(np.arange(K) == k, -1.0, A[k]))) if K > 1 else 0
                    for k in range(K)
                ],
            }
        ),
        "states",
    )
    sec.text(
        "Full precision: run.json; emission parameters: states.parquet; transitions: "
        "transitions.csv; every step's state: rows.parquet."
    )
    return page


def finish_hmm(
    partial: storage.Loc,
    out: str,
    overwrite: bool,
    run: dict[str, Any],
    report: bool,
    rows: pd.DataFrame,
    X: pd.DataFrame,
    A: np.ndarray,
    sizes: np.ndarray,
    sequence_column: str,
    time_column: str,
) -> dict[str, Any]:
    """run.json and the report, then ``partial`` published as ``out``
    (``pipeline.core.outputs.publish_output``)."""
    # matplotlib and the report want a path: on object storage a local directory is uploaded
    with storage.local_dir(partial) as files:
        if report:
            sequences_figure(files, rows, X, int(sizes.shape[0]), sequence_column, time_column)
            states_figures(files, A, sizes)
            hmm_page(run, A, sizes).write(files)
        run["versions"] = versions()
        write_json(files / "run.json", run)
    outputs.publish_output(partial, out, overwrite, kind="hmm")
    return run
