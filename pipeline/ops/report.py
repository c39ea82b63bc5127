"""What a run leaves besides the labels: ``clusters.parquet``, ``run.json`` and a report,
``report.html`` and ``report.md`` (one layout for every command: ``pipeline.ops.page``).

The report of ``dpmm run`` / ``demo`` says, in this order: what the run was (rounded facts, and a
warning box when the fit looks degenerate, ``pipeline.core.diagnose``); what distinguishes the
clusters (``profile.png``: clusters x features, each feature standardised over the records, the
largest clusters in the tree's leaf order with their sizes beside; ``categories.png`` and a table
of the top categories of categorical columns; a table of the largest clusters); the tree of
stage 2 (``dendrogram.png``, drawn by ``pipeline.ops.stage2``); how good the fit is (held-out
density, NMI, ARI and ``contingency.png`` against the label column); how the fit went
(objective per pass, cluster sizes, a 2-D projection of a sample).

Everything is drawn from the clusters' statistics and the write-out's picture sample (at most
``pipeline.data.labels.PLOT_POINTS`` records), never from the records themselves: the report
costs the same for a thousand records as for a billion.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pipeline.core.diagnose import degenerate_fit
from pipeline.families import FloatArray, ProductFamily
from pipeline.families.profile import category_shares, column_means
from pipeline.families.schema import Schema
from pipeline.ops.page import Page, Picture, fmt, new_figure

IntArray = NDArray[np.int64]

# the profile shows at most this many clusters (the largest; the rest pooled in one row) and
# features (those that differ most between clusters), so that it stays readable at any size
PROFILE_CLUSTERS = 40
PROFILE_FEATURES = 60
# categorical columns drawn (``categories.png``) and categories per column named
CATEGORY_COLUMNS = 4
TOP_CATEGORIES = 5
# rows of the largest-clusters table and of the contingency picture (true labels, clusters)
TABLE_ROWS = 20
CONTINGENCY_MAX = 30
# a z-score colour scale clipped here: a cluster 2.5 sd off the mean is already far off
Z_CLIP = 2.5


@dataclass
class RunData:
    """What the run's report is drawn from besides run.json's content.

    ``stats`` (K, S): the final clusters' statistics; ``mean``, ``cov``: the moments of the
    encoded records (store order); ``plot_X``, ``plot_labels``: the write-out's sample;
    ``contingency`` (3, P): (true label code, cluster, count) triples, or None without a label
    column."""

    history: list[dict[str, Any]]
    stats: FloatArray
    family: ProductFamily
    schema: Schema
    mean: FloatArray
    cov: FloatArray
    plot_X: FloatArray
    plot_labels: IntArray
    contingency: IntArray | None = None


# -- small helpers of the pictures -----------------------------------------------------------------

_preload: threading.Thread | None = None


def _warm_matplotlib() -> None:
    import io

    try:
        fig = new_figure(1, 1)
        fig.text(0.5, 0.5, "0")
        fig.savefig(io.BytesIO(), format="png", dpi=10)
    except Exception:  # a warm-up only: the report draws (and fails) for real
        pass


def preload() -> None:
    """Import matplotlib and load its fonts in a background thread, so that a run's report,
    written at its end, does not wait for them (about half its time). Call it when the run
    starts; ``write_report`` waits for it to finish before drawing (matplotlib is not made for
    two threads drawing at once)."""
    global _preload
    if _preload is None:
        _preload = threading.Thread(target=_warm_matplotlib, name="dpmm-report-preload")
        _preload.daemon = True
        _preload.start()


def _await_preload() -> None:
    if _preload is not None:
        _preload.join()


def _new_axes(height: float) -> tuple[Any, Any]:
    # fixed margins instead of tight_layout, which draws each figure twice
    fig = new_figure(5, height)
    fig.subplots_adjust(left=0.17, right=0.96, bottom=0.15, top=0.9)
    return fig, fig.add_subplot()


def _bars(
    ax: Any,
    at: Any,
    length: Any,
    start: Any = 0.0,
    color: Any = "tab:blue",
    width: float = 0.8,
    horizontal: bool = False,
) -> Any:
    """Bars as one collection: ``Axes.bar`` makes an artist per bar, whose drawing costs more
    than everything else in a picture of a hundred clusters."""
    from matplotlib.collections import PolyCollection

    at = np.asarray(at, dtype=np.float64)
    lo = np.broadcast_to(np.asarray(start, dtype=np.float64), at.shape)
    hi = lo + np.asarray(length, dtype=np.float64)
    a, b = at - width / 2, at + width / 2
    corners = np.stack([np.stack(p, axis=-1) for p in ((lo, a), (hi, a), (hi, b), (lo, b))], 1)
    if not horizontal:
        corners = corners[..., ::-1]
    bars = PolyCollection(list(corners), facecolors=color, edgecolors="none")
    ax.add_collection(bars)
    ax.autoscale_view()
    return bars


def _plain_log_axis(axis: Any) -> None:
    """Tick labels of a log axis as plain numbers: the default's mathtext costs a parse."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _short(name: str, n: int = 18) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _projection(X: FloatArray, cov: FloatArray, mean: FloatArray) -> FloatArray:
    """The sample on the first two principal axes of the data's covariance."""
    if X.shape[1] == 1:
        return np.column_stack([X[:, 0] - mean[0], np.zeros(X.shape[0])])
    w, V = np.linalg.eigh(0.5 * (cov + cov.T))
    axes = V[:, np.argsort(w)[::-1][:2]]
    return (X - mean) @ axes


