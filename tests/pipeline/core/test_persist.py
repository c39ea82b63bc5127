"""``pipeline.core.persist``: records as JSON plus arrays, read back without unpickling.

Round trips of a real ``StoreInfo`` (after a real ingest on a LocalCluster) and of every family;
damaged and crafted files refused with the file's name, and no code run; a property test of
nested storable values."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings

from pipeline.core import persist
from pipeline.core.config import FitParams
from pipeline.core.persist import FORMAT_VERSION, PersistError
from pipeline.data.ingest import ingest
from pipeline.data.store import Moments, Store, StoreInfo
from pipeline.families import (
    Bernoulli,
    Binomial,
    Categorical,
    Exponential,
    Family,
    GaussianNW,
    Geometric,
    NormalGamma,
    Poisson,
    ProductFamily,
)
from pipeline.families.schema import Schema

# -- comparing loaded objects -------------------------------------------------------------------


def assert_same(a: Any, b: Any, where: str = "obj") -> None:
    """Exact equality of two stored values: same types all the way down, arrays bit for bit,
    NaN equal to NaN, -0.0 distinct from 0.0; families and product families by their
    constructor parameters and the kernels' arrays."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    elif type(a) is float:
        if math.isnan(a):
            assert math.isnan(b), where
        else:
            assert a == b and math.copysign(1.0, a) == math.copysign(1.0, b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, ProductFamily):
        assert_same(a.to_state(), b.to_state(), f"{where}.groups")
        for attr in ("spec", "prior", "column_order"):
            assert_same(getattr(a, attr), getattr(b, attr), f"{where}.{attr}")
        assert (a.n_cols, a.n_stats, a.n_cache) == (b.n_cols, b.n_stats, b.n_cache), where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# -- a real StoreInfo ------------------------------------------------------------------------


def mixed_frame(n: int = 600, seed: int = 0) -> pd.DataFrame:
    """Every kind of column ``family="auto"`` maps, plus a Poisson count and a label column."""
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 3, size=n)
    return pd.DataFrame(
        {
            "x": rng.normal(size=n) + 5.0 * z,
            "y": rng.normal(size=n) - 3.0 * z,
            "colour": np.array(["red", "green", "blue"])[z],
            "score": rng.integers(1, 6, size=n),
            "flag": rng.random(n) < 0.3 + 0.2 * z,
            "day": pd.to_datetime("2024-03-01") + pd.to_timedelta(rng.integers(0, 4, n), "D"),
            "shape": pd.Categorical(np.array(["round", "flat"])[rng.integers(0, 2, n)]),
            "visits": rng.poisson(1.0 + 2.0 * z),
            "truth": z,
        }
    )


def test_store_info_round_trips_after_a_real_ingest(client, tmp_path: Path):
    df = mixed_frame()
    store = Store(tmp_path / "store.zarr")
    info = ingest(
        df,
        store,
        client=client,
        family={"visits": "poisson"},
        chunk_rows=128,
        holdout=0.2,
        prior_sample=200,
        label_column="truth",
    )
    # the prior's sample is smaller than the training rows, so notes are not empty
    assert info.notes
    kinds = set(info.schema.kinds.values())
    assert {"gaussian", "categorical", "bernoulli", "poisson"} <= kinds
    assert sorted(p.name for p in store.path.iterdir() if p.is_file()) == [
        "format.json",
        "info.json",
        "info.npz",
        "zarr.json",
    ]
    doc = json.loads((store.path / "info.json").read_text())
    assert doc["format_version"] == FORMAT_VERSION

    loaded = Store(store.path).info
    assert_same(info, loaded, "info")
    # the category values keep their types: numpy ints, str, numpy datetimes
    assert type(loaded.schema.categories["score"][0]) is np.int64
    assert type(loaded.schema.categories["colour"][0]) is str
    assert type(loaded.schema.categories["day"][0]) is np.datetime64
    # the loaded family is the same model: the kernels' arrays and the log marginals
    np.testing.assert_array_equal(loaded.family.spec, info.family.spec)
    np.testing.assert_array_equal(loaded.family.prior, info.family.prior)
    np.testing.assert_array_equal(loaded.family.column_order, info.family.column_order)
    Xe = info.schema.encode(df.drop(columns=["truth"]), fitting=False)
    assert loaded.family.log_marginal(Xe) == info.family.log_marginal(Xe)
    assert loaded.family.log_predictive(Xe[0], Xe[1:50]) == info.family.log_predictive(
        Xe[0], Xe[1:50]
    )
    # and the schema encodes as it did
    np.testing.assert_array_equal(loaded.schema.encode(df.drop(columns=["truth"]), False), Xe)


