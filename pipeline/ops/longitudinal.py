"""``dpmm longitudinal``'s steps outside the flow: the input table checked and cut to the
model's columns, the distributed fit of the mixed-effects engine
(``pipeline.engines.mixed_effects``) on a grouped dataset store, the per-subject results, the
K-fold cross-validation over subjects (Table 5's protocol), and the outputs (subjects.parquet,
clusters.parquet, run.json, a report with pictures)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.core import storage
from pipeline.core.config import MAX_PASSES, MIN_CHANGE, TOL, FitParams
from pipeline.core.diagnose import degenerate_fit
from pipeline.core.errors import InputError
from pipeline.core.tasks import map_chunks, on_scattered
from pipeline.data import sources
from pipeline.data.store import Store, StoreInfo, iter_chunks
from pipeline.distributed import loop
from pipeline.engines import get_engine
from pipeline.engines.base import Chunk, RunContext
from pipeline.models.mixed_effects import _bad_value, check_within_subject
from pipeline.models.mixed_effects_start import SHRINK
from pipeline.ops.page import Page, Picture, fmt, new_figure

ENGINE = "mixed_effects"


@dataclass(frozen=True)
class Columns:
    """The user's columns: subject id, response, covariates (the time among them)."""

    subject: str
    response: str
    covariates: tuple[str, ...]
    time: str | None = None

    def check(self, columns: list[str], label: str) -> None:
        """Refuse a missing column, or a column in two roles."""
        for what, c in (("subject", self.subject), ("response", self.response)):
            if c not in columns:
                raise InputError(f"{label}: no {what} column {c!r} (columns: {columns})")
        for c in self.covariates:
            if c not in columns:
                raise InputError(f"{label}: no covariate column {c!r} (columns: {columns})")
        if self.response in self.covariates:
            raise InputError(
                f"{label}: column {self.response!r} is both the response and a covariate"
            )
        if self.subject in self.covariates or self.subject == self.response:
            raise InputError(f"{label}: the subject column {self.subject!r} is also modelled")
        if len(set(self.covariates)) != len(self.covariates):
            raise InputError(f"{label}: a covariate is listed twice: {list(self.covariates)}")


def read_input(path: str, cols: Columns) -> pd.DataFrame:
    """The input's subject, covariates and response (in that order), every value checked: a
    missing or non-finite value, or a covariate constant over all rows, is an ``InputError``
    naming the column and the 0-based data row."""
    from pipeline.data import io as pio

    pio.check_file(path)
    df = sources.read_table(path)
    cols.check([str(c) for c in df.columns], path)
    df = df[[cols.subject, *cols.covariates, cols.response]].reset_index(drop=True)
    if df.shape[0] == 0:
        raise InputError(f"{path}: no rows")
    miss = np.flatnonzero(df[cols.subject].isna().to_numpy())
    if miss.size:
        raise InputError(f"{path}: column {cols.subject!r}, row {int(miss[0])}: missing subject id")
    for c, what in [*((c, "covariate") for c in cols.covariates), (cols.response, "response")]:
        v = df[c]
        if not pd.api.types.is_numeric_dtype(v) or not np.isfinite(v.to_numpy(float)).all():
            try:
                _bad_value(v.to_numpy(), c, what)
            except InputError as err:
                raise InputError(f"{path}: {err}") from None
        df[c] = v.astype(np.float64)
    for c in cols.covariates:
        if df.shape[0] > 1 and np.ptp(df[c].to_numpy()) == 0:
            raise InputError(
                f"{path}: covariate {c!r} is constant ({df[c].iloc[0]:g}) over all rows: it "
                "duplicates the intercept"
            )
    try:
        check_within_subject(
            list(cols.covariates), [df[c].to_numpy() for c in cols.covariates], df[cols.subject]
        )
    except InputError as err:
        raise InputError(f"{path}: {err}") from None
    if df[cols.subject].nunique() < 2:
        raise InputError(f"{path}: column {cols.subject!r} holds one subject; at least 2 needed")
    return df


