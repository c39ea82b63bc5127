"""Tree-guided MCMC for a wall-time budget, one iteration at a time (the wall-clock comparison
of the samplers, ``tests/benchmarks/bench_tgmcmc.py``, and its test): not part of the product."""

from __future__ import annotations

import time

import numpy as np
from numpy.typing import ArrayLike

from pipeline.estimators.tgmcmc import IntArray, TreeGuidedMCMC
from pipeline.families import Family, ProductFamily
from pipeline.models.ibhc import leaf_log_marginals
from pipeline.models.tgmcmc import Chain, ChainSettings


def _warm_up(est: TreeGuidedMCMC, stats: np.ndarray, prod: ProductFamily) -> None:
    """Compile (or load from numba's cache) the kernels on the first two leaves."""
    st = np.ascontiguousarray(stats[: min(2, stats.shape[0])])
    m = st.shape[0]
    lm = leaf_log_marginals(st, prod)
    cfg = ChainSettings(**{**est._settings.__dict__, "G": 1, "n_local": 1})
    chain = Chain(
        cfg, st, lm, np.zeros(m, dtype=np.int64), est._pp, prod, 1.0,
        np.arange(m, dtype=np.int64), np.array([1], dtype=np.uint64),
    )  # fmt: skip
    chain.run(
        1, 0, 1, np.zeros((1, m), dtype=np.int64), np.zeros(1), np.zeros(1, dtype=np.int64),
        np.zeros(1),
    )  # fmt: skip


def fit_for(
    est: TreeGuidedMCMC,
    seconds: float,
    X: ArrayLike | None = None,
    *,
    stats: ArrayLike | None = None,
    family: Family | ProductFamily | None = None,
    max_iter: int = 1_000_000,
) -> TreeGuidedMCMC:
    """Run ``est`` for a wall-time budget, one iteration at a time, recording (time, log joint).

    Give either records ``X`` or leaf ``stats`` (with ``family``). Kernels are compiled (or
    loaded from numba's cache) on a tiny problem first, so the clock measures sampling only.
    ``burn_in`` and ``thin`` count iterations as in ``fit``; ``n_iter`` is ignored.
    Sets ``wall_trace_`` (n, 2) and the attributes of ``fit``.
    """
    if (X is None) == (stats is None):
        raise ValueError("give exactly one of X or stats")
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0; got {seconds}")
    pp = est._check_params()
    if X is not None:
        st = est._record_leaves(est._encode_fit(X))
        prod = est.family_
    else:
        assert stats is not None  # exactly one of X and stats, checked above
        st, prod = est._summaries_input(stats, family)
    chain = est._start(st, prod, pp)
    _warm_up(est, chain.stats, prod)
    lj_list: list[float] = []
    k_list: list[int] = []
    u_list: list[float] = []
    z_list: list[IntArray] = []
    times: list[float] = []
    one_z = np.zeros((1, chain.L), dtype=np.int64)
    no_z = np.zeros((0, chain.L), dtype=np.int64)
    lj1 = np.zeros(1)
    k1 = np.zeros(1, dtype=np.int64)
    u1 = np.zeros(1)
    t0 = time.perf_counter()
    it = 0
    while it < max_iter:
        keep = it >= est.burn_in and (it - est.burn_in) % est.thin == 0
        chain.run(1, 0, 1, one_z if keep else no_z, lj1, k1, u1)
        elapsed = time.perf_counter() - t0
        times.append(elapsed)
        lj_list.append(float(lj1[0]))
        k_list.append(int(k1[0]))
        u_list.append(float(u1[0]))
        if keep:
            z_list.append(one_z[0].copy())
        it += 1
        if elapsed >= seconds:
            break
    out_z = np.array(z_list, dtype=np.int64).reshape(-1, chain.L)
    kept_idx = np.array(
        [t for t in range(it) if t >= est.burn_in and (t - est.burn_in) % est.thin == 0],
        dtype=np.int64,
    )
    est._finish(
        chain, prod, out_z, np.array(lj_list), np.array(k_list, dtype=np.int64),
        np.array(u_list), kept_idx=kept_idx,
    )  # fmt: skip
    est.wall_trace_ = np.column_stack([np.array(times), np.array(lj_list)])
    return est