# -- every family ------------------------------------------------------------------------------

FAMILIES: list[tuple[Family, np.ndarray]] = [
    (
        GaussianNW(m0=[0.5, -1.0], c0=0.3, B0=[[2.0, 0.3], [0.3, 1.0]], a0=3.5),
        np.random.default_rng(1).normal(size=(20, 2)),
    ),
    (
        NormalGamma(m0=[1.0, 2.0], c0=[0.5, 1.0], a0=[2.0, 3.0], b0=[1.0, 4.0]),
        np.random.default_rng(2).normal(size=(20, 2)),
    ),
    (Categorical(alpha=[0.2, 0.3, 0.5]), np.array([[0.0], [2.0], [2.0], [1.0]])),
    (Poisson(a=[1.5, 2.0], b=[1.0, 0.5]), np.array([[0.0, 3.0], [2.0, 1.0], [5.0, 0.0]])),
    (
        Binomial(n_trials=[3, 5], a=[1.0, 2.0], b=[2.0, 1.0]),
        np.array([[0.0, 5.0], [3.0, 2.0], [1.0, 1.0]]),
    ),
    (Bernoulli(a=[0.4, 0.7], b=[0.6, 0.3]), np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])),
    (Exponential(a=[1.0, 2.0], b=[0.5, 3.0]), np.array([[0.1, 2.0], [3.5, 0.0], [1.0, 1.0]])),
    (Geometric(a=[1.0, 1.0], b=[2.0, 0.5]), np.array([[0.0, 4.0], [2.0, 1.0], [7.0, 0.0]])),
]


@pytest.mark.parametrize("fam, X", FAMILIES, ids=[type(f).__name__ for f, _ in FAMILIES])
def test_every_family_round_trips(tmp_path: Path, fam: Family, X: np.ndarray):
    persist.save(tmp_path, "fam", fam)
    got = persist.load(tmp_path, "fam", type(fam))
    assert_same(fam, got, "fam")
    assert_same(fam.as_product(), got.as_product(), "product")
    assert got.log_marginal(X) == fam.log_marginal(X)
    assert got.log_predictive(X[0], X[1:]) == fam.log_predictive(X[0], X[1:])


def test_a_product_of_families_keeps_its_column_order(tmp_path: Path):
    rng = np.random.default_rng(3)
    prod = ProductFamily(
        [
            (FAMILIES[3][0], [4, 0]),
            (FAMILIES[0][0], [1, 5]),
            (FAMILIES[2][0], [2]),
            (FAMILIES[5][0], [3, 6]),
        ]
    )
    X = np.column_stack(
        [
            rng.poisson(2.0, 30),
            rng.normal(size=30),
            rng.integers(0, 3, 30),
            rng.integers(0, 2, 30),
            rng.poisson(1.0, 30),
            rng.normal(size=30),
            rng.integers(0, 2, 30),
        ]
    ).astype(float)
    persist.save(tmp_path, "prod", prod)
    got = persist.load(tmp_path, "prod", ProductFamily)
    assert_same(prod, got, "prod")
    assert got.log_marginal(X) == prod.log_marginal(X)


def test_fit_params_and_moments_round_trip(tmp_path: Path):
    obj = {
        "params": FitParams(alpha=2.5, alpha_prior=(3.0, 0.5), n_seeds=7, restart=2),
        "learned": FitParams(),
        "moments": Moments.of(np.random.default_rng(4).normal(size=(10, 3))),
        "empty": Moments.of(np.zeros((0, 2))),
    }
    persist.save(tmp_path, "rec", obj)
    got = persist.load(tmp_path, "rec", dict)
    assert_same(obj, got, "rec")
    assert got["params"] == obj["params"] and got["learned"] == obj["learned"]
    # an empty chunk's moments hold infinities
    assert np.all(got["empty"].lo == np.inf)


