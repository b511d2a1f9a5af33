"""The main job end to end: serve a model with the plugin and show a schema-valid tool call.

Without ``--model`` it builds the tiny random-weight model (no model hub needed) and serves it on
the CPU; a random model writes garbage, so the call it returns is valid only because the plugin
made it so. With ``--model`` (a Hugging Face id or path) it serves that model with vLLM's defaults
for the platform.
"""

from __future__ import annotations

import json
import sys
from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
        },
    },
}
PARSER_FLAGS = (
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes_vllm",
    "--reasoning-parser",
    "hermes_vllm",
)


def run(model: str | None, tool_choice: str, max_tokens: int) -> int:
    """Serve, ask for the weather in Paris, print and check the call; exit status 0 when valid."""
    import jsonschema
    import torch
    from openai import OpenAI
    from transformers import AutoTokenizer

    from hermes_vllm.testing import tiny_model_path
    from hermes_vllm.testing.bias import call_bias
    from hermes_vllm.testing.server import CPU_ARGS, CPU_ENV, openai_server

    tiny = model is None
    served = str(tiny_model_path()) if model is None else model
    on_cpu = not torch.cuda.is_available()
    args = (*PARSER_FLAGS, *(CPU_ARGS if on_cpu else ()))
    extra: dict[str, Any] = {}
    if tiny:
        tokenizer = AutoTokenizer.from_pretrained(served)
        extra["logit_bias"] = {str(k): v for k, v in call_bias(tokenizer).items()}
    print(f"serving {served} with hermes-vllm ...", file=sys.stderr, flush=True)
    with openai_server(served, args, CPU_ENV if on_cpu else None) as url:
        client: Any = OpenAI(base_url=url, api_key="unused")  # the request uses vLLM's extra fields
        reply = client.chat.completions.create(
            model=served,
            messages=[{"role": "user", "content": "What is the weather in Paris, in celsius?"}],
            tools=[WEATHER_TOOL],
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            parallel_tool_calls=False,
            temperature=1.0,
            extra_body=extra,
        )
    message = reply.choices[0].message
    calls = message.tool_calls or []
    content = message.content or ""
    shown = content if len(content) <= 80 else content[:80] + f"... ({len(content)} chars)"
    print(json.dumps({"finish_reason": reply.choices[0].finish_reason, "content": shown}, ensure_ascii=False))
    schema = WEATHER_TOOL["function"]["parameters"]
    for call in calls:
        fn = call.function
        arguments = json.loads(fn.arguments)
        jsonschema.validate(arguments, schema)
        print(
            json.dumps(
                {"tool_call": {"name": fn.name, "arguments": arguments}, "schema_valid": True},
                ensure_ascii=False,
            )
        )
    if not calls:
        print("no tool call returned", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hermes_vllm.demo [--model M]``, the same as ``hermes-vllm demo``."""
    from hermes_vllm.cli import main as cli_main

    return cli_main(["demo", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
