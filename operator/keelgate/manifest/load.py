"""Reading manifests: YAML in, a validated model out, or one line naming the field to fix.

Every failure is an ``InputError`` whose ``field`` is the path in the manifest's own spelling
(``spec.tools[1].sideEffect``) and whose message is short and human. YAML is read the way
``kubectl`` reads it: timestamps stay strings and a key given twice is an error, so the file
means the same to ``keelgate run`` as to a cluster. This module must never echo a field's value
in an error except the enum or literal choice that was wrong (values may be secrets or tool
arguments), and never write anything.

A manifest is also refused before it is built if building it would cost far more than reading
it: nesting deeper than any real manifest (PyYAML composes recursively, so depth is stack) and an
alias "bomb", a few lines whose anchors expand to millions of items (as kubectl refuses them).
"""

from __future__ import annotations

import difflib
import functools
import re
import typing
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from keelgate.core.spec import Price
from keelgate.errors import InputError
from keelgate.manifest.agentrun import AgentRun, AgentRunSpec, PricingTable
from keelgate.manifest.base import DNS_LABEL, PATTERN_MEANINGS, format_loc

M = TypeVar("M", bound=BaseModel)
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"
# Levels of nesting allowed in a YAML document. Real manifests use about ten, and tool arguments
# are refused past 64 anyway (with their field's name); composing a level costs PyYAML two Python
# frames, so this stays well inside the interpreter's default limit of 1000 frames.
_MAX_DEPTH = 256
# Nodes a document may stand for once every alias is expanded: the larger of a fixed allowance
# (far above any real manifest, small enough to validate in a moment) and a multiple of the nodes
# actually written. Aliases then cost at most a constant factor over the file's own size, so an
# anchor reused a few times is fine, while eight lines of aliases of aliases (10**8 items) are not.
_MAX_EXPANDED_NODES = 400_000
_MAX_EXPANSION_RATIO = 10


@functools.cache
def _loader() -> type[Any]:
    """Safe YAML, minus implicit timestamps, plus refusal of duplicate keys, of nesting past
    ``_MAX_DEPTH`` and of alias bombs. Made (and PyYAML imported) on first use: a step pod
    validates a spec that is already data, never YAML."""
    import yaml
    from yaml.composer import ComposerError
    from yaml.nodes import MappingNode, Node, SequenceNode

    def children(node: Node) -> list[Node]:
        if isinstance(node, MappingNode):
            return [part for pair in node.value for part in pair]
        if isinstance(node, SequenceNode):
            return list(node.value)
        return []

    class Loader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._depth = 0  # levels open while composing
            self._written = 0  # nodes written out in the document (aliases not counted)

        def compose_node(self, parent: Node | None, index: int) -> Node | None:
            if self.check_event(yaml.AliasEvent):  # a node already composed, met again
                return super().compose_node(parent, index)
            self._written += 1
            if self._depth >= _MAX_DEPTH:
                # Refused here, before the recursion below runs out of stack. The check_event
                # above left the node's first event in current_event: its mark is the place.
                mark = self.current_event.start_mark
                raise ComposerError(None, None, "nested too deeply", mark)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def compose_document(self) -> Node | None:
            node = super().compose_document()
            if node is not None:
                limit = max(_MAX_EXPANDED_NODES, _MAX_EXPANSION_RATIO * self._written)
                self._check_expansion(node, limit)
            return node

        def _check_expansion(self, root: Node, limit: int) -> None:
            """Refuse the graph if, aliases expanded, it stands for more than ``limit`` nodes
            (or for infinitely many: an alias inside its own anchor). Each node's expanded size
            is worked out once from its children's, without recursion and without building
            anything, and the walk stops at the first node over the limit."""
            sizes: dict[int, int] = {}  # id(node) -> nodes it stands for, aliases expanded
            open_: set[int] = set()  # the nodes on the path to the current one
            stack: list[tuple[Node, bool]] = [(root, False)]
            while stack:
                node, children_done = stack.pop()
                if children_done:
                    open_.discard(id(node))
                    size = 1 + sum(sizes[id(child)] for child in children(node))
                    if size > limit:
                        problem = f"too many aliases (more than {limit} nodes once expanded)"
                        raise ComposerError(None, None, problem, node.start_mark)
                    sizes[id(node)] = size
                elif id(node) in open_:
                    problem = "an alias refers to the anchor that contains it"
                    raise ComposerError(None, None, problem, node.start_mark)
                elif id(node) not in sizes:
                    open_.add(id(node))
                    stack.append((node, True))
                    stack.extend((child, False) for child in children(node))

        def construct_mapping(
            self, node: yaml.MappingNode, deep: bool = False
        ) -> dict[Hashable, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    # "<<: *base" (kubectl reads it too): the mapping's own keys may override
                    # the merged ones, so only keys written here can appear twice.
                    continue
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, Hashable) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"the key {key!r} appears twice",
                        key_node.start_mark,
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return Loader


