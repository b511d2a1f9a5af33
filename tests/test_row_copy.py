"""Draft rollback puts a row back to its mark: every field, however it changed.

A hosted row (speculative decoding) is marked before each accepted token (:meth:`RowState.mark`:
its fields read into a tuple, the budget's progress copied, the pending list by its length, the
matcher by its count of accepted tokens) and put back to the mark where a draft path is left.
Here every field of every part is changed after a mark (lists appended to, arrays rebound, the
follower's and the progress's fields rebound, the matcher fed), and going back must give the row
back exactly as it was. Rolling back is lazy: the kept drafts are taken again from the path,
with no engine work and no copy, and a draft costs one engine accept.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from support.budget_scenarios import WEATHER

from hermes_vllm import constraint_args
from hermes_vllm.budget import TurnBudget
from hermes_vllm.budget.turn_budget import Progress
from hermes_vllm.dialect import get_dialect
from hermes_vllm.grammar.compiler import ToolCallMatcher
from hermes_vllm.grammar.engines.base import Direct
from hermes_vllm.grammar.engines.xgrammar import XGrammarMatcher
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.processor.hosted import HostedGrammar, RowHost
from hermes_vllm.processor.row import EngineState, Gate, RowState
from hermes_vllm.spans import TextFollower, read_tail

TURN = '<think>let me see</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "'


PARTS = (RowState, Gate, EngineState, Progress)
"""The row and its parts that are dataclasses: walked field by field."""


def fields_of(value: Any) -> list[tuple[str, Any]]:
    """A part's fields and their values (a budget's: its progress, the rest is fixed)."""
    if isinstance(value, PARTS):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    if isinstance(value, TextFollower):
        return [(f, getattr(value, f)) for f in TextFollower.__slots__]
    assert isinstance(value, TurnBudget)
    return [("progress", value.progress)]


def describe(value: Any, path: str = "row") -> dict[str, Any]:
    """Every field of the row and of its parts, as plain values keyed by their path."""
    if isinstance(value, (*PARTS, TextFollower, TurnBudget)):
        out: dict[str, Any] = {}
        for name, field in fields_of(value):
            out.update(describe(field, f"{path}.{name}"))
        return out
    if isinstance(value, ToolCallMatcher):
        value = (id(value), value.accepted)
    elif isinstance(value, np.ndarray):
        value = value.tobytes()
    elif isinstance(value, torch.Tensor):
        value = value.tolist()
    elif isinstance(value, list):
        value = list(value)
    return {path: value}


def changed(value: Any) -> Any:
    """A different value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, bytes):
        return value + b"x"
    if isinstance(value, tuple):
        return (*value, value[0] if value else 0)
    return object()


FIXED = ("request", "prepared", "future")
"""Fields fixed at admission whose values cannot be made up."""
ADMITTED = (
    "stop_ids",
    "refused_stops",
    "refused_in_calls",
    "dialect",
    "reach",
    "_reader",
    "_marks",
    "_call_first",
)
"""Fields fixed at admission (the row's and its text follower's): never changed, so not marked."""
REBOUND = {
    "dialect": lambda: get_dialect("chatml-brackets"),
    "tail": lambda: read_tail("<think>", get_dialect("hermes")),
    "paused": lambda: np.full(8, 7, np.int32),
    "paused_bans": lambda: torch.full((3,), 7),
}
"""Values for fields that :func:`changed` cannot derive from the old one."""


def mutate_in_place(part: Any, tokenizer: Any) -> None:
    """Change every field of the row and of its parts, on the objects the row holds."""
    for name, value in fields_of(part):
        if isinstance(value, (*PARTS, TextFollower, TurnBudget)):
            mutate_in_place(value, tokenizer)
        elif isinstance(value, ToolCallMatcher):
            token = tokenizer.encode("Par", add_special_tokens=False)[0]
            assert value.accept_token(token), "the matcher took no token: nothing to roll back"
        elif isinstance(value, (np.ndarray, torch.Tensor)):
            setattr(part, name, REBOUND[name]())  # the core rebinds these, never writes into them
        elif isinstance(value, list):
            value.append(-1)
        elif name not in FIXED + ADMITTED:
            setattr(
                part,
                name,
                REBOUND[name]() if name in REBOUND else changed(value) if value is not None else "x",
            )


