"""An OpenAI Agents SDK agent with a tool and a typed output, on the SDK's defaults.

The agent sends its tool and ``Area``'s JSON schema in every request (Responses API, the SDK's
default); the model calls the tool, the SDK runs it, and the model's answer in the schema is the
run's ``final_output``. Run ``make serve`` in one terminal, then ``python examples/agents_sdk.py`` in
another. Prints the typed output as JSON.
"""

import os

from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI
from pydantic import BaseModel

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("OPENAI_MODEL", "hermes-vllm-demo")
API_KEY = os.environ.get("OPENAI_API_KEY", "unused")  # vLLM checks none unless given --api-key
QUESTION = "Find the area of a triangle with a base of 10 and height of 5."
MAX_TURNS = 4


class Area(BaseModel):
    area: float


@function_tool
def calculate_triangle_area(base: int, height: int) -> float:
    """Calculate the area of a triangle given its base and height."""
    print(f"called calculate_triangle_area(base={base}, height={height})")
    return base * height / 2


def main() -> None:
    set_default_openai_client(AsyncOpenAI(base_url=BASE_URL, api_key=API_KEY))
    set_tracing_disabled(True)  # traces go to OpenAI's platform, not to a local server
    agent = Agent(
        name="geometry",
        instructions="Use the tool, then answer.",
        model=MODEL,
        tools=[calculate_triangle_area],
        output_type=Area,
    )
    result = Runner.run_sync(agent, QUESTION, max_turns=MAX_TURNS)
    print(result.final_output_as(Area).model_dump_json())


if __name__ == "__main__":
    main()
