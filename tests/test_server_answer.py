"""Tools beside structured outputs over HTTP: every combination is served (HTTP 200) or refused at
admission with a 400 that names it, never a 500; a served reply holds calls or an answer that
parses as its schema, never free text.

A real vLLM server on the tiny random model (hermes dialect, our tool and reasoning parsers) gets
every combination of ``tool_choice`` (auto, required, named, none), what the request asks of its
output (nothing, ``response_format`` ``json_schema`` / ``json_object``, ``structured_outputs``
``json`` / ``regex`` / ``choice``), reasoning (a ``thinking_token_budget`` or none) and streaming,
through the ``openai`` client; and the Responses API with ``text.format``. Before the turn grammar
took the answer in, ``required`` / named beside a ``response_format`` failed every request with
HTTP 500 (the two masks left nothing), and under ``auto`` the schema made every call unreachable.
The random model is biased toward ``"``, ``}``, ``]`` and the call tag (it would never close a
string otherwise); the grammar and the budgets decide the rest: every reply that owes a call or
an answer holds it, whatever ``max_tokens`` cut.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openai import AsyncOpenAI
from support.budget_scenarios import Case, ask, valid_calls
from support.readings import Reply

from hermes_vllm.budget import MARK
from hermes_vllm.constraint import BUDGET_KEY
from hermes_vllm.demo.bias import call_bias
from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
from hermes_vllm.dialect import get_dialect
from hermes_vllm.formats.chat_template import chat_template
from hermes_vllm.formats.token_check import reserve_tokens
from hermes_vllm.testing import tiny_model_path

pytestmark = pytest.mark.server

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [ADD]
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
CHOICES: dict[str, Any] = {
    "auto": "auto",
    "required": "required",
    "named": {"type": "function", "function": {"name": "add"}},
    "none": "none",
}
OUTPUTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "json_schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    },
    "json_object": {"response_format": {"type": "json_object"}},
    "structured json": {"extra_body": {"structured_outputs": {"json": ANSWER}}},
    "structured regex": {"extra_body": {"structured_outputs": {"regex": "[a-z]+"}}},
    "structured choice": {"extra_body": {"structured_outputs": {"choice": ["yes", "no"]}}},
}
REFUSED = {"structured regex", "structured choice"}
"""What the turn grammar cannot take beside tools: refused naming the tool_choice and the
structured output (vLLM has turned a ``choice`` into a ``grammar`` by then, and says so)."""
VLLM_REFUSES = "You can only either use constraints for structured outputs or tools, not both"
"""vLLM's own 400 for a named tool_choice beside ``structured_outputs`` (before any parser)."""
SCHEMA_OF = {"json_schema": ANSWER, "json_object": {"type": "object"}, "structured json": ANSWER}
MAX_TOKENS = 160


@dataclass(frozen=True)
class Combo:
    choice: str
    output: str
    thinking: bool
    stream: bool

    @property
    def name(self) -> str:
        return f"{self.choice}, {self.output}, thinking={self.thinking}, stream={self.stream}"


COMBOS = [Combo(c, o, t, s) for c in CHOICES for o in OUTPUTS for t in (False, True) for s in (False, True)]


def case(combo: Combo, bias: dict[str, float], think: int) -> Case:
    """The request of ``combo``; with reasoning, ``<think>`` pushed too: vLLM's structured output
    starts once reasoning has ended, so a reply must reason for the two grammars to meet."""
    output = OUTPUTS[combo.output]
    if combo.thinking:
        bias = {**bias, str(think): 12.0}
    extra = {**output.get("extra_body", {}), **({"thinking_token_budget": 16} if combo.thinking else {})}
    kwargs: dict[str, Any] = {
        "tool_choice": CHOICES[combo.choice],
        "max_tokens": MAX_TOKENS,
        "logit_bias": bias,
        "seed": COMBOS.index(combo),
        **{k: v for k, v in output.items() if k != "extra_body"},
        "extra_body": extra,
    }
    return Case(combo.name, TOOLS, kwargs, combo.stream)


def refused(reply: Reply, message: str) -> bool:
    """A 400 at admission saying ``message``: whole replies get the HTTP status, a stream gets
    vLLM's error event with the same message (its response had begun)."""
    kind = reply.error.split(":", 1)[0]
    failed = "Error code: 500" in reply.error or "Internal server error" in reply.error
    return kind in ("BadRequestError", "APIError") and not failed and message in reply.error


