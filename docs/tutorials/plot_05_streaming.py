"""
Streaming: ASUGS with ``partial_fit``
=====================================

``ASUGS`` (Tsiligkaridis and Forsythe 2015) sees each record once, in batches, and keeps a
concentration that adapts as classes appear, alpha_i = k_i / (lambda + log i). Its prior is
chosen on the first batch by empirical Bayes.
"""

# %%
import matplotlib.pyplot as plt
from sklearn.datasets import make_blobs
from sklearn.metrics import normalized_mutual_info_score

from pipeline import ASUGS

X, y = make_blobs(n_samples=6_000, centers=6, n_features=3, cluster_std=0.8, random_state=2)
s = ASUGS(random_state=0)
seen = []
for start in range(0, len(X), 1_000):
    s.partial_fit(X[start : start + 1_000])
    seen.append(s.n_clusters_)
print("classes after each batch:", seen)
print("NMI:", round(normalized_mutual_info_score(y, s.predict(X)), 3))

# %%
# The adaptive concentration over the stream.
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(s.alpha_history_)
ax.set(xlabel="records seen", ylabel="alpha", title="ASUGS's adaptive concentration")
fig.tight_layout()
