"""Multivariate Gaussian with a Normal-Wishart prior (Raykov et al. 2016, Appendix B, eqs. B.1-B.2).

theta_0 = (m0, c0, B0, a0): the precision is Wishart with scale B0 and a0 degrees of freedom,
the mean Normal with precision c0 times it. B.1 updates the inverse scale T = B^{-1} additively:

    T_k = B0^{-1} + sum_j x_j x_j^T + c0 m0 m0^T - c_k m_k m_k^T                          (B.1)

Layouts for d columns
---------------------
stats ``s`` (1 + d + d^2): n, sum x (d), sum x x^T (d * d, row major).
prior ``p`` (d + 3 + d^2 + d): m0 (d), c0, a0, log|T0|, T0 = B0^{-1} (d * d), h (d) (the
recording cells' variances, 0: continuous).
cache ``c`` (2 d^2 + 2 d + 4, and d^2 + 2 more with cells): L (d * d, lower Cholesky factor of
T_k + H), m_k (d), U = L^{-1} (d * d, lower), b = U m_k (d), c_k, a_k, log|T_k + H|, the
Student-t constant; with cells V = chol(G_k)^{-1} (d * d; NaN when G_k has no factor), log|G_k|,
log|T_k|. With U a predictive is one triangular product; a record's move changes L and U in
O(d^2) (``_change_factors``), ``refresh`` rebuilds them (d^3 / 2).

The predictive (below B.2) is a Student-t with mu = m, nu = a - d + 1 and precision
Lambda = c nu / (c + 1) B: (x - mu)^T Lambda (x - mu) / nu = c / (c + 1) |L^{-1} (x - m)|^2.

Recorded values (Sheppard's correction): a column recorded on a grid of step q counts each record
with its cell's variance h = q^2 / 12 (H = diag(h) added per record to the scatter, B.1'), so a
cluster sharing one value of a column keeps a bounded density. The predictive stays the ratio of
marginals, a Student-t on T_k + H times (|T_k|^{a_k} / |T_k + H|^{a_k + 1})^{1/2}; an addition
is no longer rank one (the cache is rebuilt), a removal is one on G_k = T_k - H, whose inverse
factor keeps the leave-one-out predictive O(d^2). ``cells``: None (the default) compiles
``refresh``, ``update``, ``log_predictive_loo`` and ``add_record`` without this (the
Normal-Wishart-only kernels of ``kernels.obs.product``), True checks the prior's h at run time.
"""

import math

import numpy as np
from numba import njit

from kernels.arrays import bits_float, float_bits
from kernels.obs._common import add_count_sum
from kernels.special import LOG_PI, lmvgamma, log_gamma_ratio


@njit(cache=True, nogil=True)
def dim_of_stats(s):
    """d from len(s) = 1 + d + d^2."""
    return int(round((math.sqrt(4.0 * s.shape[0] - 3.0) - 1.0) / 2.0))  # noqa: RUF046 (numba)


@njit(cache=True, nogil=True)
def add_stats(x, s, w):
    """s += w * (1, x, x x^T)."""
    d = x.shape[0]
    add_count_sum(x, s, w)
    base = 1 + d
    for i in range(d):
        wxi = w * x[i]
        for j in range(d):
            s[base + i * d + j] += wxi * x[j]


@njit(cache=True, nogil=True)
def posterior_inverse_scale(s, p, T, m):
    """T (d, d) and m (d,) of eq. B.1 (B.1' with cells) from s and p; returns (c_k, a_k)."""
    d = m.shape[0]
    n = s[0]
    c0 = p[d]
    a0 = p[d + 1]
    ck = c0 + n
    for i in range(d):
        m[i] = (c0 * p[i] + s[1 + i]) / ck
    base_s = 1 + d
    base_p = d + 3
    for i in range(d):
        for j in range(d):
            T[i, j] = (
                p[base_p + i * d + j] + s[base_s + i * d + j] + c0 * p[i] * p[j] - ck * m[i] * m[j]
            )
    # symmetrise: the two triangles were computed by the same formula but rounding differs
    for i in range(d):
        for j in range(i):
            v = 0.5 * (T[i, j] + T[j, i])
            T[i, j] = v
            T[j, i] = v
    # B.1': every record's cell variance (module docstring)
    base_h = base_p + d * d
    for i in range(d):
        T[i, i] += n * p[base_h + i]
    return ck, a0 + n


@njit(cache=True, nogil=True)
def has_cells(p, d):
    """Whether a column of the prior p has a recording cell (h > 0, module docstring)."""
    base_h = d + 3 + d * d
    for i in range(d):
        if p[base_h + i] > 0.0:
            return True
    return False


