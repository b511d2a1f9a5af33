"""The metaschema screen never passes what jsonschema's 2020-12 check refuses, and passes tools.

``hermes_vllm.schema.metaschema.passes_metaschema`` stands in front of
``Draft202012Validator.check_schema`` (~1 ms a tool, the largest part of preparing a cold
400-tool request): a True must mean the check passes. Held here to jsonschema's verdict over the
JSON-Schema-Test-Suite's schemas, every BFCL function, and each wrong spelling of a keyword's
value placed at the root and inside a property.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from support.corpus import bfcl_functions, load_suite_file, suite_files

from hermes_vllm.schema import ToolSchemaError, bfcl_to_json_schema, normalize_tool
from hermes_vllm.schema.metaschema import passes_metaschema


def _valid(schema: Any) -> bool:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError:
        return False
    return True


def _without_dialect(schema: Any) -> Any:
    """The suite names ``$schema`` at every root (which the screen leaves to jsonschema)."""
    return {k: v for k, v in schema.items() if k != "$schema"} if isinstance(schema, dict) else schema


WRONG = [
    {"type": "strin"}, {"type": []}, {"type": ["string", "string"]}, {"type": 3},
    {"minLength": -1}, {"minLength": 1.5}, {"minLength": True}, {"maxItems": "2"},
    {"maximum": "3"}, {"maximum": True}, {"multipleOf": 0}, {"multipleOf": -2},
    {"required": ["a", "a"]}, {"required": [1]}, {"required": "a"},
    {"pattern": "("}, {"pattern": 1}, {"enum": "a"}, {"properties": []}, {"properties": {"a": 1}},
    {"items": [{}]}, {"anyOf": []}, {"anyOf": {}}, {"allOf": [1]}, {"prefixItems": []},
    {"patternProperties": {"(": {}}}, {"$ref": 1}, {"$defs": {"x": "y"}}, {"definitions": []},
    {"dependentRequired": {"a": [1]}}, {"dependencies": {"a": 3}}, {"uniqueItems": 1},
    {"title": 1}, {"examples": {}}, {"deprecated": "no"}, {"format": 1}, {"not": 1},
    {"$id": "#frag"}, {"$anchor": "1a"}, {"$comment": []},
]  # fmt: skip
RIGHT = [
    {"minItems": 2.0}, {"maxLength": 0}, {"const": {"a": [1]}}, {"enum": []}, {"type": ["null", "string"]},
    {"pattern": "^[a-z]+$"}, {"$ref": "#/$defs/a"}, {"items": False}, {"dependencies": {"a": ["b"]}},
    {"x-vendor": 1}, {"default": None}, {"examples": [1, "a"]},
]  # fmt: skip


def _placed(base: dict[str, Any], keyword: dict[str, Any]) -> list[dict[str, Any]]:
    """``keyword`` at the root of ``base`` and inside its first property."""
    root = {**copy.deepcopy(base), **keyword}
    nested = copy.deepcopy(base)
    props = nested.setdefault("properties", {})
    first = next(iter(props), "p")
    props[first] = {**(props.get(first) or {}), **keyword}
    return [root, nested]


def test_the_screen_never_passes_a_schema_jsonschema_refuses() -> None:
    schemas: list[Any] = [_without_dialect(g["schema"]) for f in suite_files() for g in load_suite_file(f)]
    tools = list(bfcl_functions().values())[::8]
    schemas += [bfcl_to_json_schema(copy.deepcopy(fn.get("parameters", {}))) for fn in tools]
    for base in schemas[-12:]:
        for keyword in WRONG + RIGHT:
            schemas += _placed(base, keyword)
    verdicts = [(passes_metaschema(s), _valid(s)) for s in schemas]
    unsound = [s for s, (fast, real) in zip(schemas, verdicts, strict=True) if fast and not real]
    assert not unsound
    assert sum(real and not fast for fast, real in verdicts) < len(schemas) // 10  # it decides most


def test_the_screen_decides_every_bfcl_tool_and_each_right_spelling() -> None:
    """The point of the screen: the schemas tools send pass it (else jsonschema runs anyway)."""
    params = [
        bfcl_to_json_schema(copy.deepcopy(fn.get("parameters", {}))) for fn in bfcl_functions().values()
    ]
    assert all(passes_metaschema(p) for p in params)
    for keyword in RIGHT:
        for schema in _placed({"type": "object", "properties": {"a": {"type": "string"}}}, keyword):
            assert passes_metaschema(schema) and _valid(schema), schema


@pytest.mark.parametrize("keyword", WRONG, ids=[next(iter(k)) + repr(next(iter(k.values()))) for k in WRONG])
def test_a_wrong_keyword_is_still_refused_with_jsonschemas_words(keyword: dict[str, Any]) -> None:
    params = {"type": "object", "properties": {"a": {"type": "string", **keyword}}}
    if _valid(bfcl_to_json_schema(copy.deepcopy(params))):  # read as BFCL's dialect, or a format
        pytest.skip("valid once read (BFCL types) or unchecked here (no URI library installed)")
    with pytest.raises(ToolSchemaError, match="parameters/properties/a"):
        normalize_tool({"name": "t", "parameters": params})
