"""A real server whose chat template opens ``<think>`` in the generation prompt.

Qwen 3's tokenizer and the tiny random model, served with a Qwen3-Thinking-2507-style template
(``tests/templates``) and our ``hermes_vllm_qwen`` parsers: the model's output starts inside the
reasoning span. The reply must be split there (reasoning up to ``</think>``, never the tag in the
content), a ``required`` call must still arrive (the processor starts the row inside the span,
and its budget closes the span in time), and ``response_format`` JSON must leave the reasoning
free and hold the content to the schema, as with vLLM's own qwen3 reasoning parser.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openai import AsyncOpenAI

from hermes_vllm.demo.bias import call_bias
from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
from hermes_vllm.testing import tiny_model_path

pytestmark = pytest.mark.server

TEMPLATE = Path(__file__).parent / "templates" / "qwen3_thinking_2507.jinja"
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD}}]
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Served:
    url: str
    model: str
    tokenizer: Any


@dataclass(frozen=True)
class Split:
    reasoning: str
    content: str
    calls: list[tuple[str, str]]
    raw: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from transformers import AutoTokenizer

    model = tiny_model_path("qwen3")
    args = [*CPU_ARGS, "--enable-auto-tool-choice", "--seed", "0", "--max-num-batched-tokens", "16384"]
    args += ["--tool-call-parser", "hermes_vllm_qwen", "--reasoning-parser", "hermes_vllm_qwen"]
    args += ["--chat-template", str(TEMPLATE)]
    log = tmp_path_factory.mktemp("prompt") / "server.log"
    with openai_server(model, args, CPU_ENV, log_path=log) as url:
        yield Served(url, str(model), AutoTokenizer.from_pretrained(str(model)))


async def _ask(served: Served, stream: bool, **kwargs: Any) -> Split:
    async with AsyncOpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300) as client:
        kwargs = {
            "model": served.model,
            "messages": MESSAGES,
            "temperature": 1.0,
            "extra_body": {"return_token_ids": True},
            **kwargs,
        }
        if not stream:
            choice = (await client.chat.completions.create(**kwargs)).choices[0]
            message = choice.message
            return Split(
                getattr(message, "reasoning", None) or "",
                message.content or "",
                [(c.function.name, c.function.arguments) for c in message.tool_calls or []],
                served.tokenizer.decode(choice.model_extra["token_ids"]),
            )
        reasoning = content = ""
        calls: dict[int, list[str]] = {}
        ids: list[int] = []
        async for chunk in await client.chat.completions.create(stream=True, **kwargs):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            ids += chunk.choices[0].model_extra.get("token_ids") or []
            reasoning += getattr(delta, "reasoning", None) or ""
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", ""])
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
        return Split(reasoning, content, [(n, a) for n, a in calls.values()], served.tokenizer.decode(ids))


def ask_both(served: Served, **kwargs: Any) -> tuple[Split, Split]:
    async def both() -> tuple[Split, Split]:
        whole, streamed = await asyncio.gather(_ask(served, False, **kwargs), _ask(served, True, **kwargs))
        return whole, streamed

    return asyncio.run(both())


def test_a_required_call_arrives_after_the_reasoning_the_prompt_opened(served: Served) -> None:
    """No ``<think>`` in the output: the prompt opened it; the budget closes it for the owed call."""
    bias = {str(k): v for k, v in call_bias(served.tokenizer, ("qwen",)).items()}
    whole, streamed = ask_both(
        served, tools=TOOLS, tool_choice="required", max_tokens=120, seed=3, logit_bias=bias
    )
    assert "<think>" not in whole.raw, "the prompt opened the span: the model writes only its end"
    assert whole.raw.index("</think>") > 0
    assert whole.reasoning == whole.raw[: whole.raw.index("</think>")]
    assert whole.calls and all(name == "add" for name, _ in whole.calls)
    for _, arguments in whole.calls:
        jsonschema.validate(json.loads(arguments), ADD)
    assert "</think>" not in whole.content and "<tool_call>" not in whole.content
    assert (streamed.reasoning, streamed.content, streamed.calls) == (
        whole.reasoning,
        whole.content,
        whole.calls,
    )


def test_json_output_comes_after_free_reasoning(served: Served) -> None:
    """``response_format`` holds only the text after ``</think>`` to the schema, as vLLM's qwen3 parser does."""
    end = served.tokenizer.convert_tokens_to_ids("</think>")
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    # The closers' bias lets the random model finish the object; the grammar still decides.
    bias = {str(k): v for k, v in call_bias(served.tokenizer, ()).items()} | {str(end): 12.0}
    whole, streamed = ask_both(served, response_format=fmt, max_tokens=300, seed=5, logit_bias=bias)
    assert "</think>" in whole.raw, "the bias makes the random model close the span"
    assert whole.reasoning == whole.raw[: whole.raw.index("</think>")]
    jsonschema.validate(json.loads(whole.content), ANSWER)
    assert (streamed.reasoning, streamed.content) == (whole.reasoning, whole.content)