def test_a_checkpoint_round_trips(tmp_path: Path):
    """The pass loop's checkpoint: ``PassState`` with its history, start record and scored
    write-out results, next to the ``FitParams`` it was computed with."""
    from pipeline.data.labels import WriteResult
    from pipeline.distributed.loop import load_checkpoint, save_checkpoint
    from pipeline.engines.base import RunContext
    from pipeline.engines.mixture_state import PassState

    rng = np.random.default_rng(5)
    written = WriteResult(
        c=0,
        heldout_sum=-12.5,
        heldout_n=3,
        train_sum=-100.25,
        train_n=40,
        new_cluster=0,
        plot_X=rng.normal(size=(5, 2)),
        plot_labels=np.arange(5, dtype=np.int64),
        pairs=np.ones((3, 2), dtype=np.int64),
    )
    state = PassState(
        pass_no=3,
        stats=rng.normal(size=(4, 7)),
        alpha=np.float64(1.25).item(),
        remap=np.array([0, 1, -1, 2], dtype=np.int64),
        k_written=4,
        offsets=np.array([0, 4, 9], dtype=np.int64),
        history=[{"pass": 1, "objective": np.float64(-3.5), "stop": None, "alpha": math.nan}],
        converged=True,
        init_record={"pass": 0, "init": "sample", "seconds": 0.5},
        alpha_k=4,
        scored=[written, dataclasses.replace(written, c=1, pairs=None)],
        scored_into="labels.zarr",
    )
    params = FitParams(seed=9, init="sample")
    store = Store(tmp_path)
    info: Any = None  # the checkpoint does not depend on the data
    save_checkpoint(RunContext(store, store, info, params), state)
    got = load_checkpoint(RunContext(store, store, info, params))
    assert got is not None
    assert_same(state, got, "state")
    other = dataclasses.replace(params, seed=10)
    assert load_checkpoint(RunContext(store, store, info, other)) is None


# -- damaged and crafted files -------------------------------------------------------------------


MARKER_ENV = "DPMM_PERSIST_TEST_MARKER"


