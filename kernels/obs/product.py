"""The product family: a record's columns split into groups, one conjugate family each.

Log terms add across groups (docs/families.md). A product is described by

``spec`` : int64, int32 or int16 ndarray of shape (G, 9)
    A row per group: family code, first column, number of columns, then (offset, length) of its
    slice of the statistics row, the prior and the cache row. Its type is the set of families
    compiled (below): int32 the Gaussians (Normal-Wishart without cells, Normal-Gamma), int16
    Normal-Wishart, int64 any.
``prior`` : float64 ndarray of shape (P,)
    The groups' prior arrays, concatenated.

A cluster is a row of ``stats`` (K, S) and of ``cache`` (K, C); ``stats[k, 0]`` is its size.
Besides ``kernels.obs``' contract for a whole row, the observation model's part of every score:
``log_marginals``, ``log_marginal_gap``, ``build_stats`` and ``moments``.
"""

import numpy as np
from numba import njit, types
from numba.extending import overload

from kernels.arrays import copy_rows, copy_vector
from kernels.obs import (
    beta_binomial,
    categorical,
    exponential_gamma,
    gaussian_nw,
    geometric_beta,
    normal_gamma,
    poisson_gamma,
)
from kernels.obs._common import COUNT_TABLE as COUNT_TABLE
from kernels.obs._common import count_sum_moments

GAUSSIAN_NW = 0
NORMAL_GAMMA = 1
CATEGORICAL = 2
POISSON_GAMMA = 3
BETA_BINOMIAL = 4
EXPONENTIAL_GAMMA = 5
GEOMETRIC_BETA = 6

# columns of a spec row
CODE, COL0, NCOL, STAT0, NSTAT, PRIOR0, NPRIOR, CACHE0, NCACHE = range(9)


@njit(cache=True, nogil=True)
def _span(a, start, length):
    """a[start : start + length], a group's slice (values, not the columns' constants: those
    would be literal types, a specialisation each)."""
    return a[start : start + length]


@njit(cache=True, nogil=True)
def _views(g, x, s, c, spec, prior):
    r = spec[g]
    return (
        _span(x, r[COL0], r[NCOL]),
        _span(s, r[STAT0], r[NSTAT]),
        _span(c, r[CACHE0], r[NCACHE]),
        _span(prior, r[PRIOR0], r[NPRIOR]),
    )


# -- one group: ``_any_*`` dispatch on the family code over every family -----------------------
@njit(cache=True, nogil=True)
def _any_add_stats(code, xg, sg, w):
    if code == GAUSSIAN_NW:
        gaussian_nw.add_stats(xg, sg, w)
    elif code == NORMAL_GAMMA:
        normal_gamma.add_stats(xg, sg, w)
    elif code == CATEGORICAL:
        categorical.add_stats(xg, sg, w)
    elif code == POISSON_GAMMA:
        poisson_gamma.add_stats(xg, sg, w)
    elif code == BETA_BINOMIAL:
        beta_binomial.add_stats(xg, sg, w)
    elif code == EXPONENTIAL_GAMMA:
        exponential_gamma.add_stats(xg, sg, w)
    else:
        geometric_beta.add_stats(xg, sg, w)


@njit(cache=True, nogil=True)
def _any_refresh(code, sg, cg, pg):
    if code == GAUSSIAN_NW:
        gaussian_nw.refresh(sg, cg, pg, True)
    elif code == NORMAL_GAMMA:
        normal_gamma.refresh(sg, cg, pg)
    elif code == CATEGORICAL:
        categorical.refresh(sg, cg, pg)
    elif code == POISSON_GAMMA:
        poisson_gamma.refresh(sg, cg, pg)
    elif code == BETA_BINOMIAL:
        beta_binomial.refresh(sg, cg, pg)
    elif code == EXPONENTIAL_GAMMA:
        exponential_gamma.refresh(sg, cg, pg)
    else:
        geometric_beta.refresh(sg, cg, pg)


@njit(cache=True, nogil=True)
def _any_update(code, xg, sg, cg, pg, w):
    if code == GAUSSIAN_NW:
        gaussian_nw.update(xg, sg, cg, pg, w, True)
    elif code == CATEGORICAL:
        categorical.update(xg, sg, cg, pg, w)
    else:
        # the other families' caches are rebuilt from the statistics, O(d) or O(d T)
        _any_add_stats(code, xg, sg, w)
        _any_refresh(code, sg, cg, pg)


