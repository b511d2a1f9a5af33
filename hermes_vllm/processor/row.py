"""A constrained request's row: its gate, its engine's state and its budget, with their marks.

What admission fixed for a request and everything that changes as the row follows its tokens,
kept apart from the step that moves it (:class:`~hermes_vllm.processor.core.ConstraintCore`), so
that a hosted row (speculative decoding) can mark and restore a row, and a test build one, without
the step's machinery.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hermes_vllm.budget import TurnBudget
from hermes_vllm.constraint import ConstraintRequest
from hermes_vllm.dialect import Dialect
from hermes_vllm.gate import GATE_MARK_FIELDS, TextGate
from hermes_vllm.grammar.compiler import PreparedTurn, ToolCallMatcher
from hermes_vllm.grammar.engines.base import EngineGrammar
from hermes_vllm.spans import TextFollower

UNWATCHED = 1 << 62
"""A row without a budget: no position from which the budget must read every token."""

# A paused row whose mask bans at most this many tokens (a reasoning span before a required call
# bans the stop tokens and a few tokens that end the span wrongly) has those logits set to -inf
# directly on the CPU, where the bitmask kernel reads the whole vocabulary (its cost a row:
# benchmarks/README.md, "Processor per step").
SPARSE_BANS_MAX = 1024


@dataclass(slots=True, kw_only=True)
class Gate(TextGate):
    """A row's text since its last clean point (its :class:`TextGate`: the follower, read by the
    gate and the budget, which feeds it where the row has one; the tokens since that point, which
    an engine-only row holds too: the prompt's open span, fed first), and what the row watches
    for: the part that lets a gated row (``auto`` mode) run without its engine outside calls
    (:mod:`hermes_vllm.processor.core`'s docstring)."""

    on: bool
    """Whether the row may leave the engine off outside calls (``auto`` mode); turned off for
    good once the one call a turn allows is made."""
    watch: bytes = b""
    """While gated: only tokens holding one of these bytes can change anything (empty: check all)."""
    quiet: bool = False
    """Gated, engine off, at a clean point: a new token matters only if it holds a watched byte.
    Kept up to date by :meth:`ConstraintCore.advance`, so that a step tests one field a row."""
    quiet_until: int = UNWATCHED
    """From this many consumed tokens on, the budget reads every token: the row is never quiet."""

    def regate(self, parallel: bool, begin: bytes) -> bool | None:
        """Read where the text stands: True where the engine must run (a call tag begun or open,
        or the one call a turn allows made: then the gate is off for good), False at a clean
        point (the grammar is in its initial state again, ``begin`` the bytes watched there),
        None where neither (a reasoning/hidden span, or its tag, begun)."""
        tail = self.follower.tail
        if tail.open is not None:
            # Inside a call or a reasoning/hidden span, only its end tag changes the situation.
            assert tail.open.tags is not None
            self.watch = b"" if tail.end_begun else tail.open.tags.end[:1].encode()
            return True if tail.open.kind == "call" else None
        if tail.begun is not None:
            self.watch = b""
            return True if tail.begun == "call" else None
        if (self.follower.calls or tail.calls) and not parallel:
            # The one allowed call is made: the engine keeps refusing another to the end.
            self.on = False
            return True
        self.pending = []
        self.watch = begin
        return False

    def read_all_from(self, position: int) -> None:
        """From ``position`` consumed tokens on, the budget reads every token."""
        self.quiet_until = position

    def wake(self) -> None:
        """Read the next token whatever bytes it holds (the text has moved without a step)."""
        self.quiet = False

    def settle(self, engine_off: bool) -> None:
        """After a step: quiet where gated, at a clean point with the engine off."""
        self.quiet = engine_off and self.on and bool(self.watch) and not self.pending

    def stop(self) -> None:
        """The row failed: nothing to watch or replay any more."""
        self.quiet = False
        self.pending = []


@dataclass(slots=True)
class EngineState:
    """Where a row's grammar engine stands: its matcher, and whether the row is over."""

    matcher: ToolCallMatcher | None = None
    """The engine's matcher while switched on; ``None`` while the gate alone watches the row."""
    failed: str | None = None
    """Why the row was stopped (a refused token, a failed compile): only its stop tokens are
    allowed from then on, never unconstrained text."""
    ended: bool = False
    """The engine accepted a stop token: the turn is over, only stop tokens are allowed (an
    engine refuses to mask after its end; vLLM asks for no mask there, a row kept on may)."""
    paused: np.ndarray | None = None
    """An engine-only row inside a reasoning span (:meth:`TurnBudget.in_quiet_span`): the mask
    the engine gave there, reused while the engine is left alone."""
    paused_bans: torch.Tensor | None = None
    """The tokens that mask bans, when they are few (:data:`SPARSE_BANS_MAX`)."""

    def start(self, matcher: ToolCallMatcher) -> None:
        self.matcher = matcher

    def switch_off(self) -> None:
        """At a clean point: the gate alone watches the row again."""
        self.matcher = None

    def feed(self, tokens: Sequence[int]) -> int | None:
        """Feed the running matcher; the first token it refuses (the row must fail), else None."""
        matcher = self.matcher
        assert matcher is not None
        for token in tokens:
            if not matcher.accept_token(token):
                return token
        self.ended = bool(tokens) and matcher.is_terminated()
        return None

    def fail(self, reason: str) -> None:
        self.failed = reason
        self.matcher = None

    def pause(self, mask: np.ndarray, width: int) -> None:
        """Keep ``mask`` for the span's content, and its bans where they are few."""
        self.paused = mask
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:width]
        bans = np.flatnonzero(bits == 0)
        self.paused_bans = torch.from_numpy(bans) if bans.size <= SPARSE_BANS_MAX else None

    def resume(self) -> None:
        self.paused = self.paused_bans = None


