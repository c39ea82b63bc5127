"""Fixtures of the flow tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest

from tests import prefect_db

# starts of the test server tried before its error is every test's
HARNESS_STARTS = 3


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One Prefect test server (``prefect_test_harness``: a temporary database and API) for all
    the flow modules of this test process that ask for it (``pytest.mark.usefixtures``), whose
    in-process flows and commands then start no temporary server of their own: a start takes
    about 7 s of the 2-core machine, once per module before. None: the start-up timeout of the
    settings, which ``tests/conftest.py`` raises for a busy machine.

    Prefect's start-up probe of the server's health retries a refused connection but not an
    answer slower than httpx's 5 s, which a server still starting on a busy 2-core machine can
    give: such a start is stopped and the harness started again, ``HARNESS_STARTS`` times at
    most (one failed session fixture is an error in every flow test of its process)."""
    import httpx
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.testing import utilities
    from prefect.testing.utilities import prefect_test_harness

    with contextlib.ExitStack() as stack:
        for start in range(HARNESS_STARTS):
            try:
                # the harness makes its database in a new ``mkdtemp()`` directory: one holding
                # a migrated copy spares its server the migrations (``tests.prefect_db``)
                with mock.patch.object(utilities, "mkdtemp", prefect_db.harness_dir):
                    stack.enter_context(prefect_test_harness(server_startup_timeout=None))
                break
            except httpx.TimeoutException:
                # the harness registers its server before starting it, and leaves it running
                server = SubprocessASGIServer._instances.pop(None, None)
                if server is not None:
                    server.stop()
                if start == HARNESS_STARTS - 1:
                    raise
        yield
