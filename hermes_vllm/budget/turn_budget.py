"""Token budgets of one turn: span budgets, the reserve for a ``required`` call, closing cut calls.

Engine-free and vLLM-free: the processor core feeds a :class:`TurnBudget` each row's tokens (as
latin-1 text, one char a byte) and asks it, before each mask, what the budget demands now:

- the turn's reasoning and hidden spans share one budget (``thinking_token_budget``: the sum of
  their tokens, each span counted like vLLM counts it, the tokens after the one that completed the
  opening tag): once it is spent the open span gets its closing tag next, and no span opens again
  (the tokens that would complete an opening tag are banned). vLLM's own thinking budget, where
  it watches the row too, counts each span alone from that same budget, so ours is spent first;
- under ``required`` / named, before the first call, free spans may use only what leaves room for
  the shortest call of the turn (its tokens in this vocabulary plus a margin, the *reserve*); when
  the room is down to that, the span closes and the call opens;
- a begun call whose shortest valid completion (read by :class:`CallCompleter`) no longer fits
  with the margin is steered to that completion (policy ``close``), followed by :data:`MARK` in
  the content so the reply says which call the budget closed; policy ``drop`` leaves it to be
  cut (the parsers drop an unclosed call);
- where no call is owed, no new call may open once its shortest spelling no longer fits;
- a turn with a final answer (a ``response_format`` beside the tools) owes a call or the answer:
  before either begins, free spans may use only what leaves room for the shortest answer, which is
  then written; a begun answer is steered to its shortest completion like a call
  (:class:`~hermes_vllm.budget.AnswerCompleter`), and a begun call is closed.

What is forced is text; the core writes it with the longest token that spells a prefix of it and
that the engine's mask allows (:class:`Speller`), so the grammar decides every token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hermes_vllm.budget.completer import AnswerCompleter, CallCompleter
from hermes_vllm.budget.speller import Speller
from hermes_vllm.dialect import Dialect
from hermes_vllm.latin1 import as_latin1, as_text, finish_character, utf8_need
from hermes_vllm.metrics import BUDGET_ACTIONS, events
from hermes_vllm.spans import Tail, TextFollower, partial_tag_suffix
from hermes_vllm.turn import MARK as MARK

_SPLIT_WINDOW = 4
"""Tokens before a span's budget is spent from which no character may be left split (a split one
is finished first): a character's continuation bytes take at most three tokens."""


@dataclass(frozen=True)
class Plan:
    """What the budget demands of the next token."""

    force: str = ""
    """Text (latin-1) the next tokens must spell; empty: nothing forced."""
    ban_call: bool = False
    """No call may begin with the next token."""
    ban_spans: bool = False
    """No reasoning or hidden span may open with the next token (the turn's budget is spent)."""
    whole_characters: bool = False
    """The next token may not end inside a character: vLLM's thinking budget may force the
    closing tag within the next few tokens, and a tag after a split character is invalid UTF-8
    (the engines that check it refuse the tag, and the row would fail)."""


NOTHING = Plan()


def _bans(*, call: bool, spans: bool) -> Plan:
    """The plan banning a call's and/or a span's beginning; :data:`NOTHING` where neither."""
    return Plan(ban_call=call, ban_spans=spans) if call or spans else NOTHING


@dataclass(slots=True)
class Progress:
    """Everything a :class:`TurnBudget` changes as it follows its row, token by token (the rest
    of a budget is fixed at admission): what a draft snapshot copies."""

    need: int
    """Tokens the owed call (or answer) needs now, as last planned."""
    answer_text: str = ""
    """The answer written so far (latin-1), leading whitespace dropped."""
    span_tokens: int = 0
    """Tokens in the open reasoning/hidden span after its opening tag."""
    reasoning_spent: int = 0
    """Tokens the turn's closed reasoning/hidden spans held."""
    forcing: str = ""
    """Forced text not yet written."""
    utf8: int = 0
    """Continuation bytes the text's last character still needs."""
    planned: int = -1
    """The position last planned for (:meth:`TurnBudget.plan`): a token fed at another position
    (a row resumed after preemption replays its output) is planned for first."""
    answer_at: int = -1
    """The position at which the answer's need was last read (-1: not yet, or unknown)."""
    answer_need: int = 0
    """The answer's need read there: at each later position it is at most this plus the answer's
    lookahead a token, so the answer need not be read again until that bound comes due."""

    def copy(self) -> Progress:
        return Progress(
            self.need, self.answer_text, self.span_tokens, self.reasoning_spent, self.forcing, self.utf8,
            self.planned, self.answer_at, self.answer_need,
        )  # fmt: skip