def fit_context(
    store: Store,
    state_dir: storage.Loc,
    info: StoreInfo,
    params: FitParams,
    cols: Columns,
    shrink: float | str = SHRINK,
    fold: int | None = None,
    progress: bool = False,
) -> RunContext:
    """The ``RunContext`` of a fit of the mixed-effects engine (``fold``: held out; ``shrink``:
    the prior's, as ``MixedEffectsDP``'s)."""
    ctx = loop.context(store, state_dir, info, params, progress)
    ctx.options = {
        "response": cols.response,
        "covariates": list(cols.covariates),
        "fold": fold,
        "shrink": shrink,
    }
    loop.create_record_arrays(ctx, get_engine(ENGINE))
    return ctx


def _subject_task(data: str, state: str, c: int, a: int, b: int, p: int, msg: Any) -> Any:
    engine: Any = get_engine(ENGINE)
    return engine.subject_results(Chunk(data, state, c, a, b, p), msg)


def subject_results(client: Any, ctx: RunContext, state: Any) -> dict[str, np.ndarray]:
    """Every subject's final results (``MixedEffectsEngine.subject_results``), in store order
    (``map_chunks``: several chunks a task)."""
    engine = get_engine(ENGINE)
    msg = engine.write_input(state, np.arange(state.n_clusters), ctx)
    data, st = str(ctx.data.path), str(ctx.state.path)
    chunks = list(iter_chunks(ctx.info))
    p = state.pass_no + 1
    if client is None:
        parts = [_subject_task(data, st, c, a, b, p, msg) for c, a, b in chunks]
    else:
        parts = on_scattered(
            client,
            [msg],
            lambda msg_f: map_chunks(client, _subject_task, chunks, (data, st), (p, msg_f)),
            what="subject results",
        )
    return {k: np.concatenate([r[k] for r in parts]) for k in parts[0]}


def subjects_table(
    res: dict[str, np.ndarray], info: StoreInfo, coef_names: list[str], subject: str
) -> pd.DataFrame:
    ids = info.group_ids or []
    df = pd.DataFrame({subject: [ids[int(c)] for c in res["code"]]})
    df["cluster"] = res["label"]
    df["n_obs"] = res["n_obs"].astype(np.int64)
    df["log_density"] = res["log_density"]
    for j, name in enumerate(coef_names):
        df[f"beta_{name}"] = res["beta"][:, j]
    return df


def clusters_table(model: Any, coef_names: list[str]) -> pd.DataFrame:
    """One row per cluster: size, weight N_k / (N + N0), mean and covariance of beta."""
    N = float(model.n.sum())
    cov = np.linalg.inv(model.R)
    rows = []
    for k in range(model.n_clusters):
        row: dict[str, Any] = {"cluster": k, "size": round(float(model.n[k]))}
        row["weight"] = float(model.n[k] / (N + model.alpha))
        for j, a in enumerate(coef_names):
            row[f"mean_{a}"] = float(model.mu[k, j])
        for j, a in enumerate(coef_names):
            for i, b in enumerate(coef_names[: j + 1]):
                row[f"cov_{b}_{a}"] = float(cov[k, i, j])
        rows.append(row)
    return pd.DataFrame(rows)


def cv_summary(heldout: np.ndarray) -> dict[str, float]:
    """Mean held-out log predictive density per subject and its standard error."""
    x = heldout[np.isfinite(heldout)]
    n = x.size
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return {"mean_heldout_log_density": float(x.mean()), "se": se, "n_subjects": int(n)}


