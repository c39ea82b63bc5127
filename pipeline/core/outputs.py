"""A command's output directory: written whole or not at all, and the JSON it records.

``staged_dir`` and ``write_outputs`` write a run's results into a temporary sibling directory
(``.<name>.partial-<pid>-<tag>``, the writer's own; ``.<name>.partial`` for a run that resumes,
``pipeline.core.paths.temp_sibling``) that is renamed into place, atomically, only when everything
has been written: a failure leaves no partial output directory, an existing one is replaced only
on success, and two writers of one output never remove each other's work. ``versions`` is what
run.json records of the software.

Atomic visibility without rename
--------------------------------
Object stores have no atomic rename of a prefix. A local output is written beside its final
name and renamed into place (``pipeline.core.paths.commit_dir``); an output on object storage is
written under its own prefix and becomes visible when its manifest (``MANIFEST``, the list of
its objects and their sizes) is written, last: ``commit``. Readers call ``require_visible``:
a prefix counts only when a manifest at it or above it lists it, so a run that is still writing
or that crashed shows nothing, and running it again resumes (``pipeline.ops.run``). Each
object is written whole by one PUT, so a single small file (a checkpoint, ``format.json``)
needs no rename either.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.core import storage
from pipeline.core.errors import InputError, StorageError
from pipeline.core.paths import commit_dir, safe_name, temp_sibling
from pipeline.core.storage import (
    Loc,
    RemotePath,
    Where,
    check_reachable,
    fs_error,
    location,
    redact,
    rmtree,
)


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary sibling of ``out`` to write into; renamed to ``out`` if the block succeeds.

    The temporary directory is the writer's own (``prepare_output``, never resumed). On any
    exception it is removed and ``out`` is left as it was; on success an existing ``out`` is
    replaced.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    tmp = prepare_output(out, None, True)[0]
    assert isinstance(tmp, Path)
    try:
        yield tmp
        publish_output(tmp, out, True, kind="")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON in ``path``; None when it is missing or does not parse."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: Any, obj: Mapping[str, Any]) -> None:
    """``obj`` as indented JSON; numpy scalars / arrays become numbers / lists, NaN and inf null.
    ``path`` may be an object on object storage (``pipeline.core.storage``): one PUT."""
    text = json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n"
    storage.location(path).write_text(text, encoding="utf-8")


def write_outputs(
    directory: str | os.PathLike[str],
    tables: Mapping[str, pd.DataFrame] | None = None,
    json_files: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Path]:
    """Write ``tables`` as ``<directory>/<name>.parquet`` and ``json_files`` as ``<name>.json``.

    ``directory`` is normally the path yielded by ``staged_dir``. Returns the files written.
    """
    d = Path(directory)
    written = []
    for stem, df in (tables or {}).items():
        f = d / f"{safe_name(stem, 'table')}.parquet"
        df.to_parquet(f, index=False)
        written.append(f)
    for stem, obj in (json_files or {}).items():
        f = d / f"{safe_name(stem, 'record')}.json"
        write_json(f, obj)
        written.append(f)
    return written


def versions() -> dict[str, str]:
    """Versions of Python and of what a run depends on, for run.json ("not installed" for a
    distribution that is absent)."""
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for dist in (
        "dpmm-pipeline",
        "numpy",
        "numba",
        "pandas",
        "scikit-learn",
        "dask",
        "distributed",
        "zarr",
        "prefect",
    ):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def commit(loc: Loc, **extra: Any) -> None:
    """Make the prefix ``loc`` visible: write its manifest (every object under it, and its
    size), last. A local directory needs none (it is renamed into place)."""
    if isinstance(loc, Path):
        return
    with contextlib.suppress(Exception):
        loc.fs.invalidate_cache(loc.key)
    objects = {k: int(v.get("size") or 0) for k, v in loc.files().items() if k != MANIFEST}
    doc = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
        "objects": objects,
    }
    (loc / MANIFEST).write_text(json.dumps(doc, indent=1, default=str) + "\n")


def read_manifest(loc: RemotePath) -> dict[str, Any] | None:
    """The manifest at ``loc`` (None when there is none)."""
    try:
        doc = json.loads((loc / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except StorageError:
        raise
    except ValueError as err:
        raise ValueError(f"{redact(str(loc / MANIFEST))}: unreadable manifest ({err})") from err
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{redact(str(loc / MANIFEST))}: not a {MANIFEST_FORMAT}")
    return doc


def committed(loc: Loc) -> bool:
    """Whether the output ``loc`` is visible: a local directory that exists, or a prefix with
    a manifest."""
    if isinstance(loc, Path):
        return loc.exists()
    return (loc / MANIFEST).exists()


def uncommit(loc: Loc) -> None:
    """Hide the output ``loc`` (its manifest goes first), then remove it."""
    if isinstance(loc, RemotePath):
        (loc / MANIFEST).unlink(missing_ok=True)
    rmtree(loc, ignore_errors=True)


def require_visible(loc: Loc, what: str = "") -> None:
    """A ``ValueError`` unless ``loc`` belongs to a committed output: a manifest at it or at
    one of its parents lists it (object storage); nothing to check locally. So a run that
    crashed, or still writes, is never read as a result."""
    if isinstance(loc, Path):
        return
    node = loc
    while True:
        doc = read_manifest(node)
        if doc is not None:
            rel = loc.relative_to(node)
            objects = doc.get("objects", {})
            if rel == "." or any(k == rel or k.startswith(rel + "/") for k in objects):
                return
            break
        if "/" not in node.key:
            break
        node = node.parent
    where = f"{what} {redact(loc.url)}".strip()
    raise InputError(
        f"{where}: not a committed output (no {MANIFEST} lists it: the run that writes it is "
        "still going or crashed; run the same command again to resume it)"
    )


def staging(out: RemotePath) -> RemotePath | None:
    """Where an output that replaces the committed ``out`` is written (None for a bucket's
    root, which has no sibling: that one is replaced in place)."""
    if "/" not in out.key:
        return None
    return out.parent / f".{out.name}.partial"


# -- replacing a committed output ------------------------------------------------------------
# ``--overwrite`` of a committed OUT on object storage: the new output is written and committed
# under OUT's hidden sibling ``.<name>.partial`` while the old one stays visible and whole; only
# then is OUT swapped: its manifest goes first (hidden), its objects are removed, the staged
# objects are copied in (server-side copies), and OUT's manifest is written last. A crash before
# the swap leaves the old OUT as it was (the same command resumes the staged run); a crash
# during the swap leaves OUT invisible, never half-visible, and the next command on OUT
# completes the swap first (``finish_replace``).


def replace(staged: RemotePath, out: RemotePath, **extra: Any) -> None:
    """Commit ``staged``, then swap it in as ``out`` (see above); ``staged`` is removed."""
    commit(staged, **extra)
    _swap(staged, out)


def _swap(staged: RemotePath, out: RemotePath) -> None:
    doc = read_manifest(staged) or {}
    (out / MANIFEST).unlink(missing_ok=True)
    rmtree(out, ignore_errors=False)
    for rel in sorted(doc.get("objects", {})):
        staged.fs.copy((staged / rel).key, (out / rel).key)
    extra = {k: v for k, v in doc.items() if k not in ("format", "version", "written", "objects")}
    commit(out, **extra)
    rmtree(staged, ignore_errors=True)


def finish_replace(out: Loc) -> bool:
    """Complete a swap of ``out`` that a crash interrupted (its staged output is committed);
    True if there was one. A local output has no swap: it is renamed into place."""
    if isinstance(out, Path):
        return False
    staged = staging(out)
    if staged is None or not committed(staged):
        return False
    _swap(staged, out)
    return True


def stage(out: Loc) -> Loc:
    """An empty place to build the output ``out`` in, invisible until ``publish``: locally the
    hidden sibling ``.<name>.partial`` (its parent created); on object storage ``out``'s own
    prefix (what an uncommitted attempt left there removed), or, when ``out`` is committed, its
    staging sibling, so that the output it replaces stays visible and whole until the swap."""
    if isinstance(out, Path):
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_sibling(out)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        return tmp
    staged = staging(out) if committed(out) else None
    if staged is None:
        uncommit(out)
        return out
    rmtree(staged, ignore_errors=True)
    return staged


def publish(staged: Loc, out: Loc, **extra: Any) -> None:
    """Make the complete ``staged`` (``stage``) the output ``out``: a rename locally (replacing
    an existing ``out``); on object storage its manifest (``extra`` recorded in it), written
    last, or the swap of a staged replacement (``replace``)."""
    if isinstance(staged, Path):
        assert isinstance(out, Path)
        commit_dir(staged, out)
    elif staged == out:
        commit(out, **extra)
    else:
        assert isinstance(out, RemotePath)
        replace(staged, out, **extra)


def discard(staged: Loc) -> None:
    """Remove what a failed attempt built at ``staged`` (``stage``); a committed staged
    replacement on object storage is kept: the next command on its output completes the swap."""
    if isinstance(staged, Path) or not committed(staged):
        rmtree(staged, ignore_errors=True)


# -- a store shared by the commands that need it ----------------------------------------------
# Written by whichever command needs it first, read by all; concurrent writers each write their
# own copy, and the first complete one is the store. Locally the copy is a hidden sibling
# ``.<name>.partial-<pid>-<tag>`` renamed into place (a rename does not replace a directory
# another writer put there first); one left by a process that is gone is removed. On object
# storage (no rename) ``final`` is a prefix of attempts ``attempt-<UTC time>-<tag>``, each
# visible once committed; readers take the newest committed one, and an uncommitted one a day
# old (a crash) is removed.
PARTIAL = ".partial-"


ATTEMPT = "attempt-"


STALE_SECONDS = 24 * 3600


def shared_copy(final: Loc) -> Loc | None:
    """Where the complete shared store ``final`` is (``write_shared``), or None: ``final``
    itself locally; its newest committed attempt on object storage."""
    if isinstance(final, Path):
        return final if final.exists() else None
    for attempt in reversed(_attempts(final)):
        if committed(attempt):
            return attempt
    return None


def write_shared(final: Loc, write: Callable[[Loc], None], replace: bool, **extra: Any) -> Loc:
    """Write the shared store ``final`` with ``write(place)`` into a new copy and make that
    copy visible; returns where the complete store is. A store already there is replaced only
    if ``replace``: else it is a concurrent writer's, the same, and kept (the new copy is
    dropped). On any failure the new copy is removed and the error re-raised. ``extra`` is
    recorded in an attempt's manifest."""
    if isinstance(final, RemotePath):
        return _write_attempt(final, write, replace, **extra)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(final)
    partial = final.parent / f".{final.name}{PARTIAL}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _ACTIVE.add(str(partial))
    try:
        write(partial)
        if replace and final.exists():
            shutil.rmtree(final)
        try:
            os.rename(partial, final)
        except OSError:
            if not final.exists():
                raise
            # a concurrent writer completed first: its store is the same
            shutil.rmtree(partial, ignore_errors=True)
    except BaseException as err:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(err, OSError) and not err.filename and storage.no_space(err):
            # a write's error names no file: the message names the store
            raise OSError(err.errno, err.strerror, str(final)) from err
        raise
    finally:
        _ACTIVE.discard(str(partial))
    return final


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_partials(final: Path) -> list[Path]:
    """Remove the partial siblings ``.<name>.partial-<pid>[-<tag>]`` of ``final`` whose writer
    is gone: another process that no longer runs, or this one when no thread of it writes there
    (a leftover of a process that had our pid). Returns what was removed."""
    removed: list[Path] = []
    prefix = f".{final.name}{PARTIAL}"
    if not final.parent.is_dir():
        return removed
    for p in final.parent.iterdir():
        if not p.name.startswith(prefix):
            continue
        try:
            pid = int(p.name[len(prefix) :].split("-")[0])
        except ValueError:
            continue
        mine = pid == os.getpid()
        if (mine and str(p) not in _ACTIVE) or (not mine and not pid_alive(pid)):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _attempts(final: RemotePath) -> list[RemotePath]:
    try:
        children = list(final.iterdir()) if final.exists() else []
    except FileNotFoundError:
        return []
    return sorted((c for c in children if c.name.startswith(ATTEMPT)), key=lambda c: c.name)


