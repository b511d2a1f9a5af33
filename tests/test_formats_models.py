"""Validation of the ToolCall / ToolResponse models: what is refused and how the error reads."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from hermes_vllm.formats.models import HermesToolCall, HermesToolResponse, ToolCall, ToolResponse


def _error(model: type[ToolCall | ToolResponse], **fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        model(**fields)
    assert info.value.error_count() == 1
    return str(info.value)


def test_name_length() -> None:
    assert "name\n  String should have at least 1 character" in _error(ToolCall, name="", arguments={})
    assert "String should have at most 256 characters" in _error(ToolCall, name="f" * 257, arguments={})
    assert ToolCall(name="f" * 256, arguments={}).name == "f" * 256


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"s": {1, 2}},
            "Value error, must be JSON-serialisable (Object of type set is not JSON serializable)",
        ),
        ({"x": float("nan")}, "Value error, must be JSON-serialisable (Out of range float values"),
        ([1, 2], "Input should be a valid dictionary"),
    ],
)
def test_arguments_must_be_a_json_object(arguments: Any, message: str) -> None:
    text = _error(HermesToolCall, name="f", arguments=arguments)
    assert "1 validation error for HermesToolCall\narguments\n" in text
    assert message in text


def test_extra_fields_are_forbidden() -> None:
    assert "id\n  Extra inputs are not permitted" in _error(ToolCall, name="f", arguments={}, id="c1")
    assert "Extra inputs are not permitted" in _error(ToolResponse, name="f", content=1, extra=True)


def test_content_is_any_json_value_but_required() -> None:
    for content in (None, 1, 2.5, "x", [1, {"a": None}], {"k": [True]}):
        assert HermesToolResponse(name="f", content=content).content == content
    assert "content\n  Field required" in _error(ToolResponse, name="f")
    assert "must be JSON-serialisable" in _error(ToolResponse, name="f", content=object())


def test_hermes_models_read_payloads() -> None:
    call = HermesToolCall.from_payload('{"arguments": {"a": "<tool_call>"}, "name": "f"}')
    assert call == HermesToolCall(name="f", arguments={"a": "<tool_call>"})
    assert HermesToolResponse.from_payload("{'name': 'f', 'content': ['ok']}") == HermesToolResponse(
        name="f", content=["ok"]
    )
    with pytest.raises(ValidationError, match="String should have at least 1 character"):
        HermesToolCall.from_payload('{"name": "", "arguments": {}}')


def test_a_response_name_may_be_none_for_bare_dialects_but_never_empty() -> None:
    assert ToolResponse(name=None, content=1).name is None
    assert "name\n  Field required" in _error(ToolResponse, content=1)
    assert "String should have at least 1 character" in _error(ToolResponse, name="", content=1)
