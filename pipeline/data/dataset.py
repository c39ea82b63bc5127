"""Ingest once, fit many times: dataset stores shared by every fit of the same input.

``open_dataset`` keeps the dataset store of a file or directory at ``root / key``, where the key
hashes the input's fingerprint (its resolved path and each of its files' size and mtime_ns) and
every ingest option. A second fit of the same input with the same options reuses the store
without running a task; a changed file or option gets another key, hence a new ingest.

An ingest writes into a hidden sibling ``.<key>.partial-<pid>-<tag>`` that is renamed into
place only when complete, so a crashed or concurrent ingest never leaves a half store where a
reader looks, and bad input leaves nothing behind. A partial whose process is gone is removed by
the next ``open_dataset`` of that key. Of concurrent ingests of one key, the first to finish
wins; the others discard their copy and open the winner's.

In-memory inputs (numpy, pandas, dask) have no fingerprint: they are ingested into ``path`` (or
into a new temporary directory that the caller owns) every time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.core import storage
from pipeline.core.config import DEFAULT_CHUNK_ROWS, N_FOLDS, PRIOR_SAMPLE
from pipeline.core.errors import InputError
from pipeline.data.ingest import ingest
from pipeline.data.sources import is_file_list
from pipeline.data.store import FORMAT_VERSION, INFO_FILE, Store, StoreInfo

DATA_DIR_ENV = "DPMM_DATA_DIR"
PARTIAL = ".partial-"


def env_root() -> str | None:
    """``$DPMM_DATA_DIR`` when set (a path or a URL: ``pipeline.core.storage``)."""
    return os.environ.get(DATA_DIR_ENV) or None


def default_root() -> storage.Loc:
    """Where shared dataset stores live: ``$DPMM_DATA_DIR``, else ``~/.cache/dpmm/datasets``."""
    env = env_root()
    if env:
        loc = storage.location(env)
        return loc.expanduser() if isinstance(loc, Path) else loc
    return Path.home() / ".cache" / "dpmm" / "datasets"


def is_path_source(source: Any) -> bool:
    """Whether ``source`` is a file or directory, or a list of them (it then has a
    fingerprint)."""
    return isinstance(source, (str, os.PathLike)) or is_file_list(source)


def fingerprint(source: str | os.PathLike[str]) -> dict[str, Any]:
    """The input's resolved path and each of its files' (relative path, size, mtime_ns).

    A directory (Parquet parts, a zarr array) lists every file under it, so that adding,
    removing or rewriting a part changes the fingerprint. An input on object storage
    (``pipeline.core.storage``): its URL and each object's (relative key, size, ETag or
    modification time). A list of inputs: the list of their fingerprints.
    """
    if isinstance(source, (list, tuple)):
        fps = [fingerprint(str(s) if isinstance(s, storage.RemotePath) else s) for s in source]
        return {"path": [fp["path"] for fp in fps], "files": [fp["files"] for fp in fps]}
    loc = storage.location(source)
    if isinstance(loc, storage.RemotePath):
        return _remote_fingerprint(loc)
    path = loc.expanduser()
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    path = path.resolve()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        files = [path]
    entries = []
    for f in files:
        st = f.stat()
        rel = "." if f == path else f.relative_to(path).as_posix()
        entries.append([rel, st.st_size, st.st_mtime_ns])
    return {"path": str(path), "files": entries}


def _remote_fingerprint(loc: storage.RemotePath) -> dict[str, Any]:
    try:
        files = loc.files() if loc.exists() else {}
    except Exception as err:  # the file system's errors: no bucket, no credentials...
        raise storage.fs_error(loc.url, err) from err
    if not files:
        raise InputError(f"{storage.redact(loc.url)}: no such file or directory")
    entries = [
        [rel, int(info.get("size") or 0), str(info.get("ETag") or info.get("mtime") or "")]
        for rel, info in files.items()
    ]
    return {"path": storage.redact(loc.url), "files": entries}


def ingest_options(
    *,
    family: Any,
    chunk_rows: int,
    holdout: float,
    n_folds: int,
    prior_sample: int,
    label_column: str | None,
    group_column: str | None,
    schema: Any = None,
) -> dict[str, Any]:
    """The options that change what ingest writes, as text (the key's other half)."""
    if schema is not None:
        # a model's schema and family (a warm start): the key holds the prior's values too
        return {
            **ingest_options(
                family=None,
                chunk_rows=chunk_rows,
                holdout=holdout,
                n_folds=n_folds,
                prior_sample=prior_sample,
                label_column=label_column,
                group_column=group_column,
            ),
            "family": family.signature(),
            "schema": repr(schema),
        }
    return {
        "family": repr(family),
        "chunk_rows": repr(int(chunk_rows)),
        "holdout": repr(float(holdout)),
        "n_folds": repr(int(n_folds)),
        "prior_sample": repr(int(prior_sample)),
        "label_column": repr(label_column),
        "group_column": repr(group_column),
        "format_version": repr(FORMAT_VERSION),
    }


def dataset_key(fp: dict[str, Any], options: dict[str, Any]) -> str:
    """``<file stem>-<hash>``: the stem only helps a person find a store; the hash decides."""
    blob = json.dumps({"input": fp, "options": options}, sort_keys=True).encode()
    digest = hashlib.sha256(blob).hexdigest()[:24]
    # a list of inputs is named after its first
    first = fp["path"][0] if isinstance(fp["path"], list) else fp["path"]
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(first).name)[:40].strip("_") or "data"
    return f"{stem}-{digest}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


