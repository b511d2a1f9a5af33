"""What a clean-point gate follows: a turn's text since its last clean point and the tokens since it.

At a clean point (free text, no span open, no tag begun) a turn's grammar is where it started, so
a grammar engine may be left alone there and a fresh matcher, fed the tokens since the last clean
point, stands exactly where one fed the whole turn would. Two gates use this: the processor's row
(:class:`hermes_vllm.processor.row.Gate`, which decides from the text where its engine runs) and
the public matcher's (``grammar/compiler.py``, for offline users). They decide what follows from
the text each in its own terms, but follow it, hold the tokens since a clean point, mark where
they stand and come back to a mark with this one piece of code (each once kept its own copy).

A mark is the follower's fields (immutable values, rebound as it moves) and the pending list with
its length: the list bound here is only ever appended to (reaching a clean point rebinds it), so
the length marks it, and marking costs the same however long a call is. :class:`GateHistory`
keeps the marks of the last :data:`GATE_ROLLBACK` tokens, for a gate that rolls back token by
token; a rollback deeper than that is refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hermes_vllm.spans import Tail, TextFollower

GATE_ROLLBACK = 256
"""Tokens a gate's history can roll back (speculative decoding rolls back a step's drafts at
most): it keeps where the gate stood before each of them, and no more."""

GateMark = tuple[str, Tail, int, str, list[int], int]
"""Where a gate stood (:meth:`TextGate.mark`): its follower's text, tail, calls and recent text,
its pending list and that list's length."""

GATE_MARK_FIELDS = 6
"""The fields of a :data:`GateMark`: a longer mark beginning with one (a row's) is read by
:meth:`TextGate.back_to` up to there."""


@dataclass(slots=True)
class TextGate:
    """A turn's text since its last clean point and the tokens since it (module docstring)."""

    follower: TextFollower
    """The text since the last clean point and where it stands (its tail)."""
    pending: list[int] = field(default_factory=list)
    """Tokens since the last clean point: replayed into a fresh matcher when the engine switches on.
    A list bound here is only ever appended to (emptying rebinds it), so that a mark records it by
    its length."""

    def hold(self, tokens: Sequence[int]) -> None:
        """Keep ``tokens`` for a matcher that starts at the last clean point."""
        self.pending.extend(tokens)

    def take_pending(self) -> list[int]:
        """The tokens kept since the last clean point, handed to a matcher (and no longer kept)."""
        tokens, self.pending = self.pending, []
        return tokens

    def mark(self) -> GateMark:
        """Where the gate stands, nothing copied (module docstring)."""
        follower, pending = self.follower, self.pending
        return follower.text, follower.tail, follower.calls, follower.recent, pending, len(pending)

    def back_to(self, mark: Sequence[Any]) -> None:
        """Stand where :meth:`mark` found the gate (read from the first :data:`GATE_MARK_FIELDS`
        fields of ``mark``); the marks taken after it are void, since the pending list is cut back
        to its length."""
        follower = self.follower
        follower.text, follower.tail, follower.calls, follower.recent, pending, held = mark[:GATE_MARK_FIELDS]
        del pending[held:]
        self.pending = pending


class GateHistory:
    """A gate's marks before each of its last :data:`GATE_ROLLBACK` tokens: a rollback puts one
    mark back instead of replaying the turn, and a long turn keeps no more than the window."""

    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: deque[tuple[Any, ...]] = deque(maxlen=GATE_ROLLBACK)

    def push(self, mark: tuple[Any, ...]) -> None:
        """Keep ``mark``, taken before a token (the oldest beyond the window is dropped)."""
        self._marks.append(mark)

    def back(self, num_tokens: int) -> tuple[Any, ...]:
        """The mark taken before the last ``num_tokens`` tokens (> 0), dropped with the later ones;
        ``ValueError``, with nothing dropped, beyond the window."""
        if num_tokens > len(self._marks):
            raise ValueError(
                f"cannot roll back {num_tokens} tokens: a gated matcher keeps the last {GATE_ROLLBACK}"
            )
        for _ in range(num_tokens - 1):
            self._marks.pop()
        return self._marks.pop()
