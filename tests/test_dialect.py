"""The dialect data files: the Qwen 3 conventions are data, and a bad value is refused by name."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from hermes_vllm.dialect import _parse, get_dialect


def _qwen_data(**changes: Any) -> dict[str, Any]:
    text = resources.files("hermes_vllm.grammars").joinpath("dialects", "qwen.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    data.update(changes)
    return data


def test_only_qwen_keeps_reasoning_switches_thinking_and_writes_bare_responses() -> None:
    conventions = {
        name: (d.reasoning_history, d.thinking_switch, d.response_payload)
        for name in ("hermes", "qwen", "chatml-brackets")
        for d in [get_dialect(name)]
    }
    assert conventions == {
        "hermes": ("dropped", False, "named"),
        "qwen": ("after_last_query", True, "bare"),
        "chatml-brackets": ("dropped", False, "named"),
    }


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"reasoning_history": "always"}, "reasoning_history must be 'dropped' or 'after_last_query'"),
        ({"response_payload": "json"}, "response_payload must be 'named' or 'bare'"),
        ({"thinking_switch": "yes"}, "thinking_switch must be true or false"),
        ({"reasoning": []}, "reasoning_history and thinking_switch need a reasoning span"),
    ],
)
def test_a_bad_convention_is_refused_by_name(changes: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        _parse(_qwen_data(**changes), "qwen.json")
