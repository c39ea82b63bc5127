"""Explicit random state for kernels (splitmix64), as in pynndescent's ``tau_rand``.

A state is a ``uint64`` array of shape (1,). Python seeds it from a ``numpy.random.SeedSequence``
child, so a kernel's draws depend only on the seed it was handed, never on global state.
"""

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def next_u64(state):
    """Advance ``state`` (uint64 array of shape (1,)) and return 64 random bits (splitmix64)."""
    state[0] += np.uint64(0x9E3779B97F4A7C15)
    z = state[0]
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def uniform(state):
    """A uniform draw in [0, 1) with 53 random bits."""
    return float(next_u64(state) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def randint(state, n):
    """A uniform integer in {0, ..., n - 1}."""
    return int(uniform(state) * n) % n


@njit(cache=True, nogil=True)
def sample_log_weights(state, logw, n):
    """Draw an index in {0, ..., n - 1} with probability proportional to exp(logw[i]).

    Parameters
    ----------
    state : ndarray of shape (1,), uint64
    logw : ndarray of shape (>= n,)
        Unnormalised log weights; -inf means excluded.
    n : int
        Number of leading entries of ``logw`` to use.
    """
    m = -np.inf
    for i in range(n):
        if logw[i] > m:
            m = logw[i]
    total = 0.0
    for i in range(n):
        total += math.exp(logw[i] - m)
    u = uniform(state) * total
    acc = 0.0
    last = 0
    for i in range(n):
        if logw[i] == -np.inf:
            continue
        acc += math.exp(logw[i] - m)
        last = i
        if u < acc:
            return i
    return last


@njit(cache=True, nogil=True)
def shuffle(state, a):
    """Fisher-Yates shuffle of ``a`` in place."""
    for i in range(a.shape[0] - 1, 0, -1):
        j = randint(state, i + 1)
        t = a[i]
        a[i] = a[j]
        a[j] = t
