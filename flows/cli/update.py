"""``dpmm update MODEL INPUT --out NEW_MODEL``: one ASUGS-PM pass (Tsiligkaridis and Forsythe 2015)
of the records of INPUT into the clusters of a saved model, saved as a new model
(``pipeline.estimators.update``).

NEW_MODEL is written to a temporary sibling and renamed when complete; MODEL is not changed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flows.cli.options import SEED
from flows.cli.types import positive_float as _positive_float
from pipeline.core import outputs, storage
from pipeline.core.errors import InputError
from pipeline.data import sources


def add_update_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``update`` to an ``argparse`` subparsers object; it sets ``func=cmd_update``."""
    from pipeline.core.config import ASUGS_LAM as DEFAULT_LAM

    p = subparsers.add_parser(
        "update",
        help="update a saved model with new records (one ASUGS-PM streaming pass)",
        description="Stream the records of INPUT, once and in order, into the clusters of the "
        "saved MODEL with ASUGS-PM (adaptive sequential updating and greedy search with pruning "
        "and merging) and save the updated model to NEW_MODEL.",
        parents=[SEED],
    )
    p.add_argument("model", metavar="MODEL", help="a saved model directory")
    p.add_argument("input", metavar="INPUT", help=".csv, .csv.gz, .tsv, .parquet, .pq or .npy")
    p.add_argument("--out", required=True, metavar="NEW_MODEL", help="the updated model")
    p.add_argument(
        "--lam",
        type=_positive_float,
        default=DEFAULT_LAM,
        metavar="F",
        help=f"lambda of alpha_i = k_i / (lambda + log i) (default {DEFAULT_LAM:g})",
    )
    p.add_argument(
        "--select",
        choices=("greedy", "sample"),
        default="greedy",
        help="a record's class: the most probable (default) or a draw",
    )
    p.add_argument(
        "--no-prune-merge",
        action="store_true",
        help="plain ASUGS: no pruning of small classes, no merging",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing NEW_MODEL")
    p.add_argument("--quiet", action="store_true", help="no summary line")
    p.set_defaults(func=cmd_update)
    return p


def cmd_update(args: argparse.Namespace) -> int:
    """``dpmm update`` (module docstring)."""
    from flows.cli.options import bad_input
    from pipeline.estimators.model import load_model, save_model
    from pipeline.estimators.update import update_model

    model_path, inp, out = args.model, args.input, args.out
    out_loc = storage.location(out)
    if outputs.committed(out_loc) and not args.overwrite:
        shown = storage.redact(str(out))
        raise InputError(f"--out {shown}: already exists (pass --overwrite to replace it)")
    if storage.same_place(model_path, out_loc):
        raise InputError(f"--out {out}: is MODEL itself; write the update to a new path")
    with bad_input(prefix=str(model_path)):
        model = load_model(model_path)
    with bad_input(prefix=str(inp)):
        df = sources.read_table(inp)
    with bad_input(prefix=str(inp), rows_of=inp):
        new, stream = update_model(
            model,
            df,
            lam=args.lam,
            select=args.select,
            prune_merge=not args.no_prune_merge,
            random_state=args.seed,
        )
    update = {
        "from_model": storage.redact(str(model_path)),
        "input": storage.redact(str(inp)),
        "records": int(df.shape[0]),
        "method": "ASUGS-PM" if not args.no_prune_merge else "ASUGS",
        "lam": float(args.lam),
        "select": args.select,
        "seed": int(args.seed),
        "clusters_before": int(model.n_clusters_),
        "clusters_after": int(stream.n_clusters_),
        "pruned": int(stream.n_pruned_),
        "merges": int(stream.n_merged_),
        "records_in_pruned_classes": int((stream.labels_ < 0).sum()),
    }
    # the model's own metadata (a run's input, passes, ...) stays, with every update after it
    meta = dict(getattr(model, "model_metadata_", None) or {})
    meta["updates"] = [*meta.get("updates", []), update]
    with bad_input(prefix=f"--out {out}"):
        # staged beside NEW_MODEL and renamed into place when complete
        save_model(new, out, overwrite=True, engine=getattr(model, "engine_", None), metadata=meta)
    if not args.quiet:
        k0 = int(model.n_clusters_)
        print(
            f"{df.shape[0]:,} records streamed into {k0} clusters: {stream.n_clusters_} clusters "
            f"now ({stream.n_pruned_} pruned, {stream.n_merged_} merges, "
            f"{int((stream.labels_ < 0).sum())} records in pruned classes), alpha "
            f"{float(new.alpha_):.4g} -> {storage.redact(str(out))}",
            file=sys.stdout,
            flush=True,
        )
    return 0
