"""From user data to the float matrix and product family the kernels see.

A ``Schema`` is learned at fit time (feature names, a family kind per column, categories, binomial
trials); it encodes the same columns at predict time and refuses anything else. It is the one
decision, for the in-memory fit, ingest and scoring alike, of what a column is.

``family="auto"`` rules, per column
-----------------------------------
* bool, or integers taking only 0 and 1: ``bernoulli``;
* ``category``, strings or other objects: ``categorical``, unless every value is a number;
* integers with at most ``MAX_LEVELS`` (10) distinct values: ``categorical`` (a Gaussian on a
  lattice of a few values rewards clusters that collapse onto one level);
* a float column with missing cells whose values are all integers follows the integer rules;
* other integers and floats: ``gaussian`` (one full-covariance Normal-Wishart group); ask for
  ``poisson``, ``geometric`` or ``binomial`` explicitly for true counts.

Full or diagonal covariance (``diag-gaussian``) for two or more of them is chosen by the data: the
higher held-out log density (eq. 3.4) of MAP-DP on a hash sample of rows
(``Schema.choose_structure``; Raykov et al. 2016, Appendix A). Fewer than
``config.EVIDENCE_PER_COL`` sample rows per column give ``diag-gaussian`` without a comparison:
there a full covariance fits the clusters' differences as correlation, and wins on density
while it merges them. Fewer than ``config.EVIDENCE_MIN`` rows, but enough per column, give
``gaussian``. One such column stays ``gaussian``.

``check_auto_text`` refuses, rather than guesses, a text column that is numbers but for a few
(``NUMERIC_SHARE``) and one that looks like an identifier (``ID_SHARE``, ``ID_LEVELS``); naming the
column's family accepts either. ``family={"visits": "poisson"}`` keeps ``auto`` for the rest.

With ``missing=True`` an empty cell stays NaN through the encoding; otherwise the first one is an
error naming its column and row. ``Schema.settle`` drops (or, with ``strict=True``, refuses) a
column of one value or none, and ``drop_collinear`` exact linear combinations of full-covariance
Gaussian columns (``Schema.dropped``, ``Schema.collinear``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import scipy.linalg

from kernels import mapdp as kmapdp
from kernels import moments as kmoments
from pipeline import families as fam_mod
from pipeline.core import config
from pipeline.core.persist import register
from pipeline.core.seeds import SAMPLE_SALT, row_uniform
from pipeline.families import Family, FloatArray, ProductFamily
from pipeline.families.cells import (
    MAX_ABS,
    auto_kind,
    check_auto_text,
    check_cells,
    first_bad_row,
    numeric_column,
)

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
COUNT_KINDS = {"poisson", "bernoulli", "binomial", "geometric"}
#: ``Schema.drop_collinear``: a QR pivot below this share of the largest marks a dependent column
COLLINEAR_TOL = 1e-6
#: (n, n_missing, lo, hi) of the encoded columns over every row: the count of rows, and per
#: column (n_features,) its missing cells, least and greatest value (``Schema.settle``)
Summary = tuple[int, FloatArray, FloatArray, FloatArray]


def as_frame(X: Any, feature_names: Sequence[str] | None = None) -> tuple[pd.DataFrame, bool]:
    """X as a DataFrame with string column names; whether the caller passed a DataFrame."""
    sparse = hasattr(X, "tocsr") or (hasattr(X, "sparse") and hasattr(X.sparse, "to_dense"))
    if sparse and not isinstance(X, pd.DataFrame):
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


def scale_rows(n: int, d: int) -> int:
    """The rows of the structure's sample of n rows and d columns that ``Schema.choose_scale``
    fits: the first ``config.SCALE_ROWS``, at least ``EVIDENCE_PER_COL`` per column."""
    return min(n, max(config.SCALE_ROWS, config.EVIDENCE_PER_COL * d))


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
    #: ``choose_structure``'s columns and evidence (each kind's held-out density, rows, choice)
    structure: dict[str, Any] = field(default_factory=dict)

    @property
    def features(self) -> list[str]:
        """The columns the model sees: ``columns`` but the ``dropped`` and ``collinear`` ones."""
        # a set: a list's membership test made this quadratic in the columns (10 x 5,000: 10 s)
        out = set(self.dropped).union(self.collinear)
        return [c for c in self.columns if c not in out]

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
        # chosen only when no named column shares their kinds (``choose_structure``)
        fixed = family == "gaussian" or {"gaussian", "diag-gaussian"} & {kinds[c] for c in named}
        schema = cls(columns=cols, kinds=kinds, from_frame=from_frame)
        schema.structure = {"columns": [] if fixed else auto_gauss}
        schema.missing = bool(missing)
        for c in cols:
            if kinds[c] == "categorical":
                s = df[c]
                if s.isna().any() and not missing:
                    i = first_bad_row(s.isna().to_numpy())
                    raise ValueError(f"column '{c}': row {i} is NaN (missing value)")
                if isinstance(s.dtype, pd.CategoricalDtype):
                    schema.categories[c] = list(s.cat.categories)
                else:
                    schema.categories[c] = sorted(
                        pd.unique(s.dropna()), key=lambda v: (str(type(v)), v)
                    )
            elif kinds[c] == "binomial":
                vals = numeric_column(df[c], c, missing)
                present = vals[~np.isnan(vals)]
                schema.n_trials[c] = int(max(np.max(present), 1)) if present.size else 1
        return schema

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
            # numbers only: one copy; the column-by-column pass only names the first NaN or inf
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
                    i = first_bad_row(bad)
                    what = "is missing" if pd.isna(s.iloc[i]) else f"has category {s.iloc[i]!r}"
                    raise ValueError(
                        f"column '{c}': row {i} {what}, not one of the {len(cats)} categories "
                        "seen in fit"
                    )
                out[:, j] = codes.to_numpy(dtype=np.float64, na_value=np.nan)
            else:
                out[:, j] = numeric_column(s, c, self.missing)
        return out

    def settle(
        self, X: FloatArray, strict: bool = True, summary: Summary | None = None
    ) -> FloatArray:
        """The fit-time decisions on the encoded records, made here for every path: enough rows,
        no column of one value or of none, and, without ``strict``, no exact linear combination
        (``drop_collinear``); then ``choose_structure``.

        Parameters
        ----------
        X : ndarray of shape (n, n_features)
            The encoded records (ingest: its sample of the training rows).
        strict : bool
            Refuse a constant or empty column and keep collinear ones; otherwise they are
            dropped (``dropped``, ``collinear``, ``dropped_lines``).
        summary : Summary, optional
            Over every row when X holds only a sample of them (ingest).

        Returns
        -------
        ndarray of shape (n, len(features))
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
        values = {}
        for j in constant.tolist():
            c, first = features[j], lo[j]
            shown = (
                self.categories[c][int(first)] if c in self.categories and first == first else first
            )
            values[c] = shown.item() if isinstance(shown, np.generic) else shown
        if values and strict:
            c, v = next(iter(values.items()))
            what = (
                f"is constant (every row is {v!r})" if v == v else "is empty (no row has a value)"
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
        X = np.ascontiguousarray(np.delete(X, constant, axis=1)) if values else X
        return X if strict else self.drop_collinear(X)

    def full_possible(self) -> bool:
        """Whether ``choose_structure`` can keep a full covariance: at most ``EVIDENCE_ROWS /
        EVIDENCE_PER_COL`` columns to choose for (no sample has ``EVIDENCE_PER_COL`` rows for
        each of more); True when no choice is to be made."""
        d = len(self.structure.get("columns", []))
        return d * config.EVIDENCE_PER_COL <= config.EVIDENCE_ROWS

    def choose_structure(self, X: FloatArray, rows: Any) -> None:
        """Full or diagonal covariance for ``structure["columns"]`` of X (n, n_features), row i
        the input's ``rows[i]`` (module docstring, ``config.EVIDENCE_ROWS``): the complete rows
        of smallest ``row_uniform(rows, SAMPLE_SALT)``, in any sample of at least as many."""
        where = {c: j for j, c in enumerate(self.features)}
        names = [c for c in self.structure.get("columns", []) if c in where]
        if len(names) < 2:
            # one column has no covariance to choose: both kinds are the same Normal model
            self.structure = {"columns": names}
            return
        d, Z = len(names), self._evidence_sample(X, rows, names)
        ev: dict[str, Any] = {"columns": names, "rows": int(Z.shape[0])}
        if Z.shape[0] < config.EVIDENCE_PER_COL * d:
            kind = "diag-gaussian"
            why = f"{Z.shape[0]} complete rows, under {config.EVIDENCE_PER_COL} per column"
        elif Z.shape[0] < config.EVIDENCE_MIN:
            kind = "gaussian"
            why = f"too few complete rows ({Z.shape[0]}) to compare by held-out density"
        else:
            ev["folds"], folds = config.EVIDENCE_FOLDS, np.arange(len(Z)) % config.EVIDENCE_FOLDS
            ev.update({k: heldout_density(Z, folds, fam_mod.FAMILIES[k]) for k in KINDS[:2]})
            kind = "gaussian" if ev["gaussian"] >= ev["diag-gaussian"] else "diag-gaussian"
            why = f"held-out log density per row {ev['gaussian']:.4g} full, "
            why += f"{ev['diag-gaussian']:.4g} diagonal, on {Z.shape[0]:,} rows"
        shape = "full" if kind == "gaussian" else "diagonal"
        ev.update(chosen=kind, note=f"{d} numeric columns: {shape} covariance ({kind}), {why}")
        self.structure = ev
        self.kinds.update(dict.fromkeys(names, kind))
        self.notes.append(ev["note"])

    def _evidence_sample(self, X: FloatArray, rows: Any, names: Sequence[str]) -> FloatArray:
        """The complete rows of X's columns ``names`` that ``choose_structure`` decides on."""
        cols = [self.features.index(c) for c in names]
        Z = X[np.argsort(row_uniform(rows, SAMPLE_SALT), kind="stable")[: config.EVIDENCE_ROWS]]
        return np.ascontiguousarray(Z[:, cols][~np.isnan(Z[:, cols]).any(axis=1)])

    def choose_scale(
        self,
        X: FloatArray,
        rows: Any,
        objective_of: Callable[[FloatArray, str], dict[float, float]],
        n_fitted: int,
    ) -> None:
        """The empirical-Bayes prior scale of the Gaussian columns of a fit of ``n_fitted``
        records, up to ``config.AUTO_RESTARTS_ROWS`` (where its fits are cheap beside the
        choice's), where ``choose_structure`` decided their covariance by evidence: on the first
        ``config.SCALE_ROWS`` (at least ``EVIDENCE_PER_COL`` per column) of the same sample of
        X (n, n_features) (row i the input's ``rows[i]``), the scale whose fit ends with the
        lowest objective
        (``objective_of``: the sample and the covariance kind -> {scale: objective}, without
        the scales not to be chosen; ``pipeline.models.mapdp.choose_scale``). Recorded as
        ``structure["scale"]``, which ``build_family`` takes when given none, and [scale,
        objective] pairs in ``structure["scales"]``; elsewhere, or once chosen, nothing
        changes."""
        ev = self.structure
        if "folds" not in ev or "scales" in ev or n_fitted > config.AUTO_RESTARTS_ROWS:
            return
        Z = self._evidence_sample(X, rows, ev["columns"])
        objective = objective_of(Z[: scale_rows(Z.shape[0], Z.shape[1])], ev["chosen"])
        ev["scales"] = [[s, objective[s]] for s in objective]
        if objective:
            ev["scale"] = min(objective, key=objective.__getitem__)

    def dropped_lines(self) -> list[str]:
        """One sentence per kind of column left out (constant, collinear); empty when none."""
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
        linear combinations of the others (QR with column pivoting, ``COLLINEAR_TOL``; recorded
        in ``collinear``): they make every cluster's scatter singular. Returns the rest."""
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

    def build_family(
        self, X: FloatArray, scale: float | None = None, support_only: bool = False
    ) -> ProductFamily:
        """Empirical-Bayes priors per group (Raykov et al. 2016, Appendix A, option 1), the
        Gaussian groups' at prior ``scale`` (None: the one ``choose_scale`` chose, else their
        default). ``support_only``: a family that only checks values and arranges the columns
        (ingest's checker), its full-covariance groups diagonal: the same support and column
        order for O(n d) instead of a Normal-Wishart prior's O(d^3) (5,000 columns: 16 s)."""
        groups: list[tuple[Family, list[int]]] = []
        feats = self.features
        if scale is None:
            scale = self.structure.get("scale")
        for kind, cols in self.groups():
            # one group over all the columns in order (the common numeric case) needs no copy
            Xg = X if cols == list(range(X.shape[1])) else X[:, cols]
            names = [feats[j] for j in cols]
            fam: Family
            if kind == "categorical":
                # an empty column has no category; ``settle`` leaves it out of the model
                n_cat = max(len(self.categories[names[0]]), 1)
                fam = fam_mod.Categorical.empirical_bayes(Xg, n_categories=n_cat)
            elif kind == "binomial":
                trials = np.array([self.n_trials[nm] for nm in names], dtype=np.float64)
                fam = fam_mod.Binomial.empirical_bayes(Xg, n_trials=trials)
            elif kind == "gaussian" and support_only:
                fam = fam_mod.NormalGamma.empirical_bayes(Xg)
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


def heldout_density(Z: FloatArray, folds: Any, family: type[Family]) -> float:
    """Mean log predictive density (eq. 3.4) per row of Z (n, d), each scored by MAP-DP (Algorithm
    1 from the sequential start, N0 = 1, ``family``'s empirical-Bayes prior) on the other folds."""
    total = 0.0
    for f in np.unique(folds):
        train, test = np.ascontiguousarray(Z[folds != f]), np.ascontiguousarray(Z[folds == f])
        fam = ProductFamily([(family.empirical_bayes(train), list(range(Z.shape[1])))])
        z, order = np.full(train.shape[0], -1), np.arange(train.shape[0])
        stats, nk, slots = np.zeros((8, fam.n_stats)), np.zeros(8), 0
        cache, empty_c = fam.cache_of(stats), fam.empty_cache()
        for _ in range(config.MAX_ITER):
            stats, cache, nk, slots, moved = kmapdp.sweep(
                train, order, z, stats, cache, nk, slots, fam.spec, fam.prior, empty_c, 1.0,
                np.empty(0),
            )  # fmt: skip
            if moved == 0:
                break
        stats, cache, nk = kmapdp.compact(z, stats, cache, nk, slots)
        total += kmapdp.predict(test, stats, cache, nk, fam.spec, fam.prior, empty_c, 1.0)[1].sum()
    return total / Z.shape[0]


def cluster_table(
    stats: FloatArray, alpha: float, family: ProductFamily, schema: Schema
) -> pd.DataFrame:
    """One row per cluster: size, weight and each family's posterior summary."""
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
