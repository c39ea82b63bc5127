"""The GPU half of a MAP-DP / Bayes K-means pass (numba CUDA kernels; ``pipeline.engines.gpu``).

The chunk's records stay on the card as float32 (arithmetic in float64). ``assign`` scores
every training record against the K frozen clusters and a new one by the MAP-DP cost (Raykov et
al. 2016, eqs. 3.1-3.2; Bayes K-means', Xu et al. 2009, Section 5), q_{i,k} - log N_{k,-i} (k0
by the leave-one-out predictive) or q_{i,K+1} - log N0, q the Normal-Wishart Student-t's, and
takes the argmin (ties: lowest; a record alone stays); the host resolves label K (a new
cluster) and K + 1 (no closed-form leave-one-out). ``label_deltas`` sums each frozen cluster's
change of (1, x)(1, x)^T's upper triangle over the records that moved to another, in fixed tiles
in record order and then in block order: no atomic adds, the same bits on every run and card.

``pack``: column k of P is ``gaussian_nw.pack_column``'s, then log N_k, log(N_k - 1), N_k and
the leave-one-out terms (beta = c_k / (c_k - 1), constant, exponent; with cells G_k's factor V
and V m_k); column K is the empty cluster's.
"""

import math

import numpy as np
from numba import float64, njit

from kernels.cuda_device import import_cuda, simulated
from kernels.obs import gaussian_nw

cuda = import_cuda()

#: the most columns a record may have (a per-thread array, and TILE rows of them in a block's
#: shared memory)
MAX_D = 40
#: records per tile of ``_deltas``
TILE = 128
#: the most statistics slots (K clusters x (d + 1)(d + 2) / 2) one thread of ``_deltas`` sums
MAX_SLOTS_PER_THREAD = 48
#: the most blocks of ``_deltas`` (their partials: MAX_BLOCKS x K x S3 float64)
MAX_BLOCKS = 1024
#: shared memory a kernel may take for its packed clusters
SHARED_BYTES = 40 * 1024


def threads_per_block():
    """128 on a card; 32 under the simulator (a Python thread per CUDA thread)."""
    return 32 if simulated() else 128


# -- packing ----------------------------------------------------------------------------------


def n_rows(d):
    """Rows of the packed clusters P for records of d columns (module docstring)."""
    T = d * (d + 1) // 2
    return T + d + 9 + T + d


@njit(cache=True)
def pack(cache, nk, K, empty_c, prior, d):
    """The packed clusters P (``n_rows(d)``, K + 1) of cache rows 0..K-1 (sizes nk) and the
    empty cache (module docstring)."""
    T = d * (d + 1) // 2
    e0 = T + d
    w0 = e0 + 9
    P = np.zeros((2 * (T + d) + 9, K + 1))
    cells = gaussian_nw.has_cells(prior, d)
    t = 2 * d * d + 2 * d
    for k in range(K + 1):
        c = cache[k] if k < K else empty_c
        gaussian_nw.pack_column(P, k, c, d)
        n = nk[k] if k < K else 0.0
        P[e0 + 3, k] = math.log(n) if n > 0.0 else -np.inf
        P[e0 + 4, k] = math.log(n - 1.0) if n - 1.0 > 0.5 else -np.inf
        P[e0 + 5, k] = n
        ck = c[t]
        ak = c[t + 1]
        c1 = ck - 1.0
        P[e0 + 6, k] = ck / c1 if c1 > 0.0 else np.nan
        if n - 1.0 <= 0.5:
            continue
        P[e0 + 8, k] = 0.5 * (ak - 1.0)
        if not cells:
            P[e0 + 7, k] = gaussian_nw.loo_constant(c, d)
            continue
        e = t + 4
        P[e0 + 7, k] = gaussian_nw.loo_cells_constant(c, d)
        # V and b = V m_k packed as U and b are (a NaN V leaves the constant NaN: unsure)
        o = d * d
        r = w0
        for i in range(d):
            acc = 0.0
            for j in range(i + 1):
                v = c[e + i * d + j]
                P[r, k] = v
                r += 1
                acc += v * c[o + j]
            P[w0 + T + i, k] = acc
    return P


# -- the assignment kernel --------------------------------------------------------------------


@cuda.jit(device=True)
def _quad(x, P, C, k, base, d):
    """|W (x - m)|^2, W packed from row base of column k of the flat P (C columns), b after."""
    T = d * (d + 1) // 2
    q = 0.0
    e = base
    for i in range(d):
        acc = -P[(base + T + i) * C + k]
        for j in range(i + 1):
            acc += P[e * C + k] * x[j]
            e += 1
        q += acc * acc
    return q


