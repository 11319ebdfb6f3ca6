"""``kubectl_complete-keelgate``: shell completion for ``kubectl keelgate``, the way kubectl asks
plugins for it.

Why it exists: kubectl (1.26+) completes a plugin's words by running ``kubectl_complete-<plugin>``
from ``PATH`` with the words typed after the plugin's name, the last one being the word to
complete (empty for a new word), and reads one candidate per line, then an optional last line
``:<directive>`` (Cobra's ShellCompDirective). This program offers the plugin's commands, their
flags, the AgentRuns of the namespace for RUN, the actions waiting for a decision for ACTION
(``reconcile``/``approve``), namespaces for ``-n`` and output formats for ``-o``, asking the API
server as the kubeconfig's user. It must never print anything but candidates (an error is an
empty answer: completion must not break a shell), never write, and never wait long.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

#: Cobra's directives: 4 = no file completion (the default is the shell's file names).
NO_FILES = 4
DEFAULT = 0
#: kubectl's flags the plugin reads, and whether each takes a value.
GLOBAL_FLAGS = {
    "--kubeconfig": True,
    "--context": True,
    "--namespace": True,
    "-n": True,
    "--as": True,
    "--as-group": True,
}
#: The commands whose first argument is a run, and those whose second is a waiting action.
TAKES_RUN = frozenset({"status", "reconcile", "approve", "resume", "logs", "audit"})
ACTION_KIND = {"reconcile": "Reconciliation", "approve": "Approval"}
OUTPUTS = ("text", "wide", "json", "yaml", "name")


def candidates(words: Sequence[str], api: Any = None) -> tuple[list[str], int]:
    """The completions of ``words`` (the last one is being typed) and the directive.
    ``api``: a PluginApi factory ``(namespace, context, kubeconfig) -> PluginApi``; None: the
    cluster of the kubeconfig."""
    import typer

    from keelgate.cli.plugin import commands as plugin_commands
    from keelgate.cli.plugin import listing as _listing  # noqa: F401 - registers list, pending
    from keelgate.cli.plugin import logs as _logs  # noqa: F401 - registers logs
    from keelgate.cli.plugin import ui as _ui  # noqa: F401 - registers ui

    group: Any = typer.main.get_command(plugin_commands.app)
    *before, word = list(words) or [""]
    flags: dict[str, str] = {}
    positional: list[str] = []
    index = 0
    while index < len(before):
        item = before[index]
        name, eq, value = item.partition("=")
        if item.startswith("-"):
            takes_value = GLOBAL_FLAGS.get(name) or _option_takes_value(group, positional, name)
            if takes_value and not eq:
                index += 1
                value = before[index] if index < len(before) else ""
            flags[name] = value
        else:
            positional.append(item)
        index += 1
    previous = before[-1] if before else ""
    if previous in ("-n", "--namespace"):
        return _prefixed(_namespaces(api, flags), word), NO_FILES
    if previous in ("-o", "--output"):
        return _prefixed(list(OUTPUTS), word), NO_FILES
    if previous in ("--kubeconfig", "--key", "--sign-key", "--output-file"):
        return [], DEFAULT  # a file: the shell's own completion
    if (
        previous.startswith("-")
        and "=" not in previous
        and (GLOBAL_FLAGS.get(previous) or _option_takes_value(group, positional, previous))
    ):
        return [], NO_FILES  # some other value: nothing to offer
    if not positional:
        if word.startswith("-"):
            return _prefixed(sorted(GLOBAL_FLAGS), word), NO_FILES
        names = [f"{name}\t{_short(cmd)}" for name, cmd in sorted(group.commands.items())]
        return _prefixed(names, word), NO_FILES
    command = positional[0]
    found = group.commands.get(command)
    if word.startswith("-"):
        options = sorted(
            {opt for param in getattr(found, "params", []) for opt in getattr(param, "opts", [])}
            | set(GLOBAL_FLAGS)
        )
        return _prefixed(options, word), NO_FILES
    arguments = positional[1:]
    if command in TAKES_RUN and not arguments:
        extra = ["export", "verify"] if command == "audit" else []
        return _prefixed(extra + _runs(api, flags), word), NO_FILES
    if command in ACTION_KIND and len(arguments) == 1:
        return _prefixed(_actions(api, flags, ACTION_KIND[command], arguments[0]), word), NO_FILES
    return [], NO_FILES


def _option_takes_value(group: Any, positional: list[str], name: str) -> bool:
    command = group.commands.get(positional[0]) if positional else None
    for param in getattr(command, "params", []):
        if name in getattr(param, "opts", []):
            return not bool(getattr(param, "is_flag", False))
    return False


def _short(command: Any) -> str:
    text = str(getattr(command, "help", "") or "").strip().splitlines()
    return text[0].rstrip(".") if text else ""


def _prefixed(values: Sequence[str], word: str) -> list[str]:
    return [v for v in values if v.startswith(word)]


def _connect(api: Any, flags: dict[str, str]) -> Any:
    if api is not None:
        return api(
            flags.get("-n") or flags.get("--namespace"),
            flags.get("--context"),
            flags.get("--kubeconfig"),
        )
    from keelgate.cli.plugin.client import ClusterClient
    from keelgate.cli.plugin.target import resolve

    target = resolve(
        flags.get("--kubeconfig"),
        flags.get("--context"),
        flags.get("-n") or flags.get("--namespace"),
    )
    return ClusterClient(target)


def _runs(api: Any, flags: dict[str, str]) -> list[str]:
    try:
        listed = _connect(api, flags).listed("AgentRun")
    except Exception:  # no cluster, no rights: nothing to offer, the shell goes on
        return []
    return sorted(str(run["metadata"]["name"]) for run in listed)


def _actions(api: Any, flags: dict[str, str], kind: str, run: str) -> list[str]:
    try:
        listed = _connect(api, flags).decisions(kind, run)
    except Exception:
        return []
    from keelgate.cli.plugin.listing import decided

    waiting = [item for item in listed if not decided(item)]
    return [f"{item['spec'].get('action', '')}\t{item['spec'].get('tool', '')}" for item in waiting]


def _namespaces(api: Any, flags: dict[str, str]) -> list[str]:
    try:
        client = _connect(api, flags)
        listed = client.core.list_namespace(_request_timeout=5)
    except Exception:  # may not list namespaces: type it
        return []
    return sorted(str(item.metadata.name) for item in listed.items)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        found, directive = candidates(words)
    except Exception:  # completion must never break the shell
        found, directive = [], NO_FILES
    for line in found:
        print(line)
    print(f":{directive}")
    return 0


def run() -> None:
    """Console-script wrapper."""
    sys.exit(main())
