"""Storage faults a test injects: an S3 server that fails some requests, and a full disk.

Object storage
--------------
``S3App`` wraps moto's WSGI app in the ``s3_server`` fixture (tests/conftest.py): it answers one
request at a time (S3's atomicity of conditional writes, which moto lacks) and, inside
``failing_s3``, fails a drawn fraction of the requests before moto sees them. The server runs in
the test's process, so every client is affected: the test's own, a Dask worker's, and a ``dpmm``
subprocess's.

    with failing_s3(0.2, kinds=("503", "throttle", "reset"), ops=("get", "put")) as faults:
        ...  # 1 in 5 reads and writes fail
    faults.injected  # Counter of (kind, op, key) -> faults

Kinds: "503" (503 SlowDown, S3's answer to too many requests), "throttle" (429 with the
throttling code ``Throttling``), "reset" (the connection closed without an answer, the request
not applied). Ops: "get" (GET, HEAD: reads and listings), "put" (PUT, POST, DELETE: writes).
``match``: only requests whose path (``/bucket/key``) contains it; ``limit``: at most that many
faults (then every request passes). ``rate=1.0`` fails every matching request: a client's
retries are spent.

A full disk
-----------
``full_disk(path, size)`` mounts a file system of ``size`` bytes at the directory ``path``: a
tmpfs where the test runs as root (``mount -t tmpfs``), else a loop-mounted ext4 file; where
neither can be mounted it raises ``pytest.skip`` naming why (``full_disk.how`` says which ran),
and under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

KINDS = ("503", "throttle", "reset")
OPS = ("get", "put")
_ANSWERS = {
    "503": ("503 Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "throttle": ("429 Too Many Requests", "Throttling", "Rate exceeded."),
}


@dataclass
class Faults:
    """What ``failing_s3`` injects (its arguments) and what it injected so far."""

    rate: float
    kinds: tuple[str, ...] = KINDS
    ops: tuple[str, ...] = OPS
    match: str | None = None
    limit: int | None = None
    seed: int = 0
    # (kind, op, path) -> faults injected
    injected: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)
    requests: int = 0

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS] + [o for o in self.ops if o not in OPS]
        if bad or not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"failing_s3: kinds in {KINDS}, ops in {OPS}, rate in [0, 1]")
        self._rng = random.Random(self.seed)

    @property
    def total(self) -> int:
        return sum(self.injected.values())

    def draw(self, method: str, path: str) -> tuple[str, str] | None:
        """The fault (kind, op) of one request, or None: it passes."""
        op = "get" if method in ("GET", "HEAD") else "put"
        self.requests += 1
        if op not in self.ops or (self.match is not None and self.match not in path):
            return None
        if self.limit is not None and self.total >= self.limit:
            return None
        if self._rng.random() >= self.rate:
            return None
        kind = self._rng.choice(self.kinds)
        self.injected[(kind, op, path)] += 1
        return kind, op


class S3App:
    """moto's WSGI app answering one request at a time, failing those ``faults`` draws."""

    def __init__(self, app: Any) -> None:
        self.app, self.lock = app, threading.Lock()
        self.faults: Faults | None = None

    def __call__(self, environ: Any, start_response: Any) -> list[bytes]:
        with self.lock:
            drawn = None
            if self.faults is not None:
                drawn = self.faults.draw(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""))
            if drawn is None:
                # moto's server answers requests in threads with no lock: two conditional writes
                # of one key (``If-None-Match: *``) could both succeed, which S3 never allows
                return list(self.app(environ, start_response))
            # the client must have sent its whole request before an answer (or a reset) comes
            length = int(environ.get("CONTENT_LENGTH") or 0)
            if length:
                environ["wsgi.input"].read(length)
            kind = drawn[0]
            if kind == "reset":
                return _reset(environ, start_response)
            status, code, message = _ANSWERS[kind]
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{message}</Message><Resource>{environ.get('PATH_INFO', '')}"
                "</Resource><RequestId>injected</RequestId></Error>"
            ).encode()
            headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
            start_response(status, headers)
            # a HEAD's answer has no body (its length is the body's a GET would have had)
            return [] if environ["REQUEST_METHOD"] == "HEAD" else [body]


def _reset(environ: Any, start_response: Any) -> list[bytes]:
    """Drop the request's connection without an answer (SO_LINGER 0: a TCP reset once closed)."""
    sock = environ.get("werkzeug.socket")
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RDWR)
    # werkzeug then fails to write to the socket and drops the connection quietly
    start_response("500 Internal Server Error", [("Content-Length", "0")])
    return []


# the app of the session's ``s3_server`` (tests/conftest.py sets it)
SERVER: S3App | None = None


@contextlib.contextmanager
def failing_s3(
    rate: float,
    kinds: tuple[str, ...] = KINDS,
    ops: tuple[str, ...] = OPS,
    match: str | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> Iterator[Faults]:
    """Fail a fraction ``rate`` of the ``s3_server``'s requests during the block (module
    docstring); yields the ``Faults`` whose ``injected`` counts them."""
    if SERVER is None:
        raise RuntimeError("failing_s3 needs the s3_server fixture")
    faults = Faults(rate, tuple(kinds), tuple(ops), match, limit, seed)
    old, SERVER.faults = SERVER.faults, faults
    try:
        yield faults
    finally:
        SERVER.faults = old


@dataclass
class Disk:
    """A small file system ``full_disk`` mounted: where, its size, and how ("tmpfs", "loop")."""

    path: Path
    size: int
    how: str


def _sh(*cmd: str) -> str:
    """Run ``cmd``; its error output ("" when it succeeded)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except OSError as err:
        return str(err)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


@contextlib.contextmanager
def full_disk(path: str | os.PathLike[str], size: int = 2 << 20) -> Iterator[Disk]:
    """A file system of ``size`` bytes mounted at ``path`` (created) during the block."""
    where = Path(path)
    where.mkdir(parents=True, exist_ok=True)
    why = _sh("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where))
    how, image = "tmpfs", None
    if why:
        image = where.with_name(f".{where.name}.img")
        with open(image, "wb") as fh:
            fh.truncate(max(size, 1 << 20))
        why_loop = _sh("mkfs.ext4", "-q", "-F", str(image)) or _sh(
            "mount", "-o", "loop", str(image), str(where)
        )
        if why_loop:
            image.unlink()
            reason = f"full_disk: cannot mount a small file system ({why}; {why_loop})"
            if os.environ.get("CI") == "true":
                pytest.fail(reason)
            pytest.skip(reason)
        how = "loop"
    try:
        yield Disk(where, size, how)
    finally:
        _sh("umount", "-l", str(where))
        if image is not None:
            image.unlink()
        shutil.rmtree(where, ignore_errors=True)


def stop_processes(procs: list[subprocess.Popen[Any]]) -> None:
    """SIGTERM each process still running, last started first, then wait for each (30 s, then
    SIGKILL): a Dask scheduler and its workers, or a Prefect server."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
