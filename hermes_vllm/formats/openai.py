"""Convert between OpenAI chat messages and Hermes ChatML messages.

A Hermes message is one ChatML turn as text, ``{"role", "content"}``: free text is escaped, an
assistant turn holds call blocks, a ``tool`` turn holds one response block per OpenAI tool
message (Hermes 2 Pro's ``{"name": ..., "content": ...}``, or the bare result where the dialect
says so), and with tools the first system turn ends with the dialect's tools preamble.

ChatML has no call ids. On the way to OpenAI they are synthesised deterministically
(:func:`tool_call_id`) and the n-th response after an assistant turn answers its n-th call. On
the way back, a turn's tool messages are put in call order by their ids (when the ids name the
calls) and then matched by position, so parallel calls survive a round trip.

Round trips are exact for canonical messages, the ones these functions write: JSON in call
arguments and tool results written as :func:`~hermes_vllm.formats.payload.dump_json` does, call
ids from :func:`tool_call_id`, ``content`` None for an assistant turn with calls and no text. A
Hermes response whose content is a string that reads as a JSON non-string value (``"12"``)
comes back as that value (``12``): OpenAI tool content is text and cannot tell them apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any, TypedDict, TypeVar

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.formats.escape import escape_text, unescape_text
from hermes_vllm.formats.formatter import HermesFunctionFormatter, ParsedMessage
from hermes_vllm.formats.models import ToolCall, ToolResponse
from hermes_vllm.formats.payload import dump_json, loads_json
from hermes_vllm.formats.prompt import ROLES, Message, Tool, content_text
from hermes_vllm.formats.system import split_system_body, system_body

MASK = "[MASKED]"
"""Replaces every tool result when conversions are asked to ``mask_output``."""

T = TypeVar("T")


class HermesMessage(TypedDict):
    role: str
    content: str


def tool_call_id(message_index: int, call_index: int) -> str:
    """The id of the ``call_index``-th call of the OpenAI message at ``message_index``."""
    return f"call_{message_index}_{call_index}"


def _tool_call(call: Mapping[str, Any]) -> ToolCall:
    function = call.get("function", call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = loads_json(arguments)
        except ValueError as e:
            raise ValueError(f"arguments of call {function.get('name')!r} are not JSON: {e}") from None
    return ToolCall(name=function.get("name"), arguments=arguments)


def _tool_result(content: Any) -> Any:
    """A tool message's content as the value a Hermes response holds.

    Text holding a JSON object, array, number, boolean or null becomes that value; any other
    text, a JSON string literal included, stays text, so :func:`_result_text` restores it exactly.
    """
    if not isinstance(content, str):
        return content
    try:
        value = loads_json(content)
    except ValueError:
        return content
    return content if isinstance(value, str) else value


def _responses(batch: list[Message], calls: list[tuple[str | None, str]], mask: bool) -> list[ToolResponse]:
    """The responses of consecutive tool messages, in the order of the calls they answer."""
    if len(batch) > len(calls):
        raise ValueError(f"{len(batch)} tool messages answer only {len(calls)} calls")
    ids = [call_id for call_id, _ in calls]
    got = [m.get("tool_call_id") for m in batch]
    if len(set(got)) == len(got) and set(got) <= set(ids):
        batch = sorted(batch, key=lambda m: ids.index(m.get("tool_call_id")))
    return [
        ToolResponse(name=name, content=MASK if mask else _tool_result(m.get("content")))
        for m, (_, name) in zip(batch, calls[: len(batch)], strict=True)
    ]


def openai_to_hermes(
    messages: Sequence[Message],
    tools: Sequence[Tool] | None = None,
    dialect: str | Dialect = "hermes",
    mask_output: bool = False,
) -> list[HermesMessage]:
    """Hermes messages for OpenAI ``messages`` (and ``tools``, announced in the system turn)."""
    d = get_dialect(dialect)
    formatter = HermesFunctionFormatter(d)
    out: list[HermesMessage] = []
    rest = list(messages)
    if tools:
        text: str | None = None
        if rest and rest[0]["role"] == "system":
            text, rest = content_text(rest[0]), rest[1:]
        out.append({"role": "system", "content": system_body(text, tools, d)})
    calls: list[tuple[str | None, str]] = []
    for role, group in groupby(rest, key=lambda m: m["role"]):
        batch = list(group)
        if role == "tool":
            responses = _responses(batch, calls, mask_output)
            out.append({"role": "tool", "content": formatter.format_tool_responses(responses)})
            continue
        for message in batch:
            if role == "assistant":
                raw = message.get("tool_calls") or []
                parsed = [_tool_call(c) for c in raw]
                calls = [(c.get("id"), p.name) for c, p in zip(raw, parsed, strict=True)]
                out.append(
                    {"role": role, "content": formatter.format_tool_calls(content_text(message), parsed)}
                )
            elif role in ("system", "user"):
                calls = []
                out.append({"role": role, "content": escape_text(content_text(message), d)})
            else:
                raise ValueError(f"unsupported message role {role!r}: expected {', '.join(ROLES)}")
    return out


def _checked(parsed: ParsedMessage[T], index: int, what: str) -> ParsedMessage[T]:
    problems = list(parsed.errors)
    if parsed.rest:
        problems.append(f"text after the first {what} block would be lost: {parsed.rest[:60]!r}")
    if problems:
        raise ValueError(f"message {index}: " + "; ".join(problems))
    return parsed


def _result_text(content: Any) -> str:
    """Inverse of :func:`_tool_result`: text stays text, any other value is written as JSON."""
    return content if isinstance(content, str) else dump_json(content)


def hermes_to_openai(
    messages: Sequence[HermesMessage],
    dialect: str | Dialect = "hermes",
    mask_output: bool = False,
) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """``(messages, tools)`` in OpenAI form; ``ValueError`` names a message that cannot convert."""
    d = get_dialect(dialect)
    formatter = HermesFunctionFormatter(d)
    out: list[dict[str, Any]] = []
    tools = None
    ids: list[str] = []
    for i, message in enumerate(messages):
        role, body = message["role"], message["content"]
        if role == "system" and i == 0:
            text, tools = split_system_body(body, d)
            out.extend([{"role": role, "content": text}] if text is not None else [])
        elif role in ("system", "user"):
            ids = []
            out.append({"role": role, "content": unescape_text(body, d)})
        elif role == "assistant":
            turn = _checked(formatter.parse_tool_calls(body), i, "call")
            ids = [tool_call_id(len(out), n) for n in range(len(turn.blocks))]
            reply: dict[str, Any] = {"role": role, "content": turn.content or (None if ids else "")}
            if ids:
                reply["tool_calls"] = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": dump_json(c.arguments)},
                    }
                    for call_id, c in zip(ids, turn.blocks, strict=True)
                ]
            out.append(reply)
        elif role == "tool":
            responses = _checked(formatter.parse_tool_responses(body), i, "response")
            if responses.content:
                raise ValueError(f"message {i}: text before the response blocks: {responses.content[:60]!r}")
            if len(responses.blocks) > len(ids):
                n = len(responses.blocks)
                raise ValueError(f"message {i}: {n} responses answer only {len(ids)} open calls")
            for r in responses.blocks:
                content = MASK if mask_output else _result_text(r.content)
                out.append({"role": role, "tool_call_id": ids.pop(0), "content": content})
        else:
            raise ValueError(f"message {i}: unsupported role {role!r}: expected {', '.join(ROLES)}")
    return out, tools
