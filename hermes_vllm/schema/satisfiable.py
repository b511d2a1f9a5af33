"""Whether any value can satisfy a schema: the tools no call can satisfy are left out, not refused.

A tool set in the wild may hold one tool whose schema contradicts itself (a BFCL tool declares
``"type": "array"`` with an ``enum`` of strings on a required property). No call to it can be
valid, so the grammar leaves it out and the request carries on for the other tools. The decision
must be sound: :func:`contradiction` reports a schema only where no value validates (a type,
``enum`` or ``const`` contradiction, bounds that exclude each other, a required property or item
that admits nothing, a ``not`` of everything); anything it cannot decide counts as satisfiable,
and the tool stays (the engines and the coverage check then treat it as before).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from hermes_vllm.schema.rewrite import JSON_TYPES, declared_types
from hermes_vllm.schema.spec import JSON, ToolSchemaError, pointer
from hermes_vllm.schema.tree import CONSTRAINING, iter_subschemas, resolve_ref

logger = logging.getLogger(__name__)

Path = tuple[str | int, ...]

_VISITS = 20_000
"""Subschemas read per tool before the check gives up (unsure, so satisfiable): ``$ref`` chains
may revisit the same schemas many times."""


@dataclass(frozen=True)
class Contradiction:
    """Where a schema admits no value, and why."""

    path: Path
    reason: str


class UnsatisfiableToolError(ToolSchemaError):
    """A tool whose arguments schema no value can satisfy: left out of the grammar, refused only
    where the request's ``tool_choice`` needs it (see :func:`hermes_vllm.grammar.turn.turn_spec`)."""


class _GiveUp(Exception):
    """The check read more subschemas than :data:`_VISITS`."""


def contradiction(schema: JSON) -> Contradiction | None:
    """The first contradiction that makes ``schema`` (a root with its ``$defs``) admit no value.

    None when some value validates, or when the check cannot tell.
    """
    try:
        return _Check(schema).empty(schema, (), frozenset())
    except _GiveUp:
        return None


class _Check:
    def __init__(self, root: JSON) -> None:
        self.root = root
        self.visits = 0
        self.refs_from_root = not any("$id" in sub for where, sub in iter_subschemas(root) if where)
        """Whether every local ``$ref`` means the root's pointer: a nested ``$id`` starts a resource
        that ``#`` then names instead, so there references are not followed (unsure)."""
        self._validator: Any = None

    def _valid(self, schema: JSON, value: JSON) -> bool | None:
        """jsonschema's verdict on ``value`` under ``schema`` (refs resolved in the root); None if none."""
        if self._validator is None:
            self._validator = Draft202012Validator(self.root)
        try:
            return bool(self._validator.evolve(schema=schema).is_valid(value))
        except Exception:  # a reference jsonschema cannot follow: no verdict
            return None

    def empty(self, schema: JSON, path: Path, refs: frozenset[str]) -> Contradiction | None:
        self.visits += 1
        if self.visits > _VISITS:
            raise _GiveUp
        if schema is False:
            return Contradiction(path, "the schema is false")
        if not isinstance(schema, dict):
            return None
        if "const" in schema or isinstance(schema.get("enum"), list):
            return self._values(schema, path)
        for found in self._applicators(schema, path, refs):
            if found is not None:
                return found
        return self._types(schema, path, refs)

    def _values(self, schema: dict[str, JSON], path: Path) -> Contradiction | None:
        """A finite set of candidates: empty exactly when none validates against the whole schema."""
        keyword = "const" if "const" in schema else "enum"
        values = [schema["const"]] if keyword == "const" else schema["enum"]
        verdicts = [self._valid(schema, v) for v in values]
        if all(v is False for v in verdicts):
            if not values:
                return Contradiction((*path, keyword), "an empty 'enum' admits no value")
            beside = ", ".join(repr(k) for k in schema if k in CONSTRAINING and k not in ("enum", "const"))
            return Contradiction(
                (*path, keyword), f"no value of {keyword!r} satisfies the keywords beside it ({beside})"
            )
        return None

    def _applicators(
        self, schema: dict[str, JSON], path: Path, refs: frozenset[str]
    ) -> Iterator[Contradiction | None]:
        """What ``$ref``, ``not``, ``allOf``, ``anyOf`` and ``oneOf`` say, lazily (the first found wins)."""
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref not in refs and self.refs_from_root:
            try:
                target = resolve_ref(self.root, ref)
            except LookupError:
                target = True
            inner = self.empty(target, _ref_path(ref), refs | {ref})
            yield None if inner is None else Contradiction(inner.path, f"{inner.reason} (through {ref!r})")
        if "not" in schema and _admits_everything(schema["not"]):
            yield Contradiction((*path, "not"), "'not' of a schema that admits everything")
        for i, branch in enumerate(_list(schema.get("allOf"))):
            yield self.empty(branch, (*path, "allOf", i), refs)
        for key in ("anyOf", "oneOf"):
            branches = _list(schema.get(key))
            if key in schema and all(self.empty(b, (*path, key, i), refs) for i, b in enumerate(branches)):
                yield Contradiction((*path, key), f"no branch of {key!r} admits a value")

    def _types(self, schema: dict[str, JSON], path: Path, refs: frozenset[str]) -> Contradiction | None:
        """Empty when every type the schema admits is ruled out by that type's own keywords."""
        declared = declared_types(schema)
        if declared is not None and not declared:
            return Contradiction((*path, "type"), "an empty 'type' list admits no type")
        kinds = sorted(declared if declared is not None else {*JSON_TYPES, "integer"})
        if "number" in kinds:
            kinds.remove("integer")  # integers are numbers: the number check decides both
        reasons = []
        for kind in kinds:
            found = self._kind(kind, schema, path, refs)
            if found is None:
                return None
            reasons.append(found)
        if len(reasons) == 1:
            return reasons[0]
        return Contradiction(path, "; ".join(f"{pointer(r.path) or '(root)'}: {r.reason}" for r in reasons))

    def _kind(
        self, kind: str, schema: dict[str, JSON], path: Path, refs: frozenset[str]
    ) -> Contradiction | None:
        if kind in ("number", "integer"):
            return _numbers(schema, path, kind == "integer")
        if kind == "string":
            return _bounds(schema, path, "minLength", "maxLength", "length")
        if kind == "array":
            return _bounds(schema, path, "minItems", "maxItems", "item count") or self._items(
                schema, path, refs
            )
        if kind == "object":
            return _bounds(
                schema, path, "minProperties", "maxProperties", "property count"
            ) or self._required(schema, path, refs)
        return None  # boolean, null: nothing else constrains them

    def _items(self, schema: dict[str, JSON], path: Path, refs: frozenset[str]) -> Contradiction | None:
        """An item every array must have (below ``minItems``) that admits nothing."""
        need = _int(schema.get("minItems")) or 0
        prefix = _list(schema.get("prefixItems"))
        for i in range(min(need, len(prefix))):
            found = self.empty(prefix[i], (*path, "prefixItems", i), refs)
            if found is not None:
                return Contradiction(found.path, f"{found.reason}, and minItems is {need}")
        if need > len(prefix) and "items" in schema:
            found = self.empty(schema["items"], (*path, "items"), refs)
            if found is not None:
                return Contradiction(found.path, f"{found.reason}, and minItems is {need}")
        least = _int(schema.get("minContains"))
        if "contains" in schema and (1 if least is None else least) >= 1:
            found = self.empty(schema["contains"], (*path, "contains"), refs)
            if found is not None:
                return found
        return None

    def _required(self, schema: dict[str, JSON], path: Path, refs: frozenset[str]) -> Contradiction | None:
        """A required property whose schema admits nothing, or more required names than allowed."""
        required = list(dict.fromkeys(n for n in _list(schema.get("required")) if isinstance(n, str)))
        most = _int(schema.get("maxProperties"))
        if most is not None and len(required) > most:
            return Contradiction(
                (*path, "required"), f"{len(required)} required properties, and maxProperties is {most}"
            )
        props = _dict(schema.get("properties"))
        patterns = _dict(schema.get("patternProperties"))
        for name in required:
            where: list[tuple[Path, JSON]] = [(("properties", name), props[name])] if name in props else []
            where += [(("patternProperties", p), s) for p, s in patterns.items() if _searches(p, name)]
            if not where and self.empty(schema.get("additionalProperties", True), path, refs) is not None:
                return Contradiction(
                    (*path, "required"),
                    f"{name!r} is required but not declared, and additionalProperties admits no value",
                )
            if "propertyNames" in schema and self._valid(schema["propertyNames"], name) is False:
                return Contradiction(
                    (*path, "propertyNames"), f"{name!r} is required and not an allowed name"
                )
            for part, sub in where:
                found = self.empty(sub, (*path, *part), refs)
                if found is not None:
                    return Contradiction(found.path, f"{found.reason}, and {name!r} is required")
        return None


