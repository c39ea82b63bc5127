"""One input contract (``pipeline.families.schema``) for every path: a corpus of odd and bad
files goes through ``MAPDP().fit``, ``dpmm cluster``, ``dpmm run`` and ``dpmm score``, and each
gets the same decision on all of them: accepted with the same kinds, columns dropped with the
same warning, or refused with the same one-line message (exit status 2). Run with ``-s`` to see
the corpus as a table (case x path -> decision). A Hypothesis property does the same for
generated small frames: the schema ``fit`` decides is the schema ingest writes."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.cli import main
from pipeline.data import sources
from pipeline.data.ingest import ingest
from pipeline.data.store import Store
from pipeline.estimators.mapdp import MAPDP

pytestmark = pytest.mark.usefixtures("prefect_harness")

FIT = {"n_restarts": 1, "random_state": 0, "max_iter": 20}
CLI = ["--quiet", "--seed", "0"]


def base(n: int = 40) -> pd.DataFrame:
    """Two groups in three numeric columns."""
    rng = np.random.default_rng(0)
    shift = np.repeat([0.0, 6.0], [n // 2, n - n // 2])[:, None]
    return pd.DataFrame(rng.normal(size=(n, 3)) + shift, columns=["a", "b", "c"]).round(3)


def with_cells(col: str, cells: dict[int, Any]) -> pd.DataFrame:
    df = base().astype({col: object}) if any(isinstance(v, str) for v in cells.values()) else base()
    for i, v in cells.items():
        df.loc[i, col] = v
    return df


@dataclass
class Case:
    """One input: its frame, how it is written, and what ``dpmm score`` must do with it.

    ``score``: "same" (a refusal of one cell: scoring refuses it with the same message, against
    a model of ``good``), "accept" (scored against a model fitted on the file itself, or on
    ``good`` when the fit refuses it) or None (no model has these columns)."""

    id: str
    frame: pd.DataFrame
    fmt: str = "csv"
    score: str | None = "accept"
    good: pd.DataFrame | None = None
    header: str | None = None  # a CSV header written as is (duplicate names)


def _cases() -> list[Case]:
    b = base()
    ids = pd.DataFrame({"id": [f"user-{i:04d}" for i in range(60)], "y": base(60)["a"]})
    dates = b.assign(d=[f"2024-01-{1 + i % 28:02d}" for i in range(40)])
    mixed = b.assign(m=[("x", 1, 2.5, "y")[i % 4] for i in range(40)])
    wide = pd.DataFrame(
        np.random.default_rng(1).normal(size=(10, 5000)), columns=[f"g{j}" for j in range(5000)]
    ).round(2)
    return [
        Case("overflow", with_cells("a", {3: 1e308, 7: -1e308}), score="same", good=b),
        Case("empty-column", b.assign(e=np.nan)),
        Case("list-parquet", b.assign(l=[[1, 2]] * 40), "parquet", "same", b.assign(l=b.a**2)),
        Case("duplicate-names", b.assign(d=b["a"] * 2 + 1), header="a,b,c,a"),
        Case("text-numbers-parquet", b.assign(b=b["b"].astype(str)), "parquet"),
        Case("mixed-types", mixed),
        Case("date-column", dates),
        Case("bool-column", b.assign(t=[i % 3 == 0 for i in range(40)])),
        Case("id-column", ids, score=None),
        Case("wide-10x5000", wide),
        Case("inf", with_cells("a", {9: np.inf}), score="same", good=b),
        Case("constant-column", b.assign(k=3.0)),
        Case("collinear", b.assign(s=b["a"] + b["b"])),
        Case("one-row", b.iloc[:1], good=b),
    ]


CASES = _cases()


def write(frame: pd.DataFrame, path: Path, header: str | None = None) -> Path:
    if path.suffix == ".parquet":
        frame.to_parquet(path)
    else:
        frame.to_csv(path, index=False)
        if header is not None:
            lines = path.read_text().splitlines()
            path.write_text("\n".join([header, *lines[1:]]) + "\n")
    return path


def one_line(err: str, path: Path) -> str:
    """The CLI's message without its prefix, the file and what it adds to a row number (the
    CSV line, or that a Parquet row is counted from 0)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    msg = lines[0].removeprefix("dpmm: error: ").replace(f"{path}: ", "")
    return re.sub(r" \((line \d+|0-based)\)", "", msg)


def dropped(lines: list[str]) -> list[str]:
    return sorted(w.removeprefix("UserWarning: ") for w in lines if "dropped" in w)


