"""The core's values have one definition each and one JSON form, and a stored checkpoint keeps
its bytes.

Why it exists: every value a store keeps or a user reads is a frozen dataclass whose fields are
its JSON (``keelgate.core.json_codec``). Reading goes through pydantic; writing through a writer
derived from the same fields, for speed. These tests hold the writer to pydantic's own
serialisation of every such class (found by introspection, so a new class cannot escape), prove
that what is written reads back the same, and that checkpoints the previous code stored are
written back byte for byte.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from collections.abc import Mapping, Sequence
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keelgate.core
from keelgate.core.json_codec import JsonValue, _adapter
from keelgate.core.state import RunState, upgraded
from keelgate.core.types import RunStatus, StopReason, StopReasonName
from keelgate.core.values import ACTION_ID

FORMAT_2 = Path(__file__).parent / "data" / "checkpoints-format-2"


def json_value_classes() -> list[type[JsonValue]]:
    for module in pkgutil.walk_packages(keelgate.core.__path__, "keelgate.core."):
        importlib.import_module(module.name)
    found: list[type[JsonValue]] = []
    pending = list(JsonValue.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: cls.__qualname__)


CLASSES = json_value_classes()

JSON_DATA = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def strategy(kind: Any) -> st.SearchStrategy[Any]:
    """Values of ``kind`` (a field's type, its constraints read from Annotated)."""
    metadata: tuple[Any, ...] = ()
    if typing.get_origin(kind) is typing.Annotated:
        kind, metadata = typing.get_args(kind)[0], kind.__metadata__
    patterns = [getattr(m, "pattern", None) for m in metadata]
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    # The bounds a field declares (pydantic keeps them as annotated-types in its metadata).
    bounds = [b for m in metadata for b in (*getattr(m, "metadata", ()), m)]
    low = max((getattr(b, "ge", None) or getattr(b, "gt", None) or 0 for b in bounds), default=0)
    high = min((getattr(b, "le", None) or 10**9 for b in bounds), default=10**9)
    shortest = max((getattr(b, "min_length", None) or 0 for b in bounds), default=0)
    if ACTION_ID in patterns:
        return st.from_regex(ACTION_ID, fullmatch=True)
    if kind is Any:
        return JSON_DATA
    if kind is str:
        return st.text(min_size=shortest, max_size=max(8, shortest))
    if kind is bool:
        return st.booleans()
    if kind is int:
        return st.integers(max(low, 0), min(high, 10**9))
    if kind is float:
        return st.floats(
            max(low, 0.001 if low == 0 and bounds else 0), min(high, 1e6), allow_nan=False
        )
    if kind is Decimal:
        return st.decimals(min_value=0, max_value=10**6, places=4)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return st.sampled_from(list(kind))
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind, include_extras=True)
        return st.builds(
            kind, **{f.name: strategy(hints[f.name]) for f in dataclasses.fields(kind) if f.init}
        )
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, type(int | None)):
        return st.one_of([strategy(a) for a in args])
    if kind is type(None):
        return st.none()
    if origin in (tuple, list, typing.Sequence, Sequence):
        return st.lists(strategy(args[0]), max_size=3).map(tuple)
    if origin in (dict, typing.Mapping, Mapping):
        return st.dictionaries(st.text(max_size=5), strategy(args[1]), max_size=3)
    if origin is frozenset:
        return st.frozensets(strategy(args[0]))
    raise TypeError(f"no strategy for {kind!r}")


def _pydantic_json(value: JsonValue) -> dict[str, Any]:
    written: dict[str, Any] = _adapter(type(value)).dump_python(value, mode="json")
    return written


def _fields(value: JsonValue) -> dict[str, Any]:
    written = value.to_json()
    if isinstance(value, RunState):  # the document's opening: format, tenant, run
        assert list(written)[:3] == ["version", "tenant", "run"]
        written = {k: v for k, v in written.items() if k not in ("version", "tenant", "run")}
    return written


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_value_is_written_as_pydantic_writes_it_and_reads_back_the_same(
    cls: type[JsonValue], data: st.DataObject
) -> None:
    """The derived writer and pydantic's serialiser give the same JSON, key order included;
    what is written reads back as a value that writes the same again."""
    value = data.draw(strategy(cls))
    written = value.to_json()
    assert orjson.dumps(_fields(value)) == orjson.dumps(_pydantic_json(value))
    again = cls.from_json(orjson.loads(orjson.dumps(written)))
    assert orjson.dumps(again.to_json()) == orjson.dumps(written)


@pytest.mark.parametrize("path", sorted(FORMAT_2.glob("*.json")), ids=lambda p: p.stem)
def test_a_checkpoint_the_previous_code_stored_is_written_back_byte_for_byte(path: Path) -> None:
    """Checkpoints of format 2 as the code with hand-written JSON stored them (approval,
    unknown outcome, dollar budget, goal met with an outbox): read and written again, each is
    the text its format's upgrade makes of it (format 3 keeps every decision on an action, so
    an action's one decision becomes a list of one), and nothing else changes."""
    text = path.read_text(encoding="utf-8")
    state = RunState.from_json(orjson.loads(text))
    # The expectation is written out here, not taken from ``upgraded`` (which ``from_json``
    # runs too: comparing with it could not catch a wrong upgrade).
    stored = orjson.loads(text)
    expected = {
        **stored,
        "version": 3,
        "approvals": {a: [decided] for a, decided in (stored.get("approvals") or {}).items()},
    }
    assert orjson.dumps(state.to_json()).decode() == orjson.dumps(expected).decode()
    assert orjson.dumps(dict(upgraded(stored))).decode() == orjson.dumps(expected).decode()


def test_the_stop_reasons_a_status_may_hold_are_the_cores() -> None:
    """StopReasonName is derived from StopReason (and "" before any stop), never re-listed."""
    assert typing.get_args(StopReasonName) == ("", *(reason.value for reason in StopReason))
    schema = RunStatus.model_json_schema(by_alias=True)
    assert schema["properties"]["stopReason"]["enum"] == ["", *(r.value for r in StopReason)]


def test_a_field_the_writer_cannot_write_is_refused_when_its_class_is_first_written() -> None:
    """A set has no JSON order: without a serialiser saying how, the writer refuses the class
    rather than write it some way of its own."""

    @dataclasses.dataclass(frozen=True)
    class Tags(JsonValue):
        tags: frozenset[str] = frozenset()

    with pytest.raises(TypeError, match=r"Tags\.tags: the writer knows no JSON form"):
        Tags(frozenset({"a"})).to_json()