def trajectories_picture(
    out: Path,
    df: pd.DataFrame,
    cols: Columns,
    subjects: pd.DataFrame,
    model: Any,
    rng: np.random.Generator,
    per_cluster: int,
    n_panels: int = 8,
) -> str:
    """``trajectories.png``: one panel per cluster (the ``n_panels`` largest), with the response
    of up to ``per_cluster`` of its subjects against time and the cluster's mean trajectory."""
    tcol = cols.time
    sizes = np.asarray(model.n, dtype=np.float64)
    shown = [int(k) for k in np.argsort(-sizes, kind="stable")[:n_panels]]
    ids = subjects[cols.subject].to_numpy()
    label = subjects["cluster"].to_numpy()
    pick: dict[Any, int] = {}
    for k in shown:
        members = ids[label == k]
        if members.size > per_cluster:
            members = rng.choice(members, size=per_cluster, replace=False)
        pick.update(dict.fromkeys(members.tolist(), k))
    sample = df[df[cols.subject].isin(list(pick))]
    n_col = min(4, max(len(shown), 1))
    n_row = -(-max(len(shown), 1) // n_col)
    height = 0.9 + 2.4 * n_row
    fig = new_figure(12, height)
    fig.subplots_adjust(
        left=0.06, right=0.99, bottom=0.45 / height, top=1 - 0.65 / height, hspace=0.45, wspace=0.08
    )
    axes = fig.subplots(n_row, n_col, sharex=True, sharey=True, squeeze=False).ravel()
    panel = {k: axes[i] for i, k in enumerate(shown)}
    for sid, g in sample.groupby(cols.subject, sort=False):
        k = pick[sid]
        t = g[tcol].to_numpy() if tcol else np.arange(len(g), dtype=float)
        panel[k].plot(t, g[cols.response], color=f"C{k % 10}", alpha=0.35, lw=1)
    if tcol:
        grid = np.linspace(df[tcol].min(), df[tcol].max(), 50)
        means = df[list(cols.covariates)].mean()
        x = np.column_stack(
            [np.ones(grid.size)]
            + [grid if c == tcol else np.full(grid.size, means[c]) for c in cols.covariates]
        )
        for k in shown:
            panel[k].plot(grid, x @ model.mu[k], color="k", lw=2.5)
    for k, ax in panel.items():
        ax.set_title(f"cluster {k} ({sizes[k]:,.0f} subjects)", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes[len(shown) :]:
        ax.set_visible(False)
    for ax in axes[::n_col]:
        ax.set_ylabel(cols.response, fontsize=8)
    fig.suptitle(
        f"trajectories of up to {per_cluster} subjects per cluster"
        + ("; black: the cluster's mean trajectory" if tcol else ""),
        fontsize=10,
    )
    fig.savefig(out / "trajectories.png", dpi=90)
    return "trajectories.png"


def _picture(
    out: Path,
    name: str,
    draw: Callable[[Any], Any],
    labels: tuple[str, str],
    title: str,
    left: float = 0.15,
) -> str:
    """A small picture ``out/name`` of ``draw(ax)`` with ``labels`` and ``title``; its name."""
    fig = new_figure(5.5, 4.2)
    ax = fig.add_subplot()
    draw(ax)
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title)
    fig.subplots_adjust(left=left, right=0.96, bottom=0.13, top=0.92)
    fig.savefig(out / name, dpi=90)
    return name


def _shrink_fact(shrink: dict[str, Any]) -> str:
    """The report's line on the prior's shrink and the held-out evidence it was chosen by."""
    chosen = f"{shrink['chosen']:g}"
    if "heldout" in shrink:
        scores = ", ".join(f"{float(k):g}: {fmt(v)}" for k, v in shrink["heldout"].items())
        return (
            f"{chosen}, by held-out log density per subject of {shrink['subjects']} subjects "
            f"in {shrink['folds']} folds ({scores})"
        )
    return f"{chosen} ({shrink['note']})" if "note" in shrink else f"{chosen} (given)"


def _facts(run: dict[str, Any], cols: Columns, coef_names: list[str]) -> list[tuple[str, Any]]:
    """The report's table of facts: the input, the model, the fit's figures and timing."""
    m = run["metrics"]
    facts: list[tuple[str, Any]] = [
        ("input", str(run["parameters"].get("input"))),
        ("subjects", m["n_subjects"]),
        ("observations", m["n_observations"]),
        ("model", f"{cols.response} ~ " + " + ".join(coef_names)),
        ("clusters", m["n_clusters"]),
        ("alpha", m["alpha"]),
        ("noise precision tau", m["noise_precision"]),
        ("passes", f"{m['passes']} ({'converged' if m.get('converged') else 'not converged'})"),
        ("objective", m["objective"]),
        ("mean log density per subject", m.get("mean_log_density")),
    ]
    shrink = m.get("shrink") or {}
    if "chosen" in shrink:
        facts.append(("prior shrink", _shrink_fact(shrink)))
    if "cv" in run:
        cv = run["cv"]
        facts.append(
            (
                f"{cv['folds']}-fold held-out log density per subject",
                f"{fmt(cv['mean_heldout_log_density'])} (standard error {fmt(cv['se'], 2)})",
            )
        )
    facts.append(("total time", f"{run['timing_seconds'].get('total', 0):.1f} s"))
    return facts


def write_report(
    out: Path,
    df: pd.DataFrame,
    cols: Columns,
    subjects: pd.DataFrame,
    model: Any,
    coef_names: list[str],
    history: list[dict[str, Any]],
    run: dict[str, Any],
    n_trajectories: int = 12,
    seed: int = 0,
    n_points: int = 20_000,
) -> list[str]:
    """report.md and report.html with four pictures: trajectories per subgroup, the random
    effects in 2-D, the cluster sizes and the objective per pass."""
    rng = np.random.default_rng(seed)
    pics = [trajectories_picture(out, df, cols, subjects, model, rng, n_trajectories)]
    tcol = cols.time
    # random effects in 2-D (the time slope against the intercept, else the first two), on at
    # most n_points subjects: a million points draw no better than 20,000
    rows = np.arange(len(subjects))
    if rows.size > n_points:
        rows = np.sort(rng.choice(rows, size=n_points, replace=False))
    beta = subjects[[f"beta_{c}" for c in coef_names]].to_numpy()[rows]
    label = subjects["cluster"].to_numpy()[rows]
    j2 = coef_names.index(tcol) if tcol in coef_names else min(1, len(coef_names) - 1)
    k = np.arange(model.n_clusters)
    pics += [
        _picture(
            out,
            "random_effects.png",
            lambda ax: ax.scatter(
                beta[:, 0], beta[:, j2], s=4, c=label % 10, cmap="tab10", vmin=0, vmax=9
            ),
            (f"beta {coef_names[0]}", f"beta {coef_names[j2]}"),
            "random effects (eq. 7.2 modes) by cluster",
        ),
        _picture(
            out,
            "sizes.png",
            lambda ax: (ax.bar(k, model.n, color=[f"C{c % 10}" for c in k]), ax.set_xticks(k)),
            ("cluster", "subjects"),
            "cluster sizes",
        ),
        _picture(
            out,
            "objective.png",
            lambda ax: ax.plot(
                [h["pass"] for h in history], [h["objective"] for h in history], marker="o"
            ),
            ("pass", "objective (negative log posterior)"),
            "objective per pass",
            left=0.2,
        ),
    ]
    m = run["metrics"]
    facts = _facts(run, cols, coef_names)
    warn = degenerate_fit(m["n_clusters"], m["n_subjects"], "subjects", tunable=("alpha",))
    page = Page("dpmm longitudinal report", facts, [warn] if warn else [])
    sec = page.section("Trajectories per subgroup")
    sec.text(
        "Each panel is a cluster of subjects (the largest first): sampled subjects' "
        f"{cols.response} over {tcol or 'their observations'}"
        + (", with the cluster's mean trajectory." if tcol else ".")
    )
    sec.pictures(Picture("trajectories.png", wide=True))
    sec = page.section("The clusters")
    total = max(float(np.sum(model.n)), 1e-300)
    table = pd.DataFrame(
        {
            "cluster": np.arange(model.n_clusters),
            "subjects": np.rint(model.n).astype(np.int64),
            "share": [f"{v / total:.1%}" for v in model.n],
            **{f"mean {c}": model.mu[:, j] for j, c in enumerate(coef_names)},
        }
    )
    sec.table(table, "each cluster's mean coefficients (intercept and covariate slopes)")
    sec.pictures(*(Picture(p) for p in pics[1:]))
    sec.text(
        "Full precision: run.json; each subject's cluster and random effects: "
        "subjects.parquet; each cluster's coefficients and covariance: clusters.parquet."
    )
    return [*page.write(out), *pics]


def write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=1, default=float) + "\n")


