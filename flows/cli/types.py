"""argparse value types shared by the ``dpmm`` subcommands: each turns text into a checked value
or raises ``ArgumentTypeError`` with the text, which argparse reports as a one-line usage error."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _checked(cast: Callable[[str], float], ok: Callable[[float], bool], what: str) -> Callable:
    def parse(text: str):  # type: ignore[no-untyped-def]
        try:
            v = cast(text)
        except ValueError:
            v = math.nan
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v

    return parse


positive_int = _checked(int, lambda v: v >= 1, "a positive integer")
nonneg_int = _checked(int, lambda v: v >= 0, "a non-negative integer")
fraction = _checked(float, lambda v: 0.0 <= v < 1.0, "a fraction in [0, 1)")
nonneg_float = _checked(float, lambda v: v >= 0.0, "a non-negative number")
_positive_float = _checked(
    float, lambda v: v > 0 and math.isfinite(v), "a positive number or 'learn'"
)


def alpha(text: str) -> float | str:
    """A positive concentration, or 'learn'."""
    return text if text == "learn" else float(_positive_float(text))


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
