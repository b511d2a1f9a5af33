"""The shortest valid completion of a (partial) tool call, read against the turn's schemas.

What the token budgets need (see :mod:`hermes_vllm.processor.core`): the reserve a ``required``
turn keeps for its call is the shortest call from nothing, and a call that ``max_tokens`` would
cut is steered to the shortest completion of what it has written. Both are read here from the
normalised schemas the engines compile (properties in declared order, compact JSON, no
whitespace needed), by a small backtracking reader of the partial JSON: every way the text so far
can be read under the schema (``anyOf`` branches, tools, key orders) is followed, and the
shortest text that completes one of them wins; a string under a ``pattern`` is finished by the
regex's own automaton (:mod:`hermes_vllm.grammar.pattern`). Keywords it cannot satisfy by
construction (``allOf``, ``oneOf``, ``not``, ...) make it answer ``None``: the caller then does
not steer.
The processor checks every token it forces against the engine's mask, so a wrong answer here can
cost a call but never let an invalid one through.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from fractions import Fraction
from itertools import count as counting
from typing import Any

import jsonschema

from hermes_vllm.dialect import Dialect
from hermes_vllm.grammar.pattern import shortest_completion
from hermes_vllm.memo import TextKeyed
from hermes_vllm.schema.formats import formats_as_patterns

Schema = Any
Measure = Callable[[str], int]
"""How long a text is: characters (the default) or a vocabulary's tokens."""
_WS = " \t\n\r"
_UNSUPPORTED = frozenset({"patternProperties"})
_CHECKED = ("oneOf", "allOf", "not")
"""Kept by the rewrites only where they could not be turned into ``anyOf`` or merged: the shortest
value is built from the rest of the schema (``oneOf``: each branch) and checked against it whole."""
_DEPTH = 24
"""``$ref`` chains followed before giving up (recursive schemas)."""
_NUMBER_DIGITS = 24
"""Digits added to a number before giving up on reaching its range."""
_NUMERIC = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_EXPONENT_DIGITS = 4
"""Longest exponent whose value is built to check a bounded number: building ``10 ** n`` takes
seconds from 7 digits on and grows without bound, and a model may write an exponent's digits
for as long as it likes. Past it the completer does not know (the grammar checks the number)."""


class _Unknown(Exception):
    """A schema the completer cannot complete by construction; ``path`` says where."""

    def __init__(self, reason: object, path: str = "") -> None:
        super().__init__(reason)
        self.reason = str(reason)
        self.path = path

    def under(self, step: str) -> _Unknown:
        return _Unknown(self.reason, step + self.path)


@dataclass(frozen=True)
class _Ctx:
    """What every reading shares: the ``$ref`` root and how lengths are measured."""

    root: Schema
    measure: Measure


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _resolve(schema: Schema, ctx: _Ctx, depth: int = 0) -> Schema:
    while isinstance(schema, Mapping) and "$ref" in schema:
        if depth > _DEPTH:
            raise _Unknown("$ref depth")
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _Unknown(ref)
        target = ctx.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            target = target[int(part)] if isinstance(target, list) else target[part]
        schema, depth = target, depth + 1
    return schema