def fed_up_to_the_city(tokenizer: Any) -> HostedGrammar:
    """A ``required`` row with a reasoning budget and a stop string, hosted, fed up to the city."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    state = core.admit(
        constraint_args([WEATHER], "required", reasoning_budget=40), [], max_tokens=200, stop=["Paris"]
    )
    assert state is not None
    grammar = HostedGrammar(RowHost(core, window=4), state)
    bitmask = torch.zeros((1, (len(tokenizer) + 31) // 32), dtype=torch.int32)
    for token in tokenizer.encode(TURN, add_special_tokens=False):
        grammar.fill_bitmask(bitmask, 0)
        assert grammar.accept_tokens("row", [token])
    return grammar


def unchanged(fields: dict[str, Any]) -> set[str]:
    """The paths of the fields :func:`mutate_in_place` leaves alone."""
    return {k for k in fields if k.rsplit(".", 1)[-1] in FIXED + ADMITTED}


@pytest.fixture
def hosted(tokenizer: Any) -> HostedGrammar:
    return fed_up_to_the_city(tokenizer)


def test_rollback_restores_every_field_of_every_part_mutated_in_place(
    hosted: HostedGrammar, tokenizer: Any
) -> None:
    state = hosted.state
    assert state.budget is not None and state.engine.matcher is not None
    assert state.budget.follower is state.gate.follower  # the budget follows the row's own text
    # Every container field holds something, so that mutating it in place means something.
    state.engine.paused = np.arange(8, dtype=np.int32)
    state.engine.paused_bans = torch.arange(3)
    state.gate.pending.extend([1, 2])
    before = describe(state)
    assert hosted.accept_tokens("row", tokenizer.encode("P", add_special_tokens=False)[:1])
    mutate_in_place(hosted.state, tokenizer)
    mutated = describe(hosted.state)
    assert {k for k in before if before[k] == mutated[k]} <= unchanged(before)
    hosted.rollback(1)
    after = describe(hosted.state)
    assert {k for k in before if before[k] != after[k]} == set()
    assert hosted.state.budget is not None and hosted.state.budget.follower is hosted.state.gate.follower


def test_going_back_to_a_mark_keeps_every_field(hosted: HostedGrammar, tokenizer: Any) -> None:
    """The mark itself, with no step between: every field the row holds is changed right after,
    and :meth:`RowState.back_to` gives each back (the matcher by rolling it back)."""
    state = hosted.state
    state.engine.paused = np.arange(8, dtype=np.int32)
    state.engine.paused_bans = torch.arange(3)
    state.gate.pending.extend([1, 2])
    before = describe(state)
    mark = state.mark()
    mutate_in_place(state, tokenizer)
    assert {k for k in before if before[k] == describe(state)[k]} <= unchanged(before)
    state.back_to(mark)
    assert {k for k in before if before[k] != describe(state)[k]} == set()


def test_a_mark_holds_the_pending_tokens_by_their_length(tokenizer: Any) -> None:
    """A gated row inside a call keeps every token of the call pending (a fresh matcher replays
    them): its mark holds the list and its length, so marking costs the same however long the
    call is, and going back cuts the list back."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    state = core.admit(constraint_args([WEATHER], "auto"), [], max_tokens=400)
    assert state is not None and state.gate.on
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "' + "Paris " * 40
    core.advance(state, tokenizer.encode(call, add_special_tokens=False))
    pending = state.gate.pending
    assert len(pending) > 40
    mark = state.mark()
    assert pending in mark and len(pending) in mark
    core.advance(state, tokenizer.encode("Lyon Nice", add_special_tokens=False))
    assert state.gate.pending is pending and len(pending) > mark[mark.index(pending) + 1]
    state.back_to(mark)
    assert state.gate.pending is pending and len(pending) == mark[mark.index(pending) + 1]


def _counted(grammar: HostedGrammar) -> list[int]:
    """The tokens the row's engine is offered from now on, counted on its xgrammar matcher: the
    hosted row reaches it through its engine matcher or through its native calls
    (:meth:`EngineMatcher.direct`, taken again here). The matcher itself counts its net accepted
    tokens only."""
    matcher = grammar.state.engine.matcher
    assert matcher is not None
    inner = matcher.engine_matcher
    assert isinstance(inner, XGrammarMatcher)
    offered: list[int] = []
    accept, direct = inner.accept_token, inner.direct

    def counting(token: int) -> bool:
        offered.append(token)
        return accept(token)

    def counting_direct() -> Direct:
        native, fill, rollback = direct()

        def feed(token: int, debug: bool) -> bool:
            offered.append(token)
            return bool(native(token, debug))

        return feed, fill, rollback

    inner.accept_token = counting  # type: ignore[method-assign]
    inner.direct = counting_direct  # type: ignore[method-assign]
    grammar._engine = None  # the row takes its engine's direct calls again (HostedGrammar._refresh)
    grammar._until = -1
    return offered


