"""What the plugin is for: the same requests served by vLLM's own parser and by hermes-vllm.

Each server gets the same tool-calling requests (a mix of ``tool_choice="required"`` and
``"auto"``); a reply counts as valid when the server parsed it into ``tool_calls`` and every
call's arguments validate against its tool's JSON schema (``jsonschema``). The table shows how
many were, per server, with one reply each.

Without ``--model`` it builds a tiny random-weight model on Qwen 3's tokenizer (no model hub
needed) and serves it on the CPU. A random model writes garbage, which is the point: whatever
valid calls it returns, a constraint made them so. It almost never closes a JSON string, so every
request favours tokens holding ``"``, ``}`` or ``]`` (:func:`hermes_vllm.testing.bias.call_bias`),
the same on every server. Nor does it open a call by itself: ``auto`` requests also favour the
call tag; ``required`` ones do not, so their call comes from the constraint and its token budget
alone. With ``--model`` (a Hugging Face id or path) it serves that model with vLLM's defaults for
the platform and no bias.
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
SCHEMAS: Mapping[str, Any] = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


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


def _calls(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    """The message's function calls (the demo sends no custom tools, so there are no others)."""
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    return [c for c in message.tool_calls or [] if isinstance(c, ChatCompletionMessageFunctionToolCall)]


def judge(message: ChatCompletionMessage) -> str:
    """Why ``message`` holds no valid call, or ``""`` when it holds at least one and all are valid."""
    import jsonschema

    calls = _calls(message)
    if not calls:
        return "no call parsed"
    for call in calls:
        schema = SCHEMAS.get(call.function.name)
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


def ask(client: Any, setup: Setup, prompt: str, tool_choice: str) -> Outcome:
    reply = client.chat.completions.create(
        model=setup.model,
        messages=[{"role": "user", "content": prompt}],
        tools=list(TOOLS),
        tool_choice=tool_choice,
        max_tokens=setup.max_tokens,
        temperature=1.0,
        extra_body={"logit_bias": dict(setup.bias[tool_choice])} if tool_choice in setup.bias else None,
    )
    choice = reply.choices[0]
    problem = judge(choice.message)
    if problem and choice.finish_reason == "length":
        problem += ", cut at max_tokens"
    return Outcome(tool_choice, problem, _show(choice.message))


def requests(count: int) -> list[tuple[str, str]]:
    """``count`` (prompt, tool_choice) pairs cycling over the prompts, three ``required`` per ``auto``."""
    choices = ("required", "required", "required", "auto")
    return [(PROMPTS[i % len(PROMPTS)], choices[i % len(choices)]) for i in range(count)]


