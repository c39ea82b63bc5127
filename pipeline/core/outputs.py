"""A command's output directory: written whole or not at all, and the JSON it records.

``staged_dir`` and ``write_outputs`` write a run's results into a temporary sibling directory
(``pipeline.core.paths.temp_sibling``: ``.<name>.partial`` next to it, the name the distributed
run uses too) that is renamed into place only when everything has been written: a failure leaves
no partial output directory, and an existing one is replaced only on success. ``versions`` is
what run.json records of the software.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.core import storage
from pipeline.core.errors import InputError
from pipeline.core.paths import commit_dir, safe_name, temp_sibling


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary sibling of ``out`` to write into; renamed to ``out`` if the block succeeds.

    The temporary directory is ``temp_sibling(out)``. On any exception it is removed and
    ``out`` is left as it was; on success an existing ``out`` is replaced.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(out)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        commit_dir(tmp, out)
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
