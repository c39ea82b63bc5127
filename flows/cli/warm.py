"""``dpmm warm`` (``make install``, the image's build): every engine's kernels for every spec type
(``warm_kernels(every_product=True)``; an in-memory fit's among them), compiled into the numba
cache before their first use by two processes sharing the rounds and their steps
(``warmup.run_rounds``)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

_WARM = "from pipeline.distributed.worker_setup import warm_kernels as w; w(every_product=True)"


def add_warm_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``warm`` to an ``argparse`` subparsers object; it sets ``func=cmd_warm``."""
    p = subparsers.add_parser(
        "warm", help="compile every engine's numba kernels into NUMBA_CACHE_DIR ahead of use"
    )
    p.set_defaults(func=cmd_warm)
    return p


def cmd_warm(args: argparse.Namespace) -> int:
    """The warm-up in two processes at once; status 1 if one of them failed."""
    procs = [subprocess.Popen([sys.executable, "-c", _WARM]) for _ in range(2)]
    return 1 if any(p.wait() for p in procs) else 0
