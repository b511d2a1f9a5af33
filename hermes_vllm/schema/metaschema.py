"""A fast screen in front of jsonschema's 2020-12 metaschema check: the keywords tools use.

``Draft202012Validator.check_schema`` is slow: the 2020-12 metaschema is eight documents joined
by ``$dynamicRef``, and jsonschema resolves a reference (URL joins, registry look-ups) at nearly
every subschema, so a cold many-tool request spent more there than on the rest of its preparation
(docs/architecture.md, "Measurements behind the code"). This screen walks a schema once
and checks, in plain Python, what the metaschema asks of each keyword that tools use (types,
bounds, ``required``, ``enum``, ``pattern`` as a regex, the subschema positions, recursively).

It only ever answers "valid": :func:`passes_metaschema` is True only where the metaschema holds,
and False both where it fails and wherever the screen does not decide (a keyword about identity
or vocabularies such as ``$id``, ``$schema``, ``$anchor``, ``$dynamicRef``, ``$vocabulary``); the
caller then runs jsonschema's own check, which also words the error. So it can make the check
faster, never weaker (``tests/test_schema_metaschema.py`` holds it to jsonschema's verdict).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

_FORMATS = Draft202012Validator.FORMAT_CHECKER
"""The format checker ``check_schema`` uses: ``regex`` and ``uri-reference`` are checked as it does."""

_SIMPLE_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})

_UNDECIDED = frozenset(
    {
        "$id", "$schema", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary",
        "$recursiveAnchor", "$recursiveRef",
    }
)  # fmt: skip
"""Keywords the screen leaves to jsonschema (URIs and anchors with patterns of their own)."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _non_negative_integer(value: Any) -> bool:
    """jsonschema's ``integer`` counts an integral float (``2.0``) as an integer."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (isinstance(value, int) or value.is_integer()) and value >= 0


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _string_array(value: Any) -> bool:
    """``stringArray``: strings, unique (equal strings are equal values)."""
    if not isinstance(value, list):
        return False
    return all(isinstance(v, str) for v in value) and len(set(value)) == len(value)


def _type(value: Any) -> bool:
    if isinstance(value, str):
        return value in _SIMPLE_TYPES
    return (
        isinstance(value, list)
        and len(value) >= 1
        and all(isinstance(v, str) and v in _SIMPLE_TYPES for v in value)
        and len(set(value)) == len(value)
    )


def _regex(value: Any) -> bool:
    return isinstance(value, str) and _FORMATS.conforms(value, "regex")


def _uri_reference(value: Any) -> bool:
    return isinstance(value, str) and _FORMATS.conforms(value, "uri-reference")


def _exclusive_positive(value: Any) -> bool:
    return _number(value) and value > 0


def _any(value: Any) -> bool:
    return True


def _array(value: Any) -> bool:
    return isinstance(value, list)


_COUNTS = (
    "maxLength", "minLength", "maxItems", "minItems", "maxContains", "minContains",
    "maxProperties", "minProperties",
)  # fmt: skip

_VALUES: dict[str, Callable[[Any], bool]] = {
    "$ref": _uri_reference,
    "$comment": _string,
    "type": _type,
    "const": _any,
    "enum": _array,
    "multipleOf": _exclusive_positive,
    **dict.fromkeys(("maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"), _number),
    **dict.fromkeys(_COUNTS, _non_negative_integer),
    "pattern": _regex,
    "uniqueItems": _boolean,
    "required": _string_array,
    "format": _string,
    "title": _string,
    "description": _string,
    "default": _any,
    "deprecated": _boolean,
    "readOnly": _boolean,
    "writeOnly": _boolean,
    "examples": _array,
    "contentEncoding": _string,
    "contentMediaType": _string,
}
"""Keywords whose value is not a schema: what the metaschema asks of it."""

_SUBSCHEMA = frozenset(
    {
        "items", "contains", "additionalProperties", "propertyNames", "if", "then", "else", "not",
        "contentSchema", "unevaluatedItems", "unevaluatedProperties",
    }
)  # fmt: skip
_SCHEMA_ARRAY = frozenset({"prefixItems", "allOf", "anyOf", "oneOf"})
_SCHEMA_MAP = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"})


def passes_metaschema(schema: Any) -> bool:
    """True only if ``schema`` is valid under the 2020-12 metaschema; False where it is not, or
    where this screen does not decide (run jsonschema's check then)."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        check = _VALUES.get(key)
        if check is not None:
            if not check(value):
                return False
        elif key in _SUBSCHEMA:
            if not passes_metaschema(value):
                return False
        elif key in _SCHEMA_ARRAY:
            if not isinstance(value, list) or not value or not all(passes_metaschema(v) for v in value):
                return False
        elif key in _SCHEMA_MAP:
            if not isinstance(value, dict) or not all(passes_metaschema(v) for v in value.values()):
                return False
            if key == "patternProperties" and not all(_regex(k) for k in value):
                return False
        elif key == "dependentRequired":
            if not isinstance(value, dict) or not all(_string_array(v) for v in value.values()):
                return False
        elif key == "dependencies":
            if not isinstance(value, dict):
                return False
            if not all(_string_array(v) or passes_metaschema(v) for v in value.values()):
                return False
        elif key in _UNDECIDED:
            return False
    return True