def figures(
    out: Path,
    history: list[dict[str, Any]],
    sizes: np.ndarray,
    plot_X: FloatArray,
    plot_labels: np.ndarray,
    mean: FloatArray,
    cov: FloatArray,
) -> list[str]:
    """The pictures of how the fit went, into ``out``: ``objective.png`` (objective per pass),
    ``sizes.png`` (cluster sizes) and ``projection.png`` (the sample on two principal axes);
    their file names."""
    names = []
    fig, ax = _new_axes(3.2)
    ax.plot([h["pass"] for h in history], [h["objective"] for h in history], "o-")
    ax.set_xlabel("pass")
    ax.set_ylabel("objective  -log p(X, z)")
    ax.set_title("Objective per pass")
    fig.savefig(out / "objective.png", dpi=100)
    names.append("objective.png")

    fig, ax = _new_axes(3.2)
    order = np.argsort(sizes)[::-1]
    log = bool(sizes.size and sizes.max() > 100 * max(sizes.min(), 1))
    # on a log axis the bars start at 1 record (0 has no place there)
    _bars(ax, np.arange(sizes.shape[0]), sizes[order] - log, start=float(log))
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("cluster (by size)")
    ax.set_ylabel("records")
    if log:
        ax.set_yscale("log")
        _plain_log_axis(ax.yaxis)
    else:
        ax.set_ylim(0, None)
    ax.set_title(f"Cluster sizes ({sizes.shape[0]} clusters)")
    fig.savefig(out / "sizes.png", dpi=100)
    names.append("sizes.png")

    if plot_X.shape[0]:
        P = _projection(plot_X, cov, mean)
        fig, ax = _new_axes(3.2)
        ax.scatter(P[:, 0], P[:, 1], c=plot_labels % 20, cmap="tab20", s=4, alpha=0.7)
        ax.set_xlabel("principal axis 1")
        ax.set_ylabel("principal axis 2")
        ax.set_title(f"{plot_X.shape[0]:,} records, coloured by cluster")
        fig.savefig(out / "projection.png", dpi=100)
        names.append("projection.png")
    return names


# -- the cluster profile ---------------------------------------------------------------------------


