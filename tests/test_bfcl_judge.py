"""The benchmark's verdicts on hand-written replies: BFCL's exact-arguments rules, one by one."""

from __future__ import annotations

import json
from typing import Any

from support.bfcl_judge import ParsedCall, calls_from_text, exact_arguments, judge

SCHEMAS: dict[str, Any] = {
    "area": {
        "type": "object",
        "properties": {
            "base": {"type": "integer"},
            "height": {"type": "number"},
            "unit": {"type": "string"},
        },
        "required": ["base", "height"],
    },
    "weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
AREA = {"area": {"base": [10], "height": [5.0], "unit": ["units", ""]}}
REQUIRED = {name: s["required"] for name, s in SCHEMAS.items()}


def call(name: str, **arguments: Any) -> ParsedCall:
    return ParsedCall(name, json.dumps(arguments))


def exact(*calls: ParsedCall, answers: Any = (AREA,)) -> bool:
    return exact_arguments([(c.name, json.loads(c.arguments)) for c in calls], answers, REQUIRED)


def test_values_among_the_possible_answers_pass_and_others_fail() -> None:
    assert exact(call("area", base=10, height=5))  # an integer where a float is possible
    assert exact(call("area", base=10, height=5.0, unit="Units"))  # strings: case ignored
    assert not exact(call("area", base=10, height=6))
    assert not exact(call("area", base=10.0, height=5))  # a float where only an integer is possible
    assert not exact(call("area", base=10, height=5, unit="cm"))


def test_omissions_and_extras_follow_bfcl() -> None:
    assert not exact(call("area", base=10))  # required height missing
    optional_listed = {"area": {"base": [10], "height": [5.0], "unit": ["units"]}}
    assert not exact(call("area", base=10, height=5), answers=[optional_listed])  # no "": must be given
    assert not exact(call("area", base=10, height=5, colour="red"))  # not in the possible answers


def test_parallel_calls_match_in_any_order_and_one_each() -> None:
    answers = [{"weather": {"city": ["Paris"], "days": [""]}}, {"weather": {"city": ["Rome"], "days": [3]}}]
    assert exact(call("weather", city="Rome", days=3), call("weather", city="paris"), answers=answers)
    assert not exact(call("weather", city="Paris"), call("weather", city="Paris"), answers=answers)
    assert not exact(call("weather", city="Paris"), answers=answers)


def test_nested_objects_and_lists() -> None:
    answers = [{"area": {"base": [10], "height": [5.0], "unit": [{"name": ["cm"], "scale": ["", 1]}]}}]
    schemas = {"area": {**SCHEMAS["area"], "properties": {**SCHEMAS["area"]["properties"], "unit": {}}}}
    verdict = judge([call("area", base=10, height=5, unit={"name": "CM"})], schemas, ["area"], answers)
    assert verdict.exact
    assert not judge([call("area", base=10, height=5, unit={"name": "m"})], schemas, ["area"], answers).exact
    lists = [{"area": {"base": [10], "height": [5.0], "unit": [["a", "b"]]}}]
    assert exact(call("area", base=10, height=5, unit=["A", "b"]), answers=lists)
    assert not exact(call("area", base=10, height=5, unit=["b", "a"]), answers=lists)


def test_judge_separates_parse_validity_tool_and_arguments() -> None:
    assert not judge([], SCHEMAS, ["area"], [AREA]).parsed
    invalid = judge([call("area", base="ten", height=5)], SCHEMAS, ["area"], [AREA])
    assert invalid.parsed and not invalid.valid and invalid.right_tool and "ten" in invalid.problem
    unknown = judge([call("volume", base=1)], SCHEMAS, ["area"], [AREA])
    assert unknown.parsed and not unknown.valid and not unknown.right_tool
    wrong = judge([call("weather", city="Oslo")], SCHEMAS, ["area"], [AREA])
    assert wrong.valid and not wrong.right_tool and not wrong.exact
    close = judge([call("area", base=10, height=4)], SCHEMAS, ["area"], [AREA])
    assert close.valid and close.right_tool and not close.exact and close.problem == "arguments differ"
    assert judge([call("area", base=10, height=5)], SCHEMAS, ["area"], [AREA]).exact


def test_raw_text_calls_are_read_as_a_client_would() -> None:
    text = (
        '<think>area it is</think>\n<tool_call>\n{"name": "area", "arguments": {"base": 10, "height": 5}}\n'
        '</tool_call><tool_call>{"name": "area", "arguments": "base=1"}</tool_call><tool_call>{"name": '
    )
    assert calls_from_text(text) == [ParsedCall("area", '{"base": 10, "height": 5}')]
    assert calls_from_text("the area is 25") == []
