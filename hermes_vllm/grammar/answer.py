"""Shortest completions of a turn's final answer (its ``response_format``'s JSON), for the budgets.

The answer is a JSON value under its schema, like a call's arguments: it is read through the
call completer as the arguments of a call named :data:`~hermes_vllm.grammar.turn.ANSWER_NAME`
(name first), and the call's own ending (``}`` and the closing tag) is taken off again. So the
answer is finished the same way a call is (the shortest value by the vocabulary's tokens, under
the same schemas the engines compile), with no second reader of partial JSON to keep in step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hermes_vllm.dialect import Dialect
from hermes_vllm.grammar.completion import CallCompleter, Measure
from hermes_vllm.grammar.turn import ANSWER_NAME
from hermes_vllm.schema import canonical_json


class AnswerCompleter:
    """The shortest completions of one answer schema."""

    def __init__(self, dialect: Dialect, schema: Any) -> None:
        self._calls = CallCompleter(replace(dialect, key_order="name_first"), [(ANSWER_NAME, schema)])
        self._head = f'{dialect.tool_call.begin}{{"name": {canonical_json(ANSWER_NAME)}, "arguments": '
        self._end = "}" + dialect.tool_call.end

    def complete(self, answer: str, measure: Measure = len) -> str | None:
        """The shortest text (by ``measure``) that makes ``answer`` (the answer written so far,
        leading whitespace dropped) a complete answer; ``""`` when it is one; ``None`` when no
        reading is known."""
        completion = self._calls.complete(self._head + answer, measure)
        if completion is None or not completion.endswith(self._end):
            return None
        return completion[: -len(self._end)]

    def shortest(self, measure: Measure = len) -> str | None:
        """The shortest whole answer."""
        return self.complete("", measure)

    def lookahead(self, measure: Measure = len) -> int:
        """The most one token can add to a begun answer's shortest completion (see
        :meth:`CallCompleter.lookahead`)."""
        return self._calls.lookahead(measure)

    def unknown(self) -> list[str]:
        """Where the answer's schema has no shortest value, one message each."""
        return self._calls.unknown()
