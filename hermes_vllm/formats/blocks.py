"""The pieces of a Hermes turn body: tool-call blocks, tool-response blocks, turns.

One place for the layout, shared by the prompt builder and the formatter; the Jinja chat
template mirrors it (``grammars/templates/chatml.jinja``) and the tests hold them equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hermes_vllm.dialect import Dialect
from hermes_vllm.formats.escape import escape_json_text, escape_text, unescape_text
from hermes_vllm.formats.payload import dump_json, loads_json


def call_block(name: str, arguments: Mapping[str, Any] | str, d: Dialect) -> str:
    """``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` in the dialect's key order.

    ``arguments`` given as a string (OpenAI's ``function.arguments``) is written verbatim, as a
    template must: it cannot parse JSON.
    """
    args = arguments if isinstance(arguments, str) else dump_json(arguments)
    name_json = dump_json(name)
    if d.key_order == "arguments_first":
        payload = '{"arguments": ' + args + ', "name": ' + name_json + "}"
    else:
        payload = '{"name": ' + name_json + ', "arguments": ' + args + "}"
    return f"{d.tool_call.begin}\n{escape_json_text(payload, d)}\n{d.tool_call.end}"


def response_block(body: str, d: Dialect) -> str:
    """``<tool_response>\\n{body}\\n</tool_response>``; ``body`` must already be escaped."""
    return f"{d.tool_response.begin}\n{body}\n{d.tool_response.end}"


def result_body(content: Any, d: Dialect) -> str:
    """A bare tool result as a response block holds it: text escaped, any other value as escaped JSON."""
    return escape_text(content, d) if isinstance(content, str) else escape_json_text(dump_json(content), d)


def read_result(body: str, d: Dialect) -> Any:
    """Inverse of :func:`result_body` on a block's body: JSON that is no string is that value.

    Text reading as a JSON number, array, object, boolean or null comes back as that value: a
    bare result cannot tell them apart (the OpenAI conversion treats tool text the same way).
    """
    body = body.removeprefix("\n").removesuffix("\n")
    try:
        value = loads_json(body)
    except ValueError:
        return unescape_text(body, d)
    return unescape_text(body, d) if isinstance(value, str) else value


def hermes_response_block(name: str | None, content: Any, d: Dialect) -> str:
    """A response block in the dialect's payload: Hermes 2 Pro's ``{"name": ..., "content": ...}``
    as escaped JSON, or the bare result (which drops the name)."""
    if d.response_payload == "bare":
        return response_block(result_body(content, d), d)
    if name is None:
        raise ValueError(f"dialect {d.name!r} names every tool response: a response without a name")
    return response_block(escape_json_text(dump_json({"name": name, "content": content}), d), d)


def join_body(content: str, blocks: Sequence[str]) -> str:
    """Escaped free text, then the blocks, one per line (Qwen's layout); no blank text line."""
    return "\n".join([content, *blocks] if content else blocks)


def turn(role: str, body: str, d: Dialect) -> str:
    """One closed ChatML turn."""
    return f"{d.turn.begin}{role}\n{body}{d.turn.end}\n"
