"""numba kernels of dpmm-pipeline: pure functions over arrays, nothing else.

Nothing here does I/O or imports Dask, Prefect, zarr or pandas (``../shared/DESIGN.md``).
Every function is ``@njit(cache=True, nogil=True)`` so that Dask worker threads release the GIL
and a second run does not recompile.
"""