@njit(cache=True, nogil=True)
def _any_log_predictive(code, xg, sg, cg, pg):
    if code == GAUSSIAN_NW:
        return gaussian_nw.log_predictive(xg, sg, cg, pg)
    elif code == NORMAL_GAMMA:
        return normal_gamma.log_predictive(xg, sg, cg, pg)
    elif code == CATEGORICAL:
        return categorical.log_predictive(xg, sg, cg, pg)
    elif code == POISSON_GAMMA:
        return poisson_gamma.log_predictive(xg, sg, cg, pg)
    elif code == BETA_BINOMIAL:
        return beta_binomial.log_predictive(xg, sg, cg, pg)
    elif code == EXPONENTIAL_GAMMA:
        return exponential_gamma.log_predictive(xg, sg, cg, pg)
    return geometric_beta.log_predictive(xg, sg, cg, pg)


@njit(cache=True, nogil=True)
def _any_moments(code, sg, pg, mean, cov):
    if code == GAUSSIAN_NW:
        gaussian_nw.moments(sg, pg, mean, cov)
    elif code == NORMAL_GAMMA:
        normal_gamma.moments(sg, pg, mean, cov)
    elif code == CATEGORICAL:
        categorical.moments(sg, pg, mean, cov)
    elif code == BETA_BINOMIAL:
        beta_binomial.moments(sg, pg, mean, cov)
    else:
        # Poisson, exponential and geometric statistics determine the means only
        count_sum_moments(sg, pg, mean, cov)


@njit(cache=True, nogil=True)
def _any_log_marginal(code, sg, pg):
    if code == GAUSSIAN_NW:
        return gaussian_nw.log_marginal(sg, pg)
    elif code == NORMAL_GAMMA:
        return normal_gamma.log_marginal(sg, pg)
    elif code == CATEGORICAL:
        return categorical.log_marginal(sg, pg)
    elif code == POISSON_GAMMA:
        return poisson_gamma.log_marginal(sg, pg)
    elif code == BETA_BINOMIAL:
        return beta_binomial.log_marginal(sg, pg)
    elif code == EXPONENTIAL_GAMMA:
        return exponential_gamma.log_marginal(sg, pg)
    return geometric_beta.log_marginal(sg, pg)


# -- the family set as a type: numba compiles per type, so the ``_group_*`` overloads pick on
# the code's integer type: int32 (``GAUSSIAN_DTYPE``) the two Gaussian families, Normal-Wishart
# without the recording cells' code and Normal-Gamma (``_gauss_*``: a full and a diagonal
# covariance share one compiled sweep), int16 (``NW_CELLS_DTYPE``, offsets below about 170
# columns) Normal-Wishart with the cells' code, int64 (``ANY_DTYPE``) the ``_any_*`` chains over
# all seven families; the int32 and int16 kernels hold the packed Normal-Wishart paths
# (``nw_paths``), the int64 ones none.
GAUSSIAN_DTYPE = np.int32
ANY_DTYPE = np.int64
NW_CELLS_DTYPE = np.int16


def _gaussian(code):
    """Whether the numba type ``code`` is an int32 spec's."""
    return isinstance(code, types.Integer) and code.bitwidth == 32


def _nw_cells(code):
    """Whether the numba type ``code`` is an int16 spec's."""
    return isinstance(code, types.Integer) and code.bitwidth == 16


def _nw(code):
    """Either spec whose kernels hold the Normal-Wishart paths."""
    return _gaussian(code) or _nw_cells(code)


def nw_paths(spec):
    """True for an int32 or int16 spec, None for int64: a kernel's packed Normal-Wishart paths
    under ``if nw is not None`` (numba drops a branch on a None argument untyped; jit only)."""
    raise NotImplementedError("jit only")


@overload(nw_paths, jit_options={"nogil": True}, inline="always")
def _ol_nw_paths(spec):
    return (lambda spec: True) if _nw(spec.dtype) else (lambda spec: None)


def gauss_paths(spec):
    """True for an int32 spec, None otherwise: ``nw_paths`` for the paths of a Normal-Wishart
    group without cells only (jit only)."""
    raise NotImplementedError("jit only")


@overload(gauss_paths, jit_options={"nogil": True}, inline="always")
def _ol_gauss_paths(spec):
    return (lambda spec: True) if _gaussian(spec.dtype) else (lambda spec: None)


