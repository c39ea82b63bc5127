"""The infinite HMM of Raykov et al. 2016, Section 6 in memory: the state, the sweep, decoding, and
the direct-assignment Gibbs sampler (6.1). MAP-iHMM's moves and run (6.2) are
``pipeline.models.ihmm_map``.

The state of a fit is an ``HmmState`` (compact: K represented states), the kernels are
``kernels.ihmm``. Kept apart from the scikit-learn estimators (``pipeline.estimators.ihmm``) so that
the distributed engine's workers never import scikit-learn. The MAP objective E(z, kappa) is
``kernels.ihmm.objective`` (``HmmState.objective``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels import ihmm as kihmm
from pipeline.core import config
from pipeline.core.persist import register
from pipeline.families import FloatArray, ProductFamily

IntArray = NDArray[np.int64]

#: floor of M0 - 1 in the kappa mode (eq. 6.6): M0 <= 1 would leave no unrepresented mass,
#: outside the objective's domain
KAPPA_FLOOR = 1e-3
#: the empirical-Bayes prior scale of the emissions (``pipeline.core.config.IHMM_PRIOR_SCALE``)
PRIOR_SCALE = config.IHMM_PRIOR_SCALE
#: the smallest emission weight ``ess_share`` returns: a numerical guard, not a belief
MIN_TEMPER = 0.01
M_COUNTS = ("expectation", "urn")


def residual_autocorrelation(
    Xa: FloatArray, z: IntArray, starts: IntArray, family: ProductFamily
) -> float:
    """Lag-1 autocorrelation of the records around their state's mean, pooled over the
    non-categorical columns (each scaled by its within-state standard deviation) and over the
    consecutive steps of a sequence that share their state; NaN when unmeasurable.

    Parameters
    ----------
    Xa : ndarray of shape (N, D)
        Arranged records.
    z : ndarray of shape (N,), int64
        States 0..K-1.
    starts : ndarray of shape (n_seq + 1,), int64
    family : ProductFamily

    Returns
    -------
    float
    """
    cols: list[int] = []
    end = 0
    for fam, group_cols in family.groups:
        if fam.name != "categorical":
            cols += range(end, end + len(group_cols))
        end += len(group_cols)
    if not cols or Xa.shape[0] < 2:
        return math.nan
    X = Xa[:, cols]
    K = int(z.max()) + 1
    counts = np.bincount(z, minlength=K).astype(np.float64)
    means = np.zeros((K, X.shape[1]))
    np.add.at(means, z, X)
    means /= counts[:, None]
    r = X - means[z]
    sd = np.sqrt((r * r).mean(axis=0))
    keep = sd > 0
    if not keep.any():
        return math.nan
    r = r[:, keep] / sd[keep]
    pair = z[1:] == z[:-1]
    # the last step of a sequence and the first of the next are no pair
    pair[starts[1:-1] - 1] = False
    if not pair.any():
        return math.nan
    a, b = r[:-1][pair], r[1:][pair]
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else math.nan


def temper_of(
    Xa: FloatArray, z: IntArray, starts: IntArray, family: ProductFamily
) -> tuple[float, float]:
    """The emission weight of ``temper="auto"``: (w, rho), rho the ``residual_autocorrelation``
    of the records ``Xa`` (N, D) within the states ``z`` (N,) of an untempered run, w =
    ``ess_share(rho)`` when rho exceeds 2 / sqrt(n_pairs) (twice its standard error under
    independence) and 1 otherwise; rho is NaN where unmeasured.
    """
    rho = residual_autocorrelation(Xa, z, starts, family)
    n_pairs = Xa.shape[0] - (starts.shape[0] - 1)
    if rho > 2.0 / math.sqrt(max(n_pairs, 1)):
        return ess_share(rho), rho
    return 1.0, rho


def check_temper(temper: Any) -> str | float:
    """``temper`` checked: "auto", or a number in (0, 1] as a float; ``ValueError`` otherwise."""
    if isinstance(temper, str) and temper == "auto":
        return "auto"
    try:
        w = float(temper)
    except (TypeError, ValueError):
        w = math.nan
    if isinstance(temper, bool) or not 0.0 < w <= 1.0:
        raise ValueError(f"temper must be 'auto' or a number in (0, 1], got {temper!r}")
    return w


def ess_share(rho: float) -> float:
    """The share of the records' evidence an autocorrelated sequence carries:
    (1 - rho) / (1 + rho), the effective sample size of an AR(1) series with lag-1
    autocorrelation rho over its length, in [``MIN_TEMPER``, 1]; 1 for rho <= 0 or NaN."""
    if not rho > 0:
        return 1.0
    return max((1.0 - rho) / (1.0 + rho), MIN_TEMPER)


def starts_of(lengths: IntArray | None, n: int) -> IntArray:
    """Offsets (n_seq + 1,) of sequences of the given lengths (hmmlearn's ``lengths``)."""
    if lengths is None:
        return np.array([0, n], dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


@register
@dataclass
class HmmState:
    """K represented states: emission statistics and the counts of the direct assignment."""

    stats: FloatArray  # (K, S)
    trans: FloatArray  # (K, K)
    start: FloatArray  # (K,)
    kappa: FloatArray  # (K,)
    ku: float

    @property
    def n_states(self) -> int:
        return int(self.stats.shape[0])

    @property
    def nk(self) -> FloatArray:
        return np.ascontiguousarray(self.stats[:, 0])

    @property
    def rows(self) -> FloatArray:
        return np.ascontiguousarray(self.trans.sum(axis=1))

    def objective(
        self, family: ProductFamily, alpha: float, gamma: float, temper: float = 1.0
    ) -> float:
        """E(z, kappa) (``kernels.ihmm.objective``), of the emissions tempered by ``temper``."""
        return float(
            kihmm.objective(
                self.stats if temper == 1.0 else temper * self.stats,
                self.nk,
                self.trans,
                self.start,
                self.rows,
                self.kappa,
                self.ku,
                family.spec,
                family.prior,
                alpha,
                gamma,
            )
        )

    def take(self, keep: NDArray[Any]) -> HmmState:
        """The states ``keep`` (indices or a mask of K) alone, kappa_{K+1} as it is."""
        return HmmState(
            np.ascontiguousarray(self.stats[keep]),
            np.ascontiguousarray(self.trans[np.ix_(keep, keep)]),
            np.ascontiguousarray(self.start[keep]),
            np.ascontiguousarray(self.kappa[keep]),
            float(self.ku),
        )

    def transitions(self, alpha: float) -> tuple[FloatArray, FloatArray]:
        """MAP start probabilities (K,) and transition matrix (K, K) of the represented states."""
        pi = self.start + alpha * self.kappa
        A = self.trans + alpha * self.kappa[None, :]
        return pi / pi.sum(), A / A.sum(axis=1, keepdims=True)

    def log_params(self, alpha: float) -> tuple[FloatArray, FloatArray]:
        """log initial-state probabilities (K + 1,) and log transition matrix (K + 1, K + 1) of
        the MAP model, (N_pk + N0 kappa_k) / (N_p. + N0), the unrepresented states as one."""
        K = self.n_states
        w = np.append(self.kappa, self.ku)
        A = np.empty((K + 1, K + 1))
        A[:K, :K] = self.trans + alpha * self.kappa[None, :]
        A[:K, K] = alpha * self.ku
        A[K] = alpha * w
        A /= A.sum(axis=1, keepdims=True)
        pi = np.append(self.start + alpha * self.kappa, alpha * self.ku)
        pi /= pi.sum()
        with np.errstate(divide="ignore"):
            return np.log(pi), np.log(A)


def state_from_labels(
    Xa: FloatArray,
    z: IntArray,
    starts: IntArray,
    K: int,
    family: ProductFamily,
    kappa: FloatArray,
    ku: float,
) -> HmmState:
    """The state of labels z (0..K-1) with the given weights."""
    stats = family.stats_of(Xa, z, K)
    trans, start, _rows = kihmm.count_transitions(z, starts, K)
    return HmmState(stats, trans, start, np.asarray(kappa, dtype=np.float64).copy(), float(ku))


def kappa_mode(M: FloatArray, gamma: float) -> tuple[FloatArray, float]:
    """The mode of Dirichlet(M_1 + 1, ..., M_K + 1, M0) (eq. 6.6 under the uniform base of
    ``kernels.ihmm``), M0 - 1 floored at ``KAPPA_FLOOR``."""
    w = np.maximum(M, KAPPA_FLOOR)
    wu = max(gamma - 1.0, KAPPA_FLOOR)
    tot = w.sum() + wu
    return w / tot, wu / tot


def kappa_step(
    st: HmmState, alpha: float, gamma: float, m_counts: str, rng_state: NDArray[np.uint64]
) -> HmmState:
    """New kappa from the table counts m_pk: their expectation or a Polya-urn draw (eq. 6.2)."""
    M = kihmm.table_counts(st.trans, st.start, st.kappa, alpha, rng_state, m_counts == "urn")
    kappa, ku = kappa_mode(M, gamma)
    return HmmState(st.stats, st.trans, st.start, kappa, ku)


def compact(z: IntArray, st: HmmState, n_fixed: int = 0) -> HmmState:
    """The states of ``st`` (slots) without its free ones (size 0), those below ``n_fixed`` kept
    all the same; z relabelled 0..K-1 in slot order, in place."""
    keep = np.flatnonzero((st.nk > 0) | (np.arange(st.n_states) < n_fixed))
    remap = np.full(max(st.n_states, 1), -1, dtype=np.int64)
    remap[keep] = np.arange(keep.shape[0])
    assigned = z >= 0
    z[assigned] = remap[z[assigned]]
    return st.take(keep)


def sweep_state(
    Xa: FloatArray,
    starts: IntArray,
    z: IntArray,
    st: HmmState,
    family: ProductFamily,
    alpha: float,
    gamma: float,
    gibbs: bool,
    rng_state: NDArray[np.uint64],
    temper: float = 1.0,
    n_fixed: int = 0,
) -> tuple[HmmState, int]:
    """One ``kernels.ihmm.sweep`` (eq. 6.7's argmin, or with ``gibbs`` a draw from eq. 6.3) over
    the arranged records Xa (N, D) of the sequences ``starts`` (n_seq + 1,) from the compact
    state ``st``: the in-memory runs' and the ``ihmm`` engine's chunk sweep.

    z (N,) is updated in place (-1: no state). The ``n_fixed`` first states keep their places
    even when emptied (a chunk's copy of the K global states). Returns the compact state after
    the sweep and the number of records that changed state.
    """
    K = st.n_states
    # room for as many new states as there are now: the kernel reallocates when they run out
    cap = max(2 * K, 8)
    stats, cache = np.zeros((cap, family.n_stats)), np.zeros((cap, family.n_cache))
    trans = np.zeros((cap, cap))
    nk, start, rows, kappa = np.zeros((4, cap))
    stats[:K], trans[:K, :K] = st.stats, st.trans
    nk[:K], start[:K], rows[:K], kappa[:K] = st.nk, st.start, st.rows, st.kappa
    if K:
        cache[:K] = family.cache_of(st.stats)
    ku = np.array([st.ku])
    slots = (stats, cache, nk, trans, start, rows, kappa)
    fam = (family.spec, family.prior, family.empty_cache())
    stats, _c, _n, trans, start, _r, kappa, n, n_changed = kihmm.sweep(
        Xa, starts, z, slots, ku, K, *fam, alpha, gamma, gibbs, rng_state, n_fixed, temper
    )
    after = HmmState(stats[:n], trans[:n, :n], start[:n], kappa[:n], float(ku[0]))
    return compact(z, after, n_fixed), int(n_changed)


def empty_state(family: ProductFamily) -> HmmState:
    """No state yet: all of kappa unrepresented."""
    return HmmState(np.zeros((0, family.n_stats)), np.zeros((0, 0)), np.zeros(0), np.zeros(0), 1.0)


def log_emissions(
    Xa: FloatArray, st: HmmState, family: ProductFamily, temper: float = 1.0
) -> FloatArray:
    """log p(x_t | X_k) (N, K + 1) of every record under every state and, last, a new one: the
    posterior-predictive emissions of eq. 6.4, tempered by ``temper`` < 1 as in the fit."""
    if temper != 1.0:
        return kihmm.emission_matrix_tempered(Xa, st.stats, family.spec, family.prior, temper)
    cache = family.cache_of(st.stats)
    return kihmm.emission_matrix(
        Xa, st.stats, cache, family.spec, family.prior, family.empty_cache()
    )


def decode(
    Xa: FloatArray,
    starts: IntArray,
    st: HmmState,
    family: ProductFamily,
    alpha: float,
    temper: float = 1.0,
) -> tuple[IntArray, FloatArray]:
    """Viterbi paths under the MAP model (``HmmState.log_params``, ``log_emissions``); state K
    is an unrepresented one. Returns the paths (N,) and the best log joint of each sequence."""
    log_pi, log_a = st.log_params(alpha)
    return kihmm.viterbi(log_emissions(Xa, st, family, temper), starts, log_pi, log_a)


def log_likelihood(
    Xa: FloatArray, starts: IntArray, st: HmmState, family: ProductFamily, alpha: float
) -> FloatArray:
    """log p(x_1..x_T) of each sequence under the MAP model, by the forward algorithm (the sum
    of its steps' ``kernels.ihmm.forward_steps``, the chain rule)."""
    log_pi, log_a = st.log_params(alpha)
    steps = kihmm.forward_steps(log_emissions(Xa, st, family), starts, log_pi, log_a)
    return np.add.reduceat(steps, starts[:-1])


def gibbs_step_kappa(
    st: HmmState,
    alpha: float,
    gamma: float,
    rng_state: NDArray[np.uint64],
    rng: np.random.Generator,
) -> HmmState:
    """The Gibbs kappa step: table counts by the urn (eq. 6.2), then kappa (eq. 6.1)."""
    M = kihmm.table_counts(st.trans, st.start, st.kappa, alpha, rng_state, True)
    w = rng.dirichlet(np.append(M, gamma))
    # a Dirichlet draw can underflow to 0 for a tiny parameter; keep the weights in the domain
    w = np.maximum(w, 1e-300)
    w /= w.sum()
    return HmmState(st.stats, st.trans, st.start, w[:-1].copy(), float(w[-1]))


def run_gibbs(
    Xa: FloatArray,
    starts: IntArray,
    family: ProductFamily,
    alpha: float,
    gamma: float,
    n_sweeps: int,
    seq: np.random.SeedSequence,
    callback: Callable[[int, IntArray, HmmState], None] | None = None,
) -> tuple[IntArray, HmmState]:
    """The direct-assignment Gibbs sampler of Raykov et al. 2016, Section 6.1, from one state:
    each sweep draws every z_t (eq. 6.3), the table counts (eq. 6.2) and kappa (eq. 6.1);
    ``callback(i, z, state)`` sees each sweep. Returns the last labels and state."""
    N = Xa.shape[0]
    rng_state = np.asarray(seq.generate_state(1, dtype=np.uint64), dtype=np.uint64)
    rng = np.random.default_rng(seq.spawn(1)[0])
    z = np.zeros(N, dtype=np.int64)
    st = state_from_labels(Xa, z, starts, 1, family, np.array([0.5]), 0.5)
    for i in range(n_sweeps):
        st, _ = sweep_state(Xa, starts, z, st, family, alpha, gamma, True, rng_state)
        st = gibbs_step_kappa(st, alpha, gamma, rng_state, rng)
        if callback is not None:
            callback(i, z, st)
    return z, st
