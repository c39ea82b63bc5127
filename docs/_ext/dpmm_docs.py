"""The site's own directives: the API reference from ``pipeline.__all__`` and the performance
page's table of ``make bench`` results; and the ``dpmm`` parser as the CLI reference shows it.

``dpmm-api`` writes one section per public name, so that a name added to the registry
(``pipeline.estimators.registry.PUBLIC``) appears in the reference without editing a page.
``dpmm-bench-results`` renders the JSON files ``make bench`` leaves in ``bench-results/`` (or
``$BENCH_OUT``, ``tests/benchmarks/common.py``), or says that there are none.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

ROOT = Path(__file__).resolve().parents[2]


def api_rst() -> list[str]:
    """reStructuredText for every name of ``pipeline.__all__``: a section each, an autodoc
    directive chosen by what the name is (class, function or module)."""
    import pipeline

    lines: list[str] = []
    for name in pipeline.__all__:
        obj = getattr(pipeline, name)
        lines += [name, "-" * len(name), ""]
        if inspect.ismodule(obj):
            # a module's own names; what it only re-exports is documented where it is defined
            lines += [f".. automodule:: {obj.__name__}", "   :members:", "   :imported-members:"]
        elif inspect.isclass(obj):
            # scikit-learn's get_params / set_params are BaseEstimator's and its metadata
            # routing's set_*_request are made for every class: both documented by scikit-learn
            routing = sorted(n for n in dir(obj) if n.startswith("set_") and n.endswith("_request"))
            lines += [
                f".. autoclass:: pipeline.{name}",
                "   :members:",
                "   :inherited-members: BaseEstimator",
            ]
            if routing:
                lines.append(f"   :exclude-members: {', '.join(routing)}")
        else:
            lines += [f".. autofunction:: pipeline.{name}"]
        lines.append("")
    return lines


class ApiDirective(SphinxDirective):
    """``.. dpmm-api::``: the reference of ``pipeline.__all__``."""

    def run(self) -> list[nodes.Node]:
        node = nodes.section()
        node.document = self.state.document
        source = self.get_source_info()[0]
        content = StringList(api_rst(), source=source)
        nested_parse_with_titles(self.state, content, node)
        return node.children


def bench_dir() -> Path:
    """Where ``make bench`` writes its results (``tests/benchmarks/common.py``'s ``out_dir``,
    which ``make`` runs from the checkout's root)."""
    out = Path(os.environ.get("BENCH_OUT", "bench-results"))
    return out if out.is_absolute() else ROOT / out


def _rows(payload: Any) -> list[dict[str, Any]]:
    """The table a result holds: a list of records, or the ``rows`` / ``row`` of a dict."""
    if isinstance(payload, dict):
        for key in ("rows", "row"):
            if key in payload:
                return _rows(payload[key])
        return [payload]
    if isinstance(payload, list):
        return [r for r in payload if isinstance(r, dict)]
    return []


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value)[:60]
    return str(value)


def bench_tables(where: Path) -> list[tuple[str, list[str], list[list[str]]]]:
    """(result name, columns, rows) of every ``*.json`` result in ``where``, sorted by name."""
    out = []
    for path in sorted(where.glob("*.json")):
        rows = _rows(json.loads(path.read_text()))
        if not rows:
            continue
        columns = list(dict.fromkeys(k for r in rows for k in r))
        out.append((path.stem, columns, [[_cell(r.get(c, "")) for c in columns] for r in rows]))
    return out


class BenchResultsDirective(SphinxDirective):
    """``.. dpmm-bench-results::``: a table per result of the last ``make bench`` here."""

    def run(self) -> list[nodes.Node]:
        where = bench_dir()
        tables = bench_tables(where) if where.is_dir() else []
        if not tables:
            para = nodes.paragraph(
                text="No results of make bench in this checkout (bench-results/): the figures "
                "below were measured as each paragraph says, with the command that measures "
                "them again."
            )
            return [para]
        out: list[nodes.Node] = []
        for name, columns, rows in tables:
            table = nodes.table()
            group = nodes.tgroup(cols=len(columns))
            table += group
            group += [nodes.colspec(colwidth=1) for _ in columns]
            head = nodes.thead()
            body = nodes.tbody()
            group += [head, body]
            for target, cells in ((head, columns), *((body, r) for r in rows)):
                row = nodes.row()
                for text in cells:
                    row += nodes.entry("", nodes.paragraph(text=text))
                target += row
            table.insert(0, nodes.title(text=f"{name} ({where.name}/{name}.json)"))
            out.append(table)
        return out


def _literal(text: str | None) -> str | None:
    """``text`` with the characters reStructuredText would read as markup escaped: a help
    string is plain text ("F * |objective|" is no emphasis and no substitution)."""
    return None if text is None else re.sub(r"([*|`\\])", r"\\\1", text)


def cli_parser() -> argparse.ArgumentParser:
    """``flows.cli.app.build_parser()`` with its descriptions and help strings escaped for
    sphinx-argparse, which parses them as reStructuredText (the CLI reference's ``:func:``)."""
    from flows.cli.app import build_parser

    parser = build_parser()
    todo = [parser]
    while todo:
        p = todo.pop()
        p.description = _literal(p.description)
        for action in p._actions:
            action.help = _literal(action.help)
            if isinstance(action, argparse._SubParsersAction):
                todo += list(action.choices.values())
                for choice in action._choices_actions:
                    choice.help = _literal(choice.help)
    return parser


#: a bare name ending in "_" (``labels_``, ``n_seen_``): reStructuredText reads it as a link
#: to a target of that name, which a docstring never means
_TRAILING = re.compile(r"(?<![\\`\w*])([A-Za-z][\w.]*)_(?![\w`*])")


def escape_trailing_underscores(
    app: Sphinx, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    """Escape the underscore of every bare ``name_`` outside literals in a docstring, once
    numpydoc has turned it into reStructuredText (``autodoc-process-docstring``)."""
    for i, line in enumerate(lines):
        if line.lstrip().startswith(".."):
            continue  # a directive or comment: its arguments are names, not prose
        parts = line.split("``")
        # even parts are outside ``literals``
        parts[::2] = [_TRAILING.sub(r"\1\\_", part) for part in parts[::2]]
        lines[i] = "``".join(parts)


#: the page generated from the command line's parser, whose source does not change when it does
CLI_PAGE = "reference/cli"


def cli_page_outdated(
    app: Sphinx, env: object, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    """The CLI reference, read again on every build (``env-get-outdated``): Sphinx sees no
    change of its page when an option is added, and an incremental build kept the old one."""
    return [CLI_PAGE]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("env-get-outdated", cli_page_outdated)
    app.add_directive("dpmm-api", ApiDirective)
    app.add_directive("dpmm-bench-results", BenchResultsDirective)
    # after numpydoc's own handler (priority 500), on the reStructuredText it made
    app.connect("autodoc-process-docstring", escape_trailing_underscores, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
