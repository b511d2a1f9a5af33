"""Shapes pydantic writes that engines do not read as written (issue 35).

``dict[Literal[...], V]`` and ``dict[SomeEnum, V]`` are ``propertyNames`` with an ``enum`` of
names: spelled as the object of those optional properties and no other, every engine serves it.
Free names under a bound (``dict[Annotated[str, StringConstraints(max_length=2)], V]``,
``dict[EmailStr, V]``: a ``pattern``, a length or a ``format`` in ``propertyNames``) are served
by xgrammar as written, by llguidance as the ``patternProperties`` entry they mean, by outlines
(a ``format`` only: it has no patterns or lengths) as outlines-core's free-form object with the
format's pattern for each key, and refused under ``propertyNames`` wherever another keyword names
keys beside them.
``Json[T]`` is a string with ``contentMediaType: application/json`` and ``contentSchema``: the
string's ``pattern`` becomes the compact JSON documents of ``T``, which the engines write with a
JSON string's escapes and the budgets finish. Both are judged by the client's own model.
"""

from __future__ import annotations

import json
import re
from enum import Enum, IntEnum, StrEnum
from typing import Annotated, Any, Literal

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, EmailStr, Field, Json, StringConstraints, ValidationError

from hermes_vllm.budget import CallCompleter
from hermes_vllm.dialect import get_dialect
from hermes_vllm.grammar import ToolGrammarCompiler, ToolSchemaError
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
def test_other_names_are_spelled_out_where_finite_and_kept_for_the_engines_elsewhere(
    names: Any, kept: Any
) -> None:
    params = {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": names}
    spec = normalize_tool({"type": "function", "function": {"name": "g", "parameters": params}})
    assert ("propertyNames" in spec.parameters) == (kept is not None)
    check = Draft202012Validator(spec.parameters)
    assert check.is_valid({"a": 1}) == Draft202012Validator(params).is_valid({"a": 1})
    assert check.is_valid({"abc": 1}) == Draft202012Validator(params).is_valid({"abc": 1})


class Named(BaseModel):
    short: dict[Annotated[str, StringConstraints(max_length=2)], int]
    mail: dict[EmailStr, int] = {}


SERVING = ("xgrammar", "llguidance", "auto")
FREE_NAMES: dict[str, tuple[dict[str, Any], dict[str, int], dict[str, int]]] = {
    "pattern": ({"pattern": "^x"}, {"xa": 1, "x": 2}, {"ax": 1}),
    "maxLength": ({"maxLength": 2}, {"ab": 1, "é": 2}, {"abc": 1}),
    "minLength": ({"minLength": 2}, {"ab": 1}, {"a": 1}),
    "format": ({"format": "email"}, {"a@b.co": 1}, {"ab": 1}),
}
"""A names schema, keys it admits and keys it does not."""


@pytest.fixture(scope="module")
def compilers(tokenizer: Any) -> dict[str, ToolGrammarCompiler]:
    return {e: ToolGrammarCompiler(tokenizer, engine=e) for e in (*SERVING, "outlines")}


def _call(arguments: Any) -> str:
    return f'<tool_call>{{"name": "f", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}</tool_call>'


@pytest.mark.parametrize("engine", [*SERVING, "outlines"])
@pytest.mark.parametrize("shape", list(FREE_NAMES))
def test_free_names_are_served_exactly_or_refused_by_name(
    compilers: dict[str, ToolGrammarCompiler], engine: str, shape: str
) -> None:
    names, valid, invalid = FREE_NAMES[shape]
    v = {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": names}
    params = {"type": "object", "properties": {"v": v}, "required": ["v"]}
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    if engine == "outlines" and shape != "format":  # no pattern or length on any string there
        with pytest.raises(
            ToolSchemaError, match=re.escape(f"'{shape}' at parameters/properties/v/propertyNames")
        ):
            compilers[engine].compile([tool])
        return
    grammar = compilers[engine].compile([tool])
    check = Draft202012Validator(params, format_checker=Draft202012Validator.FORMAT_CHECKER)
    for value, admitted in ((valid, True), (invalid, False), ({}, True)):
        assert check.is_valid({"v": value}) == admitted, value
        assert grammar.matcher().accepts_text(_call({"v": value})) == admitted, value


@pytest.mark.parametrize("engine", SERVING)
def test_a_model_keyed_by_bounded_names_gets_only_calls_it_accepts(
    compilers: dict[str, ToolGrammarCompiler], engine: str
) -> None:
    grammar = compilers[engine].compile([_tool(Named)])
    for arguments in ({"short": {"ab": 1}, "mail": {"jo@example.com": 2}}, {"short": {}}):
        assert grammar.matcher().accepts_text(_call(arguments)), arguments
        Named.model_validate(arguments)
    for arguments in ({"short": {"abc": 1}}, {"short": {}, "mail": {"jo": 1}}):
        assert not grammar.matcher().accepts_text(_call(arguments)), arguments
        with pytest.raises(ValidationError):
            Named.model_validate(arguments)


class Codes(BaseModel):
    by_code: dict[Annotated[str, StringConstraints(min_length=2, max_length=3)], int] = Field(min_length=2)
    by_mail: dict[EmailStr, int] = {}


@pytest.mark.parametrize(
    "begun",
    [
        '{"by_code": {',
        '{"by_code": {"x',
        '{"by_code": {"ab": 1, "c',
        '{"by_code": {"ab": 1, "cd": 2}, "by_mail": {"jo',
        '{"by_code": {"ab": 1, "cd": 2}, "by_mail": {"a@b.co": 1, "x@',
    ],
)
def test_the_budget_finishes_keys_as_the_names_allow(begun: str) -> None:
    """An open key is finished, and a needed one chosen, as ``propertyNames`` allows."""
    spec = normalize_tool(_tool(Codes))
    completer = CallCompleter(HERMES, [(spec.name, spec.parameters)])
    text = '<tool_call>{"name": "f", "arguments": ' + begun
    rest = completer.complete(text)
    assert rest is not None, completer.unknown()
    Codes.model_validate(json.loads((text + rest)[len("<tool_call>") : -len("</tool_call>")])["arguments"])


UNSERVED = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "propertyNames": {"pattern": "^a"}},
    {"type": "object", "patternProperties": {"^a": {"type": "integer"}}, "propertyNames": {"maxLength": 2}},
    {"type": "object", "propertyNames": {"anyOf": [{"maxLength": 1}, {"pattern": "^x"}]}},
]


@pytest.mark.parametrize("engine", [*SERVING, "outlines"])
def test_names_beside_other_names_are_refused_under_property_names(
    compilers: dict[str, ToolGrammarCompiler], engine: str
) -> None:
    for v in UNSERVED:
        params = {"type": "object", "properties": {"v": v}, "required": ["v"]}
        with pytest.raises(ToolSchemaError, match=re.escape("'propertyNames' at parameters/properties/v")):
            compilers[engine].compile([{"type": "function", "function": {"name": "f", "parameters": params}}])


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
