"""The distributed layer: the pass loop on Dask (``loop``), the Dask client and HPC clusters,
the workers' preload, write-out, summaries, and ``fit_distributed``. Imports the layers below
(core ... engines)."""
