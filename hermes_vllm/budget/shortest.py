"""The shortest valid value of a JSON Schema, measured in characters or a vocabulary's tokens.

The first of the completer's two algorithms (the other, :mod:`hermes_vllm.budget.partial`, reads
a partial value): what a value needs from nothing, built from the normalised schemas the engines
compile (properties in declared order, compact JSON, no whitespace needed). A string under a
``pattern`` is finished by the regex's own automaton (:mod:`hermes_vllm.budget.pattern`);
``oneOf`` / ``allOf`` / ``not`` the rewrites left are built from each branch and checked whole.
What cannot be built raises :class:`Unknown` with the path and the reason, so admission can name it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain, islice
from itertools import count as counting
from typing import Any

import jsonschema

from hermes_vllm.budget.pattern import shortest_completion
from hermes_vllm.schema.tree import resolve_ref
from hermes_vllm.schema.unique import item_value, kept_kind

Schema = Any
Measure = Callable[[str], int]
"""How long a text is: characters (the default) or a vocabulary's tokens."""
WHITESPACE = " \t\n\r"
UNSUPPORTED = frozenset({"patternProperties"})
_CHECKED = ("oneOf", "allOf", "not")
"""Kept by the rewrites only where they could not be turned into ``anyOf`` or merged: the shortest
value is built from the rest of the schema (``oneOf``: each branch) and checked against it whole."""
MAX_DEPTH = 24
"""``$ref`` chains followed before giving up (recursive schemas)."""
_NUMBER_DIGITS = 24
"""Digits added to a number before giving up on reaching its range."""
_NUMERIC = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_EXPONENT_DIGITS = 4
"""Longest exponent whose value is built to check a bounded number: building ``10 ** n`` takes
seconds from 7 digits on and grows without bound, and a model may write an exponent's digits
for as long as it likes. Past it the completer does not know (the grammar checks the number)."""


class Unknown(Exception):
    """A schema the completer cannot complete by construction; ``path`` says where."""

    def __init__(self, reason: object, path: str = "") -> None:
        super().__init__(reason)
        self.reason = str(reason)
        self.path = path

    def under(self, step: str) -> Unknown:
        return Unknown(self.reason, step + self.path)


@dataclass(frozen=True)
class Ctx:
    """What every reading shares: the ``$ref`` root and how lengths are measured."""

    root: Schema
    measure: Measure


