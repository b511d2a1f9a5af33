"""``tool_choice="required"`` and a named tool: the reply holds a call, complete before ``max_tokens``.

Run ``make serve`` in one terminal, then ``python examples/tool_choice.py`` in another. Prints one
JSON line per call, with the ``tool_choice`` that asked for it.
"""

import json
import os
from typing import Any

from openai import OpenAI
from openai.types.chat import ChatCompletionToolChoiceOptionParam, ChatCompletionToolParam

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("OPENAI_MODEL", "hermes-vllm-demo")
API_KEY = os.environ.get("OPENAI_API_KEY", "unused")  # vLLM checks none unless given --api-key


def function(name: str, description: str, properties: dict[str, Any]) -> ChatCompletionToolParam:
    """A function tool whose every property is required."""
    parameters: dict[str, object] = {"type": "object", "properties": properties, "required": list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    function("get_weather", "Current weather for a city.", {"city": {"type": "string"}}),
    function("get_time", "Current time in a time zone.", {"timezone": {"type": "string"}}),
]
CHOICES: list[ChatCompletionToolChoiceOptionParam] = [
    "required",  # some call, to any of the tools
    {"type": "function", "function": {"name": "get_time"}},  # a call to this tool
]


def main() -> None:
    client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
    for choice in CHOICES:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is the weather in Tokyo right now?"}],
            tools=TOOLS,
            tool_choice=choice,
            max_tokens=60,
        )
        for call in reply.choices[0].message.tool_calls or []:
            if call.type == "function":
                arguments = json.loads(call.function.arguments)
                print(json.dumps({"tool_choice": choice, "name": call.function.name, "arguments": arguments}))


if __name__ == "__main__":
    main()