# -- one group of an int32 spec: Normal-Wishart (no cells) or Normal-Gamma --------------------
@njit(cache=True, nogil=True)
def _gauss_add_stats(code, xg, sg, w):
    if code == GAUSSIAN_NW:
        gaussian_nw.add_stats(xg, sg, w)
    else:
        normal_gamma.add_stats(xg, sg, w)


@njit(cache=True, nogil=True)
def _gauss_refresh(code, sg, cg, pg):
    if code == GAUSSIAN_NW:
        gaussian_nw.refresh(sg, cg, pg)
    else:
        normal_gamma.refresh(sg, cg, pg)


@njit(cache=True, nogil=True)
def _gauss_update(code, xg, sg, cg, pg, w):
    if code == GAUSSIAN_NW:
        gaussian_nw.update(xg, sg, cg, pg, w)
    else:
        normal_gamma.add_stats(xg, sg, w)
        normal_gamma.refresh(sg, cg, pg)


@njit(cache=True, nogil=True)
def _gauss_log_predictive(code, xg, sg, cg, pg):
    if code == GAUSSIAN_NW:
        return gaussian_nw.log_predictive(xg, sg, cg, pg)
    return normal_gamma.log_predictive(xg, sg, cg, pg)


@njit(cache=True, nogil=True)
def _gauss_moments(code, sg, pg, mean, cov):
    if code == GAUSSIAN_NW:
        gaussian_nw.moments(sg, pg, mean, cov)
    else:
        normal_gamma.moments(sg, pg, mean, cov)


@njit(cache=True, nogil=True)
def _gauss_log_marginal(code, sg, pg):
    if code == GAUSSIAN_NW:
        return gaussian_nw.log_marginal(sg, pg)
    return normal_gamma.log_marginal(sg, pg)


def _group_add_stats(code, xg, sg, w):
    """s_g += w g(x_g) for group family ``code`` (jit only: resolved when numba types a caller)."""
    raise NotImplementedError("jit only")


@overload(_group_add_stats, jit_options={"nogil": True}, inline="always")
def _ol_group_add_stats(code, xg, sg, w):
    if _gaussian(code):
        return lambda code, xg, sg, w: _gauss_add_stats(code, xg, sg, w)
    if _nw_cells(code):
        return lambda code, xg, sg, w: gaussian_nw.add_stats(xg, sg, w)
    return lambda code, xg, sg, w: _any_add_stats(code, xg, sg, w)


def _group_refresh(code, sg, cg, pg):
    """The group's cache from its statistics (jit only)."""
    raise NotImplementedError("jit only")


@overload(_group_refresh, jit_options={"nogil": True}, inline="always")
def _ol_group_refresh(code, sg, cg, pg):
    if _gaussian(code):
        return lambda code, sg, cg, pg: _gauss_refresh(code, sg, cg, pg)
    if _nw_cells(code):
        return lambda code, sg, cg, pg: gaussian_nw.refresh(sg, cg, pg, True)
    return lambda code, sg, cg, pg: _any_refresh(code, sg, cg, pg)


def _group_update(code, xg, sg, cg, pg, w):
    """Add (w = +1) or remove (w = -1) x_g: statistics and cache (jit only)."""
    raise NotImplementedError("jit only")


@overload(_group_update, jit_options={"nogil": True}, inline="always")
def _ol_group_update(code, xg, sg, cg, pg, w):
    if _gaussian(code):
        return lambda code, xg, sg, cg, pg, w: _gauss_update(code, xg, sg, cg, pg, w)
    if _nw_cells(code):
        return lambda code, xg, sg, cg, pg, w: gaussian_nw.update(xg, sg, cg, pg, w, True)
    return lambda code, xg, sg, cg, pg, w: _any_update(code, xg, sg, cg, pg, w)


def _group_log_predictive(code, xg, sg, cg, pg):
    """log p(x_g | X_g) of the group (jit only)."""
    raise NotImplementedError("jit only")


@overload(_group_log_predictive, jit_options={"nogil": True}, inline="always")
def _ol_group_log_predictive(code, xg, sg, cg, pg):
    if _gaussian(code):
        return lambda code, xg, sg, cg, pg: _gauss_log_predictive(code, xg, sg, cg, pg)
    if _nw_cells(code):
        return lambda code, xg, sg, cg, pg: gaussian_nw.log_predictive(xg, sg, cg, pg)
    return lambda code, xg, sg, cg, pg: _any_log_predictive(code, xg, sg, cg, pg)


