"""Multivariate Gaussian with a Normal-Wishart prior (Raykov et al. 2016, Appendix B, eqs. B.1-B.2).

Parameterisation exactly as Appendix B: theta_0 = (m0, c0, B0, a0), the precision matrix is
Wishart with scale matrix B0 and a0 degrees of freedom, the mean is Normal with precision c0 times
it. We work with the *inverse* scale T = B^{-1} because B.1 updates it additively:

    T_k = B0^{-1} + S_k + c0 N_k / (c0 + N_k) (xbar_k - m0)(xbar_k - m0)^T          (B.1)
        = B0^{-1} + sum_j x_j x_j^T + c0 m0 m0^T - c_k m_k m_k^T

Layouts for d columns
---------------------
stats ``s`` (1 + d + d^2): n, sum x (d), sum x x^T (d * d, row major).
prior ``p`` (d + 3 + d^2 + d): m0 (d), c0, a0, log|T0|, T0 = B0^{-1} (d * d), h (d): the
variance of each column's recording cell (0: continuous; see below).
cache ``c`` (2 d^2 + 2 d + 4, and d^2 + 2 more with cells): L (d * d, lower Cholesky factor
of T_k + H), m_k (d), U = L^{-1} (d * d, lower), b = U m_k (d), c_k, a_k, log|T_k + H|, the
Student-t normalising constant; with cells, V = chol(G_k)^{-1} (d * d, lower; NaN when G_k is
not positive definite), log|G_k|, log|T_k| (below). Keeping
U makes a predictive evaluation one triangular matrix-vector product with no temporary and no
division. A record joining or leaving the cluster changes L and U together in O(d^2)
(``_change_factors``); ``refresh`` rebuilds them (d^3 / 2).

The predictive (Appendix B, below B.2) is a Student-t with mu = m, nu = a - d + 1 and precision
Lambda = c nu / (c + 1) B, so (x - mu)^T Lambda (x - mu) / nu = c / (c + 1) |L^{-1} (x - m)|^2.

Recorded values (Sheppard's correction)
---------------------------------------
Values recorded on a grid of step q (integers, one decimal) are the centres of cells of width q,
and a Gaussian fitted to them can collapse onto the grid: a cluster whose members share one
value of a column has a scatter of 0 there, so its density grows without bound. Each record is
therefore counted with the variance h = q^2 / 12 of its cell (the uniform dequantisation noise,
in expectation), the diagonal H = diag(h) added once per record to the scatter:

    T_k = B0^{-1} + sum_j (x_j x_j^T + H) + c0 m0 m0^T - c_k m_k m_k^T                    (B.1')

With H = 0 this is B.1 exactly. The predictive stays the ratio of marginals p(X + x) / p(X),
which is then a Student-t on T_k + H times (|T_k|^{a_k} / |T_k + H|^{a_k + 1})^{1/2} instead of
|T_k|^{-1/2}: the cache keeps the factor L of T_k + H and the constant with both determinants.
Adding a record then changes T_k by more than a rank-one term, so ``update`` and
``add_record`` rebuild the cache (d^3 / 2) when H is not 0. Removing x from a cluster leaves
T_k - H - beta u u^T (u = x - m_k, beta = c_k / (c_k - 1)), a rank-one change of G_k = T_k - H,
so the cache of a prior with cells also keeps the inverse factor of G_k: the leave-one-out
predictive p(X_k) / p(X_k without x) stays O(d^2).

``refresh``, ``update``, ``log_predictive_loo`` and ``add_record`` take ``cells``: None (the
default) compiles them without this section at all (numba prunes ``cells is not None`` on a
None argument), for the product family's Normal-Wishart-only kernels, whose priors have no
cells (``kernels.obs.product``); True checks the prior's h at run time.
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
    """Fill T (d, d) with T_k and m (d,) with m_k of eq. B.1; return (c_k, a_k).

    Parameters
    ----------
    s : ndarray of shape (1 + d + d^2,)
    p : ndarray of shape (d + 3 + d^2 + d,)
    T : ndarray of shape (d, d), output
    m : ndarray of shape (d,), output
    """
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
    """Whether any of the d columns of the prior p has a recording cell (h > 0), i.e. whether
    Sheppard's correction (module docstring) applies."""
    base_h = d + 3 + d * d
    for i in range(d):
        if p[base_h + i] > 0.0:
            return True
    return False