class TurnBudget:
    """One request's budgets, following its text token by token.

    Its terms (the turn, the limits, the reserves) are fixed at admission and never change; what
    changes is its :class:`Progress` and the row's text follower, which :meth:`copy` copies.
    """

    def __init__(
        self,
        dialect: Dialect,
        follower: TextFollower,
        completer: CallCompleter,
        speller: Speller,
        *,
        max_tokens: int,
        reasoning_budget: int | None,
        required: bool,
        close: bool,
        margin: int,
        reserve: int,
        lookahead: int = 0,
        answer: AnswerCompleter | None = None,
        answer_reserve: int = 0,
        answer_lookahead: int = 0,
    ) -> None:
        self.dialect = dialect
        self.completer = completer
        self.speller = speller
        self.max_tokens = max_tokens
        self.reasoning_budget = reasoning_budget
        """Tokens all the turn's reasoning/hidden spans may hold together (``None``: unbounded)."""
        self.required = required
        self.close = close
        self.margin = margin
        if required:
            _check_reserve(completer, speller, reserve)
        self.reserve = reserve
        """Tokens a call needs at the least, plus the margin (:func:`call_reserve`)."""
        self.lookahead = lookahead
        """The most one token can add to a begun call's shortest completion (in tokens, over the
        turn's tools): a call is steered once what is left is within this of its need plus the
        margin, so that no token the mask allows can leave it unable to finish."""
        self.answer = answer
        """The turn's final answer (``None``: the turn has none): owed, like a call under
        ``required``, until a call begins."""
        self.answer_reserve = answer_reserve
        """Tokens the shortest answer needs, plus the margin."""
        self.answer_lookahead = answer_lookahead
        """The most one token can add to a begun answer's shortest completion."""
        self.follower = follower
        """The row's text since its last clean point (shared with the processor's gate)."""
        self._alert_floor = max(reserve, answer_reserve + answer_lookahead)
        self._alert_extra = margin + max(lookahead, answer_lookahead) + 1
        """The terms of :attr:`alert` fixed at admission: read on every token, computed once."""
        self._calm_floor = reserve + max((margin, *(len(p.end) for p in dialect.free_spans)))
        """Tokens from the end within which :meth:`plan` may speak outside a call's alert window
        (:meth:`calm_until`): the owed call opened, an owed call's span closed, a call refused."""
        self.progress = Progress(need=reserve)
        self._acted = [-1]
        """The position of the latest budget action counted; one list shared by every copy."""
        call = as_latin1(dialect.tool_call.begin)
        tags = tuple(as_latin1(p.begin) for p in dialect.free_spans)
        self.span_openings = tuple(
            tag[: next((k for k in range(1, len(tag)) if not call.startswith(tag[:k])), len(tag))]
            for tag in tags
        ) if required else tags  # fmt: skip
        """What no token may complete once the reasoning budget is spent. Where free text is
        allowed, the opening tags; under ``required``, where the grammar lets a tag's first
        characters go on only as a tag, each tag from its first character no call tag shares
        (``<th`` of ``<think>``: a ``<`` must stay free to open the call)."""

    def drop_forcing(self) -> None:
        """Stop forcing the text being forced (the grammar refuses it here)."""
        self.progress.forcing = ""

    @property
    def alert(self) -> int:
        """From this many tokens left on, the budget must look at every token (clean free text
        included); before it, clean free text without a tag's first byte changes nothing."""
        return max(self._alert_floor, 2 * self.progress.need) + self._alert_extra

    @property
    def watch_from(self) -> int:
        """From this many consumed tokens on, every token must be masked by the budget: its alert
        window, or at once where the reasoning budget is spent (no span may open)."""
        return 0 if self.reasoning_left() == 0 else self.max_tokens - self.alert

    def reasoning_left(self) -> int | None:
        """Tokens the turn's reasoning/hidden spans may still hold (``None``: unbounded)."""
        if self.reasoning_budget is None:
            return None
        return max(0, self.reasoning_budget - self.progress.reasoning_spent - self.progress.span_tokens)

    @property
    def tail(self) -> Tail:
        return self.follower.tail

    @property
    def text(self) -> str:
        return self.follower.text

    @property
    def calls_begun(self) -> int:
        return self.follower.calls_begun

    def in_quiet_span(self) -> bool:
        """Inside a reasoning/hidden span before any call, no closing tag begun, at a character
        boundary: the grammar's state is the same as at the span's first token, so a row whose
        engine runs everywhere (``required``) may leave it alone until a token changes that."""
        tail = self.tail
        span = tail.open
        return (
            span is not None and span.kind != "call" and not tail.end_begun and self.progress.utf8 == 0
            and self.calls_begun == 0
        )  # fmt: skip

    def guarded(self) -> bool:
        """Inside a call, or before the call (or answer) the turn owes: where a stop string must
        not end the request (it would cut the call, or leave the reply without one)."""
        return self.in_call() or self.owes()

    def owes(self) -> bool:
        """Whether the reply still owes its call (``required``) or its call or answer."""
        return (self.required or self.answer is not None) and self.calls_begun == 0

    def in_call(self) -> bool:
        tail = self.tail
        return (tail.open is not None and tail.open.kind == "call") or tail.begun == "call"

    def feed(self, piece: str) -> None:
        """Follow one sampled token (its bytes as latin-1): the text, then the spans' counts."""
        progress = self.progress
        if progress.forcing:
            progress.forcing = progress.forcing[len(piece) :] if progress.forcing.startswith(piece) else ""
        if progress.utf8 or not piece.isascii():
            progress.utf8 = utf8_need(progress.utf8, piece)
        span = self.tail.open
        before = self.follower.text
        read = self.follower.feed(piece)
        if self.answer is not None and span is not None and self.tail.open is None:
            # A span closed inside this piece: what follows its closing tag is the answer's.
            assert span.tags is not None
            end = span.tags.end
            k = piece.find(end)
            self._follow_answer(
                piece[k + len(end) :] if k >= 0 else piece[len(end) - partial_tag_suffix(before, (end,)) :]
            )
        elif self.answer is not None and span is None:
            self._follow_answer(piece)
        if not read:
            self.progress.span_tokens += span is not None and span.kind != "call"
            return
        new = self.tail
        was_free = span is not None and span.kind != "call"
        now = new.open if new.open is not None and new.open.kind != "call" else None
        same = now is not None and span is not None and span.kind == now.kind and span.start == now.start
        if was_free and not same:  # the span closed: its tokens count against the turn's budget
            self.progress.reasoning_spent += self.progress.span_tokens
            self.progress.span_tokens = 0
        if now is not None:
            self.progress.span_tokens = self.progress.span_tokens + 1 if same else 0

    def follow(self, pieces: Sequence[str]) -> None:
        """:meth:`feed` each of ``pieces`` in turn, written where the budget demanded nothing (a
        hosted row's light path follows its text only where it leaves the path): a run of pieces
        the follower reads without a new reading (:meth:`TextFollower.steady`) is taken at once,
        its span tokens counted and its characters' bytes read in one go."""
        follower, progress = self.follower, self.progress
        i, n = 0, len(pieces)
        while i < n:
            j = i if progress.forcing or self.answer is not None else follower.steady(pieces, i)
            if j == i:
                self.feed(pieces[i])
                i += 1
                continue
            run = "".join(pieces[i:j])
            if progress.utf8 or not run.isascii():
                progress.utf8 = utf8_need(progress.utf8, run)
            span = follower.tail.open
            if span is not None and span.kind != "call":
                progress.span_tokens += j - i
            follower.take(run)
            i = j

    def _follow_answer(self, piece: str) -> None:
        """Add free text after the lead (spans and whitespace) to the answer, before any call."""
        tail = self.tail
        if self.calls_begun or tail.open is not None or tail.begun is not None:
            return
        written = self.progress.answer_text
        self.progress.answer_text = written + piece if written else piece.lstrip(" \t\n\r")

    def plan(self, consumed: int) -> Plan:
        """What the next token must do, ``consumed`` tokens having been written.

        The invariant: whatever token the mask then allows,

        - the turn's reasoning/hidden spans stay within ``reasoning_budget`` (and none opens
          once it is spent);
        - under ``required`` / named, before the first call, the owed call (after the closing tag
          of any open span) still fits in the tokens left, counted in this vocabulary's tokens,
          with the margin;
        - a begun call, where the budget closes cut calls, can still be finished and marked;
        - no call begins that could not be finished.

        The first case that holds decides: forced text is written to its end; then where the
        text stands (inside a call or its tag, inside a reasoning/hidden span, in free text).
        ``NOTHING`` (the object itself) where the budget demands nothing.
        """
        progress = self.progress
        progress.planned = consumed
        if progress.forcing:
            return Plan(progress.forcing)
        left = self.max_tokens - consumed
        tail = self.follower.tail
        span = tail.open
        if span is not None and span.kind == "call":
            return NOTHING if self.calm_in_call(consumed) else self._plan_call(left)
        if tail.begun == "call":
            return self._plan_call(left)
        if span is not None:
            return self._plan_span(left)
        return self._plan_free(left)

    def calm_in_call(self, consumed: int) -> bool:
        """Inside a call, nothing being forced: whether the budget demands nothing of the token
        after ``consumed`` ones (the call is far from the alert window, or cut calls are left to
        be cut): nothing to steer, no call to refuse. A step asks this alone of a row whose
        tokens only lengthen its call."""
        left = self.max_tokens - consumed
        return not self.close or (left > self.reserve and left > self.alert)

    def calm_until(self) -> int:
        """The count of consumed tokens below which :meth:`plan` demands nothing, whatever the
        row writes there (free text, a span, a call, their tags), 0 where that cannot be said.

        Each case of :meth:`plan` speaks only within a bound of the end: the owed call is opened
        at the reserve plus the margin, an owed call's span is closed at the reserve plus its
        closing tag (a tag is spelled in at most one token a byte), a call is refused at the
        reserve, a begun call is steered in its alert window. The alert window's width moves
        only where the budget steers (beyond the bound), so it is read as it stands. Nothing
        bounds what a reasoning budget counts (span tokens) or what an answer's reading demands,
        nor a text being forced: such a budget has no calm bound (0). A row whose engine runs
        everywhere needs no reading of its text below the bound (a hosted row, under drafts:
        :meth:`ConstraintCore.engine_alone_until`)."""
        if self.reasoning_budget is not None or self.answer is not None or self.progress.forcing:
            return 0
        need = max(self._calm_floor, self.alert) if self.close else self._calm_floor
        return max(0, self.max_tokens - need)

    def skip_plan(self, consumed: int) -> None:
        """Count position ``consumed`` as planned without planning it: where the plan is known to
        be nothing (:meth:`calm_in_call`), or on a draft path that is restored afterwards, where
        what the position's fill would force does not matter."""
        self.progress.planned = consumed

    def _plan_call(self, left: int) -> Plan:
        """Inside a call or its opening tag: steer it to its shortest completion once one more
        token could leave it unable to finish (the alert window); else refuse what cannot fit."""
        if self.close and left <= self.alert:
            plan = self._steer(left)
            if plan.force:
                return plan
        return _bans(
            # One token can close this call and begin the next (``>?[<`` after ``</tool_call``):
            # where a new call would not fit, it is refused here as after a call (the worst-case
            # sweep cut such a second call one step before its closing tag).
            call=self.close and left <= self.reserve,
            # A call tag's first characters may yet spell a span's.
            spans=self.tail.open is None and self.reasoning_left() == 0,
        )

    def _plan_span(self, left: int) -> Plan:
        """Inside a reasoning/hidden span: close it once the turn's reasoning is spent, or once
        only its closing tag and the owed call still fit; near the end of the reasoning budget,
        leave no character split (the closing tag, ours or vLLM's, must follow whole ones)."""
        tail = self.tail
        assert tail.open is not None and tail.open.tags is not None
        end = tail.open.tags.end
        rest = end[partial_tag_suffix(self.text, (end,)) :] if tail.end_begun else end
        ahead = self.reasoning_left()
        spent = ahead is not None and ahead <= 0
        reserve = self.answer_reserve + self.answer_lookahead if self.answer is not None else self.reserve
        if spent or (self.owes() and left <= reserve + (self.speller.count(rest) or len(rest))):
            self._count("reasoning_closed")
            # Inside a split character the tag would follow invalid UTF-8: finish it first.
            return self._start(("" if tail.end_begun else finish_character(self.text)) + rest)
        if ahead is not None and ahead <= _SPLIT_WINDOW and not tail.end_begun:
            return (
                self._start(finish_character(self.text))
                if self.progress.utf8
                else Plan(whole_characters=True)
            )
        return NOTHING

    def _plan_free(self, left: int) -> Plan:
        """In free text (a span's opening tag perhaps begun): open the owed call once only it
        still fits; where no call is owed, refuse one that would not fit."""
        tail = self.tail
        spans = self.reasoning_left() == 0
        if self.answer is not None and self.calls_begun == 0 and tail.begun is None:
            plan = self._plan_answer(left)
            if plan.force:
                self._count("answer_opened")
                return plan
        if self.required and self.calls_begun == 0:
            if left <= self.reserve + self.margin and tail.begun is None:
                self._count("call_opened")
                return self._start(as_latin1(self.dialect.tool_call.begin))
            return _bans(call=False, spans=spans)
        return _bans(call=left <= self.reserve and tail.begun is None, spans=spans)

    def _plan_answer(self, left: int) -> Plan:
        """The answer the turn owes: once only it still fits, its shortest spelling (before it
        begins) or its shortest completion (once begun), within the margin and the lookahead."""
        assert self.answer is not None
        progress = self.progress
        consumed = self.max_tokens - left
        if 0 <= progress.answer_at <= consumed:
            # Each token adds at most the lookahead to the need: until that bound comes due,
            # nothing is forced, and the answer (read whole: its length grows) is not read.
            bound = progress.answer_need + (consumed - progress.answer_at) * self.answer_lookahead
            if left > bound + self.margin + self.answer_lookahead:
                return NOTHING
        progress.answer_at = -1
        written = as_text(progress.answer_text)
        completion = self.answer.complete(written, self.speller.tokens)
        if completion is None:  # no reading known
            return NOTHING
        if not completion:  # complete already
            progress.answer_at, progress.answer_need = consumed, 0
            return NOTHING
        text = finish_character(progress.answer_text) + as_latin1(completion)
        plan = self._force_when_due(text, left, self.answer_lookahead)
        if not plan.force and self.speller.count(text) is not None:
            progress.answer_at, progress.answer_need = consumed, progress.need
        return plan

    def _force_when_due(self, text: str, left: int, lookahead: int) -> Plan:
        """Force ``text`` (a completion) once the tokens ``left`` come down to what it needs, plus
        the margin and ``lookahead``; its need is kept as the turn's need either way."""
        need = self.speller.count(text)
        if need is None:
            return NOTHING
        self.progress.need = need
        if left > need + self.margin + lookahead:
            return NOTHING
        return self._start(text)

    def _count(self, action: str) -> None:
        """Count a budget action (:data:`hermes_vllm.metrics.ACTIONS`) once per position: a
        draft path rolled back, or a row replayed, plans the same position again."""
        if self.progress.planned > self._acted[0]:
            self._acted[0] = self.progress.planned
            BUDGET_ACTIONS.inc(action)
            events.debug("hermes-vllm: budget action %s at output token %d", action, self.progress.planned)

    def _start(self, text: str) -> Plan:
        self.progress.forcing = text
        return Plan(text)

    def _steer(self, left: int) -> Plan:
        call = self._call_text()
        # A random or weak model leaves split characters behind: finish the last one first, and
        # read any other as U+FFFD (inside a string, where the grammar let it through).
        fix = finish_character(call)
        written = as_text(call + fix)
        completion = self.completer.complete(written, self.speller.tokens)
        if completion is None:
            return NOTHING
        return self._force_when_due(fix + as_latin1(completion + MARK), left, self.lookahead)

    def _call_text(self) -> str:
        tail = self.tail
        if tail.open is not None:
            return self.text[tail.open.start :]
        return self.text[len(self.text) - partial_tag_suffix(self.text, (self.dialect.tool_call.begin,)) :]