def _nw_loo(code, xg, sg, cg, pg):
    """``gaussian_nw.log_predictive_loo``, with the cells' code unless int32 (jit only)."""
    raise NotImplementedError("jit only")


@overload(_nw_loo, jit_options={"nogil": True}, inline="always")
def _ol_nw_loo(code, xg, sg, cg, pg):
    if _gaussian(code):
        return lambda code, xg, sg, cg, pg: gaussian_nw.log_predictive_loo(xg, sg, cg, pg)
    return lambda code, xg, sg, cg, pg: gaussian_nw.log_predictive_loo(xg, sg, cg, pg, True)


def _group_moments(code, sg, pg, mean, cov):
    """The group's block of the moments (jit only)."""
    raise NotImplementedError("jit only")


@overload(_group_moments, jit_options={"nogil": True}, inline="always")
def _ol_group_moments(code, sg, pg, mean, cov):
    if _gaussian(code):
        return lambda code, sg, pg, mean, cov: _gauss_moments(code, sg, pg, mean, cov)
    if _nw_cells(code):
        return lambda code, sg, pg, mean, cov: gaussian_nw.moments(sg, pg, mean, cov)
    return lambda code, sg, pg, mean, cov: _any_moments(code, sg, pg, mean, cov)


def _group_log_marginal(code, sg, pg):
    """log p(X_g) of the group (jit only)."""
    raise NotImplementedError("jit only")


@overload(_group_log_marginal, jit_options={"nogil": True}, inline="always")
def _ol_group_log_marginal(code, sg, pg):
    if _gaussian(code):
        return lambda code, sg, pg: _gauss_log_marginal(code, sg, pg)
    if _nw_cells(code):
        return lambda code, sg, pg: gaussian_nw.log_marginal(sg, pg)
    return lambda code, sg, pg: _any_log_marginal(code, sg, pg)


# -- a whole record / cluster row -----------------------------------------------------------------
@njit(cache=True, nogil=True)
def add_stats(x, s, spec, w):
    """s += w * g(x) for every group. x: (D,) record, s: (S,) statistics row."""
    for g in range(spec.shape[0]):
        r = spec[g]
        _group_add_stats(r[CODE], _span(x, r[COL0], r[NCOL]), _span(s, r[STAT0], r[NSTAT]), w)


@njit(cache=True, nogil=True)
def refresh(s, c, spec, prior):
    """Recompute the cache row c (C,) from the statistics row s (S,)."""
    for g in range(spec.shape[0]):
        r = spec[g]
        _group_refresh(
            r[CODE],
            _span(s, r[STAT0], r[NSTAT]),
            _span(c, r[CACHE0], r[NCACHE]),
            _span(prior, r[PRIOR0], r[NPRIOR]),
        )


@njit(cache=True, nogil=True)
def update(x, s, c, spec, prior, w):
    """Add (w = +1) or remove (w = -1) record x (D,) from a cluster: statistics and cache."""
    if spec.shape[0] == 1:
        # one group spans the whole row: its kernel on the row, without the views (whose
        # slices and calls cost several times a diagonal group's own work)
        _group_update(spec[0, CODE], x, s, c, prior, w)
        return
    for g in range(spec.shape[0]):
        xg, sg, cg, pg = _views(g, x, s, c, spec, prior)
        _group_update(spec[g, CODE], xg, sg, cg, pg, w)


@njit(cache=True, nogil=True)
def log_predictive(x, s, c, spec, prior):
    """log p(x | X_k) of record x (D,) under the cluster with statistics s and cache c."""
    if spec.shape[0] == 1:
        # the hot path of a sweep: one group spans the whole row, so no views (a diagonal
        # group's predictive took 8 times as long through them)
        code = spec[0, CODE]
        if code == GAUSSIAN_NW:
            return gaussian_nw.log_predictive(x, s, c, prior)
        if code == NORMAL_GAMMA:
            return normal_gamma.log_predictive(x, s, c, prior)
        return _group_log_predictive(code, x, s, c, prior)
    out = 0.0
    for g in range(spec.shape[0]):
        xg, sg, cg, pg = _views(g, x, s, c, spec, prior)
        out += _group_log_predictive(spec[g, CODE], xg, sg, cg, pg)
    return out


