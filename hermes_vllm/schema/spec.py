"""The shapes every schema module shares: a tool as the grammar sees it, and the error type.

Every error names the tool and the schema path, like pydantic does, because the person reading it
is a client developer looking at an HTTP 400.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


JSON = Any


class ToolSchemaError(ValueError):
    """A tool definition that cannot be compiled; the message says which tool and where."""

    def __init__(self, tool: str | None, path: str, message: str) -> None:
        self.tool = tool
        self.path = path
        self.detail = message
        where = f"tool {tool!r}" if tool is not None else "tools"
        super().__init__(f"{where}: {path}: {message}" if path else f"{where}: {message}")


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the grammar sees it: a name and the JSON Schema of its arguments object."""

    name: str
    parameters: dict[str, JSON]
    description: str = ""


def pointer(path: Sequence[str | int]) -> str:
    return "/".join(str(p) for p in path)
