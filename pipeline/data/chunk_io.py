"""Rows of a zarr array read and written by a chunk task: a local chunk of plain or Blosc bytes
(``record_codec``) as its own file instead of through zarr's event loop, and each array opened
once per process (``open_array``); everything else through zarr.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, Literal

import google_crc32c
import numpy as np
import zarr
from numcodecs import Blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec

from pipeline.core import storage
from pipeline.core.errors import StorageError

_NATIVE = sys.byteorder


#: the last codec of every array of a store, a run's state and labels: a chunk changed after it
#: was written (a bit flip, a truncation) is a ``StorageError`` naming it when read, not numbers
CHECKSUM = Crc32cCodec()


def record_codec() -> list[Any]:
    """The codecs of the per-record arrays a pass rewrites: Blosc LZ4 over shuffled bytes."""
    return [BloscCodec(cname="lz4", clevel=1, shuffle="bitshuffle"), CHECKSUM]


def damaged(path: str, chunk: int | None, why: str) -> StorageError:
    store = storage.location(path).parent
    todo = "run the command again to rewrite it"
    if (store / "format.json").exists():
        todo = f"remove the dataset store {store} to have it ingested again"
    which = "a chunk" if chunk is None else f"chunk {chunk}"
    return StorageError(f"{path}: {which} is damaged ({why}) since written; {todo}")


def _bad_checksum(err: ValueError) -> bool:
    """zarr's error for a chunk whose checksum (``CHECKSUM``) does not match its bytes."""
    return "checksum" in str(err)


