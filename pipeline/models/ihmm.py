"""MAP-iHMM and the direct-assignment Gibbs sampler of seed 000 Section 6 in memory.

The state of a fit is an ``HmmState`` (compact: K represented states), the kernels are
``kernels.ihmm``. Kept apart from the scikit-learn estimators (``pipeline.estimators.ihmm``) so that
the
distributed engine's workers never import scikit-learn.

The MAP objective E(z, kappa) is ``kernels.ihmm.objective``. Every step of ``run_map_ihmm``
takes a move only when E does not rise: the sweeps (eq. 6.7, each q_{t,k} the exact change of
E), the kappa step (eq. 6.6 with the expected table counts, an EM step for kappa with the counts
m_pk the missing data, so it cannot raise E; checked all the same, since the mode is floored
away from the simplex's boundary), Viterbi re-segmentation of the sequences under the MAP
parameters, and split and merge moves over states. With ``m_counts="urn"`` the table counts are
drawn by the Polya urn of eq. 6.2 as in the paper, and the kappa step is then always taken: E
fluctuates, as the paper notes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kernels import ihmm as kihmm
from pipeline.core.persist import register
from pipeline.families import FloatArray, ProductFamily

IntArray = NDArray[np.int64]

#: floor of M0 - 1 in the kappa mode (eq. 6.6): M0 <= 1 would leave no unrepresented mass,
#: outside the objective's domain
KAPPA_FLOOR = 1e-3
#: the empirical-Bayes prior scale of the emissions (``GaussianNW.empirical_bayes``: the share
#: of the data's variance one state is expected to carry) of ``MAPiHMM``, ``IHMMGibbs`` and the
#: ``ihmm`` engine, below the mixtures' default 0.3: their defaults and figures (Table 4, NMI
#: >= 0.90 with 5 states, ``bench_ihmm``; the engine's recovery of the states of a simulated
#: HMM, which failed under 0.3) were measured with 0.1
PRIOR_SCALE = 0.1


def b_new_of(gamma: float) -> float:
    """The share of kappa_{K+1} a state opened by a MAP sweep takes: 1 / M0 minimises its cost
    b (1 - b)^(M0 - 1); 1/2 for M0 <= 1."""
    return 1.0 / gamma if gamma > 1.0 else 0.5


M_COUNTS = ("expectation", "urn")


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

    def objective(self, family: ProductFamily, alpha: float, gamma: float) -> float:
        """E(z, kappa) (``kernels.ihmm.objective``)."""
        return float(
            kihmm.objective(
                self.stats,
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

    def log_params(self, alpha: float) -> tuple[FloatArray, FloatArray]:
        """log initial-state probabilities (K + 1,) and log transition matrix (K + 1, K + 1) of
        the MAP model: the posterior means given the counts and kappa,
        (N_pk + N0 kappa_k) / (N_p. + N0), with the unrepresented states as one last state
        (mass N0 kappa_{K+1} / (N_p. + N0); out of it, kappa itself)."""
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
    st: HmmState,
    alpha: float,
    gamma: float,
    m_counts: str,
    rng_state: NDArray[np.uint64],
) -> HmmState:
    """New kappa from the table counts m_pk: their expectation or a Polya-urn draw (eq. 6.2)."""
    if m_counts == "urn":
        M = kihmm.table_counts_urn(st.trans, st.start, st.kappa, alpha, rng_state)
    else:
        M = kihmm.table_counts_expected(st.trans, st.start, st.kappa, alpha)
    kappa, ku = kappa_mode(M, gamma)
    return HmmState(st.stats, st.trans, st.start, kappa, ku)


def compact(
    z: IntArray,
    stats: FloatArray,
    nk: FloatArray,
    trans: FloatArray,
    start: FloatArray,
    kappa: FloatArray,
    ku: float,
    n_slots: int,
) -> HmmState:
    """Drop the free slots; z relabelled 0..K-1 in slot order, in place."""
    keep = np.flatnonzero(nk[:n_slots] > 0)
    remap = np.full(max(n_slots, 1), -1, dtype=np.int64)
    remap[keep] = np.arange(keep.shape[0])
    assigned = z >= 0
    z[assigned] = remap[z[assigned]]
    return HmmState(
        np.ascontiguousarray(stats[keep]),
        np.ascontiguousarray(trans[np.ix_(keep, keep)]),
        np.ascontiguousarray(start[keep]),
        np.ascontiguousarray(kappa[keep]),
        float(ku),
    )


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
) -> tuple[HmmState, int]:
    """One ``kernels.ihmm.sweep`` over the sequences from a compact state; returns the compact
    state after it and the number of records that changed state."""
    K = st.n_states
    cap = max(2 * K, 8)
    stats = np.zeros((cap, family.n_stats))
    stats[:K] = st.stats
    cache = np.zeros((cap, family.n_cache))
    if K:
        cache[:K] = family.cache_of(st.stats)
    nk = np.zeros(cap)
    nk[:K] = st.nk
    trans = np.zeros((cap, cap))
    trans[:K, :K] = st.trans
    start = np.zeros(cap)
    start[:K] = st.start
    rows = np.zeros(cap)
    rows[:K] = st.rows
    kappa = np.zeros(cap)
    kappa[:K] = st.kappa
    ku = np.array([st.ku])
    stats, cache, nk, trans, start, rows, kappa, n_slots, n_changed = kihmm.sweep(
        Xa,
        starts,
        z,
        stats,
        cache,
        nk,
        trans,
        start,
        rows,
        kappa,
        ku,
        K,
        family.spec,
        family.prior,
        family.empty_cache(),
        alpha,
        gamma,
        b_new_of(gamma),
        gibbs,
        rng_state,
        0,
    )
    return compact(z, stats, nk, trans, start, kappa, float(ku[0]), n_slots), int(n_changed)


def empty_state(family: ProductFamily) -> HmmState:
    """No state yet: all of kappa unrepresented."""
    return HmmState(np.zeros((0, family.n_stats)), np.zeros((0, 0)), np.zeros(0), np.zeros(0), 1.0)


def decode(
    Xa: FloatArray, starts: IntArray, st: HmmState, family: ProductFamily, alpha: float
) -> tuple[IntArray, FloatArray]:
    """Viterbi paths under the MAP model (``HmmState.log_params``, posterior-predictive emissions
    of eq. 6.4); state K is an unrepresented one. Returns the paths (N,) and the best log joint
    of each sequence."""
    log_b = kihmm.emission_matrix(
        Xa, st.stats, family.cache_of(st.stats), family.spec, family.prior, family.empty_cache()
    )
    log_pi, log_a = st.log_params(alpha)
    path, best = kihmm.viterbi(log_b, starts, log_pi, log_a)
    return path, best


def log_likelihood(
    Xa: FloatArray, starts: IntArray, st: HmmState, family: ProductFamily, alpha: float
) -> FloatArray:
    """log p(x_1..x_T) of each sequence under the MAP model, by the forward algorithm."""
    log_b = kihmm.emission_matrix(
        Xa, st.stats, family.cache_of(st.stats), family.spec, family.prior, family.empty_cache()
    )
    log_pi, log_a = st.log_params(alpha)
    return np.asarray(kihmm.forward(log_b, starts, log_pi, log_a))


def relabel(
    Xa: FloatArray,
    starts: IntArray,
    path: IntArray,
    st: HmmState,
    family: ProductFamily,
    gamma: float,
) -> tuple[IntArray, HmmState]:
    """The compact state of Viterbi paths decoded under ``st`` (path K: one new state, taking
    its share of kappa_{K+1}); states left empty give their weight back to kappa_{K+1}."""
    K = st.n_states
    kappa, ku = st.kappa, st.ku
    if np.any(path == K):
        b = b_new_of(gamma)
        kappa = np.append(kappa, b * ku)
        ku = (1.0 - b) * ku
    cand = state_from_labels(Xa, path, starts, kappa.shape[0], family, kappa, ku)
    z_new = path.copy()
    empty = cand.nk == 0
    cand = compact(
        z_new,
        cand.stats,
        cand.nk,
        cand.trans,
        cand.start,
        cand.kappa,
        cand.ku + float(cand.kappa[empty].sum()),
        cand.n_states,
    )
    return z_new, cand


def viterbi_move(
    Xa: FloatArray,
    starts: IntArray,
    z: IntArray,
    st: HmmState,
    family: ProductFamily,
    alpha: float,
    gamma: float,
    e_now: float,
    n_rounds: int = 3,
) -> tuple[HmmState, float, bool]:
    """Re-segment every sequence by Viterbi under the MAP model (``decode``), ``n_rounds`` times
    (each round decodes under the parameters of the last); taken if E falls below ``e_now``."""
    cand, z_new = st, z
    for _ in range(n_rounds):
        path, _best = decode(Xa, starts, cand, family, alpha)
        if np.array_equal(path, z_new):
            break
        z_new, cand = relabel(Xa, starts, path, cand, family, gamma)
    if cand is st:
        return st, e_now, False
    e_new = cand.objective(family, alpha, gamma)
    if e_new < e_now - 1e-9 * abs(e_now):
        z[:] = z_new
        return cand, e_new, True
    return st, e_now, False


def merge_states(st: HmmState, a: int, b: int) -> HmmState:
    """States a and b (a < b) as one: statistics, counts and weights add; b's row dropped."""
    keep = np.array([k for k in range(st.n_states) if k != b], dtype=np.int64)
    stats = st.stats.copy()
    stats[a] += stats[b]
    trans = st.trans.copy()
    trans[a] += trans[b]
    trans[:, a] += trans[:, b]
    start = st.start.copy()
    start[a] += start[b]
    kappa = st.kappa.copy()
    kappa[a] += kappa[b]
    return HmmState(
        np.ascontiguousarray(stats[keep]),
        np.ascontiguousarray(trans[np.ix_(keep, keep)]),
        np.ascontiguousarray(start[keep]),
        np.ascontiguousarray(kappa[keep]),
        st.ku,
    )


