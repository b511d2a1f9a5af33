"""Pydantic models of a tool call and a tool response, neutral and read from the Hermes form.

Validation happens here once, so nothing downstream (prompts, datasets, the server) ever holds
a call whose name is empty or whose arguments cannot be written as JSON.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hermes_vllm.formats.payload import dump_json, parse_call_payload, parse_response_payload

_Name = Field(min_length=1, max_length=256, description="Function name, 1 to 256 characters.")


def _json_value(value: Any) -> Any:
    try:
        dump_json(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"must be JSON-serialisable ({e})") from None
    return value


class ToolCall(BaseModel):
    """A function call: ``name`` and a JSON object of ``arguments``."""

    model_config = ConfigDict(extra="forbid")

    name: str = _Name
    arguments: dict[str, Any]

    _check_arguments = field_validator("arguments")(_json_value)


class ToolResponse(BaseModel):
    """The result of a call: the function ``name`` and any JSON value as ``content``.

    ``name`` is None for a response read from a dialect whose responses are bare (Qwen's).
    """

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        min_length=1, max_length=256, description="Function name, 1 to 256 characters, or None."
    )
    content: Any

    _check_content = field_validator("content")(_json_value)


class HermesToolCall(ToolCall):
    """A call read from the Hermes form: JSON or a legacy Python literal, in either key order."""

    @classmethod
    def from_payload(cls, text: str) -> HermesToolCall:
        """Parse the text between the call tags."""
        name, arguments = parse_call_payload(text)
        return cls(name=name, arguments=arguments)


class HermesToolResponse(ToolResponse):
    """A response read from a response block: ``{"name": ..., "content": ...}`` or a bare result."""

    @classmethod
    def from_payload(cls, text: str) -> HermesToolResponse:
        """Parse the text between the response tags."""
        name, content = parse_response_payload(text)
        return cls(name=name, content=content)
