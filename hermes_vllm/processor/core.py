"""The batch core shared by both runners' adapters: per-row gates and matchers, one bitmask a step.

Rows are keyed by whatever the adapter uses (V1: batch index, V2: request slot). Each step the
adapter hands over each constrained row's newly committed tokens; the core advances the row, fills
the bitmask rows that need it, and applies them in place. Rows whose mask would allow every token
are left untouched.

Outside tool calls the grammar allows every token, so in ``auto`` mode a row runs a cheap *gate*
instead of the grammar engine (xgrammar costs several microseconds a token even in free text):
tokens that cannot touch a tag (a numpy lookup) are skipped; the others are read with the same
span reader the parsers use (:func:`hermes_vllm.spans.read_tail`, strict about calls: a closing
tag inside an unfinished payload does not end one). The engine is switched on when
a call tag has begun (or may be completed by the next token) and off again at the next *clean
point*: free text, no span open, no tag begun. From a clean point the grammar is back in its
initial state, so a fresh matcher fed the tokens since the last clean point is exact. Modes whose
free text is itself constrained (``required``, ``none``, one call at most after it was made) run the
engine throughout. A vocabulary with a token holding a whole call tag plus more text disables the
gate, since that token could open an invalid call in one step.

Compiles start when a request is admitted and run on a background pool; a row waits for its
grammar only when the engine is switched on. What a row is masked with never depends on whether
its compile had finished, so every tensor-parallel worker applies the same masks.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from hermes_vllm.budget import NOTHING, Plan, Speller, TurnBudget
from hermes_vllm.constraint import ConstraintRequest, parse_constraint
from hermes_vllm.dialect import Dialect, available_dialects, get_dialect
from hermes_vllm.grammar import GrammarCompileError, ToolGrammarCompiler
from hermes_vllm.grammar.compiler import CompiledToolGrammar, ToolCallMatcher, prepare_constraint
from hermes_vllm.grammar.engines.base import KEY_CHARACTERS_MAX, allocate_bitmask, token_allowed
from hermes_vllm.grammar.engines.xgrammar import batch_accept, batch_fill
from hermes_vllm.latin1 import utf8_need
from hermes_vllm.metrics import record_step
from hermes_vllm.processor.admission import prepared_turn, refused_texts, turn_reserve
from hermes_vllm.processor.row import UNWATCHED, Gate, LaneTicket, RowState
from hermes_vllm.processor.token_index import TokenIndex, token_index
from hermes_vllm.settings import get_limits
from hermes_vllm.spans import TextFollower, open_at_end
from hermes_vllm.turn import TurnSpec

logger = logging.getLogger(__name__)

# From this many rows needing the engine, filling them in one multi-threaded call beats
# per-row fills that can skip all-allowed rows.
BATCH_FILL_MIN = 8


class Fill(Enum):
    """What a row's mask at a position is made of (:meth:`ConstraintCore.decide`)."""

    FREE = "free"
    """Gated, engine off: every token allowed, no mask."""
    STOPS = "stops"
    """Ended or failed: only the row's stop tokens."""
    BUDGETED = "budgeted"
    """The engine's mask narrowed by what the budget demands (a forced text, bans)."""
    ENGINE = "engine"
    """The engine's mask."""
    PAUSE = "pause"
    """Entering a quiet span: the engine's mask, kept for the span's content."""
    PAUSED = "paused"
    """Inside a quiet span: the mask kept when it was entered."""


PROMPT_TAIL = 256
"""Prompt tokens read for a span the generation prompt leaves open (it opens at the very end)."""

_STRING_BREAKS = b'"\\' + bytes(range(32))
"""The bytes that end a JSON string's plain run: its quote, the escape, the control characters."""


PROBES = 2
"""Words of a packed mask row, each of plain string tokens only, a filled mask is tried on before
all of them (:class:`PlainStrings`)."""


@dataclass(frozen=True)
class PlainStrings:
    """A vocabulary's plain string tokens (:meth:`ConstraintCore.string_plain`)."""

    kinds: bytes
    """Per token id: 1 for a plain token; 2 for one that may leave a string value open behind it
    (a quote with nothing but string characters after its last one, or an escape), where a mask
    is worth trying a few plain tokens later; 0 for any other."""
    words: np.ndarray
    """The same as a packed mask row."""
    probe: tuple[int, ...]
    """A few words of :attr:`words` that hold plain tokens only, spread over the vocabulary: a
    mask that does not allow them all (a key, a literal, a number) refuses some of these."""

    def allowed_by(self, rows: np.ndarray, row: int) -> bool:
        """Whether the packed mask ``rows[row]`` allows every plain token (the probe words read
        from ``rows`` itself: most masks tried are refused there, before a row is viewed)."""
        item = rows.item
        for word in self.probe:
            if item(row, word) != -1:
                return False
        return bool((rows[row] & self.words).tobytes() == self.words.tobytes())


_STRUCTURE = re.compile(r'[,:{}\[\]"\x00-\x1f]')
"""What a JSON string's body cannot hold unescaped, besides its escapes."""


def _may_open_string(piece: str) -> bool:
    """Whether a token (latin-1) may leave the text inside a string value: it holds an escape, or
    a quote with nothing after its last one that a string's body could not hold (``' "'``,
    ``'": "'``, ``' "Sa'``; not ``'",'``). Only where to try a mask: the mask decides."""
    if "\\" in piece:
        return True
    quote = piece.rfind('"')
    return quote >= 0 and _STRUCTURE.search(piece, quote + 1) is None


