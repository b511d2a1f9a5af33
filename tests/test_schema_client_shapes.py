"""Two shapes pydantic writes that engines do not read as written (issue 35).

``dict[Literal[...], V]`` and ``dict[SomeEnum, V]`` are ``propertyNames`` with an ``enum`` of
names: spelled as the object of those optional properties and no other, every engine serves it.
``Json[T]`` is a string with ``contentMediaType: application/json`` and ``contentSchema``: the
string's ``pattern`` becomes the compact JSON documents of ``T``, which the engines write with a
JSON string's escapes and the budgets finish. Both are judged by the client's own model.
"""

from __future__ import annotations

import json
import re
from enum import Enum, IntEnum, StrEnum
from typing import Any, Literal

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Json, ValidationError

from hermes_vllm.budget import CallCompleter
from hermes_vllm.dialect import get_dialect
from hermes_vllm.schema import normalize_tool
from hermes_vllm.schema.content import content_regex

HERMES = get_dialect("hermes")


class Level(Enum):
    low = "low"
    high = "high"


class Shade(StrEnum):
    dark = "dark"


class Rank(IntEnum):
    one = 1


class Keyed(BaseModel):
    by_word: dict[Literal["low", "high"], int]
    by_level: dict[Level, int] = {}
    by_shade: dict[Shade, int] = {}
    by_rank: dict[Rank, int] = {}


class Point(BaseModel):
    x: int
    label: str | None = None


class Documents(BaseModel):
    ids: Json[list[int]]
    point: Json[Point]


def _tool(model: type[BaseModel]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": model.model_json_schema()}}


INSTANCES = [{}, {"low": 1}, {"high": 2, "low": 3}, {"mid": 1}, {"low": "x"}, {"1": 1}, {"dark": 0}]


def test_property_names_of_an_enum_become_a_closed_object_validators_read_alike() -> None:
    sent = Keyed.model_json_schema()
    served = normalize_tool(_tool(Keyed)).parameters
    assert "propertyNames" not in json.dumps(served)
    for field in Keyed.model_fields:
        before, after = Draft202012Validator(sent), Draft202012Validator(served)
        for value in INSTANCES:
            base = {"by_word": {}, field: value}
            assert before.is_valid(base) == after.is_valid(base), (field, value)
    # pydantic writes an integer enum's names as integers, which no key is: the empty object only.
    assert served["properties"]["by_rank"]["properties"] == {}


@pytest.mark.parametrize(
    ("names", "kept"),
    [
        ({"const": "a"}, None),
        ({"maxLength": 2}, "propertyNames"),
        ({"format": "email"}, "propertyNames"),
    ],
)
def test_other_names_are_spelled_where_exact_and_refused_by_name_elsewhere(names: Any, kept: Any) -> None:
    params = {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": names}
    spec = normalize_tool({"type": "function", "function": {"name": "g", "parameters": params}})
    assert ("propertyNames" in spec.parameters) == (kept is not None)
    check = Draft202012Validator(spec.parameters)
    assert check.is_valid({"a": 1}) == Draft202012Validator(params).is_valid({"a": 1})
    assert check.is_valid({"abc": 1}) == Draft202012Validator(params).is_valid({"abc": 1})


def test_a_json_content_schema_is_the_strings_pattern() -> None:
    served = normalize_tool(_tool(Documents)).parameters
    ids = served["properties"]["ids"]["pattern"]
    assert all(re.fullmatch(ids, t) for t in ("[]", "[1,-2,30]"))
    assert not any(re.fullmatch(ids, t) for t in ("", "[1,]", "[01]", '["1"]', "[1.5]"))
    point = content_regex(Documents.model_json_schema()["properties"]["point"]["contentSchema"], served)
    assert point is not None
    for text in ('{"x":1}', '{"x":1,"label":"a \\"b\\""}', '{"x":1,"label":null}'):
        assert re.fullmatch(point, text)
        Point.model_validate_json(text)
    assert not re.fullmatch(point, '{"label":"a"}')
    assert content_regex({"type": "object"}, {}) is None  # any object: no regular spelling


def test_the_budget_finishes_a_json_document_inside_a_string_the_client_accepts() -> None:
    spec = normalize_tool(_tool(Documents))
    completer = CallCompleter(HERMES, [(spec.name, spec.parameters)])
    shortest = completer.shortest_call()
    assert shortest is not None, completer.unknown()
    begun = '<tool_call>{"name": "f", "arguments": {"ids": "[1,2]", "point": "{\\"x\\":3,\\"label\\":\\"q'
    for call in (shortest, begun + (completer.complete(begun) or "")):
        arguments = json.loads(call[len("<tool_call>") : -len("</tool_call>")])["arguments"]
        try:
            Documents.model_validate(arguments)
        except ValidationError as err:  # pragma: no cover - the failure message
            pytest.fail(f"{call}: {err}")