RowMark = tuple[Any, ...]
"""A row's :meth:`RowState.mark`."""


@dataclass(slots=True)
class LaneTicket:
    """What a row entering the call lane (:meth:`ConstraintCore._lane`) was found to be, kept so
    that its next tokens are checked in O(1) without reading the row again: everything
    :meth:`ConstraintCore._lengthens` checks of the row holds until the row takes another path,
    since a lane token changes none of it. Valid while :attr:`at` equals the row's ``consumed``
    (any other path moves ``consumed`` on without it; failing a row or going back to a mark drops
    the ticket)."""

    at: int
    """The row's count of consumed tokens the ticket holds for."""
    until: int
    """Lane tokens are taken while the count before them is below this (the budget stays calm:
    :meth:`TurnBudget.calm_in_call`)."""
    plain: bytes
    """Per token, 1 where it only lengthens this call (:meth:`ConstraintCore._plain_tokens`)."""
    latin1: list[str]
    follower: TextFollower
    pending: list[int] | None
    """A gated row's tokens held since its last clean point (each lane token is appended)."""
    progress: Any
    """The budget's progress, whose planned position a lane token moves on (None: no budget)."""
    matcher: ToolCallMatcher
    batchable: Any
    """The matcher's xgrammar handle, accepted and filled in batch."""


@dataclass(slots=True)
class RowState:
    """One constrained request's row: what admission fixed (shared by copies), how many output
    tokens it has seen, and its three parts: :class:`Gate`, :class:`EngineState` and its
    :class:`TurnBudget`, each with its own ``copy()``."""

    request: ConstraintRequest
    prepared: PreparedTurn
    future: Future[EngineGrammar]
    stop_ids: tuple[int, ...]
    refused_stops: tuple[str, ...]
    """The request's stop strings (latin-1): no token may complete one inside a call, nor before
    the call a ``required`` turn owes."""
    refused_in_calls: tuple[str, ...]
    """The reasoning tag, refused inside calls when vLLM's own thinking budget watches the row
    (vLLM would start counting a span there and force its closing tag into the call)."""
    gate: Gate
    engine: EngineState = field(default_factory=EngineState)
    budget: TurnBudget | None = None
    """The row's token budgets (span budgets, call reserve, closing cut calls)."""
    consumed: int = 0
    """Output tokens already seen."""
    lane: LaneTicket | None = None
    """Where the row took the call lane: its next lane token is checked in O(1)."""

    @property
    def dialect(self) -> Dialect:
        return self.prepared.spec.dialect

    @property
    def failed(self) -> str | None:
        """Why the row was stopped, if it was (:attr:`EngineState.failed`)."""
        return self.engine.failed

    def mark(self, behind: int = 0) -> RowMark:
        """Where the row stands, for a draft path to come back to (:meth:`back_to`): every field
        that changes as the row follows its tokens, read into one tuple. Nothing is copied but
        the budget's progress: the other fields hold immutable values or objects only ever
        rebound (the paused mask), the gate's text is marked as every gate's is
        (:meth:`TextGate.mark`, first), and the matcher by its count of accepted tokens (engines
        roll back, they cannot copy).

        ``behind``: the row's last ``behind`` tokens were taken by its engine alone, their text
        not followed yet (a hosted row's path, :meth:`ConstraintCore.engine_alone_until`): the
        mark is the row before them, its text being followed now (the engine had not ended)."""
        gate, engine = self.gate, self.engine
        matcher = engine.matcher
        return (
            *gate.mark(), self.consumed - behind, gate.on, gate.watch, gate.quiet, gate.quiet_until,
            matcher, 0 if matcher is None else matcher.accepted - behind, engine.failed,
            engine.ended and not behind, engine.paused, engine.paused_bans,
            None if self.budget is None else self.budget.progress.copy(),
        )  # fmt: skip

    def back_to(self, mark: RowMark) -> None:
        """Put the row back where :meth:`mark` found it (a mark may be gone back to more than once;
        the marks taken after it are void, since the pending list is cut back to its length)."""
        gate, engine = self.gate, self.engine
        self.lane = None
        gate.back_to(mark)
        (
            self.consumed, gate.on, gate.watch, gate.quiet, gate.quiet_until,
            matcher, accepted, engine.failed, engine.ended, engine.paused, engine.paused_bans, progress,
        ) = mark[GATE_MARK_FIELDS:]  # fmt: skip
        engine.matcher = matcher
        if matcher is not None and matcher.accepted > accepted:
            matcher.rollback(matcher.accepted - accepted)
        if progress is not None:
            assert self.budget is not None
            self.budget.progress = progress.copy()
