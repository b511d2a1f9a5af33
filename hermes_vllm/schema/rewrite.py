"""Exact rewrites: spell out what JSON Schema leaves implicit, so engines read it as validators do.

A grammar engine reads a schema differently from a validator. Measured on xgrammar by
benchmarks/soundness.py: an object without ``properties`` and an array without ``items`` are
closed, ``properties``/``items`` in an untyped schema restrict the type to object/array while
numeric and string bounds there are ignored, keywords beside ``anyOf``, ``enum`` and ``const``
are ignored, and ``pattern`` must match the whole string. Each rewrite below is exact under JSON
Schema 2020-12 (a validator accepts the same instances before and after), so the grammar and the
post-hoc validator agree; what cannot be rewritten exactly is left for the coverage check.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import re
from collections.abc import Sequence
from contextlib import suppress
from fractions import Fraction
from typing import Any

from jsonschema import Draft202012Validator

from hermes_vllm.schema.content import json_content_patterns
from hermes_vllm.schema.formats import keep_enforced_formats
from hermes_vllm.schema.names import FREE_NAME_KEYWORDS
from hermes_vllm.schema.spec import JSON, ToolSchemaError, pointer
from hermes_vllm.schema.tree import CONSTRAINING, depth, iter_subschemas, resolve_ref
from hermes_vllm.settings import Limits

logger = logging.getLogger(__name__)


JSON_TYPES = ("array", "boolean", "null", "number", "object", "string")


# Keywords that constrain instances of one type only and pass every other type.
_TYPED = frozenset(
    {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
        "pattern", "items", "prefixItems", "minItems", "maxItems", "contains", "minContains", "maxContains",
        "uniqueItems", "properties", "required", "additionalProperties", "patternProperties", "minProperties",
        "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas",
    }
)  # fmt: skip


# Keywords whose meaning depends on a sibling: one cannot move without the others.
_COUPLED = (
    frozenset({"properties", "patternProperties", "additionalProperties"}),
    frozenset({"prefixItems", "items"}),
    frozenset({"contains", "minContains", "maxContains"}),
    frozenset({"if", "then", "else"}),
)


_UNEVALUATED = frozenset({"unevaluatedItems", "unevaluatedProperties"})


# Constraining-list entries that place or name schemas rather than constrain instances.
_PLACES = frozenset({"$defs", "definitions", "$anchor", "$dynamicAnchor"})


_ANY_TEXT = r"[\s\S]*"


def canonical_value(value: JSON) -> JSON:
    """``value`` with integral floats as integers (``1.0`` -> ``1``), recursively.

    JSON Schema compares numbers by value, and a grammar spells an integer one way only.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [canonical_value(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical_value(v) for k, v in value.items()}
    return value


def value_key(value: JSON) -> str:
    """Equal JSON values (``1`` and ``1.0``, keys in any order) give equal keys; ``true`` is not ``1``."""
    return json.dumps(canonical_value(value), sort_keys=True)


def _value_types(value: JSON) -> set[str]:
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return {"integer", "number"}
    names = {float: "number", str: "string", list: "array", dict: "object", type(None): "null"}
    return {names[type(value)]}


def declared_types(schema: JSON) -> set[str] | None:
    """The types ``schema``'s ``type`` admits (``integer`` within ``number``); None when untyped."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind is None:
        return None
    kinds = {kind} if isinstance(kind, str) else set(kind)
    return kinds | {"integer"} if "number" in kinds else kinds


def assertion_keywords(schema: dict[str, JSON]) -> list[str]:
    return [k for k in schema if k in CONSTRAINING and k not in _PLACES]


def implied(branch: JSON, key: str, value: JSON) -> bool:
    """Whether ``branch`` already says ``key: value`` (or something stricter, for ``type``)."""
    if branch is False:
        return True
    if not isinstance(branch, dict):
        return False
    if key == "type":
        mine, theirs = declared_types(branch), declared_types({"type": value})
        return mine is not None and theirs is not None and mine <= theirs
    if key == "required" and isinstance(value, list):
        return set(value) <= set(branch.get("required", []))
    return key in branch and branch[key] == value


def _mergeable(target: dict[str, JSON], extra: dict[str, JSON]) -> bool:
    """Whether adding ``extra``'s assertions to ``target`` means "both", keyword by keyword."""
    if _UNEVALUATED & (target.keys() | extra.keys()) or any(k in extra for k in (*_PLACES, "$id")):
        return False
    keys = assertion_keywords(extra)
    if any(k in target and k != "required" and not implied(target, k, extra[k]) for k in keys):
        return False  # two `required` lists merge into their union
    for group in _COUPLED:
        mine, theirs = group & target.keys(), group & set(keys)
        if mine and theirs and {k: target[k] for k in mine} != {k: extra[k] for k in theirs}:
            return False
    return True


def _merge(target: dict[str, JSON], extra: dict[str, JSON]) -> None:
    for key, value in extra.items():
        if key == "required" and isinstance(target.get(key), list) and isinstance(value, list):
            target[key] = list(dict.fromkeys([*target[key], *value]))
        elif key in CONSTRAINING and not implied(target, key, value):
            target[key] = copy.deepcopy(value)
        else:
            target.setdefault(key, copy.deepcopy(value))


def _merge_all_of(schema: JSON) -> None:
    """``allOf`` whose branches can all be merged into the parent (see :func:`_mergeable`) -> one schema."""
    for _, sub in reversed(list(iter_subschemas(schema))):
        branches = sub.get("allOf")
        if not isinstance(branches, list) or not all(isinstance(b, dict) or b is True for b in branches):
            continue
        merged = {k: v for k, v in sub.items() if k != "allOf"}
        for branch in (b for b in branches if isinstance(b, dict)):
            if not _mergeable(merged, branch):
                break
            _merge(merged, branch)
        else:
            sub.clear()
            sub.update(merged)


def _domain(branch: JSON, root: JSON) -> tuple[str, Any] | None:
    """What a branch can match at most: ``("types", {...})`` or ``("values", (...))``; None if unknown."""
    if isinstance(branch, dict) and isinstance(branch.get("$ref"), str):
        try:
            branch = resolve_ref(root, branch["$ref"])
        except LookupError:
            return None
    if branch is False:
        return ("values", ())
    if not isinstance(branch, dict):
        return None
    if "const" in branch:
        return ("values", (branch["const"],))
    if isinstance(branch.get("enum"), list):
        return ("values", tuple(branch["enum"]))
    types = declared_types(branch)
    return ("types", types) if types is not None else None


def _disjoint(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] == b[0] == "types":
        return not (a[1] & b[1])
    if a[0] == b[0] == "values":
        return not ({value_key(v) for v in a[1]} & {value_key(v) for v in b[1]})
    values, types = (a[1], b[1]) if a[0] == "values" else (b[1], a[1])
    return all(not (_value_types(v) & types) for v in values)


def _tag_values(branch: JSON, root: JSON, key: str) -> tuple[str, Any] | None:
    """What an object-only branch requires property ``key`` to be (its :func:`_domain`); None when
    the branch admits a non-object or does not require ``key``."""
    if isinstance(branch, dict) and isinstance(branch.get("$ref"), str):
        try:
            branch = resolve_ref(root, branch["$ref"])
        except LookupError:
            return None
    if not isinstance(branch, dict) or declared_types(branch) != {"object"}:
        return None
    properties = branch.get("properties")
    if key not in branch.get("required", ()) or not isinstance(properties, dict):
        return None
    domain = _domain(properties.get(key), root)
    return domain if domain is not None and domain[0] == "values" else None


def _discriminated(branches: list[JSON], root: JSON) -> bool:
    """Whether every branch is an object that requires one same property with values no other
    branch's admits: pydantic's discriminated unions (``Field(discriminator=...)``), a ``oneOf``
    of ``$ref`` s whose ``const`` tags differ, so no instance matches two branches."""
    first = branches[0] if branches else None
    if isinstance(first, dict) and isinstance(first.get("$ref"), str):
        with suppress(LookupError):
            first = resolve_ref(root, first["$ref"])
    keys = first.get("required", []) if isinstance(first, dict) else []
    for key in (k for k in keys if isinstance(k, str)):
        tags = [_tag_values(b, root, key) for b in branches]
        known = [t for t in tags if t is not None]
        if len(known) == len(tags) and all(
            _disjoint(a, b) for i, a in enumerate(known) for b in known[i + 1 :]
        ):
            return True
    return False


def _one_of_as_any_of(schema: JSON) -> None:
    """``oneOf`` whose branches cannot overlap (disjoint types or values, or a required tag
    property with disjoint values) means ``anyOf``."""
    for _, sub in iter_subschemas(schema):
        branches = sub.get("oneOf")
        if not isinstance(branches, list) or "anyOf" in sub:
            continue
        domains = [_domain(b, schema) for b in branches]
        known = [d for d in domains if d is not None]
        disjoint = len(known) == len(domains) and all(
            _disjoint(a, b) for i, a in enumerate(known) for b in known[i + 1 :]
        )
        if disjoint or _discriminated(branches, schema):
            sub["anyOf"] = sub.pop("oneOf")


def _distribute_any_of(schema: JSON) -> None:
    """Copy the assertions beside ``anyOf`` into each branch (A and (B or C) = (A and B) or (A and C)).

    Top-down, and lazily, so that copies are themselves distributed further down. A keyword that
    cannot be merged into a branch stays beside ``anyOf`` only, where the coverage check finds it.
    """
    for _, sub in iter_subschemas(schema):
        branches = sub.get("anyOf")
        if not isinstance(branches, list):
            continue
        shared = {k: sub[k] for k in assertion_keywords(sub) if k != "anyOf"}
        for i, branch in enumerate(branches):
            if branch is True:
                branches[i] = branch = {}
            if not isinstance(branch, dict) or _UNEVALUATED & branch.keys():
                continue
            for key, value in shared.items():
                group = next((g for g in _COUPLED if key in g), frozenset({key}))
                part = {k: shared[k] for k in group if k in shared}
                if not implied(branch, key, value) and _mergeable(branch, part):
                    _merge(branch, part)


def _explicit_types(schema: JSON) -> None:
    """An untyped schema with type-specific keywords gets every type spelled out.

    ``{"maximum": 3}`` passes strings; engines that see no ``type`` may infer one from the keywords
    (unsound) or drop them (imprecise). With all six types listed each keyword applies to its own.
    """
    for path, sub in iter_subschemas(schema):
        if path and "type" not in sub and "$ref" not in sub and _TYPED & sub.keys():
            sub["type"] = list(JSON_TYPES)


FINITE_MULTIPLES = 256
"""Most values a bounded ``multipleOf`` may have to be spelled out as an ``enum``."""
_RANGE = frozenset({"type", "multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


def _bounds(sub: dict[str, JSON]) -> tuple[tuple[Fraction, bool] | None, tuple[Fraction, bool] | None]:
    """The range keywords' tightest lower and upper bound, each with whether it is excluded
    (``None`` where that side is unbounded)."""
    low: tuple[Fraction, bool] | None = None
    high: tuple[Fraction, bool] | None = None
    for key, exclusive, upper in (
        ("minimum", False, False), ("exclusiveMinimum", True, False),
        ("maximum", False, True), ("exclusiveMaximum", True, True),
    ):  # fmt: skip
        value = sub.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        bound = (Fraction(str(value)), exclusive)
        if upper:
            tighter = high is None or bound[0] < high[0] or (bound[0] == high[0] and exclusive)
            high = bound if tighter else high
        else:
            tighter = low is None or bound[0] > low[0] or (bound[0] == low[0] and exclusive)
            low = bound if tighter else low
    return low, high


def _multiples(sub: dict[str, JSON], unit: Fraction) -> range | None:
    """The ``k`` whose ``k * unit`` lies in the bounded range; ``None`` where a side is open."""
    low, high = _bounds(sub)
    if low is None or high is None:
        return None
    first, last = math.ceil(low[0] / unit), math.floor(high[0] / unit)
    first += low[1] and first * unit == low[0]
    last -= high[1] and last * unit == high[0]
    return range(first, last + 1)


def _finite_multiples(schema: JSON) -> None:
    """A ``multipleOf`` in a bounded range is a finite set: an ``enum`` of its values.

    Every engine enforces an ``enum`` (xgrammar alone enforces ``multipleOf``, and only on
    integers up to a divisor of 1024). Exact for ``"type": "integer"`` with both bounds and nothing
    else beside (annotations aside), up to :data:`FINITE_MULTIPLES` values; an empty set stays as it
    is, for the satisfiability check to name. On ``"type": "number"`` (pydantic's
    ``confloat(multiple_of=0.5, ge=0, le=5)``) the values are those the client's validators accept
    too: jsonschema divides in binary floating point, so to it 0.07 is no multiple of 0.01, and
    such a value is left out (never written; the client would refuse it). Each value is written
    in its shortest spelling (``0.5``, ``2``).
    """
    for _, sub in iter_subschemas(schema):
        step = sub.get("multipleOf")
        kind = sub.get("type")
        if kind not in ("integer", "number") or not set(sub) - ANNOTATIONS <= _RANGE:
            continue
        if not isinstance(step, int | float) or isinstance(step, bool) or step <= 0:
            continue
        unit = Fraction(str(step))
        ks = _multiples(sub, unit)
        if ks is None or not 0 < len(ks) <= FINITE_MULTIPLES:
            continue
        exact = [k * unit for k in ks]
        if kind == "integer":
            values: list[int | float] = [int(v) for v in exact if v.denominator == 1]
        else:
            judge = Draft202012Validator({"multipleOf": step})
            spelled = (int(v) if v.denominator == 1 else float(v) for v in exact)
            values = [v for v in spelled if judge.is_valid(v)]
        if values:
            for key in _RANGE:
                sub.pop(key, None)
            sub["enum"] = values


UNIQUE_ARRAYS = 100
"""Most arrays of distinct members an ``enum``'s ``uniqueItems`` array may be spelled out as."""
_UNIQUE = frozenset({"type", "items", "uniqueItems", "minItems", "maxItems"})


def _unique_members(schema: JSON) -> None:
    """An array of distinct members of a small ``enum`` (pydantic's ``set[Enum]``,
    ``set[Literal[...]]``) is a finite set of arrays: an ``anyOf`` of closed tuples, one per
    ordered choice of distinct members within ``minItems``/``maxItems``.

    No engine enforces ``uniqueItems``; spelled out, every engine does. Exact where the items'
    schema (through a ``$ref`` too) is an ``enum``/``const`` with nothing beside it but ``type``
    and annotations, up to :data:`UNIQUE_ARRAYS` arrays (4 members make 65).
    """
    for _, sub in iter_subschemas(schema):
        if (
            sub.get("uniqueItems") is not True
            or sub.get("type") != "array"
            or set(sub) - ANNOTATIONS - _UNIQUE
        ):
            continue
        items = sub.get("items")
        if isinstance(items, dict) and isinstance(items.get("$ref"), str) and len(items) == 1:
            with suppress(LookupError):
                items = resolve_ref(schema, items["$ref"])
        if not isinstance(items, dict) or set(items) - ANNOTATIONS - {"type", "enum", "const"}:
            continue
        members = [items["const"]] if "const" in items else items.get("enum")
        if not isinstance(members, list):
            continue
        check = Draft202012Validator({k: v for k, v in items.items() if k not in ANNOTATIONS})
        members = list({value_key(m): m for m in members if check.is_valid(m)}.values())
        low, high = sub.get("minItems", 0), min(sub.get("maxItems", len(members)), len(members))
        if not isinstance(low, int) or not isinstance(high, int):
            continue
        counts = [math.perm(len(members), k) for k in range(low, high + 1)]
        if not 0 < sum(counts) <= UNIQUE_ARRAYS:
            continue
        tuples = [c for k in range(low, high + 1) for c in itertools.permutations(members, k)]
        for key in _UNIQUE:
            sub.pop(key, None)
        sub["anyOf"] = [structure_of(list(c), any_order=False) for c in tuples]


def _closed_tuples(schema: JSON) -> None:
    """A ``prefixItems`` tuple whose ``maxItems`` admits no item past it says ``items: false``.

    pydantic writes ``tuple[int, str]`` so (``minItems`` = ``maxItems`` = 2, no ``items``); said
    outright, engines that take only closed tuples (outlines-core) compile it. Exact: no item can
    follow the prefix anyway.
    """
    for _, sub in iter_subschemas(schema):
        prefix, most = sub.get("prefixItems"), sub.get("maxItems")
        if (
            isinstance(prefix, list)
            and isinstance(most, int)
            and most <= len(prefix)
            and sub.get("items", True) is True
        ):
            sub["items"] = False


def open_containers(schema: JSON) -> None:
    """Objects without ``properties`` admit any keys, arrays without ``items`` any items: say so.

    Both are JSON Schema defaults (and our object policy) that engines close by default. Not done
    beside ``unevaluated*``, where an explicit ``true`` would change what counts as evaluated.
    """
    for _, sub in iter_subschemas(schema):
        types = declared_types(sub) or set()
        open_keys = {"properties", "additionalProperties", "unevaluatedProperties"}
        if "object" in types and not open_keys & sub.keys():
            sub["additionalProperties"] = True
        if "array" in types and not {"items", "unevaluatedItems"} & sub.keys():
            sub["items"] = True


_NAME_KEYWORDS = frozenset({"type", "enum", "const", "pattern", "minLength", "maxLength"})
"""What a ``propertyNames`` schema may hold for :func:`_property_names` to spell it out."""
_REF_HOPS = 32


def _names_schema(root: JSON, names: JSON) -> JSON:
    """A ``propertyNames`` schema with its ``$ref`` chain followed and its annotations dropped;
    ``None`` where a reference leads nowhere or goes on too long."""
    for _ in range(_REF_HOPS):
        if not isinstance(names, dict) or not isinstance(names.get("$ref"), str):
            break
        if len(names) > 1 + len(ANNOTATIONS.intersection(names)):
            return None  # keywords beside '$ref': left for the coverage check
        try:
            names = resolve_ref(root, names["$ref"])
        except LookupError:
            return None
    else:
        return None
    if isinstance(names, dict):
        return {k: v for k, v in names.items() if k not in ANNOTATIONS}
    return names


def _allowed_names(names: JSON) -> list[str] | None:
    """The key names a ``propertyNames`` schema admits, where they are finitely many (an ``enum``
    or ``const``, or ``false``): string members only, since a key is a string (pydantic writes an
    ``IntEnum`` key's names as integers, which no key is); ``None`` otherwise."""
    if names is False:
        return []
    if not isinstance(names, dict) or not ({"enum", "const"} & names.keys()) or set(names) - _NAME_KEYWORDS:
        return None
    values = [names["const"]] if "const" in names else names["enum"]
    if not isinstance(values, list):
        return None
    check = Draft202012Validator(names)
    return [v for v in dict.fromkeys(v for v in values if isinstance(v, str)) if check.is_valid(v)]


def _property_names(schema: JSON) -> None:
    """``propertyNames`` spelled in keywords every engine reads (none enforces it as written).

    Finitely many names (pydantic's ``dict[Literal[...], V]``, ``dict[SomeEnum, V]``) make the
    object of those optional properties and no other, each holding what the object said for
    that name (its ``properties`` entry, the ``patternProperties`` it matches, else
    ``additionalProperties``): exact. A names schema of string keywords (a ``pattern``, a length,
    a ``format``: pydantic's ``dict[EmailStr, V]``) says ``"type": "string"``, exact as every key
    is a string, so that a ``format`` there is enforced like a value's; the engines serve it
    (:mod:`.names`). A name that two of the object's schemas would apply to, or any other names
    schema, is left for the coverage check, which refuses it by name.
    """
    for _, sub in list(iter_subschemas(schema)):
        if "propertyNames" not in sub:
            continue
        names = _names_schema(schema, sub["propertyNames"])
        if names is True or names == {}:
            del sub["propertyNames"]
            continue
        props, patterns = sub.get("properties", {}), sub.get("patternProperties", {})
        extra = sub.get("additionalProperties", True)
        if not isinstance(props, dict) or not isinstance(patterns, dict):
            continue
        allowed = _allowed_names(names)
        if allowed is not None:
            closed: dict[str, JSON] = {}
            for name in allowed:
                parts = [props[name]] if name in props else []
                parts += [v for k, v in patterns.items() if re.search(k, name)]
                if len(parts) > 1:
                    break
                closed[name] = parts[0] if parts else copy.deepcopy(extra)
            else:
                sub["properties"], sub["additionalProperties"] = closed, False
                sub.pop("patternProperties", None)
                del sub["propertyNames"]
            continue
        if (
            isinstance(names, dict)
            and names.get("type", "string") == "string"
            and not set(names) - FREE_NAME_KEYWORDS - {"type"}
        ):
            sub["propertyNames"] = {**names, "type": "string"}


def _declare_required(tool: str, schema: JSON) -> None:
    """Declare required-but-undeclared property names, in place.

    The declared schema is what JSON Schema applies to that key: ``additionalProperties`` (or any
    value, when a ``patternProperties`` pattern covers the name, which still applies). Our object
    policy admits no undeclared property when ``properties`` is given, and engines ignore
    ``required`` of names they do not know. Under ``additionalProperties: false`` no instance can
    satisfy such a ``required``: refused rather than silently ignored.
    """
    for path, sub in iter_subschemas(schema):
        required = sub.get("required")
        if (
            not isinstance(required, list)
            or "object" not in (declared_types(sub) or {"object"})
            or "anyOf" in sub
        ):
            continue  # beside 'anyOf', `required` went into the branches (or the coverage check flags it)
        props = sub.setdefault("properties", {})
        extra = sub.get("additionalProperties", True)
        patterns = sub.get("patternProperties", {})
        for name in (n for n in required if isinstance(n, str) and n not in props):
            if any(re.search(p, name) for p in patterns):
                props[name] = {}
            elif extra is False:
                raise ToolSchemaError(
                    tool,
                    pointer(("parameters", *path, "required")),
                    f"{name!r} is required but not declared, and additionalProperties is false: "
                    "no call can satisfy this schema",
                )
            else:
                props[name] = copy.deepcopy(extra) if isinstance(extra, dict) else {}


def _at(schema: JSON, path: Sequence[str | int]) -> JSON:
    for part in path:
        schema = schema[part]
    return schema


def _filter_values(tool: str, schema: JSON) -> set[tuple[str | int, ...]]:
    """Drop ``enum`` values that the keywords beside them reject (engines ignore those keywords).

    A ``const`` or ``enum`` left without a value admits nothing. An optional property of a closed
    object with such a schema can never be sent, so it leaves the grammar (exact under our object
    policy, where an undeclared key is refused; logged at INFO:
    tool sets in the wild write ``{"type": "boolean", "enum": ["True", "False"]}``); anywhere else
    the schema is refused. Returns the paths where every value left was checked against the
    keywords beside it: there those keywords say nothing more (see :func:`_values_as_structure`).
    """
    validator = Draft202012Validator(schema)
    empty: list[tuple[str | int, ...]] = []
    checked: set[tuple[str | int, ...]] = set()
    for path, sub in iter_subschemas(schema):
        others = {k: v for k, v in sub.items() if k not in ("enum", "const")}
        if not ({"enum", "const"} & sub.keys() and assertion_keywords(others)):
            continue
        check = validator.evolve(schema=others)
        try:
            if isinstance(sub.get("enum"), list):
                sub["enum"] = [v for v in sub["enum"] if check.is_valid(v)]
            if not sub.get("enum", True) or ("const" in sub and not check.is_valid(sub["const"])):
                empty.append(path)
            else:
                checked.add(path)
        except Exception:  # a reference jsonschema cannot follow: left to the engine and coverage check
            continue
    for path in empty:
        try:
            sub, parent = _at(schema, path), _at(schema, path[:-2])
        except (KeyError, IndexError):  # inside a property already left out
            continue
        closed = parent.get("additionalProperties", False) is False and not parent.get("patternProperties")
        if path[-2:-1] == ("properties",) and closed and path[-1] not in parent.get("required", []):
            logger.info("tool %r: %s admits no value; the property is left out", tool, pointer(path))
            del parent["properties"][path[-1]]
            continue
        keyword = "enum" if "enum" in sub else "const"
        raise ToolSchemaError(
            tool,
            pointer(("parameters", *path, keyword)),
            f"no value of {keyword!r} satisfies the keywords beside it: no call can satisfy this schema",
        )
    return checked


ANY_ORDER_KEYS = 3
"""An object inside a ``const``/``enum`` with at most this many keys admits them in every order.

JSON object equality ignores key order, but engines write an object's properties in declared
order, so each order is a branch of an ``anyOf``: 3 keys make 6. Orders grow factorially (4 keys
make 24, 8 make 40,320; on xgrammar a 4-key object already compiles several times slower than its
declared order alone (docs/architecture.md, "Measurements behind the code")), so a bigger object admits its
declared order only, as every object does under our policy (docs/architecture.md, "Policy inside calls")."""

STRUCTURE_SCHEMAS = 2_000
"""Most subschemas the spelled-out value of one ``const``/``enum`` member may have with every key
order; nested objects multiply their orders (each branch holds every order of what it holds), and
past this the member admits its declared key order only."""


def structure_of(value: JSON, any_order: bool = True) -> JSON:
    """A schema admitting exactly the values equal to ``value``, spelled out member by member.

    Equal as JSON Schema compares: ``1`` is ``1.0``, and with ``any_order`` an object's keys come
    in any order (up to :data:`ANY_ORDER_KEYS` keys; see :func:`_member_as_structure` for the
    size bound). An object has every key ``required`` and no other, an array is a closed tuple of
    exactly its length, scalars stay ``const``. Written this way an engine applies its whitespace
    policy inside the value; a container ``const`` is one literal to engines, which admit only its
    compact spelling.
    """
    if isinstance(value, dict):
        properties = {k: structure_of(v, any_order) for k, v in value.items()}
        orders = (
            itertools.permutations(value) if any_order and len(value) <= ANY_ORDER_KEYS else [tuple(value)]
        )
        branches = [_closed_object({k: copy.deepcopy(properties[k]) for k in order}) for order in orders]
        return branches[0] if len(branches) == 1 else {"anyOf": branches}
    if isinstance(value, list):
        if not value:
            return {"type": "array", "maxItems": 0}
        items = [structure_of(v, any_order) for v in value]
        return {"type": "array", "prefixItems": items, "minItems": len(value), "items": False}
    return {"const": value}


def _closed_object(properties: dict[str, JSON]) -> JSON:
    out: dict[str, JSON] = {"type": "object", "properties": properties}
    if properties:
        out["required"] = list(properties)
    out["additionalProperties"] = False
    return out


def _member_as_structure(value: JSON) -> JSON:
    """:func:`structure_of` with every key order, or in declared order where that would exceed
    :data:`STRUCTURE_SCHEMAS` subschemas."""
    spelled = structure_of(value)
    if sum(1 for _ in iter_subschemas(spelled)) > STRUCTURE_SCHEMAS:
        logger.info("a const/enum object too large for every key order keeps its declared order")
        return structure_of(value, any_order=False)
    return spelled


def _escaped(part: str | int) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")


def _values_as_structure(schema: JSON, checked: set[tuple[str | int, ...]], max_depth: int) -> None:
    """A ``const``/``enum`` holding objects or arrays -> :func:`structure_of` (an ``anyOf`` for enums).

    Only where nothing else constrains the value (no keyword beside it, or every value checked
    against them by :func:`_filter_values`, so that they are implied and dropped; the root keeps
    its ``type: object``), where no ``$ref`` points into what is replaced, and where the result
    stays within the nesting a tool may have (``max_depth``, as ``normalize_tool`` counts it);
    elsewhere the value keeps its compact spelling, which is sound.
    """
    refs = [sub["$ref"] for _, sub in iter_subschemas(schema) if isinstance(sub.get("$ref"), str)]
    for path, sub in list(iter_subschemas(schema)):
        values = [sub["const"]] if "const" in sub else sub.get("enum")
        if not isinstance(values, list) or not any(isinstance(v, (dict, list)) for v in values):
            continue
        others = [k for k in assertion_keywords(sub) if k not in ("enum", "const") and (path or k != "type")]
        if others and path not in checked:
            continue
        here = "#" + "".join(f"/{_escaped(p)}" for p in path)
        replaced = [f"{here}/{k}" for k in ("const", "enum", *others)]
        if any(r == k or r.startswith(k + "/") for r in refs for k in replaced):
            continue
        scalars = [v for v in values if not isinstance(v, (dict, list))]
        branches = [_member_as_structure(v) for v in values if isinstance(v, (dict, list))]
        branches = [{"enum": scalars}, *branches] if scalars else branches
        replacement = branches[0] if len(branches) == 1 else {"anyOf": branches}
        if len(path) + depth(replacement, max_depth) > 2 * max_depth:
            continue
        for key in ("const", "enum", *others):
            sub.pop(key, None)
        sub.update(replacement)


def search_as_full_match(pattern: str) -> str | None:
    """A regex whose whole-string match means what ``pattern`` means to JSON Schema (a search).

    Each top-level alternative gets ``[\\s\\S]*`` on the sides it does not anchor, and the whole
    is anchored, so it also means the same to a validator. None for what no rewrite can keep:
    anchors inside groups, lookaround, backreferences (engines ignore them).
    """
    alternatives: list[tuple[str, bool, bool]] = []
    body, start, depth, in_class, i = "", False, 0, False, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            if not in_class and pattern[i + 1 : i + 2] in tuple("123456789k"):
                return None
            body, i = body + pattern[i : i + 2], i + 2
            continue
        if in_class or char == "[":
            in_class = (char != "]") if in_class else True
        elif pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            return None
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char == "|" and depth == 0:
            alternatives.append((body, start, False))
            body, start, i = "", False, i + 1
            continue
        elif char == "^" and depth == 0 and not body:
            start, i = True, i + 1
            continue
        elif char == "$" and depth == 0 and pattern[i + 1 : i + 2] in ("", "|"):
            alternatives.append((body, start, True))
            if i + 1 == len(pattern):
                break
            body, start, i = "", False, i + 2
            continue
        elif char in "^$":
            return None
        body, i = body + char, i + 1
    else:
        alternatives.append((body, start, False))
    pieces = [
        ("" if s else _ANY_TEXT) + (b if s and e else f"(?:{b})") + ("" if e else _ANY_TEXT)
        for b, s, e in alternatives
    ]
    return f"^{pieces[0]}$" if len(pieces) == 1 else f"^(?:{'|'.join(pieces)})$"


def _full_match_patterns(schema: JSON) -> None:
    """``pattern`` is a search in JSON Schema and a whole-string match in grammar engines."""
    for _, sub in iter_subschemas(schema):
        pattern = sub.get("pattern")
        rewritten = search_as_full_match(pattern) if isinstance(pattern, str) else None
        if rewritten is not None:
            sub["pattern"] = rewritten


# The meta-data and content vocabularies of 2020-12: they annotate and never constrain.
ANNOTATIONS = frozenset(
    {
        "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment",
        "contentEncoding", "contentMediaType", "contentSchema",
    }
)  # fmt: skip


def _drop_annotations(schema: JSON) -> None:
    """Annotations make equal subschemas distinct to an engine, which then compiles each apart.

    Dropped, a tool set compiles faster into a smaller xgrammar grammar (docs/architecture.md,
    "Measurements behind the code").
    Kept where a ``$ref`` points into one (legal, if odd), so that every reference still resolves.
    """
    refs = [sub["$ref"] for _, sub in iter_subschemas(schema) if isinstance(sub.get("$ref"), str)]
    pointed = {part for ref in refs for part in ref.split("/")}
    for _, sub in iter_subschemas(schema):
        for key in ANNOTATIONS.intersection(sub).difference(pointed):
            del sub[key]


ROOT_DEF = "__root__"


"""Where a root schema moves (``#/$defs/__root__``) when ``#`` must keep meaning the original one."""


def object_root(schema: dict[str, JSON]) -> None:
    """Say ``"type": "object"`` at the root: arguments are an object whatever the schema admits.

    Where ``#`` refers to the root, a copy of the root as written moves to ``$defs/__root__``
    and those references follow it, so that ``#`` keeps admitting what it did. Not beside
    ``$ref``, where the engines would ignore a type (the target's type decides).
    """
    if "$ref" in schema or schema.get("type") == "object":
        return
    if any(sub.get("$ref") == "#" for _, sub in iter_subschemas(schema)):
        original = copy.deepcopy({k: v for k, v in schema.items() if k not in ("$defs", "definitions")})
        defs = schema.setdefault("$defs", {})
        name = ROOT_DEF
        while name in defs:
            name += "_"
        defs[name] = original
        for _, sub in iter_subschemas(schema):
            if sub.get("$ref") == "#":
                sub["$ref"] = f"#/$defs/{name}"
    schema["type"] = "object"


ANY_ORDER_ARGUMENTS = 4
"""Most top-level properties whose every order :func:`any_argument_order` admits (4 make 24
branches; bigger tools keep their declared order)."""
KEY_ORDERS = ("declared", "any")
"""Values of ``Limits.call_key_order``."""
_PLAIN_OBJECT = frozenset({"type", "properties", "required", "additionalProperties", "$defs", "definitions"})


def any_argument_order(schema: dict[str, JSON]) -> None:
    """Admit a tool's top-level arguments in every order (``HERMES_VLLM_CALL_KEY_ORDER=any``).

    Engines write properties in declared order; a model used to another order is forced off its
    own. Each order becomes a branch of an ``anyOf`` holding the object as it was, for closed
    plain objects of 2 to :data:`ANY_ORDER_ARGUMENTS` properties; any other root keeps its order.
    xgrammar merges subschemas that differ only in key order, so branch ``i`` also says
    ``maxProperties: n + i``, vacuous for a closed object of ``n`` properties. Exact: a validator
    ignores key order.
    """
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not 1 < len(properties) <= ANY_ORDER_ARGUMENTS:
        return
    if not set(schema) <= _PLAIN_OBJECT or schema.get("additionalProperties", False) is not False:
        return
    body = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    body["additionalProperties"] = False
    branches = [
        {
            **copy.deepcopy(body),
            "properties": {k: copy.deepcopy(properties[k]) for k in order},
            "maxProperties": len(properties) + i,
        }
        for i, order in enumerate(itertools.permutations(properties))
    ]
    for key in list(body):
        schema.pop(key, None)
    schema["type"] = "object"
    schema["anyOf"] = branches


def make_explicit(tool: str, schema: JSON, max_depth: int = Limits.max_schema_depth) -> None:
    """Apply every exact rewrite above to a tool's parameters, in place, in dependency order.

    ``max_depth`` is the tool's nesting limit (``Limits.max_schema_depth``).
    """
    json_content_patterns(schema)  # before any rewrite reaches into the content schema
    _merge_all_of(schema)
    _one_of_as_any_of(schema)
    _distribute_any_of(schema)
    _property_names(schema)
    _explicit_types(schema)
    _finite_multiples(schema)
    _unique_members(schema)
    _closed_tuples(schema)
    open_containers(schema)
    _declare_required(tool, schema)
    _values_as_structure(schema, _filter_values(tool, schema), max_depth)
    _full_match_patterns(schema)
    keep_enforced_formats(schema)
    _drop_annotations(schema)
