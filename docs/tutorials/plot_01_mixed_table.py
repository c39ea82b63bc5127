"""
A mixed-type table with missing cells
=====================================

``MAPDP`` on a table of numbers, categories and yes/no answers with empty cells, in Python and
through ``dpmm cluster``. ``family="auto"`` picks a likelihood per column (floats: one
Normal-Wishart group; strings: categorical; 0/1: Bernoulli) and each missing cell is a latent
variable set by the same iterated conditional modes as the assignments.
"""

# %%
# A table of three groups of customers: two measurements, a region and whether they renewed,
# with 5% of the cells left empty.
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

rng = np.random.default_rng(0)
group = rng.integers(0, 3, 300)
centres = np.array([[0.0, 0.0], [4.0, 1.0], [1.0, 5.0]])
df = pd.DataFrame(
    {
        "spend": centres[group, 0] + rng.normal(0, 0.7, 300),
        "visits": centres[group, 1] + rng.normal(0, 0.7, 300),
        "region": np.array(["north", "south", "east"])[group],
        "renewed": (rng.random(300) < np.array([0.9, 0.2, 0.5])[group]).astype(int),
    }
)
holes = rng.random(df.shape) < 0.05
df = df.mask(holes)
print(df.head())
print("missing cells per column:", df.isna().sum().to_dict())

# %%
# Fit in memory. ``schema_`` tells which family each column got.
from pipeline import MAPDP

m = MAPDP(random_state=0).fit(df)
print(m.schema_.kinds)
print("clusters:", m.n_clusters_, "alpha:", round(m.alpha_, 3))
print(pd.crosstab(group, m.labels_, rownames=["true"], colnames=["cluster"]))

# %%
# ``predict`` and ``score_samples`` of a record with holes use the predictive marginalised
# over its missing cells, exactly.
new = pd.DataFrame(
    {"spend": [4.1, np.nan], "visits": [np.nan, 5.2], "region": ["south", None], "renewed": [0, 1]}
)
print(m.predict(new), m.score_samples(new).round(2))

# %%
# The same fit from the command line: ``dpmm cluster`` reads a CSV (an empty field is a missing
# cell) and writes labels, clusters and a report. ``main`` runs the command in this process and
# returns its exit status, as the ``dpmm`` program would.
from flows.cli import main

work = Path(tempfile.mkdtemp())
df.assign(true=group).to_csv(work / "customers.csv", index=False)
cmd = f"cluster {work}/customers.csv --out {work}/out --label-column true --seed 0 --quiet"
status = main(cmd.split())
print("exit status", status, sorted(p.name for p in (work / "out").iterdir()))

# %%
# A bad cell stops the command with one line naming file, column and row, exit status 2, and
# nothing written.
bad = work / "bad.csv"
bad.write_text("spend,visits\n1.0,2.0\n1.5,inf\n")
print("exit status", main(["cluster", str(bad), "--out", str(work / "bad-out"), "--quiet"]))
print("written:", (work / "bad-out").exists())

# %%
# The clusters over the two measurements (records with a missing measurement left out).
fig, ax = plt.subplots(figsize=(5, 4))
seen = df[["spend", "visits"]].notna().all(axis=1).to_numpy()
ax.scatter(df.spend[seen], df.visits[seen], c=m.labels_[seen], cmap="tab10", s=12)
ax.set(xlabel="spend", ylabel="visits", title=f"MAPDP: {m.n_clusters_} clusters")
fig.tight_layout()
