"""Tool calls with the plain ``openai`` client: the server parses the model's call into ``tool_calls``.

Run ``make serve`` in one terminal, then ``python examples/tools.py`` in another. Prints each call as
one JSON line; hermes-vllm guarantees that its arguments are valid for the tool's JSON schema.
"""

import json
import os

from openai import OpenAI
from openai.types.chat import ChatCompletionFunctionToolParam

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("OPENAI_MODEL", "hermes-vllm-demo")
API_KEY = os.environ.get("OPENAI_API_KEY", "unused")  # vLLM checks none unless given --api-key
QUESTION = "Find the area of a triangle with a base of 10 and height of 5."

TRIANGLE_AREA: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "calculate_triangle_area",
        "description": "Calculate the area of a triangle given its base and height.",
        "parameters": {
            "type": "object",
            "properties": {
                "base": {"type": "integer", "description": "The base of the triangle."},
                "height": {"type": "integer", "description": "The height of the triangle."},
                "unit": {"type": "string", "description": "The unit of measure."},
            },
            "required": ["base", "height"],
        },
    },
}


def main() -> None:
    client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[TRIANGLE_AREA],
    )
    message = reply.choices[0].message
    print(f"content: {message.content!r}")
    for call in message.tool_calls or []:
        if call.type == "function":
            print(json.dumps({"name": call.function.name, "arguments": json.loads(call.function.arguments)}))


if __name__ == "__main__":
    main()