@dataclass
class Profile:
    """The clusters the profile shows and what it shows of them.

    ``shown``: cluster ids, in display order (tree leaf order, else by size); ``rest``: the ids
    pooled in the last row; ``z`` (rows, F): standardised means of the features ``features``
    (names) for the shown clusters and, when ``rest`` is not empty, the pooled rest; ``means``
    (K, D) and ``zall`` (K, D): every cluster's means and z-scores in store order, NaN for
    categorical columns; ``names``: the columns in store order."""

    shown: list[int]
    rest: list[int]
    sizes: FloatArray
    names: list[str]
    means: FloatArray
    zall: FloatArray
    features: list[int]
    z: FloatArray


def cluster_order(sizes: FloatArray, tree_order: list[int] | None) -> list[int]:
    """The ``PROFILE_CLUSTERS`` largest clusters, in the tree's leaf order when there is one
    (``tree_order``: every cluster id once), else by size (largest first)."""
    K = sizes.shape[0]
    by_size = [int(k) for k in np.argsort(-sizes, kind="stable")]
    keep = set(by_size[:PROFILE_CLUSTERS])
    if tree_order is not None and sorted(tree_order) == list(range(K)):
        return [int(k) for k in tree_order if k in keep]
    return by_size[:PROFILE_CLUSTERS]


