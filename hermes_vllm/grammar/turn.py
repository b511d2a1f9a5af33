"""The engine-independent description of one turn's grammar: dialect, tools and tool_choice.

A :class:`TurnSpec` is what every engine backend compiles and what the cache is keyed by. The
shape it describes (free text, opaque reasoning/hidden spans, tool-call spans holding exactly one
schema-valid call) is written out once per engine in ``grammar/engines/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import xgrammar as xgr

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.schema import ToolSchemaError, ToolSpec, canonical_json

LEAD_WHITESPACE = 4
"""Whitespace allowed before each reasoning span and before the first call where no free text may
come first (``required``): Qwen 3 writes two newlines after ``</think>``. Bounded like whitespace in
a call, so a weak model cannot loop on it."""

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

    def key(self) -> str:
        """Canonical text of the spec: equal specs compile to equal grammars."""
        return self._key

    @cached_property
    def _key(self) -> str:
        """Written once per spec: a prepared turn is reused by every request that resends its tools."""
        tools = [[t.name, t.parameters] for t in self.tools]
        return canonical_json([self.dialect.name, self.mode, self.parallel, self.max_whitespace, tools])


def resolve_tool_choice(specs: Sequence[ToolSpec], tool_choice: Any) -> tuple[Mode, tuple[ToolSpec, ...]]:
    """OpenAI ``tool_choice`` -> (mode, the tools a call may use).

    Delegates the OpenAI shapes (strings, named function, ``allowed_tools``) to xgrammar's
    ``normalize_tool_choice``; a named or forced choice becomes ``required`` over that one tool.
    """
    if tool_choice == "none":
        return "none", tuple(specs)
    refs = [{"type": "function", "function": {"name": s.name}} for s in specs]
    try:
        functions, _, simplified = xgr.normalize_tool_choice(tools=refs, tool_choice=tool_choice)
    except ValueError as err:
        raise ToolSchemaError(None, "tool_choice", str(err).splitlines()[0]) from None
    allowed = {f.function.name for f in functions}
    chosen = tuple(s for s in specs if s.name in allowed)
    if not chosen:
        # ``auto`` with no tools: nothing can be called, which is exactly ``none``.
        return "none", ()
    return ("auto" if simplified == "auto" else "required"), chosen


def turn_spec(
    specs: Sequence[ToolSpec],
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = True,
    dialect: str | Dialect = "hermes",
    max_whitespace: int = 1,
) -> TurnSpec:
    """Build the spec of a turn from normalised tools and the request's tool options."""
    mode, chosen = resolve_tool_choice(specs, tool_choice)
    return TurnSpec(
        get_dialect(dialect), chosen if mode != "none" else (), mode, parallel_tool_calls, max_whitespace
    )
