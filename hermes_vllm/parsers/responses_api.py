"""What a Responses API request (``/v1/responses``) asks to constrain, in the Chat Completions shape.

Agent frameworks send tools flat (``{"type": "function", "name": ..., "parameters": ...}``),
inside namespaces, or as custom tools, and name a tool as ``{"type": "function", "name": ...}``.
The tools are taken exactly as vLLM renders them into the chat template (its own
``construct_tool_dicts``: namespaced functions flattened to ``<namespace>__<name>``, custom tools
as a one-string function), so the grammar allows the calls the model was shown, by the names
vLLM's Responses output maps back.
"""

from __future__ import annotations

from typing import Any


def responses_tools(request: Any) -> list[dict[str, Any]]:
    """The request's callable tools as Chat Completions tool definitions (built-in tools dropped)."""
    from vllm.entrypoints.openai.responses.utils import construct_tool_dicts

    return construct_tool_dicts(request.tools, "auto") or []


def _named(name: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def responses_tool_choice(tool_choice: Any) -> Any:
    """A Responses ``tool_choice`` in the Chat Completions shape.

    ``ValueError`` (HTTP 400) for a choice of a built-in tool, which no grammar of ours can call.
    """
    if tool_choice is None or isinstance(tool_choice, str):
        return tool_choice if tool_choice is not None else "auto"
    choice = tool_choice.model_dump(exclude_none=True) if hasattr(tool_choice, "model_dump") else tool_choice
    kind = choice.get("type")
    if kind in ("function", "custom"):
        return _named(choice.get("name"))
    if kind == "allowed_tools":
        tools = choice.get("tools") or []
        other = [t.get("type") for t in tools if t.get("type") not in ("function", "custom")]
        if other:
            raise ValueError(f"tool_choice.tools: hermes-vllm constrains function tools only, got {other}")
        allowed = {"mode": choice.get("mode"), "tools": [_named(t.get("name")) for t in tools]}
        return {"type": "allowed_tools", "allowed_tools": allowed}
    raise ValueError(f"tool_choice: hermes-vllm constrains function tools only, got type {kind!r}")
