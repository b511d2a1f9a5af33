"""Streamed tool calls with the plain ``openai`` client: the call arrives in argument deltas.

Run ``make serve`` in one terminal, then ``python examples/tools_stream.py`` in another. The deltas
of each call (by ``index``) are joined; the joined arguments are valid JSON for the tool's schema.
"""

import json
import os

from openai import OpenAI
from openai.types.chat import ChatCompletionFunctionToolParam

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("OPENAI_MODEL", "hermes-vllm-demo")
API_KEY = os.environ.get("OPENAI_API_KEY", "unused")  # vLLM checks none unless given --api-key

GET_WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}


def main() -> None:
    client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris, in celsius?"}],
        tools=[GET_WEATHER],
        stream=True,
    )
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for chunk in stream:
        if not chunk.choices:
            continue  # a usage-only chunk
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.function and delta.function.name:
                names[delta.index] = delta.function.name
            if delta.function and delta.function.arguments:
                arguments[delta.index] = arguments.get(delta.index, "") + delta.function.arguments
    for index, name in sorted(names.items()):
        print(json.dumps({"name": name, "arguments": json.loads(arguments.get(index, "{}"))}))


if __name__ == "__main__":
    main()