class Checked:
    """A zarr array (``arr``, at ``path``) whose reads report a damaged chunk by name
    (``damaged``) instead of zarr's checksum error; everything else is the array's."""

    def __init__(self, arr: Any, path: str) -> None:
        self.arr, self.path = arr, path

    def __getattr__(self, name: str) -> Any:
        return getattr(self.arr, name)

    def __getitem__(self, sel: Any) -> Any:
        return self._read(lambda: self.arr[sel])

    def __setitem__(self, sel: Any, value: Any) -> None:
        self.arr[sel] = value

    def get_orthogonal_selection(self, sel: Any) -> Any:
        return self._read(lambda: self.arr.get_orthogonal_selection(sel))

    def _read(self, read: Any) -> Any:
        try:
            return read()
        except ValueError as err:
            if not _bad_checksum(err):
                raise
            raise damaged(self.path, self._first_damaged(), "checksum") from None

    def _first_damaged(self) -> int | None:
        """The first chunk (along the rows) whose checksum fails, read one at a time."""
        rows = self.arr.chunks[0]
        for c in range(-(-self.arr.shape[0] // rows)):
            try:
                self.arr[c * rows : (c + 1) * rows]
            except ValueError as err:
                if _bad_checksum(err):
                    return c
                raise
        return None


def _crc(data: Any) -> bytes:
    # google_crc32c takes a read-only NumPy array, not a memoryview
    view = np.frombuffer(data, dtype=np.uint8)
    view.flags.writeable = False
    return int(google_crc32c.value(view)).to_bytes(4, "little")


# per thread: (shape, dtype) -> the array ``read_rows(reuse=True)`` last read into
_SCRATCH = threading.local()
#: the most arrays a thread keeps for ``scratch`` (a store's whole chunks and its last one)
SCRATCH_KEPT = 4


def scratch(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` for this thread: the last if unreferenced, else new."""
    pool: dict[tuple[tuple[int, ...], str], np.ndarray] = _SCRATCH.__dict__.setdefault("arrays", {})
    k = (shape, np.dtype(dtype).str)
    buf = pool.pop(k, None)
    # references: ``buf`` here and getrefcount's argument
    if buf is None or sys.getrefcount(buf) > 2:
        buf = np.empty(shape, dtype=dtype)
    pool[k] = buf  # the most recent last
    while len(pool) > SCRATCH_KEPT:
        del pool[next(iter(pool))]
    return buf


# opened arrays of this process: (path, mode) -> (signature of the metadata file, array)
_OPENED: dict[tuple[str, str], tuple[tuple[int, int, int], Any]] = {}


#: the zarr format of every store this package writes (datasets, labels, a run's records): named
#: when opening one, since zarr left to guess also asks for version 2's ``.zarray`` and
#: ``.zattrs`` (and lists their prefixes): 6 requests to open an array in object storage, not 2
ZARR_FORMAT: Literal[3] = 3


def open_group(path: str, mode: Literal["a", "w"]) -> Any:
    """``zarr.open_group(path, mode=mode)`` of a group of this package's (``ZARR_FORMAT``)."""
    return zarr.open_group(path, mode=mode, zarr_format=ZARR_FORMAT)


def open_array(path: str, mode: str = "r") -> Any:
    """``zarr.open_array(path, mode=mode)`` of an array of this package's (``ZARR_FORMAT``),
    opened once per process for a local array (kept while its ``zarr.json`` keeps inode, size
    and mtime), sparing every task zarr's metadata reads; arrays in object storage are opened
    each time."""
    loc = storage.location(path)
    try:
        st = os.stat(loc / "zarr.json") if isinstance(loc, Path) else None
    except OSError:
        st = None  # zarr's own error, or a group's
    if st is None:
        return zarr.open_array(path, mode=mode, zarr_format=ZARR_FORMAT)
    sig = (st.st_ino, st.st_size, st.st_mtime_ns)
    key = (str(loc), mode)
    hit = _OPENED.get(key)
    if hit is not None and hit[0] == sig:
        return hit[1]
    arr = zarr.open_array(path, mode=mode, zarr_format=ZARR_FORMAT)
    if len(_OPENED) >= 256:
        _OPENED.clear()
    _OPENED[key] = (sig, arr)
    return arr


def _chunk_layout(arr: Any) -> tuple[str, Any] | None:
    """How a chunk of ``arr`` lies in its file, before its ``CHECKSUM``: ("raw", None),
    ("blosc", codec), or None (no checksum, or other codecs)."""
    comps = arr.compressors
    if (
        arr.filters
        or not isinstance(arr.serializer, BytesCodec)
        or getattr(arr.serializer.endian, "value", None) not in (None, _NATIVE)
        or arr.chunks[1:] != arr.shape[1:]
        or not comps
        or not isinstance(comps[-1], Crc32cCodec)
        or len(comps) > 2
    ):
        return None
    if len(comps) == 1:
        return ("raw", None)
    comp = comps[0]
    if not isinstance(comp, BloscCodec):
        return None
    return (
        "blosc",
        Blosc(
            cname=comp.cname.value,
            clevel=comp.clevel,
            shuffle={"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[comp.shuffle.value],
            blocksize=comp.blocksize,
            typesize=comp.typesize,
        ),
    )


def _chunk_file(path: str, arr: Any, a: int, b: int) -> tuple[str, tuple[str, Any]] | None:
    """The file and layout of the chunk rows a..b start, where a task may use it directly."""
    cr = arr.chunks[0]
    loc = storage.location(path)
    if not (isinstance(loc, Path) and b > a and a % cr == 0 and b - a <= cr):
        return None
    layout = _chunk_layout(arr)
    if layout is None:
        return None
    key = arr.metadata.encode_chunk_key((a // cr, *(0,) * (arr.ndim - 1)))
    return os.path.join(loc, *key.split("/")), layout


def read_rows(path: str, a: int, b: int, reuse: bool = False) -> np.ndarray:
    """Rows a..b of the zarr array at ``path``.

    A whole local chunk, uncompressed or Blosc, is read from its file directly (about twice as
    fast as zarr's three copies); anything else goes through zarr. ``reuse``: read an
    uncompressed chunk into this thread's last array of that shape (``scratch``) when nothing
    refers to it any more, sparing a fresh mapping's page faults; only for a caller done with
    its previous array (``Chunk.X``).
    """
    arr = open_array(path, "r")
    at = _chunk_file(path, arr, a, b)
    if at is None:
        return np.asarray(Checked(arr, path)[a:b])
    f, (kind, codec) = at
    c, cr, rest = a // arr.chunks[0], arr.chunks[0], arr.shape[1:]
    if not os.path.exists(f):
        # zarr writes no chunk that is all fill value (a holdout chunk without a held-out row)
        return np.full((b - a, *rest), arr.fill_value, dtype=arr.dtype)
    # the whole chunk as written (the last one too is stored whole), then its checksum
    out = scratch((cr, *rest), arr.dtype) if reuse else np.empty((cr, *rest), dtype=arr.dtype)
    with open(f, "rb", buffering=0) as fh:
        if kind == "raw":
            # one read returns at most 2 GiB (Linux): a wide table's chunk may be larger
            data, got = out.data.cast("B"), 0
            while got < out.nbytes and (n := fh.readinto(data[got:])):
                got += n
            tail = fh.read(5)
        else:
            whole = fh.read()
            got, tail, data = out.nbytes, whole[-4:], memoryview(whole)[:-4]
    if got != out.nbytes or len(tail) != 4:
        raise damaged(path, c, f"{os.path.getsize(f)} bytes")
    if _crc(data) != tail:
        raise damaged(path, c, "checksum")
    if kind != "raw":
        codec.decode(data, out=out)
    return out[: b - a]


def write_rows(path: str, a: int, b: int, values: np.ndarray) -> None:
    """Write ``values`` into rows a..b of the zarr array at ``path``.

    A whole chunk of a local array (or the last chunk's rows) is encoded here and its file
    replaced at once (written beside it, then renamed), so a reader never sees half a chunk and
    a retried task writes the same file; anything else goes through zarr."""
    arr = open_array(path, "r+")
    at = _chunk_file(path, arr, a, b)
    cr = arr.chunks[0]
    if at is None or not (b - a == cr or b == arr.shape[0]):
        arr[a:b] = values
        return
    f, (kind, codec) = at
    if b - a == cr:
        full = np.ascontiguousarray(values, dtype=arr.dtype)
    else:
        full = np.full((cr, *arr.shape[1:]), arr.fill_value, dtype=arr.dtype)
        full[: b - a] = values
    # the array's own bytes, not a copy (a fresh 8 MB copy costs page faults)
    data = full.data.cast("B") if kind == "raw" else codec.encode(full)
    os.makedirs(os.path.dirname(f), exist_ok=True)
    tmp = f"{f}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.write(_crc(data))
    except OSError as err:  # named: a full disk's message names the file
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OSError(err.errno, err.strerror, err.filename or f) from err
    os.replace(tmp, f)
