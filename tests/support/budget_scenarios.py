"""The token-budget scenarios, sent to a running OpenAI server with the ``openai`` client.

Shared by the server test (ours must pass every one) and ``benchmarks/budget.py`` (the same
scenarios against vLLM's own constraint, in the same run). The model is the random tiny one at
temperature 1 with a bias toward ``"``, ``}`` and ``]`` only, except where a scenario says so:
nothing pushes it toward the call tag. The "tight" budgets leave the model almost no choice (the
budget writes nearly every token); the :data:`MIDDLE` ones leave it 20 tokens past the reserve
and no bias at all.

Every reply is also held to what the budget promises whatever the scenario: the turn's reasoning
within ``thinking_token_budget``, ``usage`` counting the reasoning tokens, and a reply holding a
call the budget closed (:data:`~hermes_vllm.budget.MARK` in its content) reported as
truncated (``finish_reason: "length"``; on the Responses API, ``status: "incomplete"``).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from openai import AsyncOpenAI

from hermes_vllm.budget import MARK
from hermes_vllm.constraint import constraint_args, parse_constraint
from hermes_vllm.demo.bias import call_bias
from hermes_vllm.schema import bfcl_to_json_schema, normalize_tools
from hermes_vllm.testing.adversary import span_token_counts
from hermes_vllm.vocabulary import served_vocabulary
from support.corpus import sample_tool_sets
from support.readings import Reply

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
MESSAGES = [{"role": "user", "content": "Please help."}]
THINKING_BUDGET = 24
CLOSED_THEN_ENDED = "required, tight, the turn's end pushed"
MIDDLE_ROOM = 20
MIDDLE = f"reserve+{MIDDLE_ROOM}, no bias"
"""The budget in the middle: the turn's reserve and 20 tokens, nothing pushing the model anywhere."""


@dataclass(frozen=True)
class Case:
    scenario: str
    tools: list[dict[str, Any]]
    kwargs: dict[str, Any]
    stream: bool
    api: str = "chat"
    """``chat`` (Chat Completions) or ``responses`` (the Responses API)."""


@dataclass
class Outcome:
    """How one scenario went: replies that met its promise, of all."""

    ok: int = 0
    total: int = 0
    closed: int = 0
    """Replies holding a call the budget closed."""
    reasoning: int = 0
    """Reasoning tokens over all replies, as their usage reports them."""
    failures: list[str] = field(default_factory=list)


async def ask(base_url: str, model: str, case: Case) -> Reply:
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=900) as client:
        try:
            if case.api == "responses":
                return await _ask_responses(client, model, case)
            return await _ask_chat(client, model, case)
        except Exception as err:  # an HTTP error is a failed reply, reported as such
            return Reply(None, [], "", "", error=f"{type(err).__name__}: {err}")


def _reasoning_tokens(usage: Any) -> int | None:
    details = getattr(usage, "completion_tokens_details", None) or getattr(
        usage, "output_tokens_details", None
    )
    return None if details is None else details.reasoning_tokens


async def _ask_chat(client: AsyncOpenAI, model: str, case: Case) -> Reply:
    kwargs = {"model": model, "messages": MESSAGES, "temperature": 1.0, "tools": case.tools, **case.kwargs}
    kwargs["extra_body"] = {**kwargs.get("extra_body", {}), "return_token_ids": True}
    if not case.stream:
        response = await client.chat.completions.create(**kwargs)
        choice = response.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        reasoning = getattr(choice.message, "reasoning", None) or ""
        ids = list((choice.model_extra or {}).get("token_ids") or [])
        content = choice.message.content or ""
        used = _reasoning_tokens(response.usage)
        return Reply(choice.finish_reason, calls, content, reasoning, ids, reasoning_tokens=used)
    found: dict[int, list[str]] = {}
    content = reasoning = ""
    finish = None
    token_ids: list[int] = []
    used = None
    stream = await client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    )
    async for chunk in stream:
        if chunk.usage is not None:
            used = _reasoning_tokens(chunk.usage)
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        token_ids += (choice.model_extra or {}).get("token_ids") or []
        content += choice.delta.content or ""
        reasoning += getattr(choice.delta, "reasoning", None) or ""
        for call in choice.delta.tool_calls or []:
            entry = found.setdefault(call.index, ["", ""])
            entry[0] = call.function.name or entry[0]
            entry[1] += call.function.arguments or ""
    calls = [(n, a) for n, a in found.values()]
    return Reply(finish, calls, content, reasoning, token_ids, reasoning_tokens=used)