def _utf8_text(piece: str) -> bool:
    """Whether a token's bytes (latin-1) are whole UTF-8 characters from a boundary, at least one."""
    try:
        return bool(piece.encode("latin-1").decode("utf-8"))
    except UnicodeDecodeError:
        return False


class ConstraintCore:
    """Per-row state and the step's bitmask for one engine process."""

    def __init__(
        self,
        tokenizer_loader: Callable[[], Any],
        vocab_size: int,
        engine: str = "xgrammar",
        pin_memory: bool = False,
    ) -> None:
        self._tokenizer_loader = tokenizer_loader
        self.vocab_size = vocab_size
        self.engine = engine
        self.pin_memory = pin_memory
        self.bitmask = allocate_bitmask(1, vocab_size, pin_memory)
        self._quiet_holds: np.ndarray | None = None
        """Tokens holding a byte any quiet row watches (the union over the dialects seen)."""
        self._quiet_watches: set[bytes] = set()
        self.log_refusals = True
        """Whether a token the engine refuses is logged as ending its row (an error). A hosted row
        (speculative decoding) puts its row back where it was before a refused draft instead, and
        tells vLLM, which ends a request itself where a sampled token is refused."""
        self._plain_strings: dict[str, PlainStrings | None] = {}
        """:meth:`string_plain` by the closing tag's first character (the dialects': a handful)."""

    @cached_property
    def compiler(self) -> ToolGrammarCompiler:
        """Built on first use: loading a 150k-token vocabulary is not free."""
        return ToolGrammarCompiler(self._tokenizer_loader(), engine=self.engine, vocab_size=self.vocab_size)

    @cached_property
    def speller(self) -> Speller:
        """Spells forced text; stop tokens never spell text."""
        return Speller(self.compiler.vocab.latin1, self.compiler.vocab.stop_token_ids)

    @cached_property
    def index(self) -> TokenIndex:
        """Which tokens hold a text or begin with one: the stop strings' refusal and the gates
        read it (the vocabulary's, shared by every core of the tokenizer)."""
        return token_index(self.compiler.vocab)

    def warm(self) -> None:
        """Build what every constrained request needs, once, at the engine's start-up: the
        vocabulary's tables, the speller, the token index, each dialect's gate, refusal and call-lane masks
        and the engine's own vocabulary setup. Built on a first request instead, they stalled
        every running stream for over a second (``benchmarks/stall.py``); built before vLLM's
        engine freezes its start-up heap, the collector never traverses them again."""
        compiler = self.compiler
        vocab = compiler.vocab
        words = (self.vocab_size + 31) // 32
        _ = self.speller, self.index, vocab.whole_words(words)
        for name in available_dialects():
            dialect = get_dialect(name)
            begin, end = self._begin_bytes(dialect), dialect.tool_call.end[0]
            _ = self.index.holding_any(begin), vocab.no_call_words(dialect, words)
            _ = self._plain_tokens(end, begin), self._plain_tokens(end, None), self.string_plain(end)
            vocab.gate_allowed(dialect)
        compiler.warm()

    def admit_params(
        self, params: Any, prompt: Sequence[int] | None = None, *, readied: bool = False
    ) -> RowState | None:
        """:meth:`admit` for a ``SamplingParams``: its stop tokens, ``max_tokens``, stop strings and
        ``thinking_token_budget``; then :meth:`open_from_prompt` where the prompt is known.
        ``readied``: :meth:`ready` ran for ``params`` (and counted its look at the grammar cache)."""
        state = self.admit(
            params.extra_args,
            params.all_stop_token_ids,
            max_tokens=params.max_tokens,
            thinking_budget=getattr(params, "thinking_token_budget", None),
            stop=params.stop or (),
            readied=readied,
        )
        if state is not None and prompt:
            self.open_from_prompt(state, prompt)
        return state

    def ready(self, params: Any) -> None:
        """Do the cold part of admitting a ``SamplingParams`` ahead of :meth:`admit_params`: the
        prepared turn, its compile started, and its budgets' needs in this vocabulary, each kept
        by the memos admission then reads. Touches no row and no part of the core a fill uses,
        so a hosted row's admission does it without the host's lock (the fills of every other
        row wait on that lock)."""
        request = parse_constraint(params.extra_args)
        if request is None:
            return
        compiler = self.compiler
        prepared = prepare_constraint(request, type(compiler.engine), compiler.limits, admitted=True)
        compiler.submit(prepared)
        spec = prepared.spec
        if params.max_tokens is None or (spec.mode == "none" and spec.answer is None):
            return
        needs = prepared_turn(request, self.engine, get_limits()).needs
        turn_reserve(request, self.engine, self.speller)
        needs.lookahead(self.speller)
        needs.answer_reserve(self.speller)
        needs.answer_lookahead(self.speller)

    def open_from_prompt(self, state: RowState, prompt: Sequence[int]) -> None:
        """Start a new row inside the span its prompt leaves open (a generation prompt ending with
        ``<think>``, see :func:`~hermes_vllm.spans.open_at_end`), before its first output token.

        The prompt's tokens from the one holding the opening tag are the row's first text: the
        gate and the engine read the output after them (a call tag in the span is text), and the
        span budget counts the prompt's tokens after the tag, as vLLM's thinking budget does.
        Only the prompt's last :data:`PROMPT_TAIL` tokens are read.
        """
        latin1 = self.compiler.vocab.latin1
        tail = list(prompt[-PROMPT_TAIL:])
        pieces = [latin1[t] if 0 <= t < len(latin1) else "" for t in tail]
        span = open_at_end("".join(pieces), state.dialect)
        if span is None:
            return
        first, at = 0, 0
        while at + len(pieces[first]) <= span.start:
            at += len(pieces[first])
            first += 1
        if pieces[first][: span.start - at].strip():
            # The tag shares a token with the text before it: no grammar state to start from.
            logger.warning("hermes-vllm: the prompt's open span starts inside a token; starting in free text")
            return
        state.gate.hold(tail[first:])  # replayed (gated) or fed first (engine-only) into the matcher
        for piece in pieces[first:]:
            self._follow(state, piece)
        if state.gate.on:
            state.gate.wake()
            self._regate(state)

    def admit(
        self,
        extra_args: Any,
        stop_token_ids: Sequence[int],
        *,
        max_tokens: int | None = None,
        thinking_budget: int | None = None,
        stop: str | Sequence[str] = (),
        readied: bool = False,
    ) -> RowState | None:
        """Start constraining a request entering the batch; ``None`` when it asks for nothing.

        ``thinking_budget`` is vLLM's ``thinking_token_budget``: it wins over the request's
        ``vllm_xargs`` budget and the server's ``HERMES_VLLM_REASONING_BUDGET``. It caps the turn's
        spans together; vLLM's own thinking budget counts each span alone, the same way, so it
        never reaches its limit before ours. ``readied``: as in :meth:`admit_params`.
        """
        request = parse_constraint(extra_args)
        if request is None:
            return None
        # vLLM ran validate_params on admission: the metaschema check need not run again.
        compiler = self.compiler
        prepared = prepare_constraint(request, type(compiler.engine), compiler.limits, admitted=True)
        spec = prepared.spec
        stops = tuple(dict.fromkeys((*compiler.vocab.stop_token_ids, *stop_token_ids)))
        gated = spec.free_text and compiler.vocab.gate_allowed(spec.dialect)
        budgeted = max_tokens is not None and (spec.mode != "none" or spec.answer is not None)
        refused_stops, refused_in_calls = (
            refused_texts(spec.dialect, stop, thinking_budget) if budgeted else ((), ())
        )
        follower = TextFollower(
            spec.dialect, reach=max(map(len, refused_stops + refused_in_calls), default=0)
        )
        budget = None
        if max_tokens is not None and budgeted:
            budget = self._budget(request, spec, follower, max_tokens, thinking_budget)
        watch = self._begin_bytes(spec.dialect) if gated else b""
        gate = Gate(
            follower, on=gated, watch=watch, quiet=gated,
            quiet_until=UNWATCHED if budget is None else budget.watch_from,
        )  # fmt: skip
        state = RowState(
            request, prepared, compiler.submit(prepared, counted=not readied), stops, refused_stops,
            refused_in_calls, gate,
            budget=budget,
        )  # fmt: skip
        if gated and watch not in self._quiet_watches:
            self._quiet_watches.add(watch)
            holds = self.index.holding_any(watch)
            self._quiet_holds = holds if self._quiet_holds is None else self._quiet_holds | holds
        return state

    def _budget(
        self,
        request: ConstraintRequest,
        spec: TurnSpec,
        follower: TextFollower,
        max_tokens: int,
        thinking: int | None,
    ) -> TurnBudget:
        """The row's :class:`TurnBudget`, from the turn's needs in this engine's vocabulary."""
        required = spec.mode == "required"
        options = request.budget
        needs = prepared_turn(request, self.engine, get_limits()).needs
        return TurnBudget(
            spec.dialect, follower, needs.completer, self.speller,
            max_tokens=max_tokens, reasoning_budget=options.turn_budget(thinking), required=required,
            # A turn owing a call or an answer closes a cut call: dropped, the reply had neither.
            close=options.closes(required or needs.answer is not None), margin=needs.margin,
            reserve=turn_reserve(request, self.engine, self.speller), lookahead=needs.lookahead(self.speller),
            answer=needs.answer, answer_reserve=needs.answer_reserve(self.speller),
            answer_lookahead=needs.answer_lookahead(self.speller),
        )  # fmt: skip

    @staticmethod
    def _begin_bytes(dialect: Dialect) -> bytes:
        return bytes({ord(p.begin[0]) for p in (dialect.tool_call, *dialect.free_spans)})

    def advance(self, state: RowState, new_tokens: Sequence[int]) -> None:
        """Feed a row the tokens committed since the last step.

        A token at a position the budget did not plan for (a row resumed after preemption replays
        its whole output into a fresh state) is planned for first: what the budget was forcing
        there (the rest of a closing completion, its mark) is forced again after resumption.
        """
        if len(new_tokens) == 1 and self._lengthen_call(state, new_tokens[0]):
            return
        budget = state.budget
        if (budget is not None or state.gate.on) and new_tokens and state.engine.failed is None:
            latin1 = self.compiler.vocab.latin1
            for i, token in enumerate(new_tokens):
                if budget is not None and budget.progress.planned != state.consumed + i:
                    budget.plan(state.consumed + i)
                self._follow(state, latin1[token] if 0 <= token < len(latin1) else "")
            if budget is not None and state.gate.on:  # only a gated row is ever quiet
                state.gate.read_all_from(budget.watch_from)
        self._advance(state, new_tokens)
        engine = state.engine
        state.gate.settle(engine.matcher is None and engine.failed is None)

    def _lengthen_call(self, state: RowState, token: int) -> bool:
        """Advance a row inside a call by one token that only lengthens the call's text, in O(1);
        False, with nothing done, where the token needs :meth:`advance`'s full reading
        (:meth:`_lengthens`)."""
        matcher = self._lengthens(state, token)
        if matcher is None:
            return False
        self._lengthen(state, token)
        if not matcher.accept_token(token):
            self._fail(state, f"sampled token {token} is outside the grammar", self.log_refusals)
        else:
            state.engine.ended = matcher.is_terminated()
        return True

    def _lengthens(self, state: RowState, token: int) -> ToolCallMatcher | None:
        """The row's matcher where ``token`` only lengthens the call the row is inside, else None.

        Inside a call, with nothing forced, at a character boundary, and no stop string or tag
        watched in the recent text, a token of whole characters without the closing tag's first byte changes
        only the call's text, the engine's matcher and the tokens held for it: the budget counts
        no span token, the follower reads no tail, the gate keeps its watch. Taking that path
        skips the follower's, the budget's and the gate's general readings of every token
        (most tokens of a call: its keys, values, punctuation), with the same result.
        """
        engine = state.engine
        matcher = engine.matcher
        gate = state.gate
        budget = state.budget
        if matcher is None or engine.paused is not None or (budget is None and not gate.on):
            return None
        follower = gate.follower
        tail = follower.tail
        span = tail.open
        if span is None or span.kind != "call" or tail.end_begun or follower.reach:
            return None
        if budget is not None:
            progress = budget.progress
            if progress.forcing or progress.utf8 or progress.planned != state.consumed:
                return None
        latin1 = self.compiler.vocab.latin1
        if not 0 <= token < len(latin1):
            return None
        piece = latin1[token]
        assert span.tags is not None
        if span.tags.end[0] in piece or (not piece.isascii() and utf8_need(0, piece)):
            return None
        if gate.on and (not gate.watch or self.index.holding_any(gate.watch)[token]):
            return None
        return matcher

    def _lengthen(self, state: RowState, token: int) -> None:
        """Follow a token :meth:`_lengthens` let through, all but the engine's matcher."""
        gate = state.gate
        gate.follower.text += self.compiler.vocab.latin1[token]
        state.consumed += 1
        if gate.on:
            gate.pending.append(token)
            if state.budget is not None:
                gate.read_all_from(state.budget.watch_from)
        gate.quiet = False  # the engine runs: what settling after a step gives

    def _lane(self, state: RowState, token: int) -> Any:
        """A step's cheapest path (the *call lane*): where ``token`` only lengthens the row's call
        (:meth:`_lengthens`), its matcher is plain xgrammar (:attr:`ToolCallMatcher.batchable`),
        the token is no stop token, and the budget demands nothing of the next token, the row is
        followed and planned here, its matcher counts the token, and its xgrammar matcher is
        returned: the step accepts the lane's tokens and fills their masks in one batched call
        each, every lane row's decision being :attr:`Fill.ENGINE` (no stop string is watched:
        ``_lengthens`` lets none through). None, with nothing done, otherwise.

        A row that took the lane at its last token holds a :class:`LaneTicket`: its next token is
        checked against the ticket alone (a table lookup, a bound, the stop tokens), since
        nothing the full check read has moved since."""
        ticket = state.lane
        if ticket is None or ticket.at != state.consumed:
            return self._enter_lane(state, token)
        at = ticket.at
        plain = ticket.plain
        if at >= ticket.until or not 0 <= token < len(plain) or not plain[token] or token in state.stop_ids:
            return None
        ticket.follower.text += ticket.latin1[token]
        state.consumed = ticket.at = at + 1
        if ticket.pending is not None:
            ticket.pending.append(token)
        if ticket.progress is not None:
            ticket.progress.planned = at + 1
        ticket.matcher.accepted += 1
        return ticket.batchable

    def _enter_lane(self, state: RowState, token: int) -> Any:
        """:meth:`_lane` read from the row itself; a row it takes gets its :class:`LaneTicket`."""
        matcher = self._lengthens(state, token)
        if matcher is None or matcher.batchable is None or token in state.stop_ids:
            return None
        budget = state.budget
        if budget is not None and not budget.calm_in_call(state.consumed + 1):
            return None
        self._lengthen(state, token)
        if budget is not None:
            budget.skip_plan(state.consumed)  # planned: the budget demands nothing there
        matcher.accepted += 1  # the batch accepts it; a row it refuses fails, matcher and all
        gate = state.gate
        tail = gate.follower.tail
        assert tail.open is not None and tail.open.tags is not None
        state.lane = LaneTicket(
            state.consumed, UNWATCHED if budget is None else self._calm_until(budget) - 1,
            self._plain_tokens(tail.open.tags.end[0], gate.watch if gate.on else None),
            self.compiler.vocab.latin1, gate.follower, gate.pending if gate.on else None,
            None if budget is None else budget.progress, matcher, matcher.batchable,
        )  # fmt: skip
        return matcher.batchable

    @staticmethod
    def _calm_until(budget: TurnBudget) -> int:
        """The count of consumed tokens below which, inside a call with nothing forced, the budget
        demands nothing of the next position (:meth:`TurnBudget.calm_in_call`); a lengthening
        token changes neither the reserve nor the alert window."""
        return budget.max_tokens - max(budget.reserve, budget.alert) if budget.close else UNWATCHED

    def _plain_tokens(self, end: str, watch: bytes | None) -> bytes:
        """Per token of the vocabulary, 1 where it only lengthens a call whose closing tag begins
        with ``end`` (:meth:`_lengthens`: whole characters, no ``end``, and none of ``watch``'s
        bytes where a gate watches them), else 0. Keyed by the dialects' tag bytes (a handful),
        built from the token index's arrays (no token read in Python: :meth:`warm` builds the
        character table)."""
        vocab = self.compiler.vocab

        def build() -> bytes:
            size = len(vocab.latin1)
            words = vocab.whole_words((self.vocab_size + 31) // 32)
            whole = np.unpackbits(words.view(np.uint8), bitorder="little")[:size].astype(bool)
            plain = whole & ~self.index.holding_byte(ord(end))[:size]
            if watch is not None:
                plain &= ~self.index.holding_any(watch)[:size]
            return bytes(plain.astype(np.uint8).tobytes())

        plain: bytes = vocab.table(f"call lane {end!r} {watch!r} {self.vocab_size}", build)
        return plain

    def string_plain(self, end: str) -> PlainStrings | None:
        """The plain string tokens inside a call whose closing tag begins with ``end``
        (:class:`PlainStrings`). Plain: whole UTF-8 characters, none of a JSON string's quote,
        backslash or control characters, nor ``end`` (the in-call path reads such a token whole),
        not empty, not special. Inside an unbounded string value such a token leaves the rest of
        the language as it was (:attr:`EngineMatcher.strings_repeat`). ``None`` where the
        vocabulary has no more of them than :data:`KEY_CHARACTERS_MAX`. Kept by the core per
        ``end`` (a dialect's character): a hosted row asks at every reading of its path."""
        if end in self._plain_strings:
            return self._plain_strings[end]
        vocab = self.compiler.vocab

        def build() -> PlainStrings | None:
            size = len(vocab.latin1)
            text, opens = self._string_pieces()
            plain = np.frombuffer(self._plain_tokens(end, None), dtype=np.uint8).astype(bool)
            plain &= ~self.index.holding_any(_STRING_BREAKS)[:size]
            plain &= text
            plain[[t for t in vocab.tokenizer_info.special_token_ids if 0 <= t < size]] = False
            if int(plain.sum()) <= KEY_CHARACTERS_MAX:
                return None
            padded = np.zeros((self.vocab_size + 31) // 32 * 32, dtype=bool)
            padded[:size] = plain
            words = np.packbits(padded, bitorder="little").view(np.int32)
            full = np.flatnonzero(words == -1)
            probe = (
                tuple(int(full[k * (len(full) - 1) // (PROBES - 1)]) for k in range(PROBES))
                if full.size
                else ()
            )
            kinds = plain.astype(np.uint8)
            kinds[opens] = 2
            return PlainStrings(bytes(kinds.tobytes()), words, probe)

        found: PlainStrings | None = vocab.table(f"string plain {end!r} {self.vocab_size}", build)
        self._plain_strings[end] = found
        return found

    def _string_pieces(self) -> tuple[np.ndarray, np.ndarray]:
        """Per token, whether it is whole UTF-8 text (:func:`_utf8_text`) and whether it may open
        a string value (:func:`_may_open_string`): the two Python passes over the vocabulary that
        :meth:`string_plain` needs, made once for every dialect's closing character."""
        vocab = self.compiler.vocab

        def build() -> tuple[np.ndarray, np.ndarray]:
            size = len(vocab.latin1)
            text = np.fromiter(map(_utf8_text, vocab.latin1), dtype=bool, count=size)
            opens = np.fromiter(map(_may_open_string, vocab.latin1), dtype=bool, count=size)
            return text, opens

        return vocab.table("string pieces", build)

    def start_engine(self, state: RowState) -> None:
        """Build an engine-only row's matcher now, its grammar compiled (its first fill would:
        :meth:`decide`): a hosted row does it on vLLM's compile thread, not the scheduler's."""
        if not state.gate.on and state.engine.matcher is None and state.engine.failed is None:
            self._feed_engine(state, ())

    def engine_alone_until(
        self, state: RowState, followed: bool = True
    ) -> tuple[int, np.ndarray | None, bool]:
        """The count of consumed tokens before which each position's fill is the engine's mask
        alone and moves nothing but the budget's count of planned positions (:meth:`decide`:
        ``Fill.ENGINE``, the budget's plan ``NOTHING``), 0 where that does not hold now; for a
        gated row, which tokens its gate watches (those take the full reading); and whether that
        holds *anywhere*, whatever the row writes, or only while it lengthens its call
        (:meth:`_lengthen_call`'s tokens). A hosted row (speculative decoding) skips
        :meth:`decide` and the row's marks up to there.

        Inside a call, nothing forced, at a character boundary, no stop string or tag watched in
        the recent text: the budget plans nothing until the call nears its alert window
        (:meth:`TurnBudget.plan`), and a lengthening token changes none of these conditions. That
        is read first where the row's text is ``followed`` to its last token (going back to the
        text where the path ends is then appending it).

        Anywhere: a row whose engine runs everywhere (not gated, not paused in a span), no stop
        string refused, below the budget's calm bound (:meth:`TurnBudget.calm_until`; a row
        without a budget has none): nothing but its engine reads its tokens there, and its
        engine's mask is its mask (a reasoning span's too: the mask a row paused there keeps is
        the engine's at the span's start, and the engine's stays so, :meth:`TurnBudget.in_quiet_span`).
        Its text is followed where it leaves the path, token by token as without drafts."""
        engine, gate, budget = state.engine, state.gate, state.budget
        none = 0, None, False
        if engine.matcher is None or engine.paused is not None or engine.failed is not None:
            return none
        if engine.ended or gate.quiet:
            return none
        if followed and (budget is not None or gate.on):
            call = self._in_call_until(state)
            if call[0]:
                return call
        if gate.on:
            return none
        if budget is None:
            return UNWATCHED, None, True
        if state.refused_stops or state.refused_in_calls:
            return none
        calm = budget.calm_until()
        return (calm, None, True) if calm > state.consumed else none

    def _in_call_until(self, state: RowState) -> tuple[int, np.ndarray | None, bool]:
        """:meth:`engine_alone_until` inside a call (its first reading), for a row that runs its
        engine and that its budget or its gate follows."""
        gate, budget = state.gate, state.budget
        none = 0, None, False
        follower = gate.follower
        tail = follower.tail
        if tail.open is None or tail.open.kind != "call" or tail.end_begun or follower.reach:
            return none
        if gate.on and (not gate.watch or (budget is not None and gate.quiet_until != budget.watch_from)):
            return none
        watched = self.index.holding_any(gate.watch) if gate.on else None
        if budget is None:
            return UNWATCHED, watched, False
        progress = budget.progress
        if progress.forcing or progress.utf8:
            return none
        return self._calm_until(budget), watched, False

    @staticmethod
    def _follow(state: RowState, piece: str) -> None:
        """Feed one token's bytes to the row's text follower: through its budget, which counts
        the spans' tokens on the way, where it has one."""
        if state.budget is not None:
            state.budget.feed(piece)
        else:
            state.gate.follower.feed(piece)

    def _advance(self, state: RowState, new_tokens: Sequence[int]) -> None:
        if not new_tokens:
            return
        state.consumed += len(new_tokens)
        if state.engine.failed is not None:
            return
        if not state.gate.on:
            if state.engine.paused is not None:
                assert state.budget is not None
                if state.budget.in_quiet_span():
                    return  # the span's content does not move the grammar: the engine waits
                state.engine.resume()
            self._feed_engine(state, new_tokens)
            return
        if state.engine.matcher is not None:
            self._feed_engine(state, new_tokens)
        if state.gate.watch:
            holds = self.index.holding_any(state.gate.watch)
            if not any(holds[t] for t in new_tokens if 0 <= t < len(holds)):
                # Nothing a tag could be made of: the row's situation is unchanged.
                if state.gate.pending or state.engine.matcher is not None:
                    state.gate.hold(new_tokens)
                return
        state.gate.hold(new_tokens)
        self._regate(state)

    def _regate(self, state: RowState) -> None:
        """Switch the engine on or off as the gate reads the row's text (:meth:`Gate.regate`)."""
        run = state.gate.regate(state.prepared.spec.parallel, self._begin_bytes(state.dialect))
        if run:
            self._switch_on(state)
        elif run is not None:
            state.engine.switch_off()

    def _switch_on(self, state: RowState) -> None:
        """Engine on: a fresh matcher replays the tokens since the last clean point."""
        if state.engine.matcher is not None:
            return
        compiled = self._compiled(state)
        if compiled is None:
            return
        state.engine.start(compiled.matcher(state.stop_ids, gated=False))
        self._feed_engine(state, state.gate.pending)

    def _compiled(self, state: RowState) -> CompiledToolGrammar | None:
        try:
            return self.compiler.result(state.prepared, state.future)
        except GrammarCompileError as err:
            self._fail(state, str(err))
            return None

    def _feed_engine(self, state: RowState, tokens: Sequence[int]) -> None:
        if state.engine.matcher is None:  # an engine-only row's first step
            compiled = self._compiled(state)
            if compiled is None:
                return
            state.engine.start(compiled.matcher(state.stop_ids, gated=False))
            tokens = [*state.gate.take_pending(), *tokens]  # the prompt's open span first
        refused = state.engine.feed(tokens)
        if refused is not None:
            self._fail(state, f"sampled token {refused} is outside the grammar", self.log_refusals)

    def _fail(self, state: RowState, reason: str, log: bool = True) -> None:
        """Stop the row: from now on only its stop tokens are allowed, never unconstrained text."""
        if log:
            logger.error("hermes-vllm: ending a constrained request: %s", reason)
        state.engine.fail(reason)
        state.gate.stop()
        state.lane = None

    def step(
        self, logits: torch.Tensor, updates: Sequence[tuple[int, RowState, Sequence[int]]]
    ) -> torch.Tensor:
        """Advance every row by its new tokens, then mask ``logits`` in place.

        ``updates`` holds ``(logits_row, state, tokens committed since the last step)``. Gated rows
        in clean free text that received one token are checked against the gate in one vectorised
        lookup and, when the token cannot touch a tag, go no further: the common case costs one
        pass of this loop and nothing in :meth:`mask`.
        """
        start = time.perf_counter()
        quiet_rows: list[int] = []
        quiet_states: list[RowState] = []
        quiet_tokens: list[int] = []
        lane_rows: list[int] = []
        lane_states: list[RowState] = []
        lane_matchers: list[Any] = []
        lane_tokens: list[int] = []
        active: list[tuple[int, RowState]] = []
        for row, state, tokens in updates:
            if state.gate.quiet and len(tokens) == 1 and state.consumed < state.gate.quiet_until:
                quiet_rows.append(row)
                quiet_states.append(state)
                quiet_tokens.append(tokens[0])
            elif len(tokens) == 1 and (lane := self._lane(state, tokens[0])) is not None:
                lane_rows.append(row)
                lane_states.append(state)
                lane_matchers.append(lane)
                lane_tokens.append(tokens[0])
            else:
                self.advance(state, tokens)
                active.append((row, state))
        if lane_matchers:
            refused = batch_accept(lane_matchers, lane_tokens)
            if refused:  # a refused token fails its row, which leaves the lane
                for i in refused:
                    message = f"sampled token {lane_tokens[i]} is outside the grammar"
                    self._fail(lane_states[i], message, self.log_refusals)
                    active.append((lane_rows[i], lane_states[i]))
                out = set(refused)
                lane_rows = [r for i, r in enumerate(lane_rows) if i not in out]
                lane_matchers = [m for i, m in enumerate(lane_matchers) if i not in out]
        if quiet_states:
            assert self._quiet_holds is not None
            holds = self._quiet_holds
            ids = np.array(quiet_tokens, dtype=np.int64)
            hits = holds[np.clip(ids, 0, len(holds) - 1)] | (ids < 0) | (ids >= len(holds))
            for state in quiet_states:
                state.consumed += 1
            for i in np.flatnonzero(hits).tolist():
                state = quiet_states[i]
                state.consumed -= 1
                self.advance(state, (quiet_tokens[i],))
                active.append((quiet_rows[i], state))
        masked = self.mask(logits, active, (lane_rows, lane_matchers))
        if updates:
            record_step(len(updates), time.perf_counter() - start)
        return masked

    def mask(
        self,
        logits: torch.Tensor,
        rows: Sequence[tuple[int, RowState]],
        lane: tuple[list[int], list[Any]] = ([], []),
    ) -> torch.Tensor:
        """Fill the step's bitmask for ``(logits_row, state)`` pairs (and the call lane's rows:
        :meth:`fill`) and apply it in place."""
        on_cpu = logits.device.type == "cpu"
        masked, sparse = self.fill(rows, logits.shape[1], sparse_ok=on_cpu, lane=lane)
        if masked:
            bitmask = self.bitmask[: max(masked) + 1]
            if not on_cpu:
                bitmask = bitmask.to(logits.device, non_blocking=True)
            xgr.apply_token_bitmask_inplace(logits, bitmask, indices=masked)
        for row, bans in sparse:
            logits[row].index_fill_(0, bans, float("-inf"))
        return logits

    def fill(
        self,
        rows: Sequence[tuple[int, RowState]],
        width: int,
        sparse_ok: bool = False,
        bitmask: torch.Tensor | None = None,
        lane: tuple[list[int], list[Any]] = ([], []),
    ) -> tuple[list[int], list[tuple[int, torch.Tensor]]]:
        """Fill ``bitmask`` (the core's own where not given) for ``(logits_row, state)`` pairs,
        and for the call lane's logits rows and xgrammar matchers (:meth:`_lane`: decided
        :attr:`Fill.ENGINE`, filled in one batch); return the rows to mask and, where
        ``sparse_ok``, the ``(row, banned tokens)`` of paused rows that ban only a few."""
        lane_rows, lane_matchers = lane
        if bitmask is None:
            last = max(max((r for r, _ in rows), default=0), max(lane_rows, default=0))
            self._ensure_bitmask(last + 1, width)
            bitmask = self.bitmask
        masked: list[int] = []
        if lane_rows:
            batch_fill(lane_matchers, bitmask, lane_rows)
            masked += lane_rows
        sparse: list[tuple[int, torch.Tensor]] = []
        engine_rows: list[tuple[int, ToolCallMatcher]] = []
        for row, state in rows:
            kind, plan = self.decide(state)
            if kind is Fill.ENGINE:
                assert state.engine.matcher is not None
                engine_rows.append((row, state.engine.matcher))
            elif kind is Fill.PAUSED and sparse_ok and state.engine.paused_bans is not None:
                sparse.append((row, state.engine.paused_bans))
            elif kind is not Fill.FREE:
                self.fill_decided(bitmask, row, state, kind, plan, width)
                if kind is Fill.PAUSE and sparse_ok and state.engine.paused_bans is not None:
                    sparse.append((row, state.engine.paused_bans))
                else:
                    masked.append(row)
        if len(engine_rows) >= BATCH_FILL_MIN:
            # Many rows inside calls: one parallel fill; every such row is masked.
            matchers = [m.engine_matcher for _, m in engine_rows]
            self.compiler.engine.fill_bitmasks(matchers, bitmask, [r for r, _ in engine_rows])
            for r, m in engine_rows:
                m.ban_repeats(bitmask, r)
            masked += [r for r, _ in engine_rows]
        else:
            masked += [r for r, m in engine_rows if m.fill_bitmask(bitmask, r)]
        return masked, sparse

    def decide(self, state: RowState) -> tuple[Fill, Plan]:
        """What the row's mask at this position is made of: the one decision of a row, for a
        batch's fill and for a hosted row's settling alike.

        Deciding moves the row as the position's fill does, and nothing else: the budget plans
        the position (it may begin forcing a text), an engine-only row's matcher is built (its
        first step waits for its grammar). What computing the mask then changes is
        :meth:`fill_decided`'s: a forced text the grammar refuses is dropped, a row entering a
        quiet span is paused with the mask.
        """
        if state.engine.ended:
            return Fill.STOPS, NOTHING
        budget = state.budget
        if budget is not None and state.engine.failed is None:
            plan = budget.plan(state.consumed)
            if plan is not NOTHING or self._refused(state, budget):
                if state.engine.matcher is None and not state.gate.on:
                    self._feed_engine(state, ())
                if state.engine.failed is None:
                    return Fill.BUDGETED, plan
        if state.engine.failed is None and state.engine.matcher is None:
            if state.gate.on:
                return Fill.FREE, NOTHING
            self._feed_engine(state, ())  # first step of an engine-only row: wait for its grammar
        if state.engine.failed is not None:
            return Fill.STOPS, NOTHING
        if state.engine.paused is not None:
            return Fill.PAUSED, NOTHING
        if budget is None or state.gate.on or not budget.in_quiet_span():
            return Fill.ENGINE, NOTHING
        return Fill.PAUSE, NOTHING

    def fill_decided(
        self, bitmask: torch.Tensor, row: int, state: RowState, kind: Fill, plan: Plan, width: int
    ) -> None:
        """Fill ``bitmask[row]`` as :meth:`decide` said, for a row alone (engine rows are filled
        together by :meth:`fill`)."""
        if kind is Fill.STOPS:
            self._allow_only(bitmask, row, state.stop_ids)
        elif kind is Fill.BUDGETED:
            self._fill_budgeted(bitmask, row, state, plan)
        else:
            assert kind in (Fill.PAUSE, Fill.PAUSED), kind
            if kind is Fill.PAUSE:
                self._pause(bitmask, row, state, width)
            assert state.engine.paused is not None
            bitmask[row].numpy()[:] = state.engine.paused

    def _pause(self, bitmask: torch.Tensor, row: int, state: RowState, width: int) -> None:
        """Fill the row from the engine once more and keep that mask for the span's content."""
        assert state.engine.matcher is not None
        if not state.engine.matcher.fill_bitmask(bitmask, row):
            bitmask[row].fill_(-1)
        state.engine.pause(bitmask[row].numpy().copy(), width)

    def _fill_budgeted(self, bitmask: torch.Tensor, row: int, state: RowState, plan: Plan) -> None:
        """The row's mask as the grammar has it, narrowed by what its budget demands.

        A forced text is written with the longest token spelling a prefix of it that the mask
        allows: never a token the grammar refuses (if none is allowed, nothing is forced).
        """
        budget = state.budget
        assert budget is not None
        if state.engine.matcher is None or not state.engine.matcher.fill_bitmask(bitmask, row):
            bitmask[row].fill_(-1)
        words = bitmask[row].numpy()
        if plan.force:
            for token in self.speller.prefixes(plan.force):
                if token_allowed(words, token):
                    self._allow_only(bitmask, row, (token,))
                    return
            logger.warning("hermes-vllm: the grammar refuses the forced text %r; not forcing", plan.force)
            budget.drop_forcing()
        if plan.ban_call:
            words &= self.compiler.vocab.no_call_words(state.dialect, words.size)
        if plan.whole_characters:
            words &= self.compiler.vocab.whole_words(words.size)
        refused = self._refused(state, budget)
        if plan.ban_spans:
            refused += budget.span_openings
        if refused:
            bits = words.view(np.uint32)
            before = bits.copy()
            tokens = self._completing(state.gate.follower.recent, refused)
            tokens = tokens[tokens < bits.size * 32]
            clear = ~(np.uint32(1) << (tokens & 31).astype(np.uint32))
            np.bitwise_and.at(bits, tokens >> 5, clear)
            if not bits.any():  # the grammar itself spells the refused text here: it must pass
                bits[:] = before

    @staticmethod
    def _refused(state: RowState, budget: TurnBudget) -> tuple[str, ...]:
        """The texts no token may complete here."""
        if not (state.refused_stops or state.refused_in_calls) or not budget.guarded():
            return ()
        return state.refused_stops + state.refused_in_calls if budget.in_call() else state.refused_stops

    def _completing(self, text: str, refused: Sequence[str]) -> np.ndarray:
        """Tokens that would complete one of ``refused`` after ``text`` (:class:`TokenIndex`: no
        token of the vocabulary is read here)."""
        index = self.index
        found = [index.holding(s) for s in refused]
        found += [index.starting(s[k:]) for s in refused for k in range(1, len(s)) if text.endswith(s[:k])]
        return np.concatenate(found) if len(found) > 1 else found[0]

    @staticmethod
    def _allow_only(bitmask: torch.Tensor, row: int, token_ids: Sequence[int]) -> None:
        words = bitmask[row].zero_().numpy()
        for token in token_ids:
            words[token // 32] |= np.array(1 << (token % 32), dtype=np.uint32).view(np.int32)

    def _ensure_bitmask(self, rows: int, width: int) -> None:
        words = (width + 31) // 32
        if self.bitmask.shape[0] < rows or self.bitmask.shape[1] != words:
            self.bitmask = allocate_bitmask(max(rows, 2 * self.bitmask.shape[0]), width, self.pin_memory)
