"""Render OpenAI chat messages as Hermes ChatML text, exactly as the dialect's chat template does.

Kept line for line in step with ``grammars/templates/chatml.jinja`` (the tests render both on
many inputs and require equal text): offline tooling and the served model see the same prompt.
Every piece of message text is escaped (:mod:`hermes_vllm.formats.escape`), so no message can
forge a turn, a call or a tool response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.formats.blocks import call_block, join_body, response_block, turn
from hermes_vllm.formats.escape import escape_json_text, escape_text
from hermes_vllm.formats.payload import dump_json
from hermes_vllm.formats.system import system_body

ROLES = ("system", "user", "assistant", "tool")
Message = Mapping[str, Any]
Tool = Mapping[str, Any]


def content_text(message: Message) -> str:
    """A message's text content; None reads as empty, anything else but a string is an error."""
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise TypeError(f"{message.get('role')} message content must be a string or None, got {content!r}")
    return content


def _text(message: Message, d: Dialect) -> str:
    return escape_text(content_text(message), d)


def _tool_result(message: Message, d: Dialect) -> str:
    """A string result is free text; any other JSON value is written as escaped JSON."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return _text(message, d)
    return escape_json_text(dump_json(content), d)


def _assistant_body(message: Message, d: Dialect) -> str:
    blocks = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", call)
        blocks.append(call_block(function["name"], function["arguments"], d))
    return join_body(_text(message, d), blocks)


def build_hermes_prompt(
    system: str | None,
    messages: Sequence[Message],
    tools: Sequence[Tool] | None = None,
    add_generation_prompt: bool = True,
    dialect: str | Dialect = "chatml-brackets",
) -> str:
    """ChatML text for ``messages`` (roles system, user, assistant, tool).

    ``system`` (if not None) is a system message put first. With ``tools``, the first turn is
    the system turn: the first system message's text, then the dialect's tools preamble.
    Assistant ``tool_calls`` become call blocks; consecutive ``tool`` messages share one turn
    (of the dialect's ``response_role``), one response block each.
    """
    d = get_dialect(dialect)
    rest = [*([{"role": "system", "content": system}] if system is not None else []), *messages]
    parts = []
    if tools:
        text: str | None = None
        if rest and rest[0]["role"] == "system":
            text, rest = content_text(rest[0]), rest[1:]
        parts.append(turn("system", system_body(text, tools, d), d))
    for i, message in enumerate(rest):
        role = message["role"]
        if role == "tool":
            first = i == 0 or rest[i - 1]["role"] != "tool"
            last = i == len(rest) - 1 or rest[i + 1]["role"] != "tool"
            parts.append(d.turn.begin + d.response_role + "\n" if first else "\n")
            parts.append(response_block(_tool_result(message, d), d))
            parts.append(d.turn.end + "\n" if last else "")
        elif role == "assistant":
            parts.append(turn(role, _assistant_body(message, d), d))
        elif role in ("system", "user"):
            parts.append(turn(role, _text(message, d), d))
        else:
            raise ValueError(f"unsupported message role {role!r}: expected {', '.join(ROLES)}")
    if add_generation_prompt:
        parts.append(d.turn.begin + "assistant\n")
    return "".join(parts)
