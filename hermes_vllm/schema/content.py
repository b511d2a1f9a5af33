"""A string holding a JSON document: ``contentMediaType: application/json`` with ``contentSchema``.

JSON Schema 2020-12 makes both annotations, which validators do not assert, but clients do:
pydantic writes ``Json[list[int]]`` so and its model parses the string and validates the
document, so an empty string (what an engine that drops annotations lets through) is rejected.
:func:`json_content_patterns` spells the content schema as the string's ``pattern``: a regex of
the compact JSON documents valid against it. Every engine that enforces ``pattern`` then writes
the document, with the escapes a JSON string needs (a quote inside it is ``\\"``), and the budgets
finish it as any patterned string. The regex admits compact documents only (no whitespace),
which are valid ones, so the rewrite never admits a document the client rejects. A content
schema it cannot spell (any JSON, an open object, bounds, recursion) stays an annotation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator

from hermes_vllm.schema.spec import JSON
from hermes_vllm.schema.tree import iter_subschemas, resolve_ref

MAX_REGEX = 4000
"""Longest content regex written (optional properties double it each)."""
_NOTES = frozenset({"title", "description", "default", "examples", "$comment", "deprecated"})
_SCALARS = {
    "null": "null",
    "boolean": "(?:true|false)",
    "integer": "-?(?:0|[1-9][0-9]*)",
    "number": "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?",
    "string": '"(?:[^"\\\\\\x00-\\x1f]|\\\\["\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4})*"',
}
_DEPTH = 16
_BOUNDED = frozenset({"pattern", "minLength", "maxLength", "format", "enum", "const"})
"""String keywords a content pattern would have to meet as well: the string keeps its annotation."""


class _Unspellable(Exception):
    """A content schema with no regular spelling here."""


def _alt(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _array(schema: Mapping[str, Any], root: JSON, depth: int) -> str:
    if set(schema) - _NOTES - {"type", "items"}:
        raise _Unspellable
    item = _regex(schema.get("items", True), root, depth + 1)
    return f"\\[(?:{item}(?:,{item})*)?\\]"


def _object(schema: Mapping[str, Any], root: JSON, depth: int) -> str:
    if set(schema) - _NOTES - {"type", "properties", "required", "additionalProperties"}:
        raise _Unspellable
    props = schema.get("properties", {})
    required = set(schema.get("required", ()))
    if not props and schema.get("additionalProperties", True) is not False:
        raise _Unspellable  # an open object: keys of any spelling
    fields = [
        (re.escape(json.dumps(k)) + ":" + _regex(v, root, depth + 1), k in required) for k, v in props.items()
    ]
    if required - set(props):
        raise _Unspellable

    def rest(i: int, written: bool) -> str:
        if i == len(fields):
            return ""
        field, needed = fields[i]
        take = ("," if written else "") + field + rest(i + 1, True)
        return take if needed else _alt([take, rest(i + 1, written)])

    return "\\{" + rest(0, False) + "\\}"


def _regex(schema: JSON, root: JSON, depth: int = 0) -> str:
    """The compact JSON documents valid against ``schema``, as a regex."""
    if depth > _DEPTH or not isinstance(schema, dict):
        raise _Unspellable  # recursion, or any JSON (``true``)
    if "$ref" in schema:
        if set(schema) - _NOTES - {"$ref"}:
            raise _Unspellable
        try:
            return _regex(resolve_ref(root, schema["$ref"]), root, depth + 1)
        except LookupError:
            raise _Unspellable from None
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if set(schema) - _NOTES - {"const", "enum", "type"} or not isinstance(values, list) or not values:
            raise _Unspellable
        kinds = schema.get("type")
        if kinds is not None and not isinstance(kinds, str | list):
            raise _Unspellable
        return _alt([re.escape(json.dumps(v, separators=(",", ":"))) for v in values if _typed(v, kinds)])
    if "anyOf" in schema:
        if set(schema) - _NOTES - {"anyOf"}:
            raise _Unspellable
        return _alt([_regex(branch, root, depth + 1) for branch in schema["anyOf"]])
    kinds = schema.get("type")
    if not isinstance(kinds, str):
        if not isinstance(kinds, list) or not kinds:
            raise _Unspellable
        return _alt([_regex({**schema, "type": kind}, root, depth) for kind in kinds])
    if kinds == "array":
        return _array(schema, root, depth)
    if kinds == "object":
        return _object(schema, root, depth)
    if kinds not in _SCALARS or set(schema) - _NOTES - {"type"}:
        raise _Unspellable
    return _SCALARS[kinds]


def _typed(value: Any, kinds: Any) -> bool:
    if kinds is None:
        return True
    return bool(Draft202012Validator({"type": kinds}).is_valid(value))


def content_regex(schema: JSON, root: JSON) -> str | None:
    """The anchored regex of the compact JSON documents valid against ``schema``; ``None`` where
    it has no regular spelling here or would be longer than :data:`MAX_REGEX`."""
    try:
        regex = _regex(schema, root)
    except (_Unspellable, RecursionError):
        return None
    return f"^{regex}$" if len(regex) <= MAX_REGEX else None


def json_content_patterns(schema: JSON) -> None:
    """Give each string holding a JSON document of a spellable ``contentSchema`` that document's
    regex as its ``pattern`` (in place), where it has no other string bound to meet."""
    for _, sub in iter_subschemas(schema):
        if sub.get("contentMediaType") != "application/json" or "contentSchema" not in sub:
            continue
        if (
            sub.get("type") != "string"
            or {"pattern", "minLength", "maxLength", "format", "enum", "const"} & sub.keys()
        ):
            continue
        regex = content_regex(sub["contentSchema"], schema)
        if regex is not None:
            sub["pattern"] = regex
