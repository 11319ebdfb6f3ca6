"""What share of single bugs it was not built around the simulator finds, and how fast (issue 48,
item 4): each bug of ``tests/support/unseen_bugs.py``, ``unseen_bugs_b.py`` (set B, written
by someone who had not read the simulator), ``unseen_bugs_c.py`` (set C, the same, written
after the simulator was extended for A and B), ``unseen_bugs_d.py`` (set D, the same, spread
over the product's floors), ``unseen_bugs_e.py`` (set E, the same, written while the
simulator was extended for D's misses, never shown to those extending it),
``unseen_bugs_f.py`` (set F, the same, written while E's misses were closed),
``unseen_bugs_g.py`` (set G, the same, on the ground the others left: run ownership and its
epochs, the cut of an exchange, the fence's refusals, the MCP tool, the model reply's usage,
the key's spelling and the runners) and ``unseen_bugs_h.py`` (set H, the same, in functions no
other set planted into: approvals' rules and rebinds, active time, clocks, the operator's
settlements, Approvals and step slots) is planted into a temporary copy of the package, the
simulator runs on the copy for ``--seconds`` (120 by default) from a fixed base of seeds, and
the first broken promise that the clean product does not also break counts as found.

Why it exists: a number beats a claim. A failing seed is replayed on the clean package before it
counts (a promise the product breaks on main, with a move of issue 46 say, is no finding of the
bug's); the seeds are numbered from ``--base``, so a run is the same search every time (the
seconds depend on the machine: read the runs column for the search's length). Prints a
Markdown table (the one in docs/simulation.md) and, with ``--json``, one JSON line per bug.

    .venv/bin/python bench/unseen_bugs.py                 # every bug, 120 s each
    .venv/bin/python bench/unseen_bugs.py --seconds 30 key resume   # some, shorter
    .venv/bin/python bench/unseen_bugs.py --seeds 1500    # a search that ignores the machine's load

It must never plant a bug into the tree: copies only, under a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.planted_bugs import Planted, planted  # noqa: E402
from support.unseen_bugs import UNSEEN  # noqa: E402
from support.unseen_bugs_b import UNSEEN_B  # noqa: E402
from support.unseen_bugs_c import UNSEEN_C  # noqa: E402
from support.unseen_bugs_d import UNSEEN_D  # noqa: E402
from support.unseen_bugs_e import UNSEEN_E  # noqa: E402
from support.unseen_bugs_f import UNSEEN_F  # noqa: E402
from support.unseen_bugs_g import UNSEEN_G  # noqa: E402
from support.unseen_bugs_h import UNSEEN_H  # noqa: E402

#: Every unseen bug, one list: issue 48's set (written beside the simulator's work), the
#: second set (``unseen_bugs_b.py``), written by someone who had not read the simulator, the
#: third (``unseen_bugs_c.py``), written after the simulator was extended for the first two,
#: the fourth (``unseen_bugs_d.py``), spread over the product's floors beyond the gateway, and
#: the fifth (``unseen_bugs_e.py``), written from the product code alone after D was measured,
#: the sixth (``unseen_bugs_f.py``), the same, after E was measured and its misses closed,
#: the seventh (``unseen_bugs_g.py``), the same, on ground the others left alone, and the
#: eighth (``unseen_bugs_h.py``), the same, in functions no other set planted into.
ALL: tuple[Planted, ...] = (
    UNSEEN + UNSEEN_B + UNSEEN_C + UNSEEN_D + UNSEEN_E + UNSEEN_F + UNSEEN_G + UNSEEN_H
)

SIM = [sys.executable, "-m", "keelgate.testing.sim"]
#: The world searched: the one ``make sim`` runs (every move of issues 46 and 48: people who
#: copy, reorder, re-create, impersonate and edit, and a shop at the edge of the fence's
#: assumption), which the clean product passes.
WORLD = ["--every-move"]


def _env(root: Path | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if root is not None:
        env["PYTHONPATH"] = str(root)
    return env


def _main_breaks(failure: dict[str, Any]) -> bool:
    """Whether the clean product breaks a promise on the same seed (then it is not the bug's)."""
    done = subprocess.run(
        [
            *SIM,
            "--seed",
            str(failure["seed"]),
            *WORLD,
            "--mode",
            failure["mode"],
            "--store",
            failure["store"],
        ],
        env=_env(None),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.returncode != 0


def measure(
    bug: Planted, *, seconds: float | None, base: int, seeds: int | None = None
) -> dict[str, Any]:
    """Search ``bug``'s copy for ``seconds`` (or ``seeds`` runs); the first finding main does
    not share."""
    with tempfile.TemporaryDirectory(prefix="keelgate-unseen-") as folder:
        root = planted(bug, Path(folder))
        started = time.monotonic()
        search = subprocess.Popen(
            [
                *SIM,
                *(["--seconds", str(seconds)] if seeds is None else ["--seeds", str(seeds)]),
                "--base",
                str(base),
                *WORLD,
                "--no-shrink",
                "--report-each",
                "--json",
            ],
            env=_env(root),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert search.stdout is not None
        found: dict[str, Any] | None = None
        shared: list[int] = []
        runs = 0
        for line in search.stdout:
            if not line.startswith("{"):
                continue
            data = json.loads(line)
            if "failure" in data:
                failure = data["failure"]
                if _main_breaks(failure):
                    shared.append(failure["seed"])
                    continue
                found = failure
                search.kill()
                break
            runs = int(data.get("runs", runs))
        search.wait()
        # A single run may outlast the budget (a run left waiting is looked at until its
        # calm end): a failure reported after ``seconds`` was not found within them.
        late = found is not None and seconds is not None and found["seconds"] > seconds
        return {
            "bug": bug.name,
            "found": found is not None and not late,
            "late": late,
            "seconds": None if found is None else found["seconds"],
            "runs": found["run"] if found is not None else runs,
            "seed": None if found is None else found["seed"],
            "mode": None if found is None else found["mode"],
            "rules": [] if found is None else found["rules"],
            "main_also": shared,
            "wall": round(time.monotonic() - started, 1),
        }


def _set(bug: Planted) -> str:
    if bug in UNSEEN_H:
        return "H"
    if bug in UNSEEN_G:
        return "G"
    if bug in UNSEEN_F:
        return "F"
    if bug in UNSEEN_E:
        return "E"
    if bug in UNSEEN_D:
        return "D"
    return "C" if bug in UNSEEN_C else "B" if bug in UNSEEN_B else "A"


def main() -> int:
    parse = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parse.add_argument("names", nargs="*", help="Only the bugs whose names hold these words.")
    parse.add_argument("--seconds", type=float, default=120.0)
    parse.add_argument("--seeds", type=int, help="Search this many seeds instead of seconds.")
    parse.add_argument("--base", type=int, default=48)
    parse.add_argument("--set", choices="ABCDEFGH", help="Only the bugs of this set.")
    parse.add_argument("--json", action="store_true")
    args = parse.parse_args()
    bugs = [b for b in ALL if not args.names or any(n in b.name for n in args.names)]
    bugs = [b for b in bugs if args.set is None or _set(b) == args.set]
    print("| planted bug | set | found | seconds | runs | rule broken |")
    print("| --- | --- | --- | --- | --- | --- |")
    results = []
    for bug in bugs:
        result = measure(bug, seconds=args.seconds, base=args.base, seeds=args.seeds)
        results.append(result)
        seconds = "" if result["seconds"] is None else f"{result['seconds']:.0f}"
        rules = ", ".join(f"`{r}`" for r in result["rules"])
        print(
            f"| {bug.name} | {_set(bug)} | "
            f"{'yes' if result['found'] else 'no'} | {seconds} | "
            f"{result['runs']} | {rules} |",
            flush=True,
        )
        if args.json:
            print(json.dumps(result), flush=True)
    share = sum(r["found"] for r in results) / len(results) if results else 0.0
    print(f"\nfound {sum(r['found'] for r in results)} of {len(results)} ({share:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