def test_kept_drafts_are_taken_from_the_path_and_each_draft_is_offered_once(
    hosted: HostedGrammar, tokenizer: Any
) -> None:
    """vLLM's draft path (fill and accept each draft, fill the bonus row, roll back, accept the
    kept tokens): each draft reaches the engine once, the kept ones are not fed again after the
    rollback (only the bonus token is), and the masks are those of a row fed without drafts."""
    drafts = tokenizer.encode("Lyon, France", add_special_tokens=False)[:3]
    bonus = tokenizer.encode('"', add_special_tokens=False)[-1]
    width = (len(tokenizer) + 31) // 32
    offered = _counted(hosted)
    bitmask = torch.zeros((len(drafts) + 1, width), dtype=torch.int32)
    assert hosted.validate_tokens(drafts) == drafts
    offered.clear()
    for j, token in enumerate(drafts):
        hosted.fill_bitmask(bitmask, j)
        assert hosted.accept_tokens("row", [token])
    hosted.fill_bitmask(bitmask, len(drafts))
    assert offered == drafts
    hosted.rollback(len(drafts))
    assert hosted.accept_tokens("row", [*drafts, bonus])
    assert offered == [*drafts, bonus]
    plain = fed_up_to_the_city(tokenizer)
    row = torch.zeros((1, width), dtype=torch.int32)
    for j, token in enumerate([*drafts, bonus]):
        plain.fill_bitmask(row, 0)
        if j <= len(drafts):
            assert torch.equal(row[0], bitmask[j]), j
        assert plain.accept_tokens("plain", [token])
    plain.fill_bitmask(row, 0)
    hosted.fill_bitmask(bitmask, 0)
    assert torch.equal(row[0], bitmask[0])


CALL_TEXT = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'
    + "Llanfair pwllgwyngyll gogery chwyrn drobwll "
    + 'Zürich"}}\n</tool_call>\nDone.'
)


