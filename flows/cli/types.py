"""argparse value types shared by the ``dpmm`` subcommands: each turns text into a value checked
by ``pipeline.core.config`` (one message per parameter, written once) or raises
``ArgumentTypeError`` with the text, which argparse reports as a one-line usage error."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pipeline.core import config


def _checked(cast: Callable[[str], Any], check: Callable[[Any], Any], what: str) -> Callable:
    def parse(text: str):  # type: ignore[no-untyped-def]
        try:
            return check(cast(text))
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None

    return parse


positive_int = _checked(int, lambda v: config.check_int(v, "N", 1), "a positive integer")
nonneg_int = _checked(int, lambda v: config.check_int(v, "N", 0), "a non-negative integer")
fraction = _checked(float, lambda v: config.check_fraction(v, "F"), "a fraction in [0, 1)")
nonneg_float = _checked(float, config.check_tol, "a non-negative number")
positive_float = _checked(float, lambda v: config.check_positive(v, "F"), "a positive number")


def prior_scale(text: str) -> float:
    """A prior scale in (0, 1) (``pipeline.families.gaussian.check_scale``)."""
    from pipeline.core.config import check_scale

    return float(_checked(float, check_scale, "a number in (0, 1)")(text))


def shrink(text: str) -> float | str:
    """'auto' or a number above 1 (``pipeline.models.mixed_effects_start.check_shrink``)."""
    from pipeline.models.mixed_effects_start import check_shrink

    try:
        return check_shrink(text)  # it reads a number's text itself
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number > 1, got {text!r}") from None


def alpha(text: str) -> float | str:
    """A positive finite concentration, or 'learn' (``pipeline.core.config.check_alpha``)."""
    value: float | str = text
    if text != "learn":
        try:
            value = float(text)
        except ValueError:
            pass
    try:
        config.check_alpha(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive number or 'learn', got {text!r}"
        ) from None
    return value


def family(text: str) -> str | dict[str, str]:
    """A family name, or COL=KIND,COL=KIND overrides."""
    text = text.strip()
    if "=" not in text:
        if not text or "," in text:
            raise argparse.ArgumentTypeError(
                f"expected a family name or COL=KIND,COL=KIND, got {text!r}"
            )
        return text
    out: dict[str, str] = {}
    for part in text.split(","):
        col, sep, kind = part.partition("=")
        if not sep or not col.strip() or not kind.strip():
            raise argparse.ArgumentTypeError(
                f"expected COL=KIND,COL=KIND, got {text!r} (bad part {part!r})"
            )
        out[col.strip()] = kind.strip()
    return out
