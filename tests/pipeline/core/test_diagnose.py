"""The degenerate-fit rule: one cluster, or more clusters than one per ten records; an HMM
that tempering merged into one state."""

from __future__ import annotations

import pytest

from pipeline.core.diagnose import RECORDS_PER_CLUSTER, degenerate_fit, sequence_fit


@pytest.mark.parametrize(
    ("k", "n", "degenerate"),
    [
        (1, 1000, True),
        (2, 1000, False),
        (100, 1000, False),  # exactly one per ten records
        (101, 1000, True),
        (5, 40, True),
        (1, 1, False),  # one record: one cluster is all there can be
    ],
)
def test_the_rule(k: int, n: int, degenerate: bool) -> None:
    assert (degenerate_fit(k, n) is not None) == degenerate
    assert (degenerate_fit(k, n) is not None) == (
        n >= 2 and (k <= 1 or k * RECORDS_PER_CLUSTER > n)
    )


def test_names_the_parameter_and_its_direction() -> None:
    one = degenerate_fit(1, 500)
    many = degenerate_fit(300, 500)
    assert one is not None and many is not None
    assert "raise alpha (--alpha" in one and "lower prior_scale (--prior-scale" in one
    assert "Lower alpha (--alpha" in many and "raise prior_scale (--prior-scale" in many
    assert "500 records" in one and "300 clusters for 500 records" in many


def test_names_only_the_parameters_the_command_has() -> None:
    msg = degenerate_fit(1, 50, "subjects", tunable=("alpha",))
    assert msg is not None and "subjects" in msg and "alpha" in msg
    assert "prior_scale" not in msg


def test_an_hmm_tempered_into_one_state_names_the_trend() -> None:
    """``sequence_fit``: one state after tempering names the tempering and the changes as the
    cure, not alpha or the prior scale; untempered, or with more states, the rule of
    ``degenerate_fit`` over time steps."""
    msg = sequence_fit(1, 203, 0.039, 0.924)
    assert msg is not None
    assert "203 time steps" in msg and "autocorrelation 0.92" in msg and "weighed 0.039" in msg
    assert "trend" in msg and "numpy.diff" in msg and "temper=1 (--temper 1)" in msg
    assert "alpha" not in msg and "prior_scale" not in msg
    assert "autocorrelation" not in (sequence_fit(1, 203, 0.5, None) or "")
    assert sequence_fit(1, 203, 1.0, None) == degenerate_fit(1, 203, "time steps")
    assert sequence_fit(30, 203, 0.5, 0.3) == degenerate_fit(30, 203, "time steps")
    assert sequence_fit(2, 203, 0.039, 0.924) is None
    assert sequence_fit(1, 1, 0.5, 0.3) is None
