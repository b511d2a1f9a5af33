"""``uniqueItems`` the processor keeps: arrays of plain strings, integers or numbers.

pydantic's ``set[str]``, ``set[int]``, ``frozenset[float]`` write an array with ``uniqueItems``
over a plain scalar. No engine enforces the keyword (a small ``enum`` of items is spelled out by
the schema rewrite instead), and no context-free grammar can say "distinct". The processor can:
the matcher follows the call and refuses a token that would close an item equal to an earlier
one (:mod:`hermes_vllm.grammar.unique`). That is always possible here, because an item of these
kinds can be made different by writing on (another character, another digit) until it is closed;
an integer ``0`` cannot go on, so it is refused as soon as it is written where ``0`` was.
Anything else under ``uniqueItems`` stays refused by coverage.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Final

from hermes_vllm.schema.spec import JSON, ToolSchemaError, ToolSpec, pointer
from hermes_vllm.schema.tree import iter_subschemas

KEPT_KINDS: Final = ("string", "integer", "number")
"""Item types whose arrays the processor keeps distinct."""
_ITEM_KEYWORDS: Final = frozenset({"type", "minLength"})
"""What may sit beside an item's type: nothing that caps how far it can be written on."""
_ARRAY_KEYWORDS: Final = frozenset({"type", "items", "uniqueItems", "minItems", "maxItems"})


def kept_kind(sub: JSON) -> str | None:
    """The item type of an array whose ``uniqueItems`` the processor keeps; ``None`` otherwise."""
    if not isinstance(sub, dict) or sub.get("uniqueItems") is not True or sub.get("type") != "array":
        return None
    if set(sub) - _ARRAY_KEYWORDS:
        return None
    items = sub.get("items")
    if not isinstance(items, dict) or set(items) - _ITEM_KEYWORDS:
        return None
    kind = items.get("type")
    if kind not in KEPT_KINDS or ("minLength" in items and kind != "string"):
        return None
    return str(kind)


def item_value(text: str) -> Any:
    """An item's value as the client compares it (``1`` and ``1.0`` are one, ``"\\u0061"`` is
    ``"a"``), from its JSON text; a text that is no value equals nothing."""
    try:
        return json.loads(text)
    except ValueError:
        return object()


def keeps_unique(schema: JSON) -> bool:
    """Whether the processor keeps some ``uniqueItems`` inside ``schema``."""
    return any(kept_kind(sub) for _, sub in iter_subschemas(schema))


def without_kept_unique(schema: JSON) -> JSON:
    """A copy of ``schema`` without the ``uniqueItems`` the processor keeps, for the engines (which
    compile the arrays; llguidance refuses the keyword outright); ``schema`` itself if it has none."""
    if not keeps_unique(schema):
        return schema
    out = copy.deepcopy(schema)
    for _, sub in iter_subschemas(out):
        if kept_kind(sub):
            del sub["uniqueItems"]
    return out


def refuse_kept_unique(spec: ToolSpec, why: str) -> None:
    """Refuse (``ToolSchemaError``, naming tool and path) a ``uniqueItems`` only the processor
    keeps, where it cannot (``why``)."""
    for path, sub in iter_subschemas(spec.parameters):
        if kept_kind(sub):
            raise ToolSchemaError(
                spec.name, "", f"'uniqueItems' at {pointer(('parameters', *path))} cannot be enforced: {why}"
            )
