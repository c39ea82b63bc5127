"""Where the pipeline reads and writes: local paths, and fsspec URLs of object storage.

INPUT, OUT, dataset stores and models may be local paths or URLs (``s3://``; ``gs://`` and
``abfs://`` with gcsfs / adlfs). ``location`` turns either into a ``Loc``: a ``pathlib.Path`` or a
``RemotePath`` offering the few ``Path`` methods the pipeline uses over fsspec. This module is the
one place that tells the two apart. Credentials come from each process's standard environment
(``AWS_*``, ``FSSPEC_<PROTOCOL>_<OPTION>``), never the command line; ``redact`` removes a
user:password part of a URL before it is shown or recorded. Every S3 client of a process that
names a URL here retries as ``config.STORAGE_ATTEMPTS`` says (``retry_policy``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from errno import EDQUOT, ENOSPC
from functools import cached_property
from pathlib import Path
from typing import Any, TypeAlias

from pipeline.core.errors import InputError, StorageError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_LOCAL_SCHEMES = ("file", "local")
# the package behind each scheme fsspec knows but may not have installed
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs"}
_PACKAGES.update({"az": "adlfs", "abfss": "adlfs"})
log = logging.getLogger(__name__)


def scheme(x: Any) -> str | None:
    """The URL scheme of ``x`` in lower case (None for a path)."""
    if not isinstance(x, str):
        return None
    m = _SCHEME.match(x)
    return m.group(1).lower() if m else None


def is_where(x: Any) -> bool:
    """Whether ``x`` names a place (``Where``): a path, a URL or a ``RemotePath``."""
    return isinstance(x, (str, os.PathLike, RemotePath))


def is_url(x: Any) -> bool:
    """Whether ``x`` is a URL of a remote file system (``file://`` is a local path)."""
    if isinstance(x, RemotePath):
        return True
    s = scheme(x)
    return s is not None and s not in _LOCAL_SCHEMES


def redact(url: str) -> str:
    """``url`` without a ``user:password@`` part (shown and recorded URLs carry no secret)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1", str(url))


class RemotePath:
    """A file or prefix of an fsspec file system with the ``Path`` methods used; ``str()``: URL."""

    def __init__(self, url: str):
        s = scheme(url)
        if s is None:
            raise ValueError(f"{url}: not a URL")
        rest = url[len(s) + 3 :].strip("/")
        self.protocol = s
        self.url = f"{s}://{rest}"

    # naming -------------------------------------------------------------------------------
    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({redact(self.url)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, name: str | os.PathLike[str]) -> RemotePath:
        name = os.fspath(name).strip("/")
        if not name or ".." in name.split("/"):
            raise ValueError(f"{redact(self.url)}: bad name {name!r} under it")
        return RemotePath(f"{self.url}/{name}")

    @property
    def key(self) -> str:
        """The path inside the file system (``bucket/key`` of S3), as fsspec names it."""
        return self.url[len(self.protocol) + 3 :]

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemotePath:
        if "/" not in self.key:
            return self
        return RemotePath(f"{self.protocol}://{self.key.rsplit('/', 1)[0]}")

    @property
    def bucket(self) -> str:
        return self.key.split("/", 1)[0]

    def expanduser(self) -> RemotePath:
        return self

    def resolve(self) -> RemotePath:
        """Itself: a URL has no links or relative parts to resolve."""
        return self

    def relative_to(self, other: RemotePath) -> str:
        if self == other:
            return "."
        if not self.url.startswith(other.url + "/"):
            raise ValueError(f"{self} is not under {other}")
        return self.url[len(other.url) + 1 :]

    # the file system ------------------------------------------------------------------------
    @cached_property
    def fs(self) -> Any:
        return filesystem(self.protocol, self.url)

    def exists(self) -> bool:
        return bool(self.fs.exists(self.key))

    def is_dir(self) -> bool:
        return bool(self.fs.isdir(self.key))

    def is_file(self) -> bool:
        return bool(self.fs.isfile(self.key))

    def read_bytes(self) -> bytes:
        return bytes(self.fs.cat_file(self.key))

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        # one PUT: a reader sees the old object or the new one whole
        self.fs.pipe_file(self.key, bytes(data))
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to create: a prefix exists once an object is written under it."""

    def iterdir(self) -> Iterator[RemotePath]:
        for key in self.fs.ls(self.key, detail=False):
            key = str(key).rstrip("/")
            if key != self.key:
                yield RemotePath(f"{self.protocol}://{key}")

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def open(self, mode: str = "rb") -> Any:
        return self.fs.open(self.key, mode)

    def stat_size(self) -> int:
        return int(self.fs.info(self.key)["size"])

    def files(self) -> dict[str, dict[str, Any]]:
        """Every object under this prefix (or this object): relative key -> fsspec info."""
        if self.is_file():
            return {".": self.fs.info(self.key)}
        found = self.fs.find(self.key, detail=True)
        return {str(k)[len(self.key) + 1 :]: v for k, v in sorted(found.items())}


Loc: TypeAlias = Path | RemotePath
# what a caller may name a place with
Where: TypeAlias = str | os.PathLike[str] | RemotePath


def location(x: Where) -> Loc:
    """A local ``Path`` (a path, or a ``file://`` URL) or a ``RemotePath`` (any other URL)."""
    if isinstance(x, (Path, RemotePath)):
        return x
    if isinstance(x, str):
        s = scheme(x)
        if s in _LOCAL_SCHEMES:
            return Path(x[len(s or "") + 3 :] or "/")
        if s is not None:
            retry_policy()
            return RemotePath(x)
    return Path(x)


def shared(loc: Loc) -> bool:
    """Whether every machine of a cluster reaches ``loc`` (object storage, not a local path)."""
    return isinstance(loc, RemotePath)


def folder(loc: Loc) -> str:
    """What a message calls ``loc`` when it holds files: "directory", or "prefix"."""
    return "prefix" if isinstance(loc, RemotePath) else "directory"


def can_hold_files(loc: Loc) -> bool:
    """Whether files can be written under ``loc``: an existing local directory, or any prefix."""
    return isinstance(loc, RemotePath) or loc.is_dir()


def size(loc: Loc) -> int:
    """The size in bytes of the file or object ``loc``."""
    return loc.stat_size() if isinstance(loc, RemotePath) else loc.stat().st_size


def stamp(info: dict[str, Any]) -> str:
    """What changes when an object is rewritten: S3's ETag, else its modification time."""
    for k in ("ETag", "etag", "mtime", "LastModified", "last_modified", "created"):
        if info.get(k) is not None:
            return str(info[k])
    return ""


def file_stamps(loc: Loc) -> dict[str, tuple[int, int | str]]:
    """Every file under ``loc`` (or ``loc`` itself, named "."): relative path -> (size, what
    changes when it is rewritten: the mtime in ns of a local file, ``stamp`` of an object)."""
    if isinstance(loc, RemotePath):
        return {rel: (int(info.get("size") or 0), stamp(info)) for rel, info in loc.files().items()}
    files = sorted(p for p in loc.rglob("*") if p.is_file()) if loc.is_dir() else [loc]
    out: dict[str, tuple[int, int | str]] = {}
    for f in files:
        st = f.stat()
        out["." if f == loc else f.relative_to(loc).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def subdirs(loc: Loc) -> list[Loc]:
    """The directories (or sub-prefixes) right under ``loc``."""
    if isinstance(loc, Path):
        return [p for p in loc.iterdir() if p.is_dir()]
    found: list[Loc] = []
    for e in loc.fs.ls(loc.key, detail=True):
        key = str(e["name"]).rstrip("/")
        if e.get("type") == "directory" and key != loc.key:
            found.append(RemotePath(f"{loc.protocol}://{key}"))
    return found


def same_place(a: Where, b: Where) -> bool:
    """Whether ``a`` and ``b`` are the same URL, or local paths of one existing file."""
    la, lb = location(a), location(b)
    if la == lb:
        return True
    return (
        isinstance(la, Path)
        and isinstance(lb, Path)
        and lb.exists()
        and la.resolve() == lb.resolve()
    )


@contextlib.contextmanager
def fs_errors(x: Where, what: str = "") -> Iterator[None]:
    """A remote file system's failure in the block as a one-line ``InputError`` naming ``x``."""
    try:
        yield
    except InputError:
        raise
    except Exception as err:
        if not is_url(x):
            raise
        raise fs_error(str(x), err, what) from err


@contextlib.contextmanager
def local_copy(x: Where) -> Iterator[Path]:
    """A local path of ``x`` for a reader that needs a real file: ``x`` when local, else a
    temporary copy removed after the block, whose ``InputError`` messages name the URL."""
    loc = location(x)
    if isinstance(loc, Path):
        yield loc
        return
    check_reachable(loc)
    with tempfile.TemporaryDirectory(prefix="dpmm-read-") as tmp:
        local = Path(tmp) / loc.name
        with fs_errors(str(x)):
            if loc.is_dir():  # a directory of Parquet parts
                loc.fs.get(loc.key + "/", str(local), recursive=True)
            elif loc.exists():
                loc.fs.get_file(loc.key, str(local))
        try:
            yield local
        except InputError as err:
            raise type(err)(str(err).replace(str(local), redact(str(x)))) from None


def filesystem(protocol: str, url: str) -> Any:
    """The fsspec file system of ``protocol`` from the environment; a ``ValueError`` otherwise."""
    import fsspec

    try:
        # no listings cache: the workers write into the prefixes this process lists
        return fsspec.filesystem(protocol, use_listings_cache=False)
    except ImportError as err:
        pkg = _PACKAGES.get(protocol, f"the fsspec implementation of {protocol}://")
        raise InputError(
            f"{redact(url)}: {protocol}:// needs the {pkg} package (pip install {pkg})"
        ) from err
    except ValueError as err:
        if "not known" in str(err).lower():
            raise InputError(
                f"{redact(url)}: unknown storage scheme {protocol}:// (a local path, file://, "
                "s3://, gs:// or abfs://)"
            ) from err
        raise


def fs_error(url: Any, err: BaseException, what: str = "") -> InputError:
    """A one-line ``InputError`` naming ``url`` for a file system's failure, never a credential."""
    where = f"{what} {redact(str(url))}".strip()
    name = type(err).__name__
    text = " ".join(str(err).split())
    if isinstance(err, InputError):
        return err
    if name in ("NoCredentialsError", "PartialCredentialsError") or "credentials" in text.lower():
        return InputError(
            f"{where}: no credentials for {scheme(str(url))}:// (set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, in the environment)"
        )
    if isinstance(err, FileNotFoundError):
        if "bucket" in text.lower():
            loc = location(str(url))
            bucket = loc.bucket if isinstance(loc, RemotePath) else ""
            return InputError(f"{where}: the bucket {bucket!r} does not exist")
        return InputError(f"{where}: no such file or directory")
    if isinstance(err, PermissionError):
        return InputError(f"{where}: access denied ({text})")
    return InputError(f"{where}: cannot be reached ({name}: {text})")


def check_reachable(x: Any, what: str = "") -> None:
    """For a URL: that its file system and bucket exist and can be listed with the environment's
    credentials, else an ``InputError`` naming it; nothing for a local path."""
    loc = location(x)
    if not isinstance(loc, RemotePath):
        return
    try:
        fs = loc.fs
        fs.ls(loc.bucket, detail=False)
    except Exception as err:
        raise fs_error(loc.url, err, what) from err


#: object storage's retry policy, every S3 client's (``retry_policy``, ``config.STORAGE_ATTEMPTS``):
#: a request failed by a 5xx, a 429 or a lost connection is tried this often in all, with
#: botocore's "legacy" backoff (a random 0..2^(k-1) s before retry k), each retry a warning naming
#: the object
STORAGE_ATTEMPTS = 5


@functools.cache
def retry_policy() -> None:
    """Give every S3 client this process makes from now on (s3fs's, zarr's stores' too, unless
    the environment sets fsspec's options) ``config.STORAGE_ATTEMPTS`` and ``_retried``."""
    import fsspec.config

    retries = {"total_max_attempts": STORAGE_ATTEMPTS, "mode": "legacy"}
    fsspec.config.conf.setdefault("s3", {}).setdefault("config_kwargs", {}).setdefault(
        "retries", retries
    )
    with contextlib.suppress(ImportError):
        from botocore import handlers

        # every botocore session registers these when made (s3fs makes one per client)
        handlers.BUILTIN_HANDLERS.append(("needs-retry.s3", _retried))


def _retried(attempts: int, request_dict: dict[str, Any], response: Any = None, **kw: Any) -> None:
    """botocore's ``needs-retry``: a warning naming the object of a request failed by a 5xx, a
    429 or a lost connection, and a ``StorageError`` naming it once its attempts are spent."""
    from botocore.exceptions import ConnectionError, HTTPClientError

    lost = kw.get("caught_exception")
    if lost is not None:
        if not isinstance(lost, (ConnectionError, HTTPClientError)):
            return
        why = f"connection lost ({type(lost).__name__})"
    else:
        status = int(getattr(response[0], "status_code", 0))
        if status < 500 and status != 429:
            return
        why = f"{(response[1] or {}).get('Error', {}).get('Code') or 'HTTP'} ({status})"
    # "/bucket/key" whether the bucket is in the host name or the path
    url = f"s3:/{request_dict.get('auth_path', '')}"
    if attempts >= STORAGE_ATTEMPTS:
        raise StorageError(
            f"{url}: {why}, still failing after {attempts} attempts (the storage is unavailable "
            "or overloaded; run the command again later)"
        )
    log.warning("%s: %s; retry %d of %d", url, why, attempts, STORAGE_ATTEMPTS - 1)


def no_space(
    err: BaseException | None, places: Sequence[str | os.PathLike[str]] = ()
) -> StorageError | None:
    """A ``StorageError`` naming the file when ``err``, or an error it came from, is a full
    device (ENOSPC, or a quota: EDQUOT); else None.

    A failed ``write`` names no file: the message then names the one of ``places`` (the local
    folders the command writes: OUT, the dataset stores, the temporary folder) whose device has
    the least space free now.
    """
    seen: set[int] = set()
    # a chain may close on itself (an error re-raised inside its own handler)
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno in (ENOSPC, EDQUOT):
            where = f" writing {err.filename}" if err.filename else _fullest(places)
            return StorageError(f"no space left on device{where} (free some, then run again)")
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _fullest(places: Sequence[str | os.PathLike[str]]) -> str:
    """ " under PLACE (N MiB free there now)" for the local place of ``places`` whose device
    has the least space free, or "" when none is local."""
    free: list[tuple[int, str]] = []
    for place in places:
        if is_url(os.fspath(place)):
            continue
        path = Path(place).expanduser().absolute()
        # the place may not exist yet (or no longer): its device is its nearest existing folder's
        at = next((a for a in (path, *path.parents) if a.is_dir()), None)
        if at is not None:
            free.append((shutil.disk_usage(at).free, str(path)))
    if not free:
        return ""
    left, fullest = min(free)
    return f" under {fullest} ({left / 2**20:.1f} MiB free there now)"


def rmtree(loc: Loc, ignore_errors: bool = False) -> None:
    """Remove a directory or prefix and everything under it."""
    if isinstance(loc, Path):
        shutil.rmtree(loc, ignore_errors=ignore_errors)
        return
    try:
        if loc.exists():
            loc.fs.rm(loc.key, recursive=True)
    except Exception:
        if not ignore_errors:
            raise
    # listings may be cached: the next exists() must see the removal
    with contextlib.suppress(Exception):
        loc.fs.invalidate_cache(loc.key)


def write_atomic(path: Where, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically (a synced temporary file renamed, or one PUT)."""
    loc = location(path)
    if isinstance(loc, RemotePath):
        loc.write_bytes(data)
        return
    fd, tmp = tempfile.mkstemp(dir=loc.parent, prefix=f".{loc.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, loc)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # not every file system can sync a directory; the rename itself is atomic either way
    with contextlib.suppress(OSError):
        dfd = os.open(loc.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@contextlib.contextmanager
def local_dir(loc: Loc) -> Iterator[Path]:
    """A local directory whose files end up in ``loc`` (uploaded when the block succeeds)."""
    if isinstance(loc, Path):
        loc.mkdir(parents=True, exist_ok=True)
        yield loc
        return
    with tempfile.TemporaryDirectory(prefix="dpmm-upload-") as tmp:
        yield Path(tmp)
        upload(Path(tmp), loc)


def upload(src: Path, dest: RemotePath) -> None:
    """Copy every file under the local directory ``src`` to the prefix ``dest``."""
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        dest.fs.put_file(str(f), (dest / f.relative_to(src).as_posix()).key)


def move(src: Loc, dest: Loc) -> None:
    """Move ``src`` to ``dest`` on the same file system: a rename locally, else a server-side
    copy of each object, then ``src`` removed (within a place no reader sees yet)."""
    if isinstance(src, Path) and isinstance(dest, Path):
        src.rename(dest)
        return
    if not (isinstance(src, RemotePath) and isinstance(dest, RemotePath)):
        raise ValueError(f"{src} -> {dest}: not on the same file system")
    for rel in src.files():
        target = dest if rel == "." else dest / rel
        src.fs.copy((src if rel == "." else src / rel).key, target.key)
    rmtree(src)
