"""Debian's Chromium driven by Playwright for the viewer's tests (Playwright downloads
no browser): the flags for WebRTC on loopback, a tab that collects the page's errors,
screenshots as test artifacts."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import TOKEN, WAIT_S
from tests.support.appliance import ROOT

CHROMIUM = Path("/usr/bin/chromium")
# ../shared/TESTBED.md, "WebRTC on loopback"; the profile dir is launch_persistent_context's.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
]
SCREENSHOTS = ROOT / "tests" / "artifacts"  # viewer*.png (gitignored)
UI_WAIT_MS = WAIT_S * 1000


def launch(profile: Path, **options: Any) -> Iterator[Any]:
    """A fresh Chromium profile; skips when Chromium or Playwright is missing."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists() or shutil.which("chromium") is None:
        pytest.skip("chromium is not installed: run sh tests/install_deps.sh")
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            args=CHROMIUM_FLAGS,
            accept_downloads=True,
            **{"viewport": {"width": 1100, "height": 900}, **options},
        )
        try:
            yield context
        finally:
            context.close()


class Page:
    """One tab, with every script error and console error it reports."""

    def __init__(self, context: Any, *, token: bool = False) -> None:
        self.tab = context.new_page()
        self.tab.set_default_timeout(UI_WAIT_MS)
        self.errors: list[str] = []
        self.tab.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.tab.on("console", self._console)
        if token:  # as if typed in before: the tab's session storage holds it
            self.tab.add_init_script(
                f"sessionStorage.setItem('appliance.token', {json.dumps(TOKEN)})"
            )

    def _console(self, message: Any) -> None:
        # Refused API calls (401 before the token, 404 without a watch) and calls to an
        # appliance that is down are logged by Chromium as failed resources: expected.
        # Anything else is a fault of the page.
        text = message.text
        if message.type == "error" and not text.startswith("Failed to load resource"):
            self.errors.append(text)

    def text(self, selector: str) -> str:
        return str(self.tab.locator(selector).inner_text())

    def phase(self) -> str | None:
        """What the large player is doing (#media's data-phase)."""
        value = self.tab.locator("#media").get_attribute("data-phase")
        return None if value is None else str(value)


def screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.tab.screenshot(path=str(SCREENSHOTS / name), full_page=True)