@njit(cache=True, nogil=True)
def cholesky_inplace(A):
    """Lower Cholesky factor of A (d, d) written over A's lower triangle; upper set to 0.

    Returns False if A is not numerically positive definite.
    """
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
    """c[dst:dst + d d] = the inverse of the lower-triangular d x d matrix at c[src:] (both row
    major), by forward substitution column by column."""
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


# reassociation lets LLVM vectorise the dot products of the quadratic form (about twice as fast
# for d = 10); results move by rounding only. No other fast-math flag: NaN and inf stay IEEE.
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
    """Fill U, b and the scalar tail of the cache from L, m, (c_k, a_k), log|T_k + H| and
    log|T_k|."""
    _invert_factor(c, d)
    _finish_constants(c, d, ck, ak, logdet, logdet_t)


@njit(cache=True, nogil=True)
def _finish_constants(c, d, ck, ak, logdet, logdet_t):
    """The scalar tail of the cache: c_k, a_k, log|T_k + H| and the Student-t constant, whose
    determinant term is (a_k log|T_k| - (a_k + 1) log|T_k + H|) / 2 (module docstring; written
    so that it is exactly -log|T_k| / 2 when H = 0)."""
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
    """Recompute the cache (Cholesky factor of T_k + H, m_k, constants) from the statistics;
    ``cells``: the module docstring."""
    d = dim_of_stats(s)
    T = np.empty((d, d))
    m = np.empty(d)
    ck, ak = posterior_inverse_scale(s, p, T, m)
    with_cells = False
    if cells is not None:
        with_cells = has_cells(p, d)
    logdet_t = 0.0
    if with_cells:
        # log|T_k| from a factor of a copy; G_k = T_k - H for the leave-one-out predictive;
        # then T_k + H (module docstring)
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
    """The cache's section for a prior with cells: V = chol(G)^{-1} (G (d, d) is overwritten),
    log|G| and log|T_k|; V and log|G| are NaN when G is not positive definite (an empty
    cluster: T0 - H), which sends a leave-one-out predictive to the caller's copy."""
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
    """(a_k - 1) / 2 log(1 - beta r), beta = c_k / (c_k - 1), of a record at r = |V u|^2 or
    |L^{-1} u|^2: NaN when 1 - beta r is not positive (rounding)."""
    one_minus = 1.0 - (ck / (ck - 1.0)) * r
    if not one_minus > 0.0:
        return np.nan
    return 0.5 * (ak - 1.0) * math.log(one_minus)


@njit(cache=True, nogil=True, inline="always")
def _loo_with_cells(x, c, d):
    """log p(X_k) - log p(X_k without x) under B.1' (module docstring): with u = x - m_k,
    log|T'| = log|G_k| + log(1 - beta |V u|^2), and the marginals' other terms in closed form.
    NaN when G_k had no factor or 1 - beta |V u|^2 is not positive."""
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
    """Add (w = +1) or remove (w = -1) record x: statistics and cache, O(d^2).

    Adding x to a cluster with (c_k, m_k) changes T_k by c_k / (c_k + 1) (x - m_k)(x - m_k)^T,
    removing it by -c_k / (c_k - 1) (x - m_k)(x - m_k)^T: rank one either way, so L and
    U = L^{-1} change together in O(d^2) (``_change_factors``). With recording cells (H > 0,
    not rank one) the cache is rebuilt instead, O(d^3).
    """
    update_with(x, s, c, p, w, np.empty(4 * x.shape[0]), cells, True)