def problem(combo: Combo, reply: Reply) -> str | None:
    """What is wrong with a reply to ``combo``; ``None`` when it is what the combination promises."""
    if combo.choice == "named" and combo.output.startswith("structured"):
        return None if refused(reply, VLLM_REFUSES) else f"expected vLLM's 400, got {reply.error or reply}"
    if combo.output in REFUSED:
        named = f"(tool_choice={CHOICES[combo.choice]!r}) together with structured_outputs."
        return (
            None
            if refused(reply, named)
            else f"expected a 400 naming the combination, got {reply.error or reply}"
        )
    if reply.error:
        return f"expected 200, got {reply.error}"
    if valid_calls(reply, TOOLS) is None:
        return f"an invalid call: {reply.calls}"
    if combo.choice in ("required", "named"):
        return None if reply.calls else f"no call: {reply}"
    schema = SCHEMA_OF.get(combo.output)
    if schema is None:
        return None
    if combo.choice == "none" and reply.calls:
        return f"a call under none: {reply.calls}"
    if reply.calls:  # beside them, at most the mark of a call the budget closed
        extra = reply.content.strip() not in ("", MARK.strip())
        return f"free text beside the calls: {reply.content!r}" if extra else None
    try:
        jsonschema.validate(json.loads(reply.content), schema)
    except (ValueError, jsonschema.ValidationError) as err:
        return f"content is not an answer in the schema ({err}): {reply.content!r}"
    return None


SETUPS = {"hermes": ("hermes_vllm", "mistral-v1"), "qwen3": ("hermes_vllm_qwen", "qwen3")}
"""Server -> (parser, tokenizer): the hermes dialect behind our template, and Qwen 3's own template
(there vLLM's reasoning gate lets its JSON grammar run from the first token: before the fix,
``required`` beside a ``response_format`` was HTTP 500 there)."""


@pytest.fixture(scope="module", params=list(SETUPS))
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, Any, Path]]:
    from transformers import AutoTokenizer

    parser, tokenizer_name = SETUPS[request.param]
    model = tiny_model_path(tokenizer_name)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    tmp = tmp_path_factory.mktemp(request.param)
    args = [*CPU_ARGS, "--enable-auto-tool-choice", "--seed", "0", "--max-num-batched-tokens", "16384"]
    args += ["--tool-call-parser", parser, "--reasoning-parser", parser]
    if request.param == "hermes":
        template = tmp / "chat_template.jinja"
        template.write_text(chat_template(reserve_tokens(get_dialect("hermes"), tokenizer)), encoding="utf-8")
        args += ["--chat-template", str(template)]
    log = tmp / "server.log"
    with openai_server(model, args, CPU_ENV, log_path=log) as url:
        yield url, str(model), tokenizer, log


def test_every_combination_is_served_or_refused_by_name_never_a_500(
    server: tuple[str, str, Any, Path],
) -> None:
    url, model, tokenizer, log = server
    bias = {str(k): v for k, v in call_bias(tokenizer).items()}
    think = tokenizer.convert_tokens_to_ids("<think>")

    async def gather() -> list[Reply]:
        return await asyncio.gather(*(ask(url, model, case(c, bias, think)) for c in COMBOS))

    replies = asyncio.run(gather())
    problems = [f"{c.name}: {p}" for c, r in zip(COMBOS, replies, strict=True) if (p := problem(c, r))]
    assert not problems, "\n".join(problems)
    served = {c.output for c, r in zip(COMBOS, replies, strict=True) if c.choice == "auto" and not r.error}
    assert served == set(OUTPUTS) - set(REFUSED)
    answered = [r for c, r in zip(COMBOS, replies, strict=True) if c.output in SCHEMA_OF and not r.calls]
    assert any(r.finish_reason == "stop" for r in answered), "no answer was finished"
    assert "grammar rejected" not in log.read_text(encoding="utf-8")


NOTE = {
    "type": "function",
    "function": {
        "name": "note",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 8}},
            "required": ["text"],
        },
    },
}
"""A tool whose schema only llguidance enforces well (a bounded string): the auto engine compiles the
turn, its answer included, with llguidance."""


def test_an_answer_beside_tools_that_need_llguidance_is_served_not_refused(
    server: tuple[str, str, Any, Path],
) -> None:
    """Under ``auto`` and ``none``, streamed and whole: HTTP 200, each reply a valid call or an
    answer in its schema (before, the auto engine refused the answer with HTTP 400: it was written
    by xgrammar only)."""
    url, model, tokenizer, log = server
    bias = {str(k): v for k, v in call_bias(tokenizer).items()}
    response_format = OUTPUTS["json_schema"]["response_format"]
    asked = [(c, s) for c in ("auto", "none") for s in (False, True) for _ in range(2)]

    def kwargs(choice: str, seed: int) -> dict[str, Any]:
        return {
            "tool_choice": choice,
            "response_format": response_format,
            "max_tokens": MAX_TOKENS,
            "logit_bias": bias,
            "seed": seed,
        }

    async def gather() -> list[Reply]:
        return await asyncio.gather(
            *(
                ask(url, model, Case(f"{c} {s} {i}", [NOTE], kwargs(c, i), s))
                for i, (c, s) in enumerate(asked)
            )
        )

    problems = []
    for (choice, stream), reply in zip(asked, asyncio.run(gather()), strict=True):
        if reply.error or valid_calls(reply, [NOTE]) is None:
            problems.append(f"{choice}, stream={stream}: {reply.error or reply.calls}")
        elif reply.calls:
            if choice == "none" or reply.content.strip() not in ("", MARK.strip()):
                problems.append(f"{choice}, stream={stream}: {reply}")
        else:
            try:
                jsonschema.validate(json.loads(reply.content), ANSWER)
            except (ValueError, jsonschema.ValidationError) as err:
                problems.append(f"{choice}, stream={stream}: not an answer ({err}): {reply.content!r}")
    assert not problems, "\n".join(problems)
    assert "grammar rejected" not in log.read_text(encoding="utf-8")


