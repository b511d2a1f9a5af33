"""Walking a JSON Schema: its subschemas with their paths, local ``$ref`` resolution, depth."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from hermes_vllm.schema.spec import JSON

logger = logging.getLogger(__name__)


# Keywords of JSON Schema 2020-12 that constrain instances. Anything else is an unknown
# keyword, which the specification says to ignore (BFCL's "optional", vendor extensions, ...).
CONSTRAINING = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
        "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains",
        "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "prefixItems",
        "items", "contains", "additionalProperties", "properties", "patternProperties", "dependentSchemas",
        "propertyNames",
        "if", "then", "else", "allOf", "anyOf", "oneOf", "not", "unevaluatedItems", "unevaluatedProperties",
        "$ref", "$dynamicRef", "$recursiveRef", "$defs", "definitions", "$anchor", "$dynamicAnchor",
        "dependencies", "additionalItems",
    }
)  # fmt: skip


_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties")  # fmt: skip


_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")


_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def iter_subschemas(
    schema: JSON, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], dict[str, JSON]]]:
    """Every schema object inside ``schema`` (itself included) with its path."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key in _SUBSCHEMA:
        if key in schema:
            yield from iter_subschemas(schema[key], (*path, key))
    for key in _SUBSCHEMA_LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield from iter_subschemas(sub, (*path, key, i))
    for key in _SUBSCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, dict):
            for name, sub in value.items():
                yield from iter_subschemas(sub, (*path, key, name))


def depth(schema: JSON, limit: int) -> int:
    deepest = 0
    for path, _ in iter_subschemas(schema):
        deepest = max(deepest, len(path))
        if deepest > 2 * limit:
            break
    return deepest


def resolve_ref(root: JSON, ref: str) -> JSON:
    """The schema a local ``$ref`` (``#`` or a ``#/...`` JSON pointer) names inside ``root``.

    Raises ``LookupError`` when the pointer leads nowhere.
    """
    target: JSON = root
    for raw in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise LookupError(ref)
    return target


def repoint_refs(schema: JSON, base: str) -> None:
    """Prefix every local ``$ref`` into the root (``#`` and ``#/...``) with ``base``, in place."""
    for _, sub in iter_subschemas(schema):
        ref = sub.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            sub["$ref"] = base + ref[1:]
