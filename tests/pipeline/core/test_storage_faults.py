"""Object storage that fails now and then (``failing_s3``, tests/faults.py, on the ``s3_server``):
a read or write that fails with a 503, a throttling answer or a dropped connection is retried
(one warning naming the object per retry) and succeeds; once ``STORAGE_ATTEMPTS`` are spent it
stops with a ``StorageError`` naming the object."""

from __future__ import annotations

import logging

import pytest

from pipeline.core import storage
from pipeline.core.config import STORAGE_ATTEMPTS
from pipeline.core.errors import StorageError


@pytest.mark.parametrize("kind", ["503", "throttle", "reset"])
@pytest.mark.parametrize("op", ["get", "put"])
def test_a_failed_request_is_retried_and_says_so(
    s3_bucket: str, failing_s3, caplog, kind: str, op: str
) -> None:
    loc = storage.location(f"s3://{s3_bucket}/a/{kind}.bin")
    loc.write_bytes(b"before")
    caplog.set_level(logging.WARNING, logger=storage.__name__)
    with failing_s3(1.0, kinds=(kind,), ops=(op,), match=f"/a/{kind}.bin", limit=2) as faults:
        if op == "put":
            loc.write_bytes(b"after")
        assert loc.read_bytes() == (b"after" if op == "put" else b"before")
    assert faults.total == 2
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    # aiohttp tries a request again once, unsaid, when a kept-alive connection was dropped
    assert len(retries) == 2 or (kind, len(retries)) == ("reset", 1), retries
    assert all(m.startswith(f"s3://{s3_bucket}/a/{kind}.bin: ") for m in retries), retries


def test_spent_retries_stop_with_one_line_naming_the_object(s3_bucket: str, failing_s3) -> None:
    loc = storage.location(f"s3://{s3_bucket}/b/x.bin")
    loc.write_bytes(b"x")
    with failing_s3(1.0, kinds=("503",), ops=("get",), match="/b/x.bin") as faults:
        with pytest.raises(StorageError) as err:
            loc.read_bytes()
    assert faults.total == STORAGE_ATTEMPTS
    msg = str(err.value)
    assert msg.startswith(f"s3://{s3_bucket}/b/x.bin: ") and "\n" not in msg
    assert f"after {STORAGE_ATTEMPTS} attempts" in msg
