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

from keelgate.cli import _error_line, _exit_code, dispatch
from keelgate.cli.plugin import commands
from keelgate.cli.plugin import listing as _listing  # noqa: F401 - registers list, pending
from keelgate.cli.plugin import logs as _logs  # noqa: F401 - registers logs
from keelgate.cli.plugin import ui as _ui  # noqa: F401 - registers ui
from keelgate.cli.plugin.target import Impersonation, impersonate
from keelgate.errors import KeelgateError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kubectl-keelgate`` executable; returns the exit code."""
    from keelgate.cli.pipes import closed_pipes_are_quiet

    with closed_pipes_are_quiet():
        return _main(list(sys.argv[1:] if argv is None else argv))


def _main(args: list[str]) -> int:
    try:
        args, impersonation = Impersonation.taken_from(args)
    except KeelgateError as error:
        from keelgate.cli.render import Console

        Console.program = "kubectl keelgate"
        Console().error(_error_line(error))
        return _exit_code(error)
    impersonate(impersonation)
    verb = _audit_tool(args)
    if verb is not None:
        # `audit RUN` shows a run's chain; `audit export|verify` are commands of their own
        # under its name. kubectl's flags given before `audit` go after the command.
        from keelgate.cli.plugin import audit_export

        at = args.index("audit")
        rest = [verb, *args[at + 2 :], *args[:at]]
        return dispatch(audit_export.app, rest, prog_name="kubectl keelgate audit")
    return dispatch(commands.app, args, prog_name="kubectl keelgate")


#: kubectl's flags that take a value (given before the command).
_VALUED = frozenset({"--kubeconfig", "--context", "--namespace", "-n"})


def _audit_tool(args: list[str]) -> str | None:
    """``export`` or ``verify`` when the command is ``audit export|verify``, after any of
    kubectl's flags; None otherwise."""
    index = 0
    while index < len(args) and args[index].startswith("-"):
        index += 1 if "=" in args[index] or args[index] not in _VALUED else 2
    if args[index : index + 1] == ["audit"] and args[index + 1 : index + 2] in (
        ["export"],
        ["verify"],
    ):
        return args[index + 1]
    return None


def run() -> None:
    """Console-script wrapper: exit with main's code."""
    sys.exit(main())