@cuda.jit(device=True)
def _best(x, k0, P, K, d, log_new, cells):
    """Argmin of the costs (module docstring) for record x in cluster k0 (-1: none); P flat,
    K + 1 columns."""
    C = K + 1
    T = d * (d + 1) // 2
    e0 = T + d
    best = -1
    best_cost = math.inf
    unsure = False
    for k in range(K + 1):
        q = _quad(x, P, C, k, 0, d)
        lp = P[e0 * C + k] - P[(e0 + 2) * C + k] * math.log1p(q * P[(e0 + 1) * C + k])
        if k == K:
            cost = -lp - log_new
        elif k == k0:
            lognm1 = P[(e0 + 4) * C + k]
            if lognm1 == -math.inf:
                continue
            r = _quad(x, P, C, k, e0 + 9, d) if cells else q
            om = 1.0 - P[(e0 + 6) * C + k] * r
            c = P[(e0 + 7) * C + k]
            if not (om > 0.0 and c == c):
                unsure = True
                continue
            cost = -(c + P[(e0 + 8) * C + k] * math.log(om)) - lognm1
        else:
            lognk = P[(e0 + 3) * C + k]
            if lognk == -math.inf:
                continue
            cost = -lp - lognk
        if cost < best_cost:
            best_cost = cost
            best = k
    if unsure or best < 0:
        return K + 1
    if best == K and k0 >= 0 and P[(e0 + 5) * C + k0] == 1.0:
        return k0
    return best


@cuda.jit
def _assign(X, train, z_old, P, K, log_new, cells, in_shared, z_new):
    """z_new[i] = ``_best`` of a training record, z_old[i] otherwise, a thread a record; the flat
    P first copied to shared memory with ``in_shared``."""
    Ps = cuda.shared.array(0, dtype=float64)
    if in_shared:
        for j in range(cuda.threadIdx.x, P.shape[0], cuda.blockDim.x):
            Ps[j] = P[j]
        cuda.syncthreads()
    i = cuda.grid(1)
    if i < X.shape[0]:
        k0 = z_old[i]
        if train[i] == 0:
            z_new[i] = k0
        else:
            d = X.shape[1]
            x = cuda.local.array(MAX_D, dtype=float64)
            for j in range(d):
                x[j] = X[i, j]
            if in_shared:
                z_new[i] = _best(x, k0, Ps, K, d, log_new, cells)
            else:
                z_new[i] = _best(x, k0, P, K, d, log_new, cells)


def to_device(a):
    """A host array on the device."""
    return cuda.to_device(np.ascontiguousarray(a))


def check_width(d):
    """Refuse records wider than the kernels' per-thread and per-tile arrays."""
    if d > MAX_D:
        raise ValueError(f"the GPU kernels take records of at most {MAX_D} columns, got {d}")


