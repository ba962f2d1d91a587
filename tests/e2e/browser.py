"""Debian's chromium, headless, driven over the DevTools protocol by Playwright: the Airflow UI as a person uses it.

Playwright only drives: it never downloads a browser here (`executable_path` is the system chromium).
Every request the page makes to a host other than loopback is aborted, and chromium's own background
traffic (component updates, safe browsing, metrics) is switched off, so the test stays on 127.0.0.1.

Screenshots go to the test's tmp dir and are copied to var/artefacts/browser/ for a person to look at.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTEFACTS = ROOT / "var" / "artefacts" / "browser"
CHROMIUM_FLAGS = [
    "--no-sandbox",  # CI runs as root, where chromium's sandbox refuses to start
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
    "--safebrowsing-disable-auto-update",
]


def chromium_path() -> str:
    """The system chromium (`apt-get install chromium`; .ci/run installs it). Absent: fail in CI, else skip."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed: .ci/run installs it with apt-get (Debian package `chromium`)")
    pytest.skip("chromium is not installed (apt-get install chromium)")


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _only_loopback(route: Any) -> None:
    url = route.request.url
    if url.startswith(("data:", "blob:", "about:")) or is_loopback(url):
        route.continue_()
    else:
        route.abort("blockedbyclient")


class Browser:
    """One page of a headless chromium, plus where its screenshots go."""

    def __init__(self, page: Any, shots: Path, artefacts: Path = ARTEFACTS) -> None:
        self.page = page
        self.shots = shots
        self.artefacts = artefacts
        self.saved: list[Path] = []

    def screenshot(self, name: str) -> Path:
        """A full-page PNG in the tmp dir, copied to the session's artefact dir (same name)."""
        path = self.shots / f"{len(self.saved) + 1:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.artefacts.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, self.artefacts / path.name)
        self.saved.append(path)
        return path


@contextmanager
def chromium(shots: Path, artefacts: str = "") -> Iterator[Browser]:
    """A headless chromium page (1400x1000) whose traffic cannot leave 127.0.0.1.

    `artefacts`: a folder of var/artefacts/browser/ for this session's screenshots (one per test that wants its own,
    so a later browser test does not wipe them); none: var/artefacts/browser/ itself."""
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    shots.mkdir(parents=True, exist_ok=True)
    folder = ARTEFACTS / artefacts if artefacts else ARTEFACTS
    for old in folder.glob("*.png"):  # the folder shows the latest session only
        old.unlink()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.route("**/*", _only_loopback)
            # An action's wait, not a verdict (each test's verdicts are facts read after it): in CI, with a second
            # suite beside it, a click on the DAG page's Trigger button was dispatched and not taken within 60 s
            # (chromium's renderer starved while the page rendered its grid). Twice that; a broken page still fails.
            context.set_default_timeout(120_000)
            yield Browser(context.new_page(), shots, folder)
        finally:
            browser.close()
