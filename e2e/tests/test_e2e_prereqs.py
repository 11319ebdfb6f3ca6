"""`make test`'s prerequisite step (`make prereqs`, keelgate_e2e.prereqs) on a machine without
Chromium or chromedriver: as root with apt-get it installs Debian's packages, and the browser then
draws a page through its driver; where it cannot install (not root, or no apt-get), `make test`
stops within seconds, before any check or test has started, with one line saying what to run.

The machine without them is this one, copy-on-write: in a private mount namespace (unshare),
overlays lie over /usr, /etc, /var and /root, and there the packages are really purged and really
installed again, by the real apt-get and dpkg from the real Debian archive. Only the packages go:
the libraries they pulled in stay (purging those too could take away libraries this machine's own
Python was built against). The machine's own packages are checked unchanged afterwards.

It needs root, unshare, overlayfs and apt-get (as CI has); elsewhere it skips, saying why. It
must never change the machine's own packages: every write lands under the test's tmp_path.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Where the overlays lie: every directory dpkg writes to, and /root (so another user may use
#: this venv's Python, which lives under it, in the overlay only).
OVERLAID = ("usr", "etc", "var", "root")
BROWSER_PACKAGES = ("chromium", "chromium-driver", "chromium-common")
#: `make` as the suite runs it: this venv's Python, and the venv taken as up to date (the step is
#: under test, not pip).
MAKE = f"make --no-print-directory -o .venv/.installed-stamp PY={shlex.quote(sys.executable)}"
DRAW = (
    "from keelgate_e2e.browser import chromium\n"
    "with chromium() as page:\n"
    "    page.get('data:text/html,<p id=said>drawn by Chromium</p>')\n"
    "    print(page.find_element('id', 'said').text)\n"
)


def _host_packages() -> str:
    """The machine's own state of the browser packages (dpkg's view)."""
    return subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Status} ${Version}\n", *BROWSER_PACKAGES],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


@dataclass(frozen=True)
class Machine:
    """This machine seen through overlays kept in `layers`: commands run here write only there."""

    layers: Path

    def run(self, script: str, *, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run the shell `script` inside; on a timeout, its whole process group is killed."""
        mounts = []
        for name in OVERLAID:
            upper, work = self.layers / "upper" / name, self.layers / "work" / name
            upper.mkdir(parents=True, exist_ok=True)
            work.mkdir(parents=True, exist_ok=True)
            options = f"lowerdir=/{name},upperdir={upper},workdir={work}"
            mounts.append(f"mount -t overlay overlay -o {options} /{name} || exit 97")
        setup = "\n".join([*mounts, "chmod 755 /root || exit 97"])
        env = {
            k: v for k, v in os.environ.items() if k not in ("KEELGATE_CHROMIUM", "CHROMEDRIVER")
        }
        process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{setup}\n{script}"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            raise AssertionError(f"still running after {timeout:.0f}s:\n{out}{err}") from None
        assert process.returncode != 97, f"the overlays could not be laid:\n{err}"
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.fixture
def bare_machine(tmp_path: Path) -> Iterator[Machine]:
    """This machine with no Chromium and no chromedriver (purged in the overlay if installed)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (to lay overlays in a mount namespace)")
    for program in ("unshare", "apt-get", "dpkg-query", "runuser"):
        if shutil.which(program) is None:
            pytest.skip(f"needs {program}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        pytest.skip("needs overlayfs")
    before = _host_packages()
    machine = Machine(tmp_path / "layers")
    purge = machine.run(
        "installed=$(dpkg-query -W -f='${Package} ${Status}\\n' "
        + " ".join(BROWSER_PACKAGES)
        + " 2>/dev/null | awk '/ installed$/ {print $1}')\n"
        '[ -z "$installed" ] || DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $installed '
        ">/dev/null || exit 1\n"
        "! command -v chromium && ! command -v chromedriver"
    )
    assert purge.returncode == 0, purge.stdout + purge.stderr
    yield machine
    assert _host_packages() == before, "the machine's own packages changed"


def test_make_prereqs_installs_chromium_and_its_driver_where_it_may(bare_machine: Machine) -> None:
    """As root with apt-get, on a machine with neither program: `make prereqs` (the first step of
    `make test` and of CI) says it installs Debian's chromium and chromium-driver, does, and
    reports them of one version; the inbox tests' own browser code then starts Chromium through
    chromedriver and reads back a page it drew."""
    started = time.monotonic()
    done = bare_machine.run(f"{MAKE} prereqs")
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "prereqs: installing Chromium and chromedriver: apt-get install chromium" in out
    reported = [line for line in out.splitlines() if line.startswith("prereqs: Chromium and")]
    assert len(reported) == 1 and "/chromium and " in reported[0], out
    assert "/chromedriver" in reported[0], out
    drawn = bare_machine.run(f"PYTHONPATH=e2e {shlex.quote(sys.executable)} -c {shlex.quote(DRAW)}")
    assert drawn.stdout.strip().splitlines()[-1:] == ["drawn by Chromium"], drawn.stderr
    print(f"installed in {took:.0f}s")


@pytest.mark.parametrize("why", ["not root", "no apt-get here"])
def test_make_test_stops_at_once_where_it_cannot_install(bare_machine: Machine, why: str) -> None:
    """Not root, or root without apt-get, on a machine with neither program: `make test` (-j2,
    so nothing may start beside the step either) fails within seconds with one line naming what
    to run, before lint, types, unit or e2e tests have started, and has installed nothing."""
    if why == "not root":
        script = f"runuser -u nobody -- env HOME=/nonexistent {MAKE} -j2 test"
    else:
        script = f"rm /usr/bin/apt-get && {MAKE} -j2 test"
    started = time.monotonic()
    done = bare_machine.run(script, timeout=180)
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert took < 60, f"took {took:.0f}s"
    lines = [line for line in done.stderr.splitlines() if line.startswith("make test needs")]
    assert len(lines) == 1, out
    assert lines[0].startswith("make test needs Chromium and chromedriver"), lines[0]
    assert f"({why})" in lines[0]
    assert "apt-get install chromium chromium-driver" in lines[0] and "CHROMEDRIVER=" in lines[0]
    for started_too in ("ruff", "mypy", "pytest", "lint-imports", "keelgate_e2e.build"):
        assert started_too not in out, f"{started_too} ran before the step stopped make:\n{out}"
    still = bare_machine.run("command -v chromium chromedriver")
    assert still.stdout == "", still.stdout