def compact(value: Any) -> str:
    """``value`` as the engines write JSON: no whitespace, characters unescaped."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def resolve(schema: Schema, ctx: Ctx, depth: int = 0) -> Schema:
    """``schema`` with its ``$ref`` chain followed in the reading's root (``LookupError`` where a
    pointer leads nowhere)."""
    while isinstance(schema, Mapping) and "$ref" in schema:
        if depth > MAX_DEPTH:
            raise Unknown("$ref depth")
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise Unknown(ref)
        schema, depth = resolve_ref(ctx.root, ref), depth + 1
    return schema


def types_of(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    if kind is None:
        return ["object", "array", "string", "number", "boolean", "null"]
    return [kind] if isinstance(kind, str) else list(kind)


def shortest_value(schema: Schema, ctx: Ctx, depth: int = 0) -> str:
    """The shortest compact JSON valid under ``schema``; :class:`Unknown` when not constructible."""
    if depth > MAX_DEPTH:
        raise Unknown("depth")
    schema = resolve(schema, ctx)
    if schema is True or schema == {}:
        return "0"
    if schema is False or not isinstance(schema, Mapping):
        raise Unknown("false schema")
    if UNSUPPORTED & schema.keys():
        raise Unknown(sorted(UNSUPPORTED & schema.keys())[0])
    if any(k in schema for k in _CHECKED):
        return _checked_shortest(schema, ctx, depth)
    if "const" in schema:
        return compact(schema["const"])
    if "enum" in schema:
        return min((compact(v) for v in schema["enum"]), key=ctx.measure)
    options: list[str] = []
    if "anyOf" in schema:
        for branch in schema["anyOf"]:
            with suppress(Unknown):
                options.append(shortest_value(branch, ctx, depth + 1))
        if not options:
            raise Unknown("no branch of anyOf has a shortest value")
        return min(options, key=ctx.measure)
    failure: Unknown | None = None
    for kind in types_of(schema):
        try:
            options.append(_shortest_of(kind, schema, ctx, depth))
        except Unknown as err:
            failure = failure or err
    if not options:
        raise failure or Unknown("no type")
    return min(options, key=ctx.measure)


def _checked_shortest(schema: Mapping[str, Any], ctx: Ctx, depth: int) -> str:
    """``oneOf`` / ``allOf`` / ``not`` the rewrites left: candidates built from the schema's
    other keywords and from each branch, the shortest that the whole schema accepts. The check
    runs where the schema sits in the call's root, so that a branch's ``$ref`` (pydantic's
    discriminated unions are a ``oneOf`` of them) resolves as the completer resolved it."""
    plain = {k: v for k, v in schema.items() if k not in _CHECKED}
    candidates: list[str] = []
    for branch in [*schema.get("oneOf", ()), *schema.get("allOf", ()), plain]:
        with suppress(Unknown):
            merged = dict(plain, **branch) if isinstance(branch, Mapping) and branch is not plain else plain
            candidates.append(shortest_value(merged, ctx, depth + 1))
    validator = jsonschema.Draft202012Validator(ctx.root).evolve(schema=schema)
    valid = []
    for text in candidates:
        with suppress(jsonschema.exceptions.SchemaError, jsonschema.exceptions.RefResolutionError):
            if validator.is_valid(json.loads(text)):
                valid.append(text)
    if not valid:
        raise Unknown(f"no candidate satisfies {sorted(k for k in _CHECKED if k in schema)[0]}")
    return min(valid, key=ctx.measure)


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str) -> tuple[Fraction | None, bool]:
    """One side of a number range: (bound, whether the bound itself is excluded)."""
    bound: Fraction | None = None
    strict = False
    value = schema.get(inclusive)
    if isinstance(value, int | float) and not isinstance(value, bool):
        bound = Fraction(str(value))
        strict = schema.get(exclusive) is True  # draft 4's boolean form
    other = schema.get(exclusive)
    if isinstance(other, int | float) and not isinstance(other, bool):
        limit = Fraction(str(other))
        tighter = bound is None or (limit >= bound if inclusive == "minimum" else limit <= bound)
        if tighter:
            bound, strict = limit, True
    return bound, strict


def _fits(value: Fraction, schema: Mapping[str, Any], integer: bool) -> bool:
    low, low_open = _bound(schema, "minimum", "exclusiveMinimum")
    high, high_open = _bound(schema, "maximum", "exclusiveMaximum")
    if low is not None and (value < low or (low_open and value == low)):
        return False
    if high is not None and (value > high or (high_open and value == high)):
        return False
    step = schema.get("multipleOf")
    if isinstance(step, int | float) and step > 0 and (value / Fraction(str(step))).denominator != 1:
        return False
    return not integer or value.denominator == 1


def _grid(whole: str, frac: str, dot: bool, integer: bool) -> Iterator[tuple[int, int]]:
    """Ways to extend a number's digits, fewest added characters first: (integer digits added,
    fraction digits added); a fraction needs its ``.`` too where none is written."""
    for added in range(_NUMBER_DIGITS + 1):
        if dot:
            if added or frac:
                yield 0, added
            continue
        for k in range(added + 1):
            rest = added - k
            f = 0 if rest == 0 else rest - 1
            if rest == 1 or (f and integer) or (whole == "0" and k) or (not whole and not k):
                continue
            yield k, f


def _pick(
    whole: str, frac: str, k: int, f: int, sign: int, schema: Mapping[str, Any], integer: bool
) -> str | None:
    """The first magnitude spelled ``whole`` + ``k`` digits (+ ``.`` ``frac`` + ``f`` digits)
    whose signed value the schema accepts, spelled; ``None`` if there is none."""
    digits = len(frac) + f
    step = Fraction(1, 10**digits)
    if whole:
        first = last = Fraction(int(whole) * 10**k)
        last += 10**k - 1
    else:
        first, last = Fraction(0 if k == 1 else 10 ** (k - 1)), Fraction(10**k - 1)
    if frac:
        first += int(frac) * 10**f * step
        last = first + (10**f - 1) * step
    elif f:
        last += 1 - step
    low, _ = _bound(schema, "minimum", "exclusiveMinimum")
    high, _ = _bound(schema, "maximum", "exclusiveMaximum")
    below, above = (
        (low, high) if sign > 0 else (None if high is None else -high, None if low is None else -low)
    )
    if below is not None and below > first:
        first += -((first - below) // step) * step
    if above is not None:
        last = min(last, above)
    value = first
    for _ in range(256):
        if value > last:
            return None
        if _fits(sign * value, schema, integer):
            units = int(value)
            if not digits:
                return str(units)
            return f"{units}." + str(int((value - units) / step)).zfill(digits)
        value += step
    return None


def extend_number(schema: Mapping[str, Any], written: str, integer: bool) -> str | None:
    """The shortest text that makes ``written`` (the start of a JSON number) a number the schema
    accepts: its range (inclusive or exclusive, fractional), ``multipleOf``, integer or not."""
    if any(c in written for c in "eE+"):
        fix = "0" if written[-1] in "eE+-" else ""
        if not integer and not _NUMERIC.intersection(schema):
            return fix  # every number fits: its value (10 ** exponent) is never built
        if len(written.lower().partition("e")[2].lstrip("+-0")) > _EXPONENT_DIGITS:
            return None
        try:
            value = Fraction(written + fix)
        except ValueError:
            return None
        return fix if _fits(value, schema, integer) else None
    sign = -1 if written.startswith("-") else 1
    whole, dot, frac = written.lstrip("-").partition(".")
    if not whole.isdigit() and whole:
        return None
    for k, f in _grid(whole, frac, bool(dot), integer):
        body = _pick(whole, frac, k, f, sign, schema, integer)
        if body is not None:
            full = ("-" if sign < 0 else "") + body
            if full.startswith(written):
                return full[len(written) :]
    return None


def _number(schema: Mapping[str, Any], integer: bool, ctx: Ctx) -> str:
    options = [w + e for w in ("", "-") if (e := extend_number(schema, w, integer)) is not None]
    if not options:
        raise Unknown("no number in the range")
    return min(options, key=ctx.measure)


def _shortest_of(kind: str, schema: Mapping[str, Any], ctx: Ctx, depth: int) -> str:
    if kind == "null":
        return "null"
    if kind == "boolean":
        return "true"
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer", ctx)
    if kind == "string":
        pattern = schema.get("pattern")
        if pattern is None:
            return '"' + "a" * int(schema.get("minLength", 0)) + '"'
        return '"' + pattern_suffix(schema, "") + '"'
    if kind == "array":
        prefix = list(schema.get("prefixItems", ()))
        need = int(schema.get("minItems", 0))
        distinct = kept_kind(schema)
        if distinct is not None:
            return "[" + ",".join(distinct_items(schema, ctx, frozenset(), need)) + "]"
        items = [*prefix[:need], *[schema.get("items", {})] * max(0, need - len(prefix))]
        values = []
        for n, item in enumerate(items):
            try:
                values.append(shortest_value(item, ctx, depth + 1))
            except Unknown as err:
                raise err.under(f"/items/{n}") from None
        return "[" + ",".join(values) + "]"
    if kind == "object":
        return "{" + rest_of_object(schema, ctx, Members(-1, 0, frozenset()), depth, first=True) + "}"
    raise Unknown(kind)


_DISTINCT_POOL = 64
"""Candidate items tried for an array whose items must be distinct, per item wanted."""


def _candidate_items(kind: str, min_length: int) -> Iterator[str]:
    """Items of a kept kind (:mod:`hermes_vllm.schema.unique`), shortest first."""
    if kind == "string":
        letters = "abcdefghijklmnopqrstuvwxyz0123456789"
        for length in counting(min_length):
            if length == 0:
                yield '""'
                continue
            for c in letters:
                yield compact("a" * (length - 1) + c)
    else:
        for n in counting():
            yield str(n)
            if n:
                yield str(-n)


def distinct_items(schema: Mapping[str, Any], ctx: Ctx, taken: frozenset[Any], need: int) -> list[str]:
    """``need`` shortest items of a kept ``uniqueItems`` array, distinct and unlike ``taken``."""
    kind = kept_kind(schema)
    if kind is None:
        raise Unknown("uniqueItems")
    if need <= 0:
        return []
    items = schema.get("items", {})
    pool: list[str] = []
    values = set(taken)
    for text in _candidate_items(kind, int(items.get("minLength", 0))):
        value = item_value(text)
        if value not in values:
            values.add(value)
            pool.append(text)
            if len(pool) >= need + _DISTINCT_POOL:
                break
    pool.sort(key=ctx.measure)
    return pool[:need]


def declared(schema: Mapping[str, Any]) -> list[tuple[str, Schema]]:
    return list(schema.get("properties", {}).items())


def extra_schema(schema: Mapping[str, Any]) -> Schema:
    """The schema of undeclared keys; ``False`` where none may be written.

    Left unsaid, undeclared keys are allowed only where ``properties`` is absent too (the schema
    rewrite says so there, :mod:`hermes_vllm.schema.rewrite`); the engines close an object that
    declares ``properties``, even none (``{"properties": {}}`` admits only ``{}``)."""
    return schema.get("additionalProperties", "properties" not in schema)


@dataclass(frozen=True)
class Members:
    """Where an object's reading stands: the last declared property written (its index), how
    many properties are written, and the undeclared keys among them."""

    last: int
    count: int
    free: frozenset[str]

    def add(self, index: int, key: str) -> Members:
        if index >= 0:
            return Members(max(index, self.last), self.count + 1, self.free)
        if key in self.free:  # written again: JSON keeps the last, the count of properties stays
            return self
        return Members(self.last, self.count + 1, self.free | {key})


def key_names(schema: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The schema every key of the object must satisfy (its ``propertyNames``), if any."""
    names = schema.get("propertyNames")
    return names if isinstance(names, Mapping) else None


