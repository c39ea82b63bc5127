"""What a run leaves besides the labels: ``clusters.parquet``, ``run.json`` and a report,
``report.html`` and ``report.md`` (one layout for every command: ``pipeline.ops.page``).

The report says what the run was (with a warning when the fit looks degenerate), what
distinguishes the clusters (``profile.png``, ``categories.png``, tables), stage 2's tree, how good
the fit is (held-out density, NMI, ARI, ``contingency.png``) and how it went. Everything is drawn
from the clusters' statistics and the write-out's picture sample, never from the records, so the
report costs the same for a thousand records as for a billion.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse.linalg
from numpy.typing import NDArray

from pipeline.core.diagnose import degenerate_fit
from pipeline.families import FloatArray
from pipeline.families.schema import scale_rows
from pipeline.ops.page import (
    Page,
    Picture,
    await_preload,
    draw_bars,
    fmt,
    new_axes,
    new_figure,
    plain_log_axis,
)
from pipeline.ops.profile import (
    CATEGORY_COLUMNS,
    TABLE_ROWS,
    RunData,
    categories_picture,
    category_table,
    largest_table,
    profile,
    profile_picture,
)

IntArray = NDArray[np.int64]

CONTINGENCY_MAX = 30


#: above this many columns ``top_axes`` iterates instead of decomposing the covariance
EIGH_MAX_COLS = 64


def top_axes(cov: FloatArray, k: int) -> FloatArray:
    """The eigenvectors of the k largest eigenvalues of the covariance ``cov`` (d, d), shape
    (d, k), largest first: a full decomposition up to ``EIGH_MAX_COLS`` columns, above it
    Lanczos iterations from a fixed start (5,000 columns: 1.2 s against 10 s)."""
    S = 0.5 * (cov + cov.T)
    d = S.shape[0]
    if d <= EIGH_MAX_COLS:
        w, V = np.linalg.eigh(S)
    else:
        w, V = scipy.sparse.linalg.eigsh(S, k=k, which="LA", v0=np.ones(d))
    return V[:, np.argsort(w)[::-1][:k]]


def figures(
    out: Path,
    history: list[dict[str, Any]],
    sizes: np.ndarray,
    plot_X: FloatArray,
    plot_labels: np.ndarray,
    mean: FloatArray,
    cov: FloatArray,
) -> list[str]:
    """``objective.png``, ``sizes.png`` and ``projection.png`` (the sample on two principal
    axes) into ``out``; their file names."""
    names = []
    fig, ax = new_axes(3.2)
    ax.plot([h["pass"] for h in history], [h["objective"] for h in history], "o-")
    ax.set_xlabel("pass")
    ax.set_ylabel("objective  -log p(X, z)")
    ax.set_title("Objective per pass")
    fig.savefig(out / "objective.png", dpi=100)
    names.append("objective.png")

    fig, ax = new_axes(3.2)
    order = np.argsort(sizes)[::-1]
    log = bool(sizes.size and sizes.max() > 100 * max(sizes.min(), 1))
    # on a log axis the bars start at 1 record (0 has no place there)
    draw_bars(ax, np.arange(sizes.shape[0]), sizes[order] - log, start=float(log))
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("cluster (by size)")
    ax.set_ylabel("records")
    if log:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
    else:
        ax.set_ylim(0, None)
    ax.set_title(f"Cluster sizes ({sizes.shape[0]} clusters)")
    fig.savefig(out / "sizes.png", dpi=100)
    names.append("sizes.png")

    if plot_X.shape[0]:
        # the sample on the first two principal axes of the data's covariance
        P = np.column_stack([plot_X[:, 0] - mean[0], np.zeros(plot_X.shape[0])])
        if plot_X.shape[1] > 1:
            P = (plot_X - mean) @ top_axes(cov, 2)
        fig, ax = new_axes(3.2)
        ax.scatter(P[:, 0], P[:, 1], c=plot_labels % 20, cmap="tab20", s=4, alpha=0.7)
        ax.set_xlabel("principal axis 1")
        ax.set_ylabel("principal axis 2")
        ax.set_title(f"{plot_X.shape[0]:,} records, coloured by cluster")
        fig.savefig(out / "projection.png", dpi=100)
        names.append("projection.png")
    return names


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


def _prior_scale_line(given: Any, structure: dict[str, Any]) -> str:
    """The report's line on the empirical-Bayes prior scale: the one given, the one of lowest
    objective on the structure's sample (``Schema.choose_scale``), or the engine's default."""
    if given is not None:
        return f"{fmt(given)} (given)"
    if "scale" not in structure:
        return "the engine's default"
    tried = ", ".join(f"{fmt(s)}: {fmt(e)}" for s, e in structure.get("scales", []))
    n = scale_rows(int(structure["rows"]), len(structure["columns"]))
    return (
        f"{fmt(structure['scale'])}, of lowest objective -log p(X, z, N0) on {fmt(n)} rows of "
        f"the covariance's sample ({tried})"
    )


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
        ("covariance", (run.get("structure") or {}).get("note", "as named")),
        ("prior scale", _prior_scale_line(p.get("prior_scale"), run.get("structure") or {})),
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


def _hierarchy(page: Page, s2: dict[str, Any]) -> None:
    """The section of stage 2's tree (``pipeline.ops.stage2``), and tgMCMC's posterior."""
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


def write_report(
    out: Path, run: dict[str, Any], clusters: pd.DataFrame, data: RunData
) -> list[str]:
    """The pictures, ``report.html`` and ``report.md`` of a run into ``out``; the names of the
    files written."""
    await_preload()
    m = run.get("metrics", {})
    s2 = run.get("stage2_info") or {}
    names = [data.schema.columns[j] for j in data.family.column_order]
    tree_order = s2.get("cluster_order")
    warned = [degenerate_fit(int(m.get("n_clusters") or 0), int(run.get("n_train") or 0))]
    if m.get("converged") is False and m.get("passes"):
        warned.append(
            f"the passes stopped at the limit ({m['passes']}) before converging: raise "
            "--max-passes, or loosen --tol"
        )
    page = Page("dpmm run report", _facts(run), [w for w in warned if w])
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
        _hierarchy(page, s2)

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