def by_fit(path: Path) -> tuple[Any, ...]:
    df = sources.read_table(path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = MAPDP(**FIT).fit(df)
    except ValueError as err:
        return ("refused", str(err))
    return ("accepted", model.schema_.kinds, dropped([str(w.message) for w in caught]))


def by_cluster(path: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Any, ...]:
    rc = main(["cluster", str(path), "--out", str(out), "--restarts", "1", *CLI])
    err = capsys.readouterr().err
    if rc != 0:
        assert rc == 2 and not out.exists()
        return ("refused", one_line(err, path))
    run = json.loads((out / "run.json").read_text())
    return ("accepted", run["data"]["families"], dropped(run["warnings"]))


def by_run(
    path: Path, out: Path, address: str, capsys: pytest.CaptureFixture[str]
) -> tuple[Any, ...]:
    argv = ["run", str(path), "--out", str(out), "--scheduler", address, "--no-report", *CLI]
    rc = main(argv)
    err = capsys.readouterr().err
    if rc != 0:
        assert rc == 2 and not out.exists()
        return ("refused", one_line(err, path))
    run = json.loads((out / "run.json").read_text())
    return ("accepted", run["kinds"], dropped(run["notes"]))


def by_score(
    case: Case, path: Path, tmp: Path, address: str, capsys: pytest.CaptureFixture[str]
) -> tuple[Any, ...]:
    model_dir = tmp / "model"
    fitted_on = sources.read_table(path) if case.good is None else case.good
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MAPDP(**FIT).fit(fitted_on).save(model_dir)
    out = tmp / "scored"
    argv = ["score", str(model_dir), str(path), "--out", str(out), "--scheduler", address]
    rc = main([*argv, "--quiet"])
    err = capsys.readouterr().err
    if rc != 0:
        assert rc == 2 and not out.exists()
        return ("refused", one_line(err, path))
    return ("accepted",)


def shown(decision: tuple[Any, ...]) -> str:
    if decision[0] == "refused":
        return f"refused: {decision[1]}"
    if len(decision) == 1:
        return "accepted"
    kinds = sorted(set(decision[1].values()))
    drops = "; ".join(decision[2])
    return f"accepted ({', '.join(kinds)})" + (f"; {drops}" if drops else "")


@pytest.fixture(scope="module")
def address(client: Any) -> Iterator[str]:
    yield client.scheduler.address


@pytest.mark.slow
def test_corpus_gets_one_decision_on_every_path(
    address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = []
    wrong = []
    for case in CASES:
        d = tmp_path / case.id
        d.mkdir()
        path = write(case.frame, d / f"in.{case.fmt}", case.header)
        fit = by_fit(path)
        paths = {
            "MAPDP().fit": fit,
            "dpmm cluster": by_cluster(path, d / "cluster", capsys),
            "dpmm run": by_run(path, d / "run", address, capsys),
        }
        if case.score is not None:
            paths["dpmm score"] = by_score(case, path, d, address, capsys)
            want = fit if case.score == "same" else ("accepted",)
            if paths["dpmm score"] != want:
                wrong.append((case.id, "dpmm score", paths["dpmm score"], want))
        for name, got in paths.items():
            if name != "dpmm score" and got != fit:
                wrong.append((case.id, name, got, fit))
            rows.append(f"| {case.id} | {name} | {shown(got)} |")
    with capsys.disabled():
        print("\n| case | path | decision |\n|---|---|---|\n" + "\n".join(rows))
    assert not wrong, wrong


def test_run_says_a_dropped_column_on_stderr(
    address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``dpmm run`` warns of a dropped column on stderr in the in-memory fit's words (with
    ``--quiet`` its stderr goes to the run's log)."""
    path = tmp_path / "in.csv"
    base().assign(e=np.nan).to_csv(path, index=False)
    argv = ["run", str(path), "--out", str(tmp_path / "out"), "--scheduler", address]
    assert main([*argv, "--no-report", "--seed", "0"]) == 0
    said = "dpmm: warning: constant columns dropped (they cannot inform the clustering): 'e' "
    assert said + "(empty: no value)" in capsys.readouterr().err


def test_the_three_found_cases_are_decided_by_name(tmp_path: Path) -> None:
    """The overflow and the list column are refused naming the column and the row; the empty
    column is dropped with the constant columns' warning."""
    assert by_fit(write(CASES[0].frame, tmp_path / "o.csv")) == (
        "refused",
        "column 'a': row 3 is 1e+308, beyond +-1e+100 where the statistics overflow; "
        "rescale the column",
    )
    got = by_fit(write(CASES[2].frame, tmp_path / "l.parquet"))
    assert got[0] == "refused" and got[1].startswith("column 'l': row 0 holds a ndarray")
    got = by_fit(write(CASES[1].frame, tmp_path / "e.csv"))
    assert got[0] == "accepted" and got[2] == [
        "constant columns dropped (they cannot inform the clustering): 'e' (empty: no value); "
        "strict=True (--strict) refuses them instead"
    ]


# -- the property --------------------------------------------------------------------------

COLUMN = st.sampled_from(["float", "few-ints", "bool", "text", "float-holes", "empty", "const"])


def column(kind: str, n: int, rng: np.random.Generator) -> pd.Series:
    makers: dict[str, Callable[[], Any]] = {
        "float": lambda: rng.normal(size=n).round(3),
        "few-ints": lambda: rng.integers(0, 4, size=n),
        "bool": lambda: rng.random(n) < 0.5,
        "text": lambda: rng.choice(["u", "v", "w"], size=n).astype(object),
        "float-holes": lambda: np.where(rng.random(n) < 0.2, np.nan, rng.normal(size=n)),
        "empty": lambda: np.full(n, np.nan),
        "const": lambda: np.full(n, 2.5),
    }
    return pd.Series(makers[kind]())


def schema_or_refusal(make: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = make()
    except ValueError as err:
        # ingest names the source first: the decision is the rest
        return ("refused", re.sub(r"^(DataFrame|array): ", "", str(err)))
    # an empty column's value is NaN, which equals nothing: compare its text
    dropped = {c: repr(v) for c, v in s.dropped.items()}
    return (s.kinds, s.categories, dropped, s.collinear, s.n_trials, s.features)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kinds=st.lists(COLUMN, min_size=1, max_size=4),
    n=st.integers(min_value=1, max_value=30),
    seed=st.integers(0, 2**16),
)
def test_fit_schema_is_the_ingested_schema(
    client: Any, tmp_path_factory: pytest.TempPathFactory, kinds: list[str], n: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({f"c{j}": column(k, n, rng) for j, k in enumerate(kinds)})
    store = Store(tmp_path_factory.mktemp("prop") / "store.zarr")
    fit = schema_or_refusal(lambda: MAPDP(**FIT).fit(df).schema_)
    ingested = schema_or_refusal(
        lambda: ingest(df, store, client=client, missing=True, strict=False).schema
    )
    assert fit == ingested
