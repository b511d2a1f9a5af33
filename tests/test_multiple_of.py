"""``multipleOf`` (issue 28, item 2): pydantic's ``conint(multiple_of=...)`` and
``confloat(multiple_of=..., ge=..., le=...)``.

Unbounded, the multiples of an integer are a regular language of decimal strings, which xgrammar
enforces exactly for divisors up to 1024 (``auto`` sends such a turn there); in a bounded range
they are a finite set, spelled as an ``enum`` that every engine enforces, integers and numbers
alike (numbers: the values the client's jsonschema accepts). What neither covers (an unbounded
number multiple) is refused by name.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field
from support.soundness import tool
from support.worst_case import worst_case_arguments

from hermes_vllm.grammar import ToolGrammarCompiler, ToolSchemaError
from hermes_vllm.schema import normalize_tool


class Order(BaseModel):
    """Quantities in packs of 15, and a minute on the quarter hour."""

    quantity: Annotated[int, Field(multiple_of=15)]
    minute: Annotated[int, Field(multiple_of=15, ge=0, lt=60)] = 0


ORDER = {"type": "function", "function": {"name": "order", "parameters": Order.model_json_schema()}}


def call(value: Any) -> str:
    return f'<tool_call>{{"name": "t", "arguments": {json.dumps({"v": value})}}}</tool_call>'


def one_integer(schema: dict[str, Any]) -> dict[str, Any]:
    return tool({"type": "object", "properties": {"v": schema}, "required": ["v"]}, "t")


@pytest.mark.parametrize("engine", ("xgrammar", "auto"))
@pytest.mark.parametrize("divisor", (15, 7, 1024))
def test_unbounded_multiples_are_enforced(tokenizer: Any, engine: str, divisor: int) -> None:
    grammar = ToolGrammarCompiler(tokenizer, engine=engine).compile(
        [one_integer({"type": "integer", "multipleOf": divisor})]
    )
    for n in (0, 1, -1, 2, 123456789):
        assert grammar.matcher().accepts_text(call(n * divisor)), n * divisor
        assert not grammar.matcher().accepts_text(call(n * divisor + 1)), n * divisor + 1


def test_a_bounded_range_of_multiples_is_a_finite_set() -> None:
    spec = normalize_tool(
        one_integer({"type": "integer", "multipleOf": 15, "minimum": -30, "exclusiveMaximum": 60})
    )
    assert spec.parameters["properties"]["v"] == {"enum": [-30, -15, 0, 15, 30, 45]}


@pytest.mark.parametrize("engine", ("llguidance", "outlines"))
def test_every_engine_enforces_a_bounded_range_of_multiples(tokenizer: Any, engine: str) -> None:
    grammar = ToolGrammarCompiler(tokenizer, engine=engine).compile(
        [one_integer({"type": "integer", "multipleOf": 15, "minimum": 0, "maximum": 59})]
    )
    assert [n for n in range(-20, 80) if grammar.matcher().accepts_text(call(n))] == [0, 15, 30, 45]


@pytest.mark.parametrize(
    ("engine", "schema", "words"),
    [
        ("xgrammar", {"type": "integer", "multipleOf": 1025}, "whole divisor from 1 to 1024"),
        ("xgrammar", {"type": "integer", "multipleOf": 15, "minimum": 0, "maximum": 10**6}, "no range"),
        ("xgrammar", {"type": "number", "multipleOf": 0.5}, '"type": "integer"'),
        ("auto", {"type": "integer", "multipleOf": 15, "maximum": 10**6}, "no range"),
        ("llguidance", {"type": "integer", "multipleOf": 15}, "cannot enforce"),
    ],
)
def test_what_no_engine_keeps_is_refused_by_name(
    tokenizer: Any, engine: str, schema: dict[str, Any], words: str
) -> None:
    """Strict coverage names it (xgrammar silently drops these); lenient coverage strips it."""
    compiler = ToolGrammarCompiler(tokenizer, engine=engine)
    with pytest.raises(ToolSchemaError, match=words) as refused:
        compiler.compile([one_integer(schema)])
    assert "'multipleOf' at parameters/properties/v" in str(refused.value)
    assert compiler.prepare([one_integer(schema)], coverage="lenient").needs_validation


def test_auto_refuses_a_multiple_in_a_turn_llguidance_must_compile(tokenizer: Any) -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "multipleOf": 15},
            "e": {"type": "string", "format": "email"},
        },
    }
    with pytest.raises(ValueError, match="needs llguidance"):
        ToolGrammarCompiler(tokenizer, engine="auto").compile([tool(schema, "t")])


def test_worst_case_calls_satisfy_the_clients_own_model(tokenizer: Any) -> None:
    """Every sampler, ``required`` and named, from the reserve up: ``Order.model_validate``
    accepts each call (the tool was refused before)."""
    for arguments in worst_case_arguments(
        tokenizer, ORDER, [("required", 0), ("order", 5), ("required", 30)]
    ):
        Order.model_validate(arguments)


class Rate(BaseModel):
    """Number multiples in a bounded range: stars in halves, a discount in steps of 0.1."""

    stars: Annotated[float, Field(multiple_of=0.5, ge=0, le=5)]
    discount: Annotated[float, Field(multiple_of=0.1, gt=0, lt=1)] = 0.5


RATE = {"type": "function", "function": {"name": "rate", "parameters": Rate.model_json_schema()}}


def test_a_bounded_range_of_number_multiples_is_the_set_the_client_accepts() -> None:
    """Spelled out as the multiples jsonschema accepts too: it divides in binary floating point,
    so 0.3 is no multiple of 0.1 to it, and it is left out (the client would refuse it)."""
    props = normalize_tool(RATE).parameters["properties"]
    assert props["stars"] == {"enum": [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5]}
    assert props["discount"] == {"enum": [0.1, 0.2, 0.4, 0.5, 0.8, 0.9]}
    check = Draft202012Validator({"multipleOf": 0.1})
    assert not check.is_valid(0.3) and not check.is_valid(0.7)


@pytest.mark.parametrize("engine", ("xgrammar", "llguidance", "outlines", "auto"))
def test_every_engine_enforces_a_bounded_range_of_number_multiples(tokenizer: Any, engine: str) -> None:
    grammar = ToolGrammarCompiler(tokenizer, engine=engine).compile(
        [one_integer({"type": "number", "multipleOf": 2.5, "minimum": -5, "exclusiveMaximum": 5})]
    )
    values = [int(x / 4) if x % 4 == 0 else x / 4 for x in range(-40, 41)]  # each in its shortest spelling
    assert [v for v in values if grammar.matcher().accepts_text(call(v))] == [-5, -2.5, 0, 2.5]
    assert not grammar.matcher().accepts_text(call(2.5 + 1e-9))


def test_number_multiples_hold_under_the_worst_case(tokenizer: Any) -> None:
    """Every sampler, ``required`` and named, from the reserve up: ``Rate.model_validate`` and
    jsonschema accept each call (the tool was refused before)."""
    check = Draft202012Validator(Rate.model_json_schema())
    for arguments in worst_case_arguments(tokenizer, RATE, [("required", 0), ("rate", 5), ("required", 30)]):
        Rate.model_validate(arguments)
        check.validate(arguments)
