"""One bad tool among 140, over HTTP: a real vLLM server on the tiny model, the ``openai`` client.

139 distinct BFCL tools and the BFCL tool no call can satisfy, sent as a client sends them, under
``required`` and ``auto``, streamed and whole: the replies hold schema-valid calls to the good
tools, and the server logs the left-out tool once for the tool set. Only a ``tool_choice`` that
needs the bad tool is refused (HTTP 400 naming it and the schema path). Under ``required`` nothing
favours the call tag (the bias is toward ``"``, ``}`` and ``]`` only): the grammar and the budget
reserve bring the call. The prompt leaves the tool list out (a template of the messages only):
140 BFCL tools would not fit the tiny model's 4,096-token context, and what is under test is the
constraint, which comes from the request's ``tools``, not from the prompt.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support.budget_scenarios import Case, ask, closers
from support.corpus import UNSATISFIABLE_BFCL_TOOL, agent_tool_set
from support.readings import Reply

from hermes_vllm.demo.bias import call_bias
from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
from hermes_vllm.testing import tiny_model_path

pytestmark = pytest.mark.server

MESSAGES_ONLY = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GOOD, BAD = agent_tool_set(139)
TOOLS = [*GOOD[:70], BAD, *GOOD[70:]]
ALSO_BAD = {
    "type": "function",
    "function": {
        "name": "also_bad",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 1}},
            "required": ["n"],
        },
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Any, Path]]:
    from transformers import AutoTokenizer

    model = tiny_model_path("mistral-v1")
    folder = tmp_path_factory.mktemp("unsatisfiable")
    template = folder / "messages_only.jinja"
    template.write_text(MESSAGES_ONLY, encoding="utf-8")
    args = [*CPU_ARGS, "--enable-auto-tool-choice", "--seed", "0", "--chat-template", str(template)]
    args += ["--tool-call-parser", "hermes_vllm", "--reasoning-parser", "hermes_vllm"]
    log = folder / "server.log"
    with openai_server(model, args, CPU_ENV, log_path=log) as url:
        yield url, str(model), AutoTokenizer.from_pretrained(str(model)), log


def _invalid(reply: Reply) -> list[str]:
    """What is wrong with a reply's calls: a call to a tool not among the good ones, or off-schema."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in GOOD}
    wrong = []
    for name, arguments in reply.calls:
        try:
            jsonschema.validate(json.loads(arguments), schemas[name])
        except (ValueError, KeyError, jsonschema.ValidationError) as err:
            wrong.append(f"{name}({arguments[:120]}): {type(err).__name__}")
    return wrong


def test_140_tools_with_one_unsatisfiable_get_valid_calls(server: tuple[str, str, Any, Path]) -> None:
    url, model, tokenizer, log = server
    pushed = {str(k): v for k, v in call_bias(tokenizer).items()}
    cases = [
        Case(
            "required",
            TOOLS,
            {"tool_choice": "required", "max_tokens": 400, "logit_bias": closers(tokenizer)},
            s,
        )
        for s in (False, True, False, True)
    ]
    cases += [
        Case("auto", TOOLS, {"max_tokens": 200, "logit_bias": pushed}, s) for s in (False, True, False, True)
    ]

    async def gather() -> list[Reply]:
        return await asyncio.gather(*(ask(url, model, c) for c in cases))

    replies = asyncio.run(gather())
    for case, reply in zip(cases, replies, strict=True):
        assert not reply.error, (case.scenario, reply.error)
        assert not _invalid(reply), (case.scenario, _invalid(reply))
    assert all(r.calls for c, r in zip(cases, replies, strict=True) if c.scenario == "required")
    assert any(r.calls for c, r in zip(cases, replies, strict=True) if c.scenario == "auto")
    logged = [
        line for line in log.read_text(encoding="utf-8").splitlines() if "left out of the grammar" in line
    ]
    assert len(logged) == 1 and UNSATISFIABLE_BFCL_TOOL in logged[0], logged


def test_a_tool_choice_that_needs_only_unsatisfiable_tools_is_refused(
    server: tuple[str, str, Any, Path],
) -> None:
    url, model, _, _ = server
    named = {"type": "function", "function": {"name": UNSATISFIABLE_BFCL_TOOL}}
    cases = [
        Case("named", TOOLS, {"tool_choice": named, "max_tokens": 50}, False),
        Case(
            "required, every tool bad", [BAD, ALSO_BAD], {"tool_choice": "required", "max_tokens": 50}, False
        ),
    ]

    async def gather() -> list[Reply]:
        return await asyncio.gather(*(ask(url, model, c) for c in cases))

    named_reply, required_reply = asyncio.run(gather())
    assert named_reply.error.startswith("BadRequestError"), named_reply
    assert f"tool '{UNSATISFIABLE_BFCL_TOOL}': parameters/properties/metrics/enum" in named_reply.error
    assert "tool_choice requires a call to it" in named_reply.error
    assert required_reply.error.startswith("BadRequestError"), required_reply
    assert "no call can satisfy any tool it allows" in required_reply.error
    assert "tool 'also_bad': parameters/properties/n" in required_reply.error
