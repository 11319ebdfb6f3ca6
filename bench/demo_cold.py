"""A first `make demo` as a newcomer meets it: a fresh clone, every cache empty, wall and CPU time.

Why it exists: the README quotes how long the first `make demo` takes (issue 53: the figure it
quoted was not what a newcomer saw). This script measures exactly that case: it clones the
repository at a commit (default HEAD) into a temporary folder, points Go's build and module
caches, pip's cache and the XDG cache folder (helm's) at empty temporary folders, runs
`make demo` there and reports the wall time, the user and system CPU of every process `make`
waited for (the Go build, pip, the cluster's start, the demo), the peak RSS of the largest of
them, and where the time went: the module downloads, the Go build (per tools module), the
venv's install beside it, the cluster's start with Keelgate's chart, the demo itself. The
cluster's own processes run in the background and are not waited for; their CPU is reported
beside the total, apart.

It must never touch the user's own caches or work tree: everything it writes is under its
temporary folder, which it removes at the end (after `make down` in the clone), also when the
demo fails or it is interrupted. It needs an idle machine for a wall time worth quoting (it
prints the load average at the start and the end); its CPU figures hold on a busy one.

    python3 bench/demo_cold.py                 # HEAD; `make demo-cold` runs this
    python3 bench/demo_cold.py --rev main --log /tmp/demo-cold.log --json /tmp/demo-cold.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parent.parent

#: Lines of `make demo`'s output that open or close a phase (keelgate_e2e.build prints the
#: timings of its steps; make echoes each command it runs).
_STEP = re.compile(
    r"^\s*(modules ready and packages listed|go build) in (\d+)s "
    r"\(CPU (\d+)s user, (\d+)s system(?:, (.*))?\)$"
)
#: How the report names each step of keelgate_e2e.build in tools module {}.
_STEP_NAMES = {
    "modules ready and packages listed": "Go modules downloaded, packages listed (e2e/tools/{})",
    "go build": "go build (e2e/tools/{})",
}
_GO_LIST = re.compile(r"^\+ \(cd (\S+) && go list -deps")
_UP_CMD = re.compile(r"-m keelgate_e2e --dir \S+ up$")
_CLUSTER_UP = re.compile(r"^cluster up in ([\d.]+)s \(components: (\{.*\})\)")
_DEMO_CMD = re.compile(r"examples/restock/cluster_demo\.py")


@dataclass
class Phase:
    """One span of the run, in seconds from the start of `make demo`."""

    name: str
    start: float
    end: float
    cpu_user: float | None = None
    cpu_system: float | None = None
    note: str = ""


@dataclass
class Report:
    """What one cold `make demo` cost."""

    commit: str
    target: str
    date: str
    cpus: int
    load_start: float
    load_end: float = 0.0
    exit_code: int = -1
    wall: float = 0.0
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    peak_rss_mib: float = 0.0
    background_cpu: float = 0.0
    phases: list[Phase] = field(default_factory=list)


def phases(lines: Sequence[tuple[float, str]], venv_done: float | None) -> list[Phase]:
    """The phases of a `make demo` from its timestamped output lines (seconds from the start)
    and the time its venv's install finished (None if unknown)."""
    found: list[Phase] = []
    module = ""
    up_started = demo_started = None
    for at, line in lines:
        if match := _GO_LIST.search(line):
            module = Path(match.group(1)).name
        elif match := _STEP.search(line):
            step, took, user, system, note = match.groups()
            name = _STEP_NAMES[step].format(module)
            found.append(Phase(name, at - float(took), at, float(user), float(system), note or ""))
        elif _UP_CMD.search(line):
            up_started = at
        elif (match := _CLUSTER_UP.search(line)) and up_started is not None:
            components = json.loads(match.group(2))
            parts = ", ".join(f"{k} {v:g}s" for k, v in components.items())
            found.append(
                Phase("cluster start and Keelgate's chart (make up)", up_started, at, note=parts)
            )
        elif _DEMO_CMD.search(line):
            demo_started = at
    if demo_started is not None and lines:
        found.append(Phase("the demo", demo_started, lines[-1][0]))
    if venv_done is not None:
        found.append(Phase("venv install (beside the Go build)", 0.0, venv_done))
    return sorted(found, key=lambda p: (p.start, p.end))


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def render(report: Report) -> str:
    """The report as text."""
    cpu = report.cpu_user + report.cpu_system
    share = 100 * cpu / report.wall / report.cpus if report.wall else 0.0
    lines = [
        f"cold `make {report.target}` of {report.commit[:12]} on {report.date} "
        f"({report.cpus} cores; load {report.load_start:.1f} at the start, "
        f"{report.load_end:.1f} at the end)",
        f"  exit {report.exit_code} in {_clock(report.wall)} ({report.wall:.0f} s): "
        f"{report.cpu_user:.0f} s user + {report.cpu_system:.0f} s system CPU "
        f"({cpu / 60:.1f} CPU-minutes, {share:.0f}% of the {report.cpus} cores), "
        f"peak RSS {report.peak_rss_mib / 1024:.1f} GiB",
        "  where the time goes:",
    ]
    for p in report.phases:
        cost = ""
        if p.cpu_user is not None and p.cpu_system is not None:
            cost = f", CPU {p.cpu_user:.0f} s user + {p.cpu_system:.0f} s system"
        note = f" ({p.note})" if p.note else ""
        lines.append(
            f"    {_clock(p.start):>5} - {_clock(p.end):>5}  {p.name}: "
            f"{p.end - p.start:.0f} s{cost}{note}"
        )
    lines.append(
        f"  the cluster's own processes (background, not in the CPU above): "
        f"{report.background_cpu:.0f} s CPU by the demo's end"
    )
    return "\n".join(lines)


