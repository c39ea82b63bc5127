"""From user data to the float matrix and product family the kernels see.

A ``Schema`` is learned at fit time: the feature names, a family kind per column (``family="auto"``
rules below, or the user's choice), the categories of categorical columns and the number of trials
of binomial columns. It encodes the same columns at predict time and refuses anything else.

``family="auto"`` rules, per column
-----------------------------------
* bool, or integers taking only the values 0 and 1: ``bernoulli`` (Beta prior);
* pandas ``category``, strings or other non-numeric objects: ``categorical`` (Dirichlet prior),
  unless every value present is a number: numbers stored as text follow the rules below;
* integers taking at most ``MAX_LEVELS`` (10) distinct values: ``categorical`` over the values
  seen. Such a column is a code or a score on a short scale; a Gaussian on a lattice of a few
  values rewards clusters that collapse onto one level (the density grows without bound as the
  variance shrinks);
* a float column with missing cells whose values present are all integers follows the two
  integer rules above (a CSV reader makes such a column float because of its empty cells);
* other integers: ``gaussian``, the same as floats. Integer-valued measurements (ages, counts of
  hundreds) are rarely Poisson within a cluster, and a Poisson family forced on over-dispersed
  data splits it into many clusters; ask for ``poisson`` (or ``geometric``, ``binomial``)
  explicitly for true counts;
* floats: ``gaussian`` (all such columns share one full-covariance Normal-Wishart group).

A wide table, more than ``WIDE_COLS`` (50) such columns or fewer than two rows per column,
gets ``diag-gaussian`` for them instead (``Schema.notes`` says so): a full covariance has
d (d + 1) / 2 parameters per cluster, and its Normal-Wishart prior then needs a0 > d - 1
pseudo-records, more than a whole cluster holds, so every split costs more than it explains (a
microarray of 500 genes in 189 samples came out as one cluster); independent columns need 2 d.

Missing values
--------------
With ``missing=True`` (the estimators' default ``missing="latent"``) an empty cell is kept as NaN
through the encoding (a categorical column's missing cell too); ``constant_columns`` and
``check_informative`` look at the values present. Otherwise the first missing cell is an error
naming its column and row.

Constant columns
----------------
``check_informative`` refuses a column of one value (``strict=True``); otherwise the column is
dropped (``Schema.dropped``, with its value): it carries no information and its
empirical-Bayes prior is degenerate. Likewise ``drop_collinear`` leaves out full-covariance
Gaussian columns that are exact linear combinations of others (``Schema.collinear``). ``encode``
then leaves them out at fit and predict time.

Two kinds of text column are refused by ``auto`` rather than guessed (``check_auto_text``): one
whose values are numbers but for a few (at least ``NUMERIC_SHARE``, 90%: a numeric column with a
typo, which would otherwise become a categorical column of as many levels as distinct numbers),
and one whose distinct values are nearly as many as its rows (more than ``ID_SHARE`` of them and
more than ``ID_LEVELS``: an identifier, one cluster per record). Naming the column's family
(``family={"id": "categorical"}``) accepts either.

Any column can be overridden: ``family={"visits": "poisson"}`` keeps ``auto`` for the rest.

One contract for every path
---------------------------
This module decides, for the in-memory fit, ingest (``pipeline.data.ingest``) and scoring alike,
what a column is and what happens to it, so that one input gets one decision everywhere:
``check_cells`` refuses what no family holds (lists, structs, complex numbers, other objects),
``_numeric_column`` a value beyond ``MAX_ABS``, ``Schema.infer`` decides the kinds and
``Schema.settle`` the columns left out (constant, empty, collinear) with ``dropped_lines``'s
warning. A column with no value at all is empty: dropped as a constant column, or refused
with ``strict``.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import scipy.linalg

from kernels import moments as kmoments
from pipeline import families as fam_mod
from pipeline.core.errors import InputError
from pipeline.core.persist import register
from pipeline.families import Family, FloatArray, ProductFamily

KINDS = (
    "gaussian",
    "diag-gaussian",
    "categorical",
    "poisson",
    "bernoulli",
    "binomial",
    "exponential",
    "geometric",
)
NUMERIC_KINDS = {"gaussian", "diag-gaussian", "exponential"}
MAX_LEVELS = 10
# ``check_auto_text``: a text column with at least this share of numbers is a numeric column with
# typos; one with more than this share of distinct values and more than this many levels is an
# identifier
NUMERIC_SHARE = 0.9
ID_SHARE = 0.5
ID_LEVELS = 50
COUNT_KINDS = {"poisson", "bernoulli", "binomial", "geometric"}
#: ``family="auto"`` makes the Gaussian columns diagonal above this many (module docstring)
WIDE_COLS = 50
#: ``Schema.drop_collinear``: a QR pivot below this share of the largest marks a dependent column
COLLINEAR_TOL = 1e-6
#: the largest magnitude of a value: the families' statistics hold its square summed over a
#: billion rows (1e209) and the empirical-Bayes covariance of such columns without overflow
MAX_ABS = 1e100
# what ``infer_dtype`` calls a column of cells every family path can read (anything else is
# looked at cell by cell, ``check_cells``)
_PLAIN = frozenset(
    "string bytes empty integer floating mixed-integer-float boolean decimal date datetime "
    "datetime64 time timedelta timedelta64".split()
)
_CELL_TYPES = (str, bytes, int, float, np.bool_, np.integer, np.floating, decimal.Decimal)
_TIME_TYPES = (datetime.date, datetime.time, datetime.timedelta, np.datetime64, np.timedelta64)


def _is_sparse(X: Any) -> bool:
    return hasattr(X, "tocsr") or (hasattr(X, "sparse") and hasattr(X.sparse, "to_dense"))


def as_frame(X: Any, feature_names: Sequence[str] | None = None) -> tuple[pd.DataFrame, bool]:
    """X as a DataFrame with string column names; whether the caller passed a DataFrame."""
    if _is_sparse(X) and not isinstance(X, pd.DataFrame):
        raise TypeError(
            "sparse input is not supported: pass a dense array (X.toarray()) or a DataFrame"
        )
    if isinstance(X, pd.DataFrame):
        df = X.copy(deep=False)
        df.columns = [str(c) for c in df.columns]
        if len(set(df.columns)) != df.shape[1]:
            raise ValueError("column names must be unique")
        return df, True
    if isinstance(X, pd.Series):
        raise ValueError("X must be 2-D (n_samples, n_features); got a Series")
    arr = np.asarray(X)
    if np.iscomplexobj(arr):
        raise ValueError("Complex data not supported: X has a complex dtype")
    if arr.dtype == object:
        # numbers held in an object array are numbers (scikit-learn's convention): anything that is
        # not is reported by float() with the TypeError scikit-learn's checks expect
        arr = arr.astype(np.float64)
    if arr.ndim != 2:
        raise ValueError(
            f"X must be 2-D (n_samples, n_features); got an array of shape {arr.shape}. "
            "Reshape your data with X.reshape(-1, 1) for a single feature or X.reshape(1, -1) "
            "for a single sample."
        )
    names = (
        list(feature_names) if feature_names is not None else [f"x{j}" for j in range(arr.shape[1])]
    )
    # no copy: the frame is only read (encode copies each column out once)
    return pd.DataFrame(arr, columns=names, copy=False), False


def _first_bad_row(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def check_cells(s: pd.Series, name: str) -> None:
    """Refuse a column whose dtype or cells no family can hold.

    Parameters
    ----------
    s : Series of shape (n_rows,)
    name : str
        The column's name, for the message.

    Raises
    ------
    InputError
        For a complex dtype, or the first 0-based row holding a list, an array, a dict (a
        Parquet struct), a complex number or another object that is neither a number, a text,
        nor a date or time.
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


