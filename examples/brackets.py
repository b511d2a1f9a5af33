"""The bracket dialect (``[tool_call]...[/tool_call]``): a model trained on it, served with our parsers.

A model that writes its calls in brackets is served with our chat template for the dialect and the
``hermes_vllm_brackets`` parsers (``make serve DIALECT=chatml-brackets`` does both; by hand:
``hermes-vllm template --dialect chatml-brackets > brackets.jinja``, then ``vllm serve MODEL
--chat-template brackets.jinja --enable-auto-tool-choice --tool-call-parser hermes_vllm_brackets
--reasoning-parser hermes_vllm_brackets``). Clients change nothing: the calls come back in
``tool_calls``. Run ``make serve DIALECT=chatml-brackets``, then ``python examples/brackets.py``.
Prints each call as one JSON line.
"""

import json
import os

from openai import OpenAI
from openai.types.chat import ChatCompletionFunctionToolParam

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("OPENAI_MODEL", "hermes-vllm-demo")
API_KEY = os.environ.get("OPENAI_API_KEY", "unused")  # vLLM checks none unless given --api-key

CIRCLE_AREA: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "calculate_circle_area",
        "description": "Calculate the area of a circle given its radius.",
        "parameters": {
            "type": "object",
            "properties": {"radius": {"type": "number", "description": "The radius of the circle."}},
            "required": ["radius"],
        },
    },
}


def main() -> None:
    client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the area of a circle with a radius of 3?"}],
        tools=[CIRCLE_AREA],
        tool_choice="required",
    )
    for call in reply.choices[0].message.tool_calls or []:
        if call.type == "function":
            print(json.dumps({"name": call.function.name, "arguments": json.loads(call.function.arguments)}))


if __name__ == "__main__":
    main()
