"""Prefect flows of dpmm-pipeline: orchestration only (parameters, retries, checkpoints); the
work is done by ``pipeline`` functions on Dask (docs/architecture.md).

* ``flows.cluster.cluster`` - ingest, stage-1 passes, stage 2, write-out (``dpmm run``).
"""