def greedy_merges(
    st: HmmState, family: ProductFamily, alpha: float, gamma: float, e_now: float
) -> tuple[HmmState, float, IntArray]:
    """Greedy merges over pairs of states: the pair whose merge lowers E most
    (``kernels.ihmm.merge_deltas``), while one does; each merge's E is recomputed in full.

    Returns the new state, its E and ``target`` (K,): the new number of each old state.
    """
    target = np.arange(st.n_states, dtype=np.int64)
    while st.n_states > 1:
        deltas = kihmm.merge_deltas(
            st.stats, st.trans, st.start, st.kappa, family.spec, family.prior, alpha, gamma
        )
        a, b = np.unravel_index(int(np.argmin(deltas)), deltas.shape)
        if not deltas[a, b] < -1e-9 * abs(e_now):
            break
        cand = merge_states(st, int(a), int(b))
        e = cand.objective(family, alpha, gamma)
        if not e < e_now:
            break
        st, e_now = cand, e
        target[target == b] = a
        target[target > b] -= 1
    return st, e_now, target


def merge_round(
    z: IntArray, st: HmmState, family: ProductFamily, alpha: float, gamma: float, e_now: float
) -> tuple[HmmState, float, bool]:
    """``greedy_merges`` with the labels z relabelled in place."""
    K = st.n_states
    st, e_now, target = greedy_merges(st, family, alpha, gamma, e_now)
    if st.n_states == K:
        return st, e_now, False
    z[:] = target[z]
    return st, e_now, True


