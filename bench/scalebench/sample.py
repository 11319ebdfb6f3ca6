"""What the bench reads at the edges of a measured window: each component's CPU, the operator
replicas' memory and metrics, PostgreSQL's sessions and transactions, the machine's load, and a
profile.

Why it exists: a per-step figure is a difference between two snapshots divided by the steps
between them; the snapshot is taken the same way for every component (its process tree's CPU
from ``/proc``, children it reaped included), so the shares add up and the one that saturates
shows. The operator's profile is py-spy's, attached from outside (the operator runs unchanged).
It must never signal or change a process it reads.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg

from scalebench.counting import cpu_seconds_of, parent_of

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant (each with the children it reaped)."""
    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            line = _stat(int(entry.name))
            if line is not None:
                pid = int(entry.name)
                lines[pid], parents[pid] = line, parent_of(line)
    members, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in members:
                members.add(child)
                frontier.append(child)
    return sum(cpu_seconds_of(lines[pid], TICKS) for pid in members if pid in lines)


def own_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` alone (its threads; not its children, reaped or alive)."""
    line = _stat(pid)
    if line is None:
        return 0.0
    fields = line.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def machine_cpu() -> float:
    """CPU seconds every process of the machine has used (``/proc/stat``, all cores)."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(v) for i, v in enumerate(first) if i not in (3, 4))  # less idle, iowait
    return busy / TICKS


def pg_counts(dsn: str) -> dict[str, int]:
    """PostgreSQL's totals for the database: transactions (all, and those that wrote: each took
    a transaction id) and sessions begun."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, xact_rollback, sessions FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
        ids = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    assert row is not None and ids is not None
    return {
        "transactions": int(row[0]) + int(row[1]),
        "write_transactions": int(ids[0]),
        "sessions": int(row[2]),
    }


def metric_sum(text: str, name: str, where: str = "") -> float:
    """The sum of a Prometheus metric's samples (those whose labels contain ``where``)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (not where or where in line):
            rest = line[len(name) :]
            if rest[:1] in ("{", " "):
                total += float(line.rsplit(" ", 1)[1])
    return total


def snapshot(pids: Mapping[str, int], dsn: str, metrics: str) -> dict[str, Any]:
    """Everything a window's figures are differences of, at one moment. Each component's CPU
    is its process tree's; this process's (``bench``) its own, since it started the others."""
    me = os.getpid()
    return {
        "wall": time.time(),
        "mono": time.monotonic(),
        "cpu": {name: own_cpu(pid) if pid == me else tree_cpu(pid) for name, pid in pids.items()},
        "machine_cpu": machine_cpu(),
        "pg": pg_counts(dsn),
        "metrics": metrics,
        "load": os.getloadavg(),
    }


class Peaks:
    """The operator replicas' RSS (each one's peak) and PostgreSQL's sessions, sampled every
    second in the background. ``watch`` names the replicas of the block being measured."""

    def __init__(self, pids: list[int], dsn: str) -> None:
        self.pids, self.dsn = list(pids), dsn
        self.rss: dict[int, float] = {}
        self.sessions = 0
        self.loads: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="peaks")

    def start(self) -> Peaks:
        self.thread.start()
        return self

    def watch(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self.reset()

    def reset(self) -> None:
        self.rss, self.sessions, self.loads = {}, 0, []

    def _loop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(1.0):
                for pid in list(self.pids):
                    self.rss[pid] = max(self.rss.get(pid, 0.0), rss_mb(pid))
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                ).fetchone()
                self.sessions = max(self.sessions, int(row[0]) if row else 0)
                self.loads.append(os.getloadavg()[0])


def profile(pid: int, seconds: int, out: Path, py_spy: str) -> Path | None:
    """py-spy's collapsed stacks of ``pid`` for ``seconds`` (50 samples a second, idle threads
    left out), or None when py-spy cannot attach."""
    done = subprocess.run(
        [
            py_spy,
            "record",
            "-p",
            str(pid),
            "-d",
            str(seconds),
            "-r",
            "50",
            "-f",
            "raw",
            "--gil",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not out.exists():
        print(f"bench: py-spy: {done.stderr.strip()[-300:]}", flush=True)
        return None
    return out
