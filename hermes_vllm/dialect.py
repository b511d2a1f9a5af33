"""Dialects: the one source of truth for a ChatML tool-call format's tags and conventions.

Grammar, parsers, chat templates and the formatter all read their tag strings from a
:class:`Dialect`; the definitions themselves are data files in ``grammars/dialects/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

KeyOrder = Literal["name_first", "arguments_first", "either"]
ResponseRole = Literal["tool", "user"]
ReasoningHistory = Literal["dropped", "after_last_query"]
ResponsePayload = Literal["named", "bare"]

DEFAULT_DIALECT = "hermes"


@dataclass(frozen=True)
class TagPair:
    """An opening and a closing tag, e.g. ``<tool_call>`` / ``</tool_call>``."""

    begin: str
    end: str


@dataclass(frozen=True)
class Dialect:
    """Tag pairs, call key order and tool-response placement of one ChatML tool-call format."""

    name: str
    description: str
    turn: TagPair
    tool_call: TagPair
    tool_response: TagPair
    tools: TagPair
    reasoning: tuple[TagPair, ...]
    hidden: tuple[TagPair, ...]
    key_order: KeyOrder
    response_role: ResponseRole
    system_preamble: str
    reasoning_history: ReasoningHistory = "dropped"
    """``after_last_query``: assistant turns after the last user message carry their
    ``reasoning_content`` in the first reasoning span, and a final assistant turn there always
    carries one, empty if need be (Qwen 3's multi-step tool loops); ``dropped``: never."""
    response_payload: ResponsePayload = "named"
    """What the formatter puts in a response block: ``named``, Hermes 2 Pro's
    ``{"name": ..., "content": ...}`` (the Hermes datasets); ``bare``, the result alone, as
    Qwen's template and Qwen-Agent write it. Prompts always hold the tool message's content."""
    thinking_switch: bool = False
    """``enable_thinking=False`` puts an empty first reasoning span after the generation prompt
    (Qwen 3), so the model answers without thinking."""
    reserved: tuple[str, ...] = ()
    """Strings that are no tag here but a tokenizer turns into control tokens (its added and special
    tokens, :func:`hermes_vllm.formats.token_check.reserve_tokens`): escaped in message text too."""

    def __hash__(self) -> int:
        """The name's hash (a string's, kept by the string), not the fields' (a tuple of them all,
        hashed at each call): a dialect keys its span reader (:func:`hermes_vllm.spans.reader_of`),
        looked up at every :func:`~hermes_vllm.spans.split_spans`. Equal dialects share a name."""
        return hash(self.name)

    @property
    def free_spans(self) -> tuple[TagPair, ...]:
        """Spans whose content is never constrained and never opens a call: reasoning, hidden."""
        return self.reasoning + self.hidden

    @property
    def control_strings(self) -> tuple[str, ...]:
        """The dialect's ChatML turn markers and tags, and the strings it reserves.

        If user text could spell one, it could forge a turn, a call, a tool response or a
        reasoning span; message text is escaped for these and every built-in dialect's
        (:func:`hermes_vllm.formats.escape.escaped_strings`).
        """
        pairs = (self.turn, self.tool_call, self.tool_response, self.tools, *self.free_spans)
        return tuple(dict.fromkeys((*(s for p in pairs for s in (p.begin, p.end)), *self.reserved)))

    @property
    def parsed_tags(self) -> frozenset[str]:
        """The tags the parsers must see in the text: call tags and the free spans' tags."""
        return frozenset(t for p in (self.tool_call, *self.free_spans) for t in (p.begin, p.end))

    @property
    def added_tokens(self) -> tuple[str, ...]:
        """Tags a tokenizer for this dialect would typically add as single tokens."""
        pairs = (self.tool_call, self.tool_response, *self.free_spans)
        return tuple(s for p in pairs for s in (p.begin, p.end))

    def render_system_preamble(self, tools_json: str) -> str:
        """The system-prompt text announcing ``tools_json`` (already serialised)."""
        return self.system_preamble.format(
            tools=tools_json,
            tools_begin=self.tools.begin,
            tools_end=self.tools.end,
            call_begin=self.tool_call.begin,
            call_end=self.tool_call.end,
        )


def _pair(raw: object, where: str) -> TagPair:
    if not (isinstance(raw, list) and len(raw) == 2 and all(isinstance(s, str) and s for s in raw)):
        raise ValueError(f"{where}: expected [begin, end], two non-empty strings, got {raw!r}")
    return TagPair(raw[0], raw[1])


def _parse(data: dict[str, object], source: str) -> Dialect:
    key_order = data.get("key_order")
    if key_order not in ("name_first", "arguments_first", "either"):
        raise ValueError(f"{source}: key_order must be name_first, arguments_first or either")
    role = data.get("response_role")
    if role not in ("tool", "user"):
        raise ValueError(f"{source}: response_role must be 'tool' or 'user'")
    history = data.get("reasoning_history", "dropped")
    if history not in ("dropped", "after_last_query"):
        raise ValueError(f"{source}: reasoning_history must be 'dropped' or 'after_last_query'")
    payload = data.get("response_payload", "named")
    if payload not in ("named", "bare"):
        raise ValueError(f"{source}: response_payload must be 'named' or 'bare'")
    switch = data.get("thinking_switch", False)
    if not isinstance(switch, bool):
        raise ValueError(f"{source}: thinking_switch must be true or false")
    spans = {}
    for field in ("reasoning", "hidden"):
        raw = data.get(field, [])
        if not isinstance(raw, list):
            raise ValueError(f"{source}: {field} must be a list of [begin, end] pairs")
        spans[field] = tuple(_pair(p, f"{source}: {field}[{i}]") for i, p in enumerate(raw))
    if (history != "dropped" or switch) and not spans["reasoning"]:
        raise ValueError(f"{source}: reasoning_history and thinking_switch need a reasoning span")
    return Dialect(
        name=str(data["name"]),
        description=str(data.get("description", "")),
        turn=_pair(data.get("turn"), f"{source}: turn"),
        tool_call=_pair(data.get("tool_call"), f"{source}: tool_call"),
        tool_response=_pair(data.get("tool_response"), f"{source}: tool_response"),
        tools=_pair(data.get("tools"), f"{source}: tools"),
        reasoning=spans["reasoning"],
        hidden=spans["hidden"],
        key_order=key_order,
        response_role=role,
        system_preamble=str(data["system_preamble"]),
        reasoning_history=history,
        response_payload=payload,
        thinking_switch=switch,
    )


def _dialect_dir() -> resources.abc.Traversable:
    return resources.files("hermes_vllm.grammars").joinpath("dialects")


@cache
def available_dialects() -> tuple[str, ...]:
    """Names of the built-in dialects shipped in ``grammars/dialects/``."""
    return tuple(
        sorted(p.name.removesuffix(".json") for p in _dialect_dir().iterdir() if p.name.endswith(".json"))
    )


def get_dialect(name: str | Dialect = DEFAULT_DIALECT) -> Dialect:
    """A built-in dialect by name (``hermes``, ``qwen``, ``chatml-brackets``); a Dialect passes through."""
    if isinstance(name, Dialect):
        return name
    return _load_dialect(name)


@cache
def _load_dialect(name: str) -> Dialect:
    if name not in available_dialects():
        raise ValueError(f"unknown dialect {name!r}; choose one of {', '.join(available_dialects())}")
    text = _dialect_dir().joinpath(f"{name}.json").read_text(encoding="utf-8")
    dialect = _parse(json.loads(text), f"grammars/dialects/{name}.json")
    if dialect.name != name:
        raise ValueError(f"grammars/dialects/{name}.json declares name {dialect.name!r}")
    return dialect
