"""What distinguishes the clusters, for the report (``pipeline.ops.report``): the cluster
profile (clusters x features, each feature standardised over the records, in the tree's leaf
order), the top categories of categorical columns, and the table of the largest clusters, all
from the clusters' statistics (``pipeline.families.profile``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pipeline.families import FloatArray, ProductFamily
from pipeline.families.profile import category_shares, column_means
from pipeline.families.schema import Schema
from pipeline.ops.page import draw_bars, fmt, new_figure, short_name

IntArray = NDArray[np.int64]


# the most clusters (the rest pooled) and features (those differing most) the profile shows
PROFILE_CLUSTERS = 40


PROFILE_FEATURES = 60


# categorical columns drawn (``categories.png``) and categories per column named
CATEGORY_COLUMNS = 4


TOP_CATEGORIES = 5


# rows of the largest-clusters table and of the contingency picture (true labels, clusters)
TABLE_ROWS = 20


# a z-score colour scale clipped here: a cluster 2.5 sd off the mean is already far off
Z_CLIP = 2.5


@dataclass
class Profile:
    """The clusters the profile shows: ``shown`` ids in display order, ``rest`` the ids pooled in
    the last row, ``z`` (rows, F) standardised means of ``features``, ``means`` and ``zall``
    (K, D) every cluster's means and z-scores in store order, ``names`` the store's columns."""

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
    standardised cluster means."""
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
    names = [short_name(prof.names[j]) for j in prof.features]
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
    draw_bars(axs, np.arange(n_rows), bars, color="0.55", width=0.75, horizontal=True)
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
    """The top categories of each categorical column in each shown cluster ("red 62%, blue
    30%"), None without any, and the shares (store column index -> (K, C))."""
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
    out: Path, data: RunData, names: list[str], shares: dict[int, FloatArray], shown: list[int]
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
        ax.set_title(short_name(names[j], 30), fontsize=9)
        ax.tick_params(labelsize=7)
        if i == 0:
            ax.set_yticks(range(n), [str(k) for k in shown], fontsize=8 if n <= 30 else 6.5)
            ax.set_ylabel("cluster")
        else:
            ax.set_yticks([])
        handles = [
            Patch(color=colours[t], label=short_name(_category(cats, int(c)), 14))
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


@dataclass
class RunData:
    """What the report is drawn from besides run.json: ``stats`` (K, S), the records' moments
    ``mean`` and ``cov``, the write-out's sample ``plot_X`` / ``plot_labels``, and
    ``contingency`` (3, P) triples (true label code, cluster, count) or None."""

    history: list[dict[str, Any]]
    stats: FloatArray
    family: ProductFamily
    schema: Schema
    mean: FloatArray
    cov: FloatArray
    plot_X: FloatArray
    plot_labels: IntArray
    contingency: IntArray | None = None
