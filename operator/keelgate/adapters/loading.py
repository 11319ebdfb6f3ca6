"""Import user code named as ``package.module:attribute``.

It exists so the manifest can name Python models, tools and confirmers by string. A process
that drives runs of many manifests (a Temporal worker) imports each manifest's own code from the
manifest's folder without putting that folder on ``sys.path``: a module found there is loaded
under a package private to the folder (``CallableLoader``), so two folders' ``tools.py`` are two
modules, and neither shadows anything the process imports. It must never execute anything but
the import and attribute lookup it is asked for, and never change ``sys.path``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from keelgate.errors import InputError

#: The private packages' names start with this, then a digest of the folder.
PRIVATE_PREFIX = "_keelgate_code_"
_roots = threading.Lock()


@dataclass(frozen=True)
class CallableLoader:
    """Resolves references from ``folder`` first (a manifest's folder; "" for none), then from
    the process's own path.

    A reference whose top-level module or package is in ``folder`` is imported as
    ``<private package>.<module>``: the private package's path is the folder, so the module and
    what it imports relatively (``from . import helpers``) come from there; an absolute import
    inside it is the process's own (``sys.path``), as for any installed code.
    """

    folder: str = ""

    def load(self, reference: str, *, field: str) -> Any:
        """Resolve ``pkg.module:function``; a bad reference is an InputError naming ``field``."""
        module_name, sep, attribute = reference.partition(":")
        if not sep or not module_name or not attribute:
            raise InputError(field, f"{reference!r} is not of the form 'package.module:function'")
        try:
            module = self._module(module_name)
        except ImportError as error:
            raise InputError(field, self._not_imported(module_name, error)) from None
        except SyntaxError as error:
            # The user's own code: bad input, named by file and line, never "internal error".
            where = f"{error.filename}, line {error.lineno}" if error.filename else module_name
            raise InputError(
                field, f"cannot import {module_name!r}: {where}: {error.msg}"
            ) from None
        except Exception as error:
            # Raised by the module's own code as it was imported: where, in the user's file.
            raise InputError(
                field,
                f"importing {module_name!r} raised {type(error).__name__}: {error}"
                f"{_where_raised(error)}",
            ) from None
        target: Any = module
        for part in attribute.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                raise InputError(field, f"{module_name!r} has no attribute {attribute!r}") from None
        if not callable(target):
            raise InputError(field, f"{reference!r} is not callable")
        return target

    def _not_imported(self, module_name: str, error: ImportError) -> str:
        """Why ``module_name`` could not be imported, and where it was looked for when it is
        the module itself that is missing (not one it imports)."""
        missing = getattr(error, "name", None) or ""
        top = module_name.partition(".")[0]
        if isinstance(error, ModuleNotFoundError) and missing in (module_name, top):
            return (
                f"cannot import {module_name!r}: no module {missing!r} in "
                f"{', '.join(self.searched()) or 'the installed packages'} (nor among the "
                "installed packages); PYTHONPATH adds a folder"
            )
        if isinstance(error, ModuleNotFoundError) and missing:
            return (
                f"cannot import {module_name!r}: it imports {missing!r}, which is not installed "
                "here"
            )
        return f"cannot import {module_name!r}: {error}"

    def searched(self) -> list[str]:
        """The folders a reference is looked for in, first to last: the manifest's folder (if
        any), then the process's path but for Python's own library and installed packages."""
        folders = [os.path.realpath(self.folder)] if self.folder else []
        installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
        for entry in sys.path:
            where = os.path.realpath(entry or os.curdir)
            if not os.path.isdir(where) or where in folders:
                continue
            if os.path.isfile(os.path.join(where, "keelgate", "__init__.py")):
                continue  # Keelgate's own source (an editable install): not where user code is
            if any(where == root or where.startswith(root + os.sep) for root in installed):
                continue
            folders.append(where)
        return folders

    def _module(self, module_name: str) -> ModuleType:
        top = module_name.partition(".")[0]
        folder = self.folder
        found = bool(folder) and os.path.isdir(folder)
        if found and importlib.machinery.PathFinder.find_spec(top, [folder]) is not None:
            return importlib.import_module(f"{_private_package(folder)}.{module_name}")
        return importlib.import_module(module_name)


def _where_raised(error: BaseException) -> str:
    """`` (file, line N)`` of the last frame of ``error``'s traceback that is no part of
    Python's import machinery ("" if none)."""
    import traceback

    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<frozen") and "importlib" not in frame.filename
    ]
    if not frames or frames[-1].filename == __file__:
        return ""
    return f" ({frames[-1].filename}, line {frames[-1].lineno})"


#: References resolved from the process's own path (``sys.path``) only.
FROM_SYS_PATH = CallableLoader()


def load_callable(reference: str, *, field: str) -> Any:
    """Resolve ``pkg.module:function`` from the process's own path (``sys.path``)."""
    return FROM_SYS_PATH.load(reference, field=field)


def _private_package(folder: str) -> str:
    """The name of the package whose one path entry is ``folder``, made on first use. It has no
    code of its own; its modules are the folder's files."""
    where = os.path.realpath(folder)
    name = PRIVATE_PREFIX + hashlib.sha256(where.encode()).hexdigest()[:16]
    with _roots:
        if name not in sys.modules:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [where]
            sys.modules[name] = importlib.util.module_from_spec(spec)
    return name
