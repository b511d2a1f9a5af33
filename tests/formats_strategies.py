"""Hypothesis strategies shared by the formats tests (this module holds no tests).

Text is drawn from an alphabet rich in the characters and fragments of every dialect's control
strings, so escaping, scanning and round trips meet tags, near-tags and WORD JOINERs often.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hermes_vllm.dialect import available_dialects, get_dialect
from hermes_vllm.formats.escape import WORD_JOINER
from hermes_vllm.formats.openai import tool_call_id
from hermes_vllm.formats.payload import dump_json, loads_json

DIALECTS = available_dialects()
CONTROL_STRINGS = sorted({s for name in DIALECTS for s in get_dialect(name).control_strings})
TOKENIZER_TOKENS = ["</s>", "<s>", "<unk>", "[INST]", "[/INST]", "<SPECIAL_20>"]
"""Added or special tokens of the shipped tokenizers that no dialect names (``reserve_tokens``)."""
FRAGMENTS = [
    *CONTROL_STRINGS,
    *(s[: len(s) // 2] for s in CONTROL_STRINGS),
    *TOKENIZER_TOKENS,
    WORD_JOINER,
    WORD_JOINER * 2,
    "\n",
    " ",
    "'",
    '"',
    "\\",
    "{",
    "}",
    "it's",
    "True",
    "null",
    "é",
    "日本",
    "😀",
    "\\u003c",
]

texts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet="<|[]/>_ait\u2060", max_size=4)), max_size=10
).map("".join)
"""Arbitrary text, dense in tags, tag fragments and WORD JOINERs."""

nonempty_texts = texts.filter(bool)
names = st.text(alphabet="<|[]/>_abé\u2060", min_size=1, max_size=12)


def json_values_of(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """Any JSON value whose strings and keys are drawn from ``text``."""
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=8,
    )


def tool_lists(name: st.SearchStrategy[str], text: st.SearchStrategy[str]) -> st.SearchStrategy[list[Any]]:
    """One or two OpenAI tool definitions with names from ``name`` and other text from ``text``."""
    return st.lists(
        st.builds(
            lambda name, description, properties: {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {"type": "object", "properties": properties},
                },
            },
            name,
            text,
            st.dictionaries(text, json_values_of(text), max_size=2),
        ),
        min_size=1,
        max_size=2,
    )


json_values = json_values_of(texts)
arguments = st.dictionaries(texts, json_values, max_size=4)
tools = tool_lists(names, texts)


def reads_as_json_non_string(text: str) -> bool:
    try:
        return not isinstance(loads_json(text), str)
    except ValueError:
        return False


tool_results = st.one_of(
    json_values.filter(lambda v: not isinstance(v, str)).map(dump_json),
    texts.filter(lambda s: not reads_as_json_non_string(s)),
)
"""Canonical OpenAI tool-message content: a JSON non-string value as ``dump_json`` writes it, or
any other text (JSON string literals included)."""


@st.composite
def openai_conversations(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A canonical OpenAI conversation in an order ShareGPT accepts, with optional tools."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(nonempty_texts)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(texts)})
        for _ in range(draw(st.integers(0, 2))):
            index = len(messages)
            n_calls = draw(st.integers(1, 3))
            calls = [
                {
                    "id": tool_call_id(index, n),
                    "type": "function",
                    "function": {"name": draw(names), "arguments": dump_json(draw(arguments))},
                }
                for n in range(n_calls)
            ]
            messages.append(
                {"role": "assistant", "content": draw(st.none() | nonempty_texts), "tool_calls": calls}
            )
            for n in range(draw(st.integers(1, n_calls))):
                messages.append(
                    {"role": "tool", "tool_call_id": tool_call_id(index, n), "content": draw(tool_results)}
                )
        if draw(st.booleans()):
            messages.append({"role": "assistant", "content": draw(texts)})
    return messages, draw(st.none() | tools)