def _numeric_column(s: pd.Series, name: str, missing: bool = False) -> np.ndarray:
    """Column as float64, or a ValueError naming the first row that is not a number (or is
    missing, unless ``missing``: then NaN)."""
    if pd.api.types.is_bool_dtype(s.dtype):
        return s.to_numpy(dtype=np.float64)
    if pd.api.types.is_numeric_dtype(s.dtype):
        vals = s.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        conv = pd.to_numeric(s, errors="coerce")
        bad = conv.isna().to_numpy() & s.notna().to_numpy()
        if bad.any():
            i = _first_bad_row(bad)
            raise ValueError(f"column '{name}': row {i} has {s.iloc[i]!r}, which is not a number")
        vals = conv.to_numpy(dtype=np.float64, na_value=np.nan)
    nan = np.isnan(vals)
    if nan.any() and not missing:
        raise ValueError(f"column '{name}': row {_first_bad_row(nan)} is NaN (missing value)")
    inf = np.isinf(vals)
    if inf.any():
        i = _first_bad_row(inf)
        raise ValueError(f"column '{name}': row {i} is {vals[i]} (inf is not a valid value)")
    big = np.abs(vals) > MAX_ABS
    if big.any():
        i = _first_bad_row(big)
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
        # a CSV reader turns an integer column with an empty cell into floats: the values
        # present decide, as they would have without the holes
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