def serve_and_ask(server: Server, setup: Setup, batch: Sequence[tuple[str, str]]) -> list[Outcome]:
    """Start ``server``, send every request at once (the engine batches them), stop it."""
    from openai import OpenAI

    from hermes_vllm.testing.server import CPU_ARGS, CPU_ENV, openai_server

    args = (*server.flags, *(CPU_ARGS if setup.on_cpu else ()))
    started = time.monotonic()
    print(f"serving with {server.label} ...", file=sys.stderr, flush=True)
    with openai_server(setup.model, args, CPU_ENV if setup.on_cpu else None) as url:
        client = OpenAI(base_url=url, api_key="unused")
        with ThreadPoolExecutor(max_workers=len(batch)) as pool:
            outcomes = list(pool.map(lambda r: ask(client, setup, *r), batch))
    print(f"  done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return outcomes


def _tally(outcomes: Sequence[Outcome], choice: str | None) -> str:
    picked = [o for o in outcomes if choice is None or o.tool_choice == choice]
    return f"{sum(not o.problem for o in picked)}/{len(picked)}"


def report(results: Mapping[str, Sequence[Outcome]]) -> str:
    """The side-by-side table and one reply per server: its first invalid one, else its shortest."""
    width = max(len(label) for label in results)
    lines = [f"{'server':<{width}}  required  auto  valid", "-" * (width + 23)]
    for label, outcomes in results.items():
        lines.append(
            f"{label:<{width}}  {_tally(outcomes, 'required'):>8}  {_tally(outcomes, 'auto'):>4}"
            f"  {_tally(outcomes, None):>5}"
        )
    lines.append("")
    for label, outcomes in results.items():
        example = next((o for o in outcomes if o.problem), min(outcomes, key=lambda o: len(o.shown)))
        verdict = f"INVALID: {example.problem}" if example.problem else "valid"
        lines.append(f"{label} ({example.tool_choice}), {_clip(verdict, 90)}:")
        lines.append(f"  {_clip(example.shown, 110)}")
    return "\n".join(lines)


def run(model: str | None, tokenizer_name: TokenizerName, count: int, max_tokens: int) -> int:
    """Serve the requests on each server in turn, print the comparison; 0 when ours is all valid."""
    import torch
    from transformers import AutoTokenizer

    from hermes_vllm.testing import tiny_model_path
    from hermes_vllm.testing.bias import call_bias

    served = str(tiny_model_path(tokenizer_name)) if model is None else model
    bias: dict[str, dict[str, float]] = {}
    if model is None:
        tokenizer = AutoTokenizer.from_pretrained(served)
        favoured = call_bias(tokenizer, tag_boost=TAG_BOOST)
        closers = call_bias(tokenizer, dialects=())
        bias = {
            "required": {str(k): v for k, v in closers.items()},
            "auto": {str(k): v for k, v in favoured.items()},
        }
        print(
            f"tiny random-weight model, {tokenizer_name} tokenizer ({len(tokenizer)} tokens). "
            f"Logit bias, the same on every server: +{max(closers.values()):.0f} on the "
            f'{len(closers)} tokens holding " }} or ]; under auto also +{max(favoured.values()):.0f} '
            "on <tool_call> (a random model seldom opens a call); nothing toward it under required"
        )
    else:
        print(f"{model}, no bias")
    setup = Setup(served, max_tokens, bias, on_cpu=not torch.cuda.is_available())
    batch = requests(count)
    print(
        f"{len(batch)} requests per server, {len(TOOLS)} tools each, max_tokens {max_tokens}, temperature 1"
    )
    results = {s.label: serve_and_ask(s, setup, batch) for s in SERVERS}
    print(report(results))
    return 0 if all(not o.problem for o in results[OURS]) else 1


HELP = "serve the same tool-call requests with vLLM's hermes parser and with hermes-vllm, compare"
DESCRIPTION = "Exit status 0 when every hermes-vllm reply holds a schema-valid call."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, declared once for ``python -m hermes_vllm.demo`` and ``hermes-vllm demo``."""
    from hermes_vllm.testing.tiny_model import TOKENIZER_NAMES

    parser.add_argument(
        "--model", default=None, help="HF id or path (default: build and serve the tiny random model)"
    )
    parser.add_argument(
        "--tokenizer",
        choices=TOKENIZER_NAMES,
        default=DEFAULT_TOKENIZER,
        help=f"the tiny model's tokenizer (default {DEFAULT_TOKENIZER})",
    )
    parser.add_argument("--requests", type=int, default=8, help="requests per server (default 8)")
    parser.add_argument("--max-tokens", type=int, default=200)


def run_args(args: argparse.Namespace) -> int:
    """:func:`run` with the options :func:`add_arguments` declared."""
    return run(args.model, args.tokenizer, args.requests, args.max_tokens)


def main(argv: list[str] | None = None) -> int:
    """``python -m hermes_vllm.demo [--model M]``, the same as ``hermes-vllm demo``."""
    parser = argparse.ArgumentParser(prog="python -m hermes_vllm.demo", description=DESCRIPTION)
    add_arguments(parser)
    return run_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
