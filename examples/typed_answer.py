"""Tools and a typed answer in one request: the model calls the tool, then answers in the schema.

``client.chat.completions.parse`` sends the tools and ``response_format`` together; each reply is
either calls (their arguments parsed into the tool's pydantic model) or the answer (parsed into
``Area``), never free text. Run ``make serve`` in one terminal, then ``python
examples/typed_answer.py`` in another. Prints the typed answer as JSON.
"""

import os

import openai
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("OPENAI_MODEL", "hermes-vllm-demo")
API_KEY = os.environ.get("OPENAI_API_KEY", "unused")  # vLLM checks none unless given --api-key
QUESTION = "Find the area of a triangle with a base of 10 and height of 5."
MAX_TURNS = 4


class TriangleArea(BaseModel):
    """Calculate the area of a triangle given its base and height."""

    base: int
    height: int


class Area(BaseModel):
    area: float


def main() -> None:
    client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
    tools = [openai.pydantic_function_tool(TriangleArea, name="calculate_triangle_area")]
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.parse(
            model=MODEL, messages=messages, tools=tools, response_format=Area
        )
        message = reply.choices[0].message
        if message.parsed is not None:
            print(message.parsed.model_dump_json())
            return
        calls = [c for c in message.tool_calls or [] if c.type == "function"]
        messages.append(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in calls
                ],
            }
        )
        for call in calls:
            triangle = call.function.parsed_arguments
            assert isinstance(triangle, TriangleArea)
            print(f"called {call.function.name}(base={triangle.base}, height={triangle.height})")
            area = triangle.base * triangle.height / 2
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(area)})
    raise SystemExit(f"no answer after {MAX_TURNS} turns")


if __name__ == "__main__":
    main()
