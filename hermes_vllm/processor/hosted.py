"""One constrained row hosted as a vLLM ``StructuredOutputGrammar``, for speculative decoding.

Under speculative decoding vLLM's scheduler, not the model runner, keeps drafts inside a
request's grammar: it cuts each request's drafts to their longest valid prefix
(``validate_tokens``), fills one bitmask row per draft position plus the bonus row by accepting
the drafts one by one, rolls the grammar back, and after verification accepts the tokens the
model kept. Hosting our row (gate, matcher, budgets: :class:`~hermes_vllm.processor.row.RowState`,
advanced and masked by :class:`~hermes_vllm.processor.core.ConstraintCore`'s own methods) behind
that interface puts every draft position under the constraint sampled tokens get, on either
runner, with our engines, our cache and our budgets.

*Rollback.* Engines cannot copy a matcher, but they can roll one back; the rest of a row is a
few fields. Before each accepted token off the light path (below) the row is marked
(:meth:`RowState.mark`: its fields read into a tuple, its matcher's count of accepted tokens);
going back to a mark rolls the matcher back by the difference. Only the last
``num_speculative_tokens + 1`` tokens are kept.

*Lazily.* A rollback only counts the tokens it undoes: the row stays where the draft path left
it. The scheduler then accepts the kept tokens, the kept drafts first: each is taken again from
the path (its row was computed there, after its position's fill) by moving back over it, no
engine work and no copy. Only where the tokens leave the path (the first draft the target
refused) is the row put back to the mark before it, and the matcher rolled back, once.

*Light path.* Inside a call, up to where the budget may next speak, with nothing forced and no
stop string watched (:meth:`ConstraintCore.engine_alone_until`), a fill is the engine's mask alone
and moves nothing in the row, and a token that only lengthens the call changes only its text, the
consumed count, the matcher and a gated row's pending tokens. There the row is filled straight
from its engine's matcher and a token costs the engine's accept and a few counts: no mark (going
back over it counts back; the budget's progress, unchanged along the path, is put back to the copy
taken where the path was entered), no settling, no lock (the row is touched from the scheduler's
thread only, and the path reads nothing of the core but its fixed tables), its text handed to the
follower when the row next leaves the path.

*Anywhere.* A row whose engine runs everywhere (``required``, named, or a turn's one call made),
with no stop string refused, is on the light path wherever it stands, tags and stop token
included, up to the budget's calm bound (:meth:`TurnBudget.calm_until`, the reserve and the alert
window from the end): there no plan demands anything whatever the text, so nothing but the engine
reads a token, and a call costs what its tokens cost the engine. Its text is followed where the
row leaves the path (the bound, a draft walk), token by token through the budget as without
drafts, and the trail's tokens then get their marks.

*Exactness.* Without drafts every token is preceded by a mask fill at its position, and a fill
moves the budget (it may begin forcing a text, or count a closed call). The kept drafts' rows
were computed on the draft path, each after its position's fill; past them, :meth:`accept_tokens`
settles the row before each token after the first as that position's fill would (the first
token's fill is the state the path left): a row goes through exactly what it goes through without
drafts, hence the same masks and, under greedy sampling, the same text. Settling plans the budget
and computes the mask only where the mask can change the row (:meth:`RowHost.apply_fill`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING, NoReturn

import numpy as np
import torch
from vllm.v1.structured_output.backend_types import StructuredOutputGrammar

from hermes_vllm.budget.turn_budget import Progress
from hermes_vllm.grammar import GrammarCompileError
from hermes_vllm.latin1 import utf8_need
from hermes_vllm.metrics import record_step
from hermes_vllm.processor.core import ConstraintCore, Fill, PlainStrings
from hermes_vllm.processor.forced_drafts import ForcedDrafts
from hermes_vllm.processor.row import RowMark, RowState
from hermes_vllm.spans import reader_of

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

    from hermes_vllm.grammar.compiler import ToolCallMatcher
    from hermes_vllm.grammar.engines.base import EngineMatcher

Step = tuple[RowMark | None, int, bool, Progress | None]
"""A hosted row's trail entry (:attr:`HostedGrammar._trail`)."""


