"""``dpmm warm`` (``make install``, the image's build): every engine's kernels for every spec type
(``warm_kernels(every_product=True)``; an in-memory fit's among them) and stage 2's (BHC and
tree-guided MCMC), compiled into the numba cache before their first use by two processes sharing
the rounds and their steps (``warmup.run_rounds``). ``--portable``: into the shipped kernels
instead, for any CPU of this architecture (``make wheel``, the image's build). Meanwhile the
commands' temporary Prefect server creates its database under ``PREFECT_HOME``, unless an API is
configured."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

from flows.cli import prefect_api
from pipeline.core.errors import InputError

_WARM = (
    "from pipeline.distributed.worker_setup import warm_kernels as w; "
    "from pipeline.ops.stage2 import MCMC_STEP; w(every_product=True, more_stage2=[MCMC_STEP])"
)


def add_warm_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``warm`` to an ``argparse`` subparsers object; it sets ``func=cmd_warm``."""
    p = subparsers.add_parser(
        "warm",
        help="compile every engine's numba kernels into NUMBA_CACHE_DIR ahead of use",
        description="Compile every engine's numba kernels ahead of their first use: into the "
        "numba cache (NUMBA_CACHE_DIR) for this machine's CPU, or with --portable into the "
        "package's shipped kernels (kernels/_compiled), for any CPU of this architecture. "
        "Meanwhile Prefect's temporary server is started once, so that its database under "
        "PREFECT_HOME is made before the first command (unless PREFECT_API_URL is set).",
    )
    p.add_argument(
        "--portable",
        action="store_true",
        help="compile for any CPU of this architecture into kernels/_compiled, which a wheel "
        "built afterwards ships (make wheel): its installs load the kernels there instead of "
        "compiling them. The folder is emptied first; the numba cache is left alone",
    )
    p.set_defaults(func=cmd_warm)
    return p


def cmd_warm(args: argparse.Namespace) -> int:
    """The warm-up in two processes at once; status 1 if one of them failed."""
    env = None
    if args.portable:
        from pipeline.engines import warmup

        try:
            warmup.clear_shipped()
        except OSError as err:
            raise InputError(f"--portable: {err.filename}: {err.strerror}") from None
        env = {**os.environ, **warmup.portable_env()}
    # this machine's commands start Prefect's temporary server, which creates its database under
    # PREFECT_HOME the first time (the migrations: 12 s of a 21-s start on a 2-core machine):
    # started here too, alongside the compiling, the first command (an image's too) finds it made
    prefect_api.prestart()
    procs = [subprocess.Popen([sys.executable, "-c", _WARM], env=env) for _ in range(2)]
    failed = [p.wait() for p in procs]
    # a server that did not start leaves the database to the first command, as before
    prefect_api.ready()
    prefect_api.stop()
    return 1 if any(failed) else 0