def _is_text(s: pd.Series) -> bool:
    """Strings or other objects: what ``auto_kind`` makes categorical without being told."""
    dt = s.dtype
    return not (
        pd.api.types.is_numeric_dtype(dt)
        or pd.api.types.is_bool_dtype(dt)
        or isinstance(dt, pd.CategoricalDtype)
    )


def check_auto_text(s: pd.Series, name: str) -> None:
    """Refuse a text column that ``family="auto"`` would wrongly make categorical.

    Parameters
    ----------
    s : Series of shape (n_rows,)
        The column as read (a numeric, bool or ``category`` column passes unchecked).
    name : str
        The column's name, for the message.

    Raises
    ------
    InputError
        When at least ``NUMERIC_SHARE`` of the values present are numbers (the message names the
        first 0-based row that is not), or when more than ``ID_SHARE`` of the rows and more than
        ``ID_LEVELS`` values are distinct (an identifier).
    """
    if not _is_text(s):
        return
    present = s.notna().to_numpy()
    n_present = int(present.sum())
    if n_present == 0:
        return
    is_num = pd.to_numeric(s, errors="coerce").notna().to_numpy()
    n_num = int(is_num.sum())
    if n_num < n_present and n_num >= NUMERIC_SHARE * n_present:
        i = _first_bad_row(present & ~is_num)
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


def constant_columns(df: pd.DataFrame) -> dict[str, Any]:
    """The columns of ``df`` holding one value in every row where they have one, with that value
    (a numpy scalar as the Python one, for run.json)."""
    out = {}
    for c in df.columns:
        s = df[c]
        if s.notna().any() and s.nunique(dropna=True) == 1:
            v = s.dropna().iloc[0]
            out[str(c)] = v.item() if isinstance(v, np.generic) else v
    return out


