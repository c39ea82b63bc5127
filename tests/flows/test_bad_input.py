"""Bad input: a ValueError naming the column / row / file from the library, and from the CLI
exit status 2 with one line on stderr and no output directory (nor a temporary one) left."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.cli import main
from pipeline.data import sources
from pipeline.estimators.mapdp import MAPDP


def good_frame(n: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.normal(size=n),
            "visits": rng.poisson(3.0, size=n).astype(np.float64),
        }
    )


def with_value(col: str, row: int, value: object) -> pd.DataFrame:
    df = good_frame().astype({col: object}) if isinstance(value, str) else good_frame()
    df.loc[row, col] = value
    return df


@dataclass
class Case:
    """One bad input: how to write it, CLI arguments, the words its message must contain."""

    id: str
    write: Callable[[Path], Path]
    words: list[str]
    args: list[str] = field(default_factory=list)
    # the library call that must raise ValueError (None: the CLI check only)
    library: Callable[[Path], object] | None = None


def csv_of(df: pd.DataFrame, name: str = "data.csv") -> Callable[[Path], Path]:
    def write(d: Path) -> Path:
        p = d / name
        df.to_csv(p, index=False)
        return p

    return write


def raw(name: str, content: bytes) -> Callable[[Path], Path]:
    def write(d: Path) -> Path:
        p = d / name
        p.write_bytes(content)
        return p

    return write


def fit(df: pd.DataFrame, **kw: object) -> Callable[[Path], object]:
    return lambda _d: MAPDP(n_restarts=1, **kw).fit(df)  # type: ignore[arg-type]


def read(name: str) -> Callable[[Path], object]:
    return lambda d: sources.read_table(d / name)


NAN = with_value("b", 5, np.nan)
INF = with_value("a", 9, np.inf)
TEXT = with_value("b", 11, "abc")
NEG = with_value("visits", 3, -2.0)
FRAC = with_value("visits", 4, 1.5)
CONST = good_frame().assign(b=3.0)


def typo_frame(n: int = 2000, row: int = 77) -> pd.DataFrame:
    """A numeric column ``x`` with one typo: 'oops' in ``row``."""
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"x": rng.normal(size=n).round(4), "y": rng.normal(size=n)})
    df = df.astype({"x": object})
    df.loc[row, "x"] = "oops"
    return df


def id_frame(n: int = 2000) -> pd.DataFrame:
    """A numeric column and an identifier column ``id`` (one value per row)."""
    rng = np.random.default_rng(2)
    return pd.DataFrame({"id": [f"user-{i:05d}" for i in range(n)], "y": rng.normal(size=n)})


def npy_objects(d: Path) -> Path:
    p = d / "x.npy"
    np.save(p, np.array([[1, "a"], [2, "b"]], dtype=object), allow_pickle=True)
    return p


TYPO = typo_frame()
IDS = id_frame()

CASES = [
    # row 5 of the data is line 7 of the CSV (header on line 1)
    Case(
        "nan",
        csv_of(NAN),
        ["column 'b'", "row 5 (line 7)", "NaN", "--missing refuse"],
        args=["--missing", "refuse"],
        library=fit(NAN, missing="refuse"),
    ),
    Case("inf", csv_of(INF), ["column 'a'", "row 9 (line 11)", "inf"], library=fit(INF)),
    Case(
        "nan-parquet",
        lambda d: (NAN.to_parquet(d / "data.parquet"), d / "data.parquet")[1],
        ["data.parquet", "column 'b'", "row 5", "NaN"],
        args=["--missing", "refuse"],
    ),
    Case("empty-csv", raw("data.csv", b""), ["data.csv", "empty"], library=read("data.csv")),
    Case("empty-npy", raw("x.npy", b""), ["x.npy", "empty"], library=read("x.npy")),
    Case(
        "header-only",
        raw("data.csv", b"a,b,visits\n"),
        ["data.csv", "no data rows (header only)"],
        library=read("data.csv"),
    ),
    Case(
        "non-numeric",
        csv_of(TEXT),
        ["column 'b'", "row 11 (line 13)", "'abc'", "not a number"],
        library=fit(TEXT, family="gaussian"),
    ),
    Case(
        "non-numeric-declared",
        csv_of(TEXT),
        ["column 'b'", "row 11 (line 13)", "'abc'", "not a number"],
        args=["--family", "gaussian"],
    ),
    Case(
        "negative-count",
        csv_of(NEG),
        ["column 'visits'", "row 3 (line 5)", "non-negative integers"],
        args=["--family", "visits=poisson"],
        library=fit(NEG, family={"visits": "poisson"}),
    ),
    Case(
        "fractional-count",
        csv_of(FRAC),
        ["column 'visits'", "row 4 (line 6)", "1.5", "integers"],
        args=["--family", "visits=poisson"],
        library=fit(FRAC, family={"visits": "poisson"}),
    ),
    Case(
        "constant-column",
        csv_of(CONST),
        ["column 'b'", "constant", "--strict"],
        args=["--strict"],
        library=fit(CONST, strict=True),
    ),
    Case(
        "wrong-field-count",
        raw("data.csv", b"a,b,visits\n1,2,3\n4,5,6\n7,8,9,10\n1,2,3\n"),
        ["data.csv", "line 4 has 4 fields, expected 3"],
        library=read("data.csv"),
    ),
    Case(
        "short-record",
        raw("data.csv", b"a,b,visits\n1,2,3\n4,5,6\n7,8\n1,2,3\n"),
        ["data.csv", "line 4 has 2 fields, expected 3"],
        library=read("data.csv"),
    ),
    Case(
        "csv-bytes-in-parquet",
        raw("data.parquet", b"a,b\n1,2\n3,4\n"),
        ["data.parquet", "not a Parquet file"],
        library=read("data.parquet"),
    ),
    Case(
        "text-in-npy",
        raw("x.npy", b"1 2 3\n4 5 6\n"),
        ["x.npy", "not a NumPy .npy file"],
        library=read("x.npy"),
    ),
    Case(
        "parquet-bytes-in-csv",
        lambda d: (good_frame().to_parquet(d / "data.csv"), d / "data.csv")[1],
        ["data.csv", "not a CSV file", "Parquet"],
        library=read("data.csv"),
    ),
    Case(
        "unknown-family",
        csv_of(good_frame()),
        ["unknown family 'poison'"],
        args=["--family", "poison"],
        library=fit(good_frame(), family="poison"),
    ),
    Case(
        "unknown-column-family",
        csv_of(good_frame()),
        ["column 'visits'", "unknown family 'poison'"],
        args=["--family", "visits=poison"],
        library=fit(good_frame(), family={"visits": "poison"}),
    ),
    Case(
        "missing-file",
        lambda d: d / "nowhere.csv",
        ["nowhere.csv", "no such file"],
        library=read("nowhere.csv"),
    ),
    Case(
        "missing-column",
        csv_of(good_frame()),
        ["data.csv", "no column 'zz'", "columns are"],
        args=["--columns", "a,zz"],
        library=lambda d: sources.read_table(d / "data.csv", columns=["a", "zz"]),
    ),
    Case(
        "missing-label-column",
        csv_of(good_frame()),
        ["data.csv", "no column 'truth'"],
        args=["--label-column", "truth"],
    ),
    Case(
        "unknown-extension",
        raw("data.xlsx", b"PK"),
        ["data.xlsx", ".csv", ".parquet", ".npy"],
        library=read("data.xlsx"),
    ),
    Case(
        "numeric-typo",
        csv_of(TYPO),
        [
            "column 'x'",
            "row 77 (line 79) is 'oops', not a number",
            "(1,999 of 2,000 values are numbers)",
        ],
        library=fit(TYPO),
    ),
    Case(
        "identifier",
        csv_of(IDS),
        ["column 'id'", "2,000 distinct values in 2,000 rows; an identifier?", "its family"],
        library=fit(IDS),
    ),
    Case("npy-objects", npy_objects, ["x.npy", "Python objects"], library=read("x.npy")),
    Case(
        "npy-1d",
        lambda d: (np.save(d / "x.npy", np.arange(5.0)), d / "x.npy")[1],
        ["x.npy", "2-D"],
        library=read("x.npy"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli_bad_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    path = case.write(src)
    out = tmp_path / "out"
    rc = main(["cluster", str(path), "--out", str(out), "--quiet", *case.args])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    line = lines[0]
    assert line.startswith("dpmm: error: ")
    assert path.name in line  # names the file
    for w in case.words:
        assert w in line
    assert "Traceback" not in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no out, no out.tmp-*


@pytest.mark.parametrize("case", [c for c in CASES if c.library is not None], ids=lambda c: c.id)
def test_library_bad_input(case: Case, tmp_path: Path) -> None:
    case.write(tmp_path)
    with pytest.raises(ValueError) as exc:
        assert case.library is not None
        case.library(tmp_path)
    msg = str(exc.value)
    # the library reports 0-based rows; the CLI adds the line number
    for w in case.words:
        if "(line" in w:
            w = w.split(" (line")[0]
        if w.startswith("--"):
            continue
        assert w in msg, msg


def test_predict_with_other_columns() -> None:
    df = good_frame()
    model = MAPDP(n_restarts=1, random_state=0).fit(df)
    with pytest.raises(ValueError, match=r"missing \['visits'\]; unexpected \['c'\]"):
        model.predict(df.rename(columns={"visits": "c"}))
    with pytest.raises(ValueError, match="missing"):
        model.score_samples(df[["a", "b"]])
    with pytest.raises(ValueError, match="X has 2 features, but MAPDP is expecting 3"):
        model.predict(df[["a", "b"]].to_numpy())
    with pytest.raises(ValueError, match=r"column 'b': row 2 is NaN"):
        MAPDP(n_restarts=1, random_state=0, missing="refuse").fit(df).predict(
            with_value("b", 2, np.nan)
        )
    arr_model = MAPDP(n_restarts=1, random_state=0).fit(df.to_numpy())
    with pytest.raises(ValueError, match="X has 4 features, but MAPDP is expecting 3"):
        arr_model.predict(np.zeros((3, 4)))


def test_drop_constant_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "flat.csv"
    p.write_text("a,b\n1,2\n1,2\n1,2\n")
    out = tmp_path / "out"
    assert main(["cluster", str(p), "--out", str(out), "--drop-constant", "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "every column is constant" in err[0] and "flat.csv" in err[0]
    assert not out.exists()


def test_auto_refusals_in_schema() -> None:
    """``Schema.infer`` refuses both columns under "auto" (0-based rows); naming the family
    accepts them; a column of a few levels, or with fewer than 90% numbers, is categorical."""
    from pipeline.core.errors import InputError
    from pipeline.families.schema import Schema

    with pytest.raises(InputError, match=r"^column 'x': row 77 is 'oops', not a number \(1,999 "):
        Schema.infer(TYPO, "auto", True)
    with pytest.raises(InputError, match=r"^column 'id': 2,000 distinct values in 2,000 rows"):
        Schema.infer(IDS, {"y": "gaussian"}, True)
    assert Schema.infer(TYPO, {"x": "categorical"}, True).kinds == {
        "x": "categorical",
        "y": "gaussian",
    }
    assert Schema.infer(IDS, {"id": "categorical"}, True).kinds["id"] == "categorical"
    few = pd.DataFrame({"c": ["a", "b", "c"] * 40, "n": ["1", "2", "x", "y"] * 30})
    assert Schema.infer(few, "auto", True).kinds == {"c": "categorical", "n": "categorical"}
    # 50 levels in 60 rows is still a short scale, 51 is an identifier
    ok = pd.DataFrame({"k": [f"k{i % 50}" for i in range(60)]})
    assert Schema.infer(ok, "auto", True).kinds == {"k": "categorical"}
    with pytest.raises(InputError, match="51 distinct values in 60 rows"):
        Schema.infer(pd.DataFrame({"k": [f"k{i % 51}" for i in range(60)]}), "auto", True)


def test_cli_family_override_accepts_an_identifier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    p = tmp_path / "ids.csv"
    id_frame(60).to_csv(p, index=False)
    out = tmp_path / "out"
    assert main(["cluster", str(p), "--out", str(out), "--quiet"]) == 2
    assert "an identifier?" in capsys.readouterr().err
    args = ["--family", "id=categorical", "--restarts", "1", "--seed", "0", "--quiet"]
    assert main(["cluster", str(p), "--out", str(out), *args]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["data"]["families"] == {"id": "categorical", "y": "gaussian"}


@pytest.mark.parametrize(
    "write, words",
    [
        (npy_objects, ["x.npy", "holds Python objects (dtype object)"]),
        (raw("data.parquet", b"a,b\n1,2\n"), ["data.parquet", "not a Parquet file"]),
        (raw("data.csv", b""), ["data.csv", "the file is empty"]),
        (lambda d: d / "nowhere.csv", ["nowhere.csv", "no such file or directory"]),
    ],
    ids=["npy-objects", "not-parquet", "empty", "missing"],
)
def test_run_refuses_a_bad_file_before_starting(
    write: Callable[[Path], Path],
    words: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``dpmm run`` checks the file itself (``pipeline.data.io.check_file``) before Dask and Prefect
    start: one line, status 2, nothing written."""
    src = tmp_path / "src"
    src.mkdir()
    path = write(src)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dpmm: error: {path}: "), lines
    for w in words:
        assert w in lines[0]
    assert captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
