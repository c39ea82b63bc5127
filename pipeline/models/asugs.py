"""ASUGS-PM in memory (Tsiligkaridis and Forsythe 2015, Algorithm 1 with Section 6's pruning and
merging): the state of a stream as plain arrays (``StreamState``), its parameters and one step over
a batch of records (``advance``, over the numba loop ``kernels.asugs``), and the stream's prior,
chosen by empirical Bayes on its first records (``choose_prior``).

The estimator ``ASUGS`` (``pipeline.estimators.asugs``) keeps one ``StreamState``, and the
``asugs`` engine of the pass loop (``pipeline.engines.asugs``) hands one from chunk to chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels import asugs as kasugs
from pipeline.core import config
from pipeline.core.persist import register
from pipeline.families import FloatArray, GaussianNW, NormalGamma, ProductFamily

IntArray = NDArray[np.int64]

SELECT = ("greedy", "sample")
#: records between ASUGS-PM rounds at the start of a stream (``kernels.asugs.pm_due``): earlier
#: rounds merge classes whose posteriors are still too broad to tell apart (``bench_asugs``)
PM_INTERVAL = 250
#: a class holding less than this share of the records seen since it opened is pruned
PRUNE_WEIGHT = 0.01
DEFAULT_LAM = config.ASUGS_LAM
#: the prior scale a stream's prior is fitted at before ``choose_prior`` rescales it, and that of
#: a too short first batch (``EB_MIN_RECORDS``) and of the ``asugs`` starts of MAP-DP
PRIOR_SCALE = 0.1
#: the prior scales and strengths (a0 - d - 1 of the Normal-Wishart; 1 is the batch default,
#: a0 = d + 2) ``choose_prior`` compares
EB_SCALES = (0.5, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01, 0.005, 0.002)
EB_STRENGTHS = (1.0, 3.0, 10.0, 30.0, 100.0)
#: the records at the start of a stream that ``choose_prior`` streams (at most)
EB_RECORDS = 1000
#: a first batch shorter than this keeps ``PRIOR_SCALE`` and strength 1
EB_MIN_RECORDS = 50


@register
@dataclass(eq=False)
class StreamState:
    """The state of one ASUGS stream after ``n_seen`` records (``kernels.asugs.stream``).

    Rows 0..K-1 of ``stats`` (K_cap, S), ``cache``, ``nk``, ``born`` and ``ids`` are the classes;
    ``alias`` (A,) the fate of every id opened (``n_ids`` of them); ``pruned`` (S,) the statistics
    of the pruned classes; ``rng`` (1,) uint64 the state of the draws of ``select="sample"``.
    """

    stats: FloatArray
    cache: FloatArray
    nk: FloatArray
    born: FloatArray
    ids: IntArray
    K: int
    alias: IntArray
    n_ids: int
    pruned: FloatArray
    n_seen: int
    rng: NDArray[np.uint64]
    n_pruned: int = 0
    n_merged: int = 0
    log_joint: float = 0.0

    @classmethod
    def empty(cls, family: ProductFamily, rng: NDArray[np.uint64]) -> StreamState:
        cap = 8
        return cls(
            stats=np.zeros((cap, family.n_stats)),
            cache=np.zeros((cap, family.n_cache)),
            nk=np.zeros(cap),
            born=np.zeros(cap),
            ids=np.full(cap, -1, dtype=np.int64),
            K=0,
            alias=np.full(cap, kasugs.ALIVE, dtype=np.int64),
            n_ids=0,
            pruned=np.zeros(family.n_stats),
            n_seen=0,
            rng=np.asarray(rng, dtype=np.uint64).copy(),
        )

    @classmethod
    def from_clusters(
        cls,
        stats: FloatArray,
        family: ProductFamily,
        rng: NDArray[np.uint64],
        n_seen: int | None = None,
    ) -> StreamState:
        """A stream that has seen the records the clusters ``stats`` (K, S) summarise (``n_seen``
        more when some were pruned), one class each, opened at the last of those records."""
        stats = np.ascontiguousarray(np.asarray(stats, dtype=np.float64))
        K = int(stats.shape[0])
        if K == 0 or stats.shape[1] != family.n_stats or not np.all(stats[:, 0] > 0):
            raise ValueError(
                f"a stream starts from clusters of shape (K >= 1, {family.n_stats}) with "
                f"n > 0 records each; got shape {stats.shape}"
            )
        st = cls.empty(family, rng)
        cap = max(8, 2 * K)
        if n_seen is None:
            n_seen = round(float(stats[:, 0].sum()))
        st.stats = np.zeros((cap, family.n_stats))
        st.stats[:K] = stats
        st.cache = np.zeros((cap, family.n_cache))
        st.cache[:K] = family.cache_of(stats)
        st.nk = np.zeros(cap)
        st.nk[:K] = stats[:, 0]
        st.born = np.zeros(cap)
        st.born[:K] = float(n_seen)
        st.ids = np.full(cap, -1, dtype=np.int64)
        st.ids[:K] = np.arange(K)
        st.alias = np.full(cap, kasugs.ALIVE, dtype=np.int64)
        st.K, st.n_ids, st.n_seen = K, K, int(n_seen)
        return st

    def __eq__(self, other: object) -> bool:
        """Field by field, arrays by value (a checkpoint read back equals what was written)."""
        if not isinstance(other, StreamState):
            return NotImplemented
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
                    return False
                if a.dtype != b.dtype or not np.array_equal(a, b):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    @property
    def cluster_stats(self) -> FloatArray:
        """The classes' statistics (K, S): a copy (the stream updates its arrays in place)."""
        return self.stats[: self.K].copy()

    def copy(self) -> StreamState:
        return StreamState(
            self.stats.copy(),
            self.cache.copy(),
            self.nk.copy(),
            self.born.copy(),
            self.ids.copy(),
            self.K,
            self.alias.copy(),
            self.n_ids,
            self.pruned.copy(),
            self.n_seen,
            self.rng.copy(),
            self.n_pruned,
            self.n_merged,
            self.log_joint,
        )

    def rows_of_ids(self) -> IntArray:
        """The class row of every id opened (n_ids,), -1 where pruned."""
        return np.asarray(kasugs.row_of_ids(self.alias, self.ids, self.K)[: self.n_ids])


