"""The ``dpmm`` command line: parsing, messages and exit status; the work is ``pipeline``'s.

Subcommands (one module each in ``flows.cli``): ``cluster`` (MAP-DP in this process), ``demo``,
``run`` (the distributed flow ``flows.cluster``), ``cv``, ``score``, ``serve``, ``update``,
``server``, ``longitudinal``, ``hmm`` and ``warm``.

Exit status: 0 on success; 2 on bad input or usage, 3 when the storage fails (object storage
still failing after its retries, no space left on a device, a damaged chunk:
``pipeline.core.errors.StorageError``), each with exactly one line ``dpmm: error: <message>`` on
stderr; anything unexpected raises (traceback, status 1).

A subcommand module writes ``add_<name>_parser(subparsers)`` (shared option blocks from
``flows.cli.options`` as ``parents=[...]``) and ``cmd_<name>(args) -> int``, and wraps the steps
that read user input in ``with bad_input(...)`` so that their errors become the one line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from flows.cli import prefect_api
from flows.cli.cluster import add_cluster_parser
from flows.cli.cv import add_cv_parser
from flows.cli.demo import add_demo_parser
from flows.cli.hmm import add_hmm_parser
from flows.cli.longitudinal import add_longitudinal_parser
from flows.cli.options import one_line, places
from flows.cli.run import add_run_parser
from flows.cli.score import add_score_parser
from flows.cli.serve import add_serve_parser
from flows.cli.server import add_server_parser
from flows.cli.update import add_update_parser
from flows.cli.warm import add_warm_parser
from pipeline.core import outputs, storage
from pipeline.core.errors import InputError, StorageError

PROG = "dpmm"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one ``InputError`` line instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The ``dpmm`` parser; each subcommand sets ``func(args) -> int``."""
    parser = _Parser(
        prog=PROG,
        description="Bayesian nonparametric clustering (MAP-DP for Dirichlet process mixtures).",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {outputs.versions()['dpmm-pipeline']}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    add_cluster_parser(sub)
    add_demo_parser(sub)
    add_run_parser(sub)
    add_cv_parser(sub)
    add_score_parser(sub)
    add_serve_parser(sub)
    add_update_parser(sub)
    add_server_parser(sub)
    add_longitudinal_parser(sub)
    add_hmm_parser(sub)
    add_warm_parser(sub)
    return parser


def check_paths(args: argparse.Namespace) -> None:
    """Refuse, before anything starts, an output that overlaps an input (``check_separate``)."""
    from pipeline.core.paths import check_separate

    if args.command == "demo":  # DIR holds the demo's own input and result by design
        return
    inputs: list[tuple[str, Any]] = [
        ("INPUT", getattr(args, "input", None)),
        ("MODEL", getattr(args, "model", None)),
        ("--warm-start", getattr(args, "warm_start", None)),
    ]
    if hasattr(args, "data_dir"):
        from pipeline.data.dataset import default_root

        # the stores later runs reuse: never replaced or written into by an output
        inputs.append(("--data-dir", args.data_dir or default_root()))
    outputs = [(f"--{n}", getattr(args, n, None)) for n in ("out", "models", "scores")]
    check_separate(outputs, inputs)


# the commands whose INPUT, OUT, MODEL and --data-dir may be URLs (``pipeline.core.storage``)
URL_COMMANDS = ("run", "score", "cv", "longitudinal", "hmm", "update", "serve")


def _refuse_urls(args: argparse.Namespace) -> None:
    """One line, before anything starts, for a URL given to a command that writes locally."""
    if args.command in URL_COMMANDS:
        return
    for name in ("input", "out", "model", "models", "scores", "data_dir", "warm_start"):
        value = getattr(args, name, None)
        if isinstance(value, str) and storage.is_url(value):
            raise InputError(
                f"{storage.redact(value)}: dpmm {args.command} reads and writes local paths "
                f"only (object storage URLs: dpmm {', '.join(URL_COMMANDS)})"
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dpmm`` with ``argv`` (default: this program's arguments); returns the exit status."""
    prefect_api.set_defaults()
    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        # no argv: this process is the dpmm program, whose logging ``flows.cli.logs`` may keep
        args.program = argv is None
        _refuse_urls(args)
        check_paths(args)
        return int(args.func(args))
    except (InputError, OSError) as err:
        # the storage failed, not the input (3): a run again later, or with space, may succeed
        failed = (
            err
            if isinstance(err, StorageError)
            else storage.no_space(err, [] if args is None else places(args))
        )
        if failed is None and not isinstance(err, InputError):
            raise
        print(f"{PROG}: error: {one_line(str(failed or err))}", file=sys.stderr, flush=True)
        return 2 if failed is None else 3