def _check_reserve(completer: CallCompleter, speller: Speller, reserve: int) -> None:
    """Refuse an owed call the completer cannot build (``ValueError`` naming tool and path: the
    frontend refuses it first, with the same words), and fail loudly where the reserve would not
    hold the shortest call: a turn admitted so could not keep "always"."""
    shortest = completer.shortest_call(speller.tokens)
    if shortest is None:
        where = "; ".join(completer.unknown()) or "no tool has a shortest call"
        raise ValueError(
            f"{where}: the call this tool_choice requires could not be promised within max_tokens; "
            "simplify that schema"
        )
    need = speller.tokens(shortest)
    if reserve < need:
        raise AssertionError(f"reserve {reserve} tokens is below the shortest call's {need}: {shortest!r}")


def call_reserve(shortest: str | None, close: bool, speller: Speller, margin: int) -> int:
    """Tokens a turn keeps for the call it owes: its shortest call and, where the budget closes
    cut calls, :data:`MARK` after it, in ``speller``'s tokens, plus the margin.

    The one count of the reserve: the engine's :class:`TurnBudget` forces the call to open from
    it, and the frontend refuses a ``max_tokens`` below it (so the smallest admitted value still
    holds the whole call and its mark). Only the margin where the turn has no shortest call.
    """
    text = None if shortest is None else as_latin1(shortest + (MARK if close else ""))
    count = None if text is None else speller.count(text)
    return (count or 0) + margin