@njit(cache=True, nogil=True)
def cholesky_inplace(A):
    """Lower Cholesky factor of A (d, d) over A, upper triangle 0; False if A is not positive
    definite."""
    d = A.shape[0]
    for j in range(d):
        acc = A[j, j]
        for k in range(j):
            acc -= A[j, k] * A[j, k]
        if not acc > 0.0:
            return False
        ljj = math.sqrt(acc)
        A[j, j] = ljj
        for i in range(j + 1, d):
            acc = A[i, j]
            for k in range(j):
                acc -= A[i, k] * A[j, k]
            A[i, j] = acc / ljj
        for i in range(j):
            A[i, j] = 0.0
    return True


@njit(cache=True, nogil=True)
def _tail(d):
    """Offset of the scalars (c_k, a_k, log|T_k|, constant) in the cache."""
    return 2 * d * d + 2 * d


@njit(cache=True, nogil=True, inline="always")
def _invert_lower(c, src, dst, d):
    """c[dst:dst + d d] = the inverse of the lower-triangular d x d matrix at c[src:]."""
    for j in range(d):
        c[dst + j * d + j] = 1.0 / c[src + j * d + j]
        for i in range(j + 1, d):
            acc = 0.0
            for k in range(j, i):
                acc -= c[src + i * d + k] * c[dst + k * d + j]
            c[dst + i * d + j] = acc / c[src + i * d + i]
        for i in range(j):
            c[dst + i * d + j] = 0.0


@njit(cache=True, nogil=True, inline="always")
def _invert_factor(c, d):
    """U = L^{-1} (lower triangular) and b = U m from the L and m stored in the cache."""
    o = d * d
    u0 = o + d
    _invert_lower(c, 0, u0, d)
    b0 = u0 + d * d
    for i in range(d):
        acc = 0.0
        for j in range(i + 1):
            acc += c[u0 + i * d + j] * c[o + j]
        c[b0 + i] = acc


# reassociation vectorises the quadratic forms (twice as fast at d = 10), NaN and inf stay IEEE
QUAD_FLAGS = {"reassoc", "contract"}


@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS)
def _mahalanobis(x, c, d):
    """|L^{-1} (x - m_k)|^2 = sum_i (sum_{j <= i} U_ij x_j - b_i)^2."""
    u0 = d * d + d
    b0 = u0 + d * d
    q = 0.0
    for i in range(d):
        acc = -c[b0 + i]
        row = u0 + i * d
        for j in range(i + 1):
            acc += c[row + j] * x[j]
        q += acc * acc
    return q


@njit(cache=True, nogil=True)
def _finish_cache(c, d, ck, ak, logdet, logdet_t):
    """U, b and the cache's scalars from its L and m."""
    _invert_factor(c, d)
    _finish_constants(c, d, ck, ak, logdet, logdet_t)


@njit(cache=True, nogil=True)
def _finish_constants(c, d, ck, ak, logdet, logdet_t):
    """The cache's c_k, a_k, log|T_k + H| and Student-t constant (exactly -log|T_k| / 2 in its
    determinant term when H = 0)."""
    o = _tail(d)
    c[o] = ck
    c[o + 1] = ak
    c[o + 2] = logdet
    # Gamma((nu + d) / 2) / Gamma(nu / 2) (pi nu)^(-d / 2) |Lambda|^(1 / 2) with Lambda =
    # c nu / (c + 1) B: the powers of nu cancel
    c[o + 3] = (
        log_gamma_ratio(0.5 * (ak - d + 1.0), d, ck / (ck + 1.0))
        - 0.5 * d * LOG_PI
        - 0.5 * logdet
        + 0.5 * ak * (logdet_t - logdet)
    )


@njit(cache=True, nogil=True)
def refresh(s, c, p, cells=None):
    """The cache from the statistics (``cells``: module docstring)."""
    d = dim_of_stats(s)
    T = np.empty((d, d))
    m = np.empty(d)
    ck, ak = posterior_inverse_scale(s, p, T, m)
    with_cells = False
    if cells is not None:
        with_cells = has_cells(p, d)
    logdet_t = 0.0
    if with_cells:
        # log|T_k|, then G_k = T_k - H (the leave-one-out) and T_k + H
        A = T.copy()
        if not cholesky_inplace(A):
            raise ValueError("Normal-Wishart posterior inverse scale is not positive definite")
        base_h = d + 3 + d * d
        for i in range(d):
            logdet_t += 2.0 * math.log(A[i, i])
        for i in range(d):
            for j in range(d):
                A[i, j] = T[i, j]
            A[i, i] -= p[base_h + i]
            T[i, i] += p[base_h + i]
        _cells_tail(A, c, d, logdet_t)
    if not cholesky_inplace(T):
        raise ValueError("Normal-Wishart posterior inverse scale is not positive definite")
    logdet = 0.0
    for i in range(d):
        logdet += 2.0 * math.log(T[i, i])
        for j in range(d):
            c[i * d + j] = T[i, j]
        c[d * d + i] = m[i]
    _finish_cache(c, d, ck, ak, logdet, logdet_t if with_cells else logdet)


