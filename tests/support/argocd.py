"""Argo CD's custom-health runtime, reproduced for tests: a health.lua over an object.

Why it exists: the Lua under ``deploy/argocd/`` is only worth shipping if it runs the way Argo CD
runs it. Argo CD (``util/lua/lua.go``) uses a Lua 5.1 VM (gopher-lua) with only the package,
base and table libraries and a safe ``os`` (time, date, clock): no ``string``, ``math``, ``io``
or ``debug``, and so no string methods either. It sets the object as the global ``obj`` (YAML
nulls are absent keys), runs the script, takes the returned table, and turns a status it does
not know into ``Unknown`` with a fixed message. ``run_health`` does the same with a real Lua 5.1
(lupa's bundled one), so a script that calls ``string.format`` fails here as it fails there.
It must never widen that environment: a script passing here must pass in Argo CD.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from lupa import lua51

VALID = ("Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown")
INVALID_MESSAGE = "Lua returned an invalid health status"  # Argo CD's words


class _Loader(yaml.SafeLoader):
    """YAML as sigs.k8s.io/yaml reads it for Argo CD: timestamps stay strings."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_Loader)  # _Loader is a SafeLoader


_SANDBOX = """
getmetatable("").__index = nil
string, math, io, debug, coroutine = nil, nil, nil, nil, nil
local time, date, clock = os.time, os.date, os.clock
os = {time = time, date = date, clock = clock}
"""


def _to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, Mapping):
        table = runtime.table()
        for key, item in value.items():
            if item is not None:
                table[str(key)] = _to_lua(runtime, item)
        return table
    if isinstance(value, list):
        return runtime.table(*(_to_lua(runtime, item) for item in value))
    if isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"no Lua value for {value!r}")


def run_health(script: str, obj: Mapping[str, Any]) -> dict[str, str]:
    """``{"status": ..., "message": ...}`` as Argo CD computes it for ``obj``."""
    runtime = lua51.LuaRuntime(register_eval=False, register_builtins=False)
    runtime.execute(_SANDBOX)
    runtime.globals().obj = _to_lua(runtime, obj)
    result = runtime.execute(script)
    if lua51.lua_type(result) != "table":
        raise TypeError(f"expect table output from Lua script, not {lua51.lua_type(result)}")
    status, message = result["status"], result["message"]
    if message is not None and not isinstance(message, str):
        raise TypeError(f"hs.message must be a string, not {message!r}")
    if status not in VALID:
        return {"status": "Unknown", "message": INVALID_MESSAGE}
    return {"status": str(status), "message": message or ""}
