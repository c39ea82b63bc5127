"""Bad input: a ValueError naming the column / row / file from the library, and from the CLI
exit status 2 with one line on stderr and no output directory (nor a temporary one) left."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline import io as pio
from pipeline.cli import main
from pipeline.mapdp import MAPDP


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
    return lambda d: pio.read_table(d / name)


NAN = with_value("b", 5, np.nan)
INF = with_value("a", 9, np.inf)
TEXT = with_value("b", 11, "abc")
NEG = with_value("visits", 3, -2.0)
FRAC = with_value("visits", 4, 1.5)
CONST = good_frame().assign(b=3.0)

CASES = [
    # row 5 of the data is line 7 of the CSV (header on line 1)
    Case("nan", csv_of(NAN), ["column 'b'", "row 5 (line 7)", "NaN"], library=fit(NAN)),
    Case("inf", csv_of(INF), ["column 'a'", "row 9 (line 11)", "inf"], library=fit(INF)),
    Case(
        "nan-parquet",
        lambda d: (NAN.to_parquet(d / "data.parquet"), d / "data.parquet")[1],
        ["data.parquet", "column 'b'", "row 5", "NaN"],
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
        ["column 'b'", "constant", "--drop-constant"],
        library=fit(CONST),
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
        library=lambda d: pio.read_table(d / "data.csv", columns=["a", "zz"]),
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
        if w == "--drop-constant":
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
        model.predict(with_value("b", 2, np.nan))
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
