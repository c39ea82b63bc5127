"""Every name the README and docs/ document imports from where the README says: each
``from pipeline... import X`` it shows and each dotted ``pipeline.a.b.X`` it names."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
#: the README and the pages under docs/ (any depth; not the site the build writes there)
BUILT = {"_build", "auto_tutorials"}
PAGES = [
    ROOT / "README.md",
    *(
        p
        for p in sorted((ROOT / "docs").rglob("*.md"))
        if not BUILT & set(p.relative_to(ROOT / "docs").parts)
    ),
]
README = "\n".join(p.read_text() for p in PAGES)

_FROM = re.compile(r"^\s*from (pipeline(?:\.\w+)*) import ([\w, ()]+)", re.MULTILINE)
_DOTTED = re.compile(r"(?<![\w./])pipeline(?:\.\w+)+")


def _documented() -> list[str]:
    names = {
        f"{module}.{name.strip()}"
        for module, imported in _FROM.findall(README)
        for name in imported.strip("()").split(",")
        if name.strip()
    }
    names |= set(_DOTTED.findall(README))
    return sorted(names)


def _resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted``, then look the rest up as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise ModuleNotFoundError(dotted)


def test_the_readme_documents_names_to_check() -> None:
    names = _documented()
    assert {"pipeline.MAPDP", "pipeline.GridSearch", "pipeline.load_model"} <= set(names)
    assert len(names) >= 15


@pytest.mark.parametrize("dotted", _documented())
def test_a_documented_name_imports_from_where_the_readme_says(dotted: str) -> None:
    # a name that moved keeps working from its old place with a DeprecationWarning, which the
    # README should not need: documented places are current ones
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert _resolve(dotted) is not None
