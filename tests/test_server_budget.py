"""Token budgets on the real OpenAI server, driven by the ``openai`` client.

The server runs with the documented flags (``--tool-call-parser hermes_vllm --reasoning-parser
hermes_vllm``), the random tiny model at temperature 1, a bias toward ``"``, ``}`` and ``]`` only
(:mod:`support.budget_scenarios`): nothing pushes the model toward the call tag, so
it wanders into ``<think>`` spans, and only the budget gets the call written in time. vLLM's own
thinking budget is on for the requests that send ``thinking_token_budget`` (the reasoning parser
switches it on), so those replies also show that its forcing and ours agree: the server log must
hold no row our grammar ended. Every reply's ``usage`` must count its reasoning tokens, and a
reply holding a call the budget closed must say it was truncated, on Chat Completions and on the
Responses API, streamed and whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import budget_scenarios
from support.budget_scenarios import CLOSED_THEN_ENDED, WEATHER, Case, ask, reserve

from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
from hermes_vllm.testing import tiny_model_path

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Any, Path]]:
    from transformers import AutoTokenizer

    model = tiny_model_path("mistral-v1")
    args = [*CPU_ARGS, "--enable-auto-tool-choice", "--seed", "0"]
    args += ["--tool-call-parser", "hermes_vllm", "--reasoning-parser", "hermes_vllm"]
    log = tmp_path_factory.mktemp("budget") / "server.log"
    with openai_server(model, args, CPU_ENV, log_path=log) as url:
        yield url, str(model), AutoTokenizer.from_pretrained(str(model)), log


def test_every_budget_scenario_keeps_its_promise(server: tuple[str, str, Any, Path]) -> None:
    """Required and named replies hold a valid call at 400 tokens, at a max_tokens just above
    the reserve, and 20 above it with no bias at all, streamed and whole; thinking_token_budget caps the turn's reasoning; auto with
    calls pushed returns no invalid call; a stop string pushed into the argument does not end the
    call; a call the budget closed comes back truncated even where the model ended its turn after
    it; usage counts the reasoning tokens."""
    url, model, tokenizer, log = server
    outcomes = budget_scenarios.run(url, model, tokenizer)
    failed = {name: o.failures for name, o in outcomes.items() if o.ok < o.total}
    assert not failed, failed
    assert len(outcomes) == 10 and all(o.total >= 4 for o in outcomes.values())
    assert outcomes[CLOSED_THEN_ENDED].closed >= 2, "too few calls closed by the budget to judge"
    thinking = outcomes[f"required, thinking_token_budget={budget_scenarios.THINKING_BUDGET}, <think> pushed"]
    assert thinking.reasoning > 0, "no reasoning to check the budget and usage on"
    assert "ending a constrained request" not in log.read_text(encoding="utf-8")


def test_a_max_tokens_that_cannot_hold_the_shortest_call_is_refused(
    server: tuple[str, str, Any, Path],
) -> None:
    url, model, tokenizer, _ = server
    need = reserve(tokenizer, [WEATHER], "required")
    case = Case("400", [WEATHER], {"tool_choice": "required", "max_tokens": need - 1}, False)
    reply = asyncio.run(ask(url, model, case))
    assert reply.error.startswith("BadRequestError"), reply
    assert f"max_tokens={need - 1}" in reply.error and f"{need} tokens" in reply.error
