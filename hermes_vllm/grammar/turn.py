"""The engine-independent description of one turn's grammar: dialect, tools, tool_choice, answer.

A :class:`TurnSpec` is what every engine backend compiles and what the cache is keyed by. The
shape it describes (free text, opaque reasoning/hidden spans, tool-call spans holding exactly one
schema-valid call) is written out once per engine in ``grammar/engines/``. A turn with an
*answer* (the request's ``response_format`` beside its tools) has no free text: reasoning, then
either calls or the answer as JSON matching its schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import xgrammar as xgr

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.schema import ToolSchemaError, ToolSpec, UnsatisfiableToolError, canonical_json

LEAD_WHITESPACE = 4
"""Whitespace allowed before each reasoning span and before the first call where no free text may
come first (``required``): Qwen 3 writes two newlines after ``</think>``. Bounded like whitespace in
a call, so a weak model cannot loop on it."""

MARK = " [closed by max_tokens]"
"""Content written right after a call that the budget closed (its arguments may be truncated);
a turn with an answer admits it after its last call, where it admits no other text."""
ANSWER_NAME = "response_format"
"""What errors call the final answer's schema (it is read like a tool's arguments)."""


def tag_initials(dialect: Dialect) -> str:
    """The first characters of the tags readers of free text act on (the call tag, the span
    openers, the other parsed tags), escaped for a character class (an EBNF one and a regex one
    alike). An answer's strings never hold them raw: the answer is free text to every span reader
    (parsers, the budget's follower), and a raw ``<think>`` there would open a span for them."""
    d = dialect
    firsts = sorted({t[0] for t in (d.tool_call.begin, *(p.begin for p in d.free_spans), *d.parsed_tags)})
    return "".join("\\" + c if c in "[]^-\\" else c for c in firsts)


Mode = Literal["auto", "required", "none"]
"""``auto``: calls optional; ``required``: at least one call (named choice = required over one tool);
``none``: no call span may open."""


@dataclass(frozen=True)
class TurnSpec:
    """Everything a turn grammar depends on, minus the tokenizer and the engine."""

    dialect: Dialect
    tools: tuple[ToolSpec, ...]
    mode: Mode
    parallel: bool
    max_whitespace: int
    answer: ToolSpec | None = None
    """The final answer's schema (``response_format`` / ``structured_outputs`` JSON), normalised
    like a tool's arguments. Under ``required`` it is unused (the turn owes calls, as OpenAI serves
    it) but still makes the turn calls only: no free text after them either."""

    @property
    def answers(self) -> bool:
        """Whether the turn may end with its answer (``auto`` and ``none`` with an answer)."""
        return self.answer is not None and self.mode != "required"

    @property
    def written(self) -> tuple[ToolSpec, ...]:
        """The schemas the turn's grammar writes: its tools, then its answer where it may end with it."""
        return (*self.tools, self.answer) if self.answers and self.answer is not None else self.tools

    @property
    def free_text(self) -> bool:
        """Whether text outside calls and spans is the model's own (``auto`` without an answer):
        only then may a gate leave the engine alone between calls."""
        return self.mode == "auto" and self.answer is None

    def key(self) -> str:
        """Canonical text of the spec: equal specs compile to equal grammars."""
        return self._key

    @cached_property
    def _key(self) -> str:
        """Written once per spec: a prepared turn is reused by every request that resends its tools."""
        tools = [[t.name, t.parameters] for t in self.tools]
        key = [self.dialect.name, self.mode, self.parallel, self.max_whitespace, tools]
        if self.answer is not None:  # under required only its presence counts: calls only
            key.append(self.answer.parameters if self.answers else True)
        return canonical_json(key)


def resolve_tool_choice(names: Sequence[str], tool_choice: Any) -> tuple[Mode, frozenset[str]]:
    """OpenAI ``tool_choice`` over a request's tool ``names`` -> (mode, the names a call may use).

    Delegates the OpenAI shapes (strings, named function, ``allowed_tools``) to xgrammar's
    ``normalize_tool_choice``; a named or forced choice becomes ``required`` over that one tool.
    """
    if tool_choice == "none":
        return "none", frozenset(names)
    refs = [{"type": "function", "function": {"name": n}} for n in names]
    try:
        functions, _, simplified = xgr.normalize_tool_choice(tools=refs, tool_choice=tool_choice)
    except ValueError as err:
        raise ToolSchemaError(None, "tool_choice", str(err).splitlines()[0]) from None
    return ("auto" if simplified == "auto" else "required"), frozenset(f.function.name for f in functions)


def turn_spec(
    specs: Sequence[ToolSpec],
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = True,
    dialect: str | Dialect = "hermes",
    max_whitespace: int = 1,
    unusable: Sequence[UnsatisfiableToolError] = (),
    answer: ToolSpec | None = None,
) -> TurnSpec:
    """Build the spec of a turn from normalised tools and the request's tool options.

    ``answer`` (the final answer's schema): the turn is calls or that answer under ``auto``,
    the answer under ``none``, calls only where a call is required (the answer unused, as OpenAI
    serves ``tool_choice="required"`` beside a ``response_format``).

    The ``unusable`` tools (no call can satisfy them) are named in the request, so ``tool_choice``
    may name them, but no call to them can be written: they are left out. Refused only where the
    choice needs a call and allows none but them (the named tool, or every tool of ``required``).
    """
    mode, allowed = resolve_tool_choice(
        [*(s.name for s in specs), *(u.tool or "" for u in unusable)], tool_choice
    )
    chosen = tuple(s for s in specs if s.name in allowed)
    needed = [u for u in unusable if u.tool in allowed]
    if mode == "required" and not chosen and needed:
        raise _unusable_choice(needed)
    if not chosen:
        mode = "none"  # ``auto`` with no tool a call can use: nothing can be called, which is ``none``
    return TurnSpec(
        get_dialect(dialect),
        chosen if mode != "none" else (),
        mode,
        parallel_tool_calls,
        max_whitespace,
        answer,
    )


def _unusable_choice(needed: Sequence[UnsatisfiableToolError]) -> UnsatisfiableToolError:
    """The HTTP 400 of a ``tool_choice`` that requires a call, when no allowed tool can take one."""
    if len(needed) == 1:
        (only,) = needed
        return UnsatisfiableToolError(
            only.tool, only.path, f"{only.detail}; tool_choice requires a call to it"
        )
    listed = "; ".join(str(u) for u in needed)
    return UnsatisfiableToolError(
        None, "tool_choice", f"requires a call, and no call can satisfy any tool it allows: {listed}"
    )