def _types(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    if kind is None:
        return ["object", "array", "string", "number", "boolean", "null"]
    return [kind] if isinstance(kind, str) else list(kind)


def _shortest(schema: Schema, ctx: _Ctx, depth: int = 0) -> str:
    """The shortest compact JSON valid under ``schema``; :class:`_Unknown` when not constructible."""
    if depth > _DEPTH:
        raise _Unknown("depth")
    schema = _resolve(schema, ctx)
    if schema is True or schema == {}:
        return "0"
    if schema is False or not isinstance(schema, Mapping):
        raise _Unknown("false schema")
    if _UNSUPPORTED & schema.keys():
        raise _Unknown(sorted(_UNSUPPORTED & schema.keys())[0])
    if any(k in schema for k in _CHECKED):
        return _checked_shortest(schema, ctx, depth)
    if "const" in schema:
        return _dumps(schema["const"])
    if "enum" in schema:
        return min((_dumps(v) for v in schema["enum"]), key=ctx.measure)
    options: list[str] = []
    if "anyOf" in schema:
        for branch in schema["anyOf"]:
            with suppress(_Unknown):
                options.append(_shortest(branch, ctx, depth + 1))
        if not options:
            raise _Unknown("no branch of anyOf has a shortest value")
        return min(options, key=ctx.measure)
    failure: _Unknown | None = None
    for kind in _types(schema):
        try:
            options.append(_shortest_of(kind, schema, ctx, depth))
        except _Unknown as err:
            failure = failure or err
    if not options:
        raise failure or _Unknown("no type")
    return min(options, key=ctx.measure)


def _checked_shortest(schema: Mapping[str, Any], ctx: _Ctx, depth: int) -> str:
    """``oneOf`` / ``allOf`` / ``not`` the rewrites left: candidates built from the schema's
    other keywords and from each branch, the shortest that the whole schema accepts. The check
    runs where the schema sits in the call's root, so that a branch's ``$ref`` (pydantic's
    discriminated unions are a ``oneOf`` of them) resolves as the completer resolved it."""
    plain = {k: v for k, v in schema.items() if k not in _CHECKED}
    candidates: list[str] = []
    for branch in [*schema.get("oneOf", ()), *schema.get("allOf", ()), plain]:
        with suppress(_Unknown):
            merged = dict(plain, **branch) if isinstance(branch, Mapping) and branch is not plain else plain
            candidates.append(_shortest(merged, ctx, depth + 1))
    validator = jsonschema.Draft202012Validator(ctx.root).evolve(schema=schema)
    valid = []
    for text in candidates:
        with suppress(jsonschema.exceptions.SchemaError, jsonschema.exceptions.RefResolutionError):
            if validator.is_valid(json.loads(text)):
                valid.append(text)
    if not valid:
        raise _Unknown(f"no candidate satisfies {sorted(k for k in _CHECKED if k in schema)[0]}")
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


def _extend_number(schema: Mapping[str, Any], written: str, integer: bool) -> str | None:
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


def _number(schema: Mapping[str, Any], integer: bool, ctx: _Ctx) -> str:
    options = [w + e for w in ("", "-") if (e := _extend_number(schema, w, integer)) is not None]
    if not options:
        raise _Unknown("no number in the range")
    return min(options, key=ctx.measure)


def _shortest_of(kind: str, schema: Mapping[str, Any], ctx: _Ctx, depth: int) -> str:
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
        return '"' + _pattern_suffix(schema, "") + '"'
    if kind == "array":
        prefix = list(schema.get("prefixItems", ()))
        need = int(schema.get("minItems", 0))
        items = [*prefix[:need], *[schema.get("items", {})] * max(0, need - len(prefix))]
        values = []
        for n, item in enumerate(items):
            try:
                values.append(_shortest(item, ctx, depth + 1))
            except _Unknown as err:
                raise err.under(f"/items/{n}") from None
        return "[" + ",".join(values) + "]"
    if kind == "object":
        return "{" + _rest_of_object(schema, ctx, _Members(-1, 0, frozenset()), depth, first=True) + "}"
    raise _Unknown(kind)


def _properties(schema: Mapping[str, Any]) -> list[tuple[str, Schema]]:
    return list(schema.get("properties", {}).items())


def _extra(schema: Mapping[str, Any]) -> Schema:
    """The schema of undeclared keys; ``False`` where none may be written.

    Left unsaid, undeclared keys are allowed only where ``properties`` is absent too (the schema
    rewrite says so there, :mod:`hermes_vllm.schema.rewrite`); the engines close an object that
    declares ``properties``, even none (``{"properties": {}}`` admits only ``{}``)."""
    return schema.get("additionalProperties", "properties" not in schema)


@dataclass(frozen=True)
class _Members:
    """Where an object's reading stands: the last declared property written (its index), how
    many properties are written, and the undeclared keys among them."""

    last: int
    count: int
    free: frozenset[str]

    def add(self, index: int, key: str) -> _Members:
        if index >= 0:
            return _Members(max(index, self.last), self.count + 1, self.free)
        if key in self.free:  # written again: JSON keeps the last, the count of properties stays
            return self
        return _Members(self.last, self.count + 1, self.free | {key})


def _free_keys(schema: Mapping[str, Any], taken: frozenset[str]) -> Iterator[str]:
    """Undeclared keys not written yet, shortest first."""
    declared = set(schema.get("properties", {}))
    for n in counting():
        key = "" if n == 0 else "k" + str(n - 1) if n > 26 else chr(ord("a") + n - 1)
        if key not in declared and key not in taken:
            yield key


def _member(key: str, value: Schema, ctx: _Ctx, depth: int) -> str:
    try:
        return f"{_dumps(key)}:{_shortest(value, ctx, depth + 1)}"
    except _Unknown as err:
        raise err.under(f"/properties/{key}") from None


def _rest_of_object(schema: Mapping[str, Any], ctx: _Ctx, at: _Members, depth: int, first: bool) -> str:
    """The properties an object still needs after ``at``, spelled ``"k":v`` and joined: the
    required ones after the last declared property written, and as many of the shortest others
    as ``minProperties`` asks for (declared ones in their order, undeclared ones last)."""
    required = set(schema.get("required", ()))
    props = _properties(schema)
    if required - {k for k, _ in props}:
        raise _Unknown("required property not declared")
    chosen = {n: _member(k, v, ctx, depth) for n, (k, v) in enumerate(props) if n > at.last and k in required}
    missing = int(schema.get("minProperties", 0)) - at.count - len(chosen)
    free: list[str] = []
    if missing > 0:
        optional = []
        for n, (k, v) in enumerate(props):
            if n > at.last and n not in chosen:
                with suppress(_Unknown):
                    optional.append((n, _member(k, v, ctx, depth)))
        optional.sort(key=lambda o: ctx.measure(o[1]))
        chosen.update(optional[:missing])
        missing -= len(optional[:missing])
        extra = _extra(schema)
        if missing > 0 and extra is not False:
            keys = _free_keys(schema, at.free)
            free = [
                _member(next(keys), extra if isinstance(extra, Mapping) else {}, ctx, depth)
                for _ in range(missing)
            ]
            missing = 0
        if missing > 0:
            raise _Unknown("minProperties")
    most = schema.get("maxProperties")
    if isinstance(most, int) and at.count + len(chosen) + len(free) > most:
        raise _Unknown("maxProperties")
    parts = [chosen[n] for n in sorted(chosen)] + free
    text = ",".join(parts)
    return ("," + text if text and not first else text) if parts else ""


@dataclass(frozen=True)
class _Done:
    end: int


@dataclass(frozen=True)
class _Open:
    suffix: str
    """What the value still needs, the text having ended inside it."""


_Read = _Done | _Open


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _read(schema: Schema, ctx: _Ctx, text: str, i: int, depth: int = 0) -> Iterator[_Read]:
    """Every reading of a value starting at ``text[i]`` (whitespace before it skipped)."""
    if depth > _DEPTH:
        return
    i = _skip_ws(text, i)
    try:
        schema = _resolve(schema, ctx)
    except (_Unknown, KeyError, IndexError, TypeError):
        return
    if i == len(text):
        with suppress(_Unknown):
            yield _Open(_shortest(schema, ctx, depth))
        return
    if schema is True or schema == {}:
        schema = {}
    if (
        not isinstance(schema, Mapping)
        or _UNSUPPORTED & schema.keys()
        or "allOf" in schema
        or "not" in schema
    ):
        return
    if "const" in schema or "enum" in schema:
        yield from _read_literal([_dumps(v) for v in schema.get("enum", [schema.get("const")])], text, i)
        return
    branches = schema.get("anyOf", schema.get("oneOf"))
    if branches is not None:
        for branch in branches:
            yield from _read(branch, ctx, text, i, depth + 1)
        return
    kinds = _types(schema)
    ch = text[i]
    if ch == "{" and "object" in kinds:
        yield from _ObjectReader(schema, ctx, text, depth).member(_Members(-1, 0, frozenset()), i + 1, True)
    elif ch == "[" and "array" in kinds:
        yield from _read_array(schema, ctx, text, i + 1, depth)
    elif ch == '"' and "string" in kinds:
        if "pattern" in schema:
            yield from _read_pattern_string(schema, text, i + 1)
        else:
            yield from _read_string(text, i + 1, int(schema.get("minLength", 0)))
    elif (ch == "-" or ch.isdigit()) and ({"number", "integer"} & set(kinds)):
        yield from _read_number(schema, text, i, "number" not in kinds)
    else:
        words = [w for w, k in (("true", "boolean"), ("false", "boolean"), ("null", "null")) if k in kinds]
        yield from _read_literal(words, text, i)


def _read_literal(spellings: Sequence[str], text: str, i: int) -> Iterator[_Read]:
    rest = text[i:]
    for word in spellings:
        if rest.startswith(word):
            yield _Done(i + len(word))
        elif word.startswith(rest):
            yield _Open(word[len(rest) :])


def _read_string(text: str, i: int, min_length: int) -> Iterator[_Read]:
    """A string body from ``text[i]`` (after its opening quote)."""
    count = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if count >= min_length:
                yield _Done(i + 1)
            return
        if ch == "\\":
            escape = text[i + 1 : i + 6]
            if not escape:
                yield _Open("n" + "a" * max(0, min_length - count - 1) + '"')
                return
            if escape[0] == "u":
                hex_digits = escape[1:]
                if len(hex_digits) < 4:
                    if i + 1 + len(escape) == len(text):
                        yield _Open("0" * (4 - len(hex_digits)) + "a" * max(0, min_length - count - 1) + '"')
                    return
                i += 6
            else:
                i += 2
        else:
            i += 1
        count += 1
    yield _Open("a" * max(0, min_length - count) + '"')


def _pattern_suffix(schema: Mapping[str, Any], written: str) -> str:
    """The shortest string body (JSON-escaped) that finishes ``written`` under the schema's
    ``pattern``. A length bound beside it (only an enforced ``format`` keeps one, on llguidance)
    is checked, not searched: the pattern's shortest completion is the answer when it fits."""
    suffix = shortest_completion(schema["pattern"], written)
    if suffix is None:
        raise _Unknown("pattern")
    length = len(written) + len(suffix)
    if length < schema.get("minLength", 0) or length > schema.get("maxLength", length):
        raise _Unknown("pattern with a length bound")
    return _dumps(suffix)[1:-1]


_ESCAPES = '"\\/bfnrt'
"""What may follow a backslash in a JSON string."""


def _open_escape(body: str) -> int:
    """Where an escape the string body ends inside begins; ``len(body)`` if it ends outside one."""
    j = 0
    while j < len(body):
        if body[j] != "\\":
            j += 1
        elif j + 1 == len(body) or (body[j + 1] == "u" and j + 6 > len(body)):
            return j
        else:
            j += 6 if body[j + 1] == "u" else 2
    return len(body)


def _read_pattern_string(schema: Mapping[str, Any], text: str, i: int) -> Iterator[_Read]:
    """A string body under ``pattern`` from ``text[i]``: a closed one was checked by the grammar;
    an open one is finished by the pattern's automaton, read from its decoded characters (the
    text may end inside an escape: each way to finish that escape is tried)."""
    for r in _read_string(text, i, 0):
        if isinstance(r, _Done):
            yield r
            continue
        body = text[i:]
        escape = body[_open_escape(body) :]
        if not escape:
            endings = [""]
        elif escape == "\\":
            endings = list(_ESCAPES)
        else:
            endings = ["0" * (6 - len(escape))]
        best: str | None = None
        for ending in endings:
            with suppress(_Unknown, ValueError):
                written = json.loads('"' + body + ending + '"')
                candidate = ending + _pattern_suffix(schema, written) + '"'
                if best is None or len(candidate) < len(best):
                    best = candidate
        if best is not None:
            yield _Open(best)


def _read_number(schema: Mapping[str, Any], text: str, i: int, integer: bool) -> Iterator[_Read]:
    j = i
    while j < len(text) and text[j] in "+-0123456789.eE":
        j += 1
    if j < len(text):  # the number ended: the grammar checked it
        yield _Done(j)
        return
    # The text ends inside the number: it may go on (even from below the range) or end here.
    rest = _extend_number(schema, text[i:j], integer)
    if rest is not None:
        yield _Open(rest)


def _read_array(schema: Mapping[str, Any], ctx: _Ctx, text: str, i: int, depth: int) -> Iterator[_Read]:
    prefix = list(schema.get("prefixItems", ()))
    items = schema.get("items", {})
    need = int(schema.get("minItems", 0))

    def item(n: int) -> Schema:
        return prefix[n] if n < len(prefix) else items

    def close(count: int) -> str:
        more = [_shortest(item(n), ctx, depth + 1) for n in range(count, need)]
        return "".join("," + m if count or k else m for k, m in enumerate(more)) + "]"

    def after(count: int, j: int) -> Iterator[_Read]:
        j = _skip_ws(text, j)
        if j == len(text):
            with suppress(_Unknown):
                yield _Open(close(count))
        elif text[j] == "]":
            if count >= need:
                yield _Done(j + 1)
        elif text[j] == ",":
            yield from value(count, j + 1)

    def value(count: int, j: int) -> Iterator[_Read]:
        for r in _read(item(count), ctx, text, j, depth + 1):
            if isinstance(r, _Done):
                yield from after(count + 1, r.end)
            else:
                with suppress(_Unknown):
                    yield _Open(r.suffix + close(count + 1))

    j = _skip_ws(text, i)
    if j < len(text) and text[j] == "]":
        if need == 0:
            yield _Done(j + 1)
        return
    if j == len(text):
        with suppress(_Unknown):
            yield _Open(close(0))
        return
    yield from value(0, j)


class _ObjectReader:
    """Every reading of an object's members from some point of the text on: which declared
    properties may come next (in declared order, none required skipped), undeclared keys where
    the schema allows them, and the count ``minProperties`` / ``maxProperties`` bound."""

    def __init__(self, schema: Mapping[str, Any], ctx: _Ctx, text: str, depth: int) -> None:
        self.schema = schema
        self.ctx = ctx
        self.text = text
        self.depth = depth
        self.props = _properties(schema)
        self.index = {k: n for n, (k, _) in enumerate(self.props)}
        self.required = set(schema.get("required", ()))
        extra = _extra(schema)
        self.extra: Schema = False if extra is False else extra if isinstance(extra, Mapping) else {}
        most = schema.get("maxProperties")
        self.most = most if isinstance(most, int) else None

    def rest(self, at: _Members, first: bool = False) -> str:
        return _rest_of_object(self.schema, self.ctx, at, self.depth, first) + "}"

    def skips_required(self, last: int, n: int) -> bool:
        return any(k in self.required for k, _ in self.props[last + 1 : n])

    def may_end(self, at: _Members) -> bool:
        return not self.skips_required(at.last, len(self.props)) and at.count >= int(
            self.schema.get("minProperties", 0)
        )

    def shortest(self, schema: Schema) -> str:
        return _shortest(schema, self.ctx, self.depth + 1)

    def key_choices(self, at: _Members) -> Iterator[tuple[str, Schema, _Members]]:
        """(key spelling, value schema, reading after it) of the keys that may come next."""
        if self.most is not None and at.count >= self.most:
            return
        for n, (k, v) in enumerate(self.props):
            if n > at.last and not self.skips_required(at.last, n):
                yield _dumps(k), v, at.add(n, k)
        if self.extra is not False:
            key = next(_free_keys(self.schema, at.free))
            yield _dumps(key), self.extra, at.add(-1, key)

    def member(self, at: _Members, j: int, first: bool) -> Iterator[_Read]:
        """A member (or, ``first``, the closing brace) from ``text[j]``."""
        text = self.text
        j = _skip_ws(text, j)
        if j == len(text):
            if first and self.may_end(at):
                yield _Open("}")
            for spelling, value_schema, after in self.key_choices(at):
                with suppress(_Unknown):
                    yield _Open(f"{spelling}:{self.shortest(value_schema)}{self.rest(after)}")
            return
        if first and text[j] == "}":
            if self.may_end(at):
                yield _Done(j + 1)
            return
        if text[j] == '"':
            for key_read in _read_string(text, j + 1, 0):
                if isinstance(key_read, _Open):
                    yield from self.open_key(at, j, key_read.suffix)
                else:
                    yield from self.after_key(at, j, key_read.end)

    def open_key(self, at: _Members, j: int, closing: str) -> Iterator[_Read]:
        """The text ends inside a key begun at ``text[j]``: a declared key it begins, or (where
        allowed) the undeclared key it is when closed there."""
        written = self.text[j:]
        choices = [(s, v, after) for s, v, after in self.key_choices(at) if s.startswith(written)]
        with suppress(ValueError):
            key = json.loads(written + closing)
            free = self.extra is not False and key not in self.index
            if free and (key in at.free or self.most is None or at.count < self.most):
                choices.append((written + closing, self.extra, at.add(-1, key)))
        for spelling, value_schema, after in choices:
            with suppress(_Unknown):
                yield _Open(f"{spelling[len(written) :]}:{self.shortest(value_schema)}{self.rest(after)}")

    def after_key(self, at: _Members, j: int, end: int) -> Iterator[_Read]:
        """A whole key ``text[j:end]``: its value, then what follows it."""
        text = self.text
        try:
            key = json.loads(text[j:end])
        except ValueError:
            return
        n = self.index.get(key, -1)
        if n >= 0 and (n <= at.last or self.skips_required(at.last, n)):
            return
        # An undeclared key may come again: the engines' grammars do not track which were written
        # (a weak model repeats keys in a free-form object), and JSON keeps the last value.
        if n < 0 and self.extra is False:
            return
        if self.most is not None and at.count >= self.most and key not in at.free:
            return
        value_schema = self.props[n][1] if n >= 0 else self.extra
        after = at.add(n, key)
        k = _skip_ws(text, end)
        if k == len(text):
            with suppress(_Unknown):
                yield _Open(":" + self.shortest(value_schema) + self.rest(after))
            return
        if text[k] != ":":
            return
        for r in _read(value_schema, self.ctx, text, k + 1, self.depth + 1):
            if isinstance(r, _Done):
                yield from self.after_value(after, r.end)
            else:
                with suppress(_Unknown):
                    yield _Open(r.suffix + self.rest(after))

    def after_value(self, at: _Members, j: int) -> Iterator[_Read]:
        text = self.text
        j = _skip_ws(text, j)
        if j == len(text):
            with suppress(_Unknown):
                yield _Open(self.rest(at))
        elif text[j] == "}":
            if self.may_end(at):
                yield _Done(j + 1)
        elif text[j] == ",":
            yield from self.member(at, j + 1, False)


def _envelopes(dialect: Dialect, tools: Sequence[tuple[str, Schema]]) -> list[tuple[Schema, Schema]]:
    """(call schema, $ref root) per tool and key order: the call is an object of two keys."""
    orders = ("name_first", "arguments_first") if dialect.key_order == "either" else (dialect.key_order,)
    out = []
    for name, parameters in tools:
        for order in orders:
            keys = [("name", {"const": name}), ("arguments", {"$ref": "#/arguments"})]
            if order == "arguments_first":
                keys.reverse()
            schema: dict[str, Any] = {"type": "object", "properties": dict(keys)}
            schema.update(required=["name", "arguments"], additionalProperties=False)
            out.append((schema, {"arguments": parameters}))
    return out


def _root_ref_fix(parameters: Schema) -> Schema:
    """Tool schemas refer to their own root as ``#``: rebase those pointers under ``#/arguments``."""
    if isinstance(parameters, Mapping):
        fixed = {k: _root_ref_fix(v) for k, v in parameters.items()}
        ref = fixed.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            fixed["$ref"] = "#/arguments" + ref[1:]
        return fixed
    if isinstance(parameters, list):
        return [_root_ref_fix(v) for v in parameters]
    return parameters


_CACHED_CHARS = 1 << 20
"""Call text a :class:`CallCompleter` keeps completions for (by text and measure), in all."""

_STEP_SLACK = 6
"""What one token can add inside a string or a number beyond the units :func:`_units` counts:
a begun ``\\u`` escape's digits, a split character's continuation bytes."""


def _units(schema: Schema, ctx: _Ctx, depth: int, seen: set[int]) -> Iterator[str]:
    """Texts one token may commit a call to at once, anywhere under ``schema``: an optional
    property with its shortest value, one more array item, a longer ``anyOf`` branch or enum
    value, a number pushed towards its range."""
    if depth > _DEPTH:
        return
    with suppress(_Unknown, KeyError, IndexError, TypeError):
        schema = _resolve(schema, ctx)
    if not isinstance(schema, Mapping) or id(schema) in seen:
        return
    seen.add(id(schema))
    for value in schema.get("enum", ()):
        yield _dumps(value)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for branch in schema.get(key, ()):
            with suppress(_Unknown):
                yield "," + _shortest(branch, ctx, depth + 1)
            yield from _units(branch, ctx, depth + 1, seen)
    for key, value in _properties(schema):
        with suppress(_Unknown):
            yield "," + _member(key, value, ctx, depth)
        yield from _units(value, ctx, depth + 1, seen)
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            with suppress(_Unknown):
                yield ',"":' + _shortest(sub, ctx, depth + 1)
            yield from _units(sub, ctx, depth + 1, seen)
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        if isinstance(schema.get(key), int | float):
            yield "-" + str(schema[key]) * 2
    if "pattern" in schema:
        with suppress(_Unknown):
            yield _pattern_suffix(schema, "") * 2


class CallCompleter:
    """Shortest completions of one turn's calls (its tools, its dialect); engine- and vLLM-free."""

    def __init__(self, dialect: Dialect, tools: Sequence[tuple[str, Schema]]) -> None:
        self.dialect = dialect
        self.tools = [(n, formats_as_patterns(_root_ref_fix(p))) for n, p in tools]
        self._envelopes = _envelopes(dialect, self.tools)
        self._completions: TextKeyed[tuple[str, Measure], str | None] = TextKeyed(_CACHED_CHARS)

    def complete(self, call: str, measure: Measure = len) -> str | None:
        """The shortest text (by ``measure``) that makes ``call`` (the text from the call's
        opening tag on, which may itself be partly written) a complete call ending with its
        closing tag; ``None`` when no reading is known.

        Kept per ``(call, measure)``: the answer depends on nothing else, and under speculative
        decoding one position's text is steered several times (each draft row's fill, the fill
        again before the kept token, rows that share a prefix), so most calls are hits."""
        key = (call, measure)
        if key in self._completions:
            return self._completions[key]
        return self._completions.keep(key, call, self._complete(call, measure))

    def _complete(self, call: str, measure: Measure) -> str | None:
        begin = self.dialect.tool_call.begin
        if len(call) < len(begin):
            body = self._body("", measure)
            return None if body is None or not begin.startswith(call) else begin[len(call) :] + body
        if not call.startswith(begin):
            return None
        return self._body(call[len(begin) :], measure)

    def shortest_call(self, measure: Measure = len) -> str | None:
        """The shortest whole call of the turn, tags included."""
        return self.complete("", measure)

    def unknown(self) -> list[str]:
        """Where a tool's arguments have no shortest value, one message each (tool and path)."""
        out = []
        for name, parameters in self.tools:
            try:
                _shortest(parameters, _Ctx({"arguments": parameters}, len))
            except _Unknown as err:
                out.append(f"tool {name!r}: no shortest value at parameters{err.path} ({err.reason})")
        return out

    def lookahead(self, measure: Measure = len) -> int:
        """The most one token can add to a call's shortest completion (by ``measure``), over
        the turn's tools: how far ahead of the limit a begun call must be steered so that no
        token the mask allows leaves it unable to finish. Sized from the largest tool."""
        calls = []
        units: list[str] = []
        for name, parameters in self.tools:
            ctx = _Ctx({"arguments": parameters}, measure)
            with suppress(_Unknown):
                calls.append(measure(_dumps(name) + _shortest(parameters, ctx)))
            units += _units(parameters, ctx, 0, set())
        choice = max(calls) - min(calls) if calls else 0
        return max([choice, *map(measure, units)]) + _STEP_SLACK

    def _body(self, body: str, measure: Measure) -> str | None:
        end = self.dialect.tool_call.end
        best: str | None = None
        for schema, root in self._envelopes:
            for r in _read(schema, _Ctx(root, measure), body, 0):
                if isinstance(r, _Open):
                    candidate = r.suffix + end
                else:
                    tail = body[r.end :]
                    stripped = tail.lstrip(_WS)
                    if not end.startswith(stripped):
                        continue
                    candidate = end[len(stripped) :]
                if best is None or measure(candidate) < measure(best):
                    best = candidate
        return best
