"""MAP-iHMM (Raykov et al. 2016, Section 6.2) in memory: its moves over states, its run, and the
restarts and tempering that ``MAPiHMM`` and the ``ihmm`` engine's sample start share
(``fit_map_ihmm``).

Every step of ``run_map_ihmm`` is taken only when E(z, kappa) (``kernels.ihmm.objective``) does
not rise: the sweeps (eq. 6.7), the kappa step (eq. 6.6, an EM step, checked all the same since
the mode is floored), Viterbi re-segmentation, and split and merge moves. With
``m_counts="urn"`` the table counts are drawn as in the paper and E fluctuates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from kernels import ihmm as kihmm
from pipeline.core import config
from pipeline.core.diagnose import stop_reason
from pipeline.core.seeds import seed_state
from pipeline.families import FloatArray, ProductFamily
from pipeline.models.ihmm import (
    HmmState,
    IntArray,
    compact,
    decode,
    empty_state,
    kappa_step,
    state_from_labels,
    sweep_state,
    temper_of,
)


@dataclass(frozen=True)
class Problem:
    """What every move of a run sees: the arranged records (N, D) of the sequences ``starts``
    (n_seq + 1,) and the model, emissions ``family``, N0, M0 and the emission weight w."""

    Xa: FloatArray
    starts: IntArray
    family: ProductFamily
    alpha: float
    gamma: float
    temper: float = 1.0

    def objective(self, st: HmmState) -> float:
        return st.objective(self.family, self.alpha, self.gamma, self.temper)


def relabel(pr: Problem, path: IntArray, st: HmmState) -> tuple[IntArray, HmmState]:
    """The compact state of Viterbi paths decoded under ``st`` (path K: one new state, taking
    its share of kappa_{K+1}); states left empty give their weight back to kappa_{K+1}."""
    kappa, ku = st.kappa, st.ku
    if np.any(path == st.n_states):
        b = kihmm.b_new_of(pr.gamma)
        kappa = np.append(kappa, b * ku)
        ku = (1.0 - b) * ku
    cand = state_from_labels(pr.Xa, path, pr.starts, kappa.shape[0], pr.family, kappa, ku)
    z_new = path.copy()
    cand = replace(cand, ku=cand.ku + float(cand.kappa[cand.nk == 0].sum()))
    return z_new, compact(z_new, cand)


def viterbi_move(
    pr: Problem, z: IntArray, st: HmmState, e_now: float, n_rounds: int = 3
) -> tuple[HmmState, float, bool]:
    """Re-segment every sequence by Viterbi under the MAP model (``decode``), ``n_rounds`` times
    (each round decodes under the parameters of the last); taken if E falls below ``e_now``."""
    cand, z_new = st, z
    for _ in range(n_rounds):
        path, _best = decode(pr.Xa, pr.starts, cand, pr.family, pr.alpha, pr.temper)
        if np.array_equal(path, z_new):
            break
        z_new, cand = relabel(pr, path, cand)
    if cand is st:
        return st, e_now, False
    e_new = pr.objective(cand)
    if e_new < e_now - 1e-9 * abs(e_now):
        z[:] = z_new
        return cand, e_new, True
    return st, e_now, False


def merge_states(st: HmmState, a: int, b: int) -> HmmState:
    """States a and b (a < b) as one: statistics, counts and weights add; b's row dropped."""
    stats, trans, start, kappa = st.stats.copy(), st.trans.copy(), st.start.copy(), st.kappa.copy()
    stats[a] += stats[b]
    trans[a] += trans[b]
    trans[:, a] += trans[:, b]
    start[a] += start[b]
    kappa[a] += kappa[b]
    return HmmState(stats, trans, start, kappa, st.ku).take(np.arange(st.n_states) != b)


