"""The one prerequisite step of `make test` (and so of CI, whose .ci/run runs `make test`):
before any test starts, find every program the suite runs, and install what may be installed.

Why it exists: a fresh machine once ran lint, types and 1,734 unit tests and 20 minutes of e2e
tests before the browser tests found no chromedriver. The prerequisites a user brings are Python,
Go, kubectl and the PostgreSQL server programs (README.md); everything else `make test` gets
itself. Today that is Chromium and chromedriver, for the decision inbox's browser tests: Debian's
`chromium` and `chromium-driver` (the same source package, so always the same version), installed
with apt-get when the machine has it and we are root. Where it cannot install, or a user's
prerequisite is missing, one line per missing program says what to run, and the step fails in
seconds.

Chromium is driven through chromedriver (Selenium) rather than its DevTools protocol: Chromium
has to be installed either way, and its driver comes from the same package source in the same
command, so dropping it would save no step; a DevTools client would be Playwright (which brings a
Node.js runtime of its own into the venv, one more program, not one fewer) or code of our own.

It must never download anything but Debian packages through apt-get, never install anything for a
browser the user named (KEELGATE_CHROMIUM, CHROMEDRIVER), and never change anything when all is
present: then it only reports what will be used.

Run as `python -m keelgate_e2e.prereqs` (`make prereqs`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from keelgate.testing.pgserver import PostgresUnavailable, find_bin_dir

from keelgate_e2e.browser import BROWSER_HELP, NoBrowser, find_browser
from keelgate_e2e.build import BuildError, find_go
from keelgate_e2e.testing import find_kubectl

#: Debian's packages of Chromium and its driver.
BROWSER_PACKAGES = ("chromium", "chromium-driver")
_VERSION = re.compile(r"\d+(?:\.\d+){2,3}")


class Missing(Exception):
    """A prerequisite is missing; the message is the one line that says what to do."""


@dataclass(frozen=True)
class Found:
    """One prerequisite found: what it is and where (a line of the step's report)."""

    what: str
    where: str


def _version(program: str) -> str:
    """`program --version`'s X.Y.Z, or "" if it gives none."""
    try:
        out = subprocess.run(
            [program, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    match = _VERSION.search(out.stdout + out.stderr)
    return match.group(0) if match else ""


def go() -> Found:
    """Go, which builds the control plane."""
    try:
        return Found("Go", str(find_go()))
    except BuildError as exc:
        raise Missing(f"Go: {exc}") from None


def kubectl() -> Found:
    """kubectl, which the e2e tests run as a user does."""
    try:
        return Found("kubectl", str(find_kubectl()))
    except FileNotFoundError as exc:
        raise Missing(f"kubectl: {exc}") from None


def postgres() -> Found:
    """The PostgreSQL server programs, which the tests start servers of."""
    try:
        return Found("PostgreSQL", str(find_bin_dir()))
    except PostgresUnavailable as exc:
        raise Missing(f"PostgreSQL: {exc}") from None


def can_install() -> str:
    """Why the browser cannot be installed here, or "" when apt-get can install it."""
    if shutil.which("apt-get") is None:
        return "no apt-get here"
    if os.geteuid() != 0:
        return "not root"
    return ""


def install_browser() -> None:
    """`apt-get install chromium chromium-driver`, as .ci/run did; raises Missing on failure."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    packages = " ".join(BROWSER_PACKAGES)
    print(f"prereqs: installing Chromium and chromedriver: apt-get install {packages}", flush=True)
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *BROWSER_PACKAGES],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise Missing(f"Chromium: `{' '.join(cmd)}` failed (exit {done.returncode}): {tail}")


def browser(*, may_install: bool = True) -> Found:
    """Chromium and chromedriver of one major version, installed first when they are missing,
    installable, not named by the user, and `may_install`."""
    what = "Chromium and chromedriver (the decision inbox's browser tests)"
    try:
        paths = find_browser()
    except NoBrowser:
        if os.environ.get("KEELGATE_CHROMIUM") or os.environ.get("CHROMEDRIVER"):
            why = "KEELGATE_CHROMIUM or CHROMEDRIVER is set, so nothing is installed"
        elif not may_install:
            why = "not installed while a prerequisite above is missing"
        else:
            why = can_install()
        if why:
            raise Missing(f"{what}, not installed here ({why}): {BROWSER_HELP}") from None
        install_browser()
        try:
            paths = find_browser()
        except NoBrowser:
            raise Missing(f"{what}, installed but not on PATH: {BROWSER_HELP}") from None
    versions = [_version(p) for p in paths]
    for path, version in zip(paths, versions, strict=True):
        if not version:
            raise Missing(f"{what}: `{path} --version` tells no version: {BROWSER_HELP}")
    if len({v.split(".")[0] for v in versions}) != 1:
        raise Missing(
            f"{what} of one major version, not Chromium {versions[0]} ({paths[0]}) and "
            f"chromedriver {versions[1]} ({paths[1]}): {BROWSER_HELP}"
        )
    return Found("Chromium and chromedriver", f"{versions[0]}, {paths[0]} and {paths[1]}")


#: What the user brings (README.md), checked first: while one is missing nothing is installed.
USERS: tuple[Callable[[], Found], ...] = (go, kubectl, postgres)


def main(argv: Sequence[str] | None = None) -> int:
    """Check (and install) every prerequisite; one line each; exit 1 if any is missing."""
    parser = argparse.ArgumentParser(prog="python -m keelgate_e2e.prereqs", description=__doc__)
    parser.parse_args(argv)
    missing: list[str] = []
    checks: list[Callable[[], Found]] = [*USERS, lambda: browser(may_install=not missing)]
    for check in checks:
        try:
            found = check()
        except Missing as exc:
            missing.append(str(exc))
        else:
            print(f"prereqs: {found.what}: {found.where}", flush=True)
    for line in missing:
        print(f"make test needs {line}", file=sys.stderr, flush=True)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
