"""A registry of model versions that any number of processes publish into at once: ``dpmm
serve`` runs, on one machine or several, into one local directory or object-storage prefix
(docs/how-to/scheduled-refit.md tells the whole protocol).

``MODELS/vN/`` is version N, complete; ``MODELS/LATEST`` names the newest and only moves forward;
``MODELS/.staging/<host>-<pid>-<time>-<tag>/`` is a writer's version in progress, its own;
``MODELS/.claims/vN`` (object storage) is number N claimed by a writer. A writer builds its
version in its staging place, then takes the next free number: locally by a rename to ``vN``
(refused onto another writer's: it tries N + 1), on object storage by creating the claim with
``If-None-Match: *``, copying its objects and writing the manifest last. ``LATEST`` moves under
an exclusive-create lock (local) or a compare-and-swap with ``If-Match`` (object storage).
A crashed writer blocks the others for at most the lease (``pipeline.core.config.
REGISTRY_LEASE``): a lock whose process on this host is gone is taken over at once; what it left
is invisible and removed by the next writer (after ``outputs.STALE_SECONDS`` when it ran on
another host), its claim kept as a tombstone so that its number is never used again, and
marked once its ``vN/`` is gone (until then every writer removes what is left of it).
"""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core import outputs, storage
from pipeline.core.config import REGISTRY_LEASE as LEASE
from pipeline.core.errors import InputError
from pipeline.core.outputs import write_json
from pipeline.core.storage import Loc, RemotePath