def two_means(P: FloatArray, w: FloatArray, n_iter: int = 20) -> IntArray | None:
    """Two groups of points P (n, D) with weights w (n,): halves along the weighted principal
    axis refined by weighted 2-means; None when a group empties."""
    n = P.shape[0]
    if n < 2:
        return None
    mean = (w[:, None] * P).sum(axis=0) / w.sum()
    Pc = P - mean
    cov = (w[:, None] * Pc).T @ Pc / w.sum()
    if not np.all(np.isfinite(cov)):
        return None
    axis = np.linalg.eigh(cov)[1][:, -1]
    side = (Pc @ axis > 0).astype(np.int64)
    for _ in range(n_iter):
        if side.min() == side.max():
            return None
        c0 = np.average(P[side == 0], axis=0, weights=w[side == 0])
        c1 = np.average(P[side == 1], axis=0, weights=w[side == 1])
        new = (((P - c1) ** 2).sum(axis=1) < ((P - c0) ** 2).sum(axis=1)).astype(np.int64)
        if np.array_equal(new, side):
            break
        side = new
    if side.min() == side.max():
        return None
    return side


def split_labels(
    Xa: FloatArray, starts: IntArray, z: IntArray, k: int
) -> tuple[IntArray, IntArray] | None:
    """A proposal to split state k in two, by its runs (maximal stretches of k within a
    sequence): the runs' means grouped by weighted 2-means, so that a state holding runs of two
    overlapping emissions splits along time, where records one by one could not. A state of one
    run splits its records instead. Returns (members, side) or None."""
    members = np.flatnonzero(z == k)
    if members.shape[0] < 4:
        return None
    seq_of = np.searchsorted(starts, members, side="right")
    new_run = np.ones(members.shape[0], dtype=bool)
    new_run[1:] = (np.diff(members) != 1) | (np.diff(seq_of) != 0)
    run = np.cumsum(new_run) - 1
    n_runs = int(run[-1]) + 1
    if n_runs >= 4:
        length = np.bincount(run).astype(np.float64)
        means = np.zeros((n_runs, Xa.shape[1]))
        np.add.at(means, run, Xa[members])
        means /= length[:, None]
        side_runs = two_means(means, length)
        if side_runs is not None:
            return members, side_runs[run]
    side = two_means(Xa[members], np.ones(members.shape[0]))
    return None if side is None else (members, side)


