"""Real vLLM OpenAI servers beside tests/test_server_openai.py's three setups: one without a
reasoning parser, one serving the ``qwen`` template on the 32k tokenizer, and two simulated
two-host pairs (a ``--headless`` engine and a frontend without local engines, on loopback).

A file of their own, so that xdist's ``--dist loadfile`` runs these servers on one worker while the
three setups' servers run on the other (one file is bounded by one worker). The requests and the
readings are test_server_openai.py's own helpers, imported from it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jsonschema
import openai
import pytest
from support.readings import Reply
from test_server_openai import (
    NAME_OF,
    SCHEMAS,
    SETUPS,
    Served,
    ask,
    ask_responses,
    complete_calls,
    serving,
)

from hermes_vllm.demo.bias import call_bias
from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
from hermes_vllm.dialect import get_dialect
from hermes_vllm.formats.chat_template import chat_template
from hermes_vllm.testing import tiny_model_path

pytestmark = pytest.mark.server


def test_the_served_qwen_template_gets_reasoning_and_the_thinking_switch(tmp_path: Path) -> None:
    """vLLM hands a message's ``reasoning`` to the template as ``reasoning_content`` and passes
    ``chat_template_kwargs`` on: the served prompt is the one build_hermes_prompt writes."""
    import urllib.request

    from transformers import AutoTokenizer

    from hermes_vllm.formats.prompt import build_hermes_prompt

    d = get_dialect("qwen")
    model = tiny_model_path("mistral-v1")
    template = tmp_path / "chat_template.jinja"
    template.write_text(chat_template(d), encoding="utf-8")
    # With no description vLLM would hand the template "description": null.
    tools = [
        {"type": "function", "function": {"name": "add", "description": "a+b", "parameters": SCHEMAS["add"]}}
    ]
    call = {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    messages = [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": None, "reasoning": "Add them.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "3"},
    ]
    body = {
        "model": str(model),
        "messages": messages,
        "tools": tools,
        "add_generation_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    args = [*CPU_ARGS, "--chat-template", str(template)]
    with openai_server(model, args, CPU_ENV, log_path=tmp_path / "server.log") as url:
        request = urllib.request.Request(
            url.removesuffix("/v1") + "/tokenize",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            tokens = json.loads(response.read())["tokens"]
    messages[1]["reasoning_content"] = messages[1].pop("reasoning")
    prompt = build_hermes_prompt(None, messages, tools, dialect=d, enable_thinking=False)
    assert "<think>\nAdd them.\n</think>\n\n<tool_call>" in prompt and prompt.endswith(
        "<think>\n\n</think>\n\n"
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    assert tokens == tokenizer.encode(prompt, add_special_tokens=False)


@pytest.fixture(scope="module")
def served_without_reasoning_parser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """vLLM hands "none" requests to the tool parser only with a reasoning parser, unless asked to."""
    with serving("hermes", tmp_path_factory.mktemp("plain"), reasoning_parser=False) as served:
        yield served


def test_tool_choice_none_is_constrained_without_a_reasoning_parser(
    served_without_reasoning_parser: Served,
) -> None:
    served = served_without_reasoning_parser
    d = served.dialect

    async def replies() -> list[Reply]:
        return list(
            await asyncio.gather(
                *(ask(served, False, tool_choice="none", seed=s) for s in range(3)),
                *(ask_responses(served, False, tool_choice="none", seed=s) for s in range(3)),
                ask(served, False, tool_choice="required", seed=3),
            )
        )

    *nones, required = asyncio.run(replies())
    for reply in nones:
        assert reply.raw and d.tool_call.begin not in reply.raw
        assert reply.calls == []
    # The same bias opens calls when they are allowed: the ban is what keeps them out above.
    assert required.calls


@contextmanager
def two_hosts(tmp: Path, engine_flags: list[str]) -> Iterator[Served]:
    """A frontend with no engine of its own (``--data-parallel-size-local 0``) and a ``--headless``
    engine, each with its own temp dir and handshake directory, as on two hosts (on loopback)."""
    from support.headless import headless_engine
    from transformers import AutoTokenizer

    from hermes_vllm.demo.server import free_port
    from hermes_vllm.processor.handshake import ENV

    d = get_dialect("hermes")
    model = tiny_model_path(SETUPS[d.name][1])
    hosts = {}
    for host in ("frontend", "engine"):
        (tmp / host / "handshake").mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k != ENV}
        # CPU_ENV but with engine processes: a frontend without local engines needs them.
        env |= {**CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "TMPDIR": str(tmp / host)}
        hosts[host] = {**env, ENV: str(tmp / host / "handshake")}
    dp = ["--data-parallel-size", "1", "--data-parallel-address", "127.0.0.1"]
    dp += ["--data-parallel-rpc-port", str(free_port())]
    engine_args = [*CPU_ARGS, *dp, "--data-parallel-size-local", "1", *engine_flags]
    front_args = [*CPU_ARGS, *dp, "--data-parallel-size-local", "0", "--enable-auto-tool-choice"]
    front_args += ["--tool-call-parser", NAME_OF[d.name]]
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    log = tmp / "frontend.log"
    with (
        headless_engine(model, engine_args, hosts["engine"], tmp / "engine.log"),
        openai_server(model, front_args, hosts["frontend"], log_path=log) as url,
    ):
        bias = {str(k): v for k, v in call_bias(tokenizer, (d.name,)).items()}
        yield Served(d, str(model), url, tokenizer, bias, log, True, False, {}, d)


@pytest.fixture(scope="module")
def served_across_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with two_hosts(tmp_path_factory.mktemp("hosts"), []) as served:
        yield served


def test_a_frontend_without_local_engines_serves_constrained_requests(served_across_hosts: Served) -> None:
    """The engine's activation reaches the frontend through vLLM's collective_rpc, not a local note."""
    served = served_across_hosts
    frontend_dir = served.log.parent / "frontend" / "handshake"
    assert not list(frontend_dir.glob("v*.json")), "the frontend host must have no engine note of its own"

    async def replies() -> list[Reply]:
        return list(
            await asyncio.gather(*(ask(served, False, tool_choice="required", seed=s) for s in range(3)))
        )

    for reply in asyncio.run(replies()):
        assert reply.calls == complete_calls(reply.raw, served.dialect) and reply.calls
        for name, arguments in reply.calls:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    assert [p.name for p in frontend_dir.glob("*.json")] == [
        p.name for p in frontend_dir.glob("remote-*.json")
    ]


SPECULATIVE = (
    '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}'
)


def test_a_remote_engine_without_our_processor_gets_no_constrained_request(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The V1 runner with speculative decoding skips entry-point processors: nothing confirms."""
    with two_hosts(tmp_path_factory.mktemp("refusing"), ["--speculative-config", SPECULATIVE]) as served:

        async def requests() -> tuple[list[openai.BadRequestError], Reply]:
            refused = []
            for door in (
                # max_tokens that holds the shortest call: the refusal must be the activation's
                ask(served, False, tool_choice="required", max_tokens=64),
                ask(served, False, tool_choice="none", max_tokens=64),
                ask_responses(served, False, seed=0, tool_choice="required", max_output_tokens=64),
            ):
                with pytest.raises(openai.BadRequestError) as error:
                    await door
                refused.append(error.value)
            return refused, await ask(served, False, tools=openai.NOT_GIVEN, max_tokens=8, logit_bias=None)

        refused, plain = asyncio.run(requests())
    for error in refused:
        assert error.status_code == 400
        assert "the engine did not confirm a hermes-vllm logits processor" in str(error.message)
    assert plain.raw, "requests without constraints are still served"