@njit(cache=True, nogil=True, inline="always")
def _cells_tail(G, c, d, logdet_t):
    """The cache's cells section: V = chol(G)^{-1} (G (d, d) overwritten), log|G|, log|T_k|;
    V and log|G| NaN when G has no factor (an empty cluster)."""
    e = _tail(d) + 4
    if not cholesky_inplace(G):
        for i in range(d * d + 1):
            c[e + i] = np.nan
        c[e + d * d + 1] = logdet_t
        return
    logdet_g = 0.0
    for j in range(d):
        logdet_g += 2.0 * math.log(G[j, j])
        c[e + j * d + j] = 1.0 / G[j, j]
        for i in range(j + 1, d):
            acc = 0.0
            for k in range(j, i):
                acc -= G[i, k] * c[e + k * d + j]
            c[e + i * d + j] = acc / G[i, i]
        for i in range(j):
            c[e + i * d + j] = 0.0
    c[e + d * d] = logdet_g
    c[e + d * d + 1] = logdet_t


@njit(cache=True, nogil=True, inline="always")
def _loo_log_ratio(ck, ak, r):
    """(a_k - 1) / 2 log(1 - beta r), beta = c_k / (c_k - 1); NaN unless 1 - beta r > 0."""
    one_minus = 1.0 - (ck / (ck - 1.0)) * r
    if not one_minus > 0.0:
        return np.nan
    return 0.5 * (ak - 1.0) * math.log(one_minus)


@njit(cache=True, nogil=True, inline="always")
def _loo_with_cells(x, c, d):
    """``log_predictive_loo`` under B.1': log|T'| = log|G_k| + log(1 - beta |V (x - m_k)|^2);
    NaN when G_k has no factor or the logarithm's argument is not positive."""
    t = _tail(d)
    e = t + 4
    ck = c[t]
    ak = c[t + 1]
    logdet_g = c[e + d * d]
    if not logdet_g == logdet_g:
        return np.nan
    o = d * d
    r = 0.0
    for i in range(d):
        acc = 0.0
        row = e + i * d
        for j in range(i + 1):
            acc += c[row + j] * (x[j] - c[o + j])
        r += acc * acc
    return loo_cells_constant(c, d) + _loo_log_ratio(ck, ak, r)


@njit(cache=True, nogil=True)
def update(x, s, c, p, w, cells=None):
    """Add (w = +1) or remove (w = -1) record x: statistics and cache, a rank-one change in
    O(d^2) (``_change_factors``), rebuilt in O(d^3) with recording cells."""
    update_with(x, s, c, p, w, np.empty(4 * x.shape[0]), cells, True)


@njit(cache=True, nogil=True)
def update_with(x, s, c, p, w, work, cells=None, factor=True):
    """``update`` with the caller's scratch work (>= 4 d,); factor=False leaves L behind
    (``add_record``)."""
    d = x.shape[0]
    if cells is not None:
        if has_cells(p, d):
            add_stats(x, s, w)
            refresh(s, c, p, cells)
            return
    # bool(): one specialisation for every caller (a literal is a type of its own)
    if _change_factors(x, s, c, w, work, bool(factor)):
        return
    # a removal that leaves T_k nearly singular: rebuilt (refresh's default, not a None: one
    # specialisation)
    add_stats(x, s, w)
    if cells is None:
        refresh(s, c, p)
    else:
        refresh(s, c, p, cells)


@njit(cache=True, nogil=True)
def log_predictive(x, s, c, p):
    """log p(x | X): the multivariate Student-t of Appendix B. O(d^2), no allocation."""
    d = x.shape[0]
    t = _tail(d)
    ck = c[t]
    nu = c[t + 1] - d + 1.0
    q = _mahalanobis(x, c, d)
    return c[t + 3] - 0.5 * (nu + d) * math.log1p(q * ck / (ck + 1.0))


@njit(cache=True, nogil=True)
def tempered_constant(c, d, w):
    """The record-free part of ``tempered_log_predictive`` for the cache c of the weighted
    statistics w S_k (without cells): log Gamma_d((a_k + w) / 2) - log Gamma_d(a_k / 2)
    - w d / 2 log pi + d / 2 log(c_k / (c_k + w)) - w / 2 log|T_k|."""
    t = _tail(d)
    ck = c[t]
    ak = c[t + 1]
    return (
        lmvgamma(0.5 * (ak + w), d)
        - lmvgamma(0.5 * ak, d)
        - 0.5 * w * d * LOG_PI
        + 0.5 * d * math.log(ck / (ck + w))
        - 0.5 * w * c[t + 2]
    )


