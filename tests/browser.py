"""A report page as a user's browser shows it: headless Chromium, a 1280 px wide window.

``render`` opens a copy of the page (same directory, so that its pictures resolve) with a small
script added that, once the page has loaded, measures the document's width against the window's
and lists the pictures that did not load; Chromium's ``--dump-dom`` prints the page with the
measurement in it. ``chromium_or_skip`` finds the browser; without one the test is skipped with
the reason, except under CI (``CI=true``: ``.ci/run`` installs Debian's ``chromium``), where a
missing browser fails it.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

WIDTH = 1280
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# runs at the load event (every picture loaded or failed): the document's width and the
# window's, and each picture's source and whether it loaded
PROBE = """<script>
window.addEventListener("load", () => {
  const d = document.documentElement;
  const out = {
    scrollWidth: d.scrollWidth, clientWidth: d.clientWidth, innerWidth: window.innerWidth,
    bodyScrollWidth: document.body.scrollWidth,
    images: Array.from(document.images).map(i => ({
      src: i.getAttribute("src"), loaded: i.complete && i.naturalWidth > 0,
      width: i.getBoundingClientRect().width, right: i.getBoundingClientRect().right})),
  };
  const pre = document.createElement("pre");
  pre.id = "dpmm-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium_or_skip() -> str:
    """The browser's executable; skips the test without one (fails it under CI)."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    reason = f"no headless browser on PATH (tried {', '.join(BROWSERS)}): apt-get install chromium"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def render(page: Path, browser: str, profile_dir: Path, timeout: float = 120) -> dict[str, Any]:
    """Open ``page`` in headless ``browser`` with a ``WIDTH`` px window; what ``PROBE``
    measured."""
    text = page.read_text()
    assert "</body>" in text, f"{page}: no </body>"
    probe = page.with_name(f".probe-{page.name}")
    probe.write_text(text.replace("</body>", PROBE + "</body>", 1))
    try:
        proc = subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--allow-file-access-from-files",
                f"--user-data-dir={profile_dir}",
                f"--window-size={WIDTH},1000",
                "--virtual-time-budget=20000",
                "--dump-dom",
                probe.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        probe.unlink(missing_ok=True)
    # a page's own scripts may add attributes to the probe (the docs' theme makes every <pre>
    # focusable: tabindex)
    found = re.search(r'<pre id="dpmm-probe"[^>]*>(.*?)</pre>', proc.stdout, re.S)
    assert found, (
        f"{browser} printed no measurement (exit {proc.returncode}): {proc.stderr[-2000:]}"
    )
    out: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return out


def image_sources(page: Path) -> list[str]:
    """The ``src`` of every ``<img>`` of the page's HTML."""
    return [html.unescape(s) for s in re.findall(r'<img[^>]*\ssrc="([^"]+)"', page.read_text())]


def check_page(page: Path, browser: str, profile_dir: Path) -> dict[str, Any]:
    """Assert that ``page`` fits a ``WIDTH`` px window without horizontal scrolling and that
    every picture it names exists next to it and loads; returns the measurement."""
    named = image_sources(page)
    missing = [s for s in named if not (page.parent / s).is_file()]
    assert not missing, f"{page.name} names pictures that do not exist: {missing}"
    m = render(page, browser, profile_dir)
    assert m["innerWidth"] == WIDTH, m
    assert m["scrollWidth"] <= m["clientWidth"] <= WIDTH, (
        f"{page}: {m['scrollWidth']} px wide in a {m['clientWidth']} px window"
    )
    assert [i["src"] for i in m["images"]] == named
    broken = [i["src"] for i in m["images"] if not i["loaded"]]
    assert not broken, f"{page.name}: pictures that did not load: {broken}"
    assert all(i["right"] <= m["clientWidth"] for i in m["images"]), m["images"]
    return m
