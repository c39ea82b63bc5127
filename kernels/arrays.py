"""Copies between arrays, written as loops, a prefetch hint for the random-order scans, and the
bits of a float.

Numba lowers ``a[index] = b`` with an array ``b`` through its slice assignment, whose
shape-mismatch message is formatted by compiled code (string joins and integer formatting):
about 2.8 s of compiling in every process that compiles a kernel with one, a tenth of the demo's
whole warm-up. The kernels copy with these loops instead; a slice assigned a scalar
(``a[k, :] = 0.0``) does not take that path and stays as it is.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


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


@intrinsic
def prefetch(typingctx, arr, i):
    """Ask the CPU to bring a[i] (a 1-D array) or row a[i] (2-D, C-contiguous: its first and
    last element, which cover a row of up to 8 cache lines' span with two requests for d <= 16
    of float64) into its caches, without waiting for it: ``llvm.prefetch``, read, high
    locality. A sweep in random order issues it some records ahead, so that the record's row,
    label and score are in cache when it gets there (a miss each otherwise: 130 of 570 ns per
    record over 200,000 x 10 records in random order)."""
    if not (isinstance(arr, types.Array) and arr.ndim in (1, 2) and isinstance(i, types.Integer)):
        return None
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        if aryty.ndim == 1:
            cols = [None]
        else:
            shape = cgutils.unpack_tuple(builder, ary.shape, 2)
            last = builder.sub(shape[1], context.get_constant(types.intp, 1))
            cols = [context.get_constant(types.intp, 0), last]
        for col in cols:
            ind = [idx] if col is None else [idx, col]
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, ind, wraparound=False)
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def borrowed(typingctx, arr):
    """The array a, without its reference count: the same data, shape and strides, no owner
    (a NULL meminfo, as an array made by ``numba.carray``).

    Numba takes and drops a reference to an array (an atomic increment and decrement of its
    owner's count) wherever a variable receives it: each argument of an inlined function, each
    argument at a function's entry, each row view. In the per-record loops that is 60 to 100
    atomic operations a record, about a sixth of a sweep's time, which numba's reference-count
    pruning leaves wherever a call lies between the pair. A borrowed array's references are a
    test of NULL. Only for an array whose owner outlives every use of the borrowed one: an
    argument of the function that borrows it (the caller holds it for the call), never an array
    allocated there.
    """
    if not isinstance(arr, types.Array):
        return None
    sig = arr(arr)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, value=args[0])
        ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
        ary.parent = cgutils.get_null_value(ary.parent.type)
        return ary._getvalue()

    return sig, codegen


@intrinsic
def float_bits(typingctx, x):
    """The IEEE 754 bits of the float64 x as an int64 (a bit cast: no conversion, no memory),
    which a loop over columns can take in its vectorised body where an integer view of a float
    array would take a loop of its own (``gaussian_nw.packed_log_predictive_bounds``)."""
    if not isinstance(x, types.Float) or x.bitwidth != 64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def bits_float(typingctx, b):
    """The float64 whose IEEE 754 bits are the int64 b (``float_bits``' inverse)."""
    if not isinstance(b, types.Integer) or b.bitwidth != 64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


# The block loops (``gaussian_nw.block_quad_forms``) run over rows of 64 records in 512-bit
# vectors; a row that starts off a 64-byte line splits every load and store in two. NRT's
# allocations are 16-byte aligned, so whether a sweep's scratch was aligned depended on the heap
# (the same write-out sweep at 447-460 or 551 ns a record from one process to the next).
_LINE = 64


@njit(cache=True, nogil=True)
def aligned_matrix(rows, cols):
    """An uninitialised float64 (rows, cols) C-contiguous array whose first element starts a
    64-byte line (a view into a slightly longer allocation): with cols a multiple of 8, every
    row does.

    Parameters
    ----------
    rows, cols : int

    Returns
    -------
    ndarray of shape (rows, cols), float64
    """
    n = rows * cols
    raw = np.empty(n + _LINE // 8)
    skip = ((-raw.ctypes.data) % _LINE) // 8
    return raw[skip : skip + n].reshape((rows, cols))
