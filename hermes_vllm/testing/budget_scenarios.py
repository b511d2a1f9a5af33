"""The token-budget scenarios, sent to a running OpenAI server with the ``openai`` client.

Shared by the server test (ours must pass every one) and ``benchmarks/budget.py`` (the same
scenarios against vLLM's own constraint, in the same run). The model is the random tiny one at
temperature 1 with a bias toward ``"``, ``}`` and ``]`` only, except where a scenario says so:
nothing pushes it toward the call tag.
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

from hermes_vllm.constraint import constraint_args, parse_constraint
from hermes_vllm.schema import bfcl_to_json_schema, normalize_tools
from hermes_vllm.settings import get_limits
from hermes_vllm.testing.bias import call_bias
from hermes_vllm.testing.corpus import sample_tool_sets
from hermes_vllm.testing.server import Reply

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
MESSAGES = [{"role": "user", "content": "Please help."}]
THINKING_BUDGET = 24


@dataclass(frozen=True)
class Case:
    scenario: str
    tools: list[dict[str, Any]]
    kwargs: dict[str, Any]
    stream: bool


@dataclass
class Outcome:
    """How one scenario went: replies that met its promise, of all."""

    ok: int = 0
    total: int = 0
    failures: list[str] = field(default_factory=list)


async def ask(base_url: str, model: str, case: Case) -> Reply:
    kwargs = {"model": model, "messages": MESSAGES, "temperature": 1.0, "tools": case.tools, **case.kwargs}
    kwargs["extra_body"] = {**kwargs.get("extra_body", {}), "return_token_ids": True}
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=900) as client:
        try:
            if not case.stream:
                choice = (await client.chat.completions.create(**kwargs)).choices[0]
                calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
                reasoning = getattr(choice.message, "reasoning", None) or ""
                ids = list((choice.model_extra or {}).get("token_ids") or [])
                return Reply(choice.finish_reason, calls, choice.message.content or "", reasoning, ids)
            found: dict[int, list[str]] = {}
            content = reasoning = ""
            finish = None
            token_ids: list[int] = []
            async for chunk in await client.chat.completions.create(stream=True, **kwargs):
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
            return Reply(finish, [(n, a) for n, a in found.values()], content, reasoning, token_ids)
        except Exception as err:  # an HTTP error is a failed reply, reported as such
            return Reply(None, [], "", "", error=f"{type(err).__name__}: {err}")


def valid_calls(reply: Reply, tools: Sequence[dict[str, Any]]) -> int | None:
    """How many calls the reply returned, ``None`` if one of them is invalid for its tool."""
    schemas = {s.name: s.parameters for s in normalize_tools(tools)}
    for name, arguments in reply.calls:
        try:
            jsonschema.validate(json.loads(arguments), schemas[name])
        except (ValueError, KeyError, jsonschema.ValidationError):
            return None
    return len(reply.calls)


def span_token_counts(token_ids: Sequence[int], tokenizer: Any) -> list[int]:
    """Tokens inside each ``<think>`` span, counted between the tags' own tokens."""
    begin, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    counts: list[int] = []
    inside = False
    for token in token_ids:
        if token == begin and not inside:
            inside = True
            counts.append(0)
        elif token == end and inside:
            inside = False
        elif inside:
            counts[-1] += 1
    return counts


def tight_max_tokens(tokenizer: Any, tools: list[dict[str, Any]], choice: Any) -> int:
    """A ``max_tokens`` just above the turn's shortest call: its tokens, the margin, and 2."""
    from hermes_vllm.processor.core import shortest_call_text

    request = parse_constraint(constraint_args(tools, choice))
    assert request is not None
    text = shortest_call_text(request, "auto")
    assert text is not None
    return len(tokenizer.encode(text, add_special_tokens=False)) + get_limits().budget_margin + 2


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
            for budget, max_tokens in (("400", 400), ("tight", tight_max_tokens(tokenizer, tools, choice))):
                kwargs = {"tool_choice": choice, "max_tokens": max_tokens, "logit_bias": bias}
                out += [Case(f"{label} max_tokens={budget}", tools, kwargs, s) for s in streams]
        pushed = {str(k): v for k, v in call_bias(tokenizer).items()}
        out += [Case("auto, calls pushed, max_tokens=40", tools, {"max_tokens": 40, "logit_bias": pushed}, s)
                for s in streams]  # fmt: skip
    thinking = {"tool_choice": "required", "max_tokens": 400, "logit_bias": bias}
    thinking["extra_body"] = {"thinking_token_budget": THINKING_BUDGET}
    out += [
        Case(f"required, thinking_token_budget={THINKING_BUDGET}", [WEATHER], thinking, s)
        for s in streams * 2
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
    if "thinking_token_budget" in case.scenario:
        used = max(span_token_counts(reply.token_ids, tokenizer), default=0)
        if used > THINKING_BUDGET:
            return f"a reasoning span of {used} tokens"
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
        if problem:
            outcome.failures.append(("stream: " if case.stream else "") + problem[:300])
    return outcomes
