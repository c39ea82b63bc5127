"""Copies between arrays, written as loops.

Numba lowers ``a[index] = b`` with an array ``b`` through its slice assignment, whose
shape-mismatch message is formatted by compiled code (string joins and integer formatting):
about 2.8 s of compiling in every process that compiles a kernel with one, a tenth of the demo's
whole warm-up. The kernels copy with these loops instead; a slice assigned a scalar
(``a[k, :] = 0.0``) does not take that path and stays as it is.
"""

from numba import njit


@njit(cache=True, nogil=True)
def copy_vector(dst, src):
    """dst[t] = src[t] for t < len(src).

    Parameters
    ----------
    dst : ndarray of shape (m,), m >= n, output
    src : ndarray of shape (n,)
    """
    for t in range(src.shape[0]):
        dst[t] = src[t]


@njit(cache=True, nogil=True)
def copy_rows(dst, src):
    """dst[i, t] = src[i, t] for i < src.shape[0], t < src.shape[1]: ``src`` into the top-left
    block of ``dst``.

    Parameters
    ----------
    dst : ndarray of shape (m, q), m >= n, q >= p, output
    src : ndarray of shape (n, p)
    """
    for i in range(src.shape[0]):
        for t in range(src.shape[1]):
            dst[i, t] = src[i, t]


@njit(cache=True, nogil=True)
def add_vector(dst, src, w):
    """dst[t] += w src[t] for t < len(src): a statistics row added (w = 1) or removed (w = -1).

    Parameters
    ----------
    dst : ndarray of shape (m,), m >= n, output
    src : ndarray of shape (n,)
    w : float
    """
    for t in range(src.shape[0]):
        dst[t] += w * src[t]
