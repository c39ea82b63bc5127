"""``family="auto"``'s covariance chosen by held-out density (``Schema.choose_structure``, issue
57) on generated mixtures whose answer is known, in memory and through ingest on a real
``distributed.LocalCluster``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.core import config
from pipeline.data.ingest import ingest
from pipeline.data.store import Store
from pipeline.engines import get_engine
from pipeline.estimators.mapdp import MAPDP


def correlated(n: int, seed: int = 0) -> pd.DataFrame:
    """Three clusters, each a thin ellipse along its own direction in 4 columns: a diagonal
    covariance must spend many axis-aligned clusters on each."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    t = rng.normal(size=(n, 1)) * 3.0
    dirs = rng.normal(size=(3, 4))
    X = 6.0 * rng.normal(size=(3, 4))[y] + t * dirs[y] + 0.2 * rng.normal(size=(n, 4))
    return pd.DataFrame(X, columns=[f"c{j}" for j in range(4)])


def independent(n: int = 300, seed: int = 1) -> pd.DataFrame:
    """Independent columns (30): two clusters apart in their means only, where a full
    covariance's prior costs more than it explains."""
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], n // 2)
    X = 1.5 * rng.normal(size=(2, 30))[y] + rng.normal(size=(n, 30)) * rng.uniform(0.5, 2, 30)
    return pd.DataFrame(X, columns=[f"c{j}" for j in range(30)])


def test_correlated_clusters_get_full_covariance_and_the_evidence_is_kept() -> None:
    m = MAPDP(random_state=0).fit(correlated(600))
    ev = m.schema_.structure
    assert set(m.schema_.kinds.values()) == {"gaussian"} and ev["chosen"] == "gaussian"
    assert ev["gaussian"] > ev["diag-gaussian"] and ev["rows"] == 600
    assert ev["folds"] == config.EVIDENCE_FOLDS and ev["note"] in m.schema_.notes
    assert "full covariance" in ev["note"]


def test_full_covariance_that_overfits_gives_diagonal() -> None:
    m = MAPDP(random_state=0).fit(independent())
    ev = m.schema_.structure
    assert set(m.schema_.kinds.values()) == {"diag-gaussian"}
    assert ev["diag-gaussian"] > ev["gaussian"] and "diagonal covariance" in ev["note"]


def test_under_ten_rows_per_column_give_diagonal_without_a_comparison() -> None:
    """150 rows of 30 columns (the rule's threshold, ``config.EVIDENCE_PER_COL``, is 10)."""
    ev = MAPDP(random_state=0).fit(independent(150)).schema_.structure
    assert ev["chosen"] == "diag-gaussian" and "gaussian" not in ev
    assert f"under {config.EVIDENCE_PER_COL} per column" in ev["note"]


def test_too_few_rows_fall_back_to_the_column_count_rule() -> None:
    X = correlated(40)
    m = MAPDP(random_state=0).fit(X)
    assert m.schema_.kinds["c0"] == "gaussian" and "gaussian" not in m.schema_.structure
    assert "too few complete rows (40)" in m.schema_.structure["note"]


def test_a_named_family_is_not_second_guessed() -> None:
    X = independent()
    assert MAPDP(family="gaussian").fit(X).schema_.structure == {"columns": []}
    m = MAPDP(family={"c0": "gaussian"}).fit(X)
    assert m.schema_.kinds["c1"] == "gaussian" and m.schema_.structure == {"columns": []}


@pytest.mark.parametrize("make", [lambda: correlated(2_600), independent])
def test_ingest_chooses_as_the_in_memory_fit(client: object, tmp_path: Path, make: object) -> None:
    """Same rows, folds and choice on both paths; the store's prior sample (here a hash subset
    of the rows) holds the evidence rows whenever it holds at least as many. The prior scale
    is chosen on the same rows when a MAP-DP run starts (``MapdpEngine.run_info``)."""
    X = make()  # type: ignore[operator]
    mem = MAPDP(random_state=0).fit(X).schema_.structure
    info = ingest(X, Store(tmp_path / "s"), client=client, chunk_rows=500, prior_sample=2_300)
    assert info.sample.shape[0] < len(X) or len(X) < 2_300
    assert info.schema.structure == {k: v for k, v in mem.items() if k not in ("scale", "scales")}
    run = get_engine("mapdp").run_info(info, config.FitParams())
    assert run.schema.structure == mem and "scale" in mem
    assert mem["note"] in info.notes
    assert info.family.groups[0][0].__class__.__name__ == (
        "GaussianNW" if mem["chosen"] == "gaussian" else "NormalGamma"
    )