def allowed_name(schema: Mapping[str, Any], key: str) -> bool:
    """Whether ``key`` satisfies the object's ``propertyNames``."""
    names = key_names(schema)
    return names is None or jsonschema.Draft202012Validator(names).is_valid(key)


_NAME_TRIES = 4096
"""Candidate keys tried against a ``propertyNames`` schema before giving up."""


def _plain_keys() -> Iterator[str]:
    for n in counting():
        yield "" if n == 0 else "k" + str(n - 1) if n > 26 else chr(ord("a") + n - 1)


def free_keys(schema: Mapping[str, Any], taken: frozenset[str]) -> Iterator[str]:
    """Undeclared keys not written yet, shortest first. Under ``propertyNames``: the shortest
    name its pattern or length allows, then the short ones it accepts, and :class:`Unknown`
    when none is left among the candidates tried."""
    names = key_names(schema)
    skip = set(schema.get("properties", {})) | taken
    if names is None:
        yield from (k for k in _plain_keys() if k not in skip)
        return
    check = jsonschema.Draft202012Validator(names)
    shortest = json.loads(_shortest_of("string", {**names, "type": "string"}, Ctx({}, len), 0))
    tried = (json.loads(c) for c in _candidate_items("string", 0))
    for key in islice(chain([shortest], tried), _NAME_TRIES):
        if key not in skip and check.is_valid(key):
            skip.add(key)
            yield key
    raise Unknown("propertyNames")