def read_yaml(text: str, *, source: str) -> Any:
    """Parse one YAML document; a syntax error names ``source`` and the line."""
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        problem = error.problem or error.context or "not valid YAML"
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise InputError(source, f"{where}{problem}") from None
    except yaml.YAMLError as error:
        raise InputError(source, f"not valid YAML: {error}") from None
    except RecursionError:
        # _MAX_DEPTH leaves room for an ordinary caller; one already deep in its stack may still
        # run out, and that is the same mistake in the file, not an internal error.
        raise InputError(source, "nested too deeply") from None


def read_source(text_or_path: str | Path) -> tuple[str, str]:
    """(text, source name). A Path, or a one-line string that does not look like YAML, is a
    file; a string with a newline (or a one-line ``{...}``) is the manifest itself."""
    if isinstance(text_or_path, str) and ("\n" in text_or_path or text_or_path.startswith("{")):
        return text_or_path, "manifest"
    path = Path(text_or_path)
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except FileNotFoundError:
        raise InputError(str(path), "no such file") from None
    except IsADirectoryError:
        raise InputError(str(path), "is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise InputError(str(path), f"cannot read: {reason}") from None


def load_agentrun(
    text_or_path: str | Path, *, tenant_default: str = "default", source: str | None = None
) -> AgentRun:
    """Read and validate an AgentRun manifest from YAML text or a file.

    A manifest without ``metadata.namespace`` gets ``tenant_default``.
    """
    text, name = read_source(text_or_path)
    data = read_yaml(text, source=source or name)
    run = parse(AgentRun, data, source=source or name)
    if run.metadata.namespace is None:
        if not _is_label(tenant_default):
            raise InputError("metadata.namespace", PATTERN_MEANINGS[DNS_LABEL])
        run = run.model_copy(
            update={"metadata": run.metadata.model_copy(update={"namespace": tenant_default})}
        )
    return run


def load_pricing(path: str | Path) -> dict[str, Price]:
    """Read a pricing file (``models: {NAME: {inputPerMillionTokens, outputPerMillionTokens}}``);
    any problem is one InputError naming ``--pricing``, the file once, and the entry at fault."""
    name = str(path)
    try:
        text, name = read_source(Path(path))
        data = read_yaml(text, source=name)
        if data is None:
            raise InputError(name, "the file is empty")
        table = parse(PricingTable, data, source=name)
    except InputError as error:
        # Each step names the file as its field, or the entry within it: say the file once.
        where = error.reason if error.field == name else str(error)
        raise InputError("--pricing", f"{name}: {where}") from None
    return table.to_prices()


def load_settings(model: type[M], path: str | Path) -> M:
    """Read a settings file of the platform's (``--notify-config``, ``--step-pod-defaults``)
    as ``model``, from YAML or JSON; an empty file is the model's defaults. Any problem is one
    InputError naming the file and the field."""
    text, name = read_source(Path(path))
    data = read_yaml(text, source=name)
    if data is None:
        return model()
    try:
        return parse(model, data, source=name)
    except InputError as error:
        if error.field == name:
            raise
        raise InputError(name, f"{error.field}: {error.reason}") from None


def parse(model: type[M], data: Any, *, source: str = "manifest", prefix: str = "") -> M:
    """Validate ``data`` (already parsed JSON/YAML) as ``model``, in the manifest's spelling
    only: ``side_effect`` for ``sideEffect`` is an unknown field, as it is to the API server."""
    if data is None:
        raise InputError(source, "the manifest is empty")
    if not isinstance(data, Mapping):
        raise InputError(source, f"must be a mapping of fields, not {_kind(data)}")
    try:
        return model.model_validate(data, by_alias=True, by_name=False)
    except ValidationError as error:
        raise input_error(error, model, prefix=prefix) from None


def spec_from_manifest(manifest: Mapping[str, Any] | None) -> AgentRunSpec:
    """The AgentRunSpec a LoopSpec carries, validated again (it may have come over the wire)."""
    if manifest is None:
        raise InputError("spec", "the run carries no manifest to build a model and tools from")
    return parse(AgentRunSpec, manifest, source="spec", prefix="spec")


def input_error(error: ValidationError, model: type[BaseModel], *, prefix: str = "") -> InputError:
    """The first of ``error``'s problems as one line; the count of the rest in brackets."""
    details = error.errors(include_url=False)
    # A misspelled field also shows up as the real one missing: the typo is what to report.
    first = next((d for d in details if d["type"] == "extra_forbidden"), details[0])
    loc = tuple(first["loc"])
    ctx = first.get("ctx") or {}
    if first["type"] == "keelgate_rule":
        loc = (*loc, *ctx.get("loc", ()))
    field = format_loc(loc)
    if prefix:
        field = f"{prefix}.{field}" if field else prefix
    message = _message(first, model)
    if len(details) > 1:
        message += f" (and {len(details) - 1} more)"
    return InputError(field or model.__name__, message)


def _message(error: ErrorDetails, model: type[BaseModel]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    given = error.get("input")
    if kind == "keelgate_rule":
        return str(ctx["reason"])
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        loc = tuple(error["loc"])
        known = _known_fields(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"unknown field{hint}"
    if kind in ("enum", "literal_error"):
        expected = str(ctx.get("expected", "")).replace("'", "")
        choice = "one of " if " or " in expected else ""
        return f"must be {choice}{expected} (got {_short(given)})"
    if kind == "string_pattern_mismatch":
        return PATTERN_MEANINGS.get(str(ctx.get("pattern")), "has the wrong format")
    simple = {
        "string_type": "must be a string",
        "int_type": "must be a whole number",
        "int_parsing": "must be a whole number",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "bool_type": "must be true or false",
        "bool_parsing": "must be true or false",
        "dict_type": "must be a mapping (key: value)",
        "model_type": "must be a mapping (key: value)",
        "model_attributes_type": "must be a mapping (key: value)",
        "dataclass_type": "must be a mapping (key: value)",
        "list_type": "must be a list",
        "datetime_type": "must be an RFC 3339 time such as '2026-01-31T12:00:00Z'",
        "datetime_parsing": "must be an RFC 3339 time such as '2026-01-31T12:00:00Z'",
        "datetime_from_date_parsing": "must be an RFC 3339 time such as '2026-01-31T12:00:00Z'",
        "finite_number": "must be a finite number",
        "int_from_float": "must be a whole number",
        "decimal_type": "must be a decimal number",
        "decimal_parsing": "must be a decimal number",
        "mapping_type": "must be a mapping (key: value)",
        "iterable_type": "must be a list",
        "tuple_type": "must be a list",
        "set_type": "must be a list",
        "string_unicode": "must be text (UTF-8)",
        "url_type": "must be a URL",
        "url_parsing": "must be a URL",
        "url_scheme": "must be an http:// or https:// URL",
        "json_invalid": "must be valid JSON",
        "none_required": "must be left out",
    }
    if kind in simple:
        return simple[kind]
    if kind == "greater_than":
        return f"must be greater than {ctx.get('gt')}"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}"
    if kind == "less_than":
        return f"must be less than {ctx.get('lt')}"
    if kind == "multiple_of":
        return f"must be a multiple of {ctx.get('multiple_of')}"
    if kind in ("decimal_max_digits", "decimal_whole_digits"):
        return f"must have at most {ctx.get('whole_digits', ctx.get('max_digits'))} digits"
    if kind == "decimal_max_places":
        return f"must have at most {ctx.get('decimal_places')} decimal places"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        expected = str(ctx.get("expected_tags", "")).replace("'", "")
        return f"must name one of {expected}" if expected else "is not one of the known kinds"
    if kind == "string_too_short":
        least = ctx.get("min_length", 1)
        return "must not be empty" if least == 1 else f"must be at least {least} characters"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} item(s)"
    # A kind not worded above: pydantic's words, turned into this module's ("must ...").
    message = str(error["msg"]).removeprefix("Value error, ")
    for theirs, ours in (
        ("Input should be ", "must be "),
        ("Input should have ", "must have "),
        ("Input should ", "must "),
        ("Value should have ", "must have "),
        ("Value should be ", "must be "),
    ):
        if message.startswith(theirs):
            message = ours + message.removeprefix(theirs)
            break
    return message[:1].lower() + message[1:]


def _known_fields(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The wire names of the fields of the model at ``path`` (for "did you mean")."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            return []
        if isinstance(part, int):
            continue
        fields = {(f.alias or name): f for name, f in current.model_fields.items()}
        if part not in fields:
            return []
        current = _inner_model(fields[part].annotation)
    if current is None:
        return []
    return [f.alias or name for name, f in current.model_fields.items()]


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _inner_model(argument)
        if found is not None:
            return found
    return None


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str | int | float | bool) or value is None else ""
    if not text:
        return _kind(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: Any) -> str:
    names = {list: "a list", dict: "a mapping", str: "a string", int: "a number"}
    return names.get(type(value), type(value).__name__)


def _is_label(value: str) -> bool:
    return len(value) <= 63 and re.fullmatch(DNS_LABEL, value) is not None
