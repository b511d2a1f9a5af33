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
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from hermes_vllm.dialect import Dialect
from hermes_vllm.grammar.pattern import shortest_completion

Schema = Any
_WS = " \t\n\r"
_UNSUPPORTED = frozenset({"allOf", "oneOf", "not", "patternProperties", "multipleOf", "format"})
_DEPTH = 24
"""``$ref`` chains followed before giving up (recursive schemas)."""


class _Unknown(Exception):
    """A schema the completer cannot complete by construction."""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _resolve(schema: Schema, root: Schema, depth: int = 0) -> Schema:
    while isinstance(schema, Mapping) and "$ref" in schema:
        if depth > _DEPTH:
            raise _Unknown("$ref depth")
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _Unknown(ref)
        target = root
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


def _shortest(schema: Schema, root: Schema, depth: int = 0) -> str:
    """The shortest compact JSON valid under ``schema``; :class:`_Unknown` when not constructible."""
    if depth > _DEPTH:
        raise _Unknown("depth")
    schema = _resolve(schema, root)
    if schema is True or schema == {}:
        return "0"
    if schema is False or not isinstance(schema, Mapping):
        raise _Unknown("false schema")
    if _UNSUPPORTED & schema.keys():
        raise _Unknown(sorted(_UNSUPPORTED & schema.keys())[0])
    if "const" in schema:
        return _dumps(schema["const"])
    if "enum" in schema:
        return min((_dumps(v) for v in schema["enum"]), key=len)
    options: list[str] = []
    for branch in schema.get("anyOf", ()):
        with suppress(_Unknown):
            options.append(_shortest(branch, root, depth + 1))
    if "anyOf" in schema:
        if not options:
            raise _Unknown("anyOf")
        return min(options, key=len)
    for kind in _types(schema):
        with suppress(_Unknown):
            options.append(_shortest_of(kind, schema, root, depth))
    if not options:
        raise _Unknown("no type")
    return min(options, key=len)


def _number(schema: Mapping[str, Any], integer: bool) -> str:
    low = schema.get("minimum", -math.inf)
    if "exclusiveMinimum" in schema:
        low = max(low, schema["exclusiveMinimum"] + (1 if integer else 0.5))
    high = schema.get("maximum", math.inf)
    if "exclusiveMaximum" in schema:
        high = min(high, schema["exclusiveMaximum"] - (1 if integer else 0.5))
    value = 0 if low <= 0 <= high else (math.ceil(low) if low > 0 else math.floor(high))
    if not low <= value <= high:
        raise _Unknown("empty range")
    return str(int(value))


def _shortest_of(kind: str, schema: Mapping[str, Any], root: Schema, depth: int) -> str:
    if kind == "null":
        return "null"
    if kind == "boolean":
        return "true"
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "string":
        pattern = schema.get("pattern")
        if pattern is None:
            return '"' + "a" * int(schema.get("minLength", 0)) + '"'
        return '"' + _pattern_suffix(schema, "") + '"'
    if kind == "array":
        prefix = list(schema.get("prefixItems", ()))
        need = int(schema.get("minItems", 0))
        items = [*prefix[:need], *[schema.get("items", {})] * max(0, need - len(prefix))]
        return "[" + ",".join(_shortest(s, root, depth + 1) for s in items) + "]"
    if kind == "object":
        return "{" + _rest_of_object(schema, root, -1, depth, first=True) + "}"
    raise _Unknown(kind)


def _properties(schema: Mapping[str, Any]) -> list[tuple[str, Schema]]:
    return list(schema.get("properties", {}).items())


def _rest_of_object(schema: Mapping[str, Any], root: Schema, last: int, depth: int, first: bool) -> str:
    """The required properties after declared index ``last``, spelled ``"k":v`` and joined."""
    required = set(schema.get("required", ()))
    props = _properties(schema)
    parts = [f"{_dumps(k)}:{_shortest(v, root, depth + 1)}" for k, v in props[last + 1 :] if k in required]
    declared = {k for k, _ in props}
    if required - declared:
        raise _Unknown("required property not declared")
    if int(schema.get("minProperties", 0)) > last + 1 + len(parts):
        raise _Unknown("minProperties")
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


