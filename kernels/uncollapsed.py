"""The uncollapsed Gibbs sampler of the DPM (De Bacco and Valera, Algorithm 2; Neal 2000, Algorithm
2).

The state is z and a parameter row theta_k per occupied cluster. A scan (Algorithm 2, step 3):
(a) each record n in turn leaves its cluster (dropped if empty) and draws z_n proportional to
m_k p(x_n | theta_k) (eq. 5), or alpha int p(x_n | theta) H(theta) dtheta for a new cluster
(eq. 6, the family's prior predictive), whose theta is drawn given x_n alone; (b) every theta_k
is drawn from its conjugate posterior. Nothing is truncated (at most N clusters). theta rows
have T = the sum of the groups' widths below, in ``kernels.obs.product``'s layout:

==================  ===========================================  ==================================
family              posterior draw (statistics -> theta)         theta row of the group
==================  ===========================================  ==================================
Normal-Wishart      Lambda ~ W(T_k^{-1}, a_k) (Bartlett),         mu (d), lower Cholesky factor L
                    mu | Lambda ~ N(m_k, (c_k Lambda)^{-1})       of Lambda (d * d), sum log L_ii
                    (Raykov et al. 2016, eq. B.1)
Normal-Gamma        tau_j ~ Gamma(a_n, b_n),                      mu (d), tau (d)
                    mu_j | tau_j ~ N(m_n, 1 / (c_n tau_j))
Dirichlet           theta ~ Dir(alpha_c + n_c)                    log theta_c (C)
Gamma-Poisson       lambda_j ~ Gamma(a + sum x, b + n)            lambda (d)
Beta-binomial       theta_j ~ Beta(a + sum x, b + n N_j - sum x)  log theta (d), log(1 - theta) (d)
Gamma-exponential   lambda_j ~ Gamma(a + n, b + sum x)            lambda (d)
Beta-geometric      theta_j ~ Beta(a + n, b + sum x)              log theta (d), log(1 - theta) (d)
==================  ===========================================  ==================================

(Gamma(a, b) is shape a, rate b.) Random numbers come from ``kernels.rng`` (splitmix64 state).
"""

import math

import numpy as np
from numba import njit

from kernels import rng
from kernels.obs import gaussian_nw
from kernels.obs import product as prod

LOG_2PI = math.log(2.0 * math.pi)


# -- random variates ------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def std_normal(state):
    """A standard normal draw (Box-Muller; the uniform is shifted to (0, 1] so log is finite)."""
    u1 = 1.0 - rng.uniform(state)
    u2 = rng.uniform(state)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@njit(cache=True, nogil=True)
def log_gamma_variate(state, a):
    """log of a Gamma(a, 1) draw (Marsaglia and Tsang 2000; G(a + 1) U^(1 / a) for a < 1, whose
    draw can underflow)."""
    boost = 0.0
    if a < 1.0:
        boost = math.log(1.0 - rng.uniform(state)) / a
        a += 1.0
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = std_normal(state)
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = 1.0 - rng.uniform(state)
        if math.log(u) < 0.5 * x * x + d - d * v + d * math.log(v):
            return math.log(d * v) + boost


@njit(cache=True, nogil=True)
def gamma_variate(state, a, rate):
    """A Gamma(a, rate) draw (shape a, rate ``rate``)."""
    return math.exp(log_gamma_variate(state, a)) / rate


@njit(cache=True, nogil=True)
def log_beta_variate(state, a, b):
    """(log theta, log(1 - theta)) of a Beta(a, b) draw, from two Gamma draws on the log scale."""
    ga = log_gamma_variate(state, a)
    gb = log_gamma_variate(state, b)
    m = max(ga, gb)
    lse = m + math.log(math.exp(ga - m) + math.exp(gb - m))
    return ga - lse, gb - lse


# -- layout ---------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _group_width(code, d, n_stat):
    if code == prod.GAUSSIAN_NW:
        return d + d * d + 1
    if code == prod.CATEGORICAL:
        return n_stat - 1
    if code == prod.POISSON_GAMMA or code == prod.EXPONENTIAL_GAMMA:
        return d
    return 2 * d  # Normal-Gamma, beta-binomial, beta-geometric


