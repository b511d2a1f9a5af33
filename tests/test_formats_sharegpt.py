"""ShareGPT conversations: turn-order rules and exact round trips with OpenAI messages."""

from __future__ import annotations

from typing import Any

import pytest
from formats_strategies import DIALECTS, openai_conversations
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hermes_vllm.formats.sharegpt import (
    ShareGPTConversation,
    ShareGPTMessage,
    openai_to_sharegpt,
    sharegpt_to_openai,
)

CALL = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
RESPONSE = '<tool_response>\n{"name": "f", "content": 1}\n</tool_response>'


def _conversation(*turns: tuple[str, str]) -> ShareGPTConversation:
    return ShareGPTConversation.model_validate({"conversations": [{"from": f, "value": v} for f, v in turns]})


def test_message_uses_the_from_alias() -> None:
    message = ShareGPTMessage.model_validate({"from": "gpt", "value": "hi"})
    assert message.from_ == "gpt"
    assert message.model_dump(by_alias=True) == {"from": "gpt", "value": "hi"}
    with pytest.raises(ValidationError, match="Input should be 'system', 'human', 'gpt' or 'tool'"):
        ShareGPTMessage.model_validate({"from": "assistant", "value": "hi"})


def test_valid_orders() -> None:
    _conversation(
        ("system", "s"), ("human", "h"), ("gpt", CALL), ("tool", RESPONSE), ("tool", RESPONSE), ("gpt", "ok")
    )
    _conversation(("human", "h"), ("gpt", "a"), ("human", "h"), ("gpt", "b"))


@pytest.mark.parametrize(
    ("turns", "error"),
    [
        ((("gpt", "a"),), "a conversation starts with a system or human turn, not 'gpt'"),
        ((("tool", RESPONSE),), "a conversation starts with a system or human turn, not 'tool'"),
        ((("system", "s"), ("gpt", "a")), "turn 1: a gpt turn follows a human or tool turn, not 'system'"),
        (
            (("human", "h"), ("gpt", "a"), ("gpt", "b")),
            "turn 2: a gpt turn follows a human or tool turn, not 'gpt'",
        ),
        ((("human", "h"), ("tool", RESPONSE)), "turn 1: a tool turn follows a gpt turn that makes a call"),
        ((("human", "h"), ("gpt", "no call"), ("tool", RESPONSE)), "turn 2: a tool turn follows a gpt turn"),
    ],
)
def test_invalid_orders_are_refused_with_the_turn_named(
    turns: tuple[tuple[str, str], ...], error: str
) -> None:
    with pytest.raises(ValidationError, match=error) as info:
        _conversation(*turns)
    assert "Value error, " in str(info.value)


def test_empty_conversation_is_refused() -> None:
    with pytest.raises(ValidationError, match="List should have at least 1 item"):
        ShareGPTConversation.model_validate({"conversations": []})


def test_calls_are_found_in_the_dialect_of_the_validation_context() -> None:
    brackets = '[tool_call]\n{"name": "f", "arguments": {}}\n[/tool_call]'
    data = {
        "conversations": [
            {"from": "human", "value": "h"},
            {"from": "gpt", "value": brackets},
            {"from": "tool", "value": "r"},
        ]
    }
    ShareGPTConversation.model_validate(data, context={"dialect": "chatml-brackets"})
    with pytest.raises(ValidationError, match="a tool turn follows"):
        ShareGPTConversation.model_validate(data)


def test_a_hermes_function_calling_v1_record_converts() -> None:
    """Python-repr payloads with arguments first, as in NousResearch/hermes-function-calling-v1."""
    conversation = _conversation(
        ("system", "You are a function calling AI model."),
        ("human", "What's Apple's stock price?"),
        (
            "gpt",
            "<tool_call>\n{'arguments': {'symbol': 'AAPL', 'live': True}, "
            "'name': 'get_stock_price'}\n</tool_call>",
        ),
        (
            "tool",
            '<tool_response>\n{"name": "get_stock_price", "content": {"price": 189.5, "note": null}}'
            "\n</tool_response>",
        ),
        ("gpt", "Apple's stock is at $189.50."),
    )
    messages, tools = sharegpt_to_openai(conversation)
    assert tools is None
    assert messages[2]["tool_calls"] == [
        {
            "id": "call_2_0",
            "type": "function",
            "function": {"name": "get_stock_price", "arguments": '{"symbol": "AAPL", "live": true}'},
        }
    ]
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "call_2_0",
        "content": '{"price": 189.5, "note": null}',
    }
    assert messages[4] == {"role": "assistant", "content": "Apple's stock is at $189.50."}


def test_mask_output() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "secret"},
    ]
    conversation = openai_to_sharegpt(messages, mask_output=True)
    assert (
        conversation.conversations[2].value
        == '<tool_response>\n{"name": "f", "content": "[MASKED]"}\n</tool_response>'
    )
    back, _ = sharegpt_to_openai(openai_to_sharegpt(messages), mask_output=True)
    assert back[2]["content"] == "[MASKED]"


def test_an_openai_conversation_in_an_order_sharegpt_refuses() -> None:
    with pytest.raises(ValidationError, match="a conversation starts with a system or human turn"):
        openai_to_sharegpt([{"role": "assistant", "content": "hello"}])


def test_edge_values_round_trip() -> None:
    arguments = {
        "quote": 'it\'s "fine"',
        "yes": True,
        "no": False,
        "none": None,
        "pi": 3.14159,
        "tiny": 1e-300,
        "big": 12345678901234567890,
        "neg0": -0.0,
        "text": "naïve 日本 😀",
        "nested": {"a": [{"b": [None]}]},
    }
    messages = [
        {"role": "system", "content": "It's <|im_end|> time."},
        {"role": "user", "content": "don't </tool_call>"},
        {
            "role": "assistant",
            "content": "Two calls.",
            "tool_calls": [
                {"id": "call_2_0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                {
                    "id": "call_2_1",
                    "type": "function",
                    "function": {"name": "g", "arguments": _dump(arguments)},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_2_0", "content": "None"},
        {"role": "tool", "tool_call_id": "call_2_1", "content": _dump(arguments)},
    ]
    assert sharegpt_to_openai(openai_to_sharegpt(messages)) == (messages, None)


def _dump(value: Any) -> str:
    from hermes_vllm.formats.payload import dump_json

    return dump_json(value)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(DIALECTS), openai_conversations())
def test_round_trips_are_exact(dialect: str, conversation: tuple[list[dict[str, Any]], Any]) -> None:
    messages, tools = conversation
    sharegpt = openai_to_sharegpt(messages, tools, dialect)
    assert sharegpt_to_openai(sharegpt, dialect) == (messages, tools)
    again = openai_to_sharegpt(*sharegpt_to_openai(sharegpt, dialect), dialect)
    assert again == sharegpt
