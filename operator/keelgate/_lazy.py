"""Lazy re-exports for a package's facade: a name's module is imported on its first use.

Why it exists: ``keelgate`` and ``keelgate.runners`` re-export names whose modules a step pod
must not import before it has read its checkpoint; both need the same module ``__getattr__``.
It must never import anything but the standard library: every ``keelgate.*`` import runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str,
    namespace: MutableMapping[str, Any],
    where: Mapping[str, tuple[str, str]],
    exported: Iterable[str],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: ``where`` maps each public name to its
    (module, attribute); a name is kept in ``namespace`` once imported, so it is looked up once."""

    def __getattr__(name: str) -> Any:
        found = where.get(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(found[0]), found[1])
        namespace[name] = value
        return value

    names = tuple(exported)

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
