"""A pydantic-ai agent with a tool and a typed output.

``NativeOutput`` sends ``Area``'s JSON schema as ``response_format`` beside the tool; the model
calls the tool, pydantic-ai runs it, and the model's answer in the schema is ``result.output``. Run
``make serve`` in one terminal, then ``python examples/pydantic_ai_agent.py`` in another. Prints the
typed output as JSON.
"""

import os

from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.profiles.openai import OpenAIModelProfile
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("OPENAI_MODEL", "hermes-vllm-demo")
API_KEY = os.environ.get("OPENAI_API_KEY", "unused")  # vLLM checks none unless given --api-key
QUESTION = "Find the area of a triangle with a base of 10 and height of 5."
MAX_REQUESTS = 4


class Area(BaseModel):
    area: float


def calculate_triangle_area(base: int, height: int) -> float:
    """Calculate the area of a triangle given its base and height."""
    print(f"called calculate_triangle_area(base={base}, height={height})")
    return base * height / 2


def main() -> None:
    model = OpenAIChatModel(
        MODEL,
        provider=OpenAIProvider(base_url=BASE_URL, api_key=API_KEY),
        # A served model's name says nothing of its features: the profile says it takes a JSON schema.
        profile=OpenAIModelProfile(supports_json_schema_output=True),
    )
    agent = Agent(model, output_type=NativeOutput(Area), tools=[calculate_triangle_area])
    result = agent.run_sync(
        QUESTION,
        usage_limits=UsageLimits(request_limit=MAX_REQUESTS),
    )
    print(result.output.model_dump_json())


if __name__ == "__main__":
    main()