@njit(cache=True, nogil=True)
def tempered_log_predictive(x, c, w, const):
    """log p(w (S_k + g(x))) - log p(w S_k): record x (d,) joining with weight w the state whose
    weighted statistics w S_k have the cache c (without cells); const = ``tempered_constant``.
    The power likelihood's predictive in O(d^2): a record of weight w changes T_k of eq. B.1
    (Raykov et al. 2016) by the rank-one c_k w / (c_k + w) (x - m_k)(x - m_k)^T (w = 1:
    ``log_predictive``)."""
    d = x.shape[0]
    t = _tail(d)
    ck = c[t]
    q = _mahalanobis(x, c, d)
    return const - 0.5 * (c[t + 1] + w) * math.log1p(q * ck * w / (ck + w))


@njit(cache=True, nogil=True)
def log_marginal(s, p):
    """log p(X) = -n d / 2 log pi + log Gamma_d(a_n / 2) - log Gamma_d(a0 / 2)
    + a0 / 2 log|T0| - a_n / 2 log|T_n| + d / 2 (log c0 - log c_n)."""
    if s[0] == 0.0:
        return 0.0
    d = dim_of_stats(s)
    return log_marginal_with(s, p, np.empty((d, d)), np.empty(d), log_marginal_prior_term(p, d))


@njit(cache=True, nogil=True)
def log_marginal_prior_term(p, d):
    """log Gamma_d(a0 / 2), the term of ``log_marginal`` that depends on the prior only."""
    return lmvgamma(0.5 * p[d + 1], d)


@njit(cache=True, nogil=True)
def log_marginal_with(s, p, T, m, lmv0):
    """``log_marginal`` (the same value) with the caller's scratch T (d, d), m (d,) and
    ``log_marginal_prior_term`` lmv0, for a loop of log marginals."""
    n = s[0]
    if n == 0.0:
        return 0.0
    d = m.shape[0]
    ck, ak = posterior_inverse_scale(s, p, T, m)
    if not cholesky_inplace(T):
        raise ValueError("Normal-Wishart posterior inverse scale is not positive definite")
    logdet = 0.0
    for i in range(d):
        logdet += 2.0 * math.log(T[i, i])
    c0 = p[d]
    a0 = p[d + 1]
    return (
        -0.5 * n * d * LOG_PI
        + lmvgamma(0.5 * ak, d)
        - lmv0
        + 0.5 * a0 * p[d + 2]
        - 0.5 * ak * logdet
        + 0.5 * d * (math.log(c0) - math.log(ck))
    )


@njit(cache=True, nogil=True)
def scatter_logdet(s, p, W, mean):
    """log|S + n H|, S the scatter of s's records about their mean; -inf where singular.
    W (d, d) and mean (d,) are scratch."""
    d = W.shape[0]
    n = s[0]
    if not n > 0.0:
        return -np.inf
    moments(s, p, mean, W)
    base_h = d + 3 + d * d
    for i in range(d):
        for j in range(d):
            W[i, j] *= n
        W[i, i] += n * p[base_h + i]
    if not cholesky_inplace(W):
        return -np.inf
    out = 0.0
    for i in range(d):
        out += 2.0 * math.log(W[i, i])
    return out


@njit(cache=True, nogil=True)
def merged_logdet_lower(sb, sd_b, L, m, ck, logdet, y):
    """A lower bound of log|T_ab| of two clusters merged, in O(d^2): T_ab = (T_a + beta v v^T)
    + (S_b + n_b H) with beta = c_a n_b / (c_a + n_b), v = m_a - mean_b, so by Minkowski's
    determinant inequality |T_ab|^(1/d) >= |T_a + beta v v^T|^(1/d) + |S_b + n_b H|^(1/d).

    Parameters
    ----------
    sb : ndarray of shape (1 + d + d^2,)
        Statistics of cluster b (n_b > 0); sd_b its ``scatter_logdet``.
    L, m : ndarrays of shapes (d, d) and (d,)
        Cluster a's Cholesky factor of T_a and m_a; ck, logdet: c_a and log|T_a|.
    y : ndarray of shape (d,), scratch
    """
    d = m.shape[0]
    nb = sb[0]
    beta = ck * nb / (ck + nb)
    q = 0.0
    for i in range(d):
        acc = m[i] - sb[1 + i] / nb
        for j in range(i):
            acc -= L[i, j] * y[j]
        y[i] = acc / L[i, i]
        q += y[i] * y[i]
    r1 = (logdet + math.log1p(beta * q)) / d
    r2 = sd_b / d
    if r2 == -np.inf:
        return d * r1
    hi = max(r1, r2)
    return d * (hi + math.log(math.exp(r1 - hi) + math.exp(r2 - hi)))


