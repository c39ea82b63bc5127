"""Ingest once, fit many times: dataset stores shared by every fit of the same input.

``open_dataset`` keeps the store of a file or directory at ``root / key``, the key hashing the
input's fingerprint (resolved path, each file's size and mtime_ns) and every ingest option, so a
second fit with the same options reuses it. An ingest makes its copy visible only when complete
(``pipeline.core.outputs.write_shared``); of concurrent ingests of one key the first to finish
wins. In-memory inputs have no fingerprint and are ingested every time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.core import outputs, storage
from pipeline.core.config import DEFAULT_CHUNK_ROWS, N_FOLDS, PRIOR_SAMPLE
from pipeline.core.errors import InputError
from pipeline.data.ingest import ingest
from pipeline.data.sources import is_file_list
from pipeline.data.store import FORMAT_VERSION, INFO_FILE, Store, StoreInfo

DATA_DIR_ENV = "DPMM_DATA_DIR"


def env_root() -> str | None:
    """``$DPMM_DATA_DIR`` when set (a path or a URL: ``pipeline.core.storage``)."""
    return os.environ.get(DATA_DIR_ENV) or None


def default_root() -> storage.Loc:
    """Where shared dataset stores live: ``$DPMM_DATA_DIR``, else ``~/.cache/dpmm/datasets``."""
    env = env_root()
    if env:
        return storage.location(env).expanduser()
    return Path.home() / ".cache" / "dpmm" / "datasets"


def root_for(out: storage.Loc, data_dir: storage.Where | None) -> storage.Where | None:
    """The folder of shared dataset stores of a command that writes ``out``: ``data_dir``, else
    ``out/datasets`` when ``out`` is object storage and ``$DPMM_DATA_DIR`` is unset (the workers
    may share no disk with this machine), else None (``default_root``)."""
    if data_dir is None and not env_root() and storage.shared(out):
        return out / "datasets"
    return data_dir


def is_path_source(source: Any) -> bool:
    """Whether ``source`` is a file or directory, or a list of them (with a fingerprint)."""
    return isinstance(source, (str, os.PathLike)) or is_file_list(source)


def fingerprint(source: storage.Where) -> dict[str, Any]:
    """The input's resolved path (or URL) and each of its files' (relative path, size, mtime_ns
    or ETag), every file of a directory included; a list of inputs: their fingerprints."""
    if isinstance(source, (list, tuple)):
        fps = [fingerprint(s) for s in source]
        return {"path": [fp["path"] for fp in fps], "files": [fp["files"] for fp in fps]}
    loc = storage.location(source).expanduser()
    with storage.fs_errors(loc):
        if not loc.exists():
            raise InputError(f"{storage.redact(str(loc))}: no such file or directory")
        loc = loc.resolve()
        files = storage.file_stamps(loc)
    entries = [[rel, size, stamp] for rel, (size, stamp) in files.items()]
    return {"path": storage.redact(str(loc)), "files": entries}


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
    dtype: str = "float64",
    missing: bool = False,
    strict: bool = True,
) -> dict[str, Any]:
    """The options that change what ingest writes, as text (the key's other half); ``dtype``,
    ``missing`` and ``strict`` only when not their defaults, so that older keys stay, and a
    warm start's family by its signature."""
    out = {
        "family": repr(family),
        "chunk_rows": repr(int(chunk_rows)),
        "holdout": repr(float(holdout)),
        "n_folds": repr(int(n_folds)),
        "prior_sample": repr(int(prior_sample)),
        "label_column": repr(label_column),
        "group_column": repr(group_column),
        "format_version": repr(FORMAT_VERSION),
    }
    if dtype != "float64":
        out["dtype"] = repr(dtype)
    if schema is not None:
        out["family"] = family.signature()
        out["schema"] = repr(schema)
    elif missing or not strict:
        out["missing"] = repr(bool(missing))
        out["strict"] = repr(bool(strict))
    return out


def dataset_key(fp: dict[str, Any], options: dict[str, Any]) -> str:
    """``<file stem>-<hash>``: the stem only helps a person find a store; the hash decides."""
    blob = json.dumps({"input": fp, "options": options}, sort_keys=True).encode()
    digest = hashlib.sha256(blob).hexdigest()[:24]
    # a list of inputs is named after its first
    first = fp["path"][0] if isinstance(fp["path"], list) else fp["path"]
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(first).name)[:40].strip("_") or "data"
    return f"{stem}-{digest}"


