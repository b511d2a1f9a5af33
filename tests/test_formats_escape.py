"""The escaping scheme: reversible for free text, JSON-equivalent for payloads, no control string left."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from formats_strategies import DIALECTS, json_values, texts
from hypothesis import given
from hypothesis import strategies as st

from hermes_vllm.dialect import get_dialect
from hermes_vllm.formats.escape import (
    WORD_JOINER,
    escape_json_text,
    escape_text,
    json_escape_steps,
    text_unescape_steps,
    unescape_text,
)
from hermes_vllm.formats.payload import dump_json

WJ = WORD_JOINER


def _has_control_string(text: str, dialect: str) -> bool:
    return any(p in text for p in get_dialect(dialect).control_strings)


@given(st.sampled_from(DIALECTS), texts)
def test_text_escape_is_reversible_and_leaves_no_control_string(dialect: str, text: str) -> None:
    escaped = escape_text(text, dialect)
    assert not _has_control_string(escaped, dialect)
    assert unescape_text(escaped, dialect) == text


@given(st.sampled_from(DIALECTS), texts)
def test_text_escape_only_adds_word_joiners(dialect: str, text: str) -> None:
    assert escape_text(text, dialect).replace(WJ, "") == text.replace(WJ, "")


@given(st.sampled_from(DIALECTS), json_values)
def test_json_escape_is_json_equivalent_and_leaves_no_control_string(dialect: str, value: Any) -> None:
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


def test_text_escape_is_per_dialect() -> None:
    assert escape_text("[tool_call]", "hermes") == "[tool_call]"
    assert escape_text("[tool_call]", "chatml-brackets") == f"[{WJ}tool_call]"
    assert escape_text("<|im_end|>", "chatml-brackets") == f"<{WJ}|im_end|>"


def test_json_escape_examples() -> None:
    assert escape_json_text('{"a": "<tool_call>"}', "hermes") == '{"a": "\\u003ctool_call>"}'
    assert escape_json_text('["[step]"]', "chatml-brackets") == '["\\u005bstep]"]'
    # Structural brackets and a lone '<' are left alone: only control strings are touched.
    assert escape_json_text('[["<", "[x]"]]', "chatml-brackets") == '[["<", "[x]"]]'


def test_decoding_restores_control_strings_before_halving_doubled_joiners() -> None:
    controls = get_dialect("hermes").control_strings
    decode = text_unescape_steps("hermes")
    assert [new for _, new in decode[: len(controls)]] == list(reversed(controls))
    assert all(old.endswith(WJ * 2) and new.endswith(WJ) for old, new in decode[len(controls) :])


def test_a_control_string_that_could_sit_in_a_json_escape_is_refused() -> None:
    hermes = get_dialect("hermes")
    odd = dataclasses.replace(hermes, name="odd", tools=dataclasses.replace(hermes.tools, begin="u_tools"))
    with pytest.raises(ValueError, match="start with a JSON escape character"):
        json_escape_steps(odd)