def profile(data: RunData, names: list[str], tree_order: list[int] | None) -> Profile:
    """The cluster profile (``Profile``) of the run's final clusters: each numeric feature's
    cluster mean minus its mean over the records, over its standard deviation over the
    records."""
    stats = data.stats
    sizes = stats[:, 0]
    means = column_means(stats, data.family)
    sd = np.sqrt(np.maximum(np.diag(np.atleast_2d(data.cov)), 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        zall = np.where(sd > 0, (means - data.mean) / np.where(sd > 0, sd, 1.0), 0.0)
    zall[:, np.isnan(means).all(axis=0)] = np.nan
    shown = cluster_order(sizes, tree_order)
    rest = sorted(set(range(sizes.shape[0])) - set(shown))
    rows = [zall[k] for k in shown]
    if rest:
        pooled = stats[rest].sum(axis=0, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            pz = (column_means(pooled, data.family)[0] - data.mean) / np.where(sd > 0, sd, 1.0)
        rows.append(np.where(sd > 0, pz, 0.0))
    Z = np.asarray(rows).reshape(len(rows), len(names))
    numeric = [j for j in range(len(names)) if not np.isnan(means[:, j]).all()]
    if len(numeric) > PROFILE_FEATURES:
        # the features whose cluster means differ most, weighted by cluster size, in their order
        w = sizes / max(sizes.sum(), 1e-300)
        spread = np.nansum(w[:, None] * zall[:, numeric] ** 2, axis=0)
        top = np.sort(np.argsort(-spread, kind="stable")[:PROFILE_FEATURES])
        numeric = [numeric[i] for i in top]
    return Profile(shown, rest, sizes, names, means, zall, numeric, Z[:, numeric])


def profile_picture(out: Path, prof: Profile, ordered_by_tree: bool) -> str:
    """``profile.png``: the standardised means as a heat map (rows: clusters, columns:
    features), the sizes as bars beside it."""
    import matplotlib.colors as mcolors

    n_rows, n_feat = prof.z.shape
    row_h = 0.22 if n_rows > 20 else 0.3
    top_in, bottom_in = 0.55, 1.25 if n_feat > 10 else 0.6
    height = top_in + bottom_in + row_h * n_rows
    fig = new_figure(12, height)
    left, right, gap, bar_w = 0.09, 0.98, 0.015, 0.13
    heat_w = right - left - gap - bar_w
    b, h = bottom_in / height, row_h * n_rows / height
    ax = fig.add_axes((left, b, heat_w, h))
    axs = fig.add_axes((left + heat_w + gap, b, bar_w, h))
    Z = np.nan_to_num(prof.z, nan=0.0)
    im = ax.imshow(
        Z,
        aspect="auto",
        cmap="RdBu_r",
        norm=mcolors.Normalize(-Z_CLIP, Z_CLIP),
        interpolation="nearest",
    )
    labels = [str(k) for k in prof.shown] + ([f"other {len(prof.rest)}"] if prof.rest else [])
    fs = 8 if n_rows <= 30 else 6.5
    ax.set_yticks(range(n_rows), labels, fontsize=fs)
    ax.set_ylabel("cluster")
    names = [_short(prof.names[j]) for j in prof.features]
    ffs = 9 if n_feat <= 20 else 7.5 if n_feat <= 40 else 6.5
    ax.set_xticks(range(n_feat), names, rotation=90 if n_feat > 10 else 0, fontsize=ffs)
    if n_rows * n_feat <= 300:
        for i in range(n_rows):
            for j in range(n_feat):
                v = prof.z[i, j]
                if np.isfinite(v):
                    ax.text(
                        j,
                        i,
                        f"{v:+.1f}" if abs(v) >= 0.05 else "0",
                        ha="center",
                        va="center",
                        fontsize=6.5,
                        color="white" if abs(v) > 1.6 else "#222",
                    )
    if prof.rest:
        ax.axhline(n_rows - 1.5, color="k", lw=1)
    bars = [float(prof.sizes[k]) for k in prof.shown]
    if prof.rest:
        bars.append(float(prof.sizes[prof.rest].sum()))
    _bars(axs, np.arange(n_rows), bars, color="0.55", width=0.75, horizontal=True)
    axs.set_ylim(n_rows - 0.5, -0.5)
    axs.set_yticks([])
    axs.tick_params(labelsize=7)
    axs.set_xlabel("records", fontsize=8)
    for i, v in enumerate(bars):
        axs.text(v, i, f" {v:,.0f}", va="center", fontsize=6, clip_on=False)
    axs.set_xlim(0, max(bars) * 1.45 if bars else 1)
    axs.spines[["top", "right"]].set_visible(False)
    cax = fig.add_axes((left, 1 - 0.25 / height, 0.25, 0.1 / height))
    cb = fig.colorbar(im, cax=cax, orientation="horizontal")
    cb.ax.tick_params(labelsize=7)
    order = "tree leaf order" if ordered_by_tree else "largest first"
    fig.text(
        left + 0.27,
        1 - 0.2 / height,
        f"cluster mean - mean over the records, in standard deviations (clipped at ±{Z_CLIP}); "
        f"clusters in {order}",
        fontsize=8,
        va="center",
    )
    fig.savefig(out / "profile.png", dpi=100)
    return "profile.png"


def category_table(
    data: RunData, names: list[str], shown: list[int], sizes: FloatArray
) -> tuple[pd.DataFrame | None, dict[int, FloatArray]]:
    """The top categories of each categorical column in each shown cluster, with their shares
    ("red 62%, blue 30%"); None without categorical columns. Also the shares themselves
    (store column index -> (K, C))."""
    shares = category_shares(data.stats, data.family)
    if not shares:
        return None, shares
    table: dict[str, list[Any]] = {"cluster": shown, "records": [int(sizes[k]) for k in shown]}
    for j, sh in shares.items():
        cats = data.schema.categories.get(names[j], [])
        cells = []
        for k in shown:
            top = np.argsort(-sh[k], kind="stable")[:3]
            cells.append(
                ", ".join(f"{_category(cats, int(c))} {sh[k, c]:.0%}" for c in top if sh[k, c] > 0)
            )
        table[names[j]] = cells
    return pd.DataFrame(table), shares


def _category(cats: list[Any], c: int) -> str:
    return str(cats[c]) if c < len(cats) else str(c)


def categories_picture(
    out: Path,
    data: RunData,
    names: list[str],
    shares: dict[int, FloatArray],
    shown: list[int],
) -> str:
    """``categories.png``: for the first ``CATEGORY_COLUMNS`` categorical columns, each shown
    cluster as a bar of its ``TOP_CATEGORIES`` most frequent categories' shares (the rest grey)."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    cols = list(shares)[:CATEGORY_COLUMNS]
    n = len(shown)
    height = 1.5 + (0.22 if n > 20 else 0.3) * n
    bottom, top_m = 1.0 / height, 1 - 0.35 / height
    fig = new_figure(12, height)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=bottom, top=top_m, wspace=0.08)
    axes = fig.subplots(1, len(cols), squeeze=False)[0]
    total = data.stats[:, 0].sum()
    # each bar is a row of an image (one artist per panel, not one per bar): WIDTH pixels over
    # the shares 0..1, ROWS pixel rows per cluster of which the last is the gap between bars
    width, rows = 400, 5
    edges = np.linspace(0.0, 1.0, width + 1)[:-1] + 0.5 / width
    other = to_rgb("0.85")
    for i, (ax, j) in enumerate(zip(axes, cols, strict=True)):
        sh = shares[j]
        overall = (sh * data.stats[:, :1]).sum(axis=0) / max(total, 1e-300)
        top = np.argsort(-overall, kind="stable")[:TOP_CATEGORIES]
        cats = data.schema.categories.get(names[j], [])
        colours = [to_rgb(f"C{c}") for c in range(len(top))] + [other]
        palette = np.array(colours)
        # which segment each pixel column of each bar falls in (len(top): the rest)
        cum = np.cumsum(sh[np.asarray(shown)][:, top], axis=1)
        seg = (edges[None, :, None] >= cum[:, None, :]).sum(axis=2)
        img = np.ones((n, rows, width, 3))
        img[:, : rows - 1] = palette[seg][:, None]
        ax.imshow(
            img.reshape(n * rows, width, 3),
            aspect="auto",
            extent=(0.0, 1.0, n - 0.5 + 1.0 / rows, -0.5 + 1.0 / rows),
            interpolation="nearest",
        )
        ax.set_xlim(0, 1)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_title(_short(names[j], 30), fontsize=9)
        ax.tick_params(labelsize=7)
        if i == 0:
            ax.set_yticks(range(n), [str(k) for k in shown], fontsize=8 if n <= 30 else 6.5)
            ax.set_ylabel("cluster")
        else:
            ax.set_yticks([])
        handles = [
            Patch(color=colours[t], label=_short(_category(cats, int(c)), 14))
            for t, c in enumerate(top)
        ] + [Patch(color=other, label="other")]
        ax_h = height * (top_m - bottom)
        ax.legend(
            handles=handles,
            fontsize=6.5,
            ncol=3,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.3 / ax_h),
            frameon=False,
        )
    fig.savefig(out / "categories.png", dpi=100)
    return "categories.png"


def largest_table(
    prof: Profile, shares: dict[int, FloatArray], cats: dict[str, list[Any]]
) -> pd.DataFrame:
    """The ``TABLE_ROWS`` largest clusters: records, share of the records, the three features
    farthest from their mean (the cluster's mean and how many standard deviations off), and the
    top category of each of the first three categorical columns."""
    sizes = prof.sizes
    total = max(float(sizes.sum()), 1e-300)
    rows = []
    for k in [int(k) for k in np.argsort(-sizes, kind="stable")[:TABLE_ROWS]]:
        z = prof.zall[k]
        far = [j for j in np.argsort(-np.abs(np.nan_to_num(z)), kind="stable")[:3] if z[j] == z[j]]
        row: dict[str, Any] = {
            "cluster": k,
            "records": round(float(sizes[k])),
            "share": f"{sizes[k] / total:.1%}",
            "stands out by": "; ".join(
                f"{prof.names[j]} = {fmt(float(prof.means[k, j]), 3)} ({z[j]:+.1f} sd)" for j in far
            ),
        }
        if shares:
            row["top categories"] = "; ".join(
                f"{prof.names[j]}: {_category(cats.get(prof.names[j], []), int(sh[k].argmax()))} "
                f"{sh[k].max():.0%}"
                for j, sh in list(shares.items())[:3]
            )
        rows.append(row)
    return pd.DataFrame(rows)


# -- against the true labels -----------------------------------------------------------------------


def _label_name(code: int) -> str:
    # ingest keeps text labels as 64-bit hashes of their text (``label_codes``): shown short
    return str(code) if abs(code) < 2**31 else f"#{code & 0xFFFFFF:06x}"


def contingency_frame(pairs: IntArray) -> pd.DataFrame:
    """The contingency table (true labels x clusters, counts) of (code, cluster, count)
    triples."""
    df = pd.DataFrame({"label": pairs[0], "cluster": pairs[1], "n": pairs[2]})
    return df.pivot_table(index="label", columns="cluster", values="n", aggfunc="sum", fill_value=0)


def contingency_picture(out: Path, C: pd.DataFrame, cluster_ids: list[int]) -> str:
    """``contingency.png``: each true label's records spread over the clusters (row shares),
    the largest labels and clusters (clusters in the profile's order)."""
    import matplotlib.colors as mcolors

    cols = [k for k in cluster_ids if k in C.columns][:CONTINGENCY_MAX]
    labels = list(C.sum(axis=1).sort_values(ascending=False).index[:CONTINGENCY_MAX])
    # each label next to its main cluster: a good fit reads as a diagonal
    where = {k: i for i, k in enumerate(cols)}
    main = dict(zip(C.index, C.columns[C.to_numpy().argmax(axis=1)], strict=True))
    labels.sort(key=lambda c: where.get(main[c], len(cols)))
    sub = C.loc[labels, cols].to_numpy(dtype=np.float64)
    share = sub / np.maximum(C.loc[labels].sum(axis=1).to_numpy()[:, None], 1)
    n_r, n_c = share.shape
    height = 1.4 + 0.2 * max(n_r, 4)
    fig = new_figure(6.4, height)
    ax = fig.add_axes((0.14, 0.9 / height, 0.72, 1 - 1.35 / height))
    im = ax.imshow(share, aspect="auto", cmap="Blues", norm=mcolors.Normalize(0, 1))
    cax = fig.add_axes((0.88, 0.9 / height, 0.025, 1 - 1.35 / height))
    fig.colorbar(im, cax=cax).ax.tick_params(labelsize=7)
    if n_r * n_c <= 225:
        for i, j in zip(*np.nonzero(sub), strict=True):
            ax.text(
                j,
                i,
                f"{sub[i, j]:,.0f}",
                ha="center",
                va="center",
                fontsize=6,
                color="white" if share[i, j] > 0.6 else "#222",
            )
    fs = 7 if max(n_r, n_c) <= 20 else 5.5
    ax.set_yticks(range(n_r), [_label_name(int(v)) for v in labels], fontsize=fs)
    ax.set_xticks(range(n_c), [str(k) for k in cols], fontsize=fs, rotation=90)
    ax.set_xlabel("cluster")
    ax.set_ylabel("true label")
    ax.set_title("share of each true label's records per cluster", fontsize=9)
    fig.savefig(out / "contingency.png", dpi=100)
    return "contingency.png"


def label_table(C: pd.DataFrame) -> pd.DataFrame:
    """Per true label (largest first, at most ``TABLE_ROWS``): records, the cluster holding most
    of them and its share, and the number of clusters holding at least 1%."""
    rows = []
    for code in C.sum(axis=1).sort_values(ascending=False).index[:TABLE_ROWS]:
        r = C.loc[code]
        n = float(r.sum())
        rows.append(
            {
                "true label": _label_name(int(code)),
                "records": int(n),
                "main cluster": int(r.idxmax()),
                "its share": f"{r.max() / max(n, 1):.1%}",
                "clusters with ≥ 1%": int((r >= 0.01 * n).sum()),
            }
        )
    return pd.DataFrame(rows)


# -- the page --------------------------------------------------------------------------------------


def _warnings(run: dict[str, Any]) -> list[str]:
    m = run.get("metrics", {})
    out = []
    bad = degenerate_fit(int(m.get("n_clusters") or 0), int(run.get("n_train") or 0))
    if bad:
        out.append(bad)
    if m.get("converged") is False and m.get("passes"):
        out.append(
            f"the passes stopped at the limit ({m['passes']}) before converging: raise "
            "--max-passes, or loosen --tol"
        )
    return out


def _facts(run: dict[str, Any]) -> list[tuple[str, Any]]:
    m = run.get("metrics", {})
    p = run.get("parameters", {})
    s2 = run.get("stage2_info") or {}
    kinds = Counter((run.get("kinds") or {}).values())
    clusters = f"{fmt(m.get('n_clusters'))}"
    if m.get("n_summaries"):
        clusters += (
            f" (stage 1: {fmt(m.get('n_clusters_stage1'))}, split into {fmt(m['n_summaries'])} "
            f"summaries, merged back by {s2.get('method', p.get('stage2'))})"
        )
    n_hold = int(run.get("n_rows", 0)) - int(run.get("n_train", 0))
    facts: list[tuple[str, Any]] = [
        ("input", run.get("input")),
        (
            "records",
            f"{fmt(run.get('n_rows', 0))} ({fmt(run.get('n_train', 0))} fitted, "
            f"{fmt(n_hold)} held out)",
        ),
        (
            "columns",
            f"{fmt(run.get('n_cols'))} ("
            + ", ".join(f"{v} {k}" for k, v in kinds.most_common())
            + ")",
        ),
        ("engine", p.get("engine")),
        ("clusters", clusters),
        ("alpha", f"{fmt(m.get('alpha'))}" + (" (learned)" if p.get("alpha") == "learn" else "")),
        ("passes", f"{m.get('passes')} ({'converged' if m.get('converged') else 'not converged'})"),
        ("objective -log p(X, z)", m.get("objective")),
        ("held-out mean log predictive density", m.get("heldout_mean_log_density")),
    ]
    if "nmi" in m:
        facts.append(
            (f"against '{p.get('label_column')}'", f"NMI {m['nmi']:.3f}, ARI {m['ari']:.3f}")
        )
    t = run.get("timing", {})
    facts += [
        ("total time", f"{t.get('total', 0):.1f} s"),
        ("records per second", m.get("records_per_second")),
    ]
    return [(k, v) for k, v in facts if v is not None]


def write_report(
    out: Path, run: dict[str, Any], clusters: pd.DataFrame, data: RunData
) -> list[str]:
    """The pictures, ``report.html`` and ``report.md`` of a run into ``out``; the names of the
    files written."""
    _await_preload()
    m = run.get("metrics", {})
    s2 = run.get("stage2_info") or {}
    names = [data.schema.columns[j] for j in data.family.column_order]
    tree_order = s2.get("cluster_order")
    page = Page("dpmm run report", _facts(run), _warnings(run))
    written: list[str] = []

    prof = profile(data, names, tree_order)
    sec = page.section("What distinguishes the clusters")
    n_clusters = prof.sizes.shape[0]
    rest = ""
    if prof.rest:
        share = prof.sizes[prof.rest].sum() / max(prof.sizes.sum(), 1e-300)
        rest = (
            f" The {len(prof.rest)} smallest clusters ({share:.1%} of the records) are pooled in "
            "the last row."
        )
    feats = ""
    n_numeric = int((~np.isnan(prof.means).all(axis=0)).sum()) if n_clusters else 0
    if len(prof.features) < n_numeric:
        feats = (
            f" The {len(prof.features)} of {n_numeric} features whose means differ most between "
            "clusters are shown."
        )
    if prof.features:
        sec.text(
            "Each row is a cluster, each column a feature: red where the cluster's mean is above "
            "the feature's mean over all records, blue below, in standard deviations; the bars "
            "give each cluster's records." + rest + feats
        )
        written.append(profile_picture(out, prof, tree_order is not None))
        sec.pictures(Picture("profile.png", wide=True))
    ctable, shares = category_table(data, names, prof.shown, prof.sizes)
    if ctable is not None:
        written.append(categories_picture(out, data, names, shares, prof.shown))
        sec.text("Categorical columns: the share of each cluster's records in each category.")
        sec.pictures(Picture("categories.png", wide=True))
        # a table of at most CATEGORY_COLUMNS categorical columns, each a column of text
        cat_cols = list(ctable.columns[2:])
        for i in range(0, len(cat_cols), CATEGORY_COLUMNS):
            part = cat_cols[i : i + CATEGORY_COLUMNS]
            sec.table(
                ctable[["cluster", "records", *part]],
                "the top categories of " + ", ".join(part) + " in each cluster",
                folded=True,
            )
    sec.text(
        f"The {min(TABLE_ROWS, n_clusters)} largest of {n_clusters} clusters (all of them in "
        "clusters.parquet), with the features farthest from their mean over the records:"
    )
    sec.table(largest_table(prof, shares, data.schema.categories))

    if s2.get("pictures"):
        sec = page.section("The hierarchy")
        text = (
            f"Stage 2 ran BHC over {fmt(s2.get('n_summaries'))} summaries of the stage-1 "
            f"clusters; its r_k < 0.5 cut gives {fmt(s2.get('n_clusters'))} clusters. Leaves: "
            "final cluster · records."
        )
        post = s2.get("posterior_n_clusters")
        if post:
            best = max(post.items(), key=lambda kv: kv[1])
            text += (
                f" Tree-guided MCMC ({fmt(s2.get('mcmc_iter'))} iterations) started from it: "
                f"posterior mode K = {best[0]} (probability {best[1]:.2f}); the final clusters "
                "are its last sample's."
            )
        sec.text(text)
        sec.pictures(*(Picture(p, wide=True) for p in s2["pictures"]))

    sec = page.section("How good the fit is")
    held = m.get("heldout_mean_log_density")
    sec.text(
        f"Held-out mean log predictive density: {fmt(held)} per record over "
        f"{fmt(m.get('n_heldout'))} held-out records (fitted records: "
        f"{fmt(m.get('train_mean_log_density'))}); higher is better, and comparable between "
        "runs on the same held-out records."
        if held is not None
        else "No records were held out (--holdout): no held-out density. Fitted records' mean "
        f"log predictive density: {fmt(m.get('train_mean_log_density'))}."
    )
    if data.contingency is not None and data.contingency.size and "nmi" in m:
        C = contingency_frame(data.contingency)
        label = run.get("parameters", {}).get("label_column")
        sec.text(
            f"Against the label column '{label}' (not used by the fit): NMI {m['nmi']:.3f}, "
            f"ARI {m['ari']:.3f} (1 is perfect agreement, 0 what chance gives); "
            f"{C.shape[0]} labels, {C.shape[1]} clusters, over every record (held-out ones "
            "included)."
        )
        written.append(contingency_picture(out, C, [*prof.shown, *prof.rest]))
        sec.pictures(Picture("contingency.png"))
        sec.table(label_table(C))

    sec = page.section("How the fit went")
    pics = figures(
        out, data.history, data.stats[:, 0], data.plot_X, data.plot_labels, data.mean, data.cov
    )
    written += pics
    sec.pictures(*(Picture(p) for p in pics))
    sec.text(
        "Full precision: run.json; every cluster's posterior summary: clusters.parquet; every "
        "record's cluster and log density: labels.zarr."
    )
    return written + page.write(out)
