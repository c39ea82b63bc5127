"""The one page layout of every report (``dpmm run``/``demo``, ``longitudinal``, ``hmm``, ``cv``):
a title, the facts of the run as a two-column table, warning boxes, then sections of paragraphs,
rows of pictures and tables; written as ``report.html`` and ``report.md`` side by side.

The HTML fits a 1280 px window without horizontal scrolling whatever it holds: the body is at
most 1200 px wide, pictures shrink to their box, rows of pictures wrap, table cells break long
words, and a table that still does not fit scrolls inside its own box rather than the page.
Numbers are rounded for reading (``fmt``); run.json keeps them in full.
"""

from __future__ import annotations

import html
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# shown for a missing number
NONE = "\u2013"

CSS = """
*{box-sizing:border-box}
html{overflow-x:hidden}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;line-height:1.4;
  max-width:1200px;margin:0 auto;padding:1em 1.5em 3em;overflow-wrap:anywhere}
h1{font-size:1.6em;margin:.3em 0 .6em}
h2{font-size:1.25em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd;padding-bottom:.2em}
p{margin:.4em 0 .8em;max-width:60em}
.note{color:#555;font-size:.92em}
table{border-collapse:collapse;font-size:.9em;margin:.3em 0 1em}
td,th{border:1px solid #d4d4d4;padding:3px 8px;text-align:left;vertical-align:top;
  overflow-wrap:anywhere}
th{background:#f3f3f3;overflow-wrap:normal}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.facts td:first-child{font-weight:600;background:#fafafa;white-space:nowrap}
.scroll{max-width:100%;overflow-x:auto}
.row{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start;margin:.5em 0 1em}
figure{margin:0;flex:1 1 340px;min-width:0;max-width:100%}
figure.wide{flex-basis:100%}
figure img{display:block;max-width:100%;height:auto}
figcaption{font-size:.85em;color:#555;margin-top:.2em}
.warn{border:2px solid #d9822b;background:#fff6ea;padding:.6em 1em;margin:.8em 0;border-radius:4px}
.warn b{color:#a44c00}
details{margin:.3em 0 1em}
summary{cursor:pointer;color:#245;margin-bottom:.3em}
""".strip()


def new_figure(width: float, height: float) -> Any:
    """A matplotlib figure of ``width`` x ``height`` inches on the Agg canvas, without pyplot
    (slower to import than a picture is to draw, and keeping global figures)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def fmt(value: Any, digits: int = 4) -> str:
    """A number rounded for reading: ``digits`` significant digits (-17.18765 -> "-17.19"),
    thousands separated and no exponent from 1,000 up (328123.7 -> "328,124"), an exponent below
    0.001; integers in full with separators; None and NaN as a dash; anything else as text."""
    if value is None:
        return NONE
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isnan(v):
            return NONE
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) < 1e-3:
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}g}"
    return str(value)


@dataclass
class Picture:
    """A picture file of the output directory, its caption, and whether it takes the page's
    whole width (else it shares a row with its neighbours)."""

    src: str
    caption: str = ""
    wide: bool = False


@dataclass
class Table:
    """A table; floats are rounded by ``fmt``, numbers right-aligned. A ``folded`` table shows
    its caption only until it is opened."""

    frame: pd.DataFrame
    caption: str = ""
    folded: bool = False


@dataclass
class Section:
    """A heading and its blocks, in order: text (a paragraph), a list of pictures (one row), a
    ``Table``."""

    title: str
    blocks: list[Any] = field(default_factory=list)

    def text(self, *paragraphs: str) -> Section:
        self.blocks.extend(p for p in paragraphs if p)
        return self

    def pictures(self, *pictures: Picture) -> Section:
        if pictures:
            self.blocks.append(list(pictures))
        return self

    def table(self, frame: pd.DataFrame, caption: str = "", folded: bool = False) -> Section:
        self.blocks.append(Table(frame, caption, folded))
        return self


@dataclass
class Page:
    """A report: ``write`` puts it into ``report.html`` and ``report.md``."""

    title: str
    facts: list[tuple[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)

    def section(self, title: str) -> Section:
        """A new section at the end of the page."""
        s = Section(title)
        self.sections.append(s)
        return s

    def pictures(self) -> list[str]:
        """Every picture the page names, in order."""
        return [p.src for s in self.sections for b in s.blocks if isinstance(b, list) for p in b]

    def write(self, out: Path) -> list[str]:
        """``report.html`` and ``report.md`` in ``out``; their names."""
        (out / "report.html").write_text(self.html())
        (out / "report.md").write_text(self.markdown())
        return ["report.html", "report.md"]

    def html(self) -> str:
        e = html.escape
        body = [f"<h1>{e(self.title)}</h1>"]
        body += [f'<div class="warn"><b>Warning:</b> {e(w)}</div>' for w in self.warnings]
        if self.facts:
            rows = "".join(f"<tr><td>{e(k)}</td><td>{e(_text(v))}</td></tr>" for k, v in self.facts)
            body.append(f'<table class="facts">{rows}</table>')
        for s in self.sections:
            body.append(f"<h2>{e(s.title)}</h2>")
            for b in s.blocks:
                if isinstance(b, str):
                    body.append(f"<p>{e(b)}</p>")
                elif isinstance(b, Table):
                    body.append(_html_table(b))
                else:
                    body.append('<div class="row">' + "".join(map(_html_figure, b)) + "</div>")
        return (
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{e(self.title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body)
            + "\n</body></html>\n"
        )

    def markdown(self) -> str:
        md = [f"# {self.title}", ""]
        md += [f"> **Warning:** {w}\n" for w in self.warnings]
        md += [f"- **{k}**: {_text(v)}" for k, v in self.facts]
        for s in self.sections:
            md += ["", f"## {s.title}", ""]
            for b in s.blocks:
                if isinstance(b, str):
                    md += [b, ""]
                elif isinstance(b, Table):
                    md += ([b.caption, ""] if b.caption else []) + [_md_table(b.frame), ""]
                else:
                    md += [f"![{p.caption or p.src}]({p.src})" for p in b] + [""]
        return "\n".join(md).rstrip() + "\n"


def _text(v: Any) -> str:
    return fmt(v) if not isinstance(v, str) else v


def _cells(frame: pd.DataFrame) -> Iterable[list[tuple[str, bool]]]:
    """Each row's cells as (text, numeric)."""
    numeric = [pd.api.types.is_numeric_dtype(t) for t in frame.dtypes]
    for row in frame.itertuples(index=False):
        yield [(_text(v), num) for v, num in zip(row, numeric, strict=True)]


