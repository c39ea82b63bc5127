"""The bookkeeping of scheduled clustering (the flow is ``flows.scheduled``): dated input
partitions, published model versions and the pointer to the latest, rejected partitions.

INPUT and MODELS are local directories or prefixes of object storage (fsspec URLs,
``pipeline.core.storage``); the layout and the guarantees are the same.

Layout
------
``INPUT/date=YYYY-MM-DD/*.parquet``
    One partition per day (tables ``pipeline.data.sources`` reads: Parquet parts, CSV files; names
    starting with ``_`` or ``.``, such as ``_SUCCESS``, are not records).
``MODELS/vN/``
    Model version N: ``model/`` (``pipeline.estimators.model``), ``run.json`` and
    ``clusters.parquet`` of the refit, and ``version.json`` (the partition date it was
    refitted for, the window of dates, the version it was warm-started from, the partition's
    fingerprint).
``MODELS/LATEST``
    The name of the newest published version (``vN``), moved after the version is complete:
    a reader that follows it always finds a complete model. Earlier versions are kept.
``MODELS/rejected/date=YYYY-MM-DD.json``
    A partition that failed validation: the error (naming the file, column and row) and the
    partition's fingerprint; the same files are not tried again, changed files are.

Writers
-------
Any number of runs may write one MODELS at once (``dpmm serve`` on a schedule and a manual
backfill, on one machine or several): each builds its version in a place of its own and
publishes it under the next free number; ``LATEST`` only moves forward, to a complete version
(``pipeline.ops.registry``, which also says how long a crashed writer can block the others).
The rejection records are replaced whole (a rename locally, one PUT on object storage).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from typing import Any

from pipeline.core import storage
from pipeline.core.errors import InputError
from pipeline.core.paths import safe_name
from pipeline.core.storage import Loc
from pipeline.ops import registry
from pipeline.ops.registry import RECORD

PARTITION = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")


def partitions(root: storage.Where) -> list[tuple[str, Loc]]:
    """(date, directory or prefix) of every ``date=YYYY-MM-DD`` partition under ``root``, by
    date. An ``InputError`` (a ``ValueError``) naming ``root`` when it does not exist or cannot
    be listed (no such bucket, no credentials)."""
    loc = storage.location(root)
    with storage.fs_errors(loc, "INPUT"):
        storage.check_reachable(loc, "INPUT")
        if not loc.is_dir():
            raise InputError(
                f"{storage.redact(str(loc))}: no such input {storage.folder(loc)} of "
                "date=YYYY-MM-DD partitions"
            )
        found = storage.subdirs(loc)
    out: list[tuple[str, Loc]] = []
    for p in found:
        m = PARTITION.match(p.name)
        if m:
            with contextlib.suppress(ValueError):  # date=2024-02-30 is no partition
                dt.date.fromisoformat(m.group(1))
                out.append((m.group(1), p))
    return sorted(out, key=lambda dp: dp[0])


def require_partitions(root: storage.Where) -> list[tuple[str, Loc]]:
    """``partitions(root)``, or an ``InputError`` naming ``root`` when there is none."""
    parts = partitions(root)
    if not parts:
        raise InputError(
            f"{storage.redact(str(root))}: holds no date=YYYY-MM-DD partitions (expected "
            "INPUT/date=2026-01-31/part-0.parquet, ...)"
        )
    return parts


def _files(path: Loc) -> dict[str, tuple[int, int | str]]:
    """Every file under a partition: relative path -> (size, version stamp)
    (``storage.file_stamps``)."""
    with storage.fs_errors(path):
        return storage.file_stamps(path)


def fingerprint(path: Loc) -> list[list[Any]]:
    """The partition's files as (relative path, size, stamp): what makes it the same. The stamp
    is the mtime in ns of a local file, the ETag (or modification time) of an object."""
    return [[rel, size, stamp] for rel, (size, stamp) in _files(path).items()]


def window_files(parts: list[tuple[str, Loc]]) -> list[str]:
    """The files of the partitions ``parts`` (date, path), in date order then name order, as
    paths or URLs: the input of a refit on the rolling window (``pipeline.data.sources`` reads such
    a
    list as one input; nothing is linked or copied). Names starting with ``_`` or ``.`` (markers
    such as ``_SUCCESS``) are left out."""
    out = []
    for _date, path in parts:
        for rel in _files(path):
            if not any(part.startswith(("_", ".")) for part in rel.split("/")):
                out.append(str(path / rel))
    return out


class Registry(registry.Registry):
    """The model versions and the pointer (``pipeline.ops.registry.Registry``) with what the
    scheduled flow keeps beside them: each version's record and the rejected partitions."""

    def record(self, n: int) -> dict[str, Any]:
        """The ``version.json`` of version ``n``."""
        return json.loads((self.version_dir(n) / RECORD).read_text())  # type: ignore[no-any-return]

    def done(self) -> dict[str, int]:
        """{partition date: the version refitted for it} (the first, when concurrent writers
        both refitted it)."""
        out: dict[str, int] = {}
        for n in self.versions():
            out.setdefault(self.record(n)["date"], n)
        return out

    def rejected(self, date: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._rejected_path(date).read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    def reject(self, date: str, path: Loc, error: str) -> dict[str, Any]:
        """Record that partition ``date`` failed validation (one atomic write)."""
        rec = {
            "date": date,
            "partition": storage.redact(str(path)),
            "error": error,
            "fingerprint": fingerprint(path),
            "rejected_at": dt.datetime.now(dt.UTC).isoformat(),
        }
        target = self._rejected_path(date)
        target.parent.mkdir(parents=True, exist_ok=True)
        storage.write_atomic(target, (json.dumps(rec, indent=2) + "\n").encode())
        return rec

    def _rejected_path(self, date: str) -> Loc:
        return self.root / "rejected" / safe_name(f"date={date}.json", "partition")


def window_dates(all_dates: list[str], done: set[str], date: str, window: int) -> list[str]:
    """The dates of the rolling window of the refit for ``date``: the last ``window`` partitions
    up to ``date`` that were accepted (refitted for, so never a rejected one) or are ``date``
    itself."""
    good = [d for d in all_dates if d <= date and (d in done or d == date)]
    return good[-int(window) :]
