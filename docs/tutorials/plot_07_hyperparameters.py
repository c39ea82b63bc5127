"""
Choosing hyperparameters: ``dpmm cv`` and ``tune="cv"``
=======================================================

Labels are never used: hyperparameters are chosen by K-fold held-out log predictive density
(Raykov et al. 2016, Appendix A, option 4). ``MAPDP(tune="cv")`` tries alpha, then the prior
scale, one at a time (``family="auto"`` chooses the covariance kind by held-out density itself);
``dpmm cv`` fits a whole grid as a Prefect flow.
"""

# %%
import json
import tempfile
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from distributed import LocalCluster
from sklearn.datasets import load_wine

from flows.cli import main
from pipeline import MAPDP
from pipeline.core.diagnose import DegenerateFitWarning

wine = load_wine(as_frame=True)
work = Path(tempfile.mkdtemp())
wine.data.assign(label=wine.target).to_csv(work / "wine.csv", index=False)

# %%
# The grid: two prior scales x two alphas, 3 folds, and the best cell refitted on every record.
out = work / "cv"
# The command joins a Dask cluster of this process's threads (``--scheduler``); leave it out
# and ``dpmm`` starts a local cluster of its own.
cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
cmd = f"cv {work}/wine.csv --out {out} --prior-scale 0.3,0.1 --alpha 1,10 --folds 3"
cmd += " --label-column label --quiet"
status = main([*cmd.split(), "--scheduler", cluster.scheduler_address])
grid = pd.read_parquet(out / "cv.parquet")
print("exit status", status)
shown = ["family", "prior_scale", "alpha", "mean_log_density", "se_log_density", "n_clusters"]
print(grid[[*shown, "chosen"]].round(3).to_string(index=False))
print("chosen:", json.loads((out / "cv.json").read_text()).get("chosen"))

# %%
# In Python, ``tune="cv"`` does the same on one estimator.
# Some candidates of the search over-segment and warn (``DegenerateFitWarning``); the chosen fit
# is the one that predicts held-out records best.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DegenerateFitWarning)
    m = MAPDP(tune="cv", random_state=0).fit(wine.data)
print("clusters:", m.n_clusters_, "chosen:", m.best_params_)

# %%
# The grid's held-out density, as ``OUT/cv.png`` draws it.
fig, ax = plt.subplots(figsize=(6, 4))
ax.imshow(plt.imread(out / "cv.png"))
ax.axis("off")
fig.tight_layout()
cluster.close()
