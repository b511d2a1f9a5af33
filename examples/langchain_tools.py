"""LangChain: a chat model with tools bound; its ``tool_calls`` come back parsed, and run the tool.

Needs ``pip install langchain-openai``. Run ``make serve`` in one terminal, then ``python
examples/langchain_tools.py`` in another. Prints each call and the tool's result as one JSON line.
"""

import json
import os

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("OPENAI_MODEL", "hermes-vllm-demo")
API_KEY = os.environ.get("OPENAI_API_KEY", "unused")  # vLLM checks none unless given --api-key
QUESTION = "Find the area of a triangle with a base of 10 and height of 5."


@tool
def calculate_triangle_area(base: int, height: int) -> float:
    """Calculate the area of a triangle given its base and height."""
    return base * height / 2


def main() -> None:
    llm = ChatOpenAI(model=MODEL, base_url=BASE_URL, api_key=SecretStr(API_KEY))
    reply = llm.bind_tools([calculate_triangle_area]).invoke(QUESTION)
    for call in reply.tool_calls:
        result = calculate_triangle_area.invoke(call)  # a ToolMessage, ready to send back
        print(json.dumps({"name": call["name"], "arguments": call["args"], "result": result.content}))


if __name__ == "__main__":
    main()