async def _ask_responses(client: AsyncOpenAI, model: str, case: Case) -> Reply:
    """A Responses API request of the case (its ``finish_reason`` is the response's status)."""
    flat = [{"type": "function", **t["function"]} for t in case.tools]
    choice = case.kwargs["tool_choice"]
    kwargs: dict[str, Any] = {
        "model": model, "input": MESSAGES[0]["content"], "temperature": 1.0, "tools": flat,
        "tool_choice": choice if isinstance(choice, str) else {"type": "function", **choice["function"]},
        "max_output_tokens": case.kwargs["max_tokens"],
        "extra_body": {"logit_bias": case.kwargs.get("logit_bias", {})},
    }  # fmt: skip
    if case.stream:
        response = None
        async for event in await client.responses.create(stream=True, **kwargs):
            if event.type in ("response.completed", "response.incomplete"):
                response = event.response
        assert response is not None, "the stream ended without its response"
    else:
        response = await client.responses.create(**kwargs)
    calls = [(item.name, item.arguments) for item in response.output if item.type == "function_call"]
    used = _reasoning_tokens(response.usage)
    return Reply(response.status, calls, response.output_text, "", reasoning_tokens=used)


def valid_calls(reply: Reply, tools: Sequence[dict[str, Any]]) -> int | None:
    """How many calls the reply returned, ``None`` if one of them is invalid for its tool."""
    schemas = {s.name: s.parameters for s in normalize_tools(tools)}
    for name, arguments in reply.calls:
        try:
            jsonschema.validate(json.loads(arguments), schemas[name])
        except (ValueError, KeyError, jsonschema.ValidationError):
            return None
    return len(reply.calls)


def reserve(tokenizer: Any, tools: list[dict[str, Any]], choice: Any) -> int:
    """The smallest ``max_tokens`` the server admits under ``choice``: the turn's reserve (its
    shortest call, the mark of a call the budget closes, the margin)."""
    from hermes_vllm.processor.core import turn_reserve

    request = parse_constraint(constraint_args(tools, choice))
    assert request is not None
    return turn_reserve(request, "auto", served_vocabulary(tokenizer).speller)


def tight_max_tokens(tokenizer: Any, tools: list[dict[str, Any]], choice: Any) -> int:
    """A ``max_tokens`` just above the turn's reserve: 2 more."""
    return reserve(tokenizer, tools, choice) + 2


def end_bias(tokenizer: Any) -> dict[str, float]:
    """A strong push toward ending the turn (the grammar allows it only after the owed call)."""
    ends = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return {str(i): 30.0 for i in ends if isinstance(i, int)}


def closers(tokenizer: Any) -> dict[str, float]:
    return {str(i): 8.0 for t, i in tokenizer.get_vocab().items() if any(c in t for c in '"}]')}


