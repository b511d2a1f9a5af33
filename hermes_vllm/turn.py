"""The turn a request asks for, engine-free: what the grammar compiles and what the budget counts.

A :class:`TurnSpec` (dialect, tools, tool_choice's mode, parallel calls, whitespace, answer) is
read by :mod:`hermes_vllm.grammar` (which writes it out per engine and keys its cache by it) and
by :mod:`hermes_vllm.budget` (which counts what it needs); it lives below both, so the budget
reads a turn without importing a grammar engine. Built from a request by
:func:`hermes_vllm.grammar.turn.turn_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from hermes_vllm.dialect import Dialect
from hermes_vllm.schema import ToolSpec, canonical_json

MARK = " [closed by max_tokens]"
"""Content written right after a call that the budget closed (its arguments may be truncated);
a turn with an answer admits it after its last call, where it admits no other text."""
ANSWER_NAME = "response_format"
"""What errors call the final answer's schema (it is read like a tool's arguments)."""


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
