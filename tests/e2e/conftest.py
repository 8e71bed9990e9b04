"""Fixtures for the dashboard's browser tests: `conveyor ui` as a user starts it, and
Debian's Chromium driven by Playwright (never a browser Playwright downloads).

A missing /usr/bin/chromium skips these tests on a developer's machine and fails them in CI
(`CI=true`); scripts/test.sh installs it (`apt-get install -y chromium`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import stop

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """A headless Chromium for the session (one browser; each test opens its own pages)."""
    if not os.access(CHROMIUM, os.X_OK):
        message = f"{CHROMIUM} is missing: apt-get install -y chromium"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def browser_page(chromium: Any, tmp_path: Path) -> Iterator[Any]:
    """A fresh browser context and page; `page.shot(name)` saves a screenshot under the
    test's temp dir (screenshots/NAME.png)."""
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    page.shot = lambda name: page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"the page's script failed: {errors}"


UiStarter = Callable[..., str]


@pytest.fixture
def conveyor_ui(tmp_path: Path) -> Iterator[UiStarter]:
    """`start(*flags, token=…)` runs `conveyor ui --port 0 FLAGS` and returns its address;
    every one started is stopped at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*flags: str, token: str | None = None) -> str:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("CONVEYOR_") or k == "CONVEYOR_HOME"}
        env.setdefault("CONVEYOR_HOME", str(tmp_path / "home"))
        if token is not None:
            env["CONVEYOR_UI_TOKEN"] = token
        proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", "ui", "--port", "0",
                                 *flags], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if "serving" not in line:
            stop(proc)
            raise AssertionError(f"conveyor ui did not start: {line}")
        return line.split("serving ", 1)[1].split(" ", 1)[0]

    yield start
    for proc in started:
        stop(proc)
        if proc.stdout is not None:
            proc.stdout.close()