# partials being written by this process (its threads may ingest concurrently)
_ACTIVE: set[str] = set()


def remove_stale_partials(final: Path) -> list[Path]:
    """Remove the partial siblings ``.<name>.partial-<pid>[-<tag>]`` of ``final`` whose ingest
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
        if (mine and str(p) not in _ACTIVE) or (not mine and not _pid_alive(pid)):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _open_complete(path: storage.Loc) -> tuple[Store, StoreInfo]:
    """A completed store at ``path``, checked; a ValueError naming the path otherwise."""
    store = Store.open_checked(path)
    if not store.exists(INFO_FILE):
        raise ValueError(
            f"{path}: an incomplete dataset store (no {INFO_FILE}); remove it to ingest again"
        )
    return store, store.info


def _ingest_into(
    final: Path, source: Any, ingest_kw: dict[str, Any], key: str | None, replace: bool
) -> tuple[Store, StoreInfo]:
    """Ingest into a partial sibling of ``final`` and rename it into place when complete (a
    store already at ``final`` is replaced only if ``replace``: else it is a concurrent
    ingest's, of the same key); on any failure remove the partial and re-raise."""
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(final)
    partial = final.parent / f".{final.name}{PARTIAL}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _ACTIVE.add(str(partial))
    try:
        ingest(source, Store(partial), format_extra={"key": key}, **ingest_kw)
        if replace and final.exists():
            shutil.rmtree(final)
        try:
            os.rename(partial, final)
        except OSError:
            if not final.exists():
                raise
            # a concurrent ingest of the same key completed first: its store is the same
            shutil.rmtree(partial, ignore_errors=True)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        _ACTIVE.discard(str(partial))
    return _open_complete(final)


def open_dataset(
    source: Any,
    *,
    client: Any,
    root: storage.Where | None = None,
    family: Any = "auto",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    holdout: float = 0.0,
    n_folds: int = N_FOLDS,
    prior_sample: int = PRIOR_SAMPLE,
    label_column: str | None = None,
    group_column: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    path: storage.Where | None = None,
    schema: Any = None,
) -> tuple[Store, StoreInfo, bool]:
    """The dataset store of ``source``: reused when an ingest with the same input and options
    completed before, else ingested now (``pipeline.data.ingest.ingest``).

    Parameters
    ----------
    source : path or array-like
        A file or directory (CSV, Parquet, ``.npy``, zarr: shared by key, module docstring), or
        a numpy array, pandas DataFrame, dask array or dask DataFrame (ingested every time).
    client : distributed.Client
        Runs the ingest tasks.
    root : path, optional
        The folder of shared stores; default ``default_root()``.
    family, chunk_rows, holdout, n_folds, prior_sample, label_column, group_column, progress
        As ``pipeline.data.ingest.ingest``; all but ``progress`` are part of the key.
    schema : Schema, optional
        A fitted model's schema, ``family`` its ``ProductFamily`` (``pipeline.data.ingest.ingest``:
        the records are encoded and checked as the model's); part of the key.
    path : path, optional
        Where to keep the store instead of ``root / key``. A path input's store there is reused
        when its recorded key matches; an in-memory input is ingested there, replacing a store
        that was there. Without it an in-memory input goes into a new temporary directory, the
        store's own ``path``, which the caller removes.

    Returns
    -------
    store : Store
    info : StoreInfo
    reused : bool
        True when no ingest ran.

    Raises
    ------
    InputError, ValueError
        Bad input (naming the file and the row; nothing is left behind), or a store of another
        format version at the key (naming the path and both versions).
    """
    ingest_kw: dict[str, Any] = {
        "client": client,
        "family": family,
        "chunk_rows": chunk_rows,
        "holdout": holdout,
        "n_folds": n_folds,
        "prior_sample": prior_sample,
        "label_column": label_column,
        "group_column": group_column,
        "progress": progress,
    }
    if schema is not None:
        ingest_kw["schema"] = schema
    if not is_path_source(source):
        if path is None:
            tmp = Path(tempfile.mkdtemp(prefix="dpmm-dataset-"))
            try:
                ingest(source, Store(tmp), format_extra={"key": None}, **ingest_kw)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            store, info = _open_complete(tmp)
            return store, info, False
        final_at = storage.location(path)
        if isinstance(final_at, storage.RemotePath):
            store, info = _remote_ingest(final_at, source, ingest_kw, None, replace=True)
            return store, info, False
        final = final_at
        _refuse_foreign(final)
        store, info = _ingest_into(final, source, ingest_kw, None, replace=True)
        return store, info, False

    options = ingest_options(
        family=family,
        chunk_rows=chunk_rows,
        holdout=holdout,
        n_folds=n_folds,
        prior_sample=prior_sample,
        label_column=label_column,
        group_column=group_column,
        schema=schema,
    )
    key = dataset_key(fingerprint(source), options)
    where = (
        storage.location(path)
        if path is not None
        else storage.location(root or default_root()) / key
    )
    if isinstance(where, storage.RemotePath):
        found = _remote_open(where)
        if found is not None and (path is None or found[0].read_format().get("key") == key):
            return found[0], found[1], True
        store, info = _remote_ingest(where, source, ingest_kw, key, replace=path is not None)
        return store, info, False
    final = where
    if final.exists():
        if path is None or _recorded_key(final) == key:
            store, info = _open_complete(final)
            return store, info, True
        _refuse_foreign(final)
    store, info = _ingest_into(final, source, ingest_kw, key, replace=path is not None)
    return store, info, False


# -- dataset stores on object storage ------------------------------------------------------------
# No rename there: the keyed prefix ``root/key`` holds attempts ``attempt-<UTC time>-<tag>``, each
# one ingest's own prefix, made visible by its manifest (``pipeline.core.storage.commit``) written
# when complete. Readers take the newest committed attempt; concurrent ingests of one key each
# write their own and the first committed is used by both; an attempt left uncommitted by a
# crash is invisible and removed by a later ingest of the key once a day old.
ATTEMPT = "attempt-"
STALE_SECONDS = 24 * 3600


def _attempts(final: storage.RemotePath) -> list[storage.RemotePath]:
    try:
        children = list(final.iterdir()) if final.exists() else []
    except FileNotFoundError:
        return []
    return sorted((c for c in children if c.name.startswith(ATTEMPT)), key=lambda c: c.name)


def _remote_open(final: storage.RemotePath) -> tuple[Store, StoreInfo] | None:
    """The newest committed attempt's store under the key prefix ``final`` (None if none)."""
    for attempt in reversed(_attempts(final)):
        if storage.committed(attempt):
            return _open_complete(attempt)
    return None


def _remote_ingest(
    final: storage.RemotePath,
    source: Any,
    ingest_kw: dict[str, Any],
    key: str | None,
    replace: bool,
) -> tuple[Store, StoreInfo]:
    """Ingest into a new attempt under ``final`` and commit it; on failure remove it."""
    import calendar
    import time

    now = time.time()
    for old in _attempts(final):
        stamp = old.name[len(ATTEMPT) :].split("-")[0]
        try:
            age = now - calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%S"))
        except ValueError:
            continue
        if replace or (not storage.committed(old) and age > STALE_SECONDS):
            storage.uncommit(old)
    tag = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    attempt = final / f"{ATTEMPT}{tag}-{uuid.uuid4().hex[:8]}"
    try:
        ingest(source, Store(attempt), format_extra={"key": key}, **ingest_kw)
        if not replace:
            won = _remote_open(final)
            if won is not None:
                # a concurrent ingest of the same key committed first: its store is the same
                storage.rmtree(attempt, ignore_errors=True)
                return won
        storage.commit(attempt, kind="dataset", key=key)
    except BaseException:
        storage.rmtree(attempt, ignore_errors=True)
        raise
    return _open_complete(attempt)


def _recorded_key(path: Path) -> str | None:
    """The key in the ``format.json`` at ``path`` (None if none)."""
    try:
        key = Store(path).read_format().get("key")
    except ValueError:
        return None
    return key if isinstance(key, str) else None


def _refuse_foreign(path: Path) -> None:
    """A ValueError if ``path`` holds something other than a dataset store: never replace a
    user's files."""
    if not path.exists():
        return
    if path.is_dir() and not any(path.iterdir()):
        return
    with contextlib.suppress(ValueError):
        Store(path).read_format()
        return
    raise ValueError(f"{path}: exists and is not a dataset store; refusing to replace it")
