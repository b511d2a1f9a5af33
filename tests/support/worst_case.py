"""The adversary's worst case over one tool, for the tests that check its calls further (the
client's own pydantic model, jsonschema with formats): every sampler plays each turn from the
budget's reserve up, and the arguments of every call it got are handed to the test."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from hermes_vllm import constraint_args
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.testing.adversary import SAMPLERS, Scenario, run


def worst_case_arguments(
    tokenizer: Any,
    tool: dict[str, Any],
    plays: Sequence[tuple[str, int]],
    *,
    engine: str = "auto",
    seeded: bool = False,
) -> Iterator[Any]:
    """Each play ``(choice, tokens above the reserve)`` by every sampler, ``tool`` alone on a core
    on ``engine``: each reply must keep the budgets' promise (the owed call complete and valid
    for the tool) and hold one payload per call it counts; yields each call's arguments, in order.

    The checks run as the caller iterates: iterate to the end. ``seeded``: a play's seed is its
    tokens above the reserve (else 0)."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine=engine)
    state = core.admit(constraint_args([tool], "required"), [], max_tokens=1000)
    assert state is not None and state.budget is not None
    for sampler in SAMPLERS:
        for choice, extra in plays:
            scenario = Scenario([tool], choice, state.budget.reserve + extra)
            outcome = run(core, tokenizer, scenario, sampler, seed=extra if seeded else 0)
            assert outcome.kept(None), (sampler, choice, extra, outcome)
            assert len(outcome.payloads) == outcome.calls, outcome
            for payload in outcome.payloads:
                yield payload["arguments"]