def write_mixed_model(
    directory: Path, state: Any, cols: Columns, parameters: dict[str, Any], metrics: dict[str, Any]
) -> None:
    """``OUT/model``: the ``MixedEffectsDP`` of the run's final model (covariates ``cols``),
    whose ``predict`` / ``score_samples`` are the run's clusters and log densities."""
    from pipeline.estimators.mixed_effects import model_from_state
    from pipeline.estimators.model import write_model

    alpha = parameters.get("alpha", "learn")
    params = {
        "alpha": alpha if isinstance(alpha, str) else float(alpha),
        "shrink": parameters.get("shrink", SHRINK),
        "init": "one-cluster" if parameters.get("init") == "one-cluster" else "auto",
        "max_iter": int(parameters.get("max_passes", MAX_PASSES)),
        "tol": float(parameters.get("tol", TOL)),
        "min_change": float(parameters.get("min_change", MIN_CHANGE)),
        "random_state": parameters.get("random_state"),
    }
    est = model_from_state(
        state.model, state.prior, state.gaussian, list(cols.covariates), params, state.history
    )
    metadata = {
        "input": str(parameters.get("input")),
        "subject": cols.subject,
        "response": cols.response,
        "time": cols.time,
        **{k: metrics[k] for k in ("n_subjects", "n_observations", "passes", "objective")},
        "converged": bool(metrics["converged"]),
    }
    directory.mkdir(exist_ok=True)
    write_model(directory, est, engine=ENGINE, metadata=metadata)