class RowHost:
    """The engine process's core, shared by every hosted row.

    vLLM admits rows on its compile threads while the scheduler thread fills masks, so one lock
    guards the core (its bitmask row 0 is the scratch row of every such fill).
    """

    def __init__(self, core: ConstraintCore, window: int) -> None:
        self.core = core
        self.window = window
        self.lock = threading.Lock()
        self.checked: torch.Tensor | None = None
        """The last bitmask found alike the core's."""
        self.rows: np.ndarray | None = None
        """:attr:`checked` as numpy rows (made once a bitmask, not once a row: it costs a few fills)."""
        self.filled: set[int] = set()
        """The rows (by id: none is kept alive) filled in the step under way (:meth:`step`)."""
        core.log_refusals = False  # a refused draft's row is put back (HostedGrammar.accept_tokens)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """One engine step's masks (vLLM's ``grammar_bitmask``, on the scheduler's thread): its
        time and the hosted rows it filled go to the step metrics, once a step as the batch
        processors record theirs (:func:`~hermes_vllm.metrics.record_step`), where it filled any."""
        self.filled.clear()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.filled:
                record_step(len(self.filled), time.perf_counter() - start)

    def grammar(self, params: SamplingParams) -> HostedGrammar:
        """Admit a request and wait for its compile, as vLLM's backends do on their compile thread
        (the request waits in ``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR``, the scheduler never does)."""
        self.core.ready(params)  # the cold part (a new tool set's preparing, its compile), unlocked
        with self.lock:
            state = self.core.admit_params(params, readied=True)
        if state is None:
            raise ValueError("the request carries no hermes-vllm constraint")
        try:
            self.core.compiler.result(state.prepared, state.future)
        except GrammarCompileError as err:
            raise ValueError(f"hermes-vllm cannot compile this request's tools: {err}") from None
        self.core.start_engine(state)  # the row is not shared yet: no lock
        return HostedGrammar(self, state)

    def fill_into(
        self,
        state: RowState,
        bitmask: torch.Tensor,
        row: int,
        native: Callable[[torch.Tensor, int, bool], bool] | None = None,
    ) -> None:
        """Fill ``bitmask[row]`` (vLLM's) for ``state``, every token allowed where nothing is masked.
        ``native``: the row's matcher's engine fill (:meth:`EngineMatcher.direct`), where the
        matcher adds nothing to its engine's (:attr:`ToolCallMatcher.alone`).

        The core fills vLLM's bitmask in place: filling a row of its own and copying it cost a
        quarter of a fill. Both are sized from the model's vocabulary; where they are not alike
        the row cannot be filled in place (vLLM keeps one bitmask: it is checked once). One row,
        so :meth:`ConstraintCore.fill`'s batch is skipped: the row's decision, then its mask."""
        core = self.core
        self.check(bitmask)
        kind, plan = core.decide(state)
        if kind is Fill.ENGINE:  # the row written whatever the engine answers (EngineMatcher.fill_bitmask)
            assert state.engine.matcher is not None
            if native is None:
                state.engine.matcher.fill_bitmask(bitmask, row)
            else:
                native(bitmask, row, False)
        elif kind is Fill.FREE:
            bitmask[row].fill_(-1)
        else:
            core.fill_decided(bitmask, row, state, kind, plan, core.vocab_size)

    def check(self, bitmask: torch.Tensor) -> None:
        """Make ``bitmask`` (vLLM's) :attr:`checked`: sized and typed as the core's own."""
        if bitmask is not self.checked:
            own = self.core.bitmask
            if bitmask.shape[1] != own.shape[1] or bitmask.dtype != own.dtype:
                raise ValueError(
                    f"vLLM's bitmask ({bitmask.shape[1]} {bitmask.dtype} words a row) is not the "
                    f"hermes-vllm core's ({own.shape[1]} {own.dtype})"
                )
            self.checked, self.rows = bitmask, bitmask.numpy()

    @cached_property
    def drafter(self) -> ForcedDrafts:
        """Finds the forced runs offered as grammar drafts (:mod:`~hermes_vllm.processor.forced_drafts`)."""
        from hermes_vllm.grammar.engines.composed import sorted_vocabulary

        vocab = self.core.compiler.vocab
        return ForcedDrafts(vocab.tokenizer, vocab.decoded, vocab.stop_token_ids, sorted_vocabulary(vocab))

    def apply_fill(self, state: RowState) -> None:
        """What the fill at this position does to the row (:meth:`ConstraintCore.decide`), its mask
        computed only where the row depends on it: where a forced text may be refused by the
        grammar (the forcing is dropped) and where the row enters a quiet span (it is paused
        with that mask). The core's own bitmask row 0 is the scratch row."""
        core = self.core
        kind, plan = core.decide(state)
        if kind is Fill.PAUSE or (kind is Fill.BUDGETED and plan.force):
            core.fill_decided(core.bitmask, 0, state, kind, plan, core.vocab_size)

    def advance(self, state: RowState, token: int, plan: bool = True) -> bool:
        """Feed one token; False when it put the row out of its grammar. ``plan=False``: the
        budget does not plan the token's position first (a path that is restored afterwards)."""
        failed = state.failed
        if not plan and state.budget is not None:
            state.budget.skip_plan(state.consumed)
        self.core.advance(state, (token,))
        return failed is not None or state.failed is None


class HostedGrammar(StructuredOutputGrammar):  # type: ignore[misc]
    """A :class:`RowState` behind vLLM's per-request grammar interface."""

    def __init__(self, host: RowHost, state: RowState) -> None:
        self._host = host
        self._state = state
        self._terminated = False
        self._trail: list[Step] = []
        """Before each accepted token: the row's mark (``None`` for a token taken lightly), the
        token, whether the row had ended, and for a light token its budget's progress."""
        self._back = 0
        """Tokens at the trail's end that a rollback undid and the row has not gone back over yet:
        the row stands where they left it, the grammar before the first of them."""
        self._initial = state.mark()
        self._latin1 = host.core.compiler.vocab.latin1
        self._until = -1
        """Below this many consumed tokens the row is on the light path (module docstring); -1: to
        be read again (:meth:`_refresh`), since the row moved otherwise."""
        self._matcher: ToolCallMatcher | None = None
        self._engine: EngineMatcher | None = None
        """The row's engine matcher, fed, filled and rolled back directly on the light path
        (:attr:`_feed`, :attr:`_fill`, :attr:`_rollback`: :meth:`EngineMatcher.direct`)."""
        self._feed: Callable[[int, bool], bool] = _unread
        self._fill: Callable[[torch.Tensor, int, bool], bool] = _unread
        self._rollback: Callable[[int], None] = _unread
        self._bound: torch.Tensor | None = None
        """The bitmask the light path fills (vLLM's: the same at every step), bound at the row's
        first fill there: :attr:`_fill_row` is :attr:`_engine`'s fill into it alone
        (:meth:`EngineMatcher.fill_rows`), :attr:`_rows` its numpy view."""
        self._fill_row: Callable[[int, bool], bool] = _unread
        self._rows: np.ndarray | None = None
        self._anywhere = False
        """Whether the light path holds whatever the row writes (tags included), not only while it
        lengthens its call (:meth:`ConstraintCore.engine_alone_until`): its text is then followed
        where the row leaves the path (:meth:`_sync`)."""
        self._end = ""
        """Inside a call: the first character of its closing tag (a token holding it is read whole)."""
        self._watched: np.ndarray | None = None
        """A gated row's: the tokens its gate watches (read whole)."""
        self._progress: Progress | None = None
        """The budget's progress where the light path was entered (a light token leaves it as it
        is, but for the count of planned positions): what going back over light tokens restores."""
        self._keep = 2 * host.window
        """The trail is cut back to the host's window once it is this long (the window is what
        vLLM may roll back: ``num_speculative_tokens + 1``)."""
        self._lag: list[str] = []
        """The text (latin-1) of light tokens the row's follower has not been given yet
        (:meth:`_sync`), a piece a token."""
        self._plain: PlainStrings | None = None
        """On the light path of a row whose masks repeat inside strings
        (:attr:`EngineMatcher.strings_repeat`): the plain string tokens
        (:meth:`ConstraintCore.string_plain`)."""
        self._plain_tokens: bytes | None = None
        """:attr:`PlainStrings.kinds` of :attr:`_plain` (read at every token taken lightly)."""
        self._same: tuple[int, np.ndarray] | None = None
        """A mask and the position whose fill repeats it: inside a call, a filled mask that allows
        every plain string token is the mask again after a plain token taken lightly (inside an
        unbounded string value), so that fill copies it instead of asking the engine."""
        self._try_at = -1
        """The position from which the next fill is tried as such a mask (-1: none):
        :data:`LOOK_AFTER` plain tokens after one that may open a string value
        (:attr:`PlainStrings.kinds`), so that a short string (a name, a city) is over before
        trying would pay; at once where the row enters the in-call path or goes back (it may
        stand inside a string)."""
        with host.lock:  # read here, on vLLM's compile thread, not by the first fill
            self._refresh()

    @property
    def state(self) -> RowState:
        """The row as the grammar stands (tokens rolled back undone first)."""
        with self._host.lock:
            self._go_back()
            self._sync()
        return self._state

    def _refresh(self) -> None:
        """Read whether the row is on the light path, and up to where
        (:meth:`ConstraintCore.engine_alone_until`); the host's lock is held."""
        state = self._state
        matcher = state.engine.matcher
        engine = None if matcher is None else matcher.alone
        core = self._host.core
        followed = not (self._lag and self._anywhere)  # tokens taken anywhere: the text is behind
        until, watched, anywhere = (
            core.engine_alone_until(state, followed) if engine is not None else (0, None, False)
        )
        if not followed and not anywhere:
            self._sync()  # the text taken anywhere is followed before the row is read otherwise
            until, watched, anywhere = core.engine_alone_until(state)
        if engine is not self._engine:
            self._feed, self._fill, self._rollback = (_unread,) * 3 if engine is None else engine.direct()
            self._bound = None
        self._until, self._matcher, self._engine, self._watched = until, matcher, engine, watched
        self._anywhere = anywhere
        repeats = until and engine is not None and engine.strings_repeat
        # Taken anywhere, a row without a budget follows no text: where it stands is not read.
        repeats = repeats and not (anywhere and state.budget is None)
        self._plain = core.string_plain(state.dialect.tool_call.end[0]) if repeats else None
        self._plain_tokens = None if self._plain is None else self._plain.kinds
        self._same = None
        # A row entering the in-call path may stand inside a string: its next fill is tried.
        self._try_at = -1 if anywhere or self._plain is None else state.consumed
        if until:
            if not anywhere:
                span = state.gate.follower.tail.open
                assert span is not None and span.tags is not None
                self._end = span.tags.end[0]
            budget = state.budget
            self._progress = None if budget is None else budget.progress.copy()

    def _sync(self) -> None:
        """Give the row's follower the text of the light tokens it has not had yet: inside a call,
        pieces that only lengthen it, appended; taken anywhere, each followed as the core's
        :meth:`~ConstraintCore.advance` follows it (:meth:`_follow_lag`; a row without a budget
        follows no text)."""
        lag = self._lag
        if lag:
            if not self._anywhere:
                self._state.gate.follower.text += "".join(lag)
            elif self._state.budget is not None:
                self._follow_lag()
            lag.clear()

    def _follow_lag(self) -> None:
        """Follow the light tokens taken anywhere through the budget, each position counted as
        planned (its plan was nothing: the path's bound), runs that change no tail at once
        (:meth:`TurnBudget.follow`). Only the last ``window`` tokens can be rolled back (vLLM's
        drafts): the trail is cut to them, and each of their entries gets the row's mark before
        it (:meth:`RowState.mark` ``behind`` the tokens still to follow), so that going back over
        them puts the text back too."""
        state = self._state
        budget = state.budget
        assert budget is not None and not self._back
        trail, lag = self._trail, self._lag
        window = self._host.window
        if len(trail) > window:
            del trail[: len(trail) - window]
        n = len(lag)
        marked = min(n, len(trail))  # the lag's tokens are the trail's last (at least one: its own)
        budget.follow(lag[: n - marked])
        consumed = state.consumed
        for i in range(n - marked, n):
            behind = n - i
            budget.skip_plan(consumed - behind)
            at = len(trail) - behind
            trail[at] = (state.mark(behind), trail[at][1], False, None)
            budget.feed(lag[i])

    def _go_back(self) -> None:
        """Put the row back before the tokens rolled back."""
        back = self._back
        if back:
            self._undo(len(self._trail) - back)
            self._back = 0

    def _undo(self, start: int) -> None:
        """Put the row back where it stood before ``trail[start]`` and drop the trail from there:
        to the first mark after it (one matcher rollback), then back over the light tokens
        before that mark, whose every change is known (:meth:`_take_lightly`)."""
        trail = self._trail
        if start >= len(trail):
            return
        self._same = None
        state = self._state
        terminated = trail[start][2]
        full = start
        while full < len(trail) and trail[full][0] is None:
            full += 1
        if full < len(trail):
            mark = trail[full][0]
            assert mark is not None
            state.back_to(mark)  # taken after a sync: the light tokens after it are undone too
            self._lag.clear()
        self._until = -1  # read again: it may have been read after a fill that moved the budget
        light = full - start
        if light:
            tokens = [step[1] for step in trail[start:full]]
            lag = self._lag
            if len(lag) >= light:
                del lag[len(lag) - light :]
            else:  # some were given to the follower already
                synced = tokens[: light - len(lag)]
                lag.clear()
                follower = state.gate.follower
                chars = sum(len(self._latin1[t]) for t in synced)
                follower.text = follower.text[: len(follower.text) - chars]
            state.consumed -= light
            state.engine.ended = False  # a light token is taken before the end only (the stop may be one)
            matcher = state.engine.matcher
            assert matcher is not None
            if self._engine is not None and matcher is self._matcher:  # its engine's alone
                matcher.accepted -= light
                self._rollback(light)
            else:
                matcher.rollback(light)
            if state.gate.on:
                del state.gate.pending[len(state.gate.pending) - light :]
            progress = trail[start][3]
            if progress is not None:
                assert state.budget is not None
                state.budget.progress = progress.copy()
        del trail[start:]
        self._terminated = terminated
        if self._plain is not None:  # gone back, maybe into a string: its next fill is tried
            self._try_at = state.consumed

    def _take_lightly(self, token: int) -> bool | None:
        """Take ``token`` on the light path: True, or False where the engine refuses it (the row
        unchanged); ``None``, with nothing done, where it must be read whole (the caller checked
        that the row is on the light path). What :meth:`ConstraintCore._lengthen_call` does to the
        row, its text kept back (:attr:`_lag`) and no mark taken: undoing it is counting back.
        Taken anywhere (:attr:`_anywhere`), any token is, the stop token too (it ends the row)."""
        state = self._state
        latin1 = self._latin1
        if not 0 <= token < len(latin1):
            return None
        piece = latin1[token]
        stops = token in state.stop_ids
        if not self._anywhere:
            if stops or self._end in piece or (not piece.isascii() and utf8_need(0, piece)):
                return None
            watched = self._watched
            if watched is not None and watched[token]:
                return None
        if not self._feed(token, False):
            return False
        kinds = self._plain_tokens
        if kinds is not None:
            kind = kinds[token]  # 1: plain; 2: may open a string; 0: neither
            if kind != 1:
                self._same = None
                self._try_at = state.consumed + 1 + LOOK_AFTER if kind else -1
            elif self._same is not None:  # the next fill repeats this one's mask after a plain token
                same = self._same
                self._same = (same[0] + 1, same[1]) if same[0] == state.consumed else None
        assert self._matcher is not None
        self._matcher.accepted += 1
        self._trail.append((None, token, False, self._progress))
        state.consumed += 1
        self._lag.append(piece)
        if state.gate.on:
            state.gate.pending.append(token)
        if stops:
            assert self._engine is not None
            state.engine.ended = self._engine.is_terminated()
            self._terminated = True
        return True

    def _accept(self, token: int, plan: bool = True) -> bool:
        self._same = None
        ok = self._host.advance(self._state, token, plan)
        self._terminated = ok and token in self._state.stop_ids
        return ok

    def _take_whole(self, token: int, light: bool) -> bool:
        """Take ``token`` read whole (a tag, the stop token), the host's lock held: for a row whose
        engine runs everywhere (not gated), running, not paused, and whose matcher is its engine's
        alone (:attr:`_engine`), what :meth:`ConstraintCore.advance` does to it, without the
        general reading's layers: the budget plans the position where it has not (``light``: a
        position on the light path, whose plan is known to be nothing, is counted as planned),
        follows the token's text, then the engine takes the token directly. Elsewhere, and for a
        token the engine refuses (the engine left as it was), the core's own :meth:`_accept`."""
        self._same = None
        state = self._state
        engine = state.engine
        gate = state.gate
        if gate.on or engine.paused is not None or engine.failed is not None or self._engine is None:
            return self._accept(token)
        if engine.matcher is not self._matcher or not self._feed(token, False):
            return self._accept(token)
        budget = state.budget
        consumed = state.consumed
        if budget is not None:
            if budget.progress.planned != consumed:
                if light:
                    budget.skip_plan(consumed)
                else:
                    budget.plan(consumed)
            latin1 = self._latin1
            budget.feed(latin1[token] if 0 <= token < len(latin1) else "")
        state.consumed = consumed + 1
        matcher = self._matcher
        assert matcher is not None
        matcher.accepted += 1
        stops = token in state.stop_ids
        engine.ended = stops and self._engine.is_terminated()
        gate.quiet = False  # the engine runs: what settling after a step gives
        self._terminated = stops
        return True

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Accept ``tokens``; False, with the row as it was before the call, where one is refused.

        vLLM 0.34 feeds every trimmed draft here while filling the bitmask, the first
        grammar-invalid one included, and then rolls back only the drafts that were accepted
        (``StructuredOutputGrammar.accept_tokens``: "a false result must leave the grammar state
        unchanged"). A refused token puts the row back (the core, told to, logs no error), so a
        draft never ends the row.

        Tokens that a rollback undid are taken again by moving over them (all but the last of
        ``tokens``: the row the path left after the last one has had the next position's fill,
        which accepting it alone has not). On the light path a token costs its engine's accept
        and a few counts; elsewhere the row is marked, settled and advanced under the lock."""
        whole = -1  # the position of a token found to be read whole already (not asked again)
        if len(tokens) == 1 and not self._back and self._state.consumed < self._until:
            took = self._take_lightly(tokens[0])  # a draft on the draft path, mostly
            if took is not None:
                self._trim()
                return took
            whole = 0
        host = self._host
        trail, back = self._trail, self._back
        taken = 0
        while back and taken < len(tokens) - 1 and tokens[taken] == trail[-back][1]:
            back -= 1
            taken += 1
        self._back = back
        if back:
            with host.lock:
                self._go_back()
        start = len(trail)
        state = self._state
        for i in range(taken, len(tokens)):
            token = tokens[i]
            if self._until < 0:
                with host.lock:
                    self._refresh()
            light = state.consumed < self._until
            if light:
                # This position's fill is the engine's alone: it changes nothing in the row.
                took = None if i == whole else self._take_lightly(token)
                if took is not None:
                    if not took:
                        with host.lock:
                            self._undo(start)
                        return False
                    continue
                settled = True
            else:
                settled = i == taken
            with host.lock:
                self._until = -1
                if not settled:
                    host.apply_fill(state)  # what the fill this position gets without drafts does
                self._sync()
                trail.append((state.mark(), token, self._terminated, None))
                if self._terminated or not self._take_whole(token, light):
                    self._undo(start)
                    return False
        self._trim()
        return True

    def _trim(self) -> None:
        """Keep the trail to what vLLM may roll back (cut now and then, not on every token)."""
        trail = self._trail
        if len(trail) > self._keep:
            del trail[: len(trail) - self._host.window]

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The drafts' longest prefix the grammar accepts (on the row's path, then gone back).

        Like vLLM's own backends, this asks the matcher only, not the mask: a draft the budget or
        a refused stop string rules out is grammar-valid, and its own position's mask rejects it
        at verification (the mask a fill would compute here costs as much as the draft's row).
        """
        host = self._host
        if self._back:
            with host.lock:
                self._go_back()
        state = self._state
        matcher, engine = state.engine.matcher, state.engine
        if matcher is not None and not state.gate.on and engine.paused is None and engine.failed is None:
            alone = matcher.alone
            if alone is None:
                accept = matcher.accept_token
                return tokens[: self._valid_on_matcher(lambda t, _: accept(t), matcher.rollback, tokens)]
            if alone is self._engine:
                return tokens[: self._valid_on_matcher(self._feed, self._rollback, tokens)]
            feed, _, rollback = alone.direct()
            return tokens[: self._valid_on_matcher(feed, rollback, tokens)]
        with host.lock:
            self._sync()
            start, terminated, same = state.mark(), self._terminated, self._same
            valid = 0
            for token in tokens:
                if self._terminated or not self._accept(token, plan=False):
                    break
                valid += 1
            state.back_to(start)
            self._terminated, self._same = terminated, same  # the row is where it stood
        return tokens[:valid]

    def _valid_on_matcher(
        self, accept: Callable[[int, bool], bool], rollback: Callable[[int], None], tokens: list[int]
    ) -> int:
        """How many of ``tokens`` the matcher takes, asked of the matcher alone (its ``accept``,
        called as :meth:`EngineMatcher.direct`'s), then rolled back.

        For a row whose engine runs everywhere (not gated), running and not paused, this is what
        feeding the whole row answers: the core feeds such a row's matcher every token and nothing
        else can refuse one (only a fill pauses a row or regates it; the budget never refuses a
        token). It skips the row's mark, the budget's following of each draft and going back."""
        stops = self._state.stop_ids
        terminated = self._terminated
        valid = 0
        for token in tokens:
            if terminated or not accept(token, False):
                break
            valid += 1
            terminated = token in stops
        if valid:
            rollback(valid)
        return valid

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens, lazily (the module's docstring)."""
        if num_tokens <= 0:
            return
        kept = len(self._trail) - self._back
        if num_tokens > kept:
            raise ValueError(f"hermes-vllm keeps {kept} tokens of rollback, asked for {num_tokens}")
        self._back += num_tokens

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        host = self._host
        host.filled.add(id(self))
        if self._back or self._until < 0:
            with host.lock:
                self._go_back()
                self._refresh()
        state = self._state
        if state.consumed < self._until:  # the light path: the engine's mask alone (the module
            if bitmask is not self._bound:  # docstring), the row written whatever the engine answers
                host.check(bitmask)
                assert self._engine is not None
                self._bound, self._rows = bitmask, host.rows
                self._fill_row = self._engine.fill_rows(bitmask)
            same = self._same
            if same is not None and same[0] == state.consumed:
                self._rows[batch_index] = same[1]  # type: ignore[index]  # bound with _bound
                return
            self._fill_row(batch_index, False)
            if 0 <= self._try_at <= state.consumed:  # only ever set where _plain is
                self._try_string(state.consumed, batch_index)
            return
        with host.lock:
            if self._until:  # 0 (read at this position: off the path) stays for the token's accept
                self._until = -1
            self._sync()
            native = self._engine is not None and state.engine.matcher is self._matcher
            host.fill_into(state, bitmask, batch_index, self._fill if native else None)

    def _try_string(self, consumed: int, batch_index: int) -> None:
        """Keep the mask just filled at position ``consumed`` as :attr:`_same` where it allows
        every plain string token inside a call."""
        self._try_at = -1
        plain, rows = self._plain, self._rows
        assert plain is not None and rows is not None
        if plain.allowed_by(rows, batch_index) and self._in_call():
            self._same = (consumed, rows[batch_index].copy())

    def _in_call(self) -> bool:
        """Whether the row stands inside a call's body: given on the in-call path; taken anywhere,
        read from its text since the last clean point (the follower's, then the light tokens' it
        has not had), the follower left as it is."""
        if not self._anywhere:
            return True
        state = self._state
        follower = state.gate.follower
        tail = reader_of(state.dialect).read_tail(follower.text + "".join(self._lag))
        return tail.open is not None and tail.open.kind == "call" and not tail.end_begun

    def is_terminated(self) -> bool:
        back = self._back
        return self._trail[-back][2] if back else self._terminated

    # Grammar drafts (processor/forced_drafts.py): the walk runs on the row, then goes back.

    def forced_drafts(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the row's grammar forces next, spelled as the model would, each
        allowed by the row's mask at its position; the row is left where it was."""
        host = self._host
        with host.lock:
            self._go_back()
            self._sync()
            self._until = -1
            history = [step[1] for step in self._trail[-2:]]
            walk = _Walk(self)
            try:
                return host.drafter.offer(walk, history, limit)
            finally:
                walk.restart()

    def reset(self) -> None:
        with self._host.lock:
            self._trail.clear()
            self._back = 0
            self._lag.clear()
            self._until = -1
            self._same = None
            self._state.back_to(self._initial)
            self._terminated = False


LOOK_AFTER = 3
"""Plain tokens after one that may open a string value before a fill is tried as the string's
repeating mask (:attr:`HostedGrammar._same`)."""


def _unread(*_: object) -> NoReturn:
    """A row's direct engine calls before its light path was read (:meth:`HostedGrammar._refresh`:
    only then are they taken)."""
    raise AssertionError("hermes-vllm: a hosted row's light path was taken before it was read")


class _Walk:
    """A hosted row advanced on a forced-run walk (:class:`~hermes_vllm.processor.forced_drafts.Walk`):
    each position filled into a scratch row, then its token accepted, as vLLM's draft path does;
    the row is marked where the walk began and goes back there (:meth:`RowState.back_to`)."""

    def __init__(self, grammar: HostedGrammar) -> None:
        self._grammar = grammar
        self._start: tuple[RowMark, bool] = (grammar._state.mark(), grammar._terminated)
        self._scratch = torch.zeros_like(grammar._host.core.bitmask[:1])

    def mask(self) -> np.ndarray | None:
        grammar = self._grammar
        if grammar._terminated:
            return None
        core = grammar._host.core
        masked, _ = core.fill([(0, grammar._state)], core.vocab_size, bitmask=self._scratch)
        return self._scratch[0].numpy() if masked else None

    def accept(self, token: int) -> bool:
        """Advance by ``token``; a refused one leaves the row as it was (put back to its mark)."""
        grammar = self._grammar
        if grammar._terminated:
            return False
        state = grammar._state
        before = state.mark()
        if grammar._accept(token):
            return True
        state.back_to(before)
        grammar._terminated = False
        return False

    def restart(self) -> None:
        mark, terminated = self._start
        self._grammar._state.back_to(mark)
        self._grammar._terminated = terminated
