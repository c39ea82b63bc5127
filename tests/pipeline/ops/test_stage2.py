"""Stage 2 on summaries: BHC (+ tgMCMC) maps over-segmented stage-1 clusters to final ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.cluster.hierarchy import dendrogram, is_valid_linkage
from sklearn.metrics import adjusted_rand_score

from pipeline.estimators.bhc import BHC
from pipeline.families import GaussianNW
from pipeline.ops.stage2 import run_stage2


def _summaries():
    """Three separated blobs, each cut into four pieces along x: 12 summaries."""
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [12.0, 0.0], [0.0, 12.0]])
    X = np.vstack([c + rng.normal(size=(200, 2)) for c in centers])
    blob = np.repeat(np.arange(3), 200)
    piece = np.concatenate([np.argsort(np.argsort(X[blob == b, 0])) * 4 // 200 for b in range(3)])
    summary = blob * 4 + piece
    fam = GaussianNW.empirical_bayes(X).as_product()
    stats = fam.stats_of(fam.arrange(X), summary.astype(np.int64), 12)
    return stats, fam, np.repeat(np.arange(3), 4)


def _last_line(code: str) -> str:
    """The last line ``code`` prints, run in a fresh interpreter from the repository root."""
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    return res.stdout.splitlines()[-1]


def test_bhc_maps_pieces_back_to_blobs(tmp_path) -> None:
    stats, fam, truth = _summaries()
    res = run_stage2(stats, fam, 1.0, tmp_path)
    assert adjusted_rand_score(truth, res.mapping) == 1.0
    assert res.info["n_clusters"] == 3
    assert res.info["lower_bound"] <= res.info["log_evidence"] + 1e-9
    tree = pd.read_parquet(tmp_path / "tree.parquet")
    assert len(tree) == 2 * 12 - 1
    assert is_valid_linkage(np.load(tmp_path / "linkage.npy"))
    assert (tmp_path / "dendrogram.png").stat().st_size > 1000
    assert res.info["pictures"] == ["dendrogram.png"]
    # the report's cluster order: the clusters in the order of the tree's leaves, each once; the
    # tree's leaves are the cut's subtrees, so each cluster's summaries are together in the
    # order of the full dendrogram's leaves
    order = res.info["cluster_order"]
    leaves = dendrogram(np.load(tmp_path / "linkage.npy"), no_plot=True)["leaves"]
    assert order == list(dict.fromkeys(int(res.mapping[i]) for i in leaves))
    assert sorted(order) == [0, 1, 2]


def test_stage_2_fits_the_tree_the_estimator_fits(tmp_path) -> None:
    # the same ``pipeline.models.bhc.fit_tree`` on both paths: the same tree, cut and bounds
    stats, fam, _ = _summaries()
    res = run_stage2(stats, fam, 0.7, tmp_path)
    bhc = BHC(alpha=0.7, family=fam).fit_summaries(stats, fam)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "tree.parquet"), bhc.tree_.to_pandas())
    assert res.info["log_evidence"] == bhc.log_evidence_
    assert res.info["lower_bound"] == bhc.lower_bound_
    assert res.info["alt_lower_bound"] == bhc.alt_lower_bound_
    assert adjusted_rand_score(bhc.labels_, res.mapping) == 1.0


# in a fresh process: stage 2 (without tree-guided MCMC), the run's label scores and its report
# import no scikit-learn, whose import is most of a second of a command's start-up
_NO_SKLEARN = """
import sys, tempfile
import numpy as np
from pipeline.distributed.writeout import label_scores
from pipeline.families import GaussianNW
from pipeline.ops import report
from pipeline.ops.stage2 import run_stage2

rng = np.random.default_rng(0)
X = np.vstack([c + rng.normal(size=(100, 2)) for c in ([0.0, 0.0], [9.0, 0.0])])
fam = GaussianNW.empirical_bayes(X).as_product()
z = np.arange(200, dtype=np.int64) % 6
res = run_stage2(fam.stats_of(fam.arrange(X), z, 6), fam, 1.0, tempfile.mkdtemp())
label_scores(np.vstack([z // 3, res.mapping[z], np.ones(200, dtype=np.int64)]))
print(sorted(m for m in sys.modules if m.split(".")[0] == "sklearn"))
"""


def test_stage_2_and_the_label_scores_import_no_scikit_learn() -> None:
    assert _last_line(_NO_SKLEARN) == "[]"


def test_tgmcmc_after_bhc_writes_posterior(tmp_path) -> None:
    stats, fam, truth = _summaries()
    res = run_stage2(stats, fam, 1.0, tmp_path, mcmc_iter=60, random_state=0)
    assert adjusted_rand_score(truth, res.mapping) == 1.0
    post = pd.read_parquet(tmp_path / "posterior_k.parquet")
    assert abs(post["probability"].sum() - 1.0) < 1e-12
    assert sorted(res.info["cluster_order"]) == list(range(res.info["n_clusters"]))
    assert (tmp_path / "dendrogram.png").stat().st_size > 1000
    co = np.load(tmp_path / "coclustering.npy")
    assert co.shape == (12, 12)
    np.testing.assert_allclose(np.diag(co), 1.0)
    assert set(res.info["acceptance_rate"])


def test_none_is_identity(tmp_path) -> None:
    stats, fam, _ = _summaries()
    res = run_stage2(stats, fam, 1.0, tmp_path, method="none")
    np.testing.assert_array_equal(res.mapping, np.arange(12))


# in a fresh process: the kernels' specialisations (module-qualified name, signature) loaded by
# `dpmm warm`'s stage-2 steps in the rounds of the spec types stage 2 takes, then those that
# stage 2 with tree-guided MCMC adds on summaries of a family of each of these spec types
_COVERED = """
import json, tempfile
from kernels.obs.product import ANY_DTYPE
from pipeline.distributed.worker_setup import STAGE2_STEPS
from pipeline.engines import warmup
from pipeline.ops.stage2 import MCMC_STEP, run_stage2
from tests.conftest import kernel_signatures
from tests.pipeline.ops.test_stage2 import _summaries

for dtype in (None, ANY_DTYPE):
    with warmup.toy_spec(dtype):
        STAGE2_STEPS["bhc"]()
        MCMC_STEP[1]()
warmed = kernel_signatures()
stats, fam, _ = _summaries()
for dtype in (fam.spec.dtype, ANY_DTYPE):
    fam.spec = fam.spec.astype(dtype)
    run_stage2(stats, fam, 1.0, tempfile.mkdtemp(), mcmc_iter=20, random_state=0)
print(json.dumps(sorted(f"{k} {sig}" for k, sig in kernel_signatures() - warmed)))
"""


def test_the_warm_up_of_stage_2_covers_its_tree_guided_mcmc() -> None:
    """``dpmm warm``'s stage-2 steps (BHC's and ``MCMC_STEP``) load every kernel specialisation
    that stage 2 with ``mcmc_iter`` calls on summaries of an int32 (Normal-Wishart) and an int64
    (any family) spec: after ``dpmm warm`` a first ``dpmm run --mcmc`` compiles nothing."""
    assert json.loads(_last_line(_COVERED)) == []