@register
@dataclass(frozen=True)
class StreamParams:
    """What ``advance`` needs besides the records: lambda (<= 0: SUGS with ``alpha``), the
    selection, ASUGS-PM's schedule and threshold (``pm_interval`` <= 0: no pruning/merging)."""

    lam: float
    alpha: float
    sample: bool
    pm_interval: int
    prune_weight: float

    def concentration(self, K: int, n_seen: int) -> float:
        """alpha_n after n_seen records in K classes (Section 2.1), or SUGS's alpha."""
        if self.lam <= 0:
            return self.alpha
        return K / (self.lam + math.log(max(n_seen, 1)))


def advance(
    st: StreamState, Xa: FloatArray, family: ProductFamily, sp: StreamParams, trace: bool = False
) -> tuple[StreamState, IntArray, FloatArray]:
    """Stream the arranged records Xa (n, D) through ``st`` in order (updated in place and
    returned); the id of the class each record joined (n,) and, with ``trace``, alpha_i after
    each record (n,) (else an empty array)."""
    n = Xa.shape[0]
    z = np.empty(n, dtype=np.int64)
    alpha_trace = np.empty(n if trace else 0)
    logq = np.empty(n)
    (st.stats, st.cache, st.nk, st.born, st.ids, K, st.alias, n_ids, n_seen, n_pruned, n_merged) = (
        kasugs.stream(
            np.ascontiguousarray(Xa, dtype=np.float64),
            z,
            alpha_trace,
            logq,
            st.stats,
            st.cache,
            st.nk,
            st.born,
            st.ids,
            st.K,
            st.alias,
            st.n_ids,
            st.pruned,
            st.n_seen,
            family.spec,
            family.prior,
            family.empty_cache(),
            float(sp.lam),
            float(sp.alpha),
            bool(sp.sample),
            st.rng,
            int(sp.pm_interval),
            float(sp.prune_weight),
        )
    )
    st.K, st.n_ids, st.n_seen = int(K), int(n_ids), int(n_seen)
    st.n_pruned += int(n_pruned)
    st.n_merged += int(n_merged)
    st.log_joint += float(logq.sum())
    return st, z, alpha_trace


def check_stream_params(
    lam: Any, alpha: Any, select: Any, prune_merge: Any, pm_interval: Any, prune_weight: Any
) -> StreamParams:
    """The checked parameters of an ASUGS / SUGS stream (``ASUGS`` documents them)."""
    config.check_choice(select, SELECT, "select")
    if alpha is not None:
        config.check_positive(alpha, "alpha")
    if lam is None:
        if alpha is None:
            raise ValueError("SUGS (lam=None) needs a fixed alpha; ASUGS needs lam > 0")
        a = config.check_positive(alpha, "alpha")
        lam_v = 0.0
    else:
        if alpha is not None:
            raise ValueError(
                f"give lam (ASUGS, adaptive alpha) or alpha with lam=None (SUGS), not both: "
                f"lam={lam!r}, alpha={alpha!r}"
            )
        lam_v = config.check_positive(lam, "lam")
        a = 1.0
    if not isinstance(prune_merge, (bool, np.bool_)):
        raise ValueError(f"prune_merge must be True or False, got {prune_merge!r}")
    interval = config.check_int(pm_interval, "pm_interval")
    pw = config.check_fraction(prune_weight, "prune_weight")
    return StreamParams(
        lam=lam_v,
        alpha=a,
        sample=select == "sample",
        pm_interval=interval if prune_merge else 0,
        prune_weight=pw,
    )