@pytest.fixture(scope="module")
def cores(tokenizer: Any) -> tuple[ConstraintCore, ConstraintCore, list[int]]:
    """A core, one with its O(1) path inside calls switched off, and the count of the tokens the
    first took that path for."""
    fast, full = (ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar") for _ in range(2))
    taken = [0]
    lengthen = fast._lengthen_call

    def counted(state: RowState, token: int) -> bool:
        done = lengthen(state, token)
        taken[0] += done
        return done

    fast._lengthen_call = counted  # type: ignore[method-assign]
    full._lengthen_call = lambda state, token: False  # type: ignore[method-assign]
    return fast, full, taken


@pytest.mark.parametrize(
    ("mode", "max_tokens", "stop"),
    [("auto", 400, ()), ("required", 400, ()), ("required", 40, ()), ("auto", 400, ("Paris",))],
)
def test_a_token_that_only_lengthens_a_call_leaves_the_row_as_the_full_reading_does(
    tokenizer: Any,
    cores: tuple[ConstraintCore, ConstraintCore, list[int]],
    mode: str,
    max_tokens: int,
    stop: tuple[str, ...],
) -> None:
    """Inside a call, most tokens only lengthen its text: the core follows them in O(1)
    (``ConstraintCore._lengthen_call``) instead of through the follower, the budget and the
    gate. Fed the same tokens, with each position's decision first as a fill makes it, a row so
    followed and one read in full (that path switched off) agree on every field and every
    decision, at every token: gated or not, far from the budget's alert window or inside it (40
    tokens: the call is steered), with a refused stop string (the path is never taken then)."""
    fast_core, full_core, taken = cores
    taken[0] = 0
    rows = []
    for core in (fast_core, full_core):
        state = core.admit(constraint_args([WEATHER], mode), [], max_tokens=max_tokens, stop=list(stop))
        assert state is not None
        rows.append((core, state))
    for token in tokenizer.encode(CALL_TEXT, add_special_tokens=False):
        decisions = [core.decide(state) for core, state in rows]
        assert decisions[0] == decisions[1]
        for core, state in rows:
            core.advance(state, (token,))
        fast, full = (describe(state) for _, state in rows)
        # The matchers are two objects: compare their counts of accepted tokens.
        fast_matcher, full_matcher = fast.pop("row.engine.matcher"), full.pop("row.engine.matcher")
        assert (fast_matcher is None) == (full_matcher is None)
        assert fast_matcher is None or fast_matcher[1] == full_matcher[1]
        assert fast == full
    assert rows[0][1].failed is None
    assert (taken[0] > 10) == (not stop and max_tokens > 100)  # in the alert window: read in full


def test_the_light_path_asks_xgrammars_native_matcher(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a call, no stop string watched, a hosted row's drafts are fed, its positions filled
    and its drafts rolled back by xgrammar's native matcher (:meth:`EngineMatcher.direct`), not
    through its Python class, whose wrappers cost a call on every token, fill and rollback; and
    the masks are those the core fills for a row fed without drafts."""
    import xgrammar as xgr

    wrapped: list[str] = []
    for method in ("accept_token", "fill_next_token_bitmask", "rollback"):
        original = getattr(xgr.GrammarMatcher, method)

        def counting(self: Any, *args: Any, _original: Any = original, _name: str = method, **kw: Any) -> Any:
            wrapped.append(_name)
            return _original(self, *args, **kw)

        monkeypatch.setattr(xgr.GrammarMatcher, method, counting)
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    state = core.admit(constraint_args([WEATHER], "required"), [], max_tokens=200)
    assert state is not None
    hosted = HostedGrammar(RowHost(core, window=4), state)
    width = (len(tokenizer) + 31) // 32
    bitmask = torch.zeros((4, width), dtype=torch.int32)
    head = tokenizer.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "', add_special_tokens=False
    )
    for token in head:
        hosted.fill_bitmask(bitmask, 0)
        assert hosted.accept_tokens("row", [token])
    assert wrapped, "the row was not read through the wrappers before its call"
    wrapped.clear()
    drafts = tokenizer.encode("Lyon, France", add_special_tokens=False)[:3]
    assert hosted.validate_tokens(drafts) == drafts
    for j, token in enumerate(drafts):
        hosted.fill_bitmask(bitmask, j)
        assert hosted.accept_tokens("row", [token])
    hosted.fill_bitmask(bitmask, len(drafts))
    hosted.rollback(len(drafts))  # none kept: the next fill goes back over them
    hosted.fill_bitmask(bitmask, 0)
    for j, token in enumerate(drafts):
        hosted.fill_bitmask(bitmask, j)
        assert hosted.accept_tokens("row", [token])
    hosted.fill_bitmask(bitmask, len(drafts))
    assert wrapped == []
    monkeypatch.undo()
    plain = core.admit(constraint_args([WEATHER], "required"), [], max_tokens=200)
    assert plain is not None
    row = torch.zeros((1, width), dtype=torch.int32)
    for token in head:
        core.fill([(0, plain)], len(tokenizer), bitmask=row)
        core.advance(plain, (token,))
    for j, token in enumerate([*drafts, None]):
        row.zero_()
        core.fill([(0, plain)], len(tokenizer), bitmask=row)
        assert torch.equal(row[0], bitmask[j]), j
        if token is not None:
            core.advance(plain, (token,))


def test_a_fill_off_the_light_path_asks_xgrammars_native_matcher_too(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the row's fill is its engine's mask (after the call, outside the light path), a
    hosted row whose matcher adds nothing to its engine's fills through xgrammar's native matcher
    as well, with the mask the core fills."""
    import xgrammar as xgr

    filled: list[int] = []
    original = xgr.GrammarMatcher.fill_next_token_bitmask

    def counting(self: Any, *args: Any, **kw: Any) -> Any:
        filled.append(1)
        return original(self, *args, **kw)

    monkeypatch.setattr(xgr.GrammarMatcher, "fill_next_token_bitmask", counting)
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    rows = [core.admit(constraint_args([WEATHER], "required"), [], max_tokens=200) for _ in range(2)]
    assert rows[0] is not None and rows[1] is not None
    hosted = HostedGrammar(RowHost(core, window=4), rows[0])
    width = (len(tokenizer) + 31) // 32
    bitmask, row = (torch.zeros((1, width), dtype=torch.int32) for _ in range(2))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
    for token in tokenizer.encode(call, add_special_tokens=False):
        hosted.fill_bitmask(bitmask, 0)
        assert hosted.accept_tokens("row", [token])
        core.advance(rows[1], (token,))
    filled.clear()
    hosted.fill_bitmask(bitmask, 0)
    assert filled == []
    core.fill([(0, rows[1])], len(tokenizer), bitmask=row)
    assert filled and torch.equal(row, bitmask)


def _reading_core(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[ConstraintCore, list[int]]:
    """A core, and the positions at which it is asked whether a row is on the light path
    (:meth:`ConstraintCore.engine_alone_until`), in order."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    reads: list[int] = []
    alone_until = core.engine_alone_until

    def counted(state: RowState, followed: bool = True) -> tuple[int, Any, bool]:
        reads.append(state.consumed)
        return alone_until(state, followed)

    monkeypatch.setattr(core, "engine_alone_until", counted)
    return core, reads


def test_a_position_off_the_light_path_is_read_once(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a call, where a hosted row is off the light path (a stop string is refused there),
    its fill reads so once and its token's accept does not read it again (the fill moves no row
    onto the path, and staying off it is the full reading): one read a position."""
    core, reads = _reading_core(tokenizer, monkeypatch)
    state = core.admit(constraint_args([WEATHER], "required"), [], max_tokens=200, stop=["Paris"])
    assert state is not None
    core.start_engine(state)  # as vLLM's compile thread does (RowHost.grammar)
    hosted = HostedGrammar(RowHost(core, window=4), state)
    bitmask = torch.zeros((1, (len(tokenizer) + 31) // 32), dtype=torch.int32)
    opening = tokenizer.encode("<tool_call>", add_special_tokens=False)
    for token in opening:
        hosted.fill_bitmask(bitmask, 0)
        assert hosted.accept_tokens("row", [token])
    assert reads == list(range(len(opening)))


def test_a_tag_on_the_light_path_is_not_planned_again(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token read whole at a position on the light path (the call's closing tag) takes the
    budget's known plan there (nothing: the path's fills are the engine's alone) instead of
    planning the position, and the row ends the call as the core's does."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    rows = [core.admit(constraint_args([WEATHER], "required"), [], max_tokens=200) for _ in range(2)]
    assert rows[0] is not None and rows[1] is not None
    core.start_engine(rows[0])
    hosted = HostedGrammar(RowHost(core, window=4), rows[0])
    bitmask = torch.zeros((1, (len(tokenizer) + 31) // 32), dtype=torch.int32)
    call = tokenizer.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>',
        add_special_tokens=False,
    )
    assert rows[0].budget is not None
    planned: list[int] = []
    plan = rows[0].budget.plan

    def counted(consumed: int) -> Any:
        planned.append(consumed)
        return plan(consumed)

    monkeypatch.setattr(rows[0].budget, "plan", counted)
    for token in call:
        core.decide(rows[1])
        core.advance(rows[1], (token,))
        hosted.fill_bitmask(bitmask, 0)
        planned.clear()
        assert hosted.accept_tokens("row", [token])
    assert planned == []  # the closing tag, last, on the path: no plan
    assert hosted.state.gate.follower.tail == rows[1].gate.follower.tail
    assert hosted.state.budget is not None and rows[1].budget is not None
    assert hosted.state.budget.progress == rows[1].budget.progress


def test_a_hosted_row_is_read_at_admission(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hosted row reads where it stands (its light path, its engine's native calls) when it is
    built, on vLLM's compile thread (``RowHost.grammar``): its first fill, on the scheduler's
    thread, reads nothing more, and fills what the core fills."""
    core, reads = _reading_core(tokenizer, monkeypatch)
    rows = [core.admit(constraint_args([WEATHER], "required"), [], max_tokens=200) for _ in range(2)]
    assert rows[0] is not None and rows[1] is not None
    core.start_engine(rows[0])
    hosted = HostedGrammar(RowHost(core, window=4), rows[0])
    assert reads == [0]
    width = (len(tokenizer) + 31) // 32
    bitmask, row = (torch.zeros((1, width), dtype=torch.int32) for _ in range(2))
    hosted.fill_bitmask(bitmask, 0)
    assert reads == [0]
    core.fill([(0, rows[1])], len(tokenizer), bitmask=row)
    assert torch.equal(row, bitmask)


TURN_WITH_CALL = (
    '<think>let me see</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}'
    "\n</tool_call>"
)


def test_a_required_row_takes_its_whole_turn_on_the_path_tags_and_stop_included(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row whose engine runs everywhere, no stop string refused, below its budget's calm bound
    (:meth:`TurnBudget.calm_until`): every position of its turn (a reasoning span, the call's
    tags, the stop token) is its engine's alone, so the hosted row decides nothing and marks
    nothing there; each mask is the core's own, and once read the row's text, tail, budget and
    every other field are those of a row the core followed token by token."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    rows = [core.admit(constraint_args([WEATHER], "required"), [], max_tokens=300) for _ in range(2)]
    assert rows[0] is not None and rows[1] is not None
    core.start_engine(rows[0])
    hosted = HostedGrammar(RowHost(core, window=4), rows[0])
    width = (len(tokenizer) + 31) // 32
    bitmask, row = (torch.zeros((1, width), dtype=torch.int32) for _ in range(2))
    hosted.fill_bitmask(bitmask, 0)  # the host checks vLLM's bitmask once, at a first fill
    counts = {"decide": 0, "mark": 0}
    decide, mark = core.decide, RowState.mark

    def deciding(state: RowState) -> Any:
        counts["decide"] += 1
        return decide(state)

    def marking(state: RowState, behind: int = 0) -> Any:
        counts["mark"] += 1
        return mark(state, behind)

    monkeypatch.setattr(core, "decide", deciding)
    monkeypatch.setattr(RowState, "mark", marking)
    tokens = [*tokenizer.encode(TURN_WITH_CALL, add_special_tokens=False), tokenizer.eos_token_id]
    masks = []
    for token in tokens:
        hosted.fill_bitmask(bitmask, 0)
        masks.append(bitmask[0].clone())
        assert hosted.accept_tokens("row", [token])
    assert hosted.is_terminated() and counts == {"decide": 0, "mark": 0}
    monkeypatch.undo()
    plain = rows[1]
    for i, token in enumerate(tokens):
        row.zero_()
        masked, _ = core.fill([(0, plain)], len(tokenizer), bitmask=row)
        if not masked:
            row[0].fill_(-1)
        assert torch.equal(row[0], masks[i]), i
        core.advance(plain, (token,))
    assert plain.engine.ended and rows[0].engine.ended
    # The core leaves a required row's engine waiting inside the reasoning span (it is paused
    # there, its mask kept); the hosted row's engine took the span's tokens: only that differs.
    fields, expected = describe(hosted.state), describe(plain)
    assert fields.pop("row.engine.matcher")[1] > expected.pop("row.engine.matcher")[1]
    assert fields == expected


def test_going_back_over_tokens_followed_where_the_path_ended(tokenizer: Any) -> None:
    """Tokens taken anywhere (their text not followed) are followed where the row leaves the path,
    and the ones vLLM may still roll back get their marks then: rolled back over a closing tag
    and the stop token after the text was read, the row is the one fed only the kept tokens."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    tokens = [*tokenizer.encode(TURN_WITH_CALL, add_special_tokens=False), tokenizer.eos_token_id]
    width = (len(tokenizer) + 31) // 32
    bitmask = torch.zeros((1, width), dtype=torch.int32)
    for back in (1, 2, 3):
        state = core.admit(constraint_args([WEATHER], "required"), [], max_tokens=300)
        assert state is not None
        core.start_engine(state)
        hosted = HostedGrammar(RowHost(core, window=4), state)
        for token in tokens:
            hosted.fill_bitmask(bitmask, 0)
            assert hosted.accept_tokens("row", [token])
        before = describe(hosted.state)  # read: the text is followed, the last tokens marked
        assert before["row.gate.follower.calls"] + before["row.gate.follower.tail"].calls == 1
        hosted.rollback(back)
        plain = core.admit(constraint_args([WEATHER], "required"), [], max_tokens=300)
        assert plain is not None
        core.start_engine(plain)
        kept = HostedGrammar(RowHost(core, window=4), plain)
        for token in tokens[:-back]:
            kept.fill_bitmask(bitmask, 0)
            assert kept.accept_tokens("row", [token])
        fields, expected = describe(hosted.state), describe(kept.state)
        assert fields.pop("row.engine.matcher")[1] == expected.pop("row.engine.matcher")[1]
        # The rolled-back row had its next position's fill (vLLM fills before it drafts): it
        # counts that position as planned, which only spares planning it again.
        assert fields.pop("row.budget.progress.planned") == expected.pop("row.budget.progress.planned") + 1
        assert fields == expected, back
        assert hosted.accept_tokens("row", tokens[-back:]) and hosted.is_terminated()
