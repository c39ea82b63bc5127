"""numba kernels of dpmm-pipeline: pure functions over arrays, nothing else.

Nothing here does I/O or imports Dask, Prefect, zarr or pandas (docs/architecture.md).
Every function is ``@njit(cache=True, nogil=True)`` so that Dask worker threads release the GIL
and a second run does not recompile.

Three conventions keep the first run's compiling short (most of a cold ``dpmm demo``):

* arrays are copied with the loops of ``kernels.arrays``, never by assigning an array to a
  slice, whose shape-mismatch message numba builds from compiled string code;
* a helper with one caller, and each one-line overload of ``kernels.obs.product``'s family
  dispatch, is ``inline="always"``: numba compiles every jitted function as a
  library of its own and then links it, to be optimised and emitted again, into each caller's,
  so a chain of helpers is compiled once per level. Inlined, it is compiled in its caller only.
  Not for a ``fastmath`` helper (it would lose its flags) nor a ``parallel`` one, nor where
  numba's inlining, which deep-copies the helper's IR at every call site, costs more than the
  linking it saves: BHC's agglomeration and its candidate lists (``kernels.bhc``; stage 2's
  warm-up took 8.5 CPU s inlined, 6.9 s not);
* a jitted function is called with one type per argument everywhere: numba compiles one
  specialisation per argument type, and a module constant passed as an argument is a literal
  type of its own (``kernels.obs.product._span`` takes a spec row's values, not the constants
  naming its columns: four specialisations before), as an explicit None is another type than
  an omitted optional argument (``gaussian_nw.update`` calls ``refresh`` without ``cells``).
"""