def with_prior(
    family: ProductFamily, base_scale: float, scale: float, strength: float
) -> ProductFamily:
    """``family``'s empirical-Bayes prior (fitted at ``base_scale``) at another prior scale and
    strength, without the data: each Gaussian group's expected class covariance scaled by
    scale / base_scale, c0 = scale / (1 - scale), and ``strength`` pseudo-records in its
    covariance prior with E[precision] kept. Other groups are kept; returns a ProductFamily over
    the same column groups.
    """
    groups: list[tuple[Any, list[int]]] = []
    c0 = scale / (1.0 - scale)
    for fam, cols in family.groups:
        if isinstance(fam, GaussianNW):
            a0 = fam.n_cols + 1.0 + strength
            B0 = np.asarray(fam.B0) * (fam.a0 * base_scale) / (a0 * scale)
            fam = GaussianNW(m0=fam.m0, c0=c0, B0=0.5 * (B0 + B0.T), a0=a0, step=fam.step)
        elif isinstance(fam, NormalGamma):
            a_base = np.asarray(fam.a0, dtype=np.float64)
            a0v = a_base + 0.5 * (strength - 1.0)
            b0 = np.asarray(fam.b0, dtype=np.float64) * (a0v * scale) / (a_base * base_scale)
            fam = NormalGamma(m0=fam.m0, c0=np.full(fam.n_cols, c0), a0=a0v, b0=b0, step=fam.step)
        groups.append((fam, cols))
    return ProductFamily(groups)


def choose_prior(
    family: ProductFamily,
    base_scale: float,
    Xa: FloatArray,
    sp: StreamParams,
    rng: NDArray[np.uint64],
) -> tuple[ProductFamily, float, float]:
    """The stream's prior chosen by empirical Bayes on its first records (Raykov et al. 2016,
    Appendix A, option 2): the prior scale and strength (``with_prior``) under which the stream's
    sequential log joint of its first ``EB_RECORDS`` records is largest, by coordinate ascent over
    ``EB_SCALES`` and ``EB_STRENGTHS``. A one-pass stream decides each record once, and a class
    whose predictive is too broad absorbs its neighbours for good (Tsiligkaridis and Forsythe
    2015, Section 6.1), so the batch default does not suit it.

    Parameters
    ----------
    family : ProductFamily
        The empirical-Bayes prior fitted at ``base_scale``.
    base_scale : float
    Xa : ndarray of shape (n, D)
        The first records, arranged for ``family``; fewer than ``EB_MIN_RECORDS``, or no
        Gaussian group: ``family`` is kept.
    sp : StreamParams
    rng : ndarray of shape (1,), uint64
        The stream's RNG state (copied; each candidate starts from it).

    Returns
    -------
    family : ProductFamily
    scale, strength : float
        The choice (``base_scale`` and 1 when ``family`` is kept).
    """
    gaussian = any(isinstance(f, (GaussianNW, NormalGamma)) for f, _ in family.groups)
    if Xa.shape[0] < EB_MIN_RECORDS or not gaussian:
        return family, float(base_scale), 1.0
    Xs = np.ascontiguousarray(Xa[:EB_RECORDS], dtype=np.float64)
    seen: dict[tuple[float, float], tuple[float, ProductFamily]] = {}

    def joint(scale: float, strength: float) -> float:
        if (scale, strength) not in seen:
            fam = with_prior(family, base_scale, scale, strength)
            st, _, _ = advance(StreamState.empty(fam, rng), Xs, fam, sp)
            seen[scale, strength] = (st.log_joint, fam)
        return seen[scale, strength][0]

    def climb(values: tuple[float, ...], i: int, f: Callable[[float], float]) -> int:
        """From values[i], neighbour by neighbour while f rises (first up the list, else down)."""
        start = i
        for step in (1, -1):
            while 0 <= i + step < len(values) and f(values[i + step]) > f(values[i]):
                i += step
            if i != start:
                break
        return i

    def scan(values: tuple[float, ...], i: int, f: Callable[[float], float]) -> int:
        """The arg max of f over values (i on ties)."""
        best = max(range(len(values)), key=lambda j: f(values[j]))
        return best if f(values[best]) > f(values[i]) else i

    si = int(np.argmin(np.abs(np.log(EB_SCALES) - math.log(base_scale))))
    ai = 0
    # the first round scans every value (the joint need not be unimodal far from the optimum:
    # too broad a prior merges whole groups of classes at once), later rounds climb from there;
    # each round raises the joint or stops, and the cap only bounds the rounds
    move = scan
    for _ in range(len(EB_SCALES) + len(EB_STRENGTHS)):
        si2 = move(EB_SCALES, si, partial(joint, strength=EB_STRENGTHS[ai]))
        ai2 = move(EB_STRENGTHS, ai, partial(joint, EB_SCALES[si2]))
        if (si2, ai2) == (si, ai):
            break
        si, ai, move = si2, ai2, climb
    scale, strength = EB_SCALES[si], EB_STRENGTHS[ai]
    return seen[scale, strength][1], scale, strength
