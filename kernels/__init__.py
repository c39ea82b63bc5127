"""numba kernels of dpmm-pipeline: pure functions over arrays, no I/O, Dask, Prefect, zarr or
pandas (docs/architecture.md). Every function is ``@njit(cache=True, nogil=True)``: Dask's
threads release the GIL and a second run does not recompile: ``kernels._cache`` stamps each
cached kernel with every kernel source it can hold, so an edit recompiles only those.

Three conventions keep the first compile short (most of a cold ``dpmm demo``):

* arrays are copied with ``kernels.arrays``' loops, never by assigning an array to a slice;
* a helper with one caller, and each overload of ``kernels.obs.product``'s dispatch, is
  ``inline="always"``: numba compiles a jitted function as a library of its own and links it
  into each caller's, once per level of a chain. Not for a ``fastmath`` or ``parallel`` helper,
  nor where inlining's copies cost more than the linking (BHC's agglomeration: 8.5 CPU s
  inlined, 6.9 s not);
* a jitted function gets one type per argument everywhere: a module constant is a literal type
  of its own (``kernels.obs.product._span`` takes values), an explicit None another type than
  an omitted argument.
"""

from kernels._cache import install

# before any kernel module is imported: their functions find their cache as they are decorated
install()
