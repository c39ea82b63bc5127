"""Model artifacts (``pipeline.estimators.model``): every estimator with clusters saved and loaded
back
predicts and scores exactly as before; damaged or foreign models are refused naming the file."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings

import pipeline
from pipeline.core.persist import PersistError
from pipeline.estimators.baselines import CollapsedGibbs, DPMeans, UncollapsedGibbs
from pipeline.estimators.bhc import BHC
from pipeline.estimators.mapdp import MAPDP
from pipeline.estimators.model import MODEL_VERSION, load_model, save_model
from pipeline.estimators.tgmcmc import TreeGuidedMCMC
from pipeline.families import GaussianNW
from tests.conftest import kernel_signatures


def make(name: str, frame: bool) -> Any:
    fam = {"family": "auto"} if frame else {}
    return {
        "MAPDP": lambda: MAPDP(n_restarts=1, random_state=0, **fam),
        "CollapsedGibbs": lambda: CollapsedGibbs(n_iter=15, burn_in=5, random_state=0, **fam),
        "UncollapsedGibbs": lambda: UncollapsedGibbs(n_iter=15, burn_in=5, random_state=0, **fam),
        "DPMeans": lambda: DPMeans(n_clusters=3),
        "BHC": lambda: BHC(**fam),
        "TreeGuidedMCMC": lambda: TreeGuidedMCMC(n_iter=8, burn_in=2, G=2, random_state=0, **fam),
    }[name]()


NAMES = ["MAPDP", "CollapsedGibbs", "UncollapsedGibbs", "DPMeans", "BHC", "TreeGuidedMCMC"]


def blobs(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    return centres[rng.integers(3, size=n)] + rng.normal(size=(n, 2))


def frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    y = rng.integers(2, size=n)
    return pd.DataFrame(
        {
            "height": np.where(y == 0, 160.0, 185.0) + rng.normal(scale=4.0, size=n),
            "smoker": np.where(y == 0, rng.random(n) < 0.2, rng.random(n) < 0.8),
            "colour": pd.Categorical(
                np.where(y == 0, rng.choice(["red", "blue"], n), rng.choice(["green", "blue"], n)),
                categories=["blue", "green", "red"],
            ),
            "city": np.where(
                y == 0, rng.choice(["Oslo", "Rome"], n), rng.choice(["Rome", "Kyiv"], n)
            ),
        }
    )


@pytest.mark.parametrize("kind", ["numpy", "frame", "integer"])
@pytest.mark.parametrize("name", NAMES)
def test_round_trip_is_exact(name: str, kind: str, tmp_path: Path) -> None:
    is_frame = kind == "frame"
    X, Xnew = (frame(80, 0), frame(40, 1)) if is_frame else (blobs(60, 0), blobs(30, 1))
    if kind == "integer":
        # values on a grid: the Gaussian prior carries its recording step (Sheppard's correction)
        X, Xnew = np.round(2.0 * X), np.round(2.0 * Xnew)
    if is_frame and name == "DPMeans":
        # DP-means has no family: numeric columns only
        X, Xnew = X[["height", "smoker"]], Xnew[["height", "smoker"]]
    est = make(name, is_frame).fit(X)
    assert est.save(tmp_path / "m") == tmp_path / "m"
    loaded = pipeline.load_model(tmp_path / "m")
    assert type(loaded) is type(est)
    assert loaded.get_params() == est.get_params()
    np.testing.assert_array_equal(loaded.predict(Xnew), est.predict(Xnew))
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    if name != "DPMeans":
        np.testing.assert_array_equal(loaded.score_samples(Xnew), est.score_samples(Xnew))
        assert loaded.score(X) == est.score(X)
    assert loaded.n_clusters_ == est.n_clusters_
    assert loaded.engine_ == name.lower()
    if kind == "integer" and name != "DPMeans":
        gauss = loaded.family_.groups[0][0]
        np.testing.assert_array_equal(gauss.step, [1.0, 1.0])
        np.testing.assert_array_equal(gauss.prior_array(), est.family_.groups[0][0].prior_array())
    if is_frame and name != "DPMeans":
        assert list(loaded.feature_names_in_) == list(X.columns)
        # the encoders came back: an unseen category is refused as by the original
        bad = Xnew.copy()
        bad["city"] = bad["city"].astype(object)
        bad.loc[3, "city"] = "Paris"
        with pytest.raises(ValueError, match="column 'city': row 3 has category 'Paris'"):
            loaded.predict(bad)
    # the model is JSON plus numbers: no pickle anywhere
    files = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert files == ["model.json", "model.npz"]
    with np.load(tmp_path / "m" / "model.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


def test_given_prior_and_metadata_round_trip(tmp_path: Path) -> None:
    X = blobs(50, 2)
    fam = GaussianNW.empirical_bayes(X)
    est = MAPDP(family=fam, alpha=2.0, n_restarts=1, random_state=np.random.default_rng(0)).fit(X)
    save_model(est, tmp_path / "m", engine="mapdp", metadata={"input": "x.parquet", "passes": 3})
    loaded = load_model(tmp_path / "m", expect=MAPDP)
    assert loaded.model_metadata_ == {"input": "x.parquet", "passes": 3}
    # a Generator seed is state, not a seed: stored as None
    assert loaded.random_state is None
    assert repr(loaded.family) == repr(fam)
    np.testing.assert_array_equal(loaded.score_samples(X), est.score_samples(X))
    assert loaded.objective_history_ == est.objective_history_
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    root = doc["root"]["items"]
    assert root["format"] == "dpmm-pipeline model"
    assert root["model_version"] == MODEL_VERSION
    assert set(root["versions"]["items"]) >= {"python", "numpy", "dpmm-pipeline"}


def test_save_refuses_unfitted_and_existing(tmp_path: Path) -> None:
    with pytest.raises(PersistError, match="not fitted"):
        MAPDP().save(tmp_path / "m")
    assert not (tmp_path / "m").exists()
    est = MAPDP(n_restarts=1, random_state=0).fit(blobs(40, 3))
    est.save(tmp_path / "m")
    with pytest.raises(FileExistsError, match="already exists"):
        est.save(tmp_path / "m")
    est2 = MAPDP(alpha=5.0, n_restarts=1, random_state=0).fit(blobs(40, 4))
    est2.save(tmp_path / "m", overwrite=True)
    assert load_model(tmp_path / "m").alpha == 5.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    with pytest.raises(PersistError, match="holds a MAPDP, not a BHC"):
        load_model(tmp_path / "m", expect=BHC)


# -- damaged and foreign models ------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    MAPDP(n_restarts=1, random_state=0).fit(blobs(60, 5)).save(tmp_path / "m")
    return tmp_path / "m"


def _rewrite(d: Path, edit_doc: Any = None, edit_arrays: Any = None) -> None:
    """Change the record as a writer would (keeping the npz's SHA-256 in the JSON right)."""
    doc = json.loads((d / "model.json").read_text())
    with np.load(d / "model.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    if edit_arrays is not None:
        edit_arrays(doc, arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    (d / "model.npz").write_bytes(data)
    doc["arrays"]["sha256"] = hashlib.sha256(data).hexdigest()
    if edit_doc is not None:
        edit_doc(doc)
    (d / "model.json").write_text(json.dumps(doc))


def _fitted(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["root"]["items"]["fitted"]["items"]  # type: ignore[no-any-return]


def _refused(d: Path, match: str, file: str = "model.json") -> None:
    with pytest.raises(PersistError, match=match) as err:
        load_model(d)
    assert str(d / file) in str(err.value)


def test_other_model_version_is_refused(saved: Path) -> None:
    _rewrite(saved, lambda doc: doc["root"]["items"].update(model_version=MODEL_VERSION + 1))
    _refused(saved, f"format version {MODEL_VERSION + 1}; this dpmm-pipeline reads version")


def test_other_record_version_is_refused(saved: Path) -> None:
    _rewrite(saved, lambda doc: doc.update(format_version=99))
    _refused(saved, "written by format version 99")


def test_json_that_does_not_parse_is_refused(saved: Path) -> None:
    text = (saved / "model.json").read_text()
    (saved / "model.json").write_text(text[: len(text) // 2])
    _refused(saved, "not valid JSON")


def test_missing_array_is_refused(saved: Path) -> None:
    def drop(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        del arrays[_fitted(doc)["cluster_stats_"]["key"]]

    _rewrite(saved, edit_arrays=drop)
    _refused(saved, "no array", file="model.npz")


def test_missing_arrays_file_is_refused(saved: Path) -> None:
    (saved / "model.npz").unlink()
    _refused(saved, "no such file", file="model.npz")


def test_array_shape_disagreeing_with_json_is_refused(saved: Path) -> None:
    def grow(doc: dict[str, Any]) -> None:
        node = _fitted(doc)["cluster_stats_"]
        node["shape"] = [node["shape"][0] + 1, node["shape"][1]]

    _rewrite(saved, grow)
    _refused(saved, "records dtype .* and shape", file="model.npz")


def test_arrays_disagreeing_with_each_other_are_refused(saved: Path) -> None:
    def drop_row(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        node = _fitted(doc)["cluster_stats_"]
        arrays[node["key"]] = arrays[node["key"]][1:]
        node["shape"] = list(arrays[node["key"]].shape)

    _rewrite(saved, edit_arrays=drop_row)
    _refused(saved, "array cluster_stats_ has shape")


def test_changed_arrays_file_is_refused(saved: Path) -> None:
    data = bytearray((saved / "model.npz").read_bytes())
    data[-10] ^= 0xFF
    (saved / "model.npz").write_bytes(bytes(data))
    _refused(saved, "SHA-256 differs", file="model.npz")


def test_unknown_estimator_and_missing_directory_are_refused(saved: Path, tmp_path: Path) -> None:
    _rewrite(saved, lambda doc: doc["root"]["items"].update(estimator="os.system"))
    _refused(saved, "estimator 'os.system' is not one of")
    with pytest.raises(PersistError, match="no such model directory"):
        load_model(tmp_path / "nothing")


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(min_value=8, max_value=40),
    seed=st.integers(min_value=0, max_value=2**16),
    alpha=st.one_of(st.just("learn"), st.floats(min_value=0.05, max_value=20.0)),
    levels=st.integers(min_value=2, max_value=4),
)
def test_round_trip_property(n: int, seed: int, alpha: Any, levels: int) -> None:
    """Any MAPDP fit on a numeric column and a categorical one: the loaded model's predict and
    score_samples equal the original's on fresh records of the same columns."""
    import tempfile

    rng = np.random.default_rng(seed)
    cats = [f"c{i}" for i in range(levels)]

    def records(m: int) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "x": rng.normal(size=m) * 3.0,
                # every level in the first rows, so that the fit saw all of them
                "k": pd.Categorical([cats[i % levels] for i in range(m)], categories=cats),
            }
        )

    X = records(n)
    est = MAPDP(alpha=alpha, n_restarts=1, random_state=seed).fit(X)
    with tempfile.TemporaryDirectory() as d:
        est.save(Path(d) / "m")
        loaded = load_model(Path(d) / "m")
    Xnew = records(25)
    np.testing.assert_array_equal(loaded.predict(Xnew), est.predict(Xnew))
    np.testing.assert_array_equal(loaded.score_samples(Xnew), est.score_samples(Xnew))


def test_a_fresh_process_loads_models_holding_registered_classes(tmp_path: Path) -> None:
    """An HMM's state and a mixed model's parameters are classes registered by their modules:
    ``load_model`` in a new interpreter (as ``dpmm score`` / ``dpmm update`` start) imports the
    named estimator's module first, so the record reads back and predicts as saved."""
    import subprocess
    import sys

    from pipeline.data.synthetic import sample_longitudinal
    from pipeline.estimators.ihmm import MAPiHMM
    from pipeline.estimators.mixed_effects import MixedEffectsDP

    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(0, 1, (60, 2)), rng.normal(5, 1, (60, 2))])
    hmm = MAPiHMM(random_state=0).fit(X, lengths=[40, 40, 40])
    df = sample_longitudinal(80, seed=1)
    covs = ["wave", "depression", "adl"]
    mixed = MixedEffectsDP(random_state=0).fit(df[covs], df["qol"], df["subject"])
    hmm.save(tmp_path / "hmm")
    mixed.save(tmp_path / "mixed")
    code = (
        "import sys\n"
        "from pipeline.estimators.model import load_model\n"
        "for p in sys.argv[1:]:\n"
        "    m = load_model(p)\n"
        "    print(type(m).__name__, m.n_clusters_)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "hmm"), str(tmp_path / "mixed")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == [
        f"MAPiHMM {hmm.n_clusters_}",
        f"MixedEffectsDP {mixed.n_clusters_}",
    ]


def test_a_runs_record_is_the_record_of_its_estimator(tmp_path: Path) -> None:
    """``run_model_record`` (a distributed run's model, built without importing ``MAPDP``) is
    ``model_record`` of the ``MAPDP`` holding the run's clusters, and loads as one that predicts
    like the estimator the clusters came from."""
    from pipeline.estimators.model import (
        MAPDP_DEFAULTS,
        model_record,
        run_model_record,
        write_record,
    )

    assert MAPDP().get_params() == MAPDP_DEFAULTS
    rng = np.random.default_rng(3)
    X = pd.DataFrame(
        rng.normal(size=(300, 3)) + 6 * rng.integers(0, 3, (300, 1)), columns=list("abc")
    )
    fit = MAPDP(random_state=0).fit(X)
    params = {"alpha": 2.0, "family": "gaussian", "alpha_prior": (2.0, 1.0), "tol": 1e-5}
    est = MAPDP(**params)
    for a in ("schema_", "family_", "n_features_in_", "feature_names_in_", *MAPDP._model_attrs):
        setattr(est, a, getattr(fit, a))
    meta = {"input": "x.parquet", "passes": 2}
    want = model_record(est, engine="mapdp", metadata=meta)
    got = run_model_record(
        fit.schema_,
        fit.family_,
        fit.cluster_stats_,
        fit.alpha_,
        params,
        engine="mapdp",
        metadata=meta,
    )
    assert got.keys() == want.keys()
    for key in want:
        if key == "fitted":
            assert got[key].keys() == want[key].keys()
            for a, v in want[key].items():
                np.testing.assert_array_equal(got[key][a], v)
                assert type(got[key][a]) is type(v)
        elif key not in ("schema", "family"):
            assert got[key] == want[key], key
    assert got["schema"] is want["schema"] and got["family"] is want["family"]
    (tmp_path / "m").mkdir()
    write_record(tmp_path / "m", got)
    loaded = load_model(tmp_path / "m")
    assert isinstance(loaded, MAPDP) and loaded.get_params() == {**MAPDP_DEFAULTS, **params}
    np.testing.assert_array_equal(loaded.predict(X), fit.predict(X))
    np.testing.assert_array_equal(loaded.score_samples(X), fit.score_samples(X))


def _fitted_and_inputs(name: str) -> tuple[Any, tuple[Any, ...]]:
    """A small fitted estimator of ``name`` and the arguments its ``predict`` takes."""
    from pipeline.data.synthetic import sample_longitudinal
    from pipeline.estimators.ihmm import MAPiHMM
    from pipeline.estimators.mixed_effects import MixedEffectsDP

    if name == "MixedEffectsDP":
        df = sample_longitudinal(60, seed=1)
        args = (df[["wave", "depression", "adl"]], df["qol"], df["subject"])
        return MixedEffectsDP(random_state=0).fit(*args), args
    if name == "MAPiHMM":
        X = np.concatenate([blobs(60, 0), blobs(60, 1) + 5.0])
        return MAPiHMM(random_state=0).fit(X, lengths=[40, 40, 40]), (X,)
    X = blobs(60, 0)
    return make(name, False).fit(X), (X,)


@pytest.mark.parametrize("name", [*NAMES, "MAPiHMM", "MixedEffectsDP"])
def test_a_model_unpickled_from_read_only_memory_maps_predicts_without_new_kernels(
    name: str, tmp_path: Path
) -> None:
    """``joblib.load(path, mmap_mode="r")`` hands the model read-only arrays, for which numba
    compiles a kernel's read-only specialization (7 to 12 s each); unpickling copies them
    writable, so the loaded model's predict runs the very signatures the fit's predict ran
    (none compiled, none loaded from the cache) and gives the same output."""
    import joblib

    est, args = _fitted_and_inputs(name)
    scores = hasattr(est, "score_samples")
    expected = (est.predict(*args), est.score_samples(*args) if scores else None)
    before = kernel_signatures()
    joblib.dump(est, tmp_path / "m.joblib")
    loaded = joblib.load(tmp_path / "m.joblib", mmap_mode="r")
    got = (loaded.predict(*args), loaded.score_samples(*args) if scores else None)
    assert kernel_signatures() - before == set()
    np.testing.assert_array_equal(got[0], expected[0])
    if scores:
        np.testing.assert_allclose(got[1], expected[1], rtol=1e-12)