def _write_attempt(
    final: RemotePath, write: Callable[[Loc], None], replace: bool, **extra: Any
) -> Loc:
    import calendar

    now = time.time()
    for old in _attempts(final):
        tag = old.name[len(ATTEMPT) :].split("-")[0]
        try:
            age = now - calendar.timegm(time.strptime(tag, "%Y%m%dT%H%M%S"))
        except ValueError:
            continue
        if replace or (not committed(old) and age > STALE_SECONDS):
            uncommit(old)
    tag = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    attempt = final / f"{ATTEMPT}{tag}-{uuid.uuid4().hex[:8]}"
    try:
        write(attempt)
        if not replace:
            won = shared_copy(final)
            if won is not None:
                # a concurrent writer committed first: its store is the same
                rmtree(attempt, ignore_errors=True)
                return won
        commit(attempt, **extra)
    except BaseException:
        rmtree(attempt, ignore_errors=True)
        raise
    return attempt


# -- a command's output, local or on object storage ------------------------------------------
MARKER = "fingerprint.json"


def prepare_output(
    out: Where, fingerprint: str | None, overwrite: bool, what: str = "--out"
) -> tuple[Loc, bool]:
    """Where a command writes its output ``out`` until it is complete, and whether it resumes
    an earlier attempt of the same command (``fingerprint``: its input files and parameters;
    None: never resumed). An existing (committed) ``out`` is refused unless ``overwrite``.

    Local: the hidden sibling ``.<name>.partial`` (``.<name>.partial-<pid>-<tag>``, the
    writer's own, when never resumed), renamed into place by ``publish_output``.
    Object storage: OUT's own prefix, made visible by its manifest; or, replacing a committed
    OUT, its hidden sibling (``staging``), swapped in by ``publish_output``. A partial output
    holds ``MARKER`` from the start: a prefix without it holds objects that are not a dpmm
    output and is never touched.
    """
    where = location(out)
    if isinstance(where, RemotePath):
        return _prepare_remote_output(where, fingerprint, overwrite, what)
    check_new_output(where, overwrite, what)
    if where.exists() and not where.is_dir():
        raise ValueError(f"{what} {where}: exists and is not a directory")
    if fingerprint is None:
        # never resumed: a place of this writer's own, so that two commands writing one OUT at
        # once (a backfill scoring the day the schedule scores) never remove each other's work
        remove_stale_partials(where)
        partial = where.parent / f".{where.name}{PARTIAL}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        _ACTIVE.add(str(partial))
        partial.mkdir(parents=True)
        return partial, False
    partial = temp_sibling(where)
    marker = partial / MARKER
    if partial.exists():
        if marker.exists() and marker.read_text() == fingerprint:
            return partial, True
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    marker.write_text(fingerprint)
    return partial, False