def greedy_merges(
    st: HmmState,
    family: ProductFamily,
    alpha: float,
    gamma: float,
    e_now: float,
    temper: float = 1.0,
) -> tuple[HmmState, float, IntArray]:
    """Greedy merges of the pair of states that lowers E most, while one does. Returns the new
    state, its E and ``target`` (K,): the new number of each old state."""
    target = np.arange(st.n_states, dtype=np.int64)
    while st.n_states > 1:
        stats = st.stats if temper == 1.0 else temper * st.stats
        deltas = kihmm.merge_deltas(
            stats, st.trans, st.start, st.kappa, family.spec, family.prior, alpha, gamma
        )
        a, b = np.unravel_index(int(np.argmin(deltas)), deltas.shape)
        if not deltas[a, b] < -1e-9 * abs(e_now):
            break
        cand = merge_states(st, int(a), int(b))
        e = cand.objective(family, alpha, gamma, temper)
        if not e < e_now:
            break
        st, e_now = cand, e
        target[target == b] = a
        target[target > b] -= 1
    return st, e_now, target


def merge_round(
    pr: Problem, z: IntArray, st: HmmState, e_now: float
) -> tuple[HmmState, float, bool]:
    """``greedy_merges`` with the labels z relabelled in place."""
    K = st.n_states
    st, e_now, target = greedy_merges(st, pr.family, pr.alpha, pr.gamma, e_now, pr.temper)
    if st.n_states == K:
        return st, e_now, False
    z[:] = target[z]
    return st, e_now, True


def two_means(P: FloatArray, w: FloatArray, n_iter: int = 20) -> IntArray | None:
    """Weighted 2-means of points P (n, D), weights w (n,), from the principal axis; or None."""
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
    """A proposal to split state k in two by weighted 2-means of its runs' means (so that runs
    of two overlapping emissions split along time); a state of one run splits its records.
    Returns (members, side) or None."""
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
    pr: Problem, z: IntArray, st: HmmState, e_now: float
) -> tuple[HmmState, float, bool]:
    """Try to split every state in two (``split_labels``, then Viterbi under the K + 1 states);
    each split is taken if E falls."""
    moved = False
    for k in range(st.n_states):
        proposal = split_labels(pr.Xa, pr.starts, z, k)
        if proposal is None:
            continue
        members, side = proposal
        K = st.n_states
        z_new = z.copy()
        z_new[members[side == 1]] = K
        share = float(side.sum()) / members.shape[0]
        kappa = np.append(st.kappa, st.kappa[k] * share)
        kappa[k] *= 1.0 - share
        cand = state_from_labels(pr.Xa, z_new, pr.starts, K + 1, pr.family, kappa, st.ku)
        cand, e, _ = viterbi_move(pr, z_new, cand, pr.objective(cand))
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
    temper: float = 1.0,
) -> IhmmResult:
    """MAP-iHMM (Raykov et al. 2016, Section 6.2) on arranged records of the sequences ``starts``.

    Starts from labels z0, or with no state (a sequential first sweep). Each iteration is a sweep
    then the kappa step; when one stalls (by ``tol``), Viterbi re-segmentation, merges and splits
    are tried in turn, and the run ends when none lowers E (tempered by ``temper``).
    """
    t0 = time.perf_counter()
    pr = Problem(Xa, starts, family, alpha, gamma, temper)
    if z0 is None:
        z = np.full(Xa.shape[0], -1, dtype=np.int64)
        st = empty_state(family)
    else:
        z = np.asarray(z0, dtype=np.int64).copy()
        K0 = int(z.max()) + 1
        w0 = 1.0 / (K0 + 1)
        st = compact(z, state_from_labels(Xa, z, starts, K0, family, np.full(K0, w0), w0))
    history: list[float] = []
    e_old = math.inf
    stalled = False
    it = 0
    for it in range(1, max_iter + 1):
        st, n_changed = sweep_state(
            Xa, starts, z, st, family, alpha, gamma, False, rng_state, temper
        )
        e_new = pr.objective(st)
        cand = kappa_step(st, alpha, gamma, m_counts, rng_state)
        e_cand = pr.objective(cand)
        if m_counts == "urn" or e_cand <= e_new:
            st, e_new = cand, e_cand
        stalled = stop_reason(e_old, e_new, n_changed, tol) is not None
        for move in (viterbi_move, merge_round, split_round) if stalled and moves else ():
            st, e_new, moved = move(pr, z, st, e_new)
            if moved:
                stalled = False
                break
        history.append(e_new)
        if callback is not None:
            callback(it, e_new, st.n_states)
        if stalled:
            break
        e_old = e_new
    return IhmmResult(z, st, history[-1], history, it, stalled, time.perf_counter() - t0)


