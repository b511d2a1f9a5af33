"""Real agent clients with tools and a typed result, on the model trained here (issues 27, 37).

An OpenAI Agents SDK agent (``Agent(tools=..., output_type=...)`` through ``Runner.run``, over Chat
Completions and over Responses), a pydantic-ai agent (a tool and ``NativeOutput``: a
``response_format`` JSON schema beside the tools) and LangChain's tool loop (``ChatOpenAI`` with
``bind_tools(tools, response_format=...)``, the binding ``langchain.agents.create_agent`` makes for a
provider-native typed answer, and ``ToolMessage`` results) run against our server on the trained model
(:mod:`hermes_vllm.demo.trained_model`, Qwen 3's template, our ``hermes_vllm_qwen`` parsers), with
no logit bias and the clients' own defaults: every turn sends the tools and the answer's schema
under ``tool_choice`` ``auto`` (none sent). On the first turn the model calls the tool (before the
turn grammar took the schema in, vLLM's structured output ran from the first token and the model
could only answer). The client runs the tool and sends its result; on that turn the model, trained
on the turns after tool results too, answers in the schema instead of calling again, and the answer
is the run's validated typed output. On the model trained on first turns only, every test here
fails: it calls the tool again after each result until the client's turn or request limit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
from hermes_vllm.demo.trained_model import trained_model_path

pytestmark = pytest.mark.server

QUESTION = "Find the area of a triangle with a base of 10 units and height of 5 units."
MAX_TOKENS = 200


class Area(BaseModel):
    """The agents' typed result."""

    area: float


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    model = trained_model_path()
    args = [*CPU_ARGS, "--enable-auto-tool-choice", "--seed", "0"]
    args += ["--tool-call-parser", "hermes_vllm_qwen", "--reasoning-parser", "hermes_vllm_qwen"]
    log = tmp_path_factory.mktemp("agents") / "server.log"
    with openai_server(model, args, CPU_ENV, log_path=log) as url:
        yield url, str(model), log


def recording_http(sent: list[dict[str, Any]]) -> httpx.AsyncClient:
    """An HTTP client that appends the JSON body of every request it sends to ``sent``."""

    async def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    return httpx.AsyncClient(event_hooks={"request": [record]}, timeout=600)


def recording_client(url: str, sent: list[dict[str, Any]]) -> AsyncOpenAI:
    """An ``openai`` client on :func:`recording_http`."""
    return AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, http_client=recording_http(sent))


def triangle_area(ran: list[tuple[int, int]]) -> Any:
    """The tool (a BFCL function the model was trained on), recording each call in ``ran``."""

    def calculate_triangle_area(base: int, height: int) -> float:
        """Calculate the area of a triangle given its base and height."""
        ran.append((base, height))
        return base * height / 2

    return calculate_triangle_area


def check_turns(sent: list[dict[str, Any]], schema_field: str, log: Path) -> None:
    """Two requests, each with the tools and the answer's schema under ``auto`` (the client's
    default): the call, then the answer; nothing ended by the processor on the server."""
    assert len(sent) == 2, sent
    assert all(body["tools"] and schema_field in json.dumps(body) for body in sent), sent
    assert all(body.get("tool_choice", "auto") == "auto" for body in sent), sent
    assert "ending a constrained request" not in log.read_text(encoding="utf-8")


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_an_agents_sdk_agent_calls_its_tool_then_returns_its_typed_output_on_the_trained_model(
    server: tuple[str, str, Path], api: str
) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    url, model_name, log = server
    set_tracing_disabled(True)
    ran: list[tuple[int, int]] = []
    sent: list[dict[str, Any]] = []

    async def play() -> Any:
        client = recording_client(url, sent)
        kind = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
        agent = Agent(
            name="geometry",
            instructions="Use the tool, then answer.",
            tools=[function_tool(triangle_area(ran))],
            output_type=Area,
            model=kind(model=model_name, openai_client=client),
            model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0.0),
        )
        return await Runner.run(agent, QUESTION, max_turns=3)

    result = asyncio.run(play())
    assert len(ran) == 1, ran
    assert isinstance(result.final_output, Area), result.final_output
    check_turns(sent, "response_format" if api == "chat" else "json_schema", log)


def test_a_pydantic_ai_agent_calls_its_tool_then_returns_its_typed_native_output_on_the_trained_model(
    server: tuple[str, str, Path],
) -> None:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.profiles.openai import OpenAIModelProfile
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.usage import UsageLimits

    url, model_name, log = server
    ran: list[tuple[int, int]] = []
    sent: list[dict[str, Any]] = []

    model = OpenAIChatModel(
        model_name,
        provider=OpenAIProvider(openai_client=recording_client(url, sent)),
        # A served model's name says nothing of its features: the profile says it takes a JSON schema.
        profile=OpenAIModelProfile(supports_json_schema_output=True),
    )
    settings: ModelSettings = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
    agent = Agent(model, output_type=NativeOutput(Area), tools=[triangle_area(ran)], model_settings=settings)
    result = agent.run_sync(QUESTION, usage_limits=UsageLimits(request_limit=3))
    assert len(ran) == 1, ran
    assert isinstance(result.output, Area), result.output
    check_turns(sent, "response_format", log)


def test_a_langchain_tool_loop_calls_its_tool_then_returns_its_typed_output_on_the_trained_model(
    server: tuple[str, str, Path],
) -> None:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    url, model_name, log = server
    ran: list[tuple[int, int]] = []
    sent: list[dict[str, Any]] = []
    area_tool = tool(triangle_area(ran))
    llm = ChatOpenAI(
        model=model_name,
        base_url=url,
        api_key=SecretStr("unused"),
        max_retries=0,
        max_tokens=MAX_TOKENS,  # type: ignore[call-arg]  # an alias of max_completion_tokens
        temperature=0.0,
        http_async_client=recording_http(sent),
    )
    bound = llm.bind_tools([area_tool], response_format=Area)

    async def play() -> AIMessage:
        """LangChain's standard loop: run each call, send its ``ToolMessage``, until an answer."""
        messages: list[BaseMessage] = [HumanMessage(QUESTION)]
        for _ in range(3):
            reply = await bound.ainvoke(messages)
            assert isinstance(reply, AIMessage), reply
            messages.append(reply)
            if not reply.tool_calls:
                return reply
            messages += [await area_tool.ainvoke(call) for call in reply.tool_calls]
        raise AssertionError(f"no answer after 3 turns: {messages}")

    answer = asyncio.run(play())
    assert len(ran) == 1, ran
    assert isinstance(answer.additional_kwargs.get("parsed"), Area), answer
    check_turns(sent, "response_format", log)
