"""Write and read Hermes tool-call and tool-response messages of a dialect.

A message is escaped free text followed by blocks, one per line (the prompt's layout). Reading
uses :func:`hermes_vllm.spans.split_spans`, so a closing tag inside a JSON string does not end a
block and reasoning spans stay opaque. A broken block is skipped with a logged warning and
reported in :attr:`ParsedMessage.errors`; the other blocks are still returned.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Generic, TypeVar

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.formats.blocks import call_block, hermes_response_block, join_body, read_result
from hermes_vllm.formats.escape import escape_text, unescape_text
from hermes_vllm.formats.models import HermesToolCall, HermesToolResponse, ToolCall, ToolResponse
from hermes_vllm.spans import split_spans

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class ParsedMessage(Generic[T]):
    """A message read back: its free text, its blocks, and what could not be read."""

    content: str
    """Free text before the first block, unescaped, without the newline that separates it."""
    blocks: list[T] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One line per skipped block: which block and why."""
    rest: str = ""
    """Non-block text after the first block, unescaped and stripped (empty in a well-formed message)."""


@cache
def _response_spans_dialect(d: Dialect) -> Dialect:
    """``d`` read with the response tags in the call's place, so split_spans finds response blocks."""
    return dataclasses.replace(d, tool_call=d.tool_response, reasoning=(), hidden=())


class HermesFunctionFormatter:
    """Hermes tool calls and tool responses in the tags of one dialect (default ``hermes``)."""

    def __init__(self, dialect: str | Dialect = "hermes") -> None:
        self.dialect = get_dialect(dialect)

    def format_tool_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        """``content`` then one call block per call."""
        blocks = [call_block(c.name, c.arguments, self.dialect) for c in calls]
        return join_body(escape_text(content, self.dialect), blocks)

    def format_tool_call(self, content: str, func_name: str, args: Mapping[str, Any]) -> str:
        """``content`` then the call block of ``func_name(**args)``."""
        return self.format_tool_calls(content, [ToolCall(name=func_name, arguments=dict(args))])

    def format_tool_responses(self, responses: Sequence[ToolResponse]) -> str:
        """One response block per response, one per line (the body of a tool turn)."""
        blocks = [hermes_response_block(r.name, r.content, self.dialect) for r in responses]
        return join_body("", blocks)

    def format_tool_response(self, func_name: str | None, result: Any) -> str:
        """The response block ``{"name": func_name, "content": result}``, or ``result`` bare."""
        return self.format_tool_responses([ToolResponse(name=func_name, content=result)])

    def _parse(self, message: str, spans_dialect: Dialect, read: Callable[[str], T]) -> ParsedMessage[T]:
        spans = split_spans(message, spans_dialect)
        first = next((i for i, s in enumerate(spans) if s.kind == "call"), len(spans))
        content = message[: spans[first].start].removesuffix("\n") if first < len(spans) else message
        blocks: list[T] = []
        errors: list[str] = []
        rest = [message[s.start : s.end] for s in spans[first:] if s.kind != "call"]
        for span in (s for s in spans[first:] if s.kind == "call"):
            try:
                if not span.closed:
                    raise ValueError("the closing tag is missing")
                blocks.append(read(span.body))
            except ValueError as e:  # pydantic's ValidationError is a ValueError
                errors.append(f"block at character {span.start}: {' '.join(str(e).split())}")
                logger.warning("skipping an unreadable %s", errors[-1])
        return ParsedMessage(
            content=unescape_text(content, self.dialect),
            blocks=blocks,
            errors=errors,
            rest=unescape_text("".join(rest), self.dialect).strip(),
        )

    def parse_tool_calls(self, message: str) -> ParsedMessage[HermesToolCall]:
        """The free text and the calls of an assistant message."""
        return self._parse(message, self.dialect, HermesToolCall.from_payload)

    def parse_tool_responses(self, message: str) -> ParsedMessage[HermesToolResponse]:
        """The response blocks of a tool message; bare ones have no name."""
        return self._parse(message, _response_spans_dialect(self.dialect), self._read_response)

    def _read_response(self, body: str) -> HermesToolResponse:
        if self.dialect.response_payload == "bare":
            return HermesToolResponse(name=None, content=read_result(body, self.dialect))
        return HermesToolResponse.from_payload(body)

    def extract_tool_calls(self, message: str) -> list[HermesToolCall]:
        """The readable calls of ``message``; the text before them is ``parse_tool_calls(m).content``."""
        return self.parse_tool_calls(message).blocks

    def extract_tool_responses(self, message: str) -> list[HermesToolResponse]:
        return self.parse_tool_responses(message).blocks

    def extract_tool_response(self, message: str) -> HermesToolResponse | None:
        """The first readable response of ``message``, or None."""
        return next(iter(self.extract_tool_responses(message)), None)
