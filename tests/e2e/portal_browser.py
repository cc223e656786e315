"""The portal's browser tests' shared parts: Debian's Chromium under
Playwright, a login through the form with the keyboard only, screenshots."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from bench.live_platform import Platform

ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "portal"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextmanager
def chromium() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)",
                    pytrace=False)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@contextmanager
def logged_in(browser: Browser, platform: Platform, username: str,
              password: str) -> Iterator[Page]:
    """A fresh browser context (its own cookies), logged in through the form
    with the keyboard only."""
    context = browser.new_context(base_url=platform.url, viewport={"width": 1280,
                                                                  "height": 900},
                                  accept_downloads=True)
    opened = context.new_page()
    opened.goto("/jobs")
    expect(opened).to_have_url(re.compile(r"/login\?next=/jobs$"))
    shot(opened, "login")
    opened.get_by_label("User name").focus()
    opened.keyboard.type(username)
    opened.keyboard.press("Tab")
    opened.keyboard.type(password)
    opened.keyboard.press("Enter")
    expect(opened).to_have_url(re.compile(r"/jobs$"))
    expect(opened.locator("#who")).to_have_text(username)
    try:
        yield opened
    finally:
        context.close()


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