@njit(cache=True, nogil=True)
def merged_log_marginal_bound(n_ab, d, p, lmv0):
    """(B, scale): ``log_marginal`` of n_ab records <= B - (a0 + n_ab) / 2 low for a lower
    bound low of their log|T_ab|; log Gamma_d bounded by d log Gamma + d (d - 1) / 4 log pi
    where log Gamma increases (a_ab / 2 - (d - 1) / 2 >= 1.5); scale: the terms' magnitudes."""
    c0 = p[d]
    a0 = p[d + 1]
    ak = a0 + n_ab
    if 0.5 * ak - 0.5 * (d - 1) >= 1.5:
        lmv = d * math.lgamma(0.5 * ak) + 0.25 * d * (d - 1) * LOG_PI
    else:
        lmv = lmvgamma(0.5 * ak, d)
    t0 = -0.5 * n_ab * d * LOG_PI
    t1 = 0.5 * a0 * p[d + 2]
    t3 = 0.5 * d * (math.log(c0) - math.log(c0 + n_ab))
    return t0 + lmv - lmv0 + t1 + t3, abs(t0) + abs(lmv) + abs(lmv0) + abs(t1) + abs(t3)


@njit(cache=True, nogil=True)
def log_predictive_loo(x, s, c, p, cells=None):
    """log p(x | X_k without x) of a member x of the cluster (s, c), in O(d^2): removing x
    changes T_k by -beta u u^T (u = x - m_k, beta = c_k / (c_k - 1)), so with r = |L^{-1} u|^2
    |T'| = |T_k| (1 - beta r) (determinant lemma). NaN when 1 - beta r <= 0 (rounding: the
    caller downdates a copy); with cells the same on G_k (``_loo_with_cells``)."""
    d = x.shape[0]
    if cells is not None:
        if has_cells(p, d):
            return _loo_with_cells(x, c, d)
    t = _tail(d)
    ck = c[t]
    ak = c[t + 1]
    return loo_constant(c, d) + _loo_log_ratio(ck, ak, _mahalanobis(x, c, d))


@njit(cache=True, nogil=True)
def loo_constants(c, d, out):
    """out (3,) with ``log_predictive_loo(x) = out[0] + out[1] log(1 - out[2] r)``, r =
    ``_mahalanobis(x, c, d)`` (no cells; two records or more): the cluster's terms once."""
    t = _tail(d)
    ck = c[t]
    out[0] = loo_constant(c, d)
    out[1] = 0.5 * (c[t + 1] - 1.0)
    out[2] = ck / (ck - 1.0)


@njit(cache=True, nogil=True)
def loo_constant(c, d):
    """The Student-t constant of ``log_predictive_loo`` (no cells) at c_k - 1, a_k - 1, but for
    the factor (1 - beta r)^((a_k - 1) / 2). Two records or more."""
    t = _tail(d)
    ck = c[t]
    return (
        log_gamma_ratio(0.5 * (c[t + 1] - d), d, (ck - 1.0) / ck)
        - 0.5 * d * LOG_PI
        - 0.5 * c[t + 2]
    )


@njit(cache=True, nogil=True)
def loo_cells_constant(c, d):
    """``loo_constant`` under B.1' (NaN when G_k has no factor)."""
    t = _tail(d)
    e = t + 4
    ck = c[t]
    ak = c[t + 1]
    return (
        log_gamma_ratio(0.5 * (ak - d), d, (ck - 1.0) / ck)
        - 0.5 * d * LOG_PI
        - 0.5 * ak * c[e + d * d + 1]
        + 0.5 * (ak - 1.0) * c[e + d * d]
    )


# The packed predictives P, cluster-major so that a record's quadratic forms vectorise over
# the clusters: column h (d (d + 1) / 2 + d + 3 rows) holds U's lower triangle row by row,
# b = U m_k, then from row e0 = d (d + 1) / 2 + d the Student-t constant, c_k / (c_k + 1) and
# (nu + d) / 2.


