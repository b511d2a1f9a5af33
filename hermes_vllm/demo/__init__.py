"""What the plugin is for: the same requests served by vLLM's own parser and by hermes-vllm.

Each server gets the same tool-calling requests (a mix of ``tool_choice="required"`` and
``"auto"``); a reply counts as valid when the server parsed it into ``tool_calls`` and every
call's arguments validate against its tool's JSON schema (``jsonschema``). The table shows how
many were, per server, with one reply each.

Without ``--model`` it serves, on the CPU and with no logit bias, the small tool-calling model
trained here (:mod:`hermes_vllm.demo.trained_model`; trained on first use, then taken from the
cache) and asks it held-out BFCL questions, never trained on: a model that tries, and fails the
way weak models fail. A reply also counts its "right tool": every call names one of the item's
expected functions.

``--random`` serves a tiny random-weight model instead (the tests' model) on the demo's own three
tools. A random model writes garbage, which is the point: whatever valid calls it returns, a
constraint made them so. It almost never closes a JSON string, so every request favours tokens
holding ``"``, ``}`` or ``]`` (:func:`hermes_vllm.demo.bias.call_bias`), the same on every
server. Nor does it open a call by itself: ``auto`` requests also favour the call tag;
``required`` ones do not, so their call comes from the constraint and its token budget alone.
With ``--model`` (a Hugging Face id or path) it serves that model on the demo's tools with
vLLM's defaults for the platform and no bias.

Beside it, what only the demo runs (the tests and benchmarks use them too): the model recipe
(:mod:`.trained_model`), the BFCL corpus it trains on (:mod:`.bfcl`), the server launcher
(:mod:`.server`) and the random model's bias (:mod:`.bias`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hermes_vllm.testing.tiny_model import TokenizerName

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall

DEFAULT_TOKENIZER: TokenizerName = "qwen3"
TAG_BOOST = 6.0
"""How much more than a closer the call tag is favoured: enough that in 200 tokens of a
``tool_choice="auto"`` reply the tiny model opens a call (at +4 over Qwen 3's 2,195 closers one
of the demo's two ``auto`` replies opened none)."""


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS: tuple[dict[str, Any], ...] = (
    _function(
        "get_weather",
        "Current weather for a city.",
        {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        ["city", "unit"],
    ),
    _function(
        "calculate_triangle_area",
        "Area of a triangle from its base and height.",
        {
            "base": {"type": "integer", "description": "Base length"},
            "height": {"type": "integer", "description": "Height"},
            "unit": {"type": "string", "description": "Unit of length, e.g. cm"},
        },
        ["base", "height"],
    ),
    _function(
        "find_restaurants",
        "Restaurants near a place.",
        {
            "location": {"type": "string"},
            "cuisine": {"type": "string", "enum": ["italian", "japanese", "mexican", "indian"]},
            "max_price": {"type": "integer", "minimum": 1, "maximum": 4},
        },
        ["location", "cuisine"],
    ),
)
PROMPTS: tuple[str, ...] = (
    "What is the weather in Paris, in celsius?",
    "Find the area of a triangle with a base of 10 units and a height of 5 units.",
    "Find me a cheap Italian restaurant in Rome.",
    "Will it rain in Tokyo over the next 3 days? Answer in fahrenheit.",
)
EXPECTED: tuple[str, ...] = ("get_weather", "calculate_triangle_area", "find_restaurants", "get_weather")
"""The right tool of each prompt."""


@dataclass(frozen=True)
class Request:
    """One question as every server is asked it, and what judges the reply."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: str
    expected: tuple[str, ...]
    """The tool names a right reply calls (any of them, for every call)."""

    @property
    def schemas(self) -> dict[str, Any]:
        return {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}


@dataclass(frozen=True)
class Server:
    """One way of serving the model: a label for the table and the parser flags."""

    label: str
    flags: tuple[str, ...]


SERVERS: tuple[Server, ...] = (
    Server("vLLM hermes", ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")),
    Server(
        "vLLM hermes, strict parameter",
        ("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--tool-strict-level", "parameter"),
    ),
    Server(
        "hermes-vllm",
        (
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes_vllm",
            "--reasoning-parser",
            "hermes_vllm",
        ),
    ),
)
OURS = SERVERS[-1].label


@dataclass(frozen=True)
class Setup:
    """What every server is asked the same way: the model, the token limit, the logit bias by
    ``tool_choice`` (none where absent)."""

    model: str
    max_tokens: int
    bias: Mapping[str, Mapping[str, float]]
    on_cpu: bool


@dataclass(frozen=True)
class Outcome:
    """One reply, judged: ``problem`` is empty when every call parsed and validated."""

    tool_choice: str
    problem: str
    shown: str
    right_tool: bool = False
    """It holds a call and every call names one of the request's expected tools."""


def _calls(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    """The message's function calls (the demo sends no custom tools, so there are no others)."""
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    return [c for c in message.tool_calls or [] if isinstance(c, ChatCompletionMessageFunctionToolCall)]


NO_CALL = "no call parsed"


def judge(message: ChatCompletionMessage, schemas: Mapping[str, Any]) -> str:
    """Why ``message`` holds no valid call, or ``""`` when it holds at least one and all are valid."""
    import jsonschema

    calls = _calls(message)
    if not calls:
        return NO_CALL
    for call in calls:
        schema = schemas.get(call.function.name)
        if schema is None:
            return f"unknown tool {call.function.name!r}"
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError as e:
            return f"arguments not JSON ({e.msg})"
        try:
            jsonschema.validate(arguments, schema)
        except jsonschema.ValidationError as e:
            return f"schema: {e.message}"
    return ""


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _show(message: ChatCompletionMessage) -> str:
    calls = _calls(message)
    if calls:
        return " ".join(f"{c.function.name}({c.function.arguments})" for c in calls)
    return "content " + json.dumps(message.content or "", ensure_ascii=False)


def ask(client: Any, setup: Setup, request: Request) -> Outcome:
    choice_ = request.tool_choice
    reply = client.chat.completions.create(
        model=setup.model,
        messages=request.messages,
        tools=request.tools,
        tool_choice=choice_,
        max_tokens=setup.max_tokens,
        temperature=1.0,
        extra_body={"logit_bias": dict(setup.bias[choice_])} if choice_ in setup.bias else None,
    )
    choice = reply.choices[0]
    problem = judge(choice.message, request.schemas)
    if problem and choice.finish_reason == "length":
        problem += ", cut at max_tokens"
    calls = _calls(choice.message)
    right = bool(calls) and all(c.function.name in request.expected for c in calls)
    return Outcome(choice_, problem, _show(choice.message), right)


CHOICES = ("required", "required", "required", "auto")
"""Three ``required`` requests per ``auto`` one on the random model."""


def requests(count: int) -> list[Request]:
    """``count`` requests on the demo's tools cycling over its prompts, three ``required`` per ``auto``."""
    return [
        Request(
            [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            list(TOOLS),
            CHOICES[i % len(CHOICES)],
            (EXPECTED[i % len(PROMPTS)],),
        )
        for i in range(count)
    ]


HELD_OUT_CATEGORIES = (
    "simple_python",
    "multiple",
    "live_simple",
    "parallel",
    "live_multiple",
    "parallel_multiple",
)
"""The held-out BFCL categories the trained model is asked, in turn."""


def held_out_requests(count: int, max_prompt_chars: int = 4000) -> list[Request]:
    """``count`` held-out BFCL questions, categories in turn, ``required`` and ``auto`` alternating.

    Items with long tool sets are skipped (the CPU server's context is short); the choice is fixed.
    """
    from hermes_vllm.demo.trained_model import held_out_items

    pools: dict[str, list[Any]] = {c: [] for c in HELD_OUT_CATEGORIES}
    for item in held_out_items():
        if (
            item.category in pools
            and len(json.dumps(item.tools)) + len(json.dumps(item.messages)) <= max_prompt_chars
        ):
            pools[item.category].append(item)
    picked = [pools[c][i // len(pools)] for i in range(count) for c in [HELD_OUT_CATEGORIES[i % len(pools)]]]
    return [
        Request(item.messages, item.tools, ("required", "auto")[i % 2], tuple(item.expected_names))
        for i, item in enumerate(picked)
    ]


def serve_and_ask(server: Server, setup: Setup, batch: Sequence[Request]) -> list[Outcome]:
    """Start ``server``, send every request at once (the engine batches them), stop it."""
    from openai import OpenAI

    from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server

    args = (*server.flags, *(CPU_ARGS if setup.on_cpu else ()))
    started = time.monotonic()
    print(f"serving with {server.label} ...", file=sys.stderr, flush=True)
    with openai_server(setup.model, args, CPU_ENV if setup.on_cpu else None) as url:
        client = OpenAI(base_url=url, api_key="unused")
        with ThreadPoolExecutor(max_workers=len(batch)) as pool:
            outcomes = list(pool.map(lambda r: ask(client, setup, r), batch))
    print(f"  done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return outcomes


def _tally(outcomes: Sequence[Outcome], choice: str | None) -> str:
    picked = [o for o in outcomes if choice is None or o.tool_choice == choice]
    return f"{sum(not o.problem for o in picked)}/{len(picked)}"


def report(results: Mapping[str, Sequence[Outcome]]) -> str:
    """The side-by-side table and one reply per server: its first invalid one, else its shortest."""
    width = max(len(label) for label in results)
    lines = [f"{'server':<{width}}  required  auto  valid  right tool", "-" * (width + 35)]
    for label, outcomes in results.items():
        right = f"{sum(o.right_tool for o in outcomes)}/{len(outcomes)}"
        lines.append(
            f"{label:<{width}}  {_tally(outcomes, 'required'):>8}  {_tally(outcomes, 'auto'):>4}"
            f"  {_tally(outcomes, None):>5}  {right:>10}"
        )
    lines.append("")
    for label, outcomes in results.items():
        example = next((o for o in outcomes if o.problem), min(outcomes, key=lambda o: len(o.shown)))
        verdict = f"INVALID: {example.problem}" if example.problem else "valid"
        lines.append(f"{label} ({example.tool_choice}), {_clip(verdict, 90)}:")
        lines.append(f"  {_clip(example.shown, 110)}")
    return "\n".join(lines)


def _random_setup(tokenizer_name: TokenizerName, max_tokens: int, on_cpu: bool) -> Setup:
    """The tiny random model and the bias it needs to finish calls (the same on every server)."""
    from transformers import AutoTokenizer

    from hermes_vllm.demo.bias import call_bias
    from hermes_vllm.testing import tiny_model_path

    served = str(tiny_model_path(tokenizer_name))
    tokenizer = AutoTokenizer.from_pretrained(served)
    favoured = call_bias(tokenizer, tag_boost=TAG_BOOST)
    closers = call_bias(tokenizer, dialects=())
    print(
        f"tiny random-weight model, {tokenizer_name} tokenizer ({len(tokenizer)} tokens). "
        f"Logit bias, the same on every server: +{max(closers.values()):.0f} on the "
        f'{len(closers)} tokens holding " }} or ]; under auto also +{max(favoured.values()):.0f} '
        "on <tool_call> (a random model seldom opens a call); nothing toward it under required"
    )
    bias = {
        "required": {str(k): v for k, v in closers.items()},
        "auto": {str(k): v for k, v in favoured.items()},
    }
    return Setup(served, max_tokens, bias, on_cpu)


def run(
    model: str | None,
    tokenizer_name: TokenizerName,
    count: int,
    max_tokens: int,
    *,
    random_model: bool = False,
    steps: int | None = None,
) -> int:
    """Serve the requests on every server (all at once, each its own process), print the comparison.

    0 when every hermes-vllm ``required`` reply holds a schema-valid call and no reply of it
    holds an invalid one (under ``auto`` a model may rightly answer without a call).
    """
    import torch

    on_cpu = not torch.cuda.is_available()
    if random_model:
        setup, batch = _random_setup(tokenizer_name, max_tokens, on_cpu), requests(count)
    elif model is not None:
        print(f"{model}, no bias")
        setup, batch = Setup(model, max_tokens, {}, on_cpu), requests(count)
    else:
        from dataclasses import replace

        from hermes_vllm.demo.trained_model import DEFAULT_RECIPE, trained_model_path

        recipe = DEFAULT_RECIPE if steps is None else replace(DEFAULT_RECIPE, steps=steps)
        served = str(trained_model_path(recipe))
        print(
            f"model trained here ({recipe.steps} steps, recipe {recipe.digest()}), "
            "held-out BFCL items, no bias"
        )
        setup, batch = Setup(served, max_tokens, {}, on_cpu), held_out_requests(count)
    fewest, most = min(len(r.tools) for r in batch), max(len(r.tools) for r in batch)
    offered = str(most) if fewest == most else f"{fewest}-{most}"
    print(f"{len(batch)} requests per server, {offered} tools each, max_tokens {max_tokens}, temperature 1")
    # All servers at once: their start-ups (mostly importing vLLM and loading the model, one core
    # each) overlap (docs/getting-started.md has the times). The pool's threads start them, so
    # SIGTERM's handler is set here, in the main thread.
    from hermes_vllm.demo.server import stop_on_sigterm

    stop_on_sigterm()
    with ThreadPoolExecutor(max_workers=len(SERVERS)) as pool:
        per_server = list(pool.map(lambda s: serve_and_ask(s, setup, batch), SERVERS))
    results = {s.label: outcomes for s, outcomes in zip(SERVERS, per_server, strict=True)}
    print(report(results))
    ours = results[OURS]
    failed = any(o.problem and (o.tool_choice == "required" or o.problem != NO_CALL) for o in ours)
    return 1 if failed else 0


HELP = "serve the same tool-call requests with vLLM's hermes parser and with hermes-vllm, compare"
DESCRIPTION = (
    "Exit status 0 when every hermes-vllm required reply holds a schema-valid call "
    "and none holds an invalid one."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, declared once for ``python -m hermes_vllm.demo`` and ``hermes-vllm demo``."""
    from hermes_vllm.testing.tiny_model import TOKENIZER_NAMES

    parser.add_argument(
        "--model", default=None, help="HF id or path (default: train or reuse the model trained here)"
    )
    parser.add_argument(
        "--random", action="store_true", help="serve the tiny random-weight model (the tests' model) instead"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="the trained model's step count (default: the recipe's)"
    )
    parser.add_argument(
        "--tokenizer",
        choices=TOKENIZER_NAMES,
        default=DEFAULT_TOKENIZER,
        help=f"the random model's tokenizer (default {DEFAULT_TOKENIZER})",
    )
    parser.add_argument("--requests", type=int, default=8, help="requests per server (default 8)")
    parser.add_argument("--max-tokens", type=int, default=200)


def run_args(args: argparse.Namespace) -> int:
    """:func:`run` with the options :func:`add_arguments` declared."""
    return run(
        args.model, args.tokenizer, args.requests, args.max_tokens, random_model=args.random, steps=args.steps
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m hermes_vllm.demo [--model M]``, the same as ``hermes-vllm demo``."""
    parser = argparse.ArgumentParser(prog="python -m hermes_vllm.demo", description=DESCRIPTION)
    add_arguments(parser)
    return run_args(parser.parse_args(argv))
