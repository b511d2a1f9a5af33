"""Tool schemas written by real generators, each judged as its generator's client judges a call.

- LangChain (``langchain-core``): ``convert_to_openai_tool`` of a ``@tool`` function (its
  ``args_schema`` validates the call, as ``tool.invoke`` does) and of pydantic models;
- MCP (the ``mcp`` SDK): the tools a server lists (``list_tools``): a server of our own built
  with the SDK's ``MCPServer`` decorators, and the reference servers ``mcp-server-time`` and
  ``mcp-server-fetch``; a call is judged by the server's own ``validate_arguments``, what it runs
  on ``tools/call``.

Dev dependencies (``pip install -e '.[dev]'``); imported only when asked for.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

LANGCHAIN = "langchain"
MCP = "mcp"


class Stop(BaseModel):
    city: str
    nights: int = Field(default=1, ge=1, le=30)


def langchain_tools() -> list[tuple[type[BaseModel], dict[str, Any], Callable[[Any], Any]]]:
    """``(argument model, OpenAI tool, judge)`` of LangChain's own conversions."""
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from support.generated_schemas import AdoptPet, Schedule

    @tool
    def tag_post(post_id: int, tags: set[str], pinned_until: datetime.date | None = None) -> str:
        """Tag a post; the tags are a set."""
        return ""

    @tool
    def plan_route(stops: list[Stop], mode: Literal["car", "train"] = "train") -> str:
        """Plan a route through the stops."""
        return ""

    out: list[tuple[type[BaseModel], dict[str, Any], Callable[[Any], Any]]] = []
    for made in (tag_post, plan_route):
        schema = made.args_schema
        assert isinstance(schema, type) and issubclass(schema, BaseModel)
        out.append((schema, convert_to_openai_tool(made), schema.model_validate))
    for model in (AdoptPet, Schedule):
        out.append((model, convert_to_openai_tool(model), model.model_validate))
    return out


def _own_server() -> Any:
    """An MCP server of the everyday kind, built with the SDK's decorators."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("corpus")

    @server.tool(description="Book a table.")
    def book_table(
        when: datetime.datetime,
        guests: set[str],
        seats: Annotated[int, Field(ge=1, le=12)] = 2,
        area: Literal["inside", "terrace"] | None = None,
    ) -> str:
        return ""

    @server.tool(description="Send a note to a route's stops.")
    def notify_stops(stops: list[Stop], note: Annotated[str, Field(max_length=140)]) -> str:
        return ""

    return server


def mcp_tools() -> list[tuple[type[BaseModel], dict[str, Any], Callable[[Any], Any]]]:
    """``(argument model, OpenAI tool, judge)`` of each tool the servers list."""
    from mcp_server_fetch.server import create_server as fetch_server
    from mcp_server_time.server import create_server as time_server

    out: list[tuple[type[BaseModel], dict[str, Any], Callable[[Any], Any]]] = []
    for server in (_own_server(), time_server("UTC"), fetch_server()):
        for listed in asyncio.run(server.list_tools()):
            metadata = server._tool_manager.get_tool(listed.name).fn_metadata
            function = {
                "name": listed.name,
                "description": listed.description or "",
                "parameters": listed.input_schema,
            }
            out.append(
                (metadata.arg_model, {"type": "function", "function": function}, metadata.validate_arguments)
            )
    return out
