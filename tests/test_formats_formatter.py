"""HermesFunctionFormatter and the payload parser the vLLM tool parser shares."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from formats_strategies import DIALECTS, arguments, json_values, names, reads_as_json_non_string, texts
from hypothesis import given
from hypothesis import strategies as st

from hermes_vllm.dialect import get_dialect
from hermes_vllm.formats.formatter import HermesFunctionFormatter
from hermes_vllm.formats.models import HermesToolCall, HermesToolResponse, ToolCall, ToolResponse
from hermes_vllm.formats.payload import parse_call_payload, parse_response_payload

HERMES = HermesFunctionFormatter("hermes")


def test_format_tool_call_writes_the_text_then_the_block() -> None:
    message = HERMES.format_tool_call(
        "Let me check.", "get_weather", {"city": "Zürich", "days": 2, "metric": True}
    )
    assert message == (
        "Let me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2, "metric": true}}\n</tool_call>'
    )
    assert HERMES.format_tool_call("", "f", {}) == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


def test_format_follows_the_dialect_tags() -> None:
    brackets = HermesFunctionFormatter("chatml-brackets")
    assert (
        brackets.format_tool_call("", "f", {"a": None})
        == '[tool_call]\n{"name": "f", "arguments": {"a": null}}\n[/tool_call]'
    )
    assert brackets.format_tool_response("f", [1.5, "x"]) == (
        '[tool_response]\n{"name": "f", "content": [1.5, "x"]}\n[/tool_response]'
    )


def test_format_tool_response_writes_json_with_name_and_content() -> None:
    assert HERMES.format_tool_response("get_weather", {"temp": 22, "sky": "ciel dégagé"}) == (
        '<tool_response>\n{"name": "get_weather", "content": {"temp": 22, "sky": "ciel dégagé"}}\n'
        "</tool_response>"
    )


def test_formatting_escapes_text_and_json() -> None:
    message = HERMES.format_tool_call("see <tool_call>", "f", {"q": "</tool_call>"})
    assert message.count("<tool_call>") == 1 and message.count("</tool_call>") == 1
    [call] = HERMES.extract_tool_calls(message)
    assert call.arguments == {"q": "</tool_call>"}
    assert HERMES.parse_tool_calls(message).content == "see <tool_call>"


def test_several_calls_and_the_text_before_them() -> None:
    message = HERMES.format_tool_calls(
        "Two lookups.", [ToolCall(name="a", arguments={"x": 1}), ToolCall(name="b", arguments={"y": [None]})]
    )
    parsed = HERMES.parse_tool_calls(message)
    assert parsed.content == "Two lookups."
    assert [(c.name, c.arguments) for c in parsed.blocks] == [("a", {"x": 1}), ("b", {"y": [None]})]
    assert parsed.errors == [] and parsed.rest == ""


def test_hermes_2_pro_writes_arguments_first_and_both_orders_read() -> None:
    message = (
        '<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": "get_stock_price"}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_news", "arguments": {"topic": "cars"}}\n</tool_call>'
    )
    calls = HERMES.extract_tool_calls(message)
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_stock_price", {"symbol": "TSLA"}),
        ("get_news", {"topic": "cars"}),
    ]


def test_legacy_python_repr_payloads_are_read() -> None:
    message = (
        "<tool_call>\n{'arguments': {'q': \"it's\", 'exact': True, 'limit': None, 'score': 0.5}, "
        "'name': 'search'}\n</tool_call>"
    )
    [call] = HERMES.extract_tool_calls(message)
    assert call == HermesToolCall(
        name="search", arguments={"q": "it's", "exact": True, "limit": None, "score": 0.5}
    )


def test_a_broken_block_is_skipped_with_a_warning_and_the_others_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    message = (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        "<tool_call>\n{not json at all}\n</tool_call>\n"
        '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "c", "arguments": {"k": "v"}}\n</tool_call>'
    )
    with caplog.at_level(logging.WARNING, logger="hermes_vllm.formats.formatter"):
        parsed = HERMES.parse_tool_calls(message)
    assert [c.name for c in parsed.blocks] == ["a", "c"]
    assert len(parsed.errors) == 2
    assert "neither JSON" in parsed.errors[0]
    assert "String should have at least 1 character" in parsed.errors[1]
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]


def test_an_unclosed_call_is_an_error() -> None:
    parsed = HERMES.parse_tool_calls('Sure.\n<tool_call>\n{"name": "a", "arguments": {}}')
    assert parsed.blocks == [] and parsed.content == "Sure."
    assert parsed.errors == ["block at character 6: the closing tag is missing"]


def test_a_closing_tag_inside_a_json_string_does_not_end_the_call() -> None:
    message = '<tool_call>\n{"name": "echo", "arguments": {"text": "a </tool_call> b"}}\n</tool_call>'
    [call] = HERMES.extract_tool_calls(message)
    assert call.arguments == {"text": "a </tool_call> b"}


def test_a_call_tag_inside_reasoning_is_not_a_call() -> None:
    message = (
        '<think>maybe <tool_call>{"name": "x", "arguments": {}}</tool_call>?</think>\n'
        '<tool_call>\n{"name": "y", "arguments": {}}\n</tool_call>'
    )
    parsed = HERMES.parse_tool_calls(message)
    assert [c.name for c in parsed.blocks] == ["y"]
    assert parsed.content.startswith("<think>maybe <tool_call>")


def test_text_after_the_calls_is_reported_as_rest() -> None:
    parsed = HERMES.parse_tool_calls('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\nDone!\n')
    assert parsed.rest == "Done!"


def test_extract_tool_response() -> None:
    message = HERMES.format_tool_response("f", {"ok": True}) + "\n" + HERMES.format_tool_response("g", None)
    assert HERMES.extract_tool_response(message) == HermesToolResponse(name="f", content={"ok": True})
    assert [r.name for r in HERMES.extract_tool_responses(message)] == ["f", "g"]
    assert HERMES.extract_tool_response("no response here") is None
    legacy = "<tool_response>\n{'name': 'f', 'content': {'it': \"isn't\"}}\n</tool_response>"
    assert HERMES.extract_tool_response(legacy) == HermesToolResponse(name="f", content={"it": "isn't"})


@given(st.sampled_from(DIALECTS), texts, st.lists(st.tuples(names, arguments), max_size=3))
def test_calls_round_trip(dialect: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    formatter = HermesFunctionFormatter(dialect)
    message = formatter.format_tool_calls(content, [ToolCall(name=n, arguments=a) for n, a in calls])
    parsed = formatter.parse_tool_calls(message)
    assert (parsed.content, [(c.name, c.arguments) for c in parsed.blocks]) == (content, calls)
    assert parsed.errors == [] and parsed.rest == ""


NAMED = [d for d in DIALECTS if get_dialect(d).response_payload == "named"]


@given(st.sampled_from(NAMED), st.lists(st.tuples(names, json_values), min_size=1, max_size=3))
def test_responses_round_trip(dialect: str, responses: list[tuple[str, Any]]) -> None:
    formatter = HermesFunctionFormatter(dialect)
    message = formatter.format_tool_responses([ToolResponse(name=n, content=c) for n, c in responses])
    assert [(r.name, r.content) for r in formatter.extract_tool_responses(message)] == responses


def test_qwen_responses_are_bare_results() -> None:
    qwen = HermesFunctionFormatter("qwen")
    message = qwen.format_tool_responses(
        [
            ToolResponse(name="f", content={"temp": 22}),
            ToolResponse(name="g", content="sunny </tool_response>"),
        ]
    )
    assert message == (
        '<tool_response>\n{"temp": 22}\n</tool_response>\n'
        "<tool_response>\nsunny <\u2060/tool_response>\n</tool_response>"
    )
    assert qwen.extract_tool_responses(message) == [
        HermesToolResponse(name=None, content={"temp": 22}),
        HermesToolResponse(name=None, content="sunny </tool_response>"),
    ]
    with pytest.raises(ValueError, match="names every tool response"):
        HERMES.format_tool_responses([ToolResponse(name=None, content=1)])


BARE = [d for d in DIALECTS if get_dialect(d).response_payload == "bare"]
results = json_values.filter(lambda v: not (isinstance(v, str) and reads_as_json_non_string(v)))


@given(st.sampled_from(BARE), st.lists(results, min_size=1, max_size=3))
def test_bare_responses_round_trip_their_results(dialect: str, contents: list[Any]) -> None:
    """A bare result has no name; text reading as JSON that is no string would come back as that value."""
    formatter = HermesFunctionFormatter(dialect)
    message = formatter.format_tool_responses([ToolResponse(name="f", content=c) for c in contents])
    assert [(r.name, r.content) for r in formatter.extract_tool_responses(message)] == [
        (None, c) for c in contents
    ]


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ("[1, 2]", "tool call payload must be an object, got list"),
        ('{"name": "f"}', "must have exactly the keys ['name', 'arguments'], got ['name']"),
        ('{"name": "f", "arguments": {}, "id": 1}', "got ['name', 'arguments', 'id']"),
        ('{"name": 3, "arguments": {}}', "tool call 'name' must be a string, got int"),
        ('{"name": "f", "arguments": "{} x"}', "tool call 'arguments' must be an object, got str"),
        ('{"name": "f", "arguments": {"x": NaN}}', "neither JSON"),
        ("{'name': 'f', 'arguments': {}", "neither JSON"),
    ],
)
def test_parse_call_payload_says_what_is_wrong(payload: str, error: str) -> None:
    with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("]", r"\]")):
        parse_call_payload(payload)


def test_parse_payloads_accept_whitespace_and_both_syntaxes() -> None:
    assert parse_call_payload('\n {"arguments": {"a": 1}, "name": "f"} \n') == ("f", {"a": 1})
    # arguments the model serialised itself: decoded once (vLLM's hermes parser after 0.32 does too)
    assert parse_call_payload('{"name": "f", "arguments": "{\\"a\\": 1}"}') == ("f", {"a": 1})
    for text in ('"hello"', '"{a}"', '"{\\"a\\": 1} tail"', '"[1]"'):
        with pytest.raises(ValueError, match="must be an object"):
            parse_call_payload(f'{{"name": "f", "arguments": {text}}}')
    assert parse_call_payload("\n{'name': 'f', 'arguments': {'b': False}}\n") == ("f", {"b": False})
    assert parse_response_payload('{"name": "f", "content": "x"}') == ("f", "x")
