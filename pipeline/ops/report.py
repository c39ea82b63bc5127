"""What a run leaves besides the labels: ``clusters.parquet``, ``run.json`` and a report with
pictures (objective per pass, cluster sizes, a 2-D projection of a sample coloured by cluster),
as ``report.html`` and ``report.md``."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.families import FloatArray


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
    """Write the report's pictures into ``out``; their file names."""
    # the object-oriented API with the Agg canvas: no pyplot (whose import and backend set-up
    # cost more than drawing the three pictures), and fixed margins instead of tight_layout,
    # which draws each figure twice
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def new_axes(height: float) -> tuple[Figure, Any]:
        fig = Figure(figsize=(5, height))
        FigureCanvasAgg(fig)
        fig.subplots_adjust(left=0.17, right=0.96, bottom=0.15, top=0.9)
        return fig, fig.add_subplot()

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
    ax.bar(np.arange(sizes.shape[0]), sizes[order], color="tab:blue")
    ax.set_xlabel("cluster (by size)")
    ax.set_ylabel("records")
    ax.set_yscale("log" if sizes.size and sizes.max() > 100 * max(sizes.min(), 1) else "linear")
    ax.set_title(f"Cluster sizes ({sizes.shape[0]} clusters)")
    fig.savefig(out / "sizes.png", dpi=100)
    names.append("sizes.png")

    if plot_X.shape[0]:
        P = _projection(plot_X, cov, mean)
        fig, ax = new_axes(4.5)
        ax.scatter(P[:, 0], P[:, 1], c=plot_labels % 20, cmap="tab20", s=4, alpha=0.7)
        ax.set_xlabel("principal axis 1")
        ax.set_ylabel("principal axis 2")
        ax.set_title(f"{plot_X.shape[0]} records, coloured by cluster")
        fig.savefig(out / "projection.png", dpi=100)
        names.append("projection.png")
    return names


def write_report(
    out: Path, run: dict[str, Any], clusters: pd.DataFrame, pictures: list[str]
) -> None:
    """``report.md`` and ``report.html`` in ``out``."""
    m = run.get("metrics", {})
    lines = [
        ("input", run.get("input")),
        ("records", f"{run.get('n_rows', 0):,} ({run.get('n_train', 0):,} fitted)"),
        ("engine", run["parameters"].get("engine")),
        ("clusters", m.get("n_clusters")),
        ("passes", f"{m.get('passes')} ({'converged' if m.get('converged') else 'not converged'})"),
        ("objective", f"{m.get('objective', float('nan')):.6g}"),
        ("total time", f"{run.get('timing', {}).get('total', 0):.2f} s"),
        ("records per second", f"{m.get('records_per_second', 0):,.0f}"),
        ("held-out mean log predictive density", m.get("heldout_mean_log_density")),
    ]
    top = clusters.sort_values("size", ascending=False).head(20)
    md = ["# dpmm run report", ""]
    md += [f"- **{k}**: {v}" for k, v in lines]
    md += ["", "## Pictures", ""] + [f"![{p}]({p})" for p in pictures]
    md += [
        "",
        "## Largest clusters",
        "",
        top.to_markdown(index=False) if _has_tabulate() else top.to_string(),
    ]
    (out / "report.md").write_text("\n".join(md) + "\n")
    body = ["<h1>dpmm run report</h1>", "<ul>"]
    body += [f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>" for k, v in lines]
    body += ["</ul>", "<h2>Pictures</h2>"]
    body += [f'<img src="{p}" alt="{p}" style="max-width:32%">' for p in pictures]
    body += [
        "<h2>Largest clusters</h2>",
        top.to_html(index=False, float_format=lambda v: f"{v:.4g}"),
    ]
    (out / "report.html").write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>dpmm run report</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
