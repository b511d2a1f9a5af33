"""Serialise and parse the JSON payloads of tool calls and tool responses.

Kept free of vLLM (and of tags: a payload is what sits between the tags) so the vLLM tool
parser, the formatter and the converters all read payloads the same way.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_lone_surrogates(text: str) -> str:
    """``\\uXXXX`` for unpaired surrogates: JSON may spell them, UTF-8 cannot carry them raw.

    A model writing ``"\\udedc"`` produces a valid JSON string whose value holds a lone surrogate;
    written back raw, the text would fail to encode (an HTTP response, a stream chunk). Escaped,
    it is the same JSON value. Surrogates only occur inside JSON strings, so this is always valid.
    """
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def dump_json(value: Any) -> str:
    """The one JSON serialisation: the same text as Hugging Face's ``tojson`` filter.

    ``ensure_ascii=False`` and default separators, like the chat templates; NaN and Infinity
    are refused because they are not JSON.
    """
    return _escape_lone_surrogates(json.dumps(value, ensure_ascii=False, allow_nan=False))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_json(text: str) -> Any:
    """Strict ``json.loads``: NaN and Infinity are errors, as in :func:`dump_json`."""
    return json.loads(text, parse_constant=_refuse_constant)


def load_payload(text: str) -> Any:
    """JSON first, then a Python literal: early Hermes datasets wrote payloads with ``repr()``."""
    try:
        return loads_json(text)
    except ValueError as json_error:
        try:
            return ast.literal_eval(text.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"payload is neither JSON ({json_error}) nor a Python literal") from None


def _object_with(payload: Any, keys: tuple[str, str], what: str) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise ValueError(f"{what} payload must be an object, got {type(payload).__name__}")
    if set(payload) != set(keys):
        raise ValueError(f"{what} payload must have exactly the keys {list(keys)}, got {list(payload)}")
    if not isinstance(payload[keys[0]], str):
        raise ValueError(f"{what} {keys[0]!r} must be a string, got {type(payload[keys[0]]).__name__}")
    return payload


def _serialized_object(value: Any) -> Any:
    """The object a string holds when the whole string is one JSON object, else ``value``.

    Some models (Granite 4) write ``arguments`` already serialised, as a JSON string; decoded
    once, it is the object they meant, which vLLM's hermes parser (after 0.32) returns too. Any
    other string stays a string, and so no call."""
    if isinstance(value, str):
        try:
            decoded = loads_json(value)
        except ValueError:
            return value
        if isinstance(decoded, dict):
            return decoded
    return value


def parse_call_payload(text: str) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of a call payload, in either key order, arguments written as an object
    or as the JSON text of one; ``ValueError`` says what is wrong."""
    payload = _object_with(load_payload(text), ("name", "arguments"), "tool call")
    arguments = _serialized_object(payload["arguments"])
    if not isinstance(arguments, dict):
        raise ValueError(f"tool call 'arguments' must be an object, got {type(arguments).__name__}")
    return payload["name"], arguments


def parse_response_payload(text: str) -> tuple[str, Any]:
    """``(name, content)`` of a Hermes tool-response payload ``{"name": ..., "content": ...}``."""
    payload = _object_with(load_payload(text), ("name", "content"), "tool response")
    return payload["name"], payload["content"]
