"""Fitted models on disk: ``save_model`` / ``load_model`` (and ``estimator.save(path)``).

A model is a directory holding one ``pipeline.core.persist`` record, ``model.json`` plus
``model.npz`` (never a pickle). The JSON's root holds ``format``, ``model_version``
(``MODEL_VERSION``; another is refused), ``estimator`` (a class of
``pipeline.estimators.registry.MODELS``), ``engine``, ``params`` (``get_params``), ``schema``,
``family`` (with ``family_description``), ``alpha``, ``fitted`` (the attributes the estimator
predicts with), ``metadata`` and ``versions``. Training labels are not part of a model.

Loading checks the record, the version and that the arrays agree with each other and with the
JSON before it builds the estimator; any failure is a ``PersistError`` naming the file.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core import config, outputs, persist, storage
from pipeline.core.outputs import versions
from pipeline.core.persist import PersistError

MODEL_FORMAT = "dpmm-pipeline model"
MODEL_VERSION = 1
RECORD = "model"

# the fitted attribute stored as a tree (its columns and node statistics)
_TREE = "tree_"


def _estimators() -> dict[str, type]:
    """The estimators a model may load into (an allowlist: the registry's, imported by name to
    avoid a circle through ``MixtureEstimator.save``), their record classes registered."""
    registry = importlib.import_module("pipeline.estimators.registry")
    return {name: m.estimator for name, m in registry.MODELS.items()}


def _tree_node(tree: Any) -> dict[str, Any]:
    table = tree.to_numpy()
    return {
        "fields": list(table.dtype.names),
        "columns": {name: np.ascontiguousarray(table[name]) for name in table.dtype.names},
        "stats": np.ascontiguousarray(tree.stats),
    }


def model_record(
    est: Any, *, engine: str | None = None, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The dict ``save_model`` stores for the fitted estimator ``est``; a ``PersistError`` when
    it is not one of the registry's estimators or not fitted."""
    cls: type = type(est)
    name = cls.__name__
    estimators = _estimators()
    if estimators.get(name) is not cls:
        raise PersistError(
            f"cannot save a {type(est).__qualname__}: models are saved for " + ", ".join(estimators)
        )
    attrs = tuple(est._model_attrs)
    missing = [a for a in ("schema_", *attrs) if not hasattr(est, a)]
    if missing:
        raise PersistError(f"cannot save this {name}: it is not fitted (no {', '.join(missing)})")
    attrs += tuple(a for a in est._model_extras if hasattr(est, a))
    fitted: dict[str, Any] = {}
    for a in attrs:
        v = getattr(est, a)
        fitted[a] = _tree_node(v) if a == _TREE else v
    params = dict(est.get_params(deep=False))
    alpha = getattr(est, "alpha_", None)
    if alpha is None and "alpha" in params:
        alpha = est.alpha
    rs = params.get("random_state")
    if rs is not None and not isinstance(rs, (int, np.integer)):
        # a Generator or SeedSequence is no user's seed: a loaded model refits unseeded
        params["random_state"] = None
    elif isinstance(rs, np.integer):
        params["random_state"] = int(rs)
    family = getattr(est, "family_", None)
    return _record(
        name, engine or name.lower(), params, est.schema_, family, alpha, fitted, metadata
    )


def _record(
    name: str,
    engine: str,
    params: dict[str, Any],
    schema: Any,
    family: Any,
    alpha: Any,
    fitted: dict[str, Any],
    metadata: dict[str, Any] | None,
) -> dict[str, Any]:
    """The stored dict of a model (module docstring) from its parts."""
    return {
        "format": MODEL_FORMAT,
        "model_version": MODEL_VERSION,
        "estimator": name,
        "engine": engine,
        "params": params,
        "schema": schema,
        "family": family,
        "family_description": repr(family) if family is not None else None,
        "alpha": None if alpha is None or isinstance(alpha, str) else float(alpha),
        "fitted": fitted,
        "metadata": dict(metadata or {}),
        "versions": versions(),
    }


