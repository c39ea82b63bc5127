"""The pipeline side of ``dpmm cv``: a grid of MAP-DP configurations scored by K-fold held-out
log predictive density over the folds of a dataset store (Raykov et al. 2016, Appendix A, option 4).

Every (cell, fold) fit is a Dask task (``fold_fit``) on the store ingested once; finished fits
persist as one small JSON file each (``ResultLog``). ``summarise`` gives a row per cell,
``pipeline.estimators.search.select_index`` picks one, ``refit`` fits all the records with it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.core import storage
from pipeline.core.config import check_scale
from pipeline.core.diagnose import degenerate_fit
from pipeline.core.errors import InputError
from pipeline.core.paths import safe_name
from pipeline.data.store import Store, StoreInfo
from pipeline.estimators.search import select_index
from pipeline.ops.page import Page, Picture, fmt, new_figure

GAUSSIAN_VARIANTS = ("gaussian", "diag-gaussian")


class GridError(InputError):
    """A grid that cannot run: empty, a value out of range, more folds than records."""


@dataclass(frozen=True)
class Grid:
    """The cells of a CV grid: every (alpha, prior scale, family variant)."""

    alphas: tuple[float, ...]
    scales: tuple[float, ...]
    families: tuple[str, ...]

    def __post_init__(self) -> None:
        for what, values in (
            ("--alpha", self.alphas),
            ("--prior-scale", self.scales),
            ("--family", self.families),
        ):
            if not values:
                raise GridError(f"{what}: the grid is empty (give at least one value)")
        for a in self.alphas:
            if not (isinstance(a, (int, float)) and a > 0 and math.isfinite(a)):
                raise GridError(f"--alpha {a!r}: a concentration must be > 0")
        for s in self.scales:
            try:
                check_scale(s)
            except ValueError as err:
                raise GridError(f"--prior-scale {s!r}: {err}") from None
        for f in self.families:
            if f not in GAUSSIAN_VARIANTS:
                raise GridError(f"--family {f!r}: choose among {', '.join(GAUSSIAN_VARIANTS)}")

    def cells(self) -> list[dict[str, Any]]:
        """One parameter dict per cell, in (family, prior scale, alpha) order."""
        return [
            {"family": f, "prior_scale": float(s), "alpha": float(a)}
            for f in self.families
            for s in self.scales
            for a in self.alphas
        ]


def cell_id(params: dict[str, Any]) -> str:
    """A short stable name of a cell (file names of its results)."""
    text = json.dumps(params, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def check_folds(store: Store, info: StoreInfo, n_folds: int) -> NDArrayInt:
    """Records per fold (K,), or a ``GridError`` when there are more folds than records (or
    groups) or a fold has no record."""
    n_units = info.n_groups if info.grouped else info.n_rows
    unit = "groups" if info.grouped else "records"
    if n_folds < 2:
        raise GridError(f"--folds {n_folds}: at least 2 folds are needed")
    if n_folds > n_units:
        raise GridError(f"--folds {n_folds}: more folds than {unit} ({n_units})")
    fold = np.asarray(store.array("fold")[:])
    counts = np.bincount(fold[fold >= 0], minlength=n_folds)[:n_folds]
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        raise GridError(
            f"--folds {n_folds}: fold {int(empty[0])} has no {unit} among {n_units} "
            "(folds are drawn by a hash of the row); use fewer folds"
        )
    return counts


NDArrayInt = np.ndarray


def family_spec(info: StoreInfo, variant: str) -> dict[str, str]:
    """The store's column kinds with every Gaussian column made ``variant`` (full or diagonal
    covariance); other columns keep their kind."""
    kinds = {c: info.schema.kinds[c] for c in info.schema.features}
    return {c: (variant if k in GAUSSIAN_VARIANTS else k) for c, k in kinds.items()}


def _frame(X: np.ndarray, info: StoreInfo) -> pd.DataFrame:
    """Store rows (family order) as a DataFrame of the schema's kept columns, categorical codes
    as integers; a missing cell stays NaN."""
    df = pd.DataFrame(X, columns=info.names)
    for c in info.schema.features:
        if info.schema.kinds[c] not in GAUSSIAN_VARIANTS and not df[c].isna().any():
            df[c] = df[c].astype(np.int64)
    return df[list(info.schema.features)]


def _read_rows(store_path: str) -> tuple[np.ndarray, np.ndarray, StoreInfo]:
    store = Store(store_path)
    info = store.info
    X = np.asarray(store.array("X")[:], dtype=np.float64)
    fold = np.asarray(store.array("fold")[:])
    if info.grouped:
        real = np.asarray(store.array("row")[:]) >= 0
        X, fold = X[real], fold[real]
    return X, fold, info


def estimator(info: StoreInfo, params: dict[str, Any], seed: int, max_iter: int) -> Any:
    """The MAP-DP of a cell: one restart (a fold fit is a score, not the model)."""
    from pipeline.estimators.mapdp import MAPDP

    return MAPDP(
        alpha=float(params["alpha"]),
        prior_scale=float(params["prior_scale"]),
        family=family_spec(info, params["family"]),
        n_restarts=1,
        max_iter=int(max_iter),
        random_state=int(seed),
    )


def fold_fit(
    store_path: str, params: dict[str, Any], fold: int, seed: int, max_iter: int
) -> dict[str, Any]:
    """One (cell, fold) fit in a Dask worker: MAP-DP with ``params`` on the other folds' rows,
    scored on ``fold``'s (eq. 3.4), with the clusters found and the seconds."""
    from sklearn.exceptions import ConvergenceWarning

    X, folds, info = _read_rows(store_path)
    est = estimator(info, params, seed, max_iter)
    test = folds == fold
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(_frame(X[~test], info))
    t1 = time.perf_counter()
    try:
        dens = est.score_samples(_frame(X[test], info))
        score, error = float(np.mean(dens)), ""
    except ValueError as err:
        # a category of the held-out rows that the training folds never saw
        score, error = math.nan, " ".join(str(err).split())
    return {
        "cell": cell_id(params),
        "fold": int(fold),
        "score": score,
        "n_test": int(test.sum()),
        "n_clusters": int(est.n_clusters_),
        "fit_seconds": t1 - t0,
        "score_seconds": time.perf_counter() - t1,
        "error": error,
    }


