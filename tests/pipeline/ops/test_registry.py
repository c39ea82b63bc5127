"""Many writers of one model registry (``pipeline.ops.registry``) at once, in real processes,
locally and on a real S3-compatible server (moto's server mode, ``s3_server``): every version
complete and published once under its own number, ``LATEST`` only moving forward to the
highest; writers killed (SIGKILL) at random points of their publish block nothing and leave
nothing but their published versions; one paused while it holds the pointer's lock blocks the
others for the lease (short here) only."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.core import outputs, storage
from pipeline.ops.registry import Registry

WRITERS = 4
# rounds of every writer publishing at once: fewer on the S3 server, which answers one request
# at a time (tests/conftest.py) and takes ~30 of them a publish
ROUNDS = {"local": 20, "s3": 10}
LEASE = 2.0
# a hang guard for joins, not a measurement
JOIN_S = 240


def _ctx() -> Any:
    # forked from a server that imported this module once: a new writer starts in milliseconds
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _env() -> dict[str, str]:
    """The object store's endpoint and credentials: a forked writer has the environment of
    the server it is forked from, started before the test's."""
    return {k: v for k, v in os.environ.items() if k.startswith("AWS_")}


def _payload(name: str) -> bytes:
    return random.Random(name).randbytes(4096 + len(name))


def _publish_one(reg: Registry, name: str) -> int:
    staged = reg.stage()
    (staged / "model").mkdir(parents=True, exist_ok=True)
    data = _payload(name)
    (staged / "model" / "a.bin").write_bytes(data)
    (staged / "run.json").write_text(json.dumps({"name": name}))
    record = {"date": name, "sha": hashlib.sha256(data).hexdigest()}
    return int(reg.publish(staged, record).name[1:])


def _writer(
    root: str, env: dict[str, str], writer: int, rounds: int, barrier: Any, out: Any
) -> None:
    os.environ.update(env)
    reg = Registry(root, lease=LEASE)
    got = []
    for r in range(rounds):
        if barrier is not None:
            barrier.wait(JOIN_S)  # every writer publishes at the same moment
        got.append(_publish_one(reg, f"w{writer}-r{r}"))
    out.put((writer, got))


def _victim(root: str, env: dict[str, str], tag: str) -> None:
    """Publish forever, until killed."""
    os.environ.update(env)
    reg = Registry(root, lease=LEASE)
    for i in range(10**6):
        _publish_one(reg, f"{tag}-{i}")


def _run_writers(root: str, rounds: int, barrier: bool = True) -> dict[int, list[int]]:
    """``WRITERS`` processes publishing ``rounds`` versions each; meanwhile this process reads
    ``LATEST`` and checks that it only moves forward, to a published version."""
    ctx = _ctx()
    out = ctx.Queue()
    sync = ctx.Barrier(WRITERS) if barrier else None
    procs = [
        ctx.Process(target=_writer, args=(root, _env(), w, rounds, sync, out))
        for w in range(WRITERS)
    ]
    for p in procs:
        p.start()
    reg, seen = Registry(root), [0]
    while any(p.is_alive() for p in procs):
        latest = reg.latest()  # refused if it named no published version
        if latest is not None:
            seen.append(int(latest.name[1:]))
        time.sleep(0.5)  # the server answers the writers, mostly
    for p in procs:
        p.join(JOIN_S)
        assert p.exitcode == 0
    assert seen == sorted(seen), "LATEST moved back"
    return dict(out.get(timeout=JOIN_S) for _ in procs)


def _check(root: str) -> dict[str, int]:
    """Every published version whole (its payload, record and, on object storage, manifest
    match); LATEST names the highest. Returns {name: version}."""
    reg = Registry(root)
    names: dict[str, int] = {}
    for n in reg.versions():
        v = reg.version_dir(n)
        rec = json.loads((v / "version.json").read_text())
        data = (v / "model" / "a.bin").read_bytes()
        assert rec["version"] == n and data == _payload(rec["date"])
        assert hashlib.sha256(data).hexdigest() == rec["sha"]
        if isinstance(v, storage.RemotePath):
            manifest = json.loads((v / outputs.MANIFEST).read_text())
            sizes = {k: int(i["size"]) for k, i in v.files().items() if k != outputs.MANIFEST}
            assert manifest["objects"] == sizes
        assert rec["date"] not in names, f"{rec['date']} published twice"
        names[rec["date"]] = n
    assert names and str(reg.latest()) == str(reg.version_dir(max(names.values())))
    return names


@pytest.fixture(params=list(ROUNDS))
def models(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "models")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/models"


def test_many_writers_at_once(models: str) -> None:
    rounds = ROUNDS["s3" if models.startswith("s3://") else "local"]
    got = _run_writers(models, rounds)
    names = _check(models)
    numbers = sorted(n for ns in got.values() for n in ns)
    # every publish of every writer is there, each under its own number, nothing else is
    assert numbers == sorted(names.values()) == list(range(1, WRITERS * rounds + 1))
    assert {f"w{w}-r{r}" for w in range(WRITERS) for r in range(rounds)} == set(names)