def member_text(key: str, value: Schema, ctx: Ctx, depth: int) -> str:
    try:
        return f"{compact(key)}:{shortest_value(value, ctx, depth + 1)}"
    except Unknown as err:
        raise err.under(f"/properties/{key}") from None


def rest_of_object(schema: Mapping[str, Any], ctx: Ctx, at: Members, depth: int, first: bool) -> str:
    """The properties an object still needs after ``at``, spelled ``"k":v`` and joined: the
    required ones after the last declared property written, and as many of the shortest others
    as ``minProperties`` asks for (declared ones in their order, undeclared ones last)."""
    required = set(schema.get("required", ()))
    props = declared(schema)
    if required - {k for k, _ in props}:
        raise Unknown("required property not declared")
    chosen = {
        n: member_text(k, v, ctx, depth) for n, (k, v) in enumerate(props) if n > at.last and k in required
    }
    missing = int(schema.get("minProperties", 0)) - at.count - len(chosen)
    free: list[str] = []
    if missing > 0:
        optional = []
        for n, (k, v) in enumerate(props):
            if n > at.last and n not in chosen:
                with suppress(Unknown):
                    optional.append((n, member_text(k, v, ctx, depth)))
        optional.sort(key=lambda o: ctx.measure(o[1]))
        chosen.update(optional[:missing])
        missing -= len(optional[:missing])
        extra = extra_schema(schema)
        if missing > 0 and extra is not False:
            keys = free_keys(schema, at.free)
            free = [
                member_text(next(keys), extra if isinstance(extra, Mapping) else {}, ctx, depth)
                for _ in range(missing)
            ]
            missing = 0
        if missing > 0:
            raise Unknown("minProperties")
    most = schema.get("maxProperties")
    if isinstance(most, int) and at.count + len(chosen) + len(free) > most:
        raise Unknown("maxProperties")
    parts = [chosen[n] for n in sorted(chosen)] + free
    text = ",".join(parts)
    return ("," + text if text and not first else text) if parts else ""


def pattern_suffix(schema: Mapping[str, Any], written: str) -> str:
    """The shortest string body (JSON-escaped) that finishes ``written`` under the schema's
    ``pattern``. A length bound beside it (only an enforced ``format`` keeps one, on llguidance)
    is checked, not searched: the pattern's shortest completion is the answer when it fits."""
    suffix = shortest_completion(schema["pattern"], written)
    if suffix is None:
        raise Unknown("pattern")
    length = len(written) + len(suffix)
    if length < schema.get("minLength", 0) or length > schema.get("maxLength", length):
        raise Unknown("pattern with a length bound")
    return compact(suffix)[1:-1]