@njit(cache=True, nogil=True)
def theta_offsets(spec):
    """Offsets (G + 1,) of each group's slice of a theta row; the last entry is its length T."""
    G = spec.shape[0]
    off = np.zeros(G + 1, dtype=np.int64)
    for g in range(G):
        r = spec[g]
        off[g + 1] = off[g] + _group_width(r[prod.CODE], r[prod.NCOL], r[prod.NSTAT])
    return off


# -- posterior draws, one group -------------------------------------------------------------------
@njit(cache=True, nogil=True)
def draw_normal_wishart(s, p, th, state):
    """th (d + d^2 + 1,) = (mu, L, sum log L_ii) drawn from eq. B.1's posterior (Raykov et al.
    2016) of s (1 + d + d^2,), p (d + 3 + d^2 + d,): Lambda = (U^T A)(U^T A)^T by Bartlett's
    decomposition (T_k = R R^T, U = R^{-1}, A_ii = sqrt(chi2(a_k - i)), A_ij ~ N(0, 1)), then
    mu = m_k + L^{-T} eps / sqrt(c_k), Lambda = L L^T; state (1,) uint64."""
    d = gaussian_nw.dim_of_stats(s)
    T = np.empty((d, d))
    m = np.empty(d)
    ck, ak = gaussian_nw.posterior_inverse_scale(s, p, T, m)
    if not gaussian_nw.cholesky_inplace(T):
        raise ValueError("Normal-Wishart posterior scale is not positive definite")
    # U = R^{-1}, lower triangular, by forward substitution column by column
    U = np.zeros((d, d))
    for j in range(d):
        U[j, j] = 1.0 / T[j, j]
        for i in range(j + 1, d):
            acc = 0.0
            for k in range(j, i):
                acc += T[i, k] * U[k, j]
            U[i, j] = -acc / T[i, i]
    A = np.zeros((d, d))
    for i in range(d):
        A[i, i] = math.sqrt(2.0 * gamma_variate(state, 0.5 * (ak - i), 1.0))
        for j in range(i):
            A[i, j] = std_normal(state)
    # M = U^T A; Lambda = M M^T
    M = np.zeros((d, d))
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for k in range(max(i, j), d):
                acc += U[k, i] * A[k, j]
            M[i, j] = acc
    Lam = M @ M.T
    for i in range(d):
        for j in range(i):
            v = 0.5 * (Lam[i, j] + Lam[j, i])
            Lam[i, j] = v
            Lam[j, i] = v
    if not gaussian_nw.cholesky_inplace(Lam):
        raise ValueError("a Wishart draw is not numerically positive definite")
    # mu = m + L^{-T} eps / sqrt(c): back substitution of L^T y = eps
    eps = np.empty(d)
    for i in range(d):
        eps[i] = std_normal(state)
    y = np.empty(d)
    for i in range(d - 1, -1, -1):
        acc = eps[i]
        for k in range(i + 1, d):
            acc -= Lam[k, i] * y[k]
        y[i] = acc / Lam[i, i]
    sc = 1.0 / math.sqrt(ck)
    logdet_half = 0.0
    for i in range(d):
        th[i] = m[i] + sc * y[i]
        logdet_half += math.log(Lam[i, i])
        for j in range(d):
            th[d + i * d + j] = Lam[i, j]
    th[d + d * d] = logdet_half


@njit(cache=True, nogil=True)
def draw_normal_gamma(s, p, th, state):
    """theta = (mu (d), tau (d)) from each column's Normal-Gamma posterior (Murphy 2007, sec. 3;
    the formulas of ``kernels.obs.normal_gamma``)."""
    d = p.shape[0] // 5
    n = s[0]
    for j in range(d):
        m0, c0, a0, b0 = p[j], p[d + j], p[2 * d + j], p[3 * d + j]
        u = s[1 + j]
        v = s[1 + d + j]
        cn = c0 + n
        mn = (c0 * m0 + u) / cn
        an = a0 + 0.5 * n
        # b_n = b0 + 1/2 [sum (x - m0)^2 - (u - n m0)^2 / c_n]
        dev = u - n * m0
        bn = b0 + 0.5 * max(v - 2.0 * m0 * u + n * m0 * m0 - dev * dev / cn, 0.0)
        bn += 0.5 * n * p[4 * d + j]  # the recording cells (kernels.obs.normal_gamma)
        tau = gamma_variate(state, an, bn)
        th[d + j] = tau
        th[j] = mn + std_normal(state) / math.sqrt(cn * tau)


