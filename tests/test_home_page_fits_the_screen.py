"""The built docs site in a real browser: no code block on the home page or the
Getting started page is clipped, at desktop width or on a phone (issue 30).

A code block whose scrollWidth exceeds its clientWidth hides part of its
lines behind a scroll bar; docs/stylesheets/extra.css wraps them instead.
Chromium comes from Debian's `chromium` package (.ci/run installs it) and is
driven by Playwright; no browser is ever downloaded. Screenshots of each
page at each width land in screenshots/ (git-ignored), for a person to look
at.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
SHOTS = ROOT / "screenshots"
WIDTHS = {"desktop": 1280, "phone": 390}
PAGES = {"home": "", "getting-started": "getting-started/"}
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Every code block whose content is wider than its box, as "index: widths".
CLIPPED = """
() => Array.from(document.querySelectorAll("pre > code, pre")).flatMap((el, i) =>
    el.scrollWidth > el.clientWidth + 1
        ? [`${el.tagName} ${i}: ${el.scrollWidth} > ${el.clientWidth}: `
           + el.textContent.slice(0, 60)]
        : [])
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The mkdocs site, built strictly and served on 127.0.0.1; its base URL."""
    folder = tmp_path_factory.mktemp("site")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(folder)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=300,
    )

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_no_code_block_is_clipped_at_desktop_or_phone_width(site: str) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install -y chromium)")
    SHOTS.mkdir(exist_ok=True)
    clipped: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            for device, width in WIDTHS.items():
                page = browser.new_page(viewport={"width": width, "height": 900})
                for name, path in PAGES.items():
                    page.goto(site + path, wait_until="load")
                    blocks = page.locator("pre > code").count()
                    assert blocks > 0, f"{name}: no code block rendered"
                    page.screenshot(path=str(SHOTS / f"{name}-{device}.png"), full_page=True)
                    clipped += [f"{name} at {width}px: {c}" for c in page.evaluate(CLIPPED)]
                page.close()
        finally:
            browser.close()
    assert not clipped, "\n".join(clipped)
