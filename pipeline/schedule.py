"""The bookkeeping of scheduled clustering (the flow is ``flows.scheduled``): dated input
partitions, published model versions and the pointer to the latest, rejected partitions.

Layout
------
``INPUT/date=YYYY-MM-DD/*.parquet``
    One partition per day (any files ``pipeline.sources`` reads: Parquet parts, CSV, ...).
``MODELS/vN/``
    Model version N: ``model/`` (``pipeline.model``), ``run.json`` and ``clusters.parquet`` of
    the refit, and ``version.json`` (the partition date it was refitted for, the window of dates,
    the version it was warm-started from, the partition's fingerprint). A version is written
    under ``MODELS/.vN.partial`` and renamed into place when complete.
``MODELS/LATEST``
    The name of the published version (``vN``), replaced atomically after the version's rename:
    a reader that follows it always finds a complete model. Earlier versions are kept.
``MODELS/rejected/date=YYYY-MM-DD.json``
    A partition that failed validation: the error (naming the file, column and row) and the
    partition's fingerprint; the same files are not tried again, changed files are.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from pipeline.io import write_json
from pipeline.paths import child

PARTITION = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
POINTER = "LATEST"
VERSION = re.compile(r"^v([1-9][0-9]*)$")


def partitions(root: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """(date, directory) of every ``date=YYYY-MM-DD`` directory under ``root``, by date."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: no such input directory of date=YYYY-MM-DD partitions")
    out = []
    for p in root.iterdir():
        m = PARTITION.match(p.name)
        if m and p.is_dir():
            try:
                dt.date.fromisoformat(m.group(1))
            except ValueError:
                continue
            out.append((m.group(1), p))
    return sorted(out)


def fingerprint(path: Path) -> list[list[Any]]:
    """The partition's files as (relative path, size, mtime_ns): what makes it the same."""
    return [
        [f.relative_to(path).as_posix(), f.stat().st_size, f.stat().st_mtime_ns]
        for f in sorted(path.rglob("*"))
        if f.is_file()
    ]


class Registry:
    """The model versions, the pointer and the rejected partitions under ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def versions(self) -> list[int]:
        """Published version numbers, ascending (a ``vN`` with its ``version.json``)."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = VERSION.match(p.name)
            if m and (p / "version.json").is_file():
                out.append(int(m.group(1)))
        return sorted(out)

    def latest(self) -> Path | None:
        """The published version the pointer names, or None before the first."""
        try:
            name = (self.root / POINTER).read_text().strip()
        except FileNotFoundError:
            return None
        if not VERSION.match(name) or not (self.root / name / "version.json").is_file():
            raise ValueError(f"{self.root / POINTER}: names {name!r}, not a published version")
        return self.root / name

    def record(self, n: int) -> dict[str, Any]:
        return json.loads((self.root / f"v{n}" / "version.json").read_text())  # type: ignore[no-any-return]

    def done(self) -> dict[str, int]:
        """{partition date: the version refitted for it}."""
        return {self.record(n)["date"]: n for n in self.versions()}

    def rejected(self, date: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._rejected_path(date).read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    def reject(self, date: str, path: Path, error: str) -> dict[str, Any]:
        """Record that partition ``date`` failed validation (written atomically)."""
        rec = {
            "date": date,
            "partition": str(path),
            "error": error,
            "fingerprint": fingerprint(path),
            "rejected_at": dt.datetime.now(dt.UTC).isoformat(),
        }
        target = self._rejected_path(date)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        write_json(tmp, rec)
        os.replace(tmp, target)
        return rec

    def _rejected_path(self, date: str) -> Path:
        return child(self.root / "rejected", f"date={date}.json", "partition")

    def stage(self) -> tuple[int, Path]:
        """The next version number and an empty directory to build it in."""
        self.root.mkdir(parents=True, exist_ok=True)
        n = max(self.versions(), default=0) + 1
        staged = self.root / f".v{n}.partial"
        if staged.exists():
            shutil.rmtree(staged)
        staged.mkdir()
        return n, staged

    def publish(self, n: int, staged: Path, record: dict[str, Any]) -> Path:
        """Write ``version.json`` into ``staged``, rename it to ``vN``, then switch the pointer
        (the last step: until then readers use the previous version)."""
        write_json(staged / "version.json", {"version": n, **record})
        final = self.root / f"v{n}"
        os.replace(staged, final)
        self._point_to(n)
        return final

    def _point_to(self, n: int) -> None:
        tmp = self.root / f".{POINTER}.tmp"
        tmp.write_text(f"v{n}\n")
        os.replace(tmp, self.root / POINTER)

    def finish_publish(self) -> int | None:
        """Complete a publish interrupted between the version's rename and the pointer switch:
        point to the newest complete version if the pointer is missing or older. Returns the
        version switched to, or None when nothing was to do."""
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


def link_window(target: Path, parts: list[tuple[str, Path]]) -> Path:
    """A directory of symbolic links to the files of the partitions ``parts`` (date, path),
    ``target/date=D/...``: the window as one input, nothing copied."""
    for date, path in parts:
        for f in sorted(path.rglob("*")):
            if f.is_file() and not f.name.startswith(("_", ".")):
                link = target / f"date={date}" / f.relative_to(path)
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(f.resolve())
    return target
