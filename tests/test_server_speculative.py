"""Constrained tool calls over HTTP with ngram speculative decoding, driven by the ``openai`` client.

The budget scenarios of :mod:`support.budget_scenarios` (``required``, named, ``auto``,
tight and roomy ``max_tokens``, ``thinking_token_budget``, a stop string; streamed and whole) are
sent without their logit bias, which vLLM refuses under speculative decoding: nothing pushes the
random model toward a call or its end, only the budgets do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import budget_scenarios
from support.budget_scenarios import WEATHER, Case, ask
from support.drafts import COPYABLE_PROMPT, NGRAM

from hermes_vllm import constraint_args
from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
from hermes_vllm.metrics import FLUSH_S
from hermes_vllm.spans import split_spans
from hermes_vllm.testing import tiny_model_path

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Any, Path]]:
    from transformers import AutoTokenizer

    model = tiny_model_path("mistral-v1")
    args = [*CPU_ARGS, "--enable-auto-tool-choice", "--seed", "0", "--speculative-config", json.dumps(NGRAM)]
    args += ["--tool-call-parser", "hermes_vllm", "--reasoning-parser", "hermes_vllm"]
    log = tmp_path_factory.mktemp("speculative") / "server.log"
    with openai_server(model, args, CPU_ENV, log_path=log) as url:
        yield url, str(model), AutoTokenizer.from_pretrained(str(model)), log


def unbiased(case: Case) -> Case:
    return dataclasses.replace(case, kwargs={k: v for k, v in case.kwargs.items() if k != "logit_bias"})


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30).read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_every_budget_scenario_keeps_its_promise_with_drafts_and_no_bias(
    server: tuple[str, str, Any, Path],
) -> None:
    url, model, tokenizer, log = server
    todo = [unbiased(c) for c in budget_scenarios.cases(tokenizer, sets=1)]

    async def gather() -> list[Any]:
        return await asyncio.gather(*(ask(url, model, c) for c in todo))

    replies = asyncio.run(gather())
    problems = [
        f"{c.scenario} (stream={c.stream}): {p}"
        for c, r in zip(todo, replies, strict=True)
        if (p := budget_scenarios.judge(c, r, tokenizer))
    ]
    assert not problems, problems
    assert any(r.calls for r in replies)
    assert metric(url, "vllm:spec_decode_num_draft_tokens_total") > 0
    assert "ending a constrained request" not in log.read_text(encoding="utf-8")
    # The hosted rows' steps reach the step metrics too (a process writes them every FLUSH_S).
    deadline = time.monotonic() + 10 * FLUSH_S
    while metric(url, "hermes_vllm:step_seconds_count") == 0 and time.monotonic() < deadline:
        time.sleep(FLUSH_S)
    assert metric(url, "hermes_vllm:step_seconds_count") > 0
    assert metric(url, "hermes_vllm:constrained_rows") >= 1


def test_drafts_copied_from_the_prompt_are_accepted(server: tuple[str, str, Any, Path]) -> None:
    """Greedy, on a raw prompt holding calls to copy (``/v1/completions``: chat messages would be
    escaped): the ngram proposer drafts them, and the target, constrained alike at every draft
    position, accepts drafts."""
    from openai import OpenAI

    url, model, _, _ = server
    before = metric(url, "vllm:spec_decode_num_accepted_tokens_total")
    client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
    reply = client.completions.create(
        model=model,
        prompt=COPYABLE_PROMPT,
        max_tokens=60,
        temperature=0.0,
        extra_body={"vllm_xargs": constraint_args([WEATHER], "required"), "skip_special_tokens": False},
    )
    calls = [s for s in split_spans(reply.choices[0].text, "hermes") if s.kind == "call"]
    assert calls and calls[0].closed, reply.choices[0].text
    assert json.loads(calls[0].body)["name"] == "get_weather"
    assert metric(url, "vllm:spec_decode_num_accepted_tokens_total") > before


@pytest.mark.parametrize("choice", ["auto", "required", "none"])
def test_tools_beside_a_response_format_are_served_with_drafts(
    server: tuple[str, str, Any, Path], choice: str
) -> None:
    """The answer's schema is in our turn grammar, the grammar vLLM's structured outputs host
    under speculative decoding (before: refused, HTTP 400): a required call arrives, and what
    ``auto`` / ``none`` write is a call or the whole answer, never free text (no logit bias: the
    budget writes the answer in time)."""
    url, model, _, log = server
    answer = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    formats = [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "a", "schema": answer}},
    ]
    cases = [
        Case(choice, [WEATHER], {"tool_choice": choice, "max_tokens": 60, "response_format": f}, stream)
        for f in formats
        for stream in (False, True)
    ]

    async def gather() -> list[Any]:
        return await asyncio.gather(*(ask(url, model, c) for c in cases))

    for reply in asyncio.run(gather()):
        assert not reply.error, reply
        if choice == "required":
            assert reply.calls, reply
        elif not reply.calls:  # the answer is owed, and the budget writes it in time
            assert isinstance(json.loads(reply.content), dict), reply
        assert choice == "auto" or not (reply.calls and choice == "none"), reply
    assert "ending a constrained request" not in log.read_text(encoding="utf-8")