@njit(cache=True, nogil=True)
def pack_column(P, h, c, d):
    """Column h of P from cache row c (the layout above)."""
    u0 = d * d + d
    e = 0
    for i in range(d):
        for j in range(i + 1):
            P[e, h] = c[u0 + i * d + j]
            e += 1
    b0 = u0 + d * d
    for i in range(d):
        P[e + i, h] = c[b0 + i]
    e += d
    t = 2 * d * d + 2 * d
    ck = c[t]
    P[e, h] = c[t + 3]
    P[e + 1, h] = ck / (ck + 1.0)
    P[e + 2, h] = 0.5 * ((c[t + 1] - d + 1.0) + d)


@njit(cache=True, nogil=True)
def pack_columns(P, cache, K, empty_c, d):
    """P's columns 0..K-1 from the cache rows (K, C) and column K from the empty cache."""
    for h in range(K):
        pack_column(P, h, cache[h], d)
    pack_column(P, K, empty_c, d)


@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS)
def quad_forms(x, P, n, d, acc, qv):
    """qv[h] = |L_h^{-1} (x - m_h)|^2 for the columns h < n of P; acc: scratch (>= n,)."""
    leading_quad_forms(x, P, n, d, d, acc, qv)


@njit(cache=True, nogil=True)
def leading_rows(d):
    """The rows ``leading_quad_forms`` takes before pruning: half of d, at least 4."""
    return min(d, max(4, d // 2))


@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS)
def leading_quad_forms(x, P, n, d, rows, acc, qv):
    """qv[h] (>= n,) = the first ``rows`` rows' terms of ``quad_forms``, a lower bound that
    ``finish_quad_form`` completes; acc (>= n,) scratch. The first four rows run in one loop
    with x's entries in registers, later rows four terms at a time (``block_quad_forms``)."""
    b0 = d * (d + 1) // 2
    first = 0
    if rows >= 4:
        x0 = x[0]
        x1 = x[1]
        x2 = x[2]
        x3 = x[3]
        for h in range(n):
            a0 = P[0, h] * x0 - P[b0, h]
            a1 = (P[1, h] * x0 + P[2, h] * x1) - P[b0 + 1, h]
            a2 = (P[3, h] * x0 + P[4, h] * x1) + (P[5, h] * x2 - P[b0 + 2, h])
            a3 = (P[6, h] * x0 + P[7, h] * x1) + (P[8, h] * x2 + P[9, h] * x3) - P[b0 + 3, h]
            qv[h] = (a0 * a0 + a1 * a1) + (a2 * a2 + a3 * a3)
        first = 4
    else:
        for h in range(n):
            qv[h] = 0.0
    e = first * (first + 1) // 2
    for i in range(first, rows):
        for h in range(n):
            acc[h] = -P[b0 + i, h]
        j = 0
        while j + 4 <= i + 1:
            u0 = x[j]
            u1 = x[j + 1]
            u2 = x[j + 2]
            u3 = x[j + 3]
            for h in range(n):
                acc[h] += (P[e, h] * u0 + P[e + 1, h] * u1) + (P[e + 2, h] * u2 + P[e + 3, h] * u3)
            e += 4
            j += 4
        while j <= i:
            xj = x[j]
            for h in range(n):
                acc[h] += P[e, h] * xj
            e += 1
            j += 1
        for h in range(n):
            qv[h] += acc[h] * acc[h]


@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS)
def finish_quad_form(x, P, h, d, rows, q):
    """Column h's ``quad_forms`` value (up to reassociation) from its ``leading_quad_forms``
    value q over the first ``rows`` rows."""
    e = rows * (rows + 1) // 2
    b0 = d * (d + 1) // 2
    for i in range(rows, d):
        a = -P[b0 + i, h]
        for j in range(i + 1):
            a += P[e, h] * x[j]
            e += 1
        q += a * a
    return q


# The records in the inner loop (``block_quad_forms``): loops of B records, not K + 1 clusters.
# Contraction only, so that ``quad_form`` of one record equals its block value.
BLOCK_FLAGS = {"contract"}


@njit(cache=True, nogil=True, fastmath=BLOCK_FLAGS)
def block_quad_forms(XT, r0, r1, P, n, d, acc, Q):
    """Q[h, r] = |L_h^{-1} (x_r - m_h)|^2, Q (>= n, >= B), for the columns h < n of P and the
    records r0 <= r < r1 of the block XT (d, B); acc (>= B,) scratch. Four terms of a row are
    added at a time: the running sums are read and written once per four multiply-adds."""
    b0 = d * (d + 1) // 2
    for h in range(n):
        for r in range(r0, r1):
            Q[h, r] = 0.0
        e = 0
        for i in range(d):
            bi = P[b0 + i, h]
            for r in range(r0, r1):
                acc[r] = -bi
            j = 0
            while j + 4 <= i + 1:
                u0 = P[e, h]
                u1 = P[e + 1, h]
                u2 = P[e + 2, h]
                u3 = P[e + 3, h]
                for r in range(r0, r1):
                    acc[r] += (u0 * XT[j, r] + u1 * XT[j + 1, r]) + (
                        u2 * XT[j + 2, r] + u3 * XT[j + 3, r]
                    )
                e += 4
                j += 4
            while j <= i:
                u = P[e, h]
                for r in range(r0, r1):
                    acc[r] += u * XT[j, r]
                e += 1
                j += 1
            for r in range(r0, r1):
                Q[h, r] += acc[r] * acc[r]