def _run_dir_cpu(run_dir: Path) -> float:
    """CPU seconds (own and reaped children's) of every process carrying the run's marker, as
    keelgate_e2e marks what `make up` starts."""
    marker = f"KEELGATE_E2E_RUN={run_dir}".encode()
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime: fields 14-17 of stat, 12-15 after the name.
        total += sum(int(f) for f in fields[11:15]) / ticks
    return total


def _remove(path: Path) -> None:
    """Remove a folder in which Go may have made folders read-only (its module cache)."""
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            folder = os.path.join(root, name)
            if not os.path.islink(folder):
                os.chmod(folder, os.stat(folder).st_mode | stat.S_IWUSR)
    shutil.rmtree(path)


def _stream(proc: subprocess.Popen[str], started: float, log: Path) -> Iterator[tuple[float, str]]:
    assert proc.stdout is not None
    with log.open("w") as out:
        for line in proc.stdout:
            at = time.monotonic() - started
            out.write(f"[{_clock(at)}] {line}")
            out.flush()
            print(f"[{_clock(at)}] {line}", end="", flush=True)
            yield at, line.rstrip("\n")


def measure(rev: str, work: Path, log: Path, target: str) -> Report:
    """Clone `rev` into `work`, run `make target` there with empty caches, and report."""
    commit = subprocess.run(
        ["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    report = Report(
        commit=commit,
        target=target,
        date=datetime.now(UTC).strftime("%Y-%m-%d"),
        cpus=os.cpu_count() or 1,
        load_start=os.getloadavg()[0],
    )
    clone = work / "keelgate"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "checkout", "--quiet", "--detach", commit], cwd=clone, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    for name, folder in (
        ("GOCACHE", "go-build"),
        ("GOMODCACHE", "go-mod"),
        ("PIP_CACHE_DIR", "pip"),
        ("XDG_CACHE_HOME", "xdg-cache"),
        ("KUBECACHEDIR", "kube-cache"),
    ):
        (work / folder).mkdir()
        env[name] = str(work / folder)
    print(f"+ (cd {clone} && make {target})   caches empty, under {work}", flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started, started_wall = time.monotonic(), time.time()
    proc = subprocess.Popen(
        ["make", target],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # so that an interruption stops make's children too
    )
    try:
        lines = list(_stream(proc, started, log))
        report.exit_code = proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    report.wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report.cpu_user = after.ru_utime - before.ru_utime
    report.cpu_system = after.ru_stime - before.ru_stime
    report.peak_rss_mib = after.ru_maxrss / 1024  # KiB on Linux
    report.load_end = os.getloadavg()[0]
    report.background_cpu = _run_dir_cpu(clone / ".dev")
    # The stamp of the extras `make up` installs (or the base alone, for `make demo-local`) is
    # touched when the install ended.
    stamps = [clone / ".venv" / name for name in (".installed-up", ".installed-base")]
    venv_done = next((p.stat().st_mtime - started_wall for p in stamps if p.exists()), None)
    report.phases = phases(lines, venv_done)
    return report


def _stop(clone: Path) -> None:
    """`make down` in the clone, when its venv exists (nothing starts without it)."""
    if (clone / ".venv" / "bin" / "python").exists():
        subprocess.run(["make", "--no-print-directory", "down"], cwd=clone, check=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="HEAD", help="the commit to clone (default HEAD)")
    parser.add_argument("--target", default="demo", help="the make target (default demo)")
    parser.add_argument("--tmp", type=Path, default=None, help="where the temporary folder goes")
    parser.add_argument("--log", type=Path, default=None, help="keep make's timestamped output")
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON too")
    parser.add_argument("--keep", action="store_true", help="keep the clone and caches")
    args = parser.parse_args(argv)

    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if dirty and args.rev == "HEAD":
        print("note: the work tree has uncommitted changes; they are not measured", flush=True)

    def interrupted(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    work = Path(tempfile.mkdtemp(prefix="keelgate-demo-cold-", dir=args.tmp))
    log = args.log or work / "make-demo.log"
    try:
        report = measure(args.rev, work, log, args.target)
    except KeyboardInterrupt:
        print("interrupted: stopping the cluster and removing the temporary folder", flush=True)
        return 130
    finally:
        _stop(work / "keelgate")
        if args.keep:
            print(f"kept {work}", flush=True)
        else:
            _remove(work)
    print()
    print(render(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0 if report.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
