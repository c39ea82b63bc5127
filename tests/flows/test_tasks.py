"""``flows.tasks.run_flow``: flow-run heartbeats off against Prefect's temporary server (their
thread would hold up the end of every run by up to a second), as configured against a
long-lived one."""

from __future__ import annotations

from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    get_current_settings,
    temporary_settings,
)

from flows.tasks import run_flow


def _frequency(**kwargs: object) -> tuple[int | None, dict]:
    return get_current_settings().flows.heartbeat_frequency, kwargs


def test_heartbeats_off_for_the_temporary_server_only() -> None:
    with temporary_settings(updates={PREFECT_API_URL: None, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        assert run_flow(_frequency, a=1) == (None, {"a": 1})
        assert get_current_settings().flows.heartbeat_frequency == 30  # restored after the run
    served = {PREFECT_API_URL: "http://127.0.0.1:4200/api", PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}
    with temporary_settings(updates=served):
        assert run_flow(_frequency) == (30, {})
