"""What a turn needs at the least, read once per constraint: its completers and, counted in one
vocabulary's tokens, its shortest call, its reserves and its lookaheads.

The frontend's admission check and the engine's budget read the same numbers (a ``max_tokens``
the frontend admits is one the engine's budget can keep), so both take them from one
:class:`TurnNeeds`, built once per constraint and kept with its prepared turn.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from hermes_vllm.budget.completer import AnswerCompleter, CallCompleter
from hermes_vllm.budget.speller import Speller
from hermes_vllm.budget.turn_budget import call_reserve
from hermes_vllm.grammar.turn import TurnSpec


@dataclass(frozen=True)
class Counts:
    """A turn's needs in one vocabulary's tokens."""

    shortest_call: str | None
    """The turn's shortest call, measured in these tokens (``None``: no tool has one)."""
    call_reserve: tuple[int, int]
    """Tokens the owed call keeps: dropped when cut, closed (its mark after it) when cut."""
    lookahead: int
    """The most one token adds to a begun call's shortest completion."""
    answer_reserve: int
    """Tokens the shortest answer keeps, plus the margin (0: the turn has no answer)."""
    answer_lookahead: int

    def reserve(self, close: bool) -> int:
        """Tokens the turn keeps for its call, under the cut policy ``close`` or not."""
        return self.call_reserve[close]


class TurnNeeds:
    """One turn's completers, and its :class:`Counts` per vocabulary (kept while its speller lives)."""

    def __init__(self, spec: TurnSpec, margin: int) -> None:
        self.margin = margin
        self.completer = CallCompleter(spec.dialect, [(t.name, t.parameters) for t in spec.tools])
        self.answer = (
            AnswerCompleter(spec.dialect, spec.answer.parameters)
            if spec.answers and spec.answer is not None
            else None
        )
        self._counts: weakref.WeakKeyDictionary[Speller, Counts] = weakref.WeakKeyDictionary()

    def counts(self, speller: Speller) -> Counts:
        """The needs counted in ``speller``'s tokens (computed once per speller)."""
        found = self._counts.get(speller)
        if found is None:
            found = self._counts[speller] = self._count(speller)
        return found

    def _count(self, speller: Speller) -> Counts:
        shortest = self.completer.shortest_call(speller.tokens)
        answer = self.answer
        answer_shortest = None if answer is None else answer.shortest(speller.tokens)
        return Counts(
            shortest,
            (
                call_reserve(shortest, False, speller, self.margin),
                call_reserve(shortest, True, speller, self.margin),
            ),
            self.completer.lookahead(speller.tokens),
            0 if answer_shortest is None else call_reserve(answer_shortest, False, speller, self.margin),
            0 if answer is None else answer.lookahead(speller.tokens),
        )