def save_model(
    estimator: Any,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    engine: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a fitted estimator as the model directory ``path`` (module docstring), renamed into
    place when complete.

    Parameters
    ----------
    estimator : fitted estimator of ``pipeline.estimators.registry.MODELS``
    path : path
        The model directory; its parent is created.
    overwrite : bool, default=False
        Replace an existing ``path`` (otherwise a ``FileExistsError``).
    engine : str, optional
        What fitted it (default: the estimator's name in lower case).
    metadata : dict, optional
        Storable values kept in the model.

    Returns
    -------
    Path, ``path``.
    """
    out = storage.location(path)
    # a replacement of it that a crash interrupted is completed first (object storage)
    outputs.finish_replace(out)
    shown = storage.redact(str(out))
    if outputs.committed(out) and not overwrite:
        raise FileExistsError(f"{shown}: already exists (pass overwrite=True to replace it)")
    if not outputs.committed(out) and out.exists():
        # a prefix written but never committed: only a crashed save's files may be replaced,
        # never a user's other objects (a local directory that exists is committed)
        others = set(storage.file_stamps(out)) - {f"{RECORD}.json", f"{RECORD}.npz"}
        if others:
            raise FileExistsError(
                f"{shown}: holds objects that are not a model ({sorted(others)[0]}, ...); "
                "refusing to replace them"
            )
    record = model_record(estimator, engine=engine, metadata=metadata)
    # built beside ``out`` and published whole: the model it replaces stays until then
    staged = outputs.stage(out)
    try:
        persist.save(staged, RECORD, record)
        outputs.publish(staged, out, kind="model")
    except BaseException:
        outputs.discard(staged)
        raise
    # a Path for a local model (a URL's is its place on object storage: ``storage.Loc``)
    return out  # type: ignore[return-value]


def write_model(directory: storage.Where, estimator: Any, **kwargs: Any) -> None:
    """``save_model`` into a directory that is itself being staged: no rename of its own."""
    write_record(directory, model_record(estimator, **kwargs))


def write_record(directory: storage.Where, record: dict[str, Any]) -> None:
    """A model's ``record`` saved into a directory that is itself being staged (no rename)."""
    persist.save(directory, RECORD, record)


def _fail(json_path: storage.Loc, problem: str) -> PersistError:
    return PersistError(f"{json_path}: {problem}")


def _shape(v: Any) -> tuple[int, ...] | None:
    return tuple(v.shape) if isinstance(v, np.ndarray) else None


def _check_fitted(json_path: storage.Loc, rec: dict[str, Any], cls: type) -> None:
    """The fitted arrays agree with each other, the schema and the family, or a PersistError."""
    from pipeline.families import ProductFamily
    from pipeline.families.schema import Schema

    fitted = rec["fitted"]
    schema = rec["schema"]
    family = rec["family"]
    if not isinstance(schema, Schema):
        raise _fail(json_path, "'schema' is not a column schema")
    n_cols = len(schema.features)
    if family is not None:
        if not isinstance(family, ProductFamily):
            raise _fail(json_path, "'family' is not a ProductFamily")
        if family.n_cols != n_cols:
            raise _fail(
                json_path, f"the family models {family.n_cols} columns but the schema has {n_cols}"
            )
    need = [a for a in cls._model_attrs if a not in fitted]  # type: ignore[attr-defined]
    if need:
        raise _fail(json_path, f"the fitted attributes {need} are missing")
    raw = fitted["n_clusters_"]
    if isinstance(raw, bool) or not isinstance(raw, (int, np.integer)) or raw < 0:
        raise _fail(json_path, f"n_clusters_ is {raw!r}, not a number of clusters")
    K = int(raw)

    def expect(name: str, shape: tuple[int, ...], value: Any = None) -> None:
        v = fitted[name] if value is None else value
        got = _shape(v)
        if got != shape:
            raise _fail(
                json_path,
                f"array {name} has shape {got}, but the model's other entries make it {shape}",
            )

    if "cluster_stats_" in fitted:
        assert family is not None
        expect("cluster_stats_", (K, family.n_stats))
        expect("cluster_sizes_", (K,))
        alpha = fitted.get("alpha_")
        if not isinstance(alpha, float) or not np.isfinite(alpha) or alpha <= 0:
            raise _fail(json_path, f"alpha_ is {alpha!r}, not a positive concentration")
        if not np.array_equal(
            np.rint(fitted["cluster_stats_"][:, :1]).ravel(), fitted["cluster_sizes_"]
        ):
            raise _fail(json_path, "cluster_sizes_ disagree with the counts of cluster_stats_")
    if "state_" in fitted:
        # an infinite HMM's MAP state (``pipeline.models.ihmm.HmmState``)
        from pipeline.models.ihmm import HmmState

        st = fitted["state_"]
        if not isinstance(st, HmmState):
            raise _fail(json_path, "state_ is not an HmmState")
        assert family is not None
        expect("state_ stats", (K, family.n_stats), st.stats)
        expect("state_ trans", (K, K), st.trans)
        expect("state_ start", (K,), st.start)
        expect("state_ kappa", (K,), st.kappa)
        if not np.array_equal(st.stats, fitted["cluster_stats_"]):
            raise _fail(json_path, "state_ disagrees with cluster_stats_")
    if "model_" in fitted:
        _check_mixed(json_path, fitted, K, n_cols + bool(rec["params"].get("fit_intercept", True)))
    if "cluster_centers_" in fitted:
        expect("cluster_centers_", (K, n_cols))
    if _TREE in fitted:
        assert family is not None
        tree = fitted[_TREE]
        if not isinstance(tree, dict) or not {"fields", "columns", "stats"} <= set(tree):
            raise _fail(json_path, "tree_ needs 'fields', 'columns' and 'stats'")
        stats = tree["stats"]
        n_nodes = stats.shape[0] if isinstance(stats, np.ndarray) and stats.ndim == 2 else -1
        expect("tree_ stats", (n_nodes, family.n_stats), stats)
        if list(tree["columns"]) != list(tree["fields"]):
            raise _fail(json_path, "tree_ columns differ from its fields")
        for f, col in tree["columns"].items():
            expect(f"tree_ column {f}", (n_nodes,), col)
        expect("cluster_nodes_", (K,))
        nodes = fitted["cluster_nodes_"]
        if K and (nodes.min() < 0 or nodes.max() >= n_nodes):
            raise _fail(json_path, "cluster_nodes_ name nodes the tree does not have")


def _check_mixed(json_path: storage.Loc, fitted: dict[str, Any], K: int, p: int) -> None:
    """A ``MixedEffectsDP``'s global fit: K clusters of p coefficients, positive tau and alpha."""
    from pipeline.models.mixed_effects import MixedModel, MixedPrior

    model, prior = fitted["model_"], fitted["prior_"]
    if not isinstance(model, MixedModel) or not isinstance(prior, MixedPrior):
        raise _fail(json_path, "model_ / prior_ are not a MixedModel and a MixedPrior")
    for name, shape in (
        ("n", (K,)),
        ("s", (K, p)),
        ("ss", (K, p, p)),
        ("mu", (K, p)),
        ("R", (K, p, p)),
        ("logdet_R", (K,)),
        ("log_nw", (K,)),
    ):
        got = _shape(getattr(model, name))
        if got != shape:
            raise _fail(
                json_path,
                f"array model_ {name} has shape {got}, but the model's other entries make it "
                f"{shape}",
            )
    if _shape(prior.m0) != (p,) or _shape(prior.T0) != (p, p):
        raise _fail(json_path, f"prior_ is not a prior of {p} coefficients")
    for name in ("tau", "alpha"):
        v = getattr(model, name)
        if not isinstance(v, float) or not np.isfinite(v) or v <= 0:
            raise _fail(json_path, f"model_ {name} is {v!r}, not a positive number")


def _tree_of(json_path: storage.Loc, node: dict[str, Any]) -> Any:
    from pipeline.models.tree import Tree

    cols = node["columns"]
    dtype = np.dtype([(f, cols[f].dtype) for f in node["fields"]])
    table = np.empty(node["stats"].shape[0], dtype=dtype)
    for f in node["fields"]:
        table[f] = cols[f]
    try:
        return Tree(table, np.ascontiguousarray(node["stats"]))
    except ValueError as err:
        raise _fail(json_path, f"tree_: {err}") from err


def load_model(path: str | os.PathLike[str], expect: type | None = None) -> Any:
    """The fitted estimator saved in the model directory ``path``; ``predict`` and
    ``score_samples`` give what the saved one gave.

    Parameters
    ----------
    path : path
        A directory written by ``save_model`` (or a run's ``OUT/model``).
    expect : type, optional
        The estimator must be an instance of it.

    Raises
    ------
    PersistError
        Naming the file, for anything missing, changed, inconsistent or not allowed.
    """
    d = storage.location(path)
    json_path = d / f"{RECORD}.json"
    # on object storage a model counts only once a manifest lists it (``outputs.commit``)
    outputs.require_visible(d, "model")
    if not d.is_dir():
        raise PersistError(f"{d}: no such model directory")
    estimators = _estimators()
    rec = persist.load(d, RECORD)
    if type(rec) is not dict or rec.get("format") != MODEL_FORMAT:
        raise _fail(json_path, f"not a dpmm-pipeline model (no {MODEL_FORMAT!r} header)")
    version = rec.get("model_version")
    if version != MODEL_VERSION:
        raise _fail(
            json_path,
            f"a model of format version {version!r}; this dpmm-pipeline reads version "
            f"{MODEL_VERSION}",
        )
    name = rec.get("estimator")
    if name not in estimators:
        raise _fail(json_path, f"estimator {name!r} is not one of {sorted(estimators)}")
    for key in ("params", "fitted", "metadata"):
        if type(rec.get(key)) is not dict:
            raise _fail(json_path, f"{key!r} is not a dict")
    cls = estimators[name]
    _check_fitted(json_path, rec, cls)
    try:
        est = cls(**rec["params"])
    except TypeError as err:
        raise _fail(json_path, f"the stored parameters do not fit {name}: {err}") from err
    fitted = dict(rec["fitted"])
    if _TREE in fitted:
        fitted[_TREE] = _tree_of(json_path, fitted[_TREE])
    schema = rec["schema"]
    family = rec["family"]
    # everything is checked: only now is the estimator given its state, all at once
    est.schema_ = schema
    est.n_features_in_ = len(schema.columns)
    if schema.from_frame:
        est.feature_names_in_ = np.asarray(schema.columns, dtype=object)
    if family is not None:
        est.family_ = family
    for a, v in fitted.items():
        setattr(est, a, v)
    if family is not None and "cluster_stats_" in fitted:
        est._cache = family.cache_of(fitted["cluster_stats_"])
        est._empty_cache = family.empty_cache()
    if hasattr(est, "_after_load"):
        est._after_load()  # attributes derived from the stored ones
    est.engine_ = rec["engine"]
    est.model_metadata_ = rec["metadata"]
    if expect is not None and not isinstance(est, expect):
        raise _fail(json_path, f"holds a {name}, not a {expect.__name__}")
    return est


#: ``MAPDP``'s constructor parameters at their defaults, for ``run_model_record``, which does not
#: import the class (``tests/pipeline/estimators/test_model.py`` checks them against it)
MAPDP_DEFAULTS: dict[str, Any] = {
    "alpha": "learn",
    "alpha_prior": config.ALPHA_PRIOR,
    "device": "cpu",
    "family": "auto",
    "init": "sequential",
    "max_iter": 100,
    "missing": "latent",
    "n_restarts": "auto",
    "prior_scale": None,
    "random_state": None,
    "strict": False,
    "tol": 1e-6,
    "tune": None,
    "verbose": 0,
}


def run_model_record(
    schema: Any,
    family: Any,
    stats: np.ndarray,
    alpha: float,
    params: dict[str, Any],
    *,
    engine: str,
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """The record (``model_record``) of the ``MAPDP`` of a distributed run's final clusters:
    statistics ``stats`` (K, S) of ``family``, concentration ``alpha``, constructor parameters
    ``params`` (the others at their defaults). Its ``predict`` / ``score_samples`` are the
    run's write-out (eq. 3.5 and eq. 3.4 under these clusters).

    Built without the estimator, whose class imports scikit-learn and SciPy's stats: about
    0.7 s of CPU that a run would spend on cores its workers need, for a record whose content
    is known. ``load_model`` makes the estimator of it.
    """
    stats = np.ascontiguousarray(stats, dtype=np.float64)
    fitted = {
        "n_clusters_": int(stats.shape[0]),
        "cluster_stats_": stats,
        "cluster_sizes_": np.rint(stats[:, 0]).astype(np.int64),
        "alpha_": float(alpha),
    }
    return _record(
        "MAPDP", engine, {**MAPDP_DEFAULTS, **params}, schema, family, alpha, fitted, metadata
    )