@njit(cache=True, nogil=True)
def update_with(x, s, c, p, w, work, cells=None, factor=True):
    """``update`` with the caller's scratch (work: >= 4 d entries), for a sweep that moves
    records one after another and allocates nothing per move; factor=False leaves L behind
    (``add_record``: nothing a sweep computes reads it, ``restore_factor`` rebuilds it)."""
    d = x.shape[0]
    if cells is not None:
        if has_cells(p, d):
            add_stats(x, s, w)
            refresh(s, c, p, cells)
            return
    # bool(): one specialisation of _change_factors for every caller (a literal True or False
    # would be a type, and a compile, of its own; ``warmup.warm_observation_factors``)
    if _change_factors(x, s, c, w, work, bool(factor)):
        return
    # a removal that leaves T_k nearly singular, or indefinite by rounding: rebuild from the
    # statistics (without cells as refresh's default, not a None argument: that would be a
    # second specialisation)
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
def log_marginal(s, p):
    """log p(X) with the Normal-Wishart parameters integrated out.

    log p(X) = -n d / 2 log pi + log Gamma_d(a_n / 2) - log Gamma_d(a0 / 2)
               + a0 / 2 log|T0| - a_n / 2 log|T_n| + d / 2 (log c0 - log c_n)
    """
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
    """``log_marginal`` (the same operations, the same value) with the caller's scratch T (d, d)
    and m (d,) and ``log_marginal_prior_term`` lmv0: a loop of log marginals (the merge gaps of
    ``kernels.partition.greedy_merge``) then allocates nothing and computes the prior's d log
    gammas once."""
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
    """log|S + n H| for the records summarised by s: S their scatter about their mean (n times
    ``moments``' covariance), H the recording cells' variances (module docstring); -inf where it
    is singular (n <= d, or rounding). W (d, d) and mean (d,) are scratch.
    ``merged_logdet_lower``'s second term."""
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
    """A lower bound of log|T_ab|, the posterior inverse scale of two clusters' records merged,
    from cluster a's posterior (the Cholesky factor L of T_a, m_a, c_a, log|T_a|) and b's
    statistics and ``scatter_logdet``: O(d^2) where log|T_ab| itself is O(d^3).

    T_a is T0 plus the scatter of a's records and c0 pseudo-records at m0 about their mean m_a,
    plus n_a H. Merged with b's records, that scatter gains b's own scatter S_b and the between
    term beta v v^T (beta = c_a n_b / (c_a + n_b), v = m_a - mean_b), so
    T_ab = (T_a + beta v v^T) + (S_b + n_b H), two positive semi-definite matrices, and by
    Minkowski's determinant inequality |T_ab|^(1/d) >= |T_a + beta v v^T|^(1/d) +
    |S_b + n_b H|^(1/d), where log|T_a + beta v v^T| = log|T_a| + log(1 + beta |L^{-1} v|^2)
    (determinant lemma).

    Parameters
    ----------
    sb : ndarray of shape (1 + d + d^2,)
        Statistics of cluster b (n_b > 0).
    sd_b : float
        ``scatter_logdet`` of sb (-inf: singular).
    L : ndarray of shape (d, d)
        Lower Cholesky factor of T_a.
    m : ndarray of shape (d,)
        m_a.
    ck, logdet : float
        c_a and log|T_a|.
    y : ndarray of shape (d,), scratch.

    Returns
    -------
    float
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
    """(B, scale) with ``log_marginal(s_ab, p)`` <= B - (a0 + n_ab) / 2 low for n_ab records
    and any lower bound low of their log|T_ab| (``merged_logdet_lower``): the log marginal's
    other terms, log Gamma_d(a_ab / 2) bounded by d log Gamma(a_ab / 2) + d (d - 1) / 4 log pi
    when its smallest argument a_ab / 2 - (d - 1) / 2 is at least 1.5 (log Gamma increases
    above 1.4616), exact otherwise; scale is the sum of the terms' magnitudes (rounding is a
    few ulps of it, and of (a0 + n_ab) / 2 |low|). lmv0: ``log_marginal_prior_term``."""
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
    """log p(x | X_k without x) for a record x that is a member of the cluster (s, c).

    Removing x changes T_k by -beta u u^T with u = x - m_k and beta = c_k / (c_k - 1), so with
    r = u^T T_k^{-1} u (one forward solve with the cluster's own factor) the matrix determinant
    lemma gives |T'| = |T_k| (1 - beta r) and Sherman-Morrison gives the Student-t quadratic form
    beta r / (1 - beta r). The predictive of Appendix B with c' = c_k - 1, a' = a_k - 1 is then
    O(d^2) with no downdate; with recording cells the same lemma on G_k (``_loo_with_cells``).
    Returns NaN when 1 - beta r is not positive (rounding): the caller then downdates a copy
    instead.
    """
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
    """The terms of ``log_predictive_loo`` (without recording cells) that depend on the cluster
    alone, for a sweep that scores many of its members: out[0] the sum of the terms before the
    record's, out[1] = (nu + d - 1) / 2 and out[2] = beta = c_k / (c_k - 1), so that
    ``log_predictive_loo(x) = out[0] + out[1] log(1 - out[2] r)`` with r = ``_mahalanobis(x, c,
    d)``: the same operations in the same order, the constant's logarithms saved per record.
    Only for a cluster of two records or more (nu > 0)."""
    t = _tail(d)
    ck = c[t]
    out[0] = loo_constant(c, d)
    out[1] = 0.5 * (c[t + 1] - 1.0)
    out[2] = ck / (ck - 1.0)


@njit(cache=True, nogil=True)
def loo_constant(c, d):
    """The Student-t constant of ``log_predictive_loo`` (without recording cells): Appendix B's
    with c' = c_k - 1, a' = a_k - 1 and |T'| = |T_k| (1 - beta r) but for the last factor,
    whose logarithm the caller adds times (a_k - 1) / 2 (the powers of nu cancel as in
    ``_finish_constants``). Only for a cluster of two records or more."""
    t = _tail(d)
    ck = c[t]
    return (
        log_gamma_ratio(0.5 * (c[t + 1] - d), d, (ck - 1.0) / ck)
        - 0.5 * d * LOG_PI
        - 0.5 * c[t + 2]
    )


@njit(cache=True, nogil=True)
def loo_cells_constant(c, d):
    """``loo_constant`` under B.1' (``_loo_with_cells``): |T'|^(a' / 2) from log|G_k| and
    |T_k|^(a_k / 2) from log|T_k| (NaN when G_k had no factor)."""
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


# The packed, cluster-major copy of the predictives: column h of P (d (d + 1) / 2 + d + 3 rows)
# holds cluster h's packed lower triangle of U = L^{-1} (row by row), b = U m_k, then from row
# e0 = d (d + 1) / 2 + d the Student-t constant, c_k / (c_k + 1) and (nu + d) / 2. With the
# clusters in the inner loop the quadratic forms of one record against every cluster run over
# contiguous memory and vectorise: 0.46 us against 0.97 us for a record against 20 clusters of
# d = 10 (``log_predictive`` per cluster). MAP-DP's sweep and ``predict`` and ASUGS's stream
# use it for Normal-Wishart-only records.


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
    """qv[h] = |L_h^{-1} (x - m_h)|^2 for the columns h < n of P (``_mahalanobis`` of each);
    acc, qv : ndarrays of at least n entries (acc: scratch)."""
    leading_quad_forms(x, P, n, d, d, acc, qv)


@njit(cache=True, nogil=True)
def leading_rows(d):
    """How many leading rows of the triangular solve ``leading_quad_forms`` takes before a
    record's clusters are pruned: half of d, at least 4 (d = 10: 15 of 65 multiply-adds a
    cluster; on a 20-cluster mixture 1.35 clusters a record are then finished on average, 1.93
    with 4 rows, whose bound is looser: the fifth row costs less than the finishing it saves)."""
    return min(d, max(4, d // 2))


@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS)
def leading_quad_forms(x, P, n, d, rows, acc, qv):
    """qv[h] = the sum over the first ``rows`` rows i of (L_h^{-1} (x - m_h))_i^2 for the
    columns h < n of P: ``quad_forms`` when rows = d, else a lower bound of it (every row adds a
    square), which ``finish_quad_form`` completes for the columns that can win.

    The clusters are the vectorised loop. The first four rows (10 multiply-adds a column) run
    in one loop over the columns with the record's first four entries in registers, and every
    later row adds four terms to its running sum at a time (``block_quad_forms``' reason): a
    loop per multiply-add read and wrote the running sums each time, 75-80 ns against 33-38 ns
    for 21 columns' first four rows of d = 10.

    Parameters
    ----------
    x : ndarray of shape (d,)
    P : packed predictives (the layout above)
    n, d, rows : int
    acc, qv : ndarrays of at least n entries (acc: scratch; qv: output)
    """
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
    """Column h's ``quad_forms`` value from its ``leading_quad_forms`` value q over the first
    ``rows`` rows: the remaining rows added in the same order (``quad_forms``' value up to its
    reassociation, about an ulp); q itself when rows = d."""
    e = rows * (rows + 1) // 2
    b0 = d * (d + 1) // 2
    for i in range(rows, d):
        a = -P[b0 + i, h]
        for j in range(i + 1):
            a += P[e, h] * x[j]
            e += 1
        q += a * a
    return q


# The records in the inner loop instead (``block_quad_forms``): a block of B records against
# one column at a time runs loops of B iterations, where the clusters' loop runs K + 1 (21, so
# loop set-up and remainder weigh as much as the arithmetic). Only contraction (no
# reassociation): both functions below then do the same operations in the same order per
# record, so a column recomputed for one record equals its block value.
BLOCK_FLAGS = {"contract"}


@njit(cache=True, nogil=True, fastmath=BLOCK_FLAGS)
def block_quad_forms(XT, r0, r1, P, n, d, acc, Q):
    """Q[h, r] = |L_h^{-1} (x_r - m_h)|^2 for the columns h < n of P and the records
    r0 <= r < r1 of the block XT (d, B), one record a column.

    Four terms of a row of the triangular solve are added to the running sum at a time, so
    that the running sums (a memory array: the records are the vectorised loop) are read and
    written once for four multiply-adds instead of each: the loop was bound by those loads and
    stores (a fifth of a confirming sweep's time at K = 20, d = 10).

    Parameters
    ----------
    XT : ndarray of shape (d, B)
    P : packed predictives (the layout above)
    acc : ndarray of shape (>= B,), scratch
    Q : ndarray of shape (>= n, >= B), output
    """
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
    """``log_predictive`` (the Student-t of Appendix B) of column h of P from its quadratic form
    q = qv[h] (``quad_forms``); e0 = d (d + 1) / 2 + d."""
    return P[e0, h] - P[e0 + 2, h] * math.log1p(q * P[e0 + 1, h])


@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS)
def packed_log_predictive_exact(P, h, q, e0):
    """``packed_log_predictive`` with the floating-point flags of ``packed_log_predictives``,
    so that one column's value is that of the loop's (a pruned arg min then picks what the full
    evaluation picks)."""
    return P[e0, h] - P[e0 + 2, h] * math.log1p(q * P[e0 + 1, h])


@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS)
def packed_log_predictives(x, P, n, acc, qv, lp):
    """lp[h] = ``log_predictive`` of x under column h of P, for every h < n (a column of a
    free slot too: its value is then meaningless, and never read)."""
    d = x.shape[0]
    quad_forms(x, P, n, d, acc, qv)
    e0 = d * (d + 1) // 2 + d
    for h in range(n):
        lp[h] = P[e0, h] - P[e0 + 2, h] * math.log1p(qv[h] * P[e0 + 1, h])


# Upper bounds of the packed log predictives without a logarithm: an arg min or arg max over
# clusters needs the exact Student-t of the few clusters that can win, and a bound for the rest.
# log(u) for u = 2^e m, m in [1, 2), is e log 2 + 2 atanh(t), t = (m - 1) / (m + 1) in [0, 1/3);
# the atanh series cut after t^7 / 7 leaves out positive terms only, below 1.3e-5 in all. The
# exponent and mantissa come from the bits (``kernels.arrays.float_bits``), so the loop has no
# call in it and vectorises: 21 bounds in about 37 ns on one core of the 2-core machine, against
# 150-210 ns for 21 log1p (and 60 ns when the bits came from integer views of scratch arrays,
# three loops where one now runs).
_MANTISSA = np.int64((1 << 52) - 1)
_ONE_BITS = np.int64(1023 << 52)
_LOG2 = math.log(2.0)


# error_model="numpy": Python's model guards every division against a zero divisor (a
# ZeroDivisionError), a branch that keeps the loop from vectorising; here m + 1 >= 2. 90 ns for 21
# columns before, 64 after (one core of the loaded 2-core machine).
@njit(cache=True, nogil=True, fastmath=QUAD_FLAGS, error_model="numpy")
def packed_log_predictive_bounds(qv, P, n, e0, ub):
    """ub[h] >= ``packed_log_predictive(P, h, qv[h], e0)`` for every h < n, within about
    1.3e-5 (nu + d) / 2 of it (the bound's slack, plus 1e-12 of the terms for rounding).

    Parameters
    ----------
    qv : ndarray of shape (>= n,)
        Quadratic forms (``quad_forms``).
    P : packed predictives (module layout above); e0 = d (d + 1) / 2 + d.
    ub : ndarray of shape (>= n,), output
    """
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
    """Mean and covariance of the records summarised by s: the statistics determine both.

    mean = sum x / n, cov = sum x x^T / n - mean mean^T (the maximum-likelihood covariance, not
    the posterior's). NaN everywhere for n = 0.

    Parameters
    ----------
    s : ndarray of shape (1 + d + d^2,)
    p : ndarray of shape (d + 3 + d^2 + d,)
        Unused (the contract's argument list).
    mean : ndarray of shape (d,), output
    cov : ndarray of shape (d, d), output
    """
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
    """``update(x, s, c, p, 1.0)`` with the caller's scratch space, for a stream that adds one
    record at a time (ASUGS, Tsiligkaridis and Forsythe 2015, step (c); eqs. 4-7 in this
    parameterisation): O(d^2) and no allocation.

    Parameters
    ----------
    x : ndarray of shape (d,)
    s, c, p : the cluster's statistics and cache (updated in place) and the prior.
    work : ndarray of shape (>= 4 d,)
        Scratch space (the caller's, so that a stream allocates nothing per record).
    factor : bool
        False leaves the cache's L as it was (without recording cells): nothing in a record's
        change reads L but L's own change (U' = M^{-1} U, b, the constants and log|T'| come from
        U), so a stream of additions skips it (70 of 355 ns a record for d = 10) and rebuilds
        L from U once at its end (``restore_factor``).
    """
    if cells is not None:
        if has_cells(p, x.shape[0]):
            # recording cells make the change more than rank one (module docstring)
            update(x, s, c, p, 1.0, cells)
            return
    _change_factors(x, s, c, 1.0, work, bool(factor))


@njit(cache=True, nogil=True)
def restore_factor(c, d):
    """L = U^{-1} (lower triangular) in the cache from its U: the L that ``add_record`` with
    factor=False left behind, up to rounding."""
    _invert_lower(c, d * d + d, 0, d)


@njit(cache=True, nogil=True, inline="always")
def _change_factor_l(c, d, sign, work):
    """``_change_factors``' L' = L M, column by column from the last: column j of L M is
    M_jj L e_j plus sign w_j s_j sum_{k > j} w_k L e_k (the running sums in work[d : 2 d], from
    the old columns; work as ``_change_factors`` fills it)."""
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
    """Add (sign = +1) or remove (sign = -1) record x without recording cells: statistics, L,
    U = L^{-1}, m_k, b and the constants, all in O(d^2). Returns False, with s and c
    untouched, when a removal leaves |T'| / |T| = beta_d below 1e-6, where the update would
    lose digits (below), or not positive in floating point.

    The change is T' = T + sign v v^T with v = sqrt(c / (c + sign)) (x - m_k) = L w, w = U v,
    so T' = L (I + sign w w^T) L^T = (L M)(L M)^T with M the Cholesky factor of
    I + sign w w^T, known in closed form: with beta_0 = 1, beta_j = 1 + sign (w_1^2 + ... +
    w_j^2), M_jj = sqrt(beta_j / beta_{j-1}) and M_ij = sign w_i w_j / sqrt(beta_j beta_{j-1})
    (i > j). Hence L' = L M and U' = M^{-1} U, each O(d^2) by that structure, and (matrix
    determinant lemma) log|T'| = log|T| + log beta_d. Equal to ``refresh`` of the new
    statistics up to rounding.

    Parameters
    ----------
    x : ndarray of shape (d,)
    s, c : the cluster's statistics and cache (updated in place).
    sign : float, +1.0 or -1.0
    work : ndarray of shape (>= 4 d,)
        Scratch: w, then the running sums, 1 / sqrt(beta_j beta_{j-1}) and beta_j.
    factor : bool
        False: L is left as it was (``add_record``).
    """
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
    # beta_d = 1 - q comes from a cancellation when a removal leaves |T'| much smaller than
    # |T|: the factors would carry a relative error of about eps / beta_d, so below 1e-6
    # (and when rounding made it negative) the caller rebuilds from the statistics instead
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
    # U' = M^{-1} U, where M^{-1} has the same structure: M^{-1}_ii = sqrt(beta_{i-1} / beta_i),
    # M^{-1}_ij = -sign w_i w_j / sqrt(beta_i beta_{i-1}) (i > j). Row i of U' is then
    # M^{-1}_ii (row i of U) - sign w_i s_i sum_{j < i} w_j (row j of U): running sums of the
    # old rows, one multiply-add each on their dependency chain, where the substitution on the
    # new rows chained three operations. b' = U' m' = M^{-1} (U m')
    # with U m' = b + sign w / (coef c') (as m' = (c m + sign x) / c' and U x - b = w / coef):
    # the same on one more column (running sum rb), O(d) instead of U' m''s O(d^2). U' and b'
    # took 138 ns for d = 10 the old way, 59 now (one core of the 2-core machine)
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