def test_a_support_only_family_checks_and_arranges_as_the_family() -> None:
    """Ingest's checker (``build_family(support_only=True)``): the full-covariance group
    diagonal, whose prior costs O(n d) instead of O(d^3), with the same column order and the
    same refusal of a bad value as the family itself."""
    from pipeline.families import GaussianNW, NormalGamma
    from pipeline.families.schema import Schema

    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "c": rng.choice(["x", "y"], 30),
            "a": rng.normal(size=30),
            "b": rng.normal(size=30),
            "d": rng.normal(size=30),
        }
    )
    schema = Schema.infer(df, {"c": "categorical", "a": "gaussian", "b": "gaussian",
                               "d": "diag-gaussian"}, True)  # fmt: skip
    Xe = schema.encode(df, fitting=True)
    full, cheap = schema.build_family(Xe), schema.build_family(Xe, support_only=True)
    np.testing.assert_array_equal(cheap.column_order, full.column_order)
    kinds = [(type(f), cols) for f, cols in full.groups]
    assert (GaussianNW, [1, 2]) in kinds
    assert [(NormalGamma if t is GaussianNW else t, c) for t, c in kinds] == [
        (type(f), cols) for f, cols in cheap.groups
    ]
    bad = Xe.copy()
    bad[4, 2] = np.inf
    with pytest.raises(ValueError) as a:
        schema.check_values(full, bad)
    with pytest.raises(ValueError) as b:
        schema.check_values(cheap, bad)
    assert (
        str(a.value) == str(b.value) == "column 'b': row 4 has inf; Gaussian values must be finite"
    )


def spherical(sep: float, n: int = 600, seed: int = 0) -> tuple[np.ndarray, float]:
    """Four clusters of unit covariance in 3 columns, their centres spread by ``sep``; and the
    share of the data's covariance (its mean variance) one cluster carries."""
    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(4, 3)) * sep)[rng.integers(0, 4, size=n)] + rng.normal(size=(n, 3))
    return X, 1.0 / float(np.trace(np.cov(X.T)) / 3)


@pytest.mark.parametrize("sep", [1.5, 3.0, 12.0])
def test_the_prior_scale_chosen_brackets_the_clusters_share(sep: float) -> None:
    """Where the clusters' share of the covariance is known, the scale of lowest objective
    (``Schema.choose_scale``) is one of the two of ``config.PRIOR_SCALES`` around it (the
    nearest at the grid's ends)."""
    X, share = spherical(sep)
    ev = MAPDP(random_state=0).fit(X).schema_.structure
    grid = sorted(config.PRIOR_SCALES)
    below = max([s for s in grid if s <= share], default=grid[0])
    above = min([s for s in grid if s >= share], default=grid[-1])
    assert ev["scale"] in (below, above), (share, ev["scales"])


def test_the_chosen_scale_is_recorded_and_is_the_fits_prior() -> None:
    """The objectives are kept with the choice, the lowest is chosen, and the fit's prior is
    the one ``prior_scale`` set to it gives; a given scale is not second-guessed."""
    X, _ = spherical(3.0)
    m = MAPDP(random_state=0).fit(X)
    objective = dict(m.schema_.structure["scales"])
    assert set(objective) <= set(config.PRIOR_SCALES) and len(objective) >= 2
    assert m.schema_.structure["scale"] == min(objective, key=objective.__getitem__)
    given = MAPDP(random_state=0, prior_scale=m.schema_.structure["scale"]).fit(X)
    assert "scale" not in given.schema_.structure
    assert given.family_.signature() == m.family_.signature()


def test_no_scale_is_chosen_where_every_fit_is_degenerate() -> None:
    """One Gaussian blob: each scale's fit is one cluster (``degenerate_fit``), so none is
    chosen and the family's default prior stays."""
    X, _ = spherical(0.0)
    m = MAPDP(random_state=0).fit(X)
    ev = m.schema_.structure
    assert "scale" not in ev and ev["scales"] == []
    default = MAPDP(random_state=0, family=ev["chosen"]).fit(X)
    assert m.family_.signature() == default.family_.signature()


def test_the_scale_is_chosen_on_the_samples_first_rows_alike_in_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Schema.choose_scale`` fits the first ``config.SCALE_ROWS`` rows of the structure's
    sample (the complete rows in ``row_uniform`` order), and ``choose_scale``'s fits, one
    thread per core, give each scale the objective it has when fitted alone in one thread."""
    import pipeline.estimators.base as base
    import pipeline.models.mapdp as models
    from pipeline.core.seeds import SAMPLE_SALT, row_uniform

    X, _ = spherical(3.0, n=1_500)
    seen = []

    def spy(Z: np.ndarray, kind: str) -> dict[float, float]:
        seen.append(Z)
        return models.choose_scale(Z, kind)

    monkeypatch.setattr(base, "choose_scale", spy)
    ev = MAPDP(random_state=0).fit(X).schema_.structure
    first = np.argsort(row_uniform(np.arange(len(X)), SAMPLE_SALT), kind="stable")
    assert ev["rows"] == len(X) and len(seen) == 1
    np.testing.assert_array_equal(seen[0], X[first[: config.SCALE_ROWS]])
    monkeypatch.setattr(models.os, "cpu_count", lambda: 1)
    assert models.choose_scale(seen[0], ev["chosen"]) == dict(ev["scales"])
