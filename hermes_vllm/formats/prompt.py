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
from hermes_vllm.formats.blocks import call_block, join_body, response_block, result_body, turn
from hermes_vllm.formats.escape import escape_text
from hermes_vllm.formats.system import system_body

ROLES = ("system", "user", "assistant", "tool")
Message = Mapping[str, Any]
Tool = Mapping[str, Any]


def content_text(message: Message, field: str = "content") -> str:
    """A message's text ``field``; None or absent reads as empty, anything else but a string is an error."""
    content = message.get(field)
    if content is None:
        return ""
    if not isinstance(content, str):
        raise TypeError(f"{message.get('role')} message {field} must be a string or None, got {content!r}")
    return content


def _text(message: Message, d: Dialect) -> str:
    return escape_text(content_text(message), d)


def _tool_result(message: Message, d: Dialect) -> str:
    """A string result is free text (None is empty); any other JSON value is written as escaped JSON."""
    content = message.get("content")
    return result_body("" if content is None else content, d)


def _reasoning_span(text: str, d: Dialect) -> str:
    """Qwen 3's layout: the span's lines, then a blank line before the answer."""
    span, lines = d.reasoning[0], escape_text(text, d).strip("\n")
    return f"{span.begin}\n{lines}\n{span.end}\n\n"


def _reasoning_and_text(message: Message, d: Dialect) -> tuple[str, str]:
    """An assistant message's reasoning and text, unescaped, as Qwen 3 reads them.

    ``reasoning_content`` if given; else, in a dialect that keeps reasoning, the reasoning span
    the text holds inline (a reply sent back as the model wrote it) is taken out of the text,
    so it is kept or dropped like any reasoning. Both parts are escaped afterwards.
    """
    text = content_text(message)
    if message.get("reasoning_content") is not None or d.reasoning_history == "dropped":
        return content_text(message, "reasoning_content"), text
    span = d.reasoning[0]
    if span.end not in text:
        return "", text
    thought, *_, answer = text.split(span.end)
    return thought.rstrip("\n").split(span.begin)[-1].lstrip("\n"), answer.lstrip("\n")


def _assistant_body(message: Message, d: Dialect, keeps_reasoning: bool, last: bool) -> str:
    """Text, then call blocks; where ``keeps_reasoning``, the reasoning span first (Qwen 3).

    Qwen 3 writes a span for a turn with reasoning, and for the final turn even without; the
    text then loses its leading newlines, but still counts as text before the first call.
    """
    blocks = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", call)
        blocks.append(call_block(function["name"], function["arguments"], d))
    reasoning, raw = _reasoning_and_text(message, d)
    text = escape_text(raw, d)
    body = join_body(text, blocks)
    if keeps_reasoning and (last or reasoning):
        return _reasoning_span(reasoning, d) + body[len(text) - len(text.lstrip("\n")) :]
    return body


def _last_query(messages: Sequence[Message]) -> int:
    """Index of the last user message (the last one if there is none), as Qwen 3 counts it."""
    return max((i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages) - 1)


def build_hermes_prompt(
    system: str | None,
    messages: Sequence[Message],
    tools: Sequence[Tool] | None = None,
    add_generation_prompt: bool = True,
    dialect: str | Dialect = "chatml-brackets",
    enable_thinking: bool = True,
) -> str:
    """ChatML text for ``messages`` (roles system, user, assistant, tool).

    ``system`` (if not None) is a system message put first. With ``tools``, the first turn is
    the system turn: the first system message's text, then the dialect's tools preamble.
    Assistant ``tool_calls`` become call blocks; consecutive ``tool`` messages share one turn
    (of the dialect's ``response_role``), one response block each. A dialect that keeps
    reasoning writes ``reasoning_content`` of the assistant turns after the last user message;
    one with a thinking switch ends the prompt in an empty reasoning span if not
    ``enable_thinking`` (the template reads the same variable).
    """
    d = get_dialect(dialect)
    rest = [*([{"role": "system", "content": system}] if system is not None else []), *messages]
    parts = []
    if tools:
        text: str | None = None
        if rest and rest[0]["role"] == "system":
            text, rest = content_text(rest[0]), rest[1:]
        parts.append(turn("system", system_body(text, tools, d), d))
    last_query = _last_query(rest)
    for i, message in enumerate(rest):
        role = message["role"]
        if role == "tool":
            first = i == 0 or rest[i - 1]["role"] != "tool"
            last = i == len(rest) - 1 or rest[i + 1]["role"] != "tool"
            parts.append(d.turn.begin + d.response_role + "\n" if first else "\n")
            parts.append(response_block(_tool_result(message, d), d))
            parts.append(d.turn.end + "\n" if last else "")
        elif role == "assistant":
            keeps_reasoning = d.reasoning_history == "after_last_query" and i > last_query
            parts.append(turn(role, _assistant_body(message, d, keeps_reasoning, i == len(rest) - 1), d))
        elif role in ("system", "user"):
            parts.append(turn(role, _text(message, d), d))
        else:
            raise ValueError(f"unsupported message role {role!r}: expected {', '.join(ROLES)}")
    if add_generation_prompt:
        parts.append(d.turn.begin + "assistant\n")
        if d.thinking_switch and not enable_thinking:
            parts.append(_reasoning_span("", d))
    return "".join(parts)