def _html_table(t: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(c))}</th>" for c in t.frame.columns)
    rows = "".join(
        "<tr>"
        + "".join(f'<td class="num">{e(v)}</td>' if n else f"<td>{e(v)}</td>" for v, n in cells)
        + "</tr>"
        for cells in _cells(t.frame)
    )
    if t.folded:
        table = f"<table><thead><tr>{head}</tr></thead>{rows}</table>"
        summary = e(t.caption or f"table of {len(t.frame)} rows")
        return f'<details><summary>{summary}</summary><div class="scroll">{table}</div></details>'
    cap = f"<caption>{e(t.caption)}</caption>" if t.caption else ""
    return f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead>{rows}</table></div>'


def _html_figure(p: Picture) -> str:
    e = html.escape
    cls = ' class="wide"' if p.wide else ""
    cap = f"<figcaption>{e(p.caption)}</figcaption>" if p.caption else ""
    return f'<figure{cls}><img src="{e(p.src)}" alt="{e(p.caption or p.src)}">{cap}</figure>'


def _md_table(frame: pd.DataFrame) -> str:
    def cell(v: str) -> str:
        return v.replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(str(c)) for c in frame.columns) + " |",
        "|"
        + "|".join("---:" if pd.api.types.is_numeric_dtype(t) else "---" for t in frame.dtypes)
        + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v, _ in cells) + " |" for cells in _cells(frame)]
    return "\n".join(lines)


_preload: threading.Thread | None = None


def _warm_matplotlib() -> None:
    import io

    try:
        fig = new_figure(1, 1)
        fig.text(0.5, 0.5, "0")
        fig.savefig(io.BytesIO(), format="png", dpi=10)
    except Exception:  # a warm-up only: the report draws (and fails) for real
        pass


def preload() -> None:
    """Import matplotlib and load its fonts in a background thread when the run starts, so that
    the report does not wait for them; ``write_report`` waits for it before drawing."""
    global _preload
    if _preload is None:
        _preload = threading.Thread(target=_warm_matplotlib, name="dpmm-report-preload")
        _preload.daemon = True
        _preload.start()


def await_preload() -> None:
    if _preload is not None:
        _preload.join()


def new_axes(height: float) -> tuple[Any, Any]:
    # fixed margins instead of tight_layout, which draws each figure twice
    fig = new_figure(5, height)
    fig.subplots_adjust(left=0.17, right=0.96, bottom=0.15, top=0.9)
    return fig, fig.add_subplot()


def draw_bars(
    ax: Any,
    at: Any,
    length: Any,
    start: Any = 0.0,
    color: Any = "tab:blue",
    width: float = 0.8,
    horizontal: bool = False,
) -> Any:
    """Bars as one collection: ``Axes.bar`` makes an artist per bar, whose drawing costs more
    than everything else in a picture of a hundred clusters."""
    from matplotlib.collections import PolyCollection

    at = np.asarray(at, dtype=np.float64)
    lo = np.broadcast_to(np.asarray(start, dtype=np.float64), at.shape)
    hi = lo + np.asarray(length, dtype=np.float64)
    a, b = at - width / 2, at + width / 2
    corners = np.stack([np.stack(p, axis=-1) for p in ((lo, a), (hi, a), (hi, b), (lo, b))], 1)
    if not horizontal:
        corners = corners[..., ::-1]
    bars = PolyCollection(list(corners), facecolors=color, edgecolors="none")
    ax.add_collection(bars)
    ax.autoscale_view()
    return bars


def plain_log_axis(axis: Any) -> None:
    """Tick labels of a log axis as plain numbers: the default's mathtext costs a parse."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def short_name(name: str, n: int = 18) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"
