"""Engines of the pass loop (being filled in: the registry of engine objects)."""

from __future__ import annotations

ENGINES: tuple[str, ...] = ("mapdp", "kmeans")
