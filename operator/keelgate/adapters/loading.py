"""Import user code named as ``package.module:attribute``.

It exists so the manifest can name Python models, tools and confirmers by string. It must never
execute anything but the import and attribute lookup it is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from keelgate.errors import InputError


def load_callable(reference: str, *, field: str) -> Any:
    """Resolve ``pkg.module:function``; a bad reference is an InputError naming ``field``."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise InputError(field, f"{reference!r} is not of the form 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InputError(field, f"cannot import {module_name!r}: {error}") from None
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InputError(field, f"{module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise InputError(field, f"{reference!r} is not callable")
    return target
