"""The call lane: a step's rows whose tokens only lengthen their calls (``ConstraintCore._lane``).

At 256 rows inside calls a step's CPU was the engine's fill and accepts plus several microseconds
of Python a row (the general reading, then each row's decision, its matcher's wrappers). Rows
whose token only lengthens the call, with nothing for the budget to do, now take a lane: their
tokens are accepted and their masks filled in one batched xgrammar call each, with no decision
asked of them one by one. The lane must leave every row, mask and failure as the general path
does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from support.budget_scenarios import WEATHER

from hermes_vllm import constraint_args
from hermes_vllm.grammar.compiler import ToolCallMatcher
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.processor.row import RowState

CALL_TEXT = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'
    + "Llanfair pwllgwyngyll gogery chwyrn drobwll "
    + 'Zürich"}}\n</tool_call>\nDone.'
)
ROWS = (  # (mode, max_tokens, stop strings): gated or not; far from the alert window, in it, reaching it
    ("auto", 400, ()),
    ("required", 400, ()),
    ("auto", None, ()),
    ("required", 40, ()),
    ("auto", 400, ("Paris",)),
    ("required", 400, ()),
    ("auto", 400, ()),
    ("required", 90, ()),  # the alert window begins halfway through the argument
)


@pytest.fixture(scope="module")
def cores(tokenizer: Any) -> Iterator[tuple[ConstraintCore, ConstraintCore]]:
    """A core, and one with its O(1) paths inside calls switched off (the general reading)."""
    fast, full = (ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar") for _ in range(2))
    full._lane = lambda state, token: None  # type: ignore[method-assign]
    full._lengthen_call = lambda state, token: False  # type: ignore[method-assign]
    yield fast, full


def admitted(core: ConstraintCore) -> list[RowState]:
    rows = []
    for mode, max_tokens, stop in ROWS:
        state = core.admit(constraint_args([WEATHER], mode), [], max_tokens=max_tokens, stop=list(stop))
        assert state is not None
        rows.append(state)
    return rows


def essentials(state: RowState) -> tuple[Any, ...]:
    """What a step changes in a row, as plain values (the matcher by its count of tokens)."""
    gate, engine, follower = state.gate, state.engine, state.gate.follower
    matcher = engine.matcher
    return (
        state.consumed, gate.on, list(gate.pending), gate.watch, gate.quiet, follower.text, follower.tail,
        follower.calls, None if matcher is None else matcher.accepted, engine.failed, engine.ended,
        None if state.budget is None else state.budget.progress,
    )  # fmt: skip


def test_a_step_through_the_lane_leaves_rows_and_masks_as_the_general_path(
    tokenizer: Any, cores: tuple[ConstraintCore, ConstraintCore]
) -> None:
    """Eight rows (gated and not, with and without a budget, one steered near its end, one
    reaching its alert window inside the call, one watching a stop string), each a few tokens
    apart in the same call, stepped together: after every step each row and each logits row are
    those of the general path's."""
    fast_core, full_core = cores
    taken = [0]
    lane = fast_core._lane

    def counted(state: RowState, token: int) -> Any:
        found = lane(state, token)
        taken[0] += found is not None
        return found

    fast_core._lane = counted  # type: ignore[method-assign]
    ids = tokenizer.encode(CALL_TEXT, add_special_tokens=False)
    sides = [(core, admitted(core)) for core in (fast_core, full_core)]
    for step in range(len(ids) + 1):
        masked = []
        for core, rows in sides:
            updates = [
                (i, row, [ids[step - 1 - i]] if 0 < step - i <= len(ids) else [])
                for i, row in enumerate(rows)
            ]
            logits = torch.zeros(len(rows), len(tokenizer))
            core.step(logits, updates)
            masked.append(torch.isinf(logits))
        assert torch.equal(masked[0], masked[1]), step
        for fast, full in zip(sides[0][1], sides[1][1], strict=True):
            assert essentials(fast) == essentials(full), step
    assert all(row.failed is None for _, rows in sides for row in rows)
    assert taken[0] > 100  # most tokens of most rows' calls


def _rows_inside_the_argument(
    tokenizer: Any, core: ConstraintCore, mode: str
) -> tuple[list[RowState], torch.Tensor, int]:
    """16 rows of ``mode`` stepped together into the call's string argument, their logits, and
    the argument's next token."""
    ids = tokenizer.encode(CALL_TEXT, add_special_tokens=False)
    start = ids.index(tokenizer.encode("Llan", add_special_tokens=False)[-1]) + 1
    admitted = [core.admit(constraint_args([WEATHER], mode), [], max_tokens=400) for _ in range(16)]
    rows = [state for state in admitted if state is not None]
    logits = torch.zeros(len(rows), len(tokenizer))
    for token in ids[:start]:
        core.step(logits, [(i, state, [token]) for i, state in enumerate(rows)])
    return rows, logits, ids[start]


