"""OpenAI chat messages <-> Hermes ChatML messages: ids by position, exact round trips."""

from __future__ import annotations

from typing import Any

import pytest
from formats_strategies import DIALECTS, openai_conversations
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_vllm.formats.openai import MASK, hermes_to_openai, openai_to_hermes, tool_call_id

CALLS = [
    {"id": "x", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
    {"id": "y", "type": "function", "function": {"name": "time", "arguments": '{"tz": "CET"}'}},
]
PARALLEL = [
    {"role": "user", "content": "Weather and time in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "x", "content": '{"temp": -3}'},
    {"role": "tool", "tool_call_id": "y", "content": "14:02"},
    {"role": "assistant", "content": "Cold, and past two."},
]


def test_parallel_calls_become_one_tool_turn_and_come_back_with_positional_ids() -> None:
    hermes = openai_to_hermes(PARALLEL)
    assert [m["role"] for m in hermes] == ["user", "assistant", "tool", "assistant"]
    assert hermes[2]["content"] == (
        '<tool_response>\n{"name": "weather", "content": {"temp": -3}}\n</tool_response>\n'
        '<tool_response>\n{"name": "time", "content": "14:02"}\n</tool_response>'
    )
    messages, tools = hermes_to_openai(hermes)
    assert tools is None
    assert (
        [c["id"] for c in messages[1]["tool_calls"]]
        == [tool_call_id(1, 0), tool_call_id(1, 1)]
        == ["call_1_0", "call_1_1"]
    )
    assert [(m["tool_call_id"], m["content"]) for m in messages[2:4]] == [
        ("call_1_0", '{"temp": -3}'),
        ("call_1_1", "14:02"),
    ]


def test_responses_out_of_call_order_are_put_in_order_by_id() -> None:
    swapped = [*PARALLEL[:2], PARALLEL[3], PARALLEL[2], PARALLEL[4]]
    assert openai_to_hermes(swapped) == openai_to_hermes(PARALLEL)


def test_responses_without_matching_ids_answer_by_position() -> None:
    anonymous = [*PARALLEL[:2], {"role": "tool", "content": "14:02"}]
    [response] = hermes_to_openai(openai_to_hermes(anonymous))[0][2:]
    assert response == {"role": "tool", "tool_call_id": "call_1_0", "content": "14:02"}
    assert '"name": "weather"' in openai_to_hermes(anonymous)[2]["content"]


@pytest.mark.parametrize("content", ["", '""', '"x"', "x", "12", "null", '{"a": [1, 2.5]}', "[true]"])
def test_tool_content_round_trips_whether_or_not_it_reads_as_json(content: str) -> None:
    messages = [*PARALLEL[:2], {"role": "tool", "tool_call_id": "call_1_0", "content": content}]
    messages[1] = {**messages[1], "tool_calls": [{**CALLS[0], "id": "call_1_0"}]}
    assert hermes_to_openai(openai_to_hermes(messages)) == (messages, None)


def test_mask_output_replaces_tool_results_both_ways() -> None:
    masked = openai_to_hermes(PARALLEL, mask_output=True)
    assert masked[2]["content"].count('"content": "[MASKED]"') == 2
    messages, _ = hermes_to_openai(openai_to_hermes(PARALLEL), mask_output=True)
    assert [m["content"] for m in messages if m["role"] == "tool"] == [MASK, MASK]


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        (
            [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}],
            "1 tool messages answer only 0 calls",
        ),
        (
            [*PARALLEL[:4], {"role": "tool", "tool_call_id": "z", "content": "x"}],
            "3 tool messages answer only 2 calls",
        ),
        ([{"role": "developer", "content": "x"}], "unsupported message role 'developer'"),
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}],
                }
            ],
            "arguments of call 'f' are not JSON",
        ),
    ],
)
def test_openai_messages_that_cannot_convert(messages: list[dict[str, Any]], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        openai_to_hermes(messages)


@pytest.mark.parametrize(
    ("hermes", "error"),
    [
        (
            [
                {"role": "user", "content": "x"},
                {"role": "tool", "content": '<tool_response>\n{"name": "f", "content": 1}\n</tool_response>'},
            ],
            "message 1: 1 responses answer only 0 open calls",
        ),
        (
            [{"role": "assistant", "content": "<tool_call>\n{broken}\n</tool_call>"}],
            "message 0: block at character 0",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nand more',
                }
            ],
            "text after the first call block would be lost: 'and more'",
        ),
        ([{"role": "tool", "content": "plain text"}], "message 0: text before the response blocks"),
    ],
)
def test_hermes_messages_that_cannot_convert(hermes: list[Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        hermes_to_openai(hermes)


def test_tools_travel_in_the_system_turn() -> None:
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    hermes = openai_to_hermes([{"role": "system", "content": "Be brief."}, *PARALLEL], [tool])
    assert hermes[0]["content"].startswith("Be brief.\n\nYou are a function calling AI model.")
    messages, tools = hermes_to_openai(hermes)
    assert tools == [tool] and messages[0] == {"role": "system", "content": "Be brief."}
    messages, tools = hermes_to_openai(openai_to_hermes(PARALLEL, [tool]))
    assert tools == [tool] and messages[0]["role"] == "user"


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(DIALECTS), openai_conversations())
def test_openai_round_trip_is_exact(dialect: str, conversation: tuple[list[dict[str, Any]], Any]) -> None:
    messages, tools = conversation
    assert hermes_to_openai(openai_to_hermes(messages, tools, dialect), dialect) == (messages, tools)
