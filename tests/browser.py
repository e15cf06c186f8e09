"""Headless Chromium for the tests: Debian's ``chromium`` driven by Playwright (no download).

``.ci/run`` installs the ``chromium`` package; tests that need it skip, saying
so, where it is missing.  Pages are served on loopback only, and Chromium
runs with the flags that keep it from reaching out (background networking,
component updates, sync).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    """The system's Chromium, or a skip that says how to get it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(
            "headless Chromium is not installed (Debian: apt-get install chromium; "
            ".ci/run installs it when run as root)"
        )
    return found


@contextlib.contextmanager
def browser_page(width: int = 1600, height: int = 1000) -> Iterator[Any]:
    """A fresh headless Chromium page (a Playwright ``Page``)."""
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=FLAGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[str]:
    """``directory`` over HTTP on loopback, a free port; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


#: Set to a folder to keep the browser tests' screenshots there (they also go to pytest's tmp_path).
SCREENSHOT_DIR_VARIABLE = "TFGB_SCREENSHOT_DIR"


def keep(png: Path) -> Path:
    """Copy a screenshot to ``$TFGB_SCREENSHOT_DIR`` when it is set; returns ``png``."""
    folder = os.environ.get(SCREENSHOT_DIR_VARIABLE)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(folder) / png.name)
    return png


def colored_share(png: Path, box: tuple[int, int, int, int]) -> float:
    """Share of the pixels in ``box`` (left, top, right, bottom) that are in colour.

    The trace viewers draw slices in saturated colours on white and grey; text
    and grid lines are grey, so colour means slices were drawn.
    """
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("RGB").crop(box), dtype=np.int16)
    spread = pixels.max(axis=2) - pixels.min(axis=2)
    return float((spread > 60).mean()) if spread.size else 0.0
