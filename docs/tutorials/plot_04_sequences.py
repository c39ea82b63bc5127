"""
Sequences: the MAP infinite hidden Markov model
===============================================

``MAPiHMM`` (Raykov et al. 2016, Section 6) learns the number of hidden states of many
sequences at once. The data are two beavers' body temperatures every 10 minutes
(``tests/data/seq_beavers.csv``, base R's ``beaver1`` and ``beaver2``), with a label saying when
each beaver was active outside its retreat, which the fit never sees.
"""

# %%
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from sklearn.metrics import normalized_mutual_info_score

from pipeline import MAPiHMM

DATA = Path("../../tests/data/seq_beavers.csv")
df = pd.read_csv(DATA, comment="#")
m = MAPiHMM(random_state=0).fit(
    df[["beaver", "t", "temp"]], sequence_column="beaver", time_column="t"
)
print(
    "states:",
    m.n_states_,
    "NMI against activity:",
    round(normalized_mutual_info_score(df.label, m.labels_), 3),
)

# %%
# ``dpmm hmm`` runs the same model as a Prefect flow over the sequences of a file.
from distributed import LocalCluster

from flows.cli import main

work = Path(tempfile.mkdtemp())
df.drop(columns="label").to_csv(work / "beavers.csv", index=False)
out = work / "out"
# The command joins a Dask cluster of this process's threads (``--scheduler``); leave it out
# and ``dpmm`` starts a local cluster of its own.
cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
cmd = f"hmm {work}/beavers.csv --sequence-column beaver --time-column t --out {out}"
status = main([*cmd.split(), "--quiet", "--no-report", "--scheduler", cluster.scheduler_address])
rows = pd.read_parquet(out / "rows.parquet")
print("exit status", status, "| states:", rows.state.nunique())

# %%
# The temperatures coloured by state: the warm state is the active one.
fig, axes = plt.subplots(2, 1, figsize=(8, 5), sharey=True)
for ax, (beaver, part) in zip(axes, df.assign(state=m.labels_).groupby("beaver")):
    ax.scatter(part.t, part.temp, c=part.state, cmap="coolwarm", s=8)
    ax.set(ylabel="degC", title=f"beaver {beaver}")
axes[-1].set_xlabel("time step (10 min)")
fig.tight_layout()
cluster.close()