def assign(dX, dtrain, z_old, P, K, log_new, cells):
    """The parallel assignment step (module docstring) over the chunk on the device.

    Parameters
    ----------
    dX : device array of shape (n, d), float32
    dtrain : device array of shape (n,), uint8
        1: a training record, 0: held out (keeps z_old).
    z_old : ndarray of shape (n,), int32
        Labels 0..K-1, or -1.
    P : ndarray of shape (n_rows(d), K + 1)
        ``pack`` of the frozen clusters.
    K : int
    log_new : float
    cells : bool

    Returns
    -------
    z_new : ndarray of shape (n,), int32
        0..K-1, K or K + 1 (module docstring).
    dz_old, dz_new : the labels on the device, for ``label_deltas``
    """
    n, d = dX.shape
    check_width(d)
    dz_old = to_device(z_old.astype(np.int32))
    dz_new = cuda.device_array(n, dtype=np.int32)
    tpb = threads_per_block()
    in_shared = P.size * 8 <= SHARED_BYTES
    blocks = max((n + tpb - 1) // tpb, 1)
    flat = to_device(np.ascontiguousarray(P).ravel())
    _assign[blocks, tpb, 0, P.size * 8 if in_shared else 0](
        dX, dtrain, dz_old, flat, K, log_new, bool(cells), in_shared, dz_new
    )
    return dz_new.copy_to_host(), dz_old, dz_new


# -- the statistics kernels -------------------------------------------------------------------


@cuda.jit
def _deltas(X, z_old, z_new, K, tiles_per_block, partials):
    """partials[b, s]: block b's sum over its tiles' moved records (b, b + G, ...) of
    (1, x)(1, x)^T's upper triangle, - to the old cluster's slots and + to the new one's;
    thread t owns slots t, t + blockDim, ..."""
    nb = cuda.blockDim.x
    t = cuda.threadIdx.x
    n = X.shape[0]
    d = X.shape[1]
    S3 = (d + 1) * (d + 2) // 2
    n_slots = K * S3
    acc = cuda.local.array(MAX_SLOTS_PER_THREAD, dtype=float64)
    pk = cuda.local.array(MAX_SLOTS_PER_THREAD, dtype=np.int32)
    pp = cuda.local.array(MAX_SLOTS_PER_THREAD, dtype=np.int32)
    pq = cuda.local.array(MAX_SLOTS_PER_THREAD, dtype=np.int32)
    mine = 0
    for s in range(t, n_slots, nb):
        acc[mine] = 0.0
        pk[mine] = s // S3
        # the c-th entry of the upper triangle of a (d + 1) x (d + 1) matrix, row by row
        c = s % S3
        p = 0
        width = d + 1
        while c >= width:
            c -= width
            p += 1
            width -= 1
        pp[mine] = p
        pq[mine] = p + c
        mine += 1
    la = cuda.shared.array(TILE, dtype=np.int32)
    lb = cuda.shared.array(TILE, dtype=np.int32)
    pos = cuda.shared.array(TILE, dtype=np.int32)
    moved = cuda.shared.array(1, dtype=np.int32)
    # the tile's moved records as rows (1, x)
    xs = cuda.shared.array(0, dtype=float64)
    G = cuda.gridDim.x
    for m in range(tiles_per_block):
        start = (cuda.blockIdx.x + m * G) * TILE
        cuda.syncthreads()
        for r in range(t, TILE, nb):
            i = start + r
            a = -1
            b = -1
            if i < n:
                a = z_old[i]
                b = z_new[i]
            la[r] = a
            lb[r] = b
        cuda.syncthreads()
        if t == 0:
            cnt = 0
            for r in range(TILE):
                if la[r] != lb[r] and lb[r] < K:
                    pos[r] = cnt
                    cnt += 1
                else:
                    pos[r] = -1
            moved[0] = cnt
        cuda.syncthreads()
        for r in range(t, TILE, nb):
            h = pos[r]
            if h >= 0:
                base = h * (d + 1)
                xs[base] = 1.0
                for j in range(d):
                    xs[base + 1 + j] = X[start + r, j]
        cuda.syncthreads()
        for r in range(TILE):
            h = pos[r]
            if h < 0:
                continue
            a = la[r]
            b = lb[r]
            base = h * (d + 1)
            for j in range(mine):
                k = pk[j]
                if k == a:
                    acc[j] -= xs[base + pp[j]] * xs[base + pq[j]]
                elif k == b:
                    acc[j] += xs[base + pp[j]] * xs[base + pq[j]]
    mine = 0
    for s in range(t, n_slots, nb):
        partials[cuda.blockIdx.x, s] = acc[mine]
        mine += 1


@cuda.jit
def _sum_blocks(partials, out):
    """out[s] = sum over blocks of partials[:, s], in block order."""
    s = cuda.grid(1)
    if s < out.shape[0]:
        a = 0.0
        for b in range(partials.shape[0]):
            a += partials[b, s]
        out[s] = a


def label_deltas(dX, dz_old, dz_new, K):
    """delta (K, 1 + d + d^2): the change of each frozen cluster's statistics by the moves
    from dz_old to dz_new (n,) int32 of dX (n, d) (new labels >= K left out)."""
    n, d = dX.shape
    check_width(d)
    S3 = (d + 1) * (d + 2) // 2
    delta = np.zeros((K, 1 + d + d * d))
    if K == 0 or n == 0:
        return delta
    tpb = threads_per_block()
    while K * S3 > tpb * MAX_SLOTS_PER_THREAD and tpb < 1024:
        tpb *= 2
    if K * S3 > tpb * MAX_SLOTS_PER_THREAD:
        raise ValueError(
            f"{K} clusters of {d} columns exceed the statistics kernel's "
            f"{1024 * MAX_SLOTS_PER_THREAD} slots"
        )
    tiles = (n + TILE - 1) // TILE
    G = min(tiles, MAX_BLOCKS)
    per_block = (tiles + G - 1) // G
    partials = cuda.device_array((G, K * S3), dtype=np.float64)
    _deltas[G, tpb, 0, TILE * (d + 1) * 8](dX, dz_old, dz_new, K, per_block, partials)
    out = cuda.device_array(K * S3, dtype=np.float64)
    _sum_blocks[(K * S3 + tpb - 1) // tpb, tpb](partials, out)
    tri = out.copy_to_host().reshape(K, S3)
    return full_stats(tri, d, delta)


@njit(cache=True)
def full_stats(tri, d, out):
    """out (K, 1 + d + d^2) from the upper triangles tri (K, (d + 1)(d + 2) / 2)."""
    for k in range(tri.shape[0]):
        c = 0
        for p in range(d + 1):
            for q in range(p, d + 1):
                v = tri[k, c]
                c += 1
                if p == 0:
                    out[k, q] = v  # q == 0: n; else sum x_{q-1}
                else:
                    out[k, 1 + d + (p - 1) * d + (q - 1)] = v
                    out[k, 1 + d + (q - 1) * d + (p - 1)] = v
    return out
