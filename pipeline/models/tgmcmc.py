"""The samplers of Lee and Choi 2015 over leaf summaries, as running chains, and summaries of their
samples.

``Chain`` is one running chain of one of three samplers of partitions of leaves under a DP or NGGP
mixture (the estimator is ``pipeline.estimators.tgmcmc.TreeGuidedMCMC``): tree-guided MCMC
(``kernels.tgmcmc``), the marginal Gibbs sampler and Jain and Neal's restricted Gibbs split-merge
sampler, the two references (``kernels.samplers``). ``effective_sample_size`` and
``coclustering`` summarise the chains' output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import sparse

from kernels import samplers as sampler_kernels
from kernels import tgmcmc as tg_kernels
from pipeline.families import ProductFamily

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def effective_sample_size(x: ArrayLike) -> float:
    """Effective sample size of a scalar chain: n / tau with tau = -1 + 2 sum_k Gamma_k, Geyer's
    initial monotone sequence estimator over sums of adjacent autocorrelations
    Gamma_k = rho_{2k} + rho_{2k+1} (autocorrelations by FFT). A constant chain returns n."""
    a = np.asarray(x, dtype=np.float64).ravel()
    n = a.shape[0]
    if n < 4:
        return float(n)
    a = a - a.mean()
    var = float(np.dot(a, a)) / n
    if var <= 0.0:
        return float(n)
    f = np.fft.rfft(a, 2 * n)
    acov = np.fft.irfft(f * np.conj(f), 2 * n)[:n] / n
    rho = acov / acov[0]
    total = 0.0
    prev = np.inf
    for k in range(n // 2):
        g = float(rho[2 * k] + rho[2 * k + 1])
        if g <= 0.0:
            break
        g = min(g, prev)
        total += g
        prev = g
    tau = max(-1.0 + 2.0 * total, 1.0 / n)
    return float(n / tau)


def coclustering(samples: IntArray) -> FloatArray:
    """Fraction of samples (n_samples, L) in which leaves i and j share a cluster, (L, L)."""
    samples = np.asarray(samples, dtype=np.int64)
    n_s, L = samples.shape
    if n_s == 0:
        return np.eye(L)
    uniq, counts = np.unique(samples, axis=0, return_counts=True)
    rows: list[IntArray] = []
    cols: list[IntArray] = []
    vals: list[FloatArray] = []
    offset = 0
    for z, c in zip(uniq, counts):
        rows.append(np.arange(L, dtype=np.int64))
        cols.append(offset + z)
        vals.append(np.full(L, math.sqrt(c / n_s)))
        offset += int(z.max()) + 1
    Z = sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(L, offset)
    )
    out = np.asarray((Z @ Z.T).toarray(), dtype=np.float64)
    np.fill_diagonal(out, 1.0)
    return out


@dataclass
class ChainSettings:
    """Sampler settings handed to the kernels."""

    method: str
    G: int
    D: int
    n_local: int
    moves: str
    n_launch: int
    n_u_steps: int
    max_depth: int
    local_tree: bool
    tree: str
    stoc_new: bool
    tree_d: bool
    redraw: bool


class Chain:
    """One running chain of one of the three samplers (kernel state plus counters)."""

    def __init__(
        self,
        cfg: ChainSettings,
        stats: FloatArray,
        lm: FloatArray,
        z0: IntArray,
        pp: FloatArray,
        prod: ProductFamily,
        u0: float,
        rank: IntArray,
        state: NDArray[np.uint64],
    ) -> None:
        self.cfg = cfg
        self.method = cfg.method
        self.stats = stats
        self.pp = pp
        self.prod = prod
        self.state = state
        self.acc = np.zeros((3, 4))
        self.L = stats.shape[0]
        if self.method == "tgmcmc":
            self.fu = np.array([u0])
            self.P = (stats, lm, rank.copy(), pp, prod.spec, prod.prior)
            kind = tg_kernels.CASCADE if cfg.tree == "cascade" else tg_kernels.SEQINSERT
            self.kcfg = np.array(
                [
                    cfg.D,
                    cfg.max_depth,
                    int(cfg.local_tree),
                    kind,
                    int(cfg.stoc_new),
                    int(cfg.tree_d),
                    int(cfg.redraw),
                ],
                dtype=np.int64,
            )
            self.F, self.C = tg_kernels.init_chain(stats, lm, z0, prod.spec, prod.prior)
        else:
            self.fu = np.array([u0])
            self.lm = lm
            self.slots = sampler_kernels.init_slots(stats, z0, prod.spec, prod.prior)

    def run(
        self,
        n_iter: int,
        record_from: int,
        thin: int,
        out_z: IntArray,
        out_lj: FloatArray,
        out_K: IntArray,
        out_u: FloatArray,
    ) -> float:
        c = self.cfg
        if self.method == "tgmcmc":
            return float(
                tg_kernels.run(
                    self.C, self.F, self.P, self.state, self.fu, self.kcfg, n_iter, c.G,
                    c.n_local, c.moves != "local", c.moves != "global", c.n_u_steps,
                    record_from, thin, out_z, out_lj, out_K, out_u, self.acc,
                )
            )  # fmt: skip
        z, cst, clm, cnl = self.slots
        p = self.prod
        n_sm = c.G if self.method == "split-merge" else 0
        do_gibbs = self.method == "gibbs" or c.moves == "all"
        return float(
            sampler_kernels.run(
                z, cst, clm, cnl, self.stats, self.lm, self.state, self.fu, self.pp, p.spec,
                p.prior, n_iter, n_sm, c.n_launch, do_gibbs, c.n_u_steps, record_from,
                thin, out_z, out_lj, out_K, out_u, self.acc,
            )
        )  # fmt: skip
