"""Stage 2 of the pipeline (DESIGN.md): the tree stage on cluster summaries.

BHC (Xu et al. 2009) agglomerates the stage-1 summaries, its r_k < 0.5 cut gives the partition, and
optionally tree-guided MCMC (Lee and Choi 2015) samples partitions of the summaries started from it.
Only statistics are read; the mapping from summaries to final clusters is applied to the records by
the write-out tasks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from kernels import partition as kpartition
from pipeline.distributed.worker_setup import stage2_step
from pipeline.engines.warmup import await_step, toy_family
from pipeline.families import ProductFamily, as_product, check_summaries
from pipeline.models.bhc import Cut, fit_tree
from pipeline.ops.page import new_figure

IntArray = NDArray[np.int64]

STAGE2_METHODS = ("none", "bhc")


@dataclass
class Stage2Result:
    """``mapping`` (M,): final cluster 0..K'-1 of each summary; ``info``: figures for run.json;
    ``files``: what was written."""

    mapping: IntArray
    info: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)


# the most leaves a dendrogram labels one by one (a larger tree is truncated to its last merges)
TREE_LEAVES = 100
_MERGED = "#1f77b4"
_ABOVE_CUT = "#222222"


def _collapsed_linkage(
    Z: NDArray[np.float64], M: int, owner: IntArray, cut: IntArray
) -> NDArray[np.float64]:
    """The linkage ``Z`` (M - 1, 4) of a tree of M leaves with each subtree of the cut (``cut``,
    ``owner``) made one leaf."""
    new_id = np.full(2 * M - 1, -1, dtype=np.int64)
    n_under = np.zeros(2 * M - 1)
    new_id[cut] = np.arange(cut.shape[0])
    n_under[cut] = 1.0
    rows: list[tuple[float, float, float, float]] = []
    for t in range(M - 1):
        k = M + t
        if owner[k] >= 0:
            continue
        a, b = int(Z[t, 0]), int(Z[t, 1])
        new_id[k] = cut.shape[0] + len(rows)
        n_under[k] = n_under[a] + n_under[b]
        rows.append((new_id[a], new_id[b], Z[t, 2], n_under[k]))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4)


def _cut_owner(left: IntArray, right: IntArray, cut: IntArray) -> IntArray:
    """Each node's index in ``cut`` of the cut's subtree holding it; -1 above the cut."""
    owner = np.full(left.shape[0], -1, dtype=np.int64)
    for c, node in enumerate(cut):
        stack = [int(node)]
        while stack:
            k = stack.pop()
            owner[k] = c
            if left[k] >= 0:
                stack += [int(left[k]), int(right[k])]
    return owner


def _posterior_panel(ax: Any, posterior: pd.DataFrame) -> None:
    """tgMCMC's posterior over the number of clusters, as horizontal bars beside the tree."""
    ks = posterior["n_clusters"].to_numpy()
    ax.barh(ks, posterior["probability"], height=0.7, color="tab:blue")
    if ks.size <= 15:
        ax.set_yticks(ks)
    ax.set_ylim(ks.min() - 1, ks.max() + 1)
    ax.set_xlabel("posterior probability", fontsize=8)
    ax.set_ylabel("K (tgMCMC)", fontsize=8)
    ax.set_title("posterior over K", fontsize=10)
    ax.tick_params(labelsize=7)