def test_a_step_of_rows_lengthening_their_calls_asks_nothing_of_them_one_by_one(
    tokenizer: Any, cores: tuple[ConstraintCore, ConstraintCore]
) -> None:
    """Inside their calls, rows taking the lane are not decided one by one, nor accepted or filled
    through their matchers' wrappers: one batched accept and one batched fill serve them all."""
    core = cores[0]
    states, logits, token = _rows_inside_the_argument(tokenizer, core, "auto")
    calls: dict[str, int] = {"decide": 0, "accept_token": 0, "fill_bitmask": 0}
    originals = {
        "decide": ConstraintCore.decide,
        "accept_token": ToolCallMatcher.accept_token,
        "fill_bitmask": ToolCallMatcher.fill_bitmask,
    }

    def counting(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return originals[name](*args, **kwargs)

        return call

    try:
        ConstraintCore.decide = counting("decide")  # type: ignore[method-assign]
        ToolCallMatcher.accept_token = counting("accept_token")  # type: ignore[method-assign]
        ToolCallMatcher.fill_bitmask = counting("fill_bitmask")  # type: ignore[method-assign]
        logits.zero_()
        core.step(logits, [(i, state, [token]) for i, state in enumerate(states)])
    finally:
        ConstraintCore.decide = originals["decide"]  # type: ignore[method-assign]
        ToolCallMatcher.accept_token = originals["accept_token"]  # type: ignore[method-assign]
        ToolCallMatcher.fill_bitmask = originals["fill_bitmask"]  # type: ignore[method-assign]
    assert calls == {"decide": 0, "accept_token": 0, "fill_bitmask": 0}
    assert torch.isinf(logits).all(dim=1).logical_not().all()  # every row masked, none emptied
    assert torch.isinf(logits).any(dim=1).all()


def test_a_token_the_grammar_refuses_in_the_lane_fails_its_row_as_the_general_path_does(
    tokenizer: Any, cores: tuple[ConstraintCore, ConstraintCore]
) -> None:
    """A token that only lengthens the call's text but that the grammar refuses (a key the tool
    has not) fails its row in the lane as on the general path: only stop tokens are allowed
    after it, and the other rows of the step go on."""
    ids = tokenizer.encode('<tool_call>\n{"name": "get_weather", "arguments": {', add_special_tokens=False)
    masks = []
    for core in cores:
        rows = [core.admit(constraint_args([WEATHER], "auto"), [], max_tokens=400) for _ in range(2)]
        states = [row for row in rows if row is not None]
        logits = torch.zeros(2, len(tokenizer))
        for token in ids:
            logits.zero_()
            core.step(logits, [(i, state, [token]) for i, state in enumerate(states)])
        # Plain text (ASCII, no tag's first byte) the mask allows, and some it refuses.
        latin1 = core.compiler.vocab.latin1
        plain = [
            t
            for t, p in enumerate(latin1)
            if p and p.isascii() and "<" not in p and t not in states[0].stop_ids
        ]
        right = next(t for t in plain if not torch.isinf(logits[1, t]))
        wrong = next(t for t in plain if torch.isinf(logits[0, t]))
        logits.zero_()
        core.step(logits, [(0, states[0], [wrong]), (1, states[1], [right])])
        logits.zero_()
        core.step(logits, [(0, states[0], []), (1, states[1], [])])
        assert states[0].failed is not None and states[1].failed is None
        allowed = torch.nonzero(~torch.isinf(logits[0])).flatten().tolist()
        assert set(allowed) <= set(states[0].stop_ids)
        masks.append(torch.isinf(logits))
    assert torch.equal(masks[0], masks[1])


def test_a_row_in_the_lane_is_not_read_again_for_its_next_tokens(
    tokenizer: Any, cores: tuple[ConstraintCore, ConstraintCore]
) -> None:
    """Once a row has taken the lane, its next tokens there are checked against its ticket alone:
    the full check (:meth:`ConstraintCore._lengthens`, a dozen reads of the row's parts) runs once
    a row on entering the lane, not once a token."""
    core = cores[0]
    rows, logits, _ = _rows_inside_the_argument(tokenizer, core, "required")
    reads = [0]
    full = ConstraintCore._lengthens

    def counted(self: ConstraintCore, state: RowState, token: int) -> Any:
        reads[0] += 1
        return full(self, state, token)

    plain = tokenizer.encode(" pwllgwyngyll gogery", add_special_tokens=False)
    try:
        ConstraintCore._lengthens = counted  # type: ignore[method-assign]
        for token in plain:
            core.step(logits, [(i, state, [token]) for i, state in enumerate(rows)])
    finally:
        ConstraintCore._lengthens = full  # type: ignore[method-assign]
    assert all(state.lane is not None and state.lane.at == state.consumed for state in rows)
    assert reads[0] == 0, reads