@register
@dataclass
class Schema:
    """Feature names, per-column family kinds and encodings fixed at fit time."""

    columns: list[str]
    kinds: dict[str, str]
    categories: dict[str, list[Any]] = field(default_factory=dict)
    n_trials: dict[str, int] = field(default_factory=dict)
    from_frame: bool = False
    #: constant columns left out of the model, with their value (module docstring)
    dropped: dict[str, Any] = field(default_factory=dict)
    #: full-covariance Gaussian columns left out as exact linear combinations of the others
    collinear: list[str] = field(default_factory=list)
    #: what ``family="auto"`` chose beyond the per-column rules, in words
    notes: list[str] = field(default_factory=list)
    #: whether missing cells are kept (as NaN) rather than refused
    missing: bool = False

    @property
    def features(self) -> list[str]:
        """The columns the model sees: ``columns`` without the ``dropped`` and ``collinear``
        ones."""
        return [c for c in self.columns if c not in self.dropped and c not in self.collinear]

    @classmethod
    def infer(
        cls, df: pd.DataFrame, family: Any, from_frame: bool, missing: bool = False
    ) -> Schema:
        """Kinds per column from ``family`` ("auto", a kind name, or a {column: kind} mapping);
        ``missing``: keep missing cells (module docstring)."""
        if df.shape[1] == 0:
            raise ValueError(
                f"X has no columns: 0 feature(s) (shape=({df.shape[0]}, 0)) while a minimum of 1 "
                "is required."
            )
        cols = list(df.columns)
        for c in cols:
            check_cells(df[c], c)
        if isinstance(family, str):
            if family == "auto":
                for c in cols:
                    check_auto_text(df[c], c)
                kinds = {c: auto_kind(df[c]) for c in cols}
            elif family in KINDS:
                kinds = dict.fromkeys(cols, family)
            else:
                raise ValueError(f"unknown family {family!r}; choose 'auto' or one of {KINDS}")
        elif isinstance(family, Mapping):
            unknown = [c for c in family if str(c) not in cols]
            if unknown:
                raise ValueError(f"family names columns not in the data: {unknown}")
            named = {str(c) for c in family}
            for c in cols:
                if c not in named:
                    check_auto_text(df[c], c)
            kinds = {c: auto_kind(df[c]) for c in cols}
            for c, k in family.items():
                if k not in KINDS:
                    raise ValueError(f"column '{c}': unknown family {k!r}; choose one of {KINDS}")
                kinds[str(c)] = k
        else:
            raise ValueError(
                "family must be 'auto', a family name, a {column: family} mapping, or a "
                "Family / ProductFamily instance"
            )
        named = set(family) if isinstance(family, Mapping) else set()
        auto_gauss = [c for c in cols if kinds[c] == "gaussian" and c not in named]
        notes = []
        if (
            family != "gaussian"
            and auto_gauss
            and (len(auto_gauss) > WIDE_COLS or df.shape[0] < 2 * len(auto_gauss))
        ):
            for c in auto_gauss:
                kinds[c] = "diag-gaussian"
            notes.append(
                f"{len(auto_gauss)} numeric columns in {df.shape[0]:,} rows: diagonal covariance "
                f"(diag-gaussian) for them, since a full covariance needs far more rows per "
                f"cluster; name the family to override"
            )
        schema = cls(columns=cols, kinds=kinds, from_frame=from_frame, notes=notes)
        schema.missing = bool(missing)
        for c in cols:
            if kinds[c] == "categorical":
                s = df[c]
                if s.isna().any() and not missing:
                    i = _first_bad_row(s.isna().to_numpy())
                    raise ValueError(f"column '{c}': row {i} is NaN (missing value)")
                if isinstance(s.dtype, pd.CategoricalDtype):
                    schema.categories[c] = list(s.cat.categories)
                else:
                    schema.categories[c] = sorted(
                        pd.unique(s.dropna()), key=lambda v: (str(type(v)), v)
                    )
            elif kinds[c] == "binomial":
                vals = _numeric_column(df[c], c, missing)
                present = vals[~np.isnan(vals)]
                schema.n_trials[c] = int(max(np.max(present), 1)) if present.size else 1
        return schema

    # -- encoding ------------------------------------------------------------------------------
    def check_columns(self, df: pd.DataFrame, from_frame: bool, who: str) -> pd.DataFrame:
        """The fitted columns of df, in fit order, or a ValueError saying what differs."""
        if from_frame and self.from_frame:
            missing = [c for c in self.columns if c not in df.columns]
            extra = [c for c in df.columns if c not in self.columns]
            if missing or extra:
                parts = []
                if missing:
                    parts.append(f"missing {missing}")
                if extra:
                    parts.append(f"unexpected {extra}")
                raise ValueError(
                    f"the columns differ from those {who} was fitted with: " + "; ".join(parts)
                )
            return df[self.columns]
        if df.shape[1] != len(self.columns):
            raise ValueError(
                f"X has {df.shape[1]} features, but {who} is expecting {len(self.columns)} "
                "features as input"
            )
        df = df.copy(deep=False)
        df.columns = self.columns
        return df

    def encode(self, df: pd.DataFrame, fitting: bool) -> FloatArray:
        """The (n, n_columns) float64 matrix of df's columns; categoricals become codes 0..C-1."""
        if df.shape[0] == 0:
            raise ValueError("X has no rows (0 samples); at least 1 is required")
        features = self.features
        cols = df[features]
        if "categorical" not in self.kinds.values() and all(
            pd.api.types.is_numeric_dtype(dt) for dt in cols.dtypes
        ):
            # numbers only: one copy of the block; the column-by-column pass below runs only to
            # name the first NaN or inf
            out = cols.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
            # one pass in the common case: a NaN, an inf or a value beyond MAX_ABS fails it
            if np.abs(out).max(initial=0.0) <= MAX_ABS or (
                self.missing and not (np.abs(np.nan_to_num(out)) > MAX_ABS).any()
            ):
                return out
        out = np.empty((df.shape[0], len(features)), dtype=np.float64)
        for j, c in enumerate(features):
            kind = self.kinds[c]
            s = df[c]
            check_cells(s, c)
            if kind == "categorical":
                cats = self.categories[c]
                lookup = {v: i for i, v in enumerate(cats)}
                codes = s.map(lookup)
                bad = codes.isna().to_numpy().copy()
                if self.missing:
                    bad &= s.notna().to_numpy()
                if bad.any():
                    i = _first_bad_row(bad)
                    what = "is missing" if pd.isna(s.iloc[i]) else f"has category {s.iloc[i]!r}"
                    raise ValueError(
                        f"column '{c}': row {i} {what}, not one of the {len(cats)} categories "
                        "seen in fit"
                    )
                out[:, j] = codes.to_numpy(dtype=np.float64, na_value=np.nan)
            else:
                out[:, j] = _numeric_column(s, c, self.missing)
        return out

    def check_informative(
        self,
        X: FloatArray,
        strict: bool = True,
        summary: tuple[int, FloatArray, FloatArray, FloatArray] | None = None,
    ) -> FloatArray:
        """Fit-time checks of the encoded records X (n, n_features): enough rows, and no column
        of one constant value (among the values present) nor without any value (empty).

        A constant or empty column is an error with ``strict``; otherwise it is dropped:
        recorded in ``dropped`` (with its value; NaN for an empty one) and left out of the
        returned X and of later encodings. ``summary``: (n, n_missing, lo, hi) of every row,
        lo and hi of shape (n_features,), when X holds only a sample of them (ingest).

        Returns
        -------
        ndarray of shape (n_sample, n_features - n_dropped)
        """
        if summary is None:
            n_missing, _, lo, hi = kmoments.column_summary(np.ascontiguousarray(X))
            summary = (X.shape[0], n_missing, lo, hi)
        n, n_missing, lo, hi = summary
        if n < 2:
            raise ValueError(f"n_samples = {n}: clustering needs at least 2 samples, got {n}")
        features = self.features
        lo = np.array(lo, dtype=np.float64)
        # an all-missing column is constant too (nothing to tell its rows apart); its value NaN
        lo[np.asarray(n_missing) >= n] = np.nan
        constant = np.flatnonzero(~(lo < hi))
        if not constant.size:
            return X
        values = {}
        for j in constant.tolist():
            c = features[j]
            first = lo[j]
            shown = (
                self.categories[c][int(first)] if c in self.categories and first == first else first
            )
            values[c] = shown.item() if isinstance(shown, np.generic) else shown
        if strict:
            c, shown = next(iter(values.items()))
            empty = shown != shown
            what = (
                "is empty (no row has a value)"
                if empty
                else f"is constant (every row is {shown!r})"
            )
            raise ValueError(
                f"column '{c}' {what}: it cannot inform the clustering and its empirical-Bayes "
                "prior is degenerate; drop the column"
            )
        if constant.size == len(features):
            raise ValueError(
                f"every column is constant ({', '.join(map(repr, values))}): nothing to cluster on"
            )
        self.dropped.update(values)
        return np.ascontiguousarray(np.delete(X, constant, axis=1))

    def settle(
        self,
        X: FloatArray,
        strict: bool = True,
        summary: tuple[int, FloatArray, FloatArray, FloatArray] | None = None,
    ) -> FloatArray:
        """The fit-time decisions that need the records, made once for every path: constant
        and empty columns (``check_informative``), then, without ``strict``, exact linear
        combinations (``drop_collinear``).

        Parameters
        ----------
        X : ndarray of shape (n, n_features)
            The encoded records (ingest: its sample of the training rows).
        strict : bool
            Refuse a constant or empty column instead of dropping it; keep collinear columns.
        summary : tuple, optional
            (n, n_missing, lo, hi) over every row when X is a sample (``check_informative``).

        Returns
        -------
        ndarray of shape (n, len(features))
            X without the columns dropped (``dropped_lines`` says which, in words).
        """
        X = self.check_informative(X, strict, summary)
        return X if strict else self.drop_collinear(X)

    def dropped_lines(self) -> list[str]:
        """One sentence per kind of column left out (constant, collinear), for warnings and
        run.json; empty when none was."""
        out = []
        if self.dropped:
            out.append(
                "constant columns dropped (they cannot inform the clustering): "
                + ", ".join(
                    f"{c!r} (every value {v!r})" if v == v else f"{c!r} (empty: no value)"
                    for c, v in self.dropped.items()
                )
                + "; strict=True (--strict) refuses them instead"
            )
        if self.collinear:
            out.append(
                "columns dropped as exact linear combinations of the other numeric columns: "
                + ", ".join(map(repr, self.collinear))
            )
        return out

    def drop_collinear(self, X: FloatArray) -> FloatArray:
        """Leave out the full-covariance Gaussian columns of X (n, n_features) that are exact
        linear combinations of the others (recorded in ``collinear``); returns the rest.

        Such a column (an average of others, a difference of two) carries no information the
        others lack, and makes every cluster's scatter singular along one direction, where the
        Normal-Wishart density then grows with how tightly a cluster hugs that plane rather than
        with how well it fits the data (image segmentation's 18 attributes hold 4 such columns:
        NMI 0.44 with them, 0.56 without). Found by QR with column pivoting of the standardised
        columns over the complete rows: a pivot below ``COLLINEAR_TOL`` of the largest marks a
        column the earlier ones span.
        """
        feats = self.features
        cols = [j for j, c in enumerate(feats) if self.kinds[c] == "gaussian"]
        if len(cols) < 2:
            return X
        Z = X[:, cols]
        Z = Z[~np.isnan(Z).any(axis=1)]
        if Z.shape[0] <= len(cols):
            return X
        sd = Z.std(axis=0)
        Z = (Z - Z.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
        _q, r, piv = scipy.linalg.qr(Z, mode="economic", pivoting=True)
        pivots = np.abs(np.diag(r))
        dep = sorted(
            int(cols[piv[i]]) for i in range(len(cols)) if pivots[i] < COLLINEAR_TOL * pivots[0]
        )
        if not dep:
            return X
        self.collinear.extend(feats[j] for j in dep)
        return np.ascontiguousarray(np.delete(X, dep, axis=1))

    # -- families ----------------------------------------------------------------------------
    def groups(self) -> list[tuple[str, list[int]]]:
        """(kind, column indices): one group per kind, one per categorical column."""
        out: list[tuple[str, list[int]]] = []
        by_kind: dict[str, list[int]] = {}
        for j, c in enumerate(self.features):
            k = self.kinds[c]
            if k == "categorical":
                out.append((k, [j]))
            else:
                by_kind.setdefault(k, []).append(j)
        return [(k, cols) for k, cols in by_kind.items()] + out

    def build_family(self, X: FloatArray, scale: float | None = None) -> ProductFamily:
        """Empirical-Bayes priors per group (seed 000, Appendix A, option 1); ``scale`` is the
        prior scale of the Gaussian groups (``GaussianNW.empirical_bayes``; None: their
        default)."""
        groups: list[tuple[Family, list[int]]] = []
        for kind, cols in self.groups():
            # one group over all the columns in order (the common numeric case) needs no copy
            Xg = X if cols == list(range(X.shape[1])) else X[:, cols]
            names = [self.features[j] for j in cols]
            fam: Family
            if kind == "categorical":
                # an empty column has no category; ``settle`` leaves it out of the model
                n_cat = max(len(self.categories[names[0]]), 1)
                fam = fam_mod.Categorical.empirical_bayes(Xg, n_categories=n_cat)
            elif kind == "binomial":
                trials = np.array([self.n_trials[nm] for nm in names], dtype=np.float64)
                fam = fam_mod.Binomial.empirical_bayes(Xg, n_trials=trials)
            elif kind in ("gaussian", "diag-gaussian") and scale is not None:
                fam = fam_mod.FAMILIES[kind].empirical_bayes(Xg, scale=scale)  # type: ignore[call-arg]
            else:
                fam = fam_mod.FAMILIES[kind].empirical_bayes(Xg)
            fam.check_values(np.where(np.isnan(Xg), 0.0, Xg) if self.missing else Xg, names)
            groups.append((fam, cols))
        return ProductFamily(groups)

    def check_values(self, family: ProductFamily, X: FloatArray) -> None:
        """Each family's support check of its columns of X (n, n_features); a missing cell
        (NaN, with ``missing``) is not a value and is not checked."""
        if self.missing and np.isnan(X).any():
            X = np.where(np.isnan(X), 0.0, X)
        feats = self.features
        for fam, cols in family.groups:
            whole = list(cols) == list(range(X.shape[1]))
            fam.check_values(X if whole else X[:, cols], [feats[j] for j in cols])

    def names_of(self, family: ProductFamily) -> list[list[str]]:
        feats = self.features
        return [[feats[j] for j in cols] for _f, cols in family.groups]


def cluster_table(
    stats: FloatArray, alpha: float, family: ProductFamily, schema: Schema
) -> pd.DataFrame:
    """One row per cluster: size, weight N_k / (N + N0) and each family's posterior summary
    (as ``MAPDP.cluster_summary``)."""
    names = schema.names_of(family)
    slices = family.stat_slices()
    n = float(stats[:, 0].sum())
    rows = []
    for k in range(stats.shape[0]):
        row: dict[str, Any] = {"cluster": k, "size": round(float(stats[k, 0]))}
        row["weight"] = float(stats[k, 0] / (n + alpha))
        row["log_marginal"] = family.log_marginal_stats(stats[k])
        for (fam, _cols), nm, sl in zip(family.groups, names, slices):
            row.update(fam.posterior_summary(stats[k, sl], nm))
        rows.append(row)
    return pd.DataFrame(rows)
