"""The built site (``make docs``, which ``make test`` runs before these tests): every page it
should have is there, every internal link and picture resolves, the references list what the
code has, and every page fits a 1280 px window in headless Chromium (``tests/browser.py``).

Without a built site the tests are skipped with the reason (``make docs`` builds it), except
under CI (``CI=true``), where ``make test`` has built it and a missing site fails them.
"""

from __future__ import annotations

import argparse
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.browser import Browser, check_page

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "docs" / "_build" / "html"
#: Sphinx's own folders: copies of sources, pictures, scripts and styles, not pages
NOT_PAGES = {"_static", "_sources", "_images", "_downloads", "_modules"}
#: pages the site must have (the docs' own and the generated ones)
EXPECTED = [
    "index.html",
    "getting-started.html",
    "auto_tutorials/index.html",
    "how-to/index.html",
    "how-to/scoring.html",
    "how-to/scheduled-refit.html",
    "how-to/object-storage.html",
    "how-to/dask-cluster.html",
    "how-to/kubernetes.html",
    "how-to/hpc.html",
    "how-to/gpus.html",
    "how-to/faults.html",
    "usage.html",
    "reference/api.html",
    "reference/cli.html",
    "architecture.html",
    "models-and-papers.html",
    "families.html",
    "performance.html",
    "references.html",
]


def site_or_skip() -> Path:
    if (SITE / "index.html").is_file():
        return SITE
    reason = f"no built site at {SITE.relative_to(ROOT)}: run make docs first"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def site_pages(site: Path) -> list[Path]:
    return sorted(
        p
        for p in site.rglob("*.html")
        if not NOT_PAGES & set(p.relative_to(site).parts) and not p.name.startswith(".probe-")
    )


class _Refs(HTMLParser):
    """The ``href`` / ``src`` of a page's links, pictures, scripts and styles, and its ids."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        for name in ("href", "src"):
            value = a.get(name)
            if value is not None and tag in {"a", "img", "link", "script", "source"}:
                self.refs.append((tag, value))


def parse(page: Path) -> _Refs:
    p = _Refs()
    p.feed(page.read_text())
    return p


def broken_refs(site: Path, pages: list[Path]) -> list[str]:
    """Every internal link or picture of ``pages`` (of ``site``) whose file, or anchor in it, is
    missing."""
    ids: dict[Path, set[str]] = {}
    out = []
    for page in pages:
        for tag, ref in parse(page).refs:
            parts = urlsplit(ref)
            if parts.scheme or parts.netloc or ref.startswith(("mailto:", "javascript:")):
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                out.append(f"{page.relative_to(site)}: <{tag}> {ref}: no such file")
                continue
            if parts.fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = parse(target).ids
                if unquote(parts.fragment) not in ids[target]:
                    out.append(f"{page.relative_to(site)}: <{tag}> {ref}: no such anchor")
    return out


def test_the_site_has_every_page() -> None:
    site = site_or_skip()
    missing = [p for p in EXPECTED if not (site / p).is_file()]
    assert missing == []
    tutorials = sorted((ROOT / "docs" / "tutorials").glob("plot_*.py"))
    assert len(tutorials) >= 7
    for script in tutorials:
        page = site / "auto_tutorials" / f"{script.stem}.html"
        assert page.is_file(), page
        # each tutorial ran and drew its figure (sphinx-gallery's pictures of the run)
        assert list((site / "_images").glob(f"sphx_glr_{script.stem}_*.png")), script.name


def test_every_internal_link_and_picture_resolves() -> None:
    site = site_or_skip()
    assert broken_refs(site, site_pages(site)) == []


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "b.html").write_text('<p id="here">b</p>')
    page = tmp_path / "a.html"
    page.write_text(
        '<a href="b.html#here">ok</a><a href="b.html#gone">x</a><img src="no.png">'
        '<a href="https://example.org/x">out</a><a href="#top">top</a><p id="top"></p>'
    )
    assert broken_refs(tmp_path, [page]) == [
        "a.html: <a> b.html#gone: no such anchor",
        "a.html: <img> no.png: no such file",
    ]


def _text(page: Path) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.read_text()))


def test_the_cli_reference_has_every_command_and_option() -> None:
    from flows.cli.app import build_parser

    site = site_or_skip()
    text = _text(site / "reference" / "cli.html")
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(sub.choices) >= 10
    for name, cmd in sub.choices.items():
        assert f"dpmm {name}" in text, name
        for action in cmd._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # -h / --help: every command has it, the reference says so once
            for option in action.option_strings:
                assert option in text, (name, option)


def test_the_api_reference_has_every_public_name() -> None:
    import pipeline

    site = site_or_skip()
    text = (site / "reference" / "api.html").read_text()
    for name in pipeline.__all__:
        assert f'id="{name.lower().replace("_", "-")}"' in text or f"pipeline.{name}" in text, name
    # the numpydoc sections of an estimator, rendered
    assert "pipeline.MAPDP.fit" in text and "Parameters" in text


def test_every_page_fits_1280_px_in_chromium(browser: Browser) -> None:
    site = site_or_skip()
    for page in site_pages(site):
        check_page(page, browser)


def test_the_width_check_sees_a_page_too_wide(tmp_path: Path, browser: Browser) -> None:
    page = tmp_path / "wide.html"
    page.write_text('<html><body><div style="width: 2000px">wide</div></body></html>')
    with pytest.raises(AssertionError, match="px wide in a 1280 px window"):
        check_page(page, browser)
    assert [p.name for p in tmp_path.iterdir()] == ["wide.html"]
