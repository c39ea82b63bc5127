"""Cluster means and category shares from statistics rows, against pandas on the records."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.families.profile import category_shares, column_means
from pipeline.families.schema import Schema


def test_means_and_shares_are_the_records_per_cluster() -> None:
    rng = np.random.default_rng(0)
    n, K = 600, 4
    z = rng.integers(0, K, size=n)
    df = pd.DataFrame(
        {
            "x": rng.normal(size=n) + z,
            "colour": pd.Categorical(rng.choice(["red", "blue", "green"], size=n)),
            "count": rng.poisson(2.0 + z).astype(float),
            "y": rng.normal(size=n) * 3 - z,
            "hit": rng.integers(0, 2, size=n).astype(float),
        }
    )
    family = {"count": "poisson", "hit": "bernoulli", "y": "diag-gaussian"}
    schema = Schema.infer(df, family, from_frame=True)
    X = schema.encode(df, fitting=True)
    fam = schema.build_family(X)
    stats = fam.stats_of(fam.arrange(X), z.astype(np.int64), K)
    names = [schema.columns[j] for j in fam.column_order]

    means = column_means(stats, fam)
    ref = df.assign(z=z).groupby("z")[["x", "count", "y", "hit"]].mean()
    for c in ("x", "count", "y", "hit"):
        np.testing.assert_allclose(means[:, names.index(c)], ref[c].to_numpy(), rtol=1e-12)
    assert np.isnan(means[:, names.index("colour")]).all()

    shares = category_shares(stats, fam)
    assert list(shares) == [names.index("colour")]
    cats = schema.categories["colour"]
    ref_shares = pd.crosstab(z, df["colour"], normalize="index")[cats].to_numpy()
    np.testing.assert_allclose(shares[names.index("colour")], ref_shares, rtol=1e-12)
