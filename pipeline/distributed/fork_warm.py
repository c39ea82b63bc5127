"""Imported by the fork server of the local cluster's worker processes, as the last module of
its preload (``pipeline.distributed.client._worker_modules``): it loads the run's kernels there,
once,
before the workers are forked from it (``pipeline.distributed.worker_setup.warm_fork_server``). The
preload, a list of modules to import, is the only hook ``multiprocessing`` gives into that
process."""

from pipeline.distributed.worker_setup import warm_fork_server

warm_fork_server()
