"""The labels store of a run (``OUT/labels.zarr``): each stored row's label, eq. 3.4 log
predictive density and held-out flag, written chunk by chunk by the task that computed them.

A chunk's writer returns a ``WriteResult``: sums and a picture sample that add over chunks, so
that no labels travel to the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from numpy.typing import NDArray

from pipeline.core import storage
from pipeline.core.persist import register
from pipeline.data.chunk_io import CHECKSUM, open_group, read_rows, record_codec, write_rows
from pipeline.data.store import PLOT_SALT, BoolArray, StoreInfo, row_uniform, stored_chunk_rows
from pipeline.families import FloatArray

IntArray = NDArray[np.int64]


PLOT_POINTS = 4000


@register
@dataclass
class WriteResult:
    c: int
    heldout_sum: float
    heldout_n: int
    train_sum: float
    train_n: int
    new_cluster: int
    plot_X: FloatArray
    plot_labels: IntArray
    pairs: IntArray | None = None  # (3, P): true label code, final label, count


def emit_chunk(
    store: str,
    labels: str,
    c: int,
    a: int,
    X: FloatArray,
    hold: BoolArray,
    label: IntArray,
    logdens: FloatArray,
    plot_rate: float,
    has_y: bool,
) -> WriteResult:
    """Write chunk c's final labels, eq. 3.4 log densities and held-out flags (N,) at rows a..
    of ``labels``; its write-out summary (with contingency triples when ``has_y``)."""
    b = a + X.shape[0]
    write_rows(f"{labels}/label", a, b, label)
    write_rows(f"{labels}/log_density", a, b, logdens)
    write_rows(f"{labels}/holdout", a, b, hold)
    if storage.location(f"{labels}/row").exists():
        rows = read_rows(f"{store}/row", a, b)
        write_rows(f"{labels}/row", a, b, rows)
    pick = row_uniform(np.arange(a, b), PLOT_SALT) < plot_rate
    pairs = None
    if has_y:
        y = np.asarray(read_rows(f"{store}/y", a, b), dtype=np.int64)
        both, counts = np.unique(np.vstack([y, label]), axis=1, return_counts=True)
        pairs = np.vstack([both, counts.astype(np.int64)])
    return WriteResult(
        c,
        float(logdens[hold].sum()),
        int(hold.sum()),
        float(logdens[~hold].sum()),
        int((~hold).sum()),
        int((label[hold] < 0).sum()),
        X[pick],
        label[pick],
        pairs,
    )


def create_labels(labels_path: str, info: StoreInfo, overwrite: bool) -> None:
    """The write-out's zarr group, chunked as the store; one there is kept unless ``overwrite``."""
    if not overwrite and all(
        (storage.location(labels_path) / name / "zarr.json").exists()
        for name in ("label", "log_density", "holdout")
    ):
        return
    open_group(labels_path, mode="w")
    arrays: list[tuple[str, str, Any]] = [
        ("label", "int64", -1),
        ("log_density", "float64", np.nan),
        ("holdout", "bool", False),
    ]
    if info.grouped:
        arrays.append(("row", "int64", -1))
    for name, dtype, fill in arrays:
        zarr.create_array(
            f"{labels_path}/{name}",
            shape=(info.n_stored,),
            chunks=(stored_chunk_rows(info.n_stored, info.chunk_rows),),
            dtype=dtype,
            fill_value=fill,
            # densities are noise to a compressor (LZ4 saves 17% and doubles the write time)
            compressors=[CHECKSUM] if name == "log_density" else record_codec(),
            overwrite=True,
        )
