"""``kubectl keelgate``: the kubectl plugin (a ``kubectl-keelgate`` executable on PATH).

kubectl runs ``kubectl-keelgate`` with every argument after ``keelgate``, so this is an ordinary
program that reads kubectl's flags itself (``target``), talks to the API server through the
official client as the kubeconfig's user (``client``), and prints through the same console and
error table as ``keelgate`` (one line per error, the same exit codes, ``--output json``). It
must never print a traceback, a Secret, a credential from the kubeconfig, a store password or a
tool's argument.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from keelgate.cli import dispatch
from keelgate.cli.plugin import commands


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kubectl-keelgate`` executable; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    return dispatch(commands.app, args, prog_name="kubectl keelgate")


def run() -> None:
    """Console-script wrapper: exit with main's code."""
    sys.exit(main())
