"""How the core's values become JSON and come back: one definition per shape, one way each.

A value a store keeps or a user reads (a checkpoint, a planned action, a run's usage ...) is a
frozen dataclass whose fields *are* its JSON: camelCase names on the wire, the rare exception
declared beside the field (``OMIT_NONE``, ``OMIT_EMPTY``, an explicit alias, a
``PlainSerializer``). ``JsonValue`` gives every such class the same ``to_json`` and
``from_json``, derived from those fields; nothing is written by hand per class. The constrained
types the fields use are in ``keelgate.core.values``.

Reading is pydantic's (a ``TypeAdapter`` per class). Writing is a function this module derives
from the same declarations, the first time a class is written: a checkpoint is written at every
phase boundary, and pydantic's serialiser walks every nested value of it (the model's history
above all), which made a save of a typical checkpoint about nine times slower than the derived
writer (about 70 against 8 microseconds) and a loop iteration over the memory store about twice
as slow. ``tests/test_json_codec.py`` holds the writer to pydantic's own serialisation of every
class, so the two cannot disagree; a field of a kind the writer does not know is refused when
its class is first written, never written some other way.

The dataclasses stay plain: building one validates nothing (the loop makes several per phase),
only reading JSON does. This module must never change what a stored document says: a
checkpoint's bytes are its format (``core/state.py``), and a change here is a format change there.
Reading is lenient about keys it does not know, as every release before it was.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal, Self, cast

from pydantic import ConfigDict, Field, PlainSerializer, TypeAdapter
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

#: camelCase on the wire, like the manifest and every Kubernetes API; snake_case is accepted too.
WIRE = ConfigDict(
    alias_generator=to_camel,
    validate_by_name=True,
    validate_by_alias=True,
    serialize_by_alias=True,
)

_IS_NONE = functools.partial(operator.is_, None)
#: A field left out of the JSON while it is None (and read back as None when absent).
OMIT_NONE = Field(exclude_if=_IS_NONE)
#: A field left out of the JSON while it is empty or false (and read back as its default).
OMIT_EMPTY = Field(exclude_if=operator.not_)


class JsonValue:
    """Base of the core's frozen dataclasses with a JSON form: ``to_json`` and ``from_json`` are
    the same for every one of them, derived from the fields."""

    __slots__ = ()
    __pydantic_config__: ClassVar[ConfigDict] = WIRE

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "to_json" not in cls.__dict__:
            # Each class derives its own writer, never its parent's (which lacks its fields).
            cls.to_json = JsonValue.to_json  # type: ignore[method-assign]

    def to_json(self) -> dict[str, Any]:
        """The value as JSON-ready data (what a store keeps, what ``--output json`` prints)."""
        cls = type(self)
        writer = _writers.get(cls) or _writer(cls)
        if cls.__dict__.get("to_json") is JsonValue.to_json:
            # From now on the class's own method: one call, not two, on the checkpoint's path.
            setattr(cls, "to_json", writer)  # noqa: B010 - a method replaced on the class
        return writer(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The value a ``to_json`` document describes (pydantic's ``ValidationError`` if it
        does not describe one)."""
        return cast(Self, _adapter(cls).validate_python(data))


_adapters: dict[type, TypeAdapter[Any]] = {}


def _adapter(cls: type) -> TypeAdapter[Any]:
    # Built on first use (a class's schema needs every class it names), then kept: building one
    # costs milliseconds, using one microseconds. Two threads building at once build the same.
    adapter = _adapters.get(cls)
    if adapter is None:
        adapter = _adapters[cls] = TypeAdapter(cls)
    return adapter


_writers: dict[type, Callable[[Any], dict[str, Any]]] = {}


def _writer(cls: type) -> Callable[[Any], dict[str, Any]]:
    """The ``to_json`` of a JsonValue dataclass, generated from its fields (as ``dataclasses``
    generates ``__init__``): one dictionary display, then the fields that may be omitted."""
    hints = typing.get_type_hints(cls, include_extras=True)
    names: dict[str, Any] = {}
    always: list[str] = []
    sometimes: list[str] = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        kind, metadata = _unwrapped(hints[field.name])
        infos = [m for m in metadata if isinstance(m, FieldInfo)]
        serializers = [m for m in metadata if isinstance(m, PlainSerializer)]
        aliases = [
            i.serialization_alias or i.alias for i in infos if i.serialization_alias or i.alias
        ]
        key = aliases[-1] if aliases else to_camel(field.name)
        omits = [i.exclude_if for i in infos if i.exclude_if is not None]
        omit = omits[-1] if omits else None
        where = f"{cls.__qualname__}.{field.name}"
        if serializers:
            names[f"_serialize_{field.name}"] = serializers[-1].func
            value = f"_serialize_{field.name}(self.{field.name})"
        else:
            value = _expression(kind, f"self.{field.name}", where, depth=0)
        if omit is None:
            if sometimes:
                raise TypeError(f"{where}: a field always written follows one that may be omitted")
            always.append(f"{key!r}: {value}")
            continue
        if omit is _IS_NONE:
            test = f"self.{field.name} is not None"
        elif omit is operator.not_:
            test = f"self.{field.name}"
        else:
            names[f"_omit_{field.name}"] = omit
            test = f"not _omit_{field.name}(self.{field.name})"
        sometimes.append(f"    if {test}:\n        out[{key!r}] = {value}")
    body = "\n".join(
        ["def to_json(self):", f"    out = {{{', '.join(always)}}}", *sometimes, "    return out"]
    )
    exec(compile(body, f"<{cls.__qualname__}.to_json>", "exec"), names)
    _writers[cls] = names["to_json"]
    return cast(Callable[[Any], dict[str, Any]], names["to_json"])


def _unwrapped(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    if typing.get_origin(annotation) is Annotated:
        return typing.get_args(annotation)[0], annotation.__metadata__
    return annotation, ()


def _expression(kind: Any, value: str, where: str, *, depth: int) -> str:
    """Python source turning ``value`` (of type ``kind``) into JSON data, the way pydantic's JSON
    mode does for JSON-safe content; ``value`` itself where nothing needs turning."""
    kind, metadata = _unwrapped(kind)
    if any(isinstance(m, PlainSerializer) for m in metadata):
        raise TypeError(f"{where}: a PlainSerializer is only read on a field's own type")
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    item = f"_{depth}"
    if kind is Any or kind in (str, int, float, bool, type(None)) or origin is Literal:
        return value
    if isinstance(kind, type) and issubclass(kind, Enum):
        return f"{value}.value"
    if kind is Decimal:
        return f"str({value})"
    if isinstance(kind, type) and issubclass(kind, JsonValue):
        return f"{value}.to_json()"
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        written = {_expression(a, value, where, depth=depth) for a in options}
        if len(written) != 1:
            raise TypeError(f"{where}: a union of {options} has no single JSON form here")
        (inner,) = written
        return value if inner == value else f"(None if {value} is None else {inner})"
    if origin in (tuple, list, Sequence) and (origin is not tuple or args[1:] == (...,)):
        inner = _expression(args[0] if args else Any, item, where, depth=depth + 1)
        return f"list({value})" if inner == item else f"[{inner} for {item} in {value}]"
    if origin in (dict, Mapping) and (not args or args[0] is str):
        inner = _expression(args[1] if args else Any, item, where, depth=depth + 1)
        if inner == item:
            return f"dict({value})"  # a copy: the caller may change what it is given
        return f"{{_k{depth}: {inner} for _k{depth}, {item} in {value}.items()}}"
    raise TypeError(f"{where}: the writer knows no JSON form for {kind!r}")