def refit(store_path: str, params: dict[str, Any], seed: int, max_iter: int) -> Any:
    """MAP-DP with the chosen cell on every record of the store (the estimator's default
    restarts); returns the fitted estimator."""
    from pipeline.estimators.mapdp import MAPDP

    X, _folds, info = _read_rows(store_path)
    est = estimator(info, params, seed, max_iter)
    est.set_params(n_restarts="auto")
    assert isinstance(est, MAPDP)
    return est.fit(_frame(X, info))


class ResultLog:
    """Finished (cell, fold) results, one JSON file each in ``directory`` (a path or an object
    storage prefix), each written whole: what a rerun after a crash skips."""

    def __init__(self, directory: storage.Where):
        self.dir = storage.location(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, cell: str, fold: int) -> storage.Loc:
        return self.dir / safe_name(f"{cell}-fold{int(fold)}.json", "cell")

    def get(self, cell: str, fold: int) -> dict[str, Any] | None:
        p = self._path(cell, fold)
        try:
            out: dict[str, Any] = json.loads(p.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return out

    def put(self, result: dict[str, Any]) -> None:
        text = json.dumps(result, allow_nan=True)
        storage.write_atomic(self._path(result["cell"], int(result["fold"])), text.encode())


def summarise(
    cells: Sequence[dict[str, Any]], results: Sequence[dict[str, Any]], n_folds: int
) -> pd.DataFrame:
    """``cv.parquet``: one row per cell with its parameters, the mean held-out log predictive
    density per record over folds and its standard error, the clusters found, the fit seconds
    and the fold scores."""
    by = {(r["cell"], int(r["fold"])): r for r in results}
    rows = []
    for p in cells:
        cid = cell_id(p)
        rs = [by[(cid, j)] for j in range(n_folds)]
        s = np.array([r["score"] for r in rs], dtype=np.float64)
        k = np.array([r["n_clusters"] for r in rs], dtype=np.float64)
        t = np.array([r["fit_seconds"] for r in rs], dtype=np.float64)
        row: dict[str, Any] = {"cell": cid, **p}
        row["mean_log_density"] = float(np.mean(s))
        row["se_log_density"] = (
            float(np.std(s, ddof=1) / math.sqrt(n_folds)) if n_folds > 1 else 0.0
        )
        row["n_clusters"] = float(np.mean(k))
        row["n_clusters_min"] = int(k.min())
        row["n_clusters_max"] = int(k.max())
        row["fit_seconds"] = float(t.sum())
        row["fit_seconds_mean"] = float(t.mean())
        for j in range(n_folds):
            row[f"fold{j}_log_density"] = float(s[j])
        rows.append(row)
    return pd.DataFrame(rows)


def choose(table: pd.DataFrame, rule: str) -> int:
    """Row of the chosen cell (``pipeline.estimators.search.select_index``)."""
    return select_index(
        table["mean_log_density"].to_numpy(dtype=np.float64),
        table["se_log_density"].to_numpy(dtype=np.float64),
        table["n_clusters"].to_numpy(dtype=np.float64),
        rule,
    )


def plot_grid(table: pd.DataFrame, best: int, path: str | Path) -> None:
    """``cv.png``: one heat map per family variant, prior scale x alpha, of the mean held-out
    log predictive density per record, annotated; the chosen cell outlined."""
    from matplotlib.patches import Rectangle

    fams = list(dict.fromkeys(table["family"]))
    alphas = sorted(set(table["alpha"]))
    scales = sorted(set(table["prior_scale"]))
    lo = float(np.nanmin(table["mean_log_density"]))
    hi = float(np.nanmax(table["mean_log_density"]))
    fig = new_figure(1.6 + 1.7 * len(alphas) * len(fams), 1.6 + 0.8 * len(scales))
    axes = fig.subplots(1, len(fams), squeeze=False)
    chosen = table.iloc[best]
    im = None
    for ax, fam in zip(axes[0], fams, strict=True):
        sub = table[table["family"] == fam]
        Z = np.full((len(scales), len(alphas)), np.nan)
        for _, r in sub.iterrows():
            i, j = scales.index(r["prior_scale"]), alphas.index(r["alpha"])
            Z[i, j] = r["mean_log_density"]
            ax.text(
                j,
                i,
                f"{r['mean_log_density']:.3g}\n±{r['se_log_density']:.2g}\nK={r['n_clusters']:.1f}",
                ha="center",
                va="center",
                fontsize=7,
            )
        im = ax.imshow(Z, vmin=lo, vmax=hi, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(alphas)), [f"{a:g}" for a in alphas])
        ax.set_yticks(range(len(scales)), [f"{s:g}" for s in scales])
        ax.set_xlabel("alpha (N0)")
        if ax is axes[0][0]:
            ax.set_ylabel("prior scale")
        ax.set_title(fam)
        if chosen["family"] == fam:
            i, j = scales.index(chosen["prior_scale"]), alphas.index(chosen["alpha"])
            ax.add_patch(
                Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2)
            )
    if im is not None:
        fig.colorbar(im, ax=list(axes[0]), label="held-out log density / record")
    fig.suptitle("K-fold held-out log predictive density (chosen cell outlined)", fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def write_report(out: Path, run: dict[str, Any], table: pd.DataFrame) -> list[str]:
    """``report.html`` and ``report.md`` of a ``dpmm cv`` run into ``out``: the grid's cells, the
    chosen one and its refit, and a warning when the refit looks degenerate."""
    m = run["metrics"]
    c = run["chosen"]
    g = run["grid"]
    n_rows = int(run.get("dataset", {}).get("n_rows") or 0)
    n_cells = len(table)
    facts: list[tuple[str, Any]] = [
        ("input", run["input"]),
        ("records", n_rows),
        (
            "grid",
            f"{n_cells} cells: alpha {{{', '.join(fmt(a) for a in g['alpha'])}}} x prior scale "
            f"{{{', '.join(fmt(s) for s in g['prior_scale'])}}} x family "
            f"{{{', '.join(g['family'])}}}",
        ),
        (
            "folds",
            f"{run['n_folds']} (records per fold {', '.join(fmt(n) for n in run['fold_sizes'])})",
        ),
        ("selection", "largest mean" if run["select"] == "best" else "one-standard-error rule"),
        (
            "chosen",
            f"family {c['family']}, prior scale {fmt(c['prior_scale'])}, alpha {fmt(c['alpha'])}",
        ),
        (
            "its held-out log density per record",
            f"{fmt(m['mean_log_density'])} ± {fmt(m['se_log_density'], 2)}",
        ),
        ("refit on every record", f"{m['n_clusters']} clusters, alpha {fmt(m['alpha'])}"),
    ]
    if "nmi" in m:
        facts.append(("refit against the labels", f"NMI {m['nmi']:.3f}, ARI {m['ari']:.3f}"))
    facts += [
        ("fits", f"{run['fits_run']} run, {run['fits_reused']} reused"),
        ("total time", f"{run['timing']['total']:.1f} s"),
    ]
    warn = degenerate_fit(m["n_clusters"], n_rows)
    page = Page("dpmm cv report", facts, [warn] if warn else [])
    sec = page.section("The grid")
    sec.text(
        f"Each cell was fitted {run['n_folds']} times, each time on all folds but one, and scored "
        "by the mean log predictive density of the held-out fold's records (higher is better); "
        "the chosen cell is outlined."
    )
    sec.pictures(Picture("cv.png", wide=True))
    ranked = table.sort_values("mean_log_density", ascending=False)
    sec.table(
        pd.DataFrame(
            {
                "family": ranked["family"],
                "prior scale": ranked["prior_scale"],
                "alpha": ranked["alpha"],
                "held-out log density": ranked["mean_log_density"],
                "± se": [_round(v, 2) for v in ranked["se_log_density"]],
                "clusters": [
                    f"{fmt(k, 3)} ({lo}-{hi})"
                    for k, lo, hi in zip(
                        ranked["n_clusters"],
                        ranked["n_clusters_min"],
                        ranked["n_clusters_max"],
                        strict=True,
                    )
                ],
                "fit seconds": [_round(v, 2) for v in ranked["fit_seconds"]],
                "chosen": ["yes" if v else "" for v in ranked["chosen"]],
            }
        ),
        "cells, best first",
    )
    sec.text("Full precision: cv.json and cv.parquet; the refitted model: model/.")
    return page.write(out)


def _round(v: float, digits: int) -> float:
    """``v`` to ``digits`` significant digits (a number still, so that the table aligns it)."""
    return float(f"{v:.{digits}g}")
