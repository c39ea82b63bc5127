"""A report page as a user's browser shows it: headless Chromium, a 1280 px wide window.

``Browser`` is one headless Chromium that the tests of a process share (the ``browser``
fixture), driven over its DevTools protocol: ``check_page`` opens a copy of the page in a new
tab (same directory, so that its pictures resolve) with a small script added that, once the page
has loaded, measures the document's width against the window's and lists the pictures that did
not load. A browser per page cost about a second of CPU per page on start-up alone, and the
site has some thirty pages. ``chromium_or_skip`` finds the browser; without one the test is
skipped with the reason, except under CI (``CI=true``: ``.ci/run`` installs Debian's
``chromium``), where a missing browser fails it.
"""

from __future__ import annotations

import contextlib
import html
import itertools
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

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


class Browser:
    """One headless Chromium with a ``WIDTH`` x 1000 px window, its profile in ``profile_dir``,
    driven over the DevTools protocol (a WebSocket on 127.0.0.1); ``close`` ends it. Its
    messages go to ``chromium.log`` there."""

    def __init__(self, executable: str, profile_dir: Path, timeout: float = 120) -> None:
        self.timeout = timeout
        profile_dir.mkdir(parents=True, exist_ok=True)
        # the browser writes its DevTools port there once it listens
        port_file = profile_dir / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)
        log = profile_dir / "chromium.log"
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [
                    executable,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--allow-file-access-from-files",
                    f"--user-data-dir={profile_dir}",
                    f"--window-size={WIDTH},1000",
                    "--remote-debugging-address=127.0.0.1",
                    "--remote-debugging-port=0",
                    "about:blank",
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + timeout
        lines: list[str] = []
        while len(lines) < 2 and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            with contextlib.suppress(FileNotFoundError):
                lines = port_file.read_text().splitlines()
        if len(lines) < 2:
            self.close()
            raise AssertionError(
                f"{executable} did not start (exit {self.proc.returncode}): "
                f"{log.read_text()[-2000:]}"
            )
        self.ws = connect(f"ws://127.0.0.1:{lines[0]}{lines[1]}", max_size=None)
        self.ids = itertools.count(1)

    def _call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send a DevTools command (to the tab of ``session``); its result."""
        i = next(self.ids)
        msg: dict[str, Any] = {"id": i, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv(timeout=self.timeout))
            if reply.get("id") == i:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return dict(reply["result"])

    def _await(self, event: str, session: str) -> None:
        while True:
            msg = json.loads(self.ws.recv(timeout=self.timeout))
            if msg.get("method") == event and msg.get("sessionId") == session:
                return

    def render(self, page: Path) -> dict[str, Any]:
        """Open ``page`` in a new tab; what ``PROBE`` measured once it loaded."""
        text = page.read_text()
        assert "</body>" in text, f"{page}: no </body>"
        probe = page.with_name(f".probe-{page.name}")
        probe.write_text(text.replace("</body>", PROBE + "</body>", 1))
        tab = self._call("Target.createTarget", url="about:blank")["targetId"]
        try:
            session = self._call("Target.attachToTarget", targetId=tab, flatten=True)["sessionId"]
            self._call("Page.enable", session)
            self._call("Page.navigate", session, url=probe.resolve().as_uri())
            self._await("Page.loadEventFired", session)
            # the probe's own load handler may run after the event reached us
            deadline = time.monotonic() + self.timeout
            while True:
                got = self._call(
                    "Runtime.evaluate",
                    session,
                    expression="document.getElementById('dpmm-probe')?.textContent ?? null",
                    returnByValue=True,
                )["result"].get("value")
                if got is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            self._call("Target.closeTarget", targetId=tab)
            probe.unlink(missing_ok=True)
        assert got is not None, f"{page}: the browser measured nothing"
        out: dict[str, Any] = json.loads(got)
        return out

    def close(self) -> None:
        if hasattr(self, "ws"):
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def image_sources(page: Path) -> list[str]:
    """The ``src`` of every ``<img>`` of the page's HTML."""
    return [html.unescape(s) for s in re.findall(r'<img[^>]*\ssrc="([^"]+)"', page.read_text())]


def check_page(page: Path, browser: Browser) -> dict[str, Any]:
    """Assert that ``page`` fits a ``WIDTH`` px window without horizontal scrolling and that
    every picture it names exists next to it and loads; returns the measurement."""
    named = image_sources(page)
    missing = [s for s in named if not (page.parent / s).is_file()]
    assert not missing, f"{page.name} names pictures that do not exist: {missing}"
    m = browser.render(page)
    assert m["innerWidth"] == WIDTH, m
    assert m["scrollWidth"] <= m["clientWidth"] <= WIDTH, (
        f"{page}: {m['scrollWidth']} px wide in a {m['clientWidth']} px window"
    )
    assert [i["src"] for i in m["images"]] == named
    broken = [i["src"] for i in m["images"] if not i["loaded"]]
    assert not broken, f"{page.name}: pictures that did not load: {broken}"
    assert all(i["right"] <= m["clientWidth"] for i in m["images"]), m["images"]
    return m
