"""
The tree stage: BHC and tree-guided MCMC
========================================

``BHC`` (Xu et al. 2009) builds a binary tree by Bayesian hierarchical clustering and cuts it
where a merge's posterior falls below 0.5; ``TreeGuidedMCMC`` (Lee and Choi 2015) samples
partitions with split and merge moves proposed along such trees. ``dpmm run --summaries M
--mcmc ITER`` runs both on the summaries of the stage-1 clusters.
"""

# %%
import matplotlib.pyplot as plt
import numpy as np
from scipy.cluster.hierarchy import dendrogram
from sklearn.datasets import make_blobs

from pipeline import BHC, TreeGuidedMCMC

X, y = make_blobs(n_samples=120, centers=4, n_features=2, cluster_std=0.7, random_state=3)
b = BHC().fit(X)
print("BHC clusters:", b.n_clusters_, "log p(D | T):", round(b.log_evidence_, 1))
print("lower bound on the DPM marginal likelihood:", round(b.lower_bound_, 1))

# %%
t = TreeGuidedMCMC(n_iter=60, random_state=0).fit(X)
print("clusters after MCMC:", t.n_clusters_)
print("posterior over K:", np.unique(t.n_clusters_trace_[20:], return_counts=True))

# %%
# The BHC tree (heights: merge order) over the 120 records.
fig, ax = plt.subplots(figsize=(8, 3.5))
dendrogram(b.tree_.linkage(heights="order"), ax=ax, no_labels=True, color_threshold=0)
ax.set(title=f"BHC tree, cut into {b.n_clusters_} clusters", ylabel="merge")
fig.tight_layout()