async def _responses(url: str, model: str, choice: str, stream: bool, bias: dict[str, float]) -> Any:
    async with AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=900) as client:
        kwargs: dict[str, Any] = {
            "model": model,
            "input": "What is 2 + 3?",
            "tools": [{"type": "function", **ADD["function"]}],
            "tool_choice": choice,
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}},
            "max_output_tokens": MAX_TOKENS,
            "temperature": 1.0,
            "extra_body": {"logit_bias": bias},
        }
        if not stream:
            return await client.responses.create(**kwargs)
        async for event in await client.responses.create(stream=True, **kwargs):
            if event.type in ("response.completed", "response.incomplete"):
                return event.response
        raise AssertionError("the stream ended without its response")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_responses_text_format_beside_tools_gives_calls_or_the_answer_as_output_text(
    server: tuple[str, str, Any, Path], stream: bool
) -> None:
    url, model, tokenizer, _ = server
    bias = {str(k): v for k, v in call_bias(tokenizer).items()}

    async def gather() -> list[Any]:
        choices = ["auto", "none", "required"] * 2
        return await asyncio.gather(*(_responses(url, model, c, stream, bias) for c in choices))

    for response, choice in zip(asyncio.run(gather()), ["auto", "none", "required"] * 2, strict=True):
        calls = [item for item in response.output if item.type == "function_call"]
        if choice == "required":
            assert calls, response
        elif calls:
            assert choice == "auto" and response.output_text.strip() in ("", MARK.strip()), response
        else:
            jsonschema.validate(json.loads(response.output_text), ANSWER)


def agent_bias(tokenizer: Any) -> dict[str, float]:
    """What lets the random model play an agent: strings close (``"``, ``}``, ``]``), an object
    rather than a call where both are allowed, and the turn ends where it may
    (after its calls or its answer; elsewhere the grammar bans the end). Under a named tool_choice
    the grammar allows only the call, so the first turn still calls."""
    bias = {str(i): 8.0 for t, i in tokenizer.get_vocab().items() if any(c in t for c in '"}]')}
    bias.update({str(i): 10.0 for t, i in tokenizer.get_vocab().items() if t.startswith("{")})
    (tag, *_) = tokenizer.encode("<tool_call>", add_special_tokens=False)
    bias[str(tag)] = -10.0
    ends = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    bias.update({str(i): 10.0 for i in ends if isinstance(i, int)})
    return bias


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_an_agents_sdk_agent_calls_its_tool_then_returns_its_typed_output(
    server: tuple[str, str, Any, Path], api: str
) -> None:
    """``Agent(tools=[add], output_type=Sum)`` through ``Runner.run``: the first turn (tool_choice
    naming the tool) calls it, the SDK runs it and sends its result back with ``tool_choice``
    reset to ``auto`` beside the ``response_format`` of ``Sum``, and that turn's answer is the
    typed ``final_output``. On the tiny random model (the trained one takes minutes of CPU to
    train) a reasoning budget of 0 keeps reasoning out and the bias favours the answer's ``{``
    over a second call; the grammar and the budget make the answer whole."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from pydantic import BaseModel

    url, model_name, tokenizer, log = server
    set_tracing_disabled(True)
    ran: list[tuple[int, int]] = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.append((a, b))
        return a + b

    class Sum(BaseModel):
        total: int

    # No reasoning span at all (a turn budget of 0): the random model spells one out of pieces.
    extra = {"logit_bias": agent_bias(tokenizer), "vllm_xargs": {BUDGET_KEY: 0}}

    async def play() -> Any:
        client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=900)
        kind = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
        settings = ModelSettings(
            tool_choice="add",
            max_tokens=300,
            temperature=1.0,
            extra_body=extra,
        )
        agent = Agent(
            name="adder",
            instructions="Add the numbers with the tool, then answer.",
            tools=[add],
            output_type=Sum,
            model=kind(model=model_name, openai_client=client),
            model_settings=settings,
        )
        return await Runner.run(agent, "What is 2 + 3?", max_turns=4)

    result = asyncio.run(play())
    assert ran, "the agent never ran its tool"
    assert isinstance(result.final_output, Sum), result.final_output
    assert "ending a constrained request" not in log.read_text(encoding="utf-8")
