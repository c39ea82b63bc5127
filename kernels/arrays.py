"""Copies between arrays as loops, a prefetch hint, borrowed arrays and the bits of a float.

Numba lowers ``a[index] = b`` with an array ``b`` through a slice assignment whose error message
is compiled code (2.8 s of compiling a process); the kernels copy with these loops instead (a
scalar, ``a[k, :] = 0.0``, takes no such path).
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@njit(cache=True, nogil=True)
def copy_vector(dst, src):
    """dst[t] = src[t] for t < n, dst (>= n,), src (n,)."""
    for t in range(src.shape[0]):
        dst[t] = src[t]


@njit(cache=True, nogil=True)
def copy_rows(dst, src):
    """src (n, p) into the top-left block of dst (>= n, >= p)."""
    for i in range(src.shape[0]):
        for t in range(src.shape[1]):
            dst[i, t] = src[i, t]


@njit(cache=True, nogil=True)
def add_vector(dst, src, w):
    """dst[t] += w src[t] for t < n, dst (>= n,), src (n,): a statistics row added or removed."""
    for t in range(src.shape[0]):
        dst[t] += w * src[t]


@intrinsic
def prefetch(typingctx, arr, i):
    """``llvm.prefetch`` (read, high locality) of a[i] (1-D) or row a[i] (2-D C-contiguous: its
    first and last element), issued some records ahead by the random-order sweeps."""
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
    """The array a without its owner (a NULL meminfo, as ``numba.carray`` makes): its references
    are a test of NULL, not atomic operations (a sixth of a sweep's time, docs/performance.md).
    Only for an argument of the borrowing function, never an array allocated there."""
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
    """The IEEE 754 bits of the float64 x as an int64, a bit cast a vectorised loop can take."""
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


# The block loops' rows of 64 records in 512-bit vectors: a row off a 64-byte line splits every
# load and store (NRT aligns to 16 bytes)
_LINE = 64


@njit(cache=True, nogil=True)
def aligned_matrix(rows, cols):
    """An uninitialised C-contiguous (rows, cols) float64 array starting a 64-byte line (every
    row does when cols is a multiple of 8)."""
    n = rows * cols
    raw = np.empty(n + _LINE // 8)
    skip = ((-raw.ctypes.data) % _LINE) // 8
    return raw[skip : skip + n].reshape((rows, cols))
