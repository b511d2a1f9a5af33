"""The demo: how a reply is judged, and what ``make demo`` prints on the real servers."""

from __future__ import annotations

import json
import re

import pytest
from openai.types.chat import ChatCompletionMessage

from hermes_vllm import cli, demo


def _message(*calls: tuple[str, str], content: str | None = None) -> ChatCompletionMessage:
    return ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(calls)
            ],
        }
    )


VALID = ("get_weather", json.dumps({"city": "Paris", "unit": "celsius"}))


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (_message(VALID), ""),
        (_message(content='<tool_call>{"name": "get_weather"'), "no call parsed"),
        (_message(VALID, ("get_weather", '{"city": "Paris", "unit": "kelvin"}')), "schema: 'kelvin' is not"),
        (_message(("get_weather", '"Paris"')), "schema: 'Paris' is not of type 'object'"),
        (_message(("get_weather", '{"city": ')), "arguments not JSON"),
        (_message(("get_time", "{}")), "unknown tool 'get_time'"),
    ],
)
def test_a_reply_is_valid_when_it_holds_calls_and_every_one_validates(
    message: ChatCompletionMessage, problem: str
) -> None:
    found = demo.judge(message, demo.requests(1)[0].schemas)
    assert found.startswith(problem) and (found == "") == (problem == "")


@pytest.mark.server
def test_the_demo_prints_the_side_by_side_table_and_one_reply_per_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["demo", "--random", "--requests", "4", "--max-tokens", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"tiny random-weight model, {demo.DEFAULT_TOKENIZER} tokenizer")
    assert "Logit bias, the same on every server" in lines[0]
    assert lines[0].endswith("nothing toward it under required")  # required calls come from the budget
    assert lines[1].startswith("4 requests per server, 3 tools each, max_tokens 200")
    assert lines[2].split() == ["server", "required", "auto", "valid", "right", "tool"]
    rows = {}
    for server, line in zip(demo.SERVERS, lines[4:7], strict=True):
        assert line.startswith(server.label)
        row = re.fullmatch(r"(\d)/3 +(\d)/1 +(\d)/4 +\d/4", line[len(server.label) :].strip())
        assert row, line
        rows[server.label] = [int(n) for n in row.groups()]
        assert rows[server.label][2] == rows[server.label][0] + rows[server.label][1]
    assert rows[demo.OURS] == [3, 1, 4]
    assert rows["vLLM hermes"][2] < 4, "a random model's unconstrained arguments are not schema-valid"
    examples = lines[8:]
    assert len(examples) == 2 * len(demo.SERVERS)
    for server, head, shown in zip(demo.SERVERS, examples[::2], examples[1::2], strict=True):
        assert re.match(rf"{re.escape(server.label)} \((required|auto)\), (valid|INVALID: .+):$", head)
        assert shown.startswith("  ")


def test_the_trained_model_is_asked_held_out_items_of_several_categories_both_ways() -> None:
    from hermes_vllm.demo.trained_model import held_out_items

    batch = demo.held_out_requests(8)
    held = {json.dumps(i.messages) for i in held_out_items()}
    assert all(json.dumps(r.messages) in held for r in batch)
    assert [r.tool_choice for r in batch] == ["required", "auto"] * 4
    assert len({tuple(r.expected) for r in batch}) == 8
    assert any(len(r.tools) > 1 for r in batch) and any(len(r.expected) > 1 for r in batch)
    assert all(r.expected[0] in r.schemas for r in batch)
