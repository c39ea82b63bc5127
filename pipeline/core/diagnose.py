"""The rules that judge a run, each written once for the in-memory fits and the distributed
engines: when it stops (``stop_reason``), and when its fit looks degenerate (every record in one
cluster, or more clusters than one per ``RECORDS_PER_CLUSTER`` records: ``degenerate_fit``, which
names the parameter to change, for the reports and the estimators; ``sequence_fit`` for the
HMMs, whose tempering can merge a trending series into one state); and when held-out evidence
is enough to leave a default (``clearly_better``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def clearly_better(diff: Any) -> bool:
    """Whether paired held-out differences ``diff`` (n,) (a candidate's score minus the
    default's, per fold or per held-out unit; non-finite ones left out) favour the candidate by
    more than their standard error; False with fewer than 2 (no spread measured: no evidence to
    move on). ``GridSearch(select="given")`` and ``shrink="auto"`` of the mixed-effects model."""
    d = np.asarray(diff, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return False
    return bool(d.mean() > d.std(ddof=1) / math.sqrt(d.size))


def stop_reason(
    e_old: float, e_new: float, changed: float, tol: float, max_changed: float = 0.0
) -> str | None:
    """Why a run stops after a pass or iteration (None: it goes on).

    Parameters
    ----------
    e_old, e_new : float
        The objective before and after (an infinite ``e_old``, before the first, never stops).
    changed : float
        Records (or time steps) whose cluster changed.
    tol : float
        Relative decrease of the objective below which the run has stalled.
    max_changed : float, default=0.0
        At most this many changes also stall it (the engines' ``min_change * n_train``).

    Returns
    -------
    str or None
        "changes" when at most ``max_changed`` changed; "objective" when the objective fell by
        at most ``tol * |e_new|`` (or rose); None otherwise.
    """
    if changed <= max_changed:
        return "changes"
    if math.isfinite(e_old) and e_old - e_new <= tol * abs(e_new):
        return "objective"
    return None


class DegenerateFitWarning(UserWarning):
    """A fit that looks degenerate (``degenerate_fit``): one cluster, or too many."""


# a fit with more clusters than n / RECORDS_PER_CLUSTER is called degenerate (over-segmented)
RECORDS_PER_CLUSTER = 10


# what to change, per parameter: (when there is one cluster, when there are too many)
_ADVICE = {
    "alpha": ("raise alpha (--alpha, e.g. 10)", "lower alpha (--alpha, e.g. 0.1)"),
    "prior_scale": (
        "lower prior_scale (--prior-scale, e.g. 0.1)",
        "raise prior_scale (--prior-scale, e.g. 0.5)",
    ),
}
_SCALE_MEANS = "; prior_scale is the share of the data's variance one cluster is expected to carry"


def degenerate_fit(
    n_clusters: int,
    n_records: int,
    unit: str = "records",
    tunable: tuple[str, ...] = ("alpha", "prior_scale"),
) -> str | None:
    """What is wrong with a fit of ``n_clusters`` clusters over ``n_records`` records and which
    parameter to change, as one sentence; None when the fit does not look degenerate.

    One cluster for two records or more: raise ``alpha`` or lower ``prior_scale``; more than
    ``n_records / RECORDS_PER_CLUSTER`` clusters: the reverse. ``unit`` names a record and
    ``tunable`` the parameters the sentence may name.
    """
    k, n = int(n_clusters), int(n_records)
    if n < 2:
        return None
    if k <= 1:
        what, side = f"one cluster holds all {n:,} {unit}: the fit found no structure", 0
    elif k * RECORDS_PER_CLUSTER > n:
        what = (
            f"{k:,} clusters for {n:,} {unit}, more than one per {RECORDS_PER_CLUSTER}: "
            "the fit is over-segmented"
        )
        side = 1
    else:
        return None
    advice = " or ".join(_ADVICE[p][side] for p in tunable if p in _ADVICE)
    if not advice:
        return f"{what}."
    tail = _SCALE_MEANS if "prior_scale" in tunable else ""
    lead = "If you expect groups, " if side == 0 else ""
    sentence = f"{lead}{advice}{tail}."
    return f"{what}. {sentence[0].upper()}{sentence[1:]}"


def sequence_fit(n_states: int, n_steps: int, temper: float, rho: float | None) -> str | None:
    """``degenerate_fit`` of an HMM of ``n_states`` states over ``n_steps`` time steps fitted
    with emission weight ``temper`` measured from the residual autocorrelation ``rho`` (None or
    NaN: not measured), as one sentence; None when the fit does not look degenerate.

    One state after tempering (``temper`` < 1) is the tempering's doing, not the prior's: the
    records drift within the untempered fit's states, as a series with a trend does, and
    weighed by ``temper`` the drift no longer pays for them. Raising alpha or lowering the prior
    scale does not undo that; modelling the changes or the untempered fit does.
    """
    k, n = int(n_states), int(n_steps)
    if k > 1 or n < 2 or not temper < 1.0:
        return degenerate_fit(k, n, "time steps")
    measured = "" if rho is None or not math.isfinite(rho) else f"autocorrelation {rho:.2f}, "
    return (
        f"one state holds all {n:,} time steps: the records drift within the untempered fit's "
        f"states ({measured}each step's emission weighed {temper:.2g}), as a series with a "
        "trend does, and tempered they merge. A trend is not a state: model the changes (each "
        "sequence's differences, e.g. numpy.diff) or set temper=1 (--temper 1) for the "
        "untempered segments."
    )