def _read(schema: Schema, root: Schema, text: str, i: int, depth: int = 0) -> Iterator[_Read]:
    """Every reading of a value starting at ``text[i]`` (whitespace before it skipped)."""
    if depth > _DEPTH:
        return
    i = _skip_ws(text, i)
    try:
        schema = _resolve(schema, root)
    except (_Unknown, KeyError, IndexError, TypeError):
        return
    if i == len(text):
        with suppress(_Unknown):
            yield _Open(_shortest(schema, root, depth))
        return
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, Mapping) or _UNSUPPORTED & schema.keys():
        return
    if "const" in schema or "enum" in schema:
        yield from _read_literal([_dumps(v) for v in schema.get("enum", [schema.get("const")])], text, i)
        return
    if "anyOf" in schema:
        for branch in schema["anyOf"]:
            yield from _read(branch, root, text, i, depth + 1)
        return
    kinds = _types(schema)
    ch = text[i]
    if ch == "{" and "object" in kinds:
        yield from _read_object(schema, root, text, i + 1, depth)
    elif ch == "[" and "array" in kinds:
        yield from _read_array(schema, root, text, i + 1, depth)
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
    ``pattern``; coverage refuses a length bound beside a pattern, so none is honoured here."""
    if "minLength" in schema or "maxLength" in schema:
        raise _Unknown("pattern with a length bound")
    suffix = shortest_completion(schema["pattern"], written)
    if suffix is None:
        raise _Unknown("pattern")
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
    written = text[i:j]
    if j < len(text):  # the number ended: the grammar checked it
        yield _Done(j)
        return
    # The text ends inside the number: it may go on or end here.
    fix = "0" if written[-1] in "-+.eE" else ""
    try:
        value = float(written + fix)
    except ValueError:
        return
    low, high = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
    above = schema.get("exclusiveMinimum", -math.inf) < value < schema.get("exclusiveMaximum", math.inf)
    if low <= value <= high and above:
        yield _Open(fix)


def _read_array(schema: Mapping[str, Any], root: Schema, text: str, i: int, depth: int) -> Iterator[_Read]:
    prefix = list(schema.get("prefixItems", ()))
    items = schema.get("items", {})
    need = int(schema.get("minItems", 0))

    def item(n: int) -> Schema:
        return prefix[n] if n < len(prefix) else items

    def close(count: int) -> str:
        more = [_shortest(item(n), root, depth + 1) for n in range(count, need)]
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
        for r in _read(item(count), root, text, j, depth + 1):
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


def _read_object(schema: Mapping[str, Any], root: Schema, text: str, i: int, depth: int) -> Iterator[_Read]:
    props = _properties(schema)
    index = {k: n for n, (k, _) in enumerate(props)}
    required = set(schema.get("required", ()))
    extra = schema.get("additionalProperties", not props)
    extra_schema: Schema = extra if isinstance(extra, Mapping) else {}

    def rest(last: int, first: bool) -> str:
        return _rest_of_object(schema, root, last, depth, first) + "}"

    def skips_required(last: int, n: int) -> bool:
        return any(k in required for k, _ in props[last + 1 : n])

    def key_choices(last: int) -> Iterator[tuple[str, Schema, int]]:
        """(key spelling, value schema, declared index) of the keys that may come next."""
        for n, (k, v) in enumerate(props):
            if n > last and not skips_required(last, n):
                yield _dumps(k), v, n
        # Undeclared keys (where allowed) are read but never chosen to complete with.

    def after_value(last: int, j: int) -> Iterator[_Read]:
        j = _skip_ws(text, j)
        if j == len(text):
            with suppress(_Unknown):
                yield _Open(rest(last, False))
        elif text[j] == "}":
            if not skips_required(last, len(props)):
                yield _Done(j + 1)
        elif text[j] == ",":
            yield from member(last, j + 1, False)

    def member(last: int, j: int, first: bool) -> Iterator[_Read]:
        j = _skip_ws(text, j)
        if j == len(text):
            if first and not skips_required(last, len(props)):
                yield _Open("}")
            for spelling, value_schema, n in key_choices(last):
                with suppress(_Unknown):
                    yield _Open(f"{spelling}:{_shortest(value_schema, root, depth + 1)}{rest(n, False)}")
            return
        if first and text[j] == "}":
            if not skips_required(last, len(props)):
                yield _Done(j + 1)
            return
        if text[j] != '"':
            return
        for key_read in _read_string(text, j + 1, 0):
            if isinstance(key_read, _Open):  # the text ends inside the key
                written = text[j:]
                for spelling, value_schema, n in key_choices(last):
                    if spelling.startswith(written):
                        with suppress(_Unknown):
                            value = _shortest(value_schema, root, depth + 1)
                            yield _Open(f"{spelling[len(written) :]}:{value}{rest(n, False)}")
                continue
            try:
                key = json.loads(text[j : key_read.end])
            except ValueError:
                return
            n = index.get(key, -1)
            if n >= 0 and (n <= last or skips_required(last, n)):
                return
            if n < 0 and extra is False:
                return
            value_schema = props[n][1] if n >= 0 else extra_schema
            k = _skip_ws(text, key_read.end)
            if k == len(text):
                with suppress(_Unknown):
                    yield _Open(":" + _shortest(value_schema, root, depth + 1) + rest(max(n, last), False))
                return
            if text[k] != ":":
                return
            for r in _read(value_schema, root, text, k + 1, depth + 1):
                if isinstance(r, _Done):
                    yield from after_value(max(n, last), r.end)
                else:
                    with suppress(_Unknown):
                        yield _Open(r.suffix + rest(max(n, last), False))

    yield from member(-1, i, True)


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


class CallCompleter:
    """Shortest completions of one turn's calls (its tools, its dialect); engine- and vLLM-free."""

    def __init__(self, dialect: Dialect, tools: Sequence[tuple[str, Schema]]) -> None:
        self.dialect = dialect
        self._envelopes = _envelopes(dialect, [(n, _root_ref_fix(p)) for n, p in tools])

    def complete(self, call: str) -> str | None:
        """The shortest text that makes ``call`` (the text from the call's opening tag on, which
        may itself be partly written) a complete call ending with its closing tag; ``None`` when
        no reading is known."""
        begin = self.dialect.tool_call.begin
        if len(call) < len(begin):
            body = self._body("")
            return None if body is None or not begin.startswith(call) else begin[len(call) :] + body
        if not call.startswith(begin):
            return None
        return self._body(call[len(begin) :])

    def shortest_call(self) -> str | None:
        """The shortest whole call of the turn, tags included."""
        return self.complete("")

    def _body(self, body: str) -> str | None:
        end = self.dialect.tool_call.end
        best: str | None = None
        for schema, root in self._envelopes:
            for r in _read(schema, root, body, 0):
                if isinstance(r, _Open):
                    candidate = r.suffix + end
                else:
                    tail = body[r.end :]
                    stripped = tail.lstrip(_WS)
                    if not end.startswith(stripped):
                        continue
                    candidate = end[len(stripped) :]
                if best is None or len(candidate) < len(best):
                    best = candidate
        return best