def test_writers_killed_at_random_points_block_nothing(models: str) -> None:
    ctx, rng = _ctx(), random.Random(0)
    for k in range(12):
        p = ctx.Process(target=_victim, args=(models, _env(), f"victim{k}"))
        p.start()
        time.sleep(rng.uniform(0.05, 0.8))
        os.kill(p.pid, signal.SIGKILL)
        p.join(JOIN_S)
    got = _run_writers(models, 3, barrier=False)
    names = _check(models)
    # the writers after them each published everything, under their own numbers
    mine = {f"w{w}-r{r}" for w in range(WRITERS) for r in range(3)}
    assert mine <= set(names) and {names[x] for x in mine} == {n for v in got.values() for n in v}
    # nothing of the victims is left but their published versions
    root = storage.location(models)
    assert not (root / ".staging").exists() or not list((root / ".staging").iterdir())
    published = {f"v{n}" for n in names.values()}
    left = {p.name for p in root.iterdir() if p.name.startswith("v")} - published
    if isinstance(root, Path):
        assert not left and not (root / ".LATEST.lock").exists()
    else:
        # a victim killed in the copy of its version: what it copied is gone, and its claim is
        # kept as a tombstone, so that its number is never used again
        assert not left
        claims = root / ".claims"
        for c in claims.iterdir() if claims.exists() else []:
            assert "abandoned" in json.loads(c.read_text())


def _hold_lock(root: str, held: Any) -> None:
    reg = Registry(root, lease=LEASE)
    with reg._lock():
        held.set()
        time.sleep(JOIN_S)


def test_a_paused_writer_holding_the_pointer_lock_blocks_for_the_lease_only(
    tmp_path: Path,
) -> None:
    models = str(tmp_path / "models")
    (tmp_path / "models").mkdir()
    ctx = _ctx()
    held = ctx.Event()
    p = ctx.Process(target=_hold_lock, args=(models, held))
    p.start()
    try:
        assert held.wait(JOIN_S)
        os.kill(p.pid, signal.SIGSTOP)
        # alive but stopped: the writers wait for the lease, then take the lock over
        got = _run_writers(models, 2, barrier=False)
        assert sorted(n for v in got.values() for n in v) == list(range(1, 2 * WRITERS + 1))
        _check(models)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(JOIN_S)


def test_the_pointer_only_moves_forward_on_both_stores(models: str) -> None:
    reg = Registry(models)
    for name in ("a", "b"):
        _publish_one(reg, name)
    assert reg.advance(1) is False and str(reg.latest()).endswith("/v2")
    # a publish whose pointer did not move (a crash), completed by the next writer
    staged = reg.stage()
    (staged / "model").mkdir(parents=True, exist_ok=True)
    (staged / "model" / "a.bin").write_bytes(_payload("c"))
    reg.write_version(staged, {"date": "c", "sha": hashlib.sha256(_payload("c")).hexdigest()})
    assert str(reg.latest()).endswith("/v2") and reg.finish_publish() == 3
    assert _check(models) == {"a": 1, "b": 2, "c": 3}


def _s3_registry(bucket: str) -> tuple[Registry, storage.RemotePath]:
    reg = Registry(f"s3://{bucket}/models")
    assert isinstance(reg.root, storage.RemotePath)
    return reg, reg.root


def _tombstone_with_leftovers(root: storage.RemotePath, n: int, **mark: Any) -> None:
    """Version ``n`` as a writer killed in its copy leaves it on object storage: its claim
    made a tombstone (``mark``: more of the tombstone's fields) and part of ``vN/`` copied."""
    owner = {"host": "elsewhere", "pid": 1, "time": 0.0, "abandoned": time.time(), **mark}
    (root / ".claims" / f"v{n}").write_text(json.dumps(owner))
    (root / f"v{n}" / "model" / "a.bin").write_bytes(b"half of a copy")


def test_a_tombstone_whose_removal_was_cut_short_is_cleared_by_the_next_writer(
    s3_bucket: str,
) -> None:
    # the writer that made v1's claim a tombstone was killed before v1/ was removed (seen once
    # in the killed-writers test above: v2 left behind, its tombstone skipped ever after)
    reg, root = _s3_registry(s3_bucket)
    _tombstone_with_leftovers(root, 1)
    assert _publish_one(reg, "a") == 2
    assert not (root / "v1").files()
    held = json.loads((root / ".claims" / "v1").read_text())
    assert held["abandoned"] and held["removed"]
    assert _check(str(root)) == {"a": 2}
    # a tombstone that says its version is gone costs the next writer no listing of vN/
    _tombstone_with_leftovers(root, 3, removed=time.time())
    assert _publish_one(reg, "b") == 4 and (root / "v3" / "model" / "a.bin").exists()


def test_a_writer_whose_claim_became_a_tombstone_removes_what_it_copied(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a writer paused in its copy for longer than a claim lives: another made its claim a
    # tombstone and removed vN/ meanwhile (so no later writer looks at vN/ again); the paused
    # writer's number is never published, it takes the next and leaves nothing under the first
    reg, root = _s3_registry(s3_bucket)
    claim_once = Registry._claim
    calls: list[int] = []

    def claim_then_lose_it(self: Registry) -> Any:
        n, claim, etag = claim_once(self)
        if not calls:
            now = time.time()
            tomb = {**json.loads(claim.read_text()), "abandoned": now, "removed": now}
            claim.write_text(json.dumps(tomb))
        calls.append(n)
        return n, claim, etag

    monkeypatch.setattr(Registry, "_claim", claim_then_lose_it)
    assert _publish_one(reg, "a") == 2 and calls == [1, 2]
    assert not (root / "v1").files()
    assert _check(str(root)) == {"a": 2}
