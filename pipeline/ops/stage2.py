"""Stage 2 of the pipeline (DESIGN.md): the tree stage on cluster summaries.

BHC (seed 001) agglomerates the stage-1 summaries, its r_k < 0.5 cut gives the partition, and
optionally tree-guided MCMC (seed 004) samples partitions of the summaries started from it. Only
statistics are read; the mapping from summaries to final clusters is applied to the records by
the write-out tasks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from kernels import partition as kpartition
from pipeline.distributed.worker_setup import stage2_step
from pipeline.engines.warmup import await_step
from pipeline.estimators.bhc import BHC
from pipeline.families import ProductFamily

IntArray = NDArray[np.int64]

STAGE2_METHODS = ("none", "bhc")


@dataclass
class Stage2Result:
    """``mapping`` (M,): final cluster 0..K'-1 of each summary; ``info``: figures for run.json;
    ``files``: what was written."""

    mapping: IntArray
    info: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)


def _dendrogram(linkage: NDArray[np.float64], path: Path, n_leaves: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy.cluster.hierarchy import dendrogram

    fig, ax = plt.subplots(figsize=(10, 4.5))
    kw: dict[str, Any] = {"no_labels": n_leaves > 60}
    if n_leaves > 60:
        kw.update(truncate_mode="lastp", p=60)
    dendrogram(linkage, ax=ax, color_threshold=0, above_threshold_color="#444", **kw)
    # -log r spans from ~0 inside clusters to millions at the top merges: a symlog axis shows both
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_title(f"BHC tree over {n_leaves} cluster summaries (cut at r_k < 0.5)")
    ax.set_ylabel("cumulative -log r_k (symlog)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        Receives ``tree.parquet`` (one row per node: node, parent, left, right, n, log r, ...),
        ``linkage.npy`` (SciPy linkage), ``dendrogram.png``; with ``mcmc_iter`` also
        ``posterior_k.parquet`` (posterior over the number of clusters), ``coclustering.npy``
        (M, M) and ``mcmc_trace.parquet`` (log joint and K per iteration).
    method : {"bhc", "none"}
    mcmc_iter : int
        Iterations of ``TreeGuidedMCMC`` (DP prior) started from the BHC partition; 0 skips.
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
    # a warm-up helper may be compiling BHC's kernels at this moment (``dpmm demo``: during
    # the flow): wait for it and load them rather than compile them a second time alongside
    await_step(stage2_step(method))
    t0 = time.perf_counter()
    bhc = BHC(alpha=alpha, family=family).fit_summaries(stats, family)
    t_bhc = time.perf_counter() - t0
    files = [out / "tree.parquet", out / "linkage.npy", out / "dendrogram.png"]
    bhc.tree_.to_pandas().to_parquet(files[0], index=False)
    linkage = bhc.tree_.linkage()
    np.save(files[1], linkage)
    _dendrogram(linkage, files[2], M)
    info: dict[str, Any] = {
        "method": "bhc",
        "n_summaries": M,
        "n_clusters": int(bhc.n_clusters_),
        "log_evidence": float(bhc.log_evidence_),
        "lower_bound": float(bhc.lower_bound_),
        "alt_lower_bound": float(bhc.alt_lower_bound_),
        "seconds_bhc": t_bhc,
    }
    labels = np.asarray(bhc.labels_, dtype=np.int64)
    if mcmc_iter > 0:
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
        more = [out / "posterior_k.parquet", out / "coclustering.npy", out / "mcmc_trace.parquet"]
        post.to_parquet(more[0], index=False)
        np.save(more[1], np.asarray(mc.coclustering_))
        pd.DataFrame({"log_joint": mc.log_joint_, "n_clusters": mc.n_clusters_trace_}).to_parquet(
            more[2], index=False
        )
        files += more
        labels = np.asarray(mc.labels_, dtype=np.int64)
        info.update(
            mcmc_iter=int(mcmc_iter),
            seconds_mcmc=t_mc,
            acceptance_rate={k: float(v) for k, v in mc.acceptance_rate_.items()},
            ess_n_clusters=float(mc.ess_n_clusters_),
            posterior_n_clusters={int(k): float(p) for k, p in zip(values, post["probability"])},
        )
    # numbered 0..K-1 in order of first appearance
    mapping = np.array(labels, dtype=np.int64)
    kpartition.canonical_labels(mapping, mapping)
    info["n_clusters"] = int(mapping.max()) + 1
    return Stage2Result(mapping, info, files)
