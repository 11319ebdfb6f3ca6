"""One step pod's container, as a process forked from the executor's forkserver.

Why it exists: the forkserver has imported Keelgate once; each step then runs in a process of
its own, as in a container: the container's variables set, its output in its own log file, and
``keelgate step``'s own ``main`` run with the container's arguments, its exit code the
process's. It must never share anything with another step but what the fork copied.
"""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str], env: dict[str, str], log: str) -> None:
    """Run ``keelgate step ARGV`` with ``env`` added, output to ``log``; exit with its code."""
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    from keelgate.cli import step

    before = set(sys.modules) if os.environ.get("SCALEBENCH_IMPORTS") else set()
    started = time.process_time()
    if os.environ.get("SCALEBENCH_CPROFILE"):
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        code = profiler.runcall(step.main, argv)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(35)
    else:
        code = step.main(argv)
    if before:  # what the forkserver had not imported yet (a preload candidate), and the CPU
        print(f"scalebench: imported {sorted(set(sys.modules) - before)}", file=sys.stderr)
        print(f"scalebench: cpu {time.process_time() - started:.3f}s", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
