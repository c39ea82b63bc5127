"""Fixtures of the flow tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One Prefect test server (``prefect_test_harness``: a temporary database and API) for all
    the flow modules of this test process that ask for it (``pytest.mark.usefixtures``), whose
    in-process flows and commands then start no temporary server of their own: a start takes
    about 7 s of the 2-core machine, once per module before. None: the start-up timeout of the
    settings, which ``tests/conftest.py`` raises for a busy machine."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=None):
        yield
