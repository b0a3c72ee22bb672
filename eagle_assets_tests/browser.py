"""Debian's headless Chromium (`make browser`) driven through Playwright, as a person uses the
Dagster web UI: it loads a page and clicks a button by its label. Playwright launches the
system's Chromium (no browser of its own is downloaded) with the flags this machine needs: no
sandbox and no GPU as root in a container, no network beyond the local UI.

    with ui_page() as page:
        page.goto(f"{session.url}/asset-groups")
        click_button(page, "Materialize all")     # waits for the UI's "Launched run" toast
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
]
"""What Chromium needs here, whoever drives it."""
PAGE_TIMEOUT_MS = 180_000
"""The UI's JavaScript takes seconds to draw on two cores shared with vLLM."""


def chromium() -> str | None:
    """The system's Chromium, or None where `make browser` could not install it."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def ui_page(viewport: tuple[int, int] = (1600, 1000)) -> Iterator:
    """A page of a fresh headless Chromium; the browser is closed on leaving."""
    from playwright.sync_api import sync_playwright

    path = chromium()
    if path is None:
        raise RuntimeError("no chromium on this machine: `make browser` installs Debian's")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS, chromium_sandbox=False)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def click_button(page, label: str) -> str:
    """Click the button named `label` once the UI has drawn it, and wait for the UI's own
    confirmation that it launched a run; returns the toast's text ("Launched run 1a2b3c4d")."""
    from playwright.sync_api import expect

    # A button's accessible name starts with its icon's label ("materialization Materialize all").
    button = page.get_by_role("button", name=re.compile(rf"(^|\s){re.escape(label)}$"))
    # The button is drawn before the asset data it acts on has loaded, and enabled after (React
    # may draw it anew meanwhile: the locator, unlike an element handle, finds the new one).
    expect(button).to_be_enabled(timeout=PAGE_TIMEOUT_MS)
    button.click()
    toast = page.get_by_text("Launched run")
    toast.wait_for(state="visible")
    return toast.inner_text()