@njit(cache=True, nogil=True)
def log_predictive_loo(x, s, c, spec, prior, scratch_s, scratch_c):
    """log p(x | X_k without x) of a member x of (s, c): closed forms for the Normal-Wishart
    and beta-binomial groups, the others on a copy in scratch_s (>= S,) and scratch_c (>= C,)."""
    if spec.shape[0] == 1 and spec[0, CODE] == GAUSSIAN_NW:
        v = _nw_loo(spec[0, CODE], x, s, c, prior)
        if v == v:
            return v
    out = 0.0
    for g in range(spec.shape[0]):
        xg, sg, cg, pg = _views(g, x, s, c, spec, prior)
        code = spec[g, CODE]
        if code == GAUSSIAN_NW:
            v = _nw_loo(code, xg, sg, cg, pg)
            if v == v:
                out += v
                continue
        elif code == BETA_BINOMIAL:
            out += beta_binomial.log_predictive_loo(xg, sg, cg, pg)
            continue
        r = spec[g]
        ss = _span(scratch_s, r[STAT0], r[NSTAT])
        cc = _span(scratch_c, r[CACHE0], r[NCACHE])
        copy_vector(ss, sg)
        copy_vector(cc, cg)
        _group_update(code, xg, ss, cc, pg, -1.0)
        out += _group_log_predictive(code, xg, ss, cc, pg)
    return out


@njit(cache=True, nogil=True)
def log_marginal(s, spec, prior):
    """log p(X_k) of the records summarised by the statistics row s (S,)."""
    out = 0.0
    for g in range(spec.shape[0]):
        r = spec[g]
        out += _group_log_marginal(
            r[CODE], _span(s, r[STAT0], r[NSTAT]), _span(prior, r[PRIOR0], r[NPRIOR])
        )
    return out


@njit(cache=True, nogil=True)
def log_marginal_with(scratch, s, t, w, spec, prior):
    """log p(X) of the row s + w t (w = +1 joins the records t summarises, -1 takes them out),
    built in scratch (S,)."""
    for j in range(scratch.shape[0]):
        scratch[j] = s[j] + w * t[j]
    return log_marginal(scratch, spec, prior)


@njit(cache=True, nogil=True)
def log_marginals(stats, spec, prior):
    """log p(X_k) of each statistics row (K, S): ndarray of shape (K,), 0 for an empty row."""
    out = np.empty(stats.shape[0])
    for k in range(stats.shape[0]):
        out[k] = log_marginal(stats[k], spec, prior) if stats[k, 0] > 0.0 else 0.0
    return out


@njit(cache=True, nogil=True)
def log_marginal_gap(sa, sb, lma, lmb, scratch, spec, prior):
    """(log p(X_a u X_b) - lma - lmb, log p(X_a u X_b)): a merge gap's observation part for the
    rows sa, sb (S,) of log marginals lma, lmb; scratch (S,) receives sa + sb."""
    lm_ab = log_marginal_with(scratch, sa, sb, 1.0, spec, prior)
    return lm_ab - lma - lmb, lm_ab


@njit(cache=True, nogil=True)
def build_stats(X, z, K, spec, S):
    """Statistics rows (K, S) of the records X (N, D) labelled z (N,) int64 (< 0: skipped)."""
    stats = np.zeros((K, S))
    for i in range(X.shape[0]):
        k = z[i]
        if k >= 0:
            add_stats(X[i], stats[k], spec, 1.0)
    return stats


@njit(cache=True, nogil=True)
def moments(s, spec, prior, D):
    """mean (D,) and cov (D, D) of the records of the row s (S,), each group's block by its
    family's ``moments`` (``kernels.obs``), NaN where undetermined (across groups too)."""
    mean = np.full(D, np.nan)
    cov = np.full((D, D), np.nan)
    for g in range(spec.shape[0]):
        r = spec[g]
        c0 = r[COL0]
        c1 = c0 + r[NCOL]
        mg = np.empty(r[NCOL])
        cg = np.empty((r[NCOL], r[NCOL]))
        _group_moments(
            r[CODE], _span(s, r[STAT0], r[NSTAT]), _span(prior, r[PRIOR0], r[NPRIOR]), mg, cg
        )
        copy_vector(mean[c0:c1], mg)
        copy_rows(cov[c0:c1, c0:c1], cg)
    return mean, cov
