"""
A longitudinal panel: mixed effects with a Dirichlet-process mixture
====================================================================

``MixedEffectsDP`` (Raykov et al. 2016, Section 7) fits every subject its own intercept and
slope, drawn from a Dirichlet-process mixture of Gaussians, so that subjects fall into
subgroups of similar trajectories. The data are base R's ``ChickWeight``: 50 chicks weighed up
to 12 times over 21 days on four diets (``tests/data/panel_chickweight.csv``).
"""

# %%
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from pipeline import MixedEffectsDP

# the build runs each tutorial from its own folder, docs/tutorials
DATA = Path("../../tests/data/panel_chickweight.csv")
df = pd.read_csv(DATA)
print(df.head(), df.subject.nunique(), "chicks")

# %%
# Time, standardised, is the one covariate; an intercept is added. The fit is per chick.
day = pd.DataFrame({"time": (df["time"] - df["time"].mean()) / df["time"].std()})
m = MixedEffectsDP().fit(day, df["weight_g"], df["subject"])
print("clusters:", m.n_clusters_, "random effects:", m.random_effects_.shape)
print("fixed effects (intercept, slope):", m.fixed_effects_.round(1))

# %%
# The same model as a Prefect flow on Dask: ``dpmm longitudinal`` (subjects are the groups of
# the dataset store, so a chunk holds whole subjects) with 5-fold cross-validation over chicks.
# The commands join a Dask cluster of this process's threads (``--scheduler``): on a laptop or a
# cluster of machines, leave it out and ``dpmm`` starts its own local cluster.
from distributed import LocalCluster

from flows.cli import main

cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
out = Path(tempfile.mkdtemp()) / "out"
cmd = f"longitudinal {DATA} --subject subject --response weight_g --covariates time --time time"
cmd += " --folds 5 --quiet --no-report"
status = main([*cmd.split(), "--out", str(out), "--scheduler", cluster.scheduler_address])
subjects = pd.read_parquet(out / "subjects.parquet")
print("exit status", status, "|", sorted(p.name for p in out.iterdir()))
print(subjects[["subject", "cluster", "n_obs", "heldout_log_density"]].head())

# %%
# Each chick's weighings, one line per chick, coloured by its diet (which the fit never sees).
fig, ax = plt.subplots(figsize=(6, 4))
diet = df.groupby("subject")["group"].first()
for chick, rows in df.groupby("subject"):
    ax.plot(rows.time, rows.weight_g, color=plt.cm.tab10(diet[chick] - 1), lw=0.8, alpha=0.7)
ax.set(xlabel="day", ylabel="weight (g)", title="ChickWeight: one line per chick, coloured by diet")
fig.tight_layout()
cluster.close()
