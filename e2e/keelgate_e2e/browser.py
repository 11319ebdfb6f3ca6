"""A real browser for the decision inbox's tests: headless Chromium driven through Selenium.

Why it exists: the inbox is for people in a browser, so its tests click in one. The browser is
found like the other programs: KEELGATE_CHROMIUM (the browser) and CHROMEDRIVER (its driver), else
`chromium` / `chromedriver` on PATH (Debian's `chromium` and `chromium-driver`, which `make test`'s
prerequisite step, keelgate_e2e.prereqs, installs before any test starts). It must never download
a browser or a driver itself.

It also starts `kubectl keelgate ui` as a user runs it, and reads the address it prints.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VENV_BIN = Path(sys.executable).parent
_URL = re.compile(r"(http://127\.0\.0\.1:\d+/\?token=[\w-]+)")


#: What to run when Chromium or its driver is missing (keelgate_e2e.prereqs says it too).
BROWSER_HELP = (
    "install Chromium and its chromedriver (Debian, as root: `apt-get install chromium "
    "chromium-driver`, which `make test` runs itself where it can), or set "
    "KEELGATE_CHROMIUM=/path/to/chromium and CHROMEDRIVER=/path/to/chromedriver"
)


class NoBrowser(RuntimeError):
    """Chromium or its driver cannot be found."""


def find_browser() -> tuple[str, str]:
    """(browser, driver) paths: the variables first, then PATH."""
    browser = os.environ.get("KEELGATE_CHROMIUM") or next(
        (p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))),
        "",
    )
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or ""
    if not browser or not driver:
        raise NoBrowser(f"the inbox tests need Chromium and its driver: {BROWSER_HELP}")
    return browser, driver


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A headless Chromium under Selenium, closed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = find_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",  # as root, the sandbox cannot start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
    ):
        options.add_argument(flag)
    session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield session
    finally:
        session.quit()


@dataclass
class InboxProcess:
    """`kubectl keelgate ui` running as a user, and the address it printed."""

    process: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)

    @property
    def origin(self) -> str:
        return self.url.split("/?", 1)[0]

    def stop(self) -> int:
        """Ctrl-C, as a person stops it; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def start_inbox(
    kubectl: Path, kubeconfig: Path, context: str, namespace: str, *extra: str
) -> InboxProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KEELGATE_STORE")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["KUBECONFIG"] = str(kubeconfig)
    cmd = [str(kubectl), "keelgate", "ui", "--port", "0", "--context", context, "-n", namespace]
    process = subprocess.Popen(
        [*cmd, *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            match = _URL.search(line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(60) or not found:
        process.kill()
        raise AssertionError(f"kubectl keelgate ui printed no address: {lines}")
    return InboxProcess(process, found[0], lines)