def random_segments(starts: IntArray, rng: np.random.Generator, k0: int = 10) -> IntArray:
    """A restart's random start: geometric stretches (mean 20) labelled among ``k0`` states."""
    z = np.empty(int(starts[-1]), dtype=np.int64)
    for s in range(starts.shape[0] - 1):
        t = int(starts[s])
        while t < starts[s + 1]:
            n = int(rng.geometric(1.0 / 20.0))
            z[t : min(t + n, int(starts[s + 1]))] = rng.integers(k0)
            t += n
    return np.unique(z, return_inverse=True)[1].astype(np.int64)


def fit_map_ihmm(
    Xa: FloatArray,
    starts: IntArray,
    family: ProductFamily,
    alpha: float,
    gamma: float,
    seq: np.random.SeedSequence,
    temper: str | float = config.IHMM_TEMPER,
    n_restarts: int = 1,
    max_iter: int = config.IHMM_MAX_ITER,
    tol: float = config.IHMM_TOL,
    m_counts: str = config.IHMM_M_COUNTS,
    moves: bool = True,
    verbose: bool = False,
) -> tuple[IhmmResult, list[float], float, float]:
    """MAP-iHMM's restarts and tempering, the policy of ``MAPiHMM.fit`` and of the ``ihmm``
    engine's sample start.

    ``n_restarts`` runs of ``run_map_ihmm`` (the first sequential, the others from
    ``random_segments``); the lowest objective wins. ``temper="auto"``: w = 1 first, then w and
    rho from the winner's states (``temper_of``) and, where w < 1, the restarts again with w, the
    first from the untempered winner's states merged under w (``greedy_merges``) instead of a
    sequential sweep. rho is measured once, on the untempered states: the coarser tempered ones
    would count the states' own persistence as autocorrelation. The merges come first because a
    tempered sweep costs O(K) log marginals per record against the untempered sweep's cached
    predictives: sweeping the untempered K states (64 on 80 sensor-like recordings) cost three
    times the run that merged first, and the sequential tempered run never won.

    Returns
    -------
    best : IhmmResult
    objectives : list of float
        Every run's objective with the final w.
    w, rho : float
        The emission weight and the rho it was measured from (NaN: not measured).
    """

    def runs(w: float, z_first: IntArray | None) -> tuple[IhmmResult, list[float]]:
        best: IhmmResult | None = None
        objectives = []
        for r, child in enumerate(seq.spawn(n_restarts)):
            z0 = z_first
            if r > 0:
                z0 = random_segments(starts, np.random.default_rng(child))
            cb = None
            if verbose:

                def cb(it: int, e: float, k: int, r: int = r) -> None:
                    print(
                        f"restart {r} (temper {w:.3g}) iteration {it}: objective {e:.6g}, "
                        f"{k} states"
                    )

            res = run_map_ihmm(
                Xa,
                starts,
                family,
                alpha,
                gamma,
                max_iter,
                tol,
                m_counts,
                seed_state(child),
                z0=z0,
                moves=moves,
                callback=cb,
                temper=w,
            )
            objectives.append(res.objective)
            if best is None or res.objective < best.objective:
                best = res
        assert best is not None
        return best, objectives

    auto = temper == "auto"
    w = 1.0 if auto else float(temper)
    best, objectives = runs(w, None)
    rho = math.nan
    if auto:
        w, rho = temper_of(Xa, best.labels, starts, family)
        if w < 1.0:
            e = best.state.objective(family, alpha, gamma, w)
            target = greedy_merges(best.state, family, alpha, gamma, e, w)[2]
            best, objectives = runs(w, target[best.labels])
    return best, objectives, w, rho
