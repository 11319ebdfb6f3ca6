"""The ``scripted`` provider: answers from a list in the manifest, one entry per planning call.

It exists for demos and tests: its answers depend only on the request's call number, so a run
resumed after a crash gets the same answers. It must never consult anything but its script.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from keelgate.core.model import ModelReply, ModelRequest, reply_from_mapping
from keelgate.errors import ModelError


class ScriptedModel:
    provider = "keelgate.scripted"  # gen_ai.provider.name

    def __init__(self, script: Sequence[Mapping[str, Any]], *, name: str = "scripted") -> None:
        self.script = [dict(entry) for entry in script]
        self.name = name

    def call(self, request: ModelRequest) -> ModelReply:
        if request.call >= len(self.script):
            raise ModelError(
                f"the script has {len(self.script)} entries; planning call "
                f"{request.call + 1} has none"
            )
        entry = self.script[request.call]
        if request.phase == "verify":
            verdict = entry.get("verdict") or {}
            if isinstance(verdict, str):
                verdict = {"verdict": verdict}
            return reply_from_mapping(verdict, phase="verify")
        return reply_from_mapping(entry, phase="plan")
