"""The node agent package: a kubelet stand-in that runs pods as local host processes.

Why it exists: see `keelgate_e2e.node.agent`. It is test and development infrastructure for the
local cluster only; it must never be deployed, and product code must never import it.
"""

from __future__ import annotations

from keelgate_e2e.node.pod import kill_container

__all__ = ["kill_container"]