def _ref_path(ref: str) -> Path:
    """The path inside the root that a local ``$ref`` names (checked to resolve by the caller)."""
    parts = ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in parts)


def _admits_everything(schema: JSON) -> bool:
    return schema is True or (isinstance(schema, dict) and not CONSTRAINING & schema.keys())


def _list(value: JSON) -> Sequence[JSON]:
    return value if isinstance(value, list) else ()


def _dict(value: JSON) -> dict[str, JSON]:
    return value if isinstance(value, dict) else {}


def _int(value: JSON) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: JSON) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _searches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` finds ``name``; True when Python cannot read the pattern (unsure)."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True


def _bounds(schema: dict[str, JSON], path: Path, low: str, high: str, what: str) -> Contradiction | None:
    lo, hi = _int(schema.get(low)), _int(schema.get(high))
    if lo is not None and hi is not None and lo > hi:
        return Contradiction((*path, low), f"{low} {lo} is above {high} {hi}: no {what} fits")
    return None


def _numbers(schema: dict[str, JSON], path: Path, integer: bool) -> Contradiction | None:
    """No number (or, for ``integer``, no integer) between the bounds."""
    lows = [
        (v, k == "exclusiveMinimum")
        for k in ("minimum", "exclusiveMinimum")
        if (v := _num(schema.get(k))) is not None
    ]
    highs = [
        (v, k == "exclusiveMaximum")
        for k in ("maximum", "exclusiveMaximum")
        if (v := _num(schema.get(k))) is not None
    ]
    if not lows or not highs:
        return None
    low = max(lows)  # at equal values the exclusive bound is the stricter
    high = min(highs, key=lambda b: (b[0], not b[1]))
    (a, open_a), (b, open_b) = low, high
    if integer:
        first = math.floor(a) + 1 if open_a or not a.is_integer() else int(a)
        last = math.ceil(b) - 1 if open_b or not b.is_integer() else int(b)
        empty = first > last
    else:
        empty = a > b or (a == b and (open_a or open_b))
    if not empty:
        return None
    kind = "integer" if integer else "number"
    return Contradiction(
        path, f"no {kind} lies between the bounds ({_spell(low, '>')} and {_spell(high, '<')})"
    )


def _spell(bound: tuple[float, bool], side: str) -> str:
    value, strict = bound
    return f"{side}{'' if strict else '='} {value:g}"