POINTER = "LATEST"
VERSION = re.compile(r"^v([1-9][0-9]*)$")
RECORD = "version.json"
STAGING = ".staging"
CLAIMS = ".claims"
LOCK = ".LATEST.lock"
STALE = outputs.STALE_SECONDS
# a number or a pointer taken by other writers this many times in a row is a bug, not a race
TRIES = 10_000
_STAGED = re.compile(r"^(.+)-([0-9]+)-([0-9]{8}T[0-9]{6})-[0-9a-f]+$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _owner() -> dict[str, Any]:
    """What a claim or lock records of its writer."""
    return {"host": _host(), "pid": os.getpid(), "time": time.time(), "token": uuid.uuid4().hex}


def _gone(host: str, pid: int) -> bool:
    """Whether the process ``pid`` of ``host`` is known to be gone (only this host's can be)."""
    return host == _host() and pid != os.getpid() and not outputs.pid_alive(pid)


def _number(text: str, where: Loc) -> int:
    name = text.strip()
    m = VERSION.match(name)
    if m is None:
        raise InputError(f"{storage.redact(str(where))}: names {name!r}, not a version vN")
    return int(m.group(1))


def _conflict(err: BaseException) -> bool:
    """Whether an object store refused a conditional write (another writer was first)."""
    if isinstance(err, FileExistsError):
        return True
    response = getattr(err.__cause__, "response", None) or {}
    code = response.get("Error", {}).get("Code")
    return code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


class Registry:
    """The model versions and the pointer under ``root``, a local directory or a prefix of
    object storage (module docstring), written by any number of processes at once.

    Parameters
    ----------
    root : str, path or RemotePath
        MODELS.
    lease : float, optional
        Seconds after which what a crashed writer left stops blocking (default ``LEASE``).
    """

    def __init__(self, root: storage.Where, lease: float | None = None) -> None:
        self.root: Loc = storage.location(root)
        self.lease = float(LEASE if lease is None else lease)

    def __repr__(self) -> str:
        return f"Registry({storage.redact(str(self.root))!r})"

    def _shown(self, loc: Loc | None = None) -> str:
        return storage.redact(str(self.root if loc is None else loc))

    def version_dir(self, n: int) -> Loc:
        return self.root / f"v{int(n)}"

    def _published(self, p: Loc) -> bool:
        # renamed into place whole, or counted once its manifest is there; the record tells
        # it from a folder of that name that is not a version
        return outputs.committed(p) and (p / RECORD).is_file()

    def versions(self) -> list[int]:
        """Published version numbers, ascending (a version in progress, or left by a crash,
        is not one)."""
        with storage.fs_errors(self.root, "MODELS"):
            if not self.root.is_dir():
                return []
            found = [(VERSION.match(p.name), p) for p in self.root.iterdir()]
            return sorted(int(m.group(1)) for m, p in found if m and self._published(p))

    def latest(self) -> Loc | None:
        """The published version the pointer names, or None before the first. An
        ``InputError`` naming the pointer when it names no published version."""
        pointer = self.root / POINTER
        with storage.fs_errors(pointer, "MODELS"):
            try:
                text = pointer.read_text()
            except FileNotFoundError:
                return None
            found = self.version_dir(_number(text, pointer))
            if not self._published(found):
                raise InputError(
                    f"{self._shown(pointer)}: names {text.strip()!r}, not a published version"
                )
        return found

    def check(self) -> None:
        """An ``InputError`` of one line naming MODELS when it cannot be written (a file, a
        read-only place, no such bucket, denied) or its pointer names no published version."""
        probe = self.root / f".probe-{uuid.uuid4().hex}"
        try:
            with storage.fs_errors(self.root, "--models"):
                storage.check_reachable(self.root, "--models")
                self.root.mkdir(parents=True, exist_ok=True)
                probe.write_bytes(b"")
                probe.unlink()
        except OSError as err:
            why = err.strerror or type(err).__name__
            if isinstance(self.root, Path) and self.root.is_file():
                why = "a file, not a directory"
            raise InputError(f"--models {self._shown()}: cannot be written ({why})") from err
        self.latest()

    # -- a writer's version in progress ---------------------------------------------------------
    def stage(self) -> Loc:
        """An empty place of this writer's own to build a version in (``publish`` makes it a
        version). What writers that are gone left in their places is removed first."""
        self._remove_stale_staging()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        place = self.root / STAGING / f"{_host()}-{os.getpid()}-{stamp}-{uuid.uuid4().hex[:12]}"
        place.mkdir(parents=True)
        return place

    def _remove_stale_staging(self) -> None:
        try:
            found = storage.subdirs(self.root / STAGING)
        except FileNotFoundError:
            return
        for p in found:
            m = _STAGED.match(p.name)
            if m is None:
                continue
            born = calendar.timegm(time.strptime(m.group(3), "%Y%m%dT%H%M%S"))
            if _gone(m.group(1), int(m.group(2))) or time.time() - born > STALE:
                storage.rmtree(p, ignore_errors=True)

    def publish(self, staged: Loc, record: dict[str, Any]) -> Loc:
        """Make the complete version built in ``staged`` (``stage``) the next free version
        (``record`` and its number its ``version.json``), then move the pointer to it unless it
        names a higher one. Returns the version's directory."""
        with storage.fs_errors(self.root, "--models"):
            final = self.write_version(staged, record)
            self.advance(int(final.name[1:]))
        return final

    def write_version(self, staged: Loc, record: dict[str, Any]) -> Loc:
        """The first half of ``publish``: the version complete and visible under its number,
        the pointer not moved (what a crash between the two leaves; ``finish_publish`` moves
        it)."""
        if isinstance(staged, Path):
            return self._rename_in(staged, record)
        root = self.root
        assert isinstance(root, RemotePath)
        fs = root.fs
        objects = [str(k)[len(staged.key) + 1 :] for k in fs.find(staged.key)]
        for _ in range(TRIES):
            n, claim, etag = self._claim()
            final = root / f"v{n}"
            for rel in objects:
                fs.cp_file((staged / rel).key, (final / rel).key)
            write_json(final / RECORD, {"version": n, **record})
            try:
                holds = claim.fs.info(claim.key)["ETag"] == etag
            except FileNotFoundError:
                holds = False
            if holds:
                outputs.commit(final)
                claim.unlink(missing_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    fs.rm([(staged / rel).key for rel in objects])
                return final
            # paused for a day: another writer made this claim a tombstone and removed vN/,
            # perhaps before this copy ended; vN is never used again, so what it left goes
            storage.rmtree(final, ignore_errors=True)
        raise RuntimeError(f"{self._shown()}: no version number could be claimed")

    def _rename_in(self, staged: Path, record: dict[str, Any]) -> Path:
        n = max(self.versions(), default=0) + 1
        for _ in range(TRIES):
            final = self.version_dir(n)
            assert isinstance(final, Path)
            write_json(staged / RECORD, {"version": n, **record})
            try:
                # refused when another writer's vN is there (not empty: its version.json)
                os.rename(staged, final)
            except OSError:
                if not final.exists():
                    raise
                n += 1
                continue
            return final
        raise RuntimeError(f"{self._shown()}: no free version number")

    # -- object storage: numbers claimed by conditional creates ---------------------------------
    def _claim(self) -> tuple[int, RemotePath, str]:
        """The next free number, claimed: (N, its claim, the claim's ETag)."""
        claims = self.root / CLAIMS
        assert isinstance(claims, RemotePath)
        taken = self._release_stale_claims(claims)
        taken += [int(m.group(1)) for p in self.root.iterdir() if (m := VERSION.match(p.name))]
        n = max(taken, default=0) + 1
        data = json.dumps(_owner()).encode()
        for _ in range(TRIES):
            claim = claims / f"v{n}"
            try:
                out = claims.fs.pipe_file(claim.key, data, mode="create")
            except Exception as err:
                if not _conflict(err):
                    raise
                n += 1
                continue
            if claims.fs.find((claims.parent / f"v{n}").key, maxdepth=1):
                # its writer published it, and removed its claim, since the listing
                claim.unlink(missing_ok=True)
                n += 1
                continue
            etag = (out or {}).get("ETag") or claims.fs.info(claim.key)["ETag"]
            return n, claim, str(etag)
        raise RuntimeError(f"{self._shown()}: no version number could be claimed")

    def _release_stale_claims(self, claims: RemotePath) -> list[int]:
        """The numbers of every claim. A claim of a published version is removed (its writer
        crashed after the manifest); one whose writer is gone is made a tombstone and what that
        writer copied is removed (module docstring)."""
        taken: list[int] = []
        try:
            found = list(claims.iterdir())
        except FileNotFoundError:
            return taken
        for claim in found:
            m = VERSION.match(claim.name)
            if m is None:
                continue
            taken.append(int(m.group(1)))
            try:
                held = json.loads(claim.read_text())
            except (FileNotFoundError, ValueError):
                continue
            if held.get("removed"):
                continue  # a tombstone whose version's objects are gone
            gone = _gone(str(held.get("host")), int(held.get("pid", -1)))
            if not held.get("abandoned") and not (
                gone or time.time() - float(held.get("time", 0)) > STALE
            ):
                continue  # a writer's claim, the copy of its version under way
            final = self.version_dir(int(m.group(1)))
            if self._published(final):
                claim.unlink(missing_ok=True)  # it crashed after its manifest
                continue
            if not held.get("abandoned"):
                held = {**held, "abandoned": time.time()}
                if not self._replace_claim(claim, held):
                    continue
            # a tombstone is written before vN/ is removed, and the writer removing it can
            # crash in between: every writer removes vN/ until the tombstone says it is gone
            storage.rmtree(final, ignore_errors=True)
            self._replace_claim(claim, {**held, "removed": time.time()})
        return taken

    @staticmethod
    def _replace_claim(claim: RemotePath, held: dict[str, Any]) -> bool:
        """Write ``held`` over the claim unless another writer writes it between this one's
        look at its ETag and the write (compare-and-swap); whether it was written."""
        try:
            etag = claim.fs.info(claim.key)["ETag"]
            claim.fs.pipe_file(claim.key, json.dumps(held).encode(), IfMatch=etag)
        except Exception as err:
            if not (_conflict(err) or isinstance(err, FileNotFoundError)):
                raise
            return False
        return True

    # -- the pointer ------------------------------------------------------------------------------
    def advance(self, n: int) -> bool:
        """Point ``LATEST`` to version ``n`` unless it names ``n`` or a higher one already;
        whether it moved."""
        pointer = self.root / POINTER
        data = f"v{int(n)}\n".encode()
        if isinstance(pointer, Path):
            with self._lock():
                current = _number(pointer.read_text(), pointer) if pointer.exists() else 0
                if current >= n:
                    return False
                storage.write_atomic(pointer, data)
                return True
        for _ in range(TRIES):
            try:
                etag = pointer.fs.info(pointer.key)["ETag"]
                current = _number(pointer.read_text(), pointer)
            except FileNotFoundError:
                etag, current = None, 0
            if current >= n:
                return False
            cond: dict[str, Any] = {"IfMatch": etag} if etag else {"mode": "create"}
            try:
                pointer.fs.pipe_file(pointer.key, data, **cond)
            except Exception as err:
                if not (_conflict(err) or isinstance(err, FileNotFoundError)):
                    raise
                continue  # another writer moved it between the read and the write
            return True
        raise RuntimeError(f"{self._shown(pointer)}: could not be moved")

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Hold ``.LATEST.lock`` (local): an exclusive create; one older than the lease, or
        whose process on this host is gone, is taken over."""
        lock = self.root / LOCK
        assert isinstance(lock, Path)
        me = _owner()
        while True:
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._break_if_stale(lock)
                time.sleep(0.005)
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump(me, fh)
            break
        try:
            yield
        finally:
            held = _read_owner(lock)
            if held is not None and held.get("token") == me["token"]:
                lock.unlink(missing_ok=True)

    def _break_if_stale(self, lock: Path) -> None:
        try:
            mtime = lock.stat().st_mtime
        except FileNotFoundError:
            return
        held = _read_owner(lock) or {}
        born = float(held.get("time", mtime))
        dead = _gone(str(held.get("host", "")), int(held.get("pid", -1)))
        if not dead and time.time() - born <= self.lease:
            return
        # moved aside, not removed: if another writer took it over meanwhile, what was moved
        # is that writer's fresh lock, and it is put back
        aside = lock.with_name(f"{LOCK}.stale-{uuid.uuid4().hex}")
        try:
            os.rename(lock, aside)
        except FileNotFoundError:
            return
        moved = _read_owner(aside) or {}
        if moved.get("token") != held.get("token"):
            with contextlib.suppress(FileExistsError):
                os.link(aside, lock)
        aside.unlink(missing_ok=True)

    def finish_publish(self) -> int | None:
        """Move the pointer to the newest published version when it names an older one (a
        publish interrupted before its pointer moved); the version moved to, or None."""
        versions = self.versions()
        self.latest()  # a pointer naming no version is refused, not replaced
        if versions and self.advance(versions[-1]):
            return versions[-1]
        return None


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