def _open_complete(path: storage.Loc) -> tuple[Store, StoreInfo]:
    """A completed store at ``path``, checked; a ValueError naming the path otherwise."""
    store = Store.open_checked(path)
    if not store.exists(INFO_FILE):
        raise ValueError(
            f"{path}: an incomplete dataset store (no {INFO_FILE}); remove it to ingest again"
        )
    return store, store.info


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
    dtype: str = "float64",
    missing: bool = False,
    strict: bool = True,
    missing_hint: str | None = None,
) -> tuple[Store, StoreInfo, bool]:
    """The dataset store of ``source``: reused when an ingest with the same input and options
    completed before, else ingested now (``pipeline.data.ingest.ingest``).

    Parameters
    ----------
    source : path or array-like
        A file or directory (shared by key), or an in-memory array or frame (ingested each time).
    client : distributed.Client
        Runs the ingest tasks.
    root : path, optional
        The folder of shared stores; default ``default_root()``.
    family, chunk_rows, holdout, n_folds, prior_sample, label_column, group_column, progress, dtype,
    schema, missing, strict, missing_hint
        As ``pipeline.data.ingest.ingest``; all but ``progress`` and ``missing_hint`` are part of
        the key.
    path : path, optional
        Where to keep the store instead of ``root / key`` (reused there when its key matches);
        without it an in-memory input goes into a new temporary directory the caller removes.

    Returns
    -------
    store : Store
    info : StoreInfo
    reused : bool
        True when no ingest ran.

    Raises
    ------
    InputError, ValueError
        Bad input, or a store of another format version at the key.
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
        "dtype": dtype,
        "missing": missing,
        "strict": strict,
        "missing_hint": missing_hint,
    }
    if schema is not None:
        ingest_kw["schema"] = schema
    if not is_path_source(source):
        return _open_in_memory(source, path, ingest_kw)
    # the key: every ingest option but the client, the progress bar and a message's hint
    runtime = ("client", "progress", "missing_hint", "schema")
    options = ingest_options(
        schema=schema, **{k: v for k, v in ingest_kw.items() if k not in runtime}
    )
    key = dataset_key(fingerprint(source), options)
    where = (
        storage.location(path)
        if path is not None
        else storage.location(root or default_root()) / key
    )
    found = outputs.shared_copy(where)
    if found is not None:
        if path is None or _recorded_key(found) == key:
            store, info = _open_complete(found)
            return store, info, True
        _refuse_foreign(found)
    store, info = _ingest_shared(where, source, ingest_kw, key, replace=path is not None)
    return store, info, False


def _open_in_memory(
    source: Any, path: storage.Where | None, ingest_kw: dict[str, Any]
) -> tuple[Store, StoreInfo, bool]:
    """``open_dataset`` of an in-memory input, into ``path`` or a new temporary directory."""
    if path is None:
        tmp = Path(tempfile.mkdtemp(prefix="dpmm-dataset-"))
        try:
            ingest(source, Store(tmp), format_extra={"key": None}, **ingest_kw)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        store, info = _open_complete(tmp)
        return store, info, False
    final = storage.location(path)
    found = outputs.shared_copy(final)
    if found is not None:
        _refuse_foreign(found)
    store, info = _ingest_shared(final, source, ingest_kw, None, replace=True)
    return store, info, False


def _ingest_shared(
    final: storage.Loc, source: Any, ingest_kw: dict[str, Any], key: str | None, replace: bool
) -> tuple[Store, StoreInfo]:
    """Ingest into a new copy of the store ``final``, made visible when complete
    (``outputs.write_shared``, replacing one only if ``replace``); a failed copy is removed."""

    def write(place: storage.Loc) -> None:
        ingest(source, Store(place), format_extra={"key": key}, **ingest_kw)

    return _open_complete(outputs.write_shared(final, write, replace, kind="dataset", key=key))


def _recorded_key(path: storage.Loc) -> str | None:
    """The key in the ``format.json`` at ``path`` (None if none)."""
    try:
        key = Store(path).read_format().get("key")
    except ValueError:
        return None
    return key if isinstance(key, str) else None


def _refuse_foreign(path: storage.Loc) -> None:
    """A ValueError if ``path`` holds something other than a dataset store."""
    if not path.exists():
        return
    if path.is_dir() and not any(path.iterdir()):
        return
    with contextlib.suppress(ValueError):
        Store(path).read_format()
        return
    raise ValueError(f"{path}: exists and is not a dataset store; refusing to replace it")
