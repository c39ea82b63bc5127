"""The groups' moments a grouped dataset store keeps from ingest (``group_gram``: Raykov et al. 2016
Section 7's X_i^T X_i, X_i^T y_i, y_i^T y_i, n_i as blocks of [1, X_i]^T [1, X_i]), and the
mixed-effects engine reading them instead of the rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.core.config import FitParams
from pipeline.data.ingest import ingest
from pipeline.data.store import MAX_GRAM_COLS, Store, fold_of, holdout_mask_of, read_group_moments
from pipeline.data.synthetic import sample_longitudinal
from pipeline.distributed import loop
from pipeline.ops import longitudinal as lon

COLUMNS = ["subject", "wave", "depression", "adl", "qol"]


def survey(n: int, seed: int) -> pd.DataFrame:
    """The generator's survey with its rows shuffled (a subject's rows scattered in the input)
    and a few subjects cut to one observation."""
    df = sample_longitudinal(n, seed=seed)[COLUMNS]
    rng = np.random.default_rng(seed)
    single = df["subject"].isin(rng.choice(n, size=n // 10, replace=False))
    df = pd.concat([df[~single], df[single].groupby("subject").head(1)])
    return df.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def test_the_stored_moments_are_the_rows_moments(client, tmp_path: Path) -> None:
    df = survey(150, seed=3)
    store = Store(tmp_path / "s")
    info = ingest(
        df, store, client=client, chunk_rows=120, holdout=0.2, group_column="subject", n_folds=5
    )
    assert info.group_moments and info.n_chunks > 3
    names = info.names
    seen = []
    for c in range(info.n_chunks):
        gm = read_group_moments(str(store.path), c)
        assert np.all(np.diff(gm.code) > 0)
        seen.append(gm.code)
        for g, code in enumerate(gm.code):
            rows = df[df["subject"] == info.group_ids[code]]  # type: ignore[index]
            W = np.column_stack([np.ones(len(rows)), rows[names].to_numpy(float)])
            np.testing.assert_allclose(gm.full()[g], W.T @ W, rtol=1e-10, atol=1e-10)
        np.testing.assert_array_equal(gm.holdout, holdout_mask_of(gm.code, 0.2))
        np.testing.assert_array_equal(gm.fold, fold_of(gm.code, 5))
    np.testing.assert_array_equal(np.concatenate(seen), np.arange(info.n_groups))


def test_a_wide_grouped_store_keeps_no_moments(client, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(40, MAX_GRAM_COLS + 1)))
    df.columns = [f"x{j}" for j in range(df.shape[1])]
    df["g"] = np.arange(40) // 4
    info = ingest(df, Store(tmp_path / "w"), client=client, chunk_rows=20, group_column="g")
    assert not info.group_moments and not (tmp_path / "w" / "group_gram").exists()


@pytest.mark.parametrize("fold", [None, 1])
def test_a_fit_from_the_moments_equals_the_fit_from_the_rows(
    client, tmp_path: Path, fold: int | None
) -> None:
    """The moments are the rows' bit for bit, so every pass, the start on its hash sample and
    the per-subject results are the same as when each pass reduced the rows."""
    df = survey(400, seed=4)
    store = Store(tmp_path / "s")
    info = ingest(
        df, store, client=client, chunk_rows=300, holdout=0.1, group_column="subject", n_folds=5
    )
    cols = lon.Columns("subject", "qol", ("wave", "depression", "adl"), "wave")
    params = FitParams(
        engine="mixed_effects", alpha="learn", seed=2, max_passes=6, init_sample=200
    ).checked()
    out = {}
    for moments in (True, False):
        run_info = replace(info, group_moments=moments)
        ctx = lon.fit_context(store, tmp_path / f"st-{moments}", run_info, params, cols, fold=fold)
        state = loop.run_passes(client, ctx)
        out[moments] = (state, lon.subject_results(client, ctx, state))
    (st_m, res_m), (st_r, res_r) = out[True], out[False]
    assert st_m.pass_no == st_r.pass_no >= 2
    np.testing.assert_allclose(
        [h["objective"] for h in st_m.history], [h["objective"] for h in st_r.history], rtol=1e-9
    )
    assert res_m.keys() == res_r.keys()
    for k in res_m:
        np.testing.assert_allclose(res_m[k], res_r[k], rtol=1e-9, err_msg=k)
    np.testing.assert_array_equal(res_m["label"], res_r["label"])
    assert len(set(res_m["label"][res_m["train"]].tolist())) > 1
