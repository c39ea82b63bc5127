"""
A larger file through ``dpmm run``
==================================

The distributed pipeline on a CSV of 20,000 records: ingest into a dataset store, MAP-DP passes
over its chunks on a local Dask cluster, the write-out of every record's label and held-out log
density, and the report. ``main([...])`` runs the ``dpmm`` command in this process; in a shell it
is ``dpmm run records.csv --out OUT --label-column label --holdout 0.1``.
"""

# %%
# Eight Gaussian clusters in 6 dimensions, with the true label kept as a column that the fit
# never uses.
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from sklearn.datasets import make_blobs

from flows.cli import main

work = Path(tempfile.mkdtemp())
X, y = make_blobs(n_samples=20_000, centers=8, n_features=6, cluster_std=1.5, random_state=1)
table = pd.DataFrame(X, columns=[f"x{j}" for j in range(6)]).assign(label=y)
table.to_csv(work / "records.csv", index=False)

# %%
# The run. ``--threads`` runs the Dask workers as threads of this process (the kernels release
# the GIL), which saves starting worker processes on one machine.
out = work / "out"
cmd = f"run {work}/records.csv --out {out} --label-column label --holdout 0.1"
status = main([*cmd.split(), "--threads", "--workers", "2", "--quiet"])
print("exit status", status)
print(*sorted(p.name for p in out.iterdir()))

# %%
# ``run.json`` keeps the parameters, the passes and the metrics in full.
run = json.loads((out / "run.json").read_text())
metrics = run["metrics"]
print({k: metrics[k] for k in ("n_clusters", "nmi", "ari", "heldout_mean_log_density")})
clusters = pd.read_parquet(out / "clusters.parquet")
print(clusters[["cluster", "size", "weight", "x0:mean", "x1:mean"]].head())

# %%
# Every record's label and log density, in input order, in ``labels.zarr``.
import zarr

labels = zarr.open_group(str(out / "labels.zarr"), mode="r")
print(labels["label"][:10], labels["log_density"][:3])

# %%
# The report (``report.html``) shows these pictures; here the cluster profile and the
# contingency table against the label column.
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, name in zip(axes, ("profile.png", "contingency.png")):
    ax.imshow(plt.imread(out / name))
    ax.set_title(name)
    ax.axis("off")
fig.tight_layout()
