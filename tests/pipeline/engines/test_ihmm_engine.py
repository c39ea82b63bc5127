"""The MAP-iHMM engine (``pipeline.engines.ihmm``) under the engine contract, on a grouped
dataset store whose groups are sequences, and its result against the in-memory estimator."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest
import zarr
from sklearn.metrics import normalized_mutual_info_score

from pipeline import MAPiHMM
from pipeline.data.ingest import ingest
from pipeline.data.store import Store, input_positions
from pipeline.distributed import loop
from pipeline.distributed.summaries import identity_stage2
from pipeline.distributed.writeout import write_out
from pipeline.engines import get_engine
from pipeline.engines.base import RunContext
from pipeline.engines.mixture_state import decode_labels
from pipeline.models.ihmm import ess_share, log_likelihood, starts_of
from tests.engine_contract import (
    EngineContract,
    assert_same_arrays,
    read_record_array,
    record_arrays,
)


def sequences_frame(
    n: int, seed: int, length: int = 40, phi: float = 0.0
) -> tuple[pd.DataFrame, np.ndarray]:
    """Sequences of a sticky 3-state HMM with 2-D Gaussian emissions, ``seq`` the id column;
    with ``phi`` > 0 the emission noise is AR(1) along each sequence (unit variance, lag-1
    autocorrelation phi), from the same draws."""
    rng = np.random.default_rng(seed)
    means = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
    n_seq = -(-n // length)
    z = np.empty(n_seq * length, dtype=np.int64)
    for s in range(n_seq):
        k = int(rng.integers(3))
        for t in range(length):
            if rng.random() < 0.08:
                k = int(rng.integers(3))
            z[s * length + t] = k
    z = z[:n]
    e = rng.normal(size=(n, 2))
    if phi > 0.0:
        for t in range(1, n):
            if t % length:
                e[t] = phi * e[t - 1] + np.sqrt(1.0 - phi * phi) * e[t]
    X = means[z] + e
    df = pd.DataFrame(X, columns=["a", "b"]).assign(seq=np.arange(n) // length)
    return df, z


class TestIhmmEngine(EngineContract):
    engine: ClassVar[str] = "ihmm"
    alpha: ClassVar[float | str] = 1.0
    #: AR(1) coefficient of the emission noise (``sequences_frame``)
    phi: ClassVar[float] = 0.0

    def context(
        self, client: Any, tmp: Path, name: str, n: int = 1200, chunk_rows: int = 300, **kw: Any
    ) -> RunContext:
        store = Store(tmp / f"{name}-data")
        df, _ = sequences_frame(n, seed=len(name), phi=self.phi)
        info = ingest(
            df, store, client=client, chunk_rows=chunk_rows, holdout=0.1, group_column="seq"
        )
        return loop.context(store, tmp / f"{name}-state", info, self.params(**kw))

    def test_the_write_out_scores_every_row(self, client, tmp_path: Path) -> None:
        """The contract's check on a grouped store, whose per-row arrays have padding rows at
        the ends of chunks: every input row (``input_positions``) is scored, and a sequence's
        rows sum to its held-out log likelihood by the forward algorithm."""
        ctx = self.context(client, tmp_path, "wo")
        engine = get_engine(ctx.params.engine)
        state: Any = loop.run_passes(client, ctx)
        mapping = identity_stage2(np.zeros((state.n_clusters, 1)), ctx.info.family)
        summary = write_out(client, ctx, engine, state, mapping, tmp_path / "labels.zarr")
        logd = zarr.open_array(str(tmp_path / "labels.zarr" / "log_density"))[:]
        pos = input_positions(ctx.data, ctx.info)
        assert logd.shape == (ctx.info.n_stored,) and np.isfinite(logd[pos]).all()
        assert summary.n_heldout == ctx.info.n_rows - ctx.info.n_train > 0
        # against the estimator's forward algorithm with the same states
        df, _ = sequences_frame(1200, seed=len("wo"), phi=self.phi)
        est = MAPiHMM(alpha=1.0).fit(df.iloc[:80], sequence_column="seq")
        st = state.hmm
        est.state_, est.alpha_, est.n_states_ = st, state.alpha, st.n_states
        # Viterbi under the run's tempered emissions; the log density under the untempered ones
        est.temper_ = state.temper
        est.family_ = ctx.info.family
        per_seq = pd.Series(logd[pos]).groupby(df.seq.to_numpy()).sum().to_numpy()
        X = ctx.info.family.arrange(df[["a", "b"]].to_numpy())
        ref = log_likelihood(X, starts_of(np.full(30, 40), 1200), st, ctx.info.family, state.alpha)
        np.testing.assert_allclose(per_seq, ref, rtol=1e-9)
        # every row, trained on or held out, is labelled by Viterbi under the final model:
        # the estimator's predict with the same states
        label = zarr.open_array(str(tmp_path / "labels.zarr" / "label"))[:][pos]
        hold = zarr.open_array(str(tmp_path / "labels.zarr" / "holdout"))[:][pos].astype(bool)
        assert (~hold).any() and hold.any()
        np.testing.assert_array_equal(label, est.predict(df, sequence_column="seq"))


def test_engine_recovers_states(client, tmp_path: Path) -> None:
    """Distributed passes over 4 chunks find the 3 states of the generating HMM."""
    df, z = sequences_frame(2000, seed=3)
    store = Store(tmp_path / "data")
    info = ingest(df, store, client=client, chunk_rows=500, holdout=0.0, group_column="seq")
    ctx = loop.context(store, tmp_path / "state", info, TestIhmmEngine().params(max_passes=20))
    state: Any = loop.run_passes(client, ctx)
    assert state.n_clusters == 3

    raw = read_record_array(ctx, "z", state)
    labels = np.full(raw.shape[0], -1, dtype=np.int64)
    for c in range(info.n_chunks):
        a, b = info.chunk_bounds(c)
        labels[a:b] = decode_labels(raw[a:b], state.remap, state.k_written, int(state.offsets[c]))
    pos = input_positions(store, info)
    assert normalized_mutual_info_score(z, labels[pos]) > 0.95


class TestIhmmEngineSampleStart(TestIhmmEngine):
    """The sample start (in-memory MAP-iHMM on the first sequences, whose own counts pass 1
    takes out again) under the same contract."""

    init: ClassVar[str] = "sample"


def test_sample_start_counts_only_the_data(client, tmp_path: Path) -> None:
    """After pass 1 of a sample start the statistics are the records' own: state sizes sum to
    the training rows, transition counts to the training transitions."""
    df, _z = sequences_frame(2000, seed=4)
    store = Store(tmp_path / "data")
    info = ingest(df, store, client=client, chunk_rows=500, holdout=0.0, group_column="seq")
    params = TestIhmmEngineSampleStart().params(max_passes=1, init_sample=400)
    ctx = loop.context(store, tmp_path / "state", info, params)
    state: Any = loop.run_passes(client, ctx)
    assert state.init_record["rows"] >= 400
    assert state.stats[:, 0].sum() == pytest.approx(info.n_train)
    n_seq = df.seq.nunique()
    assert state.start.sum() == pytest.approx(n_seq)
    assert state.trans.sum() == pytest.approx(info.n_train - n_seq)


class TestIhmmEngineTempered(TestIhmmEngineSampleStart):
    """The contract with the emissions tempered: sequences whose noise is autocorrelated within
    the states (phi = 0.8), so the sample start's ``temper="auto"`` measures rho and every pass
    and the write-out weigh the records by w < 1."""

    phi: ClassVar[float] = 0.8

    def test_the_sample_start_tempers(self, client, tmp_path: Path) -> None:
        ctx = self.context(client, tmp_path, "tempered", max_passes=2)
        state: Any = loop.run_passes(client, ctx)
        assert state.rho > 0.5 and state.temper == pytest.approx(ess_share(state.rho))
        assert state.init_record["temper"] == state.temper


def test_temper_auto_keeps_independent_sequences(client, tmp_path: Path) -> None:
    """Emissions independent given the state: the sample start measures an insignificant rho,
    and the run is the untempered one (``temper`` 1), exactly."""
    df, _z = sequences_frame(1200, seed=6)
    store = Store(tmp_path / "data")
    info = ingest(df, store, client=client, chunk_rows=300, holdout=0.0, group_column="seq")
    params = TestIhmmEngineSampleStart().params(init_sample=400)
    runs = []
    for temper in ("auto", 1.0):
        ctx = loop.context(store, tmp_path / f"state-{temper}", info, params)
        ctx.options["temper"] = temper
        runs.append((ctx, loop.run_passes(client, ctx)))
    (ctx_auto, auto), (ctx_plain, plain) = runs
    assert auto.temper == plain.temper == 1.0
    n_pairs = auto.init_record["rows"] - auto.init_record["sequences"]
    assert abs(auto.rho) < 2 / np.sqrt(n_pairs) and plain.rho is None
    assert auto.objective == plain.objective
    np.testing.assert_array_equal(auto.stats, plain.stats)
    assert_same_arrays(record_arrays(ctx_auto, auto), record_arrays(ctx_plain, plain))