@njit(cache=True, nogil=True)
def draw_dirichlet(s, p, th, state):
    """log theta (C) from Dirichlet(alpha_c + n_c): normalised Gamma draws on the log scale."""
    C = s.shape[0] - 1
    m = -np.inf
    for c in range(C):
        th[c] = log_gamma_variate(state, p[c] + s[1 + c])
        if th[c] > m:
            m = th[c]
    tot = 0.0
    for c in range(C):
        tot += math.exp(th[c] - m)
    lse = m + math.log(tot)
    for c in range(C):
        th[c] -= lse


@njit(cache=True, nogil=True)
def _draw_group(code, sg, pg, th, d, state):
    if code == prod.GAUSSIAN_NW:
        draw_normal_wishart(sg, pg, th, state)
    elif code == prod.NORMAL_GAMMA:
        draw_normal_gamma(sg, pg, th, state)
    elif code == prod.CATEGORICAL:
        draw_dirichlet(sg, pg, th, state)
    elif code == prod.POISSON_GAMMA:
        # lambda_j ~ Gamma(a + sum x, b + n)
        for j in range(d):
            th[j] = gamma_variate(state, pg[j] + sg[1 + j], pg[d + j] + sg[0])
    elif code == prod.EXPONENTIAL_GAMMA:
        # lambda_j ~ Gamma(a + n, b + sum x)
        for j in range(d):
            th[j] = gamma_variate(state, pg[j] + sg[0], pg[d + j] + sg[1 + j])
    elif code == prod.BETA_BINOMIAL:
        # theta_j ~ Beta(a + sum x, b + n N_j - sum x); prior layout N (d), a (d), b (d), ...
        for j in range(d):
            u = sg[1 + j]
            lt, l1 = log_beta_variate(state, pg[d + j] + u, pg[2 * d + j] + sg[0] * pg[j] - u)
            th[j] = lt
            th[d + j] = l1
    else:
        # geometric: theta_j ~ Beta(a + n, b + sum x)
        for j in range(d):
            lt, l1 = log_beta_variate(state, pg[j] + sg[0], pg[d + j] + sg[1 + j])
            th[j] = lt
            th[d + j] = l1


@njit(cache=True, nogil=True)
def draw_params(s, th, spec, prior, toff, state):
    """theta (T,) drawn given the statistics row s (S,) (Algorithm 2, step 3(b))."""
    for g in range(spec.shape[0]):
        r = spec[g]
        _draw_group(
            r[prod.CODE],
            s[r[prod.STAT0] : r[prod.STAT0] + r[prod.NSTAT]],
            prior[r[prod.PRIOR0] : r[prod.PRIOR0] + r[prod.NPRIOR]],
            th[toff[g] : toff[g + 1]],
            r[prod.NCOL],
            state,
        )


# -- log p(x | theta) -----------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _group_log_lik(code, x, th, pg, d):
    out = 0.0
    if code == prod.GAUSSIAN_NW:
        # N(x | mu, Lambda^{-1}) with Lambda = L L^T: -d/2 log 2 pi + log|L| - |L^T (x - mu)|^2 / 2
        q = 0.0
        for j in range(d):
            acc = 0.0
            for i in range(j, d):
                acc += th[d + i * d + j] * (x[i] - th[i])
            q += acc * acc
        return -0.5 * d * LOG_2PI + th[d + d * d] - 0.5 * q
    if code == prod.NORMAL_GAMMA:
        for j in range(d):
            tau = th[d + j]
            r = x[j] - th[j]
            out += 0.5 * (math.log(tau) - LOG_2PI) - 0.5 * tau * r * r
        return out
    if code == prod.CATEGORICAL:
        C = pg.shape[0] - 2
        v = x[0]
        if not (v >= 0.0 and v < C):
            return -np.inf
        return th[int(v)]
    if code == prod.POISSON_GAMMA:
        for j in range(d):
            lam = th[j]
            out += x[j] * math.log(lam) - lam - math.lgamma(x[j] + 1.0)
        return out
    if code == prod.EXPONENTIAL_GAMMA:
        for j in range(d):
            out += math.log(th[j]) - th[j] * x[j]
        return out
    if code == prod.BETA_BINOMIAL:
        H = (pg.shape[0] - 3 * d) // d
        for j in range(d):
            N = pg[j]
            v = int(x[j])
            out += pg[3 * d + j * H + v] + x[j] * th[j] + (N - x[j]) * th[d + j]
        return out
    for j in range(d):
        out += th[j] + x[j] * th[d + j]
    return out


