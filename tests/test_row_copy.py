"""Draft rollback restores a row through its parts' own ``copy()``: every field, mutated in place.

A hosted row (speculative decoding) is snapshotted before each accepted token and restored on
rollback. The snapshot is :meth:`RowState.copy`, which copies the row's containers, its text
follower and its budget's progress; the matcher is rolled back by its count. Here every field of
every part is mutated in place after a snapshot (lists appended to, arrays overwritten, the
follower's and the progress's fields rebound, the matcher fed), and the rollback must give the
row back exactly as it was.
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
from hermes_vllm.processor.core import ConstraintCore, RowState
from hermes_vllm.processor.hosted import HostedGrammar, RowHost
from hermes_vllm.spans import TextFollower, read_tail

TURN = '<think>let me see</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "'


def describe(state: RowState) -> dict[str, Any]:
    """Every field of the row and of its parts, as plain values."""
    out: dict[str, Any] = {}
    for name in RowState.__slots__:
        value = getattr(state, name)
        if isinstance(value, TextFollower):
            value = tuple(getattr(value, f) for f in TextFollower.__slots__)
        elif isinstance(value, TurnBudget):
            assert value.follower is state.follower  # the budget follows the row's own text
            value = dataclasses.astuple(value.progress)
        elif isinstance(value, ToolCallMatcher):
            value = (id(value), value.accepted)
        elif isinstance(value, np.ndarray):
            value = value.tobytes()
        elif isinstance(value, torch.Tensor):
            value = value.tolist()
        elif isinstance(value, list):
            value = list(value)
        out[name] = value
    return out


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


def mutate_in_place(state: RowState, tokenizer: Any) -> None:
    """Change every field of the row and of its parts, on the objects the row holds."""
    for name in RowState.__slots__:
        value = getattr(state, name)
        if isinstance(value, TextFollower):
            other = {
                "dialect": get_dialect("chatml-brackets"),
                "tail": read_tail("<tool_call>", state.dialect),
            }
            for field in TextFollower.__slots__:
                setattr(value, field, other.get(field, changed(getattr(value, field))))
        elif isinstance(value, TurnBudget):
            for field in dataclasses.fields(Progress):
                setattr(value.progress, field.name, changed(getattr(value.progress, field.name)))
        elif isinstance(value, ToolCallMatcher):
            token = tokenizer.encode("Par", add_special_tokens=False)[0]
            assert value.accept_token(token), "the matcher took no token: nothing to roll back"
        elif isinstance(value, np.ndarray):
            value.fill(7)
        elif isinstance(value, torch.Tensor):
            value.fill_(7)
        elif isinstance(value, list):
            value.append(-1)
        elif value is None:  # rebound where the advanced row holds none
            setattr(
                state,
                name,
                {"paused": np.full(8, 7, np.int32), "paused_bans": torch.full((3,), 7)}.get(name, "x"),
            )
        elif name not in ("request", "prepared", "future"):
            setattr(state, name, changed(value))


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
    assert state.budget is not None and state.matcher is not None and state.pending is not None
    # Every container field holds something, so that mutating it in place means something.
    state.paused = np.arange(8, dtype=np.int32)
    state.paused_bans = torch.arange(3)
    state.pending.extend([1, 2])
    before = describe(state)
    assert hosted.accept_tokens("row", tokenizer.encode("P", add_special_tokens=False)[:1])
    mutate_in_place(hosted.state, tokenizer)
    assert describe(hosted.state) != before
    hosted.rollback(1)
    after = describe(hosted.state)
    assert {k for k in before if before[k] != after[k]} == set()


def test_a_copy_shares_only_what_never_changes(hosted: HostedGrammar) -> None:
    """A budget's terms are shared by its copies: each is immutable, or a pure cache."""
    budget = hosted.state.budget
    assert budget is not None
    shared = (int, str, bool, tuple, type(None), Dialect, CallCompleter, AnswerCompleter, Speller)
    terms = {k: v for k, v in vars(budget).items() if k not in ("progress", "follower")}
    assert terms and all(isinstance(v, shared) for v in terms.values()), {
        k: type(v) for k, v in terms.items() if not isinstance(v, shared)
    }
    twin = hosted.state.copy()
    assert twin.budget is not None and twin.budget.progress is not budget.progress
    assert twin.follower is not hosted.state.follower and twin.budget.follower is twin.follower