def _prepare_remote_output(
    out: RemotePath, fingerprint: str | None, overwrite: bool, what: str
) -> tuple[Loc, bool]:
    try:
        check_reachable(out, what)
        # a swap a crash interrupted is completed first: that command had finished
        finish_replace(out)
        target = out
        if committed(out):
            if not overwrite:
                raise ValueError(
                    f"{what} {redact(out.url)}: already exists (pass --overwrite to replace it)"
                )
            staged = staging(out)
            if staged is None:  # a bucket's root has no sibling: replaced in place
                uncommit(out)
            else:
                target = staged
        marker = target / MARKER
        if marker.exists():
            if fingerprint is not None and marker.read_text() == fingerprint:
                return target, True
            rmtree(target)
        elif target.exists():
            raise ValueError(
                f"{what} {redact(target.url)}: holds objects that are not a dpmm output; "
                "refusing to replace them"
            )
        # written first, even without a fingerprint: it marks the prefix as a dpmm output
        marker.write_text(fingerprint if fingerprint is not None else "null")
    except ValueError:
        raise
    except Exception as err:  # the file system's: no bucket, no credentials, access denied
        raise fs_error(out.url, err, what) from err
    return target, False


def publish_output(
    partial: Loc, out: Where, overwrite: bool, kind: str, what: str = "--out"
) -> None:
    """Make the complete ``partial`` (``prepare_output``) the output ``out``: a local atomic
    rename (``commit_dir``: replacing ``out`` only with ``overwrite``), OUT's manifest written
    last, or the staged output swapped in (``replace``)."""
    with contextlib.suppress(FileNotFoundError):
        (partial / MARKER).unlink()
    dest = location(out)
    if isinstance(dest, Path) and isinstance(partial, Path):
        # a local OUT may have appeared since ``prepare_output`` (another writer's, complete)
        if not commit_dir(partial, dest, overwrite):
            raise InputError(f"{what} {dest}: already exists (pass --overwrite to replace it)")
        _ACTIVE.discard(str(partial))
        return
    publish(partial, dest, kind=kind)


MANIFEST = "manifest.json"


MANIFEST_FORMAT = "dpmm-manifest"


MANIFEST_VERSION = 1


def check_new_output(out: Any, overwrite: bool, what: str = "--out") -> None:
    """Refuse a committed output ``out`` (``committed``) unless ``overwrite``, with the message
    ``prepare_output`` gives: a command checks it before it starts a cluster and compiles, not
    only when its flow gets to it."""
    loc = location(out)
    if not overwrite and committed(loc):
        shown = redact(loc.url) if isinstance(loc, RemotePath) else str(loc)
        raise InputError(f"{what} {shown}: already exists (pass --overwrite to replace it)")


# local partials being written by this process (its threads may write concurrently)
_ACTIVE: set[str] = set()
