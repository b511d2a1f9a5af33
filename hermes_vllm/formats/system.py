"""The system turn: the caller's text, then the dialect's preamble announcing the tools.

Written by the prompt builder and the converters, read back by the converters; the chat template
receives :func:`preamble_parts` so it needs no copy of the preamble text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.formats.escape import escape_json_text, escape_text, unescape_text
from hermes_vllm.formats.payload import dump_json, loads_json

_SLOT = "\x00tools\x00"
SEPARATOR = "\n\n"
"""Between the caller's system text and the tools preamble."""


@cache
def preamble_parts(dialect: str | Dialect = "hermes") -> tuple[str, str]:
    """The preamble before and after the tools JSON."""
    d = get_dialect(dialect)
    parts = d.render_system_preamble(_SLOT).split(_SLOT)
    if len(parts) != 2:
        raise ValueError(f"dialect {d.name!r}: the system preamble must hold {{tools}} exactly once")
    return parts[0], parts[1]


def tools_json(tools: Sequence[Mapping[str, Any]], d: Dialect) -> str:
    """One escaped JSON object per line, with a newline before and after (Qwen's layout)."""
    return "".join(f"\n{escape_json_text(dump_json(tool), d)}" for tool in tools) + "\n"


def system_body(text: str | None, tools: Sequence[Mapping[str, Any]], d: Dialect) -> str:
    """The system turn's body when ``tools`` are offered; ``text`` is None without a system message.

    An empty system message still puts its separator before the preamble, as Qwen 3 writes it.
    """
    prefix = escape_text(text, d) + SEPARATOR if text is not None else ""
    return prefix + d.render_system_preamble(tools_json(tools, d))


def _split(body: str, d: Dialect) -> tuple[str | None, list[Any]] | None:
    head, tail = preamble_parts(d)
    at = body.find(head)
    end = len(body) - len(tail)
    if at == -1 or at + len(head) > end or not body.endswith(tail):
        return None
    before = body[:at]
    lines = body[at + len(head) : end].split("\n")
    if (before and not before.endswith(SEPARATOR)) or len(lines) < 3 or lines[0] or lines[-1]:
        return None
    try:
        text = before.removesuffix(SEPARATOR) if before else None
        return text, [loads_json(line) for line in lines[1:-1]]
    except ValueError:
        return None


def split_system_body(body: str, d: Dialect) -> tuple[str | None, list[Any] | None]:
    """Inverse of :func:`system_body`: ``(text, tools)``; ``(text, None)`` for a plain system turn."""
    split = _split(body, d)
    if split is None:
        return unescape_text(body, d), None
    text, tools = split
    return (unescape_text(text, d) if text is not None else None), tools