def _standard(function: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function with its parameters in standard JSON Schema."""
    return {**function, "parameters": bfcl_to_json_schema(copy.deepcopy(function["parameters"]))}


def cases(tokenizer: Any, sets: int = 2) -> list[Case]:
    """Every scenario's requests, streamed and whole."""
    bias = closers(tokenizer)
    out: list[Case] = []
    streams = (False, True)
    # Sent as standard JSON Schema, as an OpenAI client sends tools (BFCL's ``dict``, ``float``
    # renamed): vLLM's structural tag refuses BFCL's names (xgrammar: 'Unsupported type "dict"';
    # its guidance fallback then fails on the tag itself, HTTP 400 "'triggers'").
    tool_sets: list[list[dict[str, Any]]] = [
        [{"type": "function", "function": _standard(t)} for t in s] for s in sample_tool_sets(sets)
    ]
    for tools in tool_sets:
        named: dict[str, Any] = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        choices: list[tuple[str, Any]] = [("required", "required"), ("named", named)]
        for label, choice in choices:
            budgets = [("400", 400, bias), ("tight", tight_max_tokens(tokenizer, tools, choice), bias)]
            # The model chooses: room for a call and some, no bias at all (a weak model's turn).
            budgets.append((MIDDLE, reserve(tokenizer, tools, choice) + MIDDLE_ROOM, {}))
            for budget, max_tokens, push in budgets:
                kwargs = {"tool_choice": choice, "max_tokens": max_tokens, "logit_bias": push}
                out += [Case(f"{label} max_tokens={budget}", tools, kwargs, s) for s in streams]
        pushed = {str(k): v for k, v in call_bias(tokenizer).items()}
        out += [Case("auto, calls pushed, max_tokens=40", tools, {"max_tokens": 40, "logit_bias": pushed}, s)
                for s in streams]  # fmt: skip
    # The model reopens reasoning whenever it may (a push toward <think>, not toward the call tag):
    # the budget is the turn's, however many spans the model opens.
    think = tokenizer.convert_tokens_to_ids("<think>")
    thinking = {"tool_choice": "required", "max_tokens": 400, "logit_bias": {**bias, str(think): 8.0}}
    thinking["extra_body"] = {"thinking_token_budget": THINKING_BUDGET}
    out += [
        Case(f"required, thinking_token_budget={THINKING_BUDGET}, <think> pushed", [WEATHER], thinking, s)
        for s in streams * 2
    ]
    # The budget closes the call, and the model ends its turn right after it: truncated all the same.
    ending = {"tool_choice": "required", "max_tokens": tight_max_tokens(tokenizer, [WEATHER], "required")}
    ending["logit_bias"] = end_bias(tokenizer)
    out += [
        Case(CLOSED_THEN_ENDED, [WEATHER], ending, s, api) for s in streams for api in ("chat", "responses")
    ]
    paris = tokenizer.encode("Paris", add_special_tokens=False)[-1]
    stop = {
        "tool_choice": "required",
        "max_tokens": 120,
        "stop": ["Paris"],
        "logit_bias": {**bias, str(paris): 9.0},
    }
    out += [Case("required, stop='Paris' pushed into the argument", [WEATHER], stop, s) for s in streams * 2]
    return out


def judge(case: Case, reply: Reply, tokenizer: Any) -> str:
    """Empty when the reply keeps the scenario's promise, else what went wrong."""
    if reply.error:
        return reply.error
    count = valid_calls(reply, case.tools)
    if count is None:
        return f"an invalid call: {reply.calls}"
    if case.scenario.startswith(("required", "named")) and count < 1:
        return f"no call (finish {reply.finish_reason}, content {reply.content[-80:]!r})"
    truncated = "incomplete" if case.api == "responses" else "length"
    if MARK.strip() in reply.content and reply.finish_reason != truncated:
        return f"a call the budget closed, reported as {reply.finish_reason!r}"
    if reply.reasoning_tokens is None:
        return "no reasoning tokens in usage"
    # A stream's chunks carry no token ids for reasoning: there the reasoning text tells.
    spans = span_token_counts(reply.token_ids, tokenizer) if not case.stream else []
    if reply.reasoning and not reply.reasoning_tokens:
        return f"usage reports no reasoning tokens for {len(reply.reasoning)} characters of reasoning"
    if reply.reasoning_tokens < sum(spans):  # spans opened by the <think> token, not in pieces
        return f"usage reports {reply.reasoning_tokens} reasoning tokens for spans of {spans}"
    if "thinking_token_budget" in case.scenario and reply.reasoning_tokens > THINKING_BUDGET:
        return f"{reply.reasoning_tokens} reasoning tokens in one turn (spans {spans})"
    if "stop=" in case.scenario and any("Paris" in a for _, a in reply.calls):
        return "the stop string inside the argument"
    return ""


def run(base_url: str, model: str, tokenizer: Any, sets: int = 2) -> dict[str, Outcome]:
    """Send every case at once (the engine batches them); each scenario's outcome."""
    todo = cases(tokenizer, sets)

    async def gather() -> list[Reply]:
        return await asyncio.gather(*(ask(base_url, model, c) for c in todo))

    outcomes: dict[str, Outcome] = {}
    for case, reply in zip(todo, asyncio.run(gather()), strict=True):
        outcome = outcomes.setdefault(case.scenario, Outcome())
        problem = judge(case, reply, tokenizer)
        outcome.total += 1
        outcome.ok += not problem
        outcome.closed += MARK.strip() in reply.content
        outcome.reasoning += reply.reasoning_tokens or 0
        if problem:
            outcome.failures.append(("stream: " if case.stream else "") + problem[:300])
    return outcomes
