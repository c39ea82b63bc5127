"""What a cell and a column of user data can be: the per-column rules of the input contract
(``pipeline.families.schema``, whose ``Schema`` calls them on every path).

``check_cells`` refuses what no family holds (lists, structs, complex numbers, other objects),
``numeric_column`` a cell that is not a number, a missing one (unless kept), an inf or a value
beyond ``MAX_ABS``; ``auto_kind`` is ``family="auto"``'s kind of a column and ``check_auto_text``
refuses the text columns it would wrongly make categorical (the rules are in the schema's
module docstring).
"""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pandas as pd

from pipeline.core.errors import InputError

MAX_LEVELS = 10
# ``check_auto_text``: a text column with at least this share of numbers is a numeric column with
# typos; one with more than this share of distinct values and more than this many levels is an
# identifier
NUMERIC_SHARE = 0.9
ID_SHARE = 0.5
ID_LEVELS = 50
#: the largest magnitude of a value: the families' statistics hold its square summed over a
#: billion rows (1e209) and the empirical-Bayes covariance of such columns without overflow
MAX_ABS = 1e100
# what ``infer_dtype`` calls a column every family can read (others: ``check_cells``)
_PLAIN = ("string", "bytes", "empty", "integer", "floating", "mixed-integer-float", "boolean")
_CELL_TYPES = (str, bytes, int, float, np.bool_, np.integer, np.floating, decimal.Decimal)
_TIME_TYPES = (datetime.date, datetime.time, datetime.timedelta, np.datetime64, np.timedelta64)


def first_bad_row(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def check_cells(s: pd.Series, name: str) -> None:
    """Refuse a column (Series ``s`` named ``name``) whose dtype or cells no family can hold.

    Raises
    ------
    InputError
        For a complex dtype, or the first 0-based row holding a list, an array, a dict, a
        complex number or another object that is not a number, a text, a date or a time.
    """
    dt = s.dtype
    if pd.api.types.is_complex_dtype(dt):
        raise InputError(f"column '{name}': complex numbers (dtype {dt}) are not supported")
    if not pd.api.types.is_object_dtype(dt) or pd.api.types.infer_dtype(s, skipna=True) in _PLAIN:
        return
    for i, v in enumerate(s.to_numpy()):
        if v is None or v is pd.NA or isinstance(v, _CELL_TYPES + _TIME_TYPES):
            continue
        shown = " ".join(repr(v).split())
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise InputError(
            f"column '{name}': row {i} holds a {type(v).__name__} ({shown}): a cell must be a "
            "number, a text or a date; lists, structs, complex numbers and other objects are "
            "not supported"
        )


def numeric_column(s: pd.Series, name: str, missing: bool = False) -> np.ndarray:
    """Column as float64, or a ValueError naming the first row that is not a number."""
    if pd.api.types.is_bool_dtype(s.dtype):
        return s.to_numpy(dtype=np.float64)
    if pd.api.types.is_numeric_dtype(s.dtype):
        vals = s.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        conv = pd.to_numeric(s, errors="coerce")
        bad = conv.isna().to_numpy() & s.notna().to_numpy()
        if bad.any():
            i = first_bad_row(bad)
            raise ValueError(f"column '{name}': row {i} has {s.iloc[i]!r}, which is not a number")
        vals = conv.to_numpy(dtype=np.float64, na_value=np.nan)
    nan = np.isnan(vals)
    if nan.any() and not missing:
        raise ValueError(f"column '{name}': row {first_bad_row(nan)} is NaN (missing value)")
    inf = np.isinf(vals)
    if inf.any():
        i = first_bad_row(inf)
        raise ValueError(f"column '{name}': row {i} is {vals[i]} (inf is not a valid value)")
    big = np.abs(vals) > MAX_ABS
    if big.any():
        i = first_bad_row(big)
        raise InputError(
            f"column '{name}': row {i} is {vals[i]:g}, beyond +-{MAX_ABS:g} where the "
            "statistics overflow; rescale the column"
        )
    return vals


def auto_kind(s: pd.Series) -> str:
    """The ``family="auto"`` kind of one column (module docstring)."""
    dt = s.dtype
    if pd.api.types.is_bool_dtype(dt):
        return "bernoulli"
    if pd.api.types.is_object_dtype(dt) or pd.api.types.is_string_dtype(dt):
        # numbers stored as text (a Parquet string column) follow the rules of numbers
        conv = pd.to_numeric(s, errors="coerce")
        n_num = int(conv.notna().sum())
        return auto_kind(conv) if n_num and n_num == int(s.notna().sum()) else "categorical"
    if isinstance(dt, pd.CategoricalDtype) or not pd.api.types.is_numeric_dtype(dt):
        return "categorical"
    vals = s.to_numpy()
    # a NumPy float column's holes are its NaN: np.isnan, a tenth of pandas' isna's time (half
    # of ``Schema.infer``'s on 200,000 x 10 records); pandas' own float dtypes ask pandas
    if pd.api.types.is_float_dtype(dt) and (
        np.isnan(vals).any() if isinstance(dt, np.dtype) else s.isna().any()
    ):
        # a CSV reader makes an integer column with an empty cell float: the values decide
        vals = vals[~np.isnan(vals)]
        if not np.array_equal(vals, np.floor(vals)):
            return "gaussian"
    elif not pd.api.types.is_integer_dtype(dt):
        return "gaussian"
    if vals.size and np.isin(vals, (0, 1)).all():
        return "bernoulli"
    if np.unique(vals).size <= MAX_LEVELS:
        return "categorical"
    return "gaussian"


def check_auto_text(s: pd.Series, name: str) -> None:
    """Refuse a text column (Series ``s`` named ``name``) that ``family="auto"`` would wrongly
    make categorical; numeric, bool and ``category`` columns pass unchecked.

    Raises
    ------
    InputError
        When at least ``NUMERIC_SHARE`` of the values present are numbers (naming the first row
        that is not), or when more than ``ID_SHARE`` of the rows and more than ``ID_LEVELS``
        values are distinct (an identifier).
    """
    dt = s.dtype  # only strings or other objects are what ``auto_kind`` makes categorical
    if pd.api.types.is_numeric_dtype(dt) or pd.api.types.is_bool_dtype(dt):
        return
    if isinstance(dt, pd.CategoricalDtype):
        return
    present = s.notna().to_numpy()
    n_present = int(present.sum())
    if n_present == 0:
        return
    is_num = pd.to_numeric(s, errors="coerce").notna().to_numpy()
    n_num = int(is_num.sum())
    if n_num < n_present and n_num >= NUMERIC_SHARE * n_present:
        i = first_bad_row(present & ~is_num)
        raise InputError(
            f"column '{name}': row {i} is {s.iloc[i]!r}, not a number ({n_num:,} of "
            f"{n_present:,} values are numbers)"
        )
    n_levels = int(s.nunique(dropna=True))
    n = int(s.shape[0])
    if n_levels > ID_LEVELS and n_levels > ID_SHARE * n:
        raise InputError(
            f"column '{name}': {n_levels:,} distinct values in {n:,} rows; an identifier? drop "
            "it or name its family"
        )
