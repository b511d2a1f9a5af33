"""What a turn needs at the least, read once per constraint: its completers and, counted in one
vocabulary's tokens, its shortest call, its reserves and its lookaheads.

The frontend's admission check and the engine's budget read the same numbers (a ``max_tokens``
the frontend admits is one the engine's budget can keep), so both take them from one
:class:`TurnNeeds`, built once per constraint and kept with its prepared turn.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from hermes_vllm.budget.completer import AnswerCompleter, CallCompleter
from hermes_vllm.budget.speller import Speller
from hermes_vllm.budget.turn_budget import call_reserve
from hermes_vllm.turn import TurnSpec


class TurnNeeds:
    """One turn's completers, and its needs counted per vocabulary (each computed on first use,
    kept while its speller lives: the frontend asks only for what its check reads, the engine's
    budget for the rest)."""

    def __init__(self, spec: TurnSpec, margin: int) -> None:
        self.margin = margin
        self.completer = CallCompleter(spec.dialect, [(t.name, t.parameters) for t in spec.tools])
        self.answer = (
            AnswerCompleter(spec.dialect, spec.answer.parameters)
            if spec.answers and spec.answer is not None
            else None
        )
        self._counted: weakref.WeakKeyDictionary[Speller, dict[str, Any]] = weakref.WeakKeyDictionary()

    def _once(self, speller: Speller, name: str, compute: Callable[[], Any]) -> Any:
        counted = self._counted.setdefault(speller, {})
        if name not in counted:
            counted[name] = compute()
        return counted[name]

    def shortest_call(self, speller: Speller) -> str | None:
        """The turn's shortest call, measured in ``speller``'s tokens (``None``: no tool has one)."""
        result: str | None = self._once(speller, "call", lambda: self.completer.shortest_call(speller.tokens))
        return result

    def reserve(self, speller: Speller, close: bool) -> int:
        """Tokens the owed call keeps: its shortest spelling, :data:`~hermes_vllm.budget.MARK` after
        it where a cut call is closed, the margin (:func:`call_reserve`)."""
        return call_reserve(self.shortest_call(speller), close, speller, self.margin)

    def lookahead(self, speller: Speller) -> int:
        """The most one token adds to a begun call's shortest completion."""
        result: int = self._once(speller, "lookahead", lambda: self.completer.lookahead(speller.tokens))
        return result

    def answer_reserve(self, speller: Speller) -> int:
        """Tokens the shortest answer keeps, plus the margin (0: the turn has no answer)."""
        answer = self.answer
        if answer is None:
            return 0
        shortest = self._once(speller, "answer", lambda: answer.shortest(speller.tokens))
        return 0 if shortest is None else call_reserve(shortest, False, speller, self.margin)

    def answer_lookahead(self, speller: Speller) -> int:
        """The most one token adds to a begun answer's shortest completion (0: no answer)."""
        answer = self.answer
        if answer is None:
            return 0
        result: int = self._once(speller, "answer_lookahead", lambda: answer.lookahead(speller.tokens))
        return result
