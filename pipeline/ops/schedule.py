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
    ``clusters.parquet`` of
    the refit, and ``version.json`` (the partition date it was refitted for, the window of dates,
    the version it was warm-started from, the partition's fingerprint).
``MODELS/LATEST``
    The name of the published version (``vN``), switched last: a reader that follows it always
    finds a complete model. Earlier versions are kept.
``MODELS/rejected/date=YYYY-MM-DD.json``
    A partition that failed validation: the error (naming the file, column and row) and the
    partition's fingerprint; the same files are not tried again, changed files are.

Visibility
----------
Local: a version is built in ``MODELS/.vN.partial`` and renamed to ``vN`` when complete; the
pointer and the rejection records are replaced by a rename (``storage.write_atomic``).
Object storage, which has no rename: a version is built under its own prefix ``MODELS/vN/``
and becomes visible when its manifest (``outputs.commit``: every object and its size) is
written, last; a ``vN`` without one (a crashed attempt) is no version: it is ignored, and the
next attempt at that number removes it before writing anything. The pointer and the rejection
records are single small objects, each written by one PUT, which S3 applies whole. So in both
cases the order is: the version complete, then visible, then the pointer; a crash between the
last two leaves the pointer on the previous version until ``finish_publish`` (the next run)
switches it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import Any

from pipeline.core import outputs, storage
from pipeline.core.errors import InputError
from pipeline.core.outputs import write_json
from pipeline.core.paths import safe_name
from pipeline.core.storage import Loc

PARTITION = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
POINTER = "LATEST"
VERSION = re.compile(r"^v([1-9][0-9]*)$")
RECORD = "version.json"


def _is_date(text: str) -> bool:
    try:
        dt.date.fromisoformat(text)
    except ValueError:
        return False
    return True


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
        if m and _is_date(m.group(1)):
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


@contextlib.contextmanager
def _fs_errors(loc: Loc) -> Iterator[None]:
    """Turn a file system's failure under ``loc`` into a one-line ``InputError``."""
    try:
        yield
    except ValueError:
        raise
    except Exception as err:  # the file system's own: no bucket, no credentials, denied...
        raise storage.fs_error(str(loc), err) from err


class Registry:
    """The model versions, the pointer and the rejected partitions under ``root`` (a local
    directory or a prefix of object storage: module docstring)."""

    def __init__(self, root: storage.Where) -> None:
        self.root: Loc = storage.location(root)

    def __repr__(self) -> str:
        return f"Registry({storage.redact(str(self.root))!r})"

    def version_dir(self, n: int) -> Loc:
        return self.root / f"v{int(n)}"

    def _published(self, p: Loc) -> bool:
        # a vN is renamed into place whole, or counts once its manifest is there; the record
        # tells it from a folder of that name that is not a version
        return outputs.committed(p) and (p / RECORD).is_file()

    def versions(self) -> list[int]:
        """Published version numbers, ascending (module docstring: a ``vN`` still being written,
        or left by a crash, is not one)."""
        with _fs_errors(self.root):
            if not self.root.is_dir():
                return []
            out = []
            for p in self.root.iterdir():
                m = VERSION.match(p.name)
                if m and self._published(p):
                    out.append(int(m.group(1)))
        return sorted(out)

    def latest(self) -> Loc | None:
        """The published version the pointer names, or None before the first."""
        pointer = self.root / POINTER
        try:
            name = pointer.read_text().strip()
        except FileNotFoundError:
            return None
        if not VERSION.match(name) or not self._published(self.root / name):
            raise ValueError(
                f"{storage.redact(str(pointer))}: names {name!r}, not a published version"
            )
        return self.root / name

    def record(self, n: int) -> dict[str, Any]:
        """The ``version.json`` of version ``n``."""
        return json.loads((self.version_dir(n) / RECORD).read_text())  # type: ignore[no-any-return]

    def done(self) -> dict[str, int]:
        """{partition date: the version refitted for it}."""
        return {self.record(n)["date"]: n for n in self.versions()}

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

    def stage(self) -> tuple[int, Loc]:
        """The next version number and an empty place to build it in (``outputs.stage``:
        ``.vN.partial`` locally, the prefix ``vN`` itself on object storage, invisible until
        ``publish`` writes its manifest). What a crashed attempt left there is removed first."""
        self.root.mkdir(parents=True, exist_ok=True)
        n = max(self.versions(), default=0) + 1
        # never a published version: versions() would have counted it
        return n, outputs.stage(self.version_dir(n))

    def publish(self, n: int, staged: Loc, record: dict[str, Any]) -> Loc:
        """Write ``version.json`` into ``staged``, make the version visible (local: rename to
        ``vN``; object storage: its manifest, last), then switch the pointer (the last step:
        until then readers use the previous version)."""
        self.write_version(n, staged, record)
        self._point_to(n)
        return self.version_dir(n)

    def write_version(self, n: int, staged: Loc, record: dict[str, Any]) -> Loc:
        """The first half of ``publish``: version ``n`` complete and visible, the pointer not
        switched yet (what a crash between the two leaves; ``finish_publish`` completes it)."""
        write_json(staged / RECORD, {"version": n, **record})
        final = self.version_dir(n)
        outputs.publish(staged, final)
        return final

    def _point_to(self, n: int) -> None:
        storage.write_atomic(self.root / POINTER, f"v{n}\n".encode())

    def finish_publish(self) -> int | None:
        """Complete a publish interrupted between the version becoming visible and the pointer
        switch: point to the newest published version if the pointer is missing or older.
        Returns the version switched to, or None when nothing was to do."""
        versions = self.versions()
        if not versions:
            return None
        current = self.latest()
        if current is not None and int(current.name[1:]) >= versions[-1]:
            return None
        self._point_to(versions[-1])
        return versions[-1]


def window_dates(all_dates: list[str], done: set[str], date: str, window: int) -> list[str]:
    """The dates of the rolling window of the refit for ``date``: the last ``window`` partitions
    up to ``date`` that were accepted (refitted for, so never a rejected one) or are ``date``
    itself."""
    good = [d for d in all_dates if d <= date and (d in done or d == date)]
    return good[-int(window) :]