def split_round(
    Xa: FloatArray,
    starts: IntArray,
    z: IntArray,
    st: HmmState,
    family: ProductFamily,
    alpha: float,
    gamma: float,
    e_now: float,
) -> tuple[HmmState, float, bool]:
    """Try to split every state in two; each split taken if E falls.

    The proposal halves a state's runs (``split_labels``), then re-segments the sequences by
    Viterbi under the K + 1 states (``viterbi_move``).
    """
    moved = False
    K0 = st.n_states
    for k in range(K0):
        proposal = split_labels(Xa, starts, z, k)
        if proposal is None:
            continue
        members, side = proposal
        K = st.n_states
        z_new = z.copy()
        z_new[members[side == 1]] = K
        share = float(side.sum()) / members.shape[0]
        kappa = np.append(st.kappa, st.kappa[k] * share)
        kappa[k] *= 1.0 - share
        cand = state_from_labels(Xa, z_new, starts, K + 1, family, kappa, st.ku)
        e = cand.objective(family, alpha, gamma)
        cand, e, _ = viterbi_move(Xa, starts, z_new, cand, family, alpha, gamma, e)
        if e < e_now - 1e-9 * abs(e_now):
            st, e_now = cand, e
            z[:] = z_new
            moved = True
    return st, e_now, moved


@dataclass
class IhmmResult:
    """One MAP-iHMM run: labels 0..K-1 of every record and the state."""

    labels: IntArray
    state: HmmState
    objective: float
    history: list[float] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = False
    seconds: float = 0.0


def run_map_ihmm(
    Xa: FloatArray,
    starts: IntArray,
    family: ProductFamily,
    alpha: float,
    gamma: float,
    max_iter: int,
    tol: float,
    m_counts: str,
    rng_state: NDArray[np.uint64],
    z0: IntArray | None = None,
    moves: bool = True,
    callback: Callable[[int, float, int], None] | None = None,
) -> IhmmResult:
    """MAP-iHMM (seed 000, Section 6.2) on arranged records of the sequences ``starts``.

    Starts from labels z0 (0..K0-1) or, without them, with no state: the first sweep is then
    sequential, each record going to the argmin of eq. 6.7 given the ones before it. Each
    iteration is a sweep, then the kappa step. When an iteration stalls (no record moved or E fell
    by less than ``tol * |E|``), Viterbi re-segmentation, merges and splits are tried in turn;
    the run ends when none of them lowers E.
    """
    t0 = time.perf_counter()
    N = Xa.shape[0]
    if z0 is None:
        z = np.full(N, -1, dtype=np.int64)
        st = empty_state(family)
    else:
        z = np.asarray(z0, dtype=np.int64).copy()
        K0 = int(z.max()) + 1
        st = state_from_labels(
            Xa, z, starts, K0, family, np.full(K0, 1.0 / (K0 + 1)), 1.0 / (K0 + 1)
        )
        st = compact(z, st.stats, st.nk, st.trans, st.start, st.kappa, st.ku, K0)
    history: list[float] = []
    e_old = math.inf
    converged = False
    it = 0
    for it in range(1, max_iter + 1):
        st, n_changed = sweep_state(Xa, starts, z, st, family, alpha, gamma, False, rng_state)
        e_new = st.objective(family, alpha, gamma)
        cand = kappa_step(st, alpha, gamma, m_counts, rng_state)
        e_cand = cand.objective(family, alpha, gamma)
        if m_counts == "urn" or e_cand <= e_new:
            st, e_new = cand, e_cand
        stalled = n_changed == 0 or e_old - e_new < tol * abs(e_new)
        if stalled and moves:
            st, e_new, moved = viterbi_move(Xa, starts, z, st, family, alpha, gamma, e_new)
            if not moved:
                st, e_new, moved = merge_round(z, st, family, alpha, gamma, e_new)
            if not moved:
                st, e_new, moved = split_round(Xa, starts, z, st, family, alpha, gamma, e_new)
            stalled = not moved
        history.append(e_new)
        if callback is not None:
            callback(it, e_new, st.n_states)
        if stalled:
            converged = True
            break
        e_old = e_new
    return IhmmResult(
        labels=z,
        state=st,
        objective=history[-1],
        history=history,
        n_iter=it,
        converged=converged,
        seconds=time.perf_counter() - t0,
    )


def gibbs_step_kappa(
    st: HmmState,
    alpha: float,
    gamma: float,
    rng_state: NDArray[np.uint64],
    rng: np.random.Generator,
) -> HmmState:
    """The kappa step of the Gibbs sampler: table counts m_pk by the Polya urn (eq. 6.2), then
    kappa ~ Dirichlet(M_1, ..., M_K, M0) (eq. 6.1)."""
    M = kihmm.table_counts_urn(st.trans, st.start, st.kappa, alpha, rng_state)
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
    """The direct-assignment Gibbs sampler of seed 000 Section 6.1 (Teh et al. 2006): each
    sweep draws every z_t from eq. 6.3 (``kernels.ihmm.sweep`` with ``gibbs``), then the table
    counts (eq. 6.2) and kappa (eq. 6.1). Starts from one state; ``callback(i, z, state)``
    sees the labels (0..K-1) and state after every sweep. Returns the last labels and state."""
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
