"""The escaping scheme: reversible for free text, JSON-equivalent for payloads, no control string left."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from formats_strategies import CONTROL_STRINGS, DIALECTS, TOKENIZER_TOKENS, json_values, texts
from hypothesis import given
from hypothesis import strategies as st

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.formats.escape import (
    WORD_JOINER,
    escapable,
    escape_json_text,
    escape_text,
    escaped_strings,
    json_escape_steps,
    text_unescape_steps,
    unescape_text,
)
from hermes_vllm.formats.payload import dump_json

WJ = WORD_JOINER


RESERVING = [dataclasses.replace(get_dialect(name), reserved=tuple(TOKENIZER_TOKENS)) for name in DIALECTS]
"""Each dialect, also escaping tokenizer tokens it does not name (what ``reserve_tokens`` makes)."""


def _has_control_string(text: str, dialect: str | Dialect) -> bool:
    """Any built-in dialect's control string, or one the dialect reserves (a tokenizer's)."""
    return any(p in text for p in (*CONTROL_STRINGS, *get_dialect(dialect).reserved))


@given(st.sampled_from([*DIALECTS, *RESERVING]), texts)
def test_text_escape_is_reversible_and_leaves_no_control_string(dialect: str | Dialect, text: str) -> None:
    escaped = escape_text(text, dialect)
    assert not _has_control_string(escaped, dialect)
    assert unescape_text(escaped, dialect) == text


@given(st.sampled_from([*DIALECTS, *RESERVING]), texts)
def test_text_escape_only_adds_word_joiners(dialect: str | Dialect, text: str) -> None:
    assert escape_text(text, dialect).replace(WJ, "") == text.replace(WJ, "")


@given(st.sampled_from([*DIALECTS, *RESERVING]), json_values)
def test_json_escape_is_json_equivalent_and_leaves_no_control_string(
    dialect: str | Dialect, value: Any
) -> None:
    escaped = escape_json_text(dump_json(value), dialect)
    assert not _has_control_string(escaped, dialect)
    assert json.loads(escaped) == value


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("<|im_start|>system", f"<{WJ}|im_start|>system"),
        ("a</tool_call>b", f"a<{WJ}/tool_call>b"),
        # A WORD JOINER already after a first character is doubled, so decoding cannot eat it.
        (f"<{WJ}|im_start|>", f"<{WJ}{WJ}|im_start|>"),
        (f"<{WJ}", f"<{WJ}{WJ}"),
        (f"x{WJ}y", f"x{WJ}y"),
        ("a < b and [x]", "a < b and [x]"),
    ],
)
def test_text_escape_examples(text: str, escaped: str) -> None:
    assert escape_text(text, "hermes") == escaped
    assert unescape_text(escaped, "hermes") == text


def test_every_dialect_escapes_every_built_in_dialects_tags() -> None:
    """A tokenizer may hold another dialect's tags as single tokens (``<tool_call>`` under brackets)."""
    assert escape_text("[tool_call]", "hermes") == f"[{WJ}tool_call]"
    assert escape_text("<tool_call>", "chatml-brackets") == f"<{WJ}tool_call>"
    assert escape_text("<|im_end|>", "chatml-brackets") == f"<{WJ}|im_end|>"
    assert escape_json_text('["<think>"]', "chatml-brackets") == '["\\u003cthink>"]'
    assert set(CONTROL_STRINGS) <= set(escaped_strings("qwen"))


def test_reserved_strings_are_escaped_where_the_scheme_can_break_them() -> None:
    d = dataclasses.replace(get_dialect("hermes"), reserved=("</s>", "[INST]", "true]"))
    assert escape_text("a</s>[INST]true]", d) == f"a<{WJ}/s>[{WJ}INST]t{WJ}rue]"
    # "true]" may sit in the JSON structure ([true]) and is not touched there; "</s>" only in strings
    assert escape_json_text('[true, "</s>", "[INST]"]', d) == '[true, "\\u003c/s>", "\\u005bINST]"]'
    assert [escapable(s) for s in ("<s>", "[INST]", "x", "aa", "<x<", f"<{WJ}s>")] == [
        True, True, False, False, False, False,
    ]  # fmt: skip


def test_json_escape_examples() -> None:
    assert escape_json_text('{"a": "<tool_call>"}', "hermes") == '{"a": "\\u003ctool_call>"}'
    assert escape_json_text('["[step]"]', "chatml-brackets") == '["\\u005bstep]"]'
    # Structural brackets and a lone '<' are left alone: only control strings are touched.
    assert escape_json_text('[["<", "[x]"]]', "chatml-brackets") == '[["<", "[x]"]]'


def test_decoding_restores_control_strings_before_halving_doubled_joiners() -> None:
    controls = escaped_strings("hermes")
    decode = text_unescape_steps("hermes")
    assert [new for _, new in decode[: len(controls)]] == list(reversed(controls))
    assert all(old.endswith(WJ * 2) and new.endswith(WJ) for old, new in decode[len(controls) :])


def test_a_control_string_that_could_sit_in_a_json_escape_is_refused() -> None:
    hermes = get_dialect("hermes")
    odd = dataclasses.replace(hermes, name="odd", tools=dataclasses.replace(hermes.tools, begin="u_tools"))
    with pytest.raises(ValueError, match="start with a JSON escape character"):
        json_escape_steps(odd)
