"""One bad tool among many: a tool no call can satisfy is left out, and the others stay callable.

The satisfiability decision is checked on hand-written shapes (each empty one has a satisfiable
twin that differs in one keyword), against the JSON-Schema-Test-Suite (a schema it calls empty
has no valid instance there) and on the real BFCL tool; then the turn (what ``tool_choice`` makes
of a left-out tool), the log, the budget reserve, and the compiled grammar of 139 good BFCL tools
and the bad one, on the 32k tokenizer. tests/test_server_unsatisfiable.py sends it over HTTP.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from support.corpus import (
    UNSATISFIABLE_BFCL_TOOL,
    agent_tool_set,
    bfcl_functions,
    load_suite_file,
    suite_files,
)

from hermes_vllm import constraint_args
from hermes_vllm.budget import CallCompleter
from hermes_vllm.constraint import parse_constraint
from hermes_vllm.demo.bfcl import as_openai_tool
from hermes_vllm.dialect import get_dialect
from hermes_vllm.grammar import ToolGrammarCompiler, ToolSchemaError
from hermes_vllm.processor.admission import prepared_turn, validate_request
from hermes_vllm.schema import UnsatisfiableToolError, contradiction, normalize_tool, read_tools
from hermes_vllm.settings import get_limits


def tool(params: Any, name: str = "t") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params}}


def obj(prop: Any) -> dict[str, Any]:
    """An arguments object whose one property ``p`` is required."""
    return {"type": "object", "properties": {"p": prop}, "required": ["p"]}


# (label, empty schema, its satisfiable twin)
SHAPES: list[tuple[str, Any, Any]] = [
    ("array with a string enum", {"type": "array", "enum": ["a"]}, {"type": "array", "enum": ["a", []]}),
    ("const of another type", {"type": "integer", "const": "1"}, {"type": "integer", "const": 1}),
    ("empty enum", {"enum": []}, {"enum": [None]}),
    ("enum filtered by bounds", {"enum": [1, 2], "minimum": 3}, {"enum": [1, 3], "minimum": 3}),
    ("minimum above maximum", {"type": "number", "minimum": 2, "maximum": 1}, {"type": "number", "minimum": 1, "maximum": 1}),
    ("exclusive bounds meet", {"type": "number", "exclusiveMinimum": 1, "maximum": 1}, {"type": "number", "exclusiveMinimum": 1, "maximum": 1.5}),
    ("no integer between", {"type": "integer", "minimum": 1.2, "maximum": 1.8}, {"type": "number", "minimum": 1.2, "maximum": 1.8}),
    ("minLength above maxLength", {"type": "string", "minLength": 3, "maxLength": 2}, {"type": "string", "minLength": 2, "maxLength": 2}),
    ("minItems above maxItems", {"type": "array", "minItems": 2, "maxItems": 1}, {"type": "array", "minItems": 1, "maxItems": 1}),
    ("a needed item admits nothing", {"type": "array", "items": {"enum": []}, "minItems": 1}, {"type": "array", "items": {"enum": []}}),
    ("a needed prefix item is false", {"type": "array", "prefixItems": [False], "minItems": 1}, {"type": "array", "prefixItems": [False]}),
    ("contains nothing", {"type": "array", "contains": False}, {"type": "array", "contains": False, "minContains": 0}),
    ("required property admits nothing", obj({"type": "string", "enum": [1]}), {"type": "object", "properties": {"p": {"type": "string", "enum": [1]}}}),
    ("required but closed out", {"type": "object", "required": ["q"], "additionalProperties": False}, {"type": "object", "required": ["q"]}),
    ("more required than maxProperties", {"type": "object", "required": ["a", "b"], "maxProperties": 1}, {"type": "object", "required": ["a"], "maxProperties": 1}),
    ("required name not allowed", {"type": "object", "required": ["ab"], "propertyNames": {"maxLength": 1}}, {"type": "object", "required": ["a"], "propertyNames": {"maxLength": 1}}),
    ("every type ruled out", {"type": ["string", "integer"], "minLength": 2, "maxLength": 1, "minimum": 2, "maximum": 1}, {"type": ["string", "integer"], "minLength": 2, "maxLength": 1}),
    ("empty type list", {"type": []}, {"type": ["null"]}),
    ("false", False, True),
    ("not everything", {"not": {"description": "anything"}}, {"not": {"type": "string"}}),
    ("allOf with a false branch", {"allOf": [{"type": "string"}, False]}, {"allOf": [{"type": "string"}, True]}),
    ("anyOf of nothing", {"anyOf": [False, {"enum": []}]}, {"anyOf": [False, {"enum": [1]}]}),
    ("oneOf of nothing", {"oneOf": [False, {"type": "integer", "minimum": 1, "maximum": 0}]}, {"oneOf": [False, {"type": "integer"}]}),
    ("through a reference", {"$ref": "#/$defs/none"}, {"$ref": "#/$defs/some"}),
]  # fmt: skip

DEFS = {"none": {"type": "string", "minLength": 1, "maxLength": 0}, "some": {"type": "string"}}

UNSURE: list[tuple[str, Any]] = [
    ("a pattern no string matches", {"type": "string", "pattern": "(?!)"}),
    ("if/then/else", {"if": True, "then": False}),
    ("multipleOf between bounds", {"type": "integer", "multipleOf": 10, "minimum": 1, "maximum": 9}),
    ("recursion", {"$ref": "#/$defs/loop"}),
    ("a reference inside another resource", {"$id": "https://example.com/inner", "$ref": "#/$defs/none"}),
    (
        "uniqueItems beyond the enum",
        {"type": "array", "items": {"enum": [1]}, "uniqueItems": True, "minItems": 2},
    ),
]
"""Empty schemas the check cannot tell: they count as satisfiable (the tool stays)."""


def _root(prop: Any) -> dict[str, Any]:
    return {**obj(prop), "$defs": {**DEFS, "loop": {"$ref": "#/$defs/loop"}}}


@pytest.mark.parametrize(("label", "empty", "twin"), SHAPES, ids=[s[0] for s in SHAPES])
def test_a_schema_no_value_satisfies_is_told_from_its_twin(label: str, empty: Any, twin: Any) -> None:
    found = contradiction(_root(empty))
    assert found is not None and found.path[:2] in (("properties", "p"), ("$defs", "none")), (label, found)
    assert contradiction(_root(twin)) is None, label


@pytest.mark.parametrize(("label", "schema"), UNSURE, ids=[s[0] for s in UNSURE])
def test_what_the_check_cannot_decide_counts_as_satisfiable(label: str, schema: Any) -> None:
    assert contradiction(_root(schema)) is None


def test_a_property_that_admits_nothing_but_is_optional_leaves_the_tool_satisfiable() -> None:
    assert contradiction({"type": "object", "properties": {"p": False}}) is None
    assert (
        contradiction({"type": ["object", "string"], "required": ["p"], "properties": {"p": False}}) is None
    )


def test_no_suite_schema_called_empty_has_a_valid_instance() -> None:
    """Soundness against the suite: wherever the check finds a contradiction, no instance is valid."""
    called = []
    for path in suite_files():
        for group in load_suite_file(path):
            if contradiction(group["schema"]) is not None:
                called.append(group["description"])
                assert not any(t["valid"] for t in group["tests"]), (path.name, group["description"])
    assert len(called) >= 8, called  # false, not {}, all-false allOf/anyOf/oneOf, a $ref to false


def test_the_bfcl_tool_is_unsatisfiable_and_named_with_its_path() -> None:
    bad = as_openai_tool(bfcl_functions()[UNSATISFIABLE_BFCL_TOOL])
    with pytest.raises(UnsatisfiableToolError) as err:
        normalize_tool(bad)
    assert err.value.tool == UNSATISFIABLE_BFCL_TOOL
    assert err.value.path == "parameters/properties/metrics/enum"
    assert "'metrics' is required" in str(err.value) and "no call can satisfy" in str(err.value)


def test_every_other_bfcl_function_is_satisfiable() -> None:
    functions = bfcl_functions()
    flagged = [n for n, f in functions.items() if contradiction(as_openai_tool(f)["function"]["parameters"])]
    assert flagged == [UNSATISFIABLE_BFCL_TOOL] and len(functions) > 1000


BAD = tool(obj({"type": "integer", "minimum": 3, "maximum": 1}), "bad")
WORSE = tool(obj({"enum": []}), "worse")
GOOD = tool(obj({"type": "string"}), "good")
MALFORMED = tool({"type": "object", "properties": {"p": {"type": 5}}}, "malformed")


def _prepare(tools: list[Any], choice: Any) -> Any:
    return validate_request(constraint_args(tools, choice), "xgrammar")


def test_tool_choice_decides_whether_a_left_out_tool_is_refused(tokenizer: Any) -> None:
    compiler = ToolGrammarCompiler(tokenizer)
    for choice in ("auto", "required"):
        prepared = compiler.prepare([BAD, GOOD, WORSE], choice)
        assert [t.name for t in prepared.spec.tools] == ["good"], choice
        assert [u.tool for u in prepared.unusable] == ["bad", "worse"]
    assert compiler.prepare([BAD, WORSE], "auto").spec.mode == "none"  # nothing callable, nothing owed
    named = {"type": "function", "function": {"name": "bad"}}
    with pytest.raises(
        ToolSchemaError, match=r"tool 'bad': parameters/properties/p: no integer .* requires a call"
    ):
        _prepare([BAD, GOOD], named)
    with pytest.raises(
        ToolSchemaError, match=r"tool_choice: .*tool 'bad': .*tool 'worse': parameters/properties/p/enum"
    ):
        _prepare([BAD, WORSE], "required")
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [named]}}
    with pytest.raises(ToolSchemaError, match="tool 'bad'"):
        _prepare([BAD, GOOD], allowed)
    with pytest.raises(ToolSchemaError, match="not a valid JSON Schema"):  # malformed: refused as before
        _prepare([MALFORMED, GOOD], "auto")
    with pytest.raises(ToolSchemaError, match="defined more than once"):
        _prepare([BAD, tool(obj({}), "bad")], "auto")


def test_the_budget_reserve_ignores_a_left_out_tool() -> None:
    request = parse_constraint(constraint_args([BAD, GOOD], "required"))
    assert request is not None
    alone = CallCompleter(get_dialect("hermes"), [("good", normalize_tool(GOOD).parameters)])
    assert (
        prepared_turn(request, "xgrammar", get_limits()).needs.completer.shortest_call()
        == alone.shortest_call()
        is not None
    )


def test_left_out_tools_are_logged_once_per_tool_set(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "hermes_vllm.schema.tool")
    tools = [BAD, tool(obj({"type": "number"}), "logged_once")]
    for _ in range(3):
        read_tools(json.loads(json.dumps(tools)))
    read_tools([*tools, GOOD])
    lines = [r.getMessage() for r in caplog.records if "left out of the grammar" in r.getMessage()]
    assert len(lines) == 2 and all("tool 'bad': parameters/properties/p" in line for line in lines), lines


def test_a_grammar_of_139_good_tools_and_a_bad_one_calls_only_the_good_ones(tokenizer: Any) -> None:
    good, bad = agent_tool_set(139)
    compiled = ToolGrammarCompiler(tokenizer).compile([*good[:70], bad, *good[70:]], "required")
    assert len(compiled.spec.tools) == 139 and [u.tool for u in compiled.prepared.unusable] == [
        bad["function"]["name"]
    ]
    for spec, sent in zip(compiled.spec.tools, good, strict=True):
        call = CallCompleter(compiled.spec.dialect, [(spec.name, spec.parameters)]).shortest_call()
        assert call is not None, spec.name
        arguments = json.loads(call[len("<tool_call>") : -len("</tool_call>")])["arguments"]
        Draft202012Validator(sent["function"]["parameters"]).validate(arguments)
        assert compiled.matcher().accepts_text(call), call
    # The closest a call to it comes: every property of the bad tool's schema but the one no value fits.
    for metrics in ([], ["trust"], "trust"):
        arguments = {"targets": ["brand:Nike"], "metrics": metrics}
        text = f'<tool_call>{{"name": "{UNSATISFIABLE_BFCL_TOOL}", "arguments": {json.dumps(arguments)}}}</tool_call>'
        assert not compiled.matcher().accepts_text(text)
    matcher = compiled.matcher()
    head = tokenizer.encode(f'<tool_call>{{"name": "{UNSATISFIABLE_BFCL_TOOL}"', add_special_tokens=False)
    assert not all(matcher.accept_token(t) for t in head), "the bad tool's name must not be writable"
