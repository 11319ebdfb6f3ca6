"""The typer app every ``keelgate`` and ``kubectl keelgate`` command group is made from.

Why it exists: the conventions kubectl users bring are the same for every group, so they are
set once here rather than at each ``typer.Typer(...)``: ``-h`` as well as ``--help``, help pages
in kubectl's layout (``keelgate.cli.helptext``: ``-n, --namespace NS``, ``Usage:``,
``Examples:``, 80 columns; no ``<bool>`` metavars, no ``{RUN}``), no rich boxes, no typer
completion flags (``keelgate completion SHELL`` prints the script, as ``kubectl completion``
does), and errors left to ``keelgate.cli.dispatch`` (one line, the documented exit code). A
command's examples and notes are its ``epilog``: sections of laid-out text, ``Examples:`` first.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import CommandFunctionType

from keelgate.cli.examples import EXAMPLES
from keelgate.cli.helptext import Flag, Page, render

#: How kubectl names a value nobody named: the type, in words.
_TYPE_WORDS = {"str": "string", "int": "int", "float": "float", "Path": "file", "bool": "bool"}
_HELP_NAMES = ["-h", "--help"]


class App(typer.Typer):
    """``typer.Typer`` with Keelgate's conventions (see the module's docstring)."""

    def __init__(self, **settings: Any) -> None:
        settings.setdefault("no_args_is_help", True)
        settings.setdefault("add_completion", False)
        settings.setdefault("pretty_exceptions_enable", False)
        settings.setdefault("rich_markup_mode", None)
        settings.setdefault("cls", HelpGroup)
        context = dict(settings.pop("context_settings", None) or {})
        context.setdefault("help_option_names", _HELP_NAMES)
        super().__init__(context_settings=context, **settings)

    def command(
        self, name: str | None = None, **settings: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        settings.setdefault("cls", HelpCommand)
        return super().command(name, **settings)


class HelpCommand(TyperCommand):
    """A command whose help page is laid out by ``keelgate.cli.helptext``."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(render(page(self, ctx)))


class HelpGroup(TyperGroup):
    """A group whose help page lists its commands in ``keelgate.cli.helptext``'s layout."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(render(page(self, ctx)))


def page(command: Any, ctx: Any) -> Page:
    """The help page of a click command (or group) in its context."""
    arguments: list[tuple[str, str]] = []
    flags: list[Flag] = []
    usage = [ctx.command_path]
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            name = argument_name(param)
            usage.append(name if param.required else f"[{name}]")
            if getattr(param, "help", None):
                arguments.append((argument_name(param), str(param.help)))
        elif param.param_type_name == "option":
            flags.append(_flag(param, ctx))
    commands: list[tuple[str, str]] = []
    if isinstance(command, TyperGroup):
        listed = [(name, command.get_command(ctx, name)) for name in command.list_commands(ctx)]
        shown = [(name, sub) for name, sub in listed if sub is not None and not sub.hidden]
        commands = [(name, sub.get_short_help_str(limit=300).rstrip(".")) for name, sub in shown]
        usage.append("COMMAND")
    usage.append("[flags]")
    return Page(
        about=command.help or "",
        usage=(" ".join(usage),),
        arguments=tuple(arguments),
        commands=tuple(commands),
        flags=tuple(flags),
        epilog="\n\n".join(
            part for part in (EXAMPLES.get(ctx.command_path, ""), command.epilog or "") if part
        ),
    )


def argument_name(param: Any) -> str:
    """``RUN`` for an argument named ``run`` (or its own metavar)."""
    return str(param.metavar or param.name or "ARG").upper()


def _flag(param: Any, ctx: Any) -> Flag:
    names = sorted(param.opts, key=lambda n: (n.startswith("--"), n))
    names += list(getattr(param, "secondary_opts", ()) or ())
    notes = []
    envvar = param.envvar if isinstance(param.envvar, str) else None
    text = str(getattr(param, "help", "") or "")
    if envvar and envvar not in text:
        notes.append(f"env {envvar}")
    default = _default(param)
    if default:
        notes.append(f"default {default}")
    if param.required:
        notes.append("required")
    if notes:
        text = f"{text} ({'; '.join(notes)})" if text else f"({'; '.join(notes)})"
    return Flag(tuple(names), "" if param.is_flag else value_name(param), text)


def value_name(param: Any) -> str:
    """How a flag's value is named on its help line: its metavar, its choices (``text|json``),
    else its type in words (``string``, ``int``), as kubectl's help names them."""
    if param.metavar:
        return str(param.metavar)
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None and getattr(descriptor, "is_choice", False):
        return "|".join(
            str(c.value if isinstance(c, Enum) else c) for c in descriptor.choices or ()
        )
    bare = param.bare_type() if hasattr(param, "bare_type") else "string"
    bare = bare.removeprefix("list[").removesuffix("]")
    return _TYPE_WORDS.get(bare, bare.lower())


def _default(param: Any) -> str:
    if param.show_default is False or param.is_flag:
        return ""
    value = param.default
    if value is None or value == "" or value == [] or callable(value):
        return ""
    if isinstance(value, Enum):
        value = value.value
    return str(value)