def _tree_picture(
    bhc: Cut,
    sizes: NDArray[np.float64],
    mapping: IntArray,
    posterior: pd.DataFrame | None,
    path: Path,
) -> list[int]:
    """``dendrogram.png`` of the BHC tree down to its cut (with ``posterior`` beside it); the
    final clusters in the order of the drawn leaves."""
    from matplotlib.lines import Line2D
    from scipy.cluster.hierarchy import dendrogram

    tree = bhc.tree
    M = tree.n_leaves
    Z = tree.linkage()
    cut = np.asarray(bhc.nodes, dtype=np.int64)
    owner = _cut_owner(tree.left, tree.right, cut)

    def label(finals: np.ndarray, n: float) -> str:
        ids = "+".join(str(int(f)) for f in finals[:3]) + ("+…" if finals.size > 3 else "")
        return f"{ids} · {n:,.0f}"

    collapse = cut.shape[0] >= 2
    fig = new_figure(12, 4.8)
    if posterior is not None:
        grid = fig.add_gridspec(1, 2, width_ratios=[5, 1], wspace=0.12)
        ax = fig.add_subplot(grid[0])
        ax_k = fig.add_subplot(grid[1])
    else:
        ax = fig.add_subplot()
    n_leaves = cut.shape[0] if collapse else M
    # a few leaves' labels read across, many only upright
    # room below the axes for upright labels, then the legend
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.18 if n_leaves <= 12 else 0.27, top=0.92)
    kw: dict[str, Any] = {
        "ax": ax,
        "leaf_rotation": 0 if n_leaves <= 12 else 90,
        "above_threshold_color": _ABOVE_CUT,
    }
    if collapse:
        Zc = _collapsed_linkage(Z, M, owner, cut)
        finals = [np.unique(mapping[owner[:M] == c]) for c in range(cut.shape[0])]
        names = [label(f, float(sizes[owner[:M] == c].sum())) for c, f in enumerate(finals)]
        if cut.shape[0] > TREE_LEAVES:
            kw.update(truncate_mode="lastp", p=TREE_LEAVES)
        out = dendrogram(
            Zc,
            labels=names,
            leaf_font_size=9 if n_leaves <= 12 else 7 if n_leaves <= 60 else 6,
            link_color_func=lambda k: _ABOVE_CUT,
            **kw,
        )
        order = [int(f) for c in out["leaves"] if c < len(finals) for f in finals[c]]
        # the cut: a dot at every leaf, each a subtree of summaries merged with r_k > 0.5
        xs = 5.0 + 10.0 * np.arange(len(out["leaves"]))
        ax.plot(xs, np.zeros_like(xs), "o", color="#d62728", ms=4, clip_on=False, zorder=3)
        what = f"{M} summaries; each dot: one subtree of the cut"
    else:
        names = [label(mapping[i : i + 1], float(sizes[i])) for i in range(M)]
        if M > TREE_LEAVES:
            kw.update(truncate_mode="lastp", p=TREE_LEAVES)
        out = dendrogram(Z, labels=names, leaf_font_size=7, link_color_func=lambda k: _MERGED, **kw)
        order = [int(mapping[i]) for i in out["leaves"] if i < M]
        what = f"leaves: the {M} summaries"
    # -log r spans from ~0 inside clusters to millions at the top merges: a symlog axis shows both
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylabel("cumulative -log r_k (symlog)")
    ax.set_xlabel("final cluster · records", fontsize=8)
    ax.set_title(
        f"BHC tree: {int(mapping.max()) + 1 if mapping.size else 0} clusters at the r_k < 0.5 "
        f"cut ({what})",
        fontsize=10,
    )
    if collapse:
        handles = [
            Line2D([], [], color=_ABOVE_CUT, lw=2, label="split (r_k < 0.5)"),
            Line2D([], [], color="#d62728", marker="o", ls="", label="a cluster of the cut"),
        ]
    else:
        handles = [Line2D([], [], color=_MERGED, lw=2, label="merged (one cluster)")]
    fig.legend(handles=handles, fontsize=7, loc="lower left", ncol=2, frameon=False)
    if posterior is not None:
        _posterior_panel(ax_k, posterior)
    fig.savefig(path, dpi=100)
    # every final cluster once, in leaf order (one missing from the drawing goes last)
    K = int(mapping.max()) + 1 if mapping.size else 0
    seen = list(dict.fromkeys(order))
    return seen + [k for k in range(K) if k not in set(seen)]


_MCMC_FILES = ("posterior_k.parquet", "coclustering.npy", "mcmc_trace.parquet")