@njit(cache=True, nogil=True, fastmath=BLOCK_FLAGS)
def quad_form(x, P, h, d):
    """One record's Q[h, r] of ``block_quad_forms``, the same operations in the same order."""
    b0 = d * (d + 1) // 2
    q = 0.0
    e = 0
    for i in range(d):
        a = -P[b0 + i, h]
        j = 0
        while j + 4 <= i + 1:
            a += (P[e, h] * x[j] + P[e + 1, h] * x[j + 1]) + (
                P[e + 2, h] * x[j + 2] + P[e + 3, h] * x[j + 3]
            )
            e += 4
            j += 4
        while j <= i:
            a += P[e, h] * x[j]
            e += 1
            j += 1
        q += a * a
    return q


@njit(cache=True, nogil=True)
def packed_log_predictive(P, h, q, e0):
    """``log_predictive`` of column h of P from its quadratic form q; e0 = d (d + 1) / 2 + d."""
    return P[e0, h] - P[e0 + 2, h] * math.log1p(q * P[e0 + 1, h])


@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS)
def packed_log_predictive_exact(P, h, q, e0):
    """``packed_log_predictive`` with ``packed_log_predictives``' flags (the loop's value)."""
    return P[e0, h] - P[e0 + 2, h] * math.log1p(q * P[e0 + 1, h])


@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS)
def packed_log_predictives(x, P, n, acc, qv, lp):
    """lp[h] = ``log_predictive`` of x under column h of P for every h < n."""
    d = x.shape[0]
    quad_forms(x, P, n, d, acc, qv)
    e0 = d * (d + 1) // 2 + d
    for h in range(n):
        lp[h] = P[e0, h] - P[e0 + 2, h] * math.log1p(qv[h] * P[e0 + 1, h])


# Bounds of the packed log predictives without a logarithm: log(2^e m), m in [1, 2), is
# e log 2 + 2 atanh((m - 1) / (m + 1)), whose series cut after t^7 / 7 leaves out positive terms
# below 1.3e-5; e and m from the bits (``kernels.arrays.float_bits``), so the loop vectorises.
_MANTISSA = np.int64((1 << 52) - 1)
_ONE_BITS = np.int64(1023 << 52)
_LOG2 = math.log(2.0)


# error_model="numpy": no zero-divisor branch (m + 1 >= 2), which kept the loop from vectorising
@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS, error_model="numpy")
def packed_log_predictive_bounds(qv, P, n, e0, ub):
    """ub[h] >= ``packed_log_predictive(P, h, qv[h], e0)`` for h < n (qv, ub (>= n,)), within
    about 1.3e-5 (nu + d) / 2 of it plus 1e-12 of the terms for rounding."""
    for h in range(n):
        b = float_bits(1.0 + qv[h] * P[e0 + 1, h])
        mh = bits_float((b & _MANTISSA) | _ONE_BITS)
        t = (mh - 1.0) / (mh + 1.0)
        t2 = t * t
        low = float((b >> 52) - 1023) * _LOG2 + 2.0 * t * (
            1.0 + t2 * (1.0 / 3.0 + t2 * (0.2 + t2 * (1.0 / 7.0)))
        )
        low -= 1e-10
        c = P[e0, h]
        w = P[e0 + 2, h] * low
        ub[h] = c - w + 1e-12 * (abs(c) + abs(w))


@njit(cache=True, nogil=True)
def moments(s, p, mean, cov):
    """mean (d,) = sum x / n and cov (d, d) = sum x x^T / n - mean mean^T of s's records (the
    records' own); NaN for n = 0; p unused."""
    d = mean.shape[0]
    n = s[0]
    if not n > 0.0:
        mean[:] = np.nan
        cov[:, :] = np.nan
        return
    for i in range(d):
        mean[i] = s[1 + i] / n
    base = 1 + d
    for i in range(d):
        for j in range(d):
            cov[i, j] = s[base + i * d + j] / n - mean[i] * mean[j]


