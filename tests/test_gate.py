"""One gate: the processor's row gate and the public matcher's gate follow a turn's text, hold the
tokens since its last clean point and come back to a mark with one piece of code
(:class:`hermes_vllm.gate.TextGate`); each once kept its own copy, and the two could drift apart."""

from __future__ import annotations

from typing import Any

import pytest
from support.budget_scenarios import WEATHER

from hermes_vllm import constraint_args
from hermes_vllm.dialect import get_dialect
from hermes_vllm.gate import GATE_ROLLBACK, GateHistory, TextGate
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.spans import TextFollower

TURN = (
    "Let me look. <think>maybe <tool_call> is text here</think> Now:\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call> and\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call> Done.'
)


def test_the_row_gate_and_the_matchers_gate_follow_a_turn_as_one(tokenizer: Any) -> None:
    """Fed the same tokens of an ``auto`` turn with parallel calls (free text, a reasoning span
    holding a call tag, two calls), the row's gate and the public matcher's gate stand in the same
    place at every token: the same text since the last clean point, tail, calls and tokens held
    for a fresh matcher; and the matcher rolled back stands where the row's mark says."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    state = core.admit(constraint_args([WEATHER], "auto"), [])
    assert state is not None and state.gate.on
    matcher = core.compiler.result(state.prepared, state.future).matcher()
    gate = matcher._gate
    assert isinstance(state.gate, TextGate) and isinstance(gate, TextGate)
    marks = []
    held = 0
    for token in tokenizer.encode(TURN, add_special_tokens=False):
        marks.append(state.mark())
        core.advance(state, [token])
        assert matcher.accept_token(token)
        assert state.gate.mark()[:4] == gate.mark()[:4]
        assert state.gate.pending == gate.pending
        held = max(held, len(gate.pending))
    assert held > 16, "the turn must hold a call's tokens"
    assert state.engine.failed is None and gate.follower.calls == 2
    for k in (40, 1):  # back into the second call, then one token
        state.back_to(marks[-k])
        matcher.rollback(k)
        assert state.gate.mark()[:4] == gate.mark()[:4] and state.gate.pending == gate.pending
        del marks[-k:]
    assert state.gate.pending, "the rollbacks must land inside a call"


def test_a_gates_history_is_bounded() -> None:
    """The marks of the last :data:`GATE_ROLLBACK` tokens are kept, no more; a deeper rollback is
    refused with the history untouched."""
    gate = TextGate(TextFollower(get_dialect("hermes")))
    history = GateHistory()
    for token in range(GATE_ROLLBACK + 8):
        history.push(gate.mark())
        gate.hold([token])
    with pytest.raises(ValueError, match="cannot roll back"):
        history.back(GATE_ROLLBACK + 1)
    gate.back_to(history.back(GATE_ROLLBACK))
    assert gate.pending == list(range(8))