def finish(
    partial: storage.Loc,
    df: pd.DataFrame,
    cols: Columns,
    info: StoreInfo,
    state: Any,
    res: dict[str, np.ndarray],
    cv: dict[str, np.ndarray] | None,
    parameters: dict[str, Any],
    timing: dict[str, float],
    report: bool,
) -> dict[str, Any]:
    """subjects.parquet, clusters.parquet, model/, run.json and the report into ``partial``;
    the scratch stores removed. Returns run.json's content."""
    coef = ["intercept", *cols.covariates]
    subjects = subjects_table(res, info, coef, cols.subject)
    model = state.model
    run: dict[str, Any] = {
        "command": "longitudinal",
        "parameters": parameters,
        "metrics": {
            "n_subjects": len(subjects),
            "n_observations": len(df),
            "n_clusters": model.n_clusters,
            "noise_precision": float(model.tau),
            "alpha": float(model.alpha),
            "objective": float(state.objective),
            "passes": int(state.pass_no),
            "converged": bool(state.converged),
            "mean_log_density": float(subjects["log_density"].mean()),
            # the prior's shrink and the held-out evidence it was chosen by
            "shrink": getattr(state, "shrink", {}),
            "fixed_effects": dict(
                zip(coef, (model.n @ model.mu / model.n.sum()).tolist(), strict=True)
            ),
        },
        "clusters": [
            {
                "cluster": k,
                "size": round(float(model.n[k])),
                "mean": model.mu[k].tolist(),
                "covariance": np.linalg.inv(model.R[k]).tolist(),
            }
            for k in range(model.n_clusters)
        ],
        "history": state.history,
        "gaussian_fit": {
            "mean": state.gaussian.mu.tolist(),
            "covariance": state.gaussian.cov.tolist(),
            "noise_precision": state.gaussian.tau,
            "passes": len(state.gaussian.history),
        },
        "timing_seconds": timing,
    }
    if cv is not None:
        ids = info.group_ids or []
        held = pd.DataFrame(
            {
                cols.subject: [ids[int(c)] for c in cv["code"]],
                "heldout_log_density": cv["log_density"],
            }
        )
        subjects = subjects.merge(held, on=cols.subject, how="left")
        run["cv"] = {"folds": int(parameters.get("folds") or 0), **cv_summary(cv["log_density"])}
    # pandas, matplotlib and the report want a path (``storage.local_dir``)
    with storage.local_dir(partial) as files_dir:
        subjects.to_parquet(files_dir / "subjects.parquet", index=False)
        clusters_table(model, coef).to_parquet(files_dir / "clusters.parquet", index=False)
        write_mixed_model(files_dir / "model", state, cols, parameters, run["metrics"])
        files = ["subjects.parquet", "clusters.parquet", "run.json", "model"]
        if report:
            files += write_report(files_dir, df, cols, subjects, model, coef, state.history, run)
        run["files"] = files
        write_json(files_dir / "run.json", run)
    scratch: list[storage.Loc] = list(partial.iterdir())
    for loc in scratch:
        if loc.name.endswith(".zarr"):
            storage.rmtree(loc, ignore_errors=True)
    return run
