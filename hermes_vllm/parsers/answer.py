"""A request's final answer schema, taken from vLLM's structured outputs into the turn grammar.

An agent with tools and a typed result (the OpenAI Agents SDK's ``output_type``, pydantic-ai's
native output) sends ``tools`` and a ``response_format`` JSON schema (Responses: ``text.format``)
in one request: the model either calls tools or answers in the schema. vLLM's own structured
output would apply the schema from the first token, so no call tag could be written (under
``required`` the two masks leave nothing). The tool parser therefore moves the schema into the
constraint (:func:`hermes_vllm.constraint.constraint_args`'s ``answer``), and vLLM's structured
output stands aside for the request. What the turn grammar cannot take (a regex, a choice, a
grammar, a structural tag) stays where it was, and admission refuses it by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hermes_vllm.processor.admission import STRUCTURED_KINDS

OBJECT: Mapping[str, Any] = {"type": "object"}
"""The answer schema of ``json_object``: any JSON object."""


def take_answer(request: Any) -> Mapping[str, Any] | None:
    """The answer's JSON schema, removed from ``request``'s structured outputs; ``None`` when it
    asks for none, or for one the turn grammar does not serve (left in place for admission)."""
    structured = request.extract_structured_outputs()
    if structured is None:
        return None
    kinds = [k for k in STRUCTURED_KINDS if getattr(structured, k, None) not in (None, False)]
    if kinds == ["json_object"]:
        schema: Any = OBJECT
    elif kinds == ["json"]:
        schema = structured.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError:
                return None  # vLLM refuses it with its own message
    else:
        return None
    if not isinstance(schema, Mapping):
        return None
    if hasattr(request, "response_format"):
        request.response_format = None
    elif request.text is not None:
        request.text.format = None
    request.structured_outputs = None
    return schema