class Evil:
    """Unpickling this creates the marker file: proof that code ran."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (os.environ[MARKER_ENV], "w"))


@pytest.fixture
def record(tmp_path: Path) -> Path:
    """A saved record ``rec`` holding a product family, moments and plain values."""
    obj = {
        "family": ProductFamily([(FAMILIES[0][0], [0, 1]), (FAMILIES[2][0], [2])]),
        "moments": Moments.of(np.arange(12.0).reshape(4, 3)),
        "names": ["a", "b", "c"],
    }
    persist.save(tmp_path, "rec", obj)
    return tmp_path


def _doc(d: Path) -> dict[str, Any]:
    return json.loads((d / "rec.json").read_text())


def _write_doc(d: Path, doc: dict[str, Any]) -> None:
    (d / "rec.json").write_text(json.dumps(doc))


def _rewrite_npz(d: Path, data: bytes) -> None:
    """Replace the arrays file and record its SHA-256 in the JSON, as a careful forger would."""
    (d / "rec.npz").write_bytes(data)
    doc = _doc(d)
    doc["arrays"]["sha256"] = hashlib.sha256(data).hexdigest()
    _write_doc(d, doc)


def _npz(**arrays: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _arrays(d: Path) -> dict[str, np.ndarray]:
    with np.load(d / "rec.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _refused(d: Path, *needles: str, file: str = "rec.json") -> PersistError:
    with pytest.raises(PersistError) as info:
        persist.load(d, "rec")
    msg = str(info.value)
    assert str(d / file) in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return info.value


def test_the_record_loads_before_it_is_damaged(record: Path):
    got = persist.load(record, "rec", dict)
    assert got["names"] == ["a", "b", "c"]
    assert persist.exists(record, "rec")


def test_a_missing_record(tmp_path: Path):
    assert not persist.exists(tmp_path, "rec")
    _refused(tmp_path, "no such file")


@pytest.mark.parametrize("cut", [0.5, 0.0])
def test_truncated_json(record: Path, cut: float):
    text = (record / "rec.json").read_bytes()
    (record / "rec.json").write_bytes(text[: int(len(text) * cut)])
    _refused(record, "not valid JSON")


def test_invalid_json(record: Path):
    (record / "rec.json").write_text("{'format': 1,")
    _refused(record, "not valid JSON")


def test_json_that_is_not_a_record(record: Path):
    (record / "rec.json").write_text('{"hello": "world"}')
    _refused(record, "not a dpmm-pipeline record")


def test_another_format_version(record: Path):
    doc = _doc(record)
    doc["format_version"] = 2
    _write_doc(record, doc)
    _refused(record, "written by format version 2; this dpmm-pipeline reads version 1")


def test_a_missing_npz(record: Path):
    (record / "rec.npz").unlink()
    _refused(record, "no such file", file="rec.npz")


def test_an_npz_from_another_write(record: Path):
    arrays = _arrays(record)
    arrays["a0"] = arrays["a0"] + 1.0
    (record / "rec.npz").write_bytes(_npz(**arrays))
    _refused(record, "SHA-256", file="rec.npz")


def test_a_missing_array(record: Path):
    arrays = _arrays(record)
    del arrays["a1"]
    _rewrite_npz(record, _npz(**arrays))
    _refused(record, "no array 'a1'", str(record / "rec.json"), file="rec.npz")


def test_an_array_of_another_shape(record: Path):
    arrays = _arrays(record)
    arrays["a0"] = np.concatenate([arrays["a0"], [0.0]])
    _rewrite_npz(record, _npz(**arrays))
    _refused(record, "shape", "'a0'", file="rec.npz")


def test_an_array_of_another_dtype(record: Path):
    arrays = _arrays(record)
    arrays["a0"] = arrays["a0"].astype(np.float32)
    _rewrite_npz(record, _npz(**arrays))
    _refused(record, "dtype", "'a0'", file="rec.npz")


@pytest.mark.parametrize("name", ["os.system", "builtins.eval", "pipeline.data.store.Store"])
def test_a_type_not_on_the_allowlist(record: Path, name: str):
    doc = _doc(record)
    node = doc["root"]["items"]["moments"]
    assert node["class"] == "pipeline.data.store.Moments"
    node["class"] = name
    _write_doc(record, doc)
    _refused(record, repr(name), "allowlist")


def test_a_stored_object_its_constructor_refuses(record: Path):
    doc = _doc(record)
    gauss = doc["root"]["items"]["family"]["state"]["items"]["groups"]["items"][0]["items"][0]
    assert gauss["class"] == "pipeline.families.gaussian.GaussianNW"
    gauss["fields"]["c0"] = -1.0
    _write_doc(record, doc)
    _refused(record, "GaussianNW", "c0 must be > 0")


def test_unknown_and_missing_fields(record: Path):
    doc = _doc(record)
    fields = doc["root"]["items"]["moments"]["fields"]
    fields["extra"] = 1
    del fields["n"]
    _write_doc(record, doc)
    _refused(record, "unknown fields ['extra']", "missing fields ['n']")


def test_a_result_of_another_type(record: Path):
    with pytest.raises(PersistError, match=r"not a pipeline\.data\.store\.StoreInfo") as info:
        persist.load(record, "rec", StoreInfo)
    assert str(record / "rec.json") in str(info.value)


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "code-ran"
    monkeypatch.setenv(MARKER_ENV, str(path))
    # the payload works: unpickling it does create the marker
    pickle.loads(pickle.dumps(Evil()))
    assert path.exists()
    path.unlink()
    return path


def test_an_npz_holding_an_object_array_runs_no_code(record: Path, marker: Path):
    arrays = _arrays(record)
    arrays["a0"] = np.array([Evil(), 1.0], dtype=object)
    _rewrite_npz(record, _npz(**arrays))
    _refused(record, "'a0'", "unpickling", file="rec.npz")
    assert not marker.exists()


def test_an_npz_that_is_a_pickle_runs_no_code(record: Path, marker: Path):
    _rewrite_npz(record, pickle.dumps({"a0": Evil()}))
    _refused(record, "refused", file="rec.npz")
    assert not marker.exists()


def test_an_unchecked_crafted_npz_is_refused_by_its_digest(record: Path, marker: Path):
    (record / "rec.npz").write_bytes(pickle.dumps(Evil()))
    _refused(record, "SHA-256", file="rec.npz")
    assert not marker.exists()


# -- what save refuses -------------------------------------------------------------------------


@dataclasses.dataclass
class NotRegistered:
    x: int = 1


@pytest.mark.parametrize(
    "obj, where, problem",
    [
        ({"x": np.array([1, "a"], dtype=object)}, "rec['x']", "Python objects"),
        ([1, {2: "two"}], "rec[1]", "only str keys"),
        ({"p": NotRegistered()}, "rec['p']", "not registered"),
        ([pd.Timestamp("2024-01-01")], "rec[0]", "Timestamp is not a storable type"),
        ((1 + 2j,), "rec[0]", "complex is not a storable type"),
        ({"s": {1, 2}}, "rec['s']", "set is not a storable type"),
    ],
)
def test_save_refuses_what_it_cannot_read_back(tmp_path: Path, obj: Any, where: str, problem: str):
    with pytest.raises(PersistError) as info:
        persist.save(tmp_path, "rec", obj)
    msg = str(info.value)
    assert str(tmp_path / "rec.json") in msg and where in msg and problem in msg, msg
    assert list(tmp_path.iterdir()) == []


def test_a_refused_save_keeps_the_previous_record(record: Path):
    before = persist.load(record, "rec", dict)
    with pytest.raises(PersistError):
        persist.save(record, "rec", {"x": np.array([None], dtype=object)})
    assert_same(persist.load(record, "rec", dict), before)
    assert sorted(p.name for p in record.iterdir()) == ["rec.json", "rec.npz"]


def test_a_schema_with_timestamp_categories_is_refused_naming_the_column(tmp_path: Path):
    df = pd.DataFrame({"when": pd.Categorical(pd.to_datetime(["2024-01-01", "2024-01-02"]))})
    schema = Schema.infer(df, "auto", True)
    with pytest.raises(PersistError, match=r"rec\.categories\['when'\]\[0\]: a pandas"):
        persist.save(tmp_path, "rec", schema)


def test_a_list_that_contains_itself(tmp_path: Path):
    a: list[Any] = [1]
    a.append(a)
    with pytest.raises(PersistError, match="contains itself"):
        persist.save(tmp_path, "rec", a)


def test_too_deep_a_nesting_is_refused_both_ways(tmp_path: Path):
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(PersistError, match="nested too deeply"):
        persist.save(tmp_path, "rec", deep)
    persist.save(tmp_path, "rec", [])
    doc = json.loads((tmp_path / "rec.json").read_text())
    doc["root"] = "ROOT"
    root = '{"type": "list", "items": [' * 5000 + "1" + "]}" * 5000
    # the JSON parser may refuse the depth first; either way it is the file's problem
    (tmp_path / "rec.json").write_text(json.dumps(doc).replace('"ROOT"', root))
    with pytest.raises(PersistError, match=r"too deeply|not valid JSON") as info:
        persist.load(tmp_path, "rec")
    assert str(tmp_path / "rec.json") in str(info.value)


@pytest.mark.parametrize("name", ["info.pkl", "../x", "", ".hidden", "a/b"])
def test_record_names_have_no_extension_or_path(tmp_path: Path, name: str):
    with pytest.raises(ValueError, match="record name"):
        persist.save(tmp_path, name, 1)


def test_remove(record: Path):
    persist.remove(record, "rec")
    assert not persist.exists(record, "rec")
    assert list(record.iterdir()) == []
    persist.remove(record, "rec")


def test_no_pickle_in_the_store_or_persist():
    import pipeline.data.store

    for mod in (persist, pipeline.data.store):
        src = Path(str(mod.__file__)).read_text()
        assert "import pickle" not in src and "pickle." not in src, mod.__name__


# -- property: nested storable values round-trip exactly ------------------------------------

DTYPES = [
    "?",
    "i1",
    "<i8",
    ">i4",
    "u2",
    "<u8",
    "<f2",
    "<f4",
    "<f8",
    ">f8",
    "<c16",
    "<M8[ns]",
    "<m8[s]",
]
arrays = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(
        np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)
    )
)
numpy_scalars = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), ()).map(lambda a: a[()])
)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.builds(Path, st.text(alphabet="ab/._ ", max_size=10)),
    arrays,
    numpy_scalars,
)
PARAMS = FitParams(seed=3)
trees = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=6), inner, max_size=4),
        st.builds(lambda v: {"params": PARAMS, "v": v}, inner),
    ),
    max_leaves=25,
)


# in a whole-suite run Hypothesis once saw the global ``random`` state change during a draw of
# these strategies (which use no ``random``: something imported lazily in that first draw does)
# and reported it as flaky; the values drawn are not affected
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
@settings(max_examples=150, deadline=None)
@given(trees)
def test_nested_storable_values_round_trip_exactly(obj: Any):
    with tempfile.TemporaryDirectory() as d:
        persist.save(d, "rec", obj)
        assert_same(obj, persist.load(d, "rec"))