def _mcmc(
    stats: NDArray[np.float64],
    family: ProductFamily,
    alpha: float,
    labels: IntArray,
    mcmc_iter: int,
    random_state: Any,
    out: Path,
    info: dict[str, Any],
) -> tuple[IntArray, pd.DataFrame]:
    """Tree-guided MCMC over the summaries from BHC's ``labels``: writes ``_MCMC_FILES`` under
    ``out``, adds its figures to ``info``; returns its labels and posterior over K."""
    from pipeline.estimators.tgmcmc import TreeGuidedMCMC

    t1 = time.perf_counter()
    mc = TreeGuidedMCMC(
        prior="dp",
        alpha=alpha,
        family=family,
        n_iter=int(mcmc_iter),
        burn_in=int(mcmc_iter) // 4,
        init=labels,
        random_state=random_state,
    ).fit_summaries(stats, family)
    t_mc = time.perf_counter() - t1
    ks = np.asarray(mc.n_clusters_trace_)[int(mcmc_iter) // 4 :]
    values, counts = np.unique(ks, return_counts=True)
    post = pd.DataFrame({"n_clusters": values, "probability": counts / counts.sum()})
    more = [out / f for f in _MCMC_FILES]
    post.to_parquet(more[0], index=False)
    np.save(more[1], np.asarray(mc.coclustering_))
    pd.DataFrame({"log_joint": mc.log_joint_, "n_clusters": mc.n_clusters_trace_}).to_parquet(
        more[2], index=False
    )
    info.update(
        mcmc_iter=int(mcmc_iter),
        seconds_mcmc=t_mc,
        acceptance_rate={k: float(v) for k, v in mc.acceptance_rate_.items()},
        ess_n_clusters=float(mc.ess_n_clusters_),
        posterior_n_clusters={int(k): float(p) for k, p in zip(values, post["probability"])},
    )
    return np.asarray(mc.labels_, dtype=np.int64), post


def warm_mcmc() -> None:
    """Load the kernels of stage 2's tree-guided MCMC (``_mcmc``), and of an in-memory
    ``TreeGuidedMCMC`` fit, prediction and scores, for the warm-up's toy family: ``dpmm
    warm``'s step ``MCMC_STEP`` in each round of a spec type stage 2 takes. Without it a first
    ``dpmm run --mcmc`` or ``TreeGuidedMCMC().fit`` compiled for about a minute."""
    from pipeline.estimators.tgmcmc import TreeGuidedMCMC

    X, family = toy_family()
    mc = TreeGuidedMCMC(family=family, n_iter=8, burn_in=2, random_state=0).fit(X)
    mc.predict(X)
    mc.score_samples(X)


#: ``warm_mcmc`` under its warm-up step's name, which ``dpmm warm`` hands to ``warm_kernels``
#: (a step defined above the workers' layer, which cannot import the estimator)
MCMC_STEP = (stage2_step("mcmc"), warm_mcmc)


def run_stage2(
    stats: NDArray[np.float64],
    family: ProductFamily,
    alpha: float,
    out_dir: str | Path,
    *,
    method: str = "bhc",
    mcmc_iter: int = 0,
    random_state: Any = None,
) -> Stage2Result:
    """BHC over the summaries, then optionally tree-guided MCMC; writes the tree outputs.

    Parameters
    ----------
    stats : ndarray of shape (M, S)
        Statistics of the stage-1 summaries; ``stats[:, 0]`` is each summary's size.
    family : ProductFamily
    alpha : float
        DP concentration (stage 1's learned value).
    out_dir : path
        Receives ``tree.parquet``, ``linkage.npy`` and ``dendrogram.png``; with ``mcmc_iter``
        also ``posterior_k.parquet``, ``coclustering.npy`` (M, M) and ``mcmc_trace.parquet``.
    method : {"bhc", "none"}
    mcmc_iter : int
        Iterations of ``TreeGuidedMCMC`` started from the BHC partition; 0 skips.
    random_state : int, SeedSequence or None

    Returns
    -------
    Stage2Result
    """
    stats = np.ascontiguousarray(np.asarray(stats, dtype=np.float64))
    M = stats.shape[0]
    out = Path(out_dir)
    if method not in STAGE2_METHODS:
        raise ValueError(f"stage 2 method must be one of {STAGE2_METHODS}, got {method!r}")
    if method == "none" or M <= 1:
        return Stage2Result(np.arange(M, dtype=np.int64), {"method": "none", "n_summaries": M})
    # a warm-up helper may be compiling BHC's kernels now: wait and load them, not compile twice
    await_step(stage2_step(method))
    t0 = time.perf_counter()
    # as ``BHC().fit_summaries(stats, family)`` fits them (its spec widened, so that stage 2
    # compiles one BHC per spec type), without the estimator's libraries
    given = as_product(family)
    leaves = check_summaries(stats, given)
    bhc = fit_tree(leaves, given.widened(), math.log(alpha))
    t_bhc = time.perf_counter() - t0
    files = [out / "tree.parquet", out / "linkage.npy", out / "dendrogram.png"]
    bhc.tree.to_pandas().to_parquet(files[0], index=False)
    np.save(files[1], bhc.tree.linkage())
    info: dict[str, Any] = {
        "method": "bhc",
        "n_summaries": M,
        "n_clusters": int(bhc.nodes.shape[0]),
        "log_evidence": bhc.log_evidence,
        "lower_bound": bhc.lower_bound,
        "alt_lower_bound": bhc.alt_lower_bound,
        "seconds_bhc": t_bhc,
    }
    labels = np.asarray(bhc.labels, dtype=np.int64)
    post: pd.DataFrame | None = None
    if mcmc_iter > 0:
        labels, post = _mcmc(stats, family, alpha, labels, mcmc_iter, random_state, out, info)
        files += [out / f for f in _MCMC_FILES]
    # numbered 0..K-1 in order of first appearance
    mapping = np.array(labels, dtype=np.int64)
    kpartition.canonical_labels(mapping, mapping)
    info["n_clusters"] = int(mapping.max()) + 1
    # the picture is drawn last: its leaves carry the final clusters
    info["cluster_order"] = _tree_picture(bhc, stats[:, 0], mapping, post, files[2])
    info["pictures"] = [files[2].name]
    return Stage2Result(mapping, info, files)
