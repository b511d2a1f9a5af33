"""Draft rollback restores a row through its parts' own ``copy()``: every field, mutated in place.

A hosted row (speculative decoding) is snapshotted before each accepted token and restored on
rollback. The snapshot is :meth:`RowState.copy`, which copies the row's parts (its gate with the text
follower, its engine state, its budget's progress) by their own ``copy()``; the matcher is rolled
back by its count. Here every field of every part is mutated in place after a snapshot (lists
appended to, arrays overwritten, the follower's and the progress's fields rebound, the matcher
fed), and the rollback must give the row back exactly as it was.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from support.budget_scenarios import WEATHER

from hermes_vllm import constraint_args
from hermes_vllm.budget import AnswerCompleter, CallCompleter, Speller, TurnBudget
from hermes_vllm.budget.turn_budget import Progress
from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.grammar.compiler import ToolCallMatcher
from hermes_vllm.processor.core import ConstraintCore, EngineState, Gate, RowState
from hermes_vllm.processor.hosted import HostedGrammar, RowHost
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
"""Fields fixed at admission whose values cannot be made up (checked immutable below)."""
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
        elif isinstance(value, np.ndarray):
            value.fill(7)
        elif isinstance(value, torch.Tensor):
            value.fill_(7)
        elif isinstance(value, list):
            value.append(-1)
        elif name not in FIXED:
            setattr(
                part,
                name,
                REBOUND[name]() if name in REBOUND else changed(value) if value is not None else "x",
            )


@pytest.fixture
def hosted(tokenizer: Any) -> HostedGrammar:
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
    assert {k for k in before if before[k] == mutated[k]} <= {f"row.{f}" for f in FIXED}
    hosted.rollback(1)
    after = describe(hosted.state)
    assert {k for k in before if before[k] != after[k]} == set()
    assert hosted.state.budget is not None and hosted.state.budget.follower is hosted.state.gate.follower


def test_a_copy_keeps_every_field_when_the_row_is_mutated_in_place(
    hosted: HostedGrammar, tokenizer: Any
) -> None:
    """The copy itself, with no step between: every container the row holds is mutated in place
    right after (a step may rebind a field first, which would hide a shared container). The
    matcher alone is shared by design, and restored by its count."""
    state = hosted.state
    state.engine.paused = np.arange(8, dtype=np.int32)
    state.engine.paused_bans = torch.arange(3)
    state.gate.pending.extend([1, 2])
    before = describe(state)
    twin = state.copy()
    mutate_in_place(state, tokenizer)
    kept = describe(twin)
    assert {k for k in before if before[k] != kept[k]} == {"row.engine.matcher"}


IMMUTABLE = (int, str, bytes, bool, tuple, type(None), Dialect, CallCompleter, AnswerCompleter, Speller)


def test_a_copy_shares_only_what_never_changes(hosted: HostedGrammar) -> None:
    """What a row's copy shares is immutable, a pure cache, or the compile's future: the fields
    admission fixed, and a budget's terms."""
    state = hosted.state
    budget = state.budget
    assert budget is not None
    terms = {k: v for k, v in vars(budget).items() if k not in ("progress", "follower")}
    fixed = {
        f.name: getattr(state, f.name)
        for f in dataclasses.fields(RowState)
        if f.name not in ("gate", "engine", "budget", "future")
    }
    assert dataclasses.is_dataclass(state.request) and state.request.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert state.prepared.__dataclass_params__.frozen  # type: ignore[attr-defined]
    shared = {**terms, **{k: v for k, v in fixed.items() if k not in ("request", "prepared")}}
    assert terms and all(isinstance(v, IMMUTABLE) for v in shared.values()), {
        k: type(v) for k, v in shared.items() if not isinstance(v, IMMUTABLE)
    }
    twin = state.copy()
    assert twin.budget is not None and twin.budget.progress is not budget.progress
    assert twin.gate is not state.gate and twin.engine is not state.engine
    assert twin.gate.follower is not state.gate.follower and twin.budget.follower is twin.gate.follower