@njit(cache=True, nogil=True)
def log_lik(x, th, spec, prior, toff):
    """log p(x | theta) of record x (D,) under the parameters th (T,): eq. 5's likelihood."""
    out = 0.0
    for g in range(spec.shape[0]):
        r = spec[g]
        c0 = r[prod.COL0]
        out += _group_log_lik(
            r[prod.CODE],
            x[c0 : c0 + r[prod.NCOL]],
            th[toff[g] : toff[g + 1]],
            prior[r[prod.PRIOR0] : r[prod.PRIOR0] + r[prod.NPRIOR]],
            r[prod.NCOL],
        )
    return out


# -- the sampler ----------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def prior_predictive(X, spec, prior, n_stats, n_cache):
    """Eq. 6's log int p(x_n | theta) H(theta) dtheta of every record (N,)."""
    N = X.shape[0]
    s = np.zeros(n_stats)
    c = np.zeros(n_cache)
    prod.refresh(s, c, spec, prior)
    out = np.empty(N)
    for n in range(N):
        out[n] = prod.log_predictive(X[n], s, c, spec, prior)
    return out


@njit(cache=True, nogil=True)
def assignment_scan(X, order, z, stats, theta, nk, lp0, spec, prior, toff, log_alpha, state):
    """Step 3(a) of Algorithm 2 (eqs. 5-6) over X (N, D) in ``order`` (N,); z (N,) int64,
    stats (N, S), theta (N, T) and nk (N,) by slot are updated; lp0 (N,) ``prior_predictive``;
    state (1,) uint64. Returns the number of records that moved."""
    cap = stats.shape[0]
    logw = np.empty(cap + 1)
    slots = np.empty(cap + 1, dtype=np.int64)
    moved = 0
    for t in range(order.shape[0]):
        n = order[t]
        x = X[n]
        old = z[n]
        prod.add_stats(x, stats[old], spec, -1.0)
        nk[old] -= 1.0
        if nk[old] <= 0.0:
            nk[old] = 0.0
            stats[old, :] = 0.0
        m = 0
        free = -1
        for k in range(cap):
            if nk[k] > 0.0:
                logw[m] = math.log(nk[k]) + log_lik(x, theta[k], spec, prior, toff)
                slots[m] = k
                m += 1
            elif free < 0:
                free = k
        logw[m] = log_alpha + lp0[n]
        slots[m] = free
        j = rng.sample_log_weights(state, logw, m + 1)
        k = slots[j]
        prod.add_stats(x, stats[k], spec, 1.0)
        if j == m:
            draw_params(stats[k], theta[k], spec, prior, toff, state)
        nk[k] += 1.0
        if k != old:
            moved += 1
        z[n] = k
    return moved


@njit(cache=True, nogil=True)
def parameter_scan(stats, theta, nk, spec, prior, toff, state):
    """Step 3(b) of Algorithm 2: theta_k ~ p(theta | X_k) for every occupied slot."""
    for k in range(stats.shape[0]):
        if nk[k] > 0.0:
            draw_params(stats[k], theta[k], spec, prior, toff, state)


@njit(cache=True, nogil=True)
def log_joint(stats, nk, spec, prior, alpha):
    """log p(X, z | alpha), parameters integrated out (Raykov et al. 2016, eq. 2.3 times the
    marginals), as the collapsed chains report it."""
    n = 0.0
    K = 0
    out = 0.0
    for k in range(stats.shape[0]):
        if nk[k] > 0.0:
            n += nk[k]
            K += 1
            out += math.lgamma(nk[k]) + prod.log_marginal(stats[k], spec, prior)
    return out + math.lgamma(alpha) - math.lgamma(n + alpha) + K * math.log(alpha)