@njit(cache=True, nogil=True)
def add_record(x, s, c, p, work, cells=None, factor=True):
    """``update(x, s, c, p, 1.0)`` with the scratch work (>= 4 d,), for a stream (ASUGS,
    Tsiligkaridis and Forsythe 2015, step (c)). factor=False leaves L (no cells): nothing but
    L's own change reads it, and ``restore_factor`` rebuilds it at the stream's end."""
    if cells is not None:
        if has_cells(p, x.shape[0]):
            update(x, s, c, p, 1.0, cells)
            return
    _change_factors(x, s, c, 1.0, work, bool(factor))


@njit(cache=True, nogil=True)
def restore_factor(c, d):
    """The cache's L = U^{-1} from its U (after ``add_record`` with factor=False)."""
    _invert_lower(c, d * d + d, 0, d)


@njit(cache=True, nogil=True, inline="always")
def _change_factor_l(c, d, sign, work):
    """``_change_factors``' L' = L M from the last column: M_jj L e_j + sign w_j s_j
    sum_{k > j} w_k L e_k (running sums in work[d : 2 d])."""
    acc0, s0, be0 = d, 2 * d, 3 * d
    for i in range(d):
        work[acc0 + i] = 0.0
    for j in range(d - 1, -1, -1):
        wj = work[j]
        mjj = work[be0 + j] * work[s0 + j]
        gj = sign * wj * work[s0 + j]
        for i in range(j, d):
            old = c[i * d + j]
            c[i * d + j] = mjj * old + gj * work[acc0 + i]
            work[acc0 + i] += wj * old


@njit(cache=True, nogil=True)
def _change_factors(x, s, c, sign, work, factor=True):
    """Add (sign = +1.0) or remove (-1.0) record x (d,) without cells: s, and L, U, m_k, b and
    the constants of c, in O(d^2); work (>= 4 d,) scratch, factor False leaves L. False, s and c
    untouched, when a removal leaves beta_d = |T'| / |T| below 1e-6 (digits lost).

    T' = T + sign v v^T, v = sqrt(c / (c + sign)) (x - m_k) = L w, is (L M)(L M)^T with M the
    Cholesky factor of I + sign w w^T: beta_j = 1 + sign (w_1^2 + ... + w_j^2),
    M_jj = sqrt(beta_j / beta_{j-1}), M_ij = sign w_i w_j / sqrt(beta_j beta_{j-1}) (i > j);
    L' = L M, U' = M^{-1} U and log|T'| = log|T| + log beta_d."""
    d = x.shape[0]
    t = _tail(d)
    ck = c[t]
    ck_new = ck + sign
    coef = math.sqrt(ck / ck_new)
    o = d * d
    u0 = o + d
    b0 = u0 + d * d
    acc0, s0, be0 = d, 2 * d, 3 * d
    # w = U v = sqrt(c / (c + sign)) (U x - b)
    q = 0.0
    for i in range(d):
        acc = -c[b0 + i]
        row = u0 + i * d
        for j in range(i + 1):
            acc += c[row + j] * x[j]
        acc *= coef
        work[i] = acc
        q += acc * acc
    # a removal's beta_d = 1 - q cancels: relative error eps / beta_d in the factors
    if not 1.0 + sign * q > 1e-6:
        return False
    add_stats(x, s, sign)
    beta_prev = 1.0
    for j in range(d):
        beta = beta_prev + sign * work[j] * work[j]
        work[s0 + j] = 1.0 / math.sqrt(beta * beta_prev)
        work[be0 + j] = beta
        beta_prev = beta
    if factor:
        _change_factor_l(c, d, sign, work)
    # U' = M^{-1} U: row i is M^{-1}_ii (row i of U) - sign w_i s_i sum_{j < i} w_j (row j of
    # U), on running sums of the old rows; b' = M^{-1} (U m') with U m' = b + sign w / (coef c')
    # on one more column (rb), O(d)
    for i in range(d):
        work[acc0 + i] = 0.0
    rb = 0.0
    rw = sign / (coef * ck_new)
    beta_prev = 1.0
    for i in range(d):
        wi = work[i]
        mii = beta_prev * work[s0 + i]
        gi = sign * wi * work[s0 + i]
        row = u0 + i * d
        for j in range(i + 1):
            u = c[row + j]
            c[row + j] = mii * u - gi * work[acc0 + j]
            work[acc0 + j] += wi * u
        r = c[b0 + i] + rw * wi
        c[b0 + i] = mii * r - gi * rb
        rb += wi * r
        beta_prev = work[be0 + i]
    # m'
    inv_c1 = 1.0 / ck_new
    for i in range(d):
        c[o + i] = (ck * c[o + i] + sign * x[i]) * inv_c1
    logdet = c[t + 2] + math.log(beta_prev)
    _finish_constants(c, d, ck_new, c[t + 1] + sign, logdet, logdet)
    return True
