"""Every reading of a partial JSON value under a schema, and what each still needs.

The second of the completer's two algorithms: a small backtracking reader of the text a call
has written so far. Every way the text can be read under the schema (``anyOf`` branches, tools,
key orders, an escape the text ends inside) is followed; each reading either ends (:class:`Done`,
where the value closed) or is open (:class:`Open`, with the shortest text that finishes it, from
:mod:`hermes_vllm.budget.shortest`). Keywords it cannot follow (``allOf``, ``not``, ...) give no
reading: the caller then does not steer, and every forced token is still checked against the
engine's mask.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from hermes_vllm.budget.shortest import (
    MAX_DEPTH,
    UNSUPPORTED,
    WHITESPACE,
    Ctx,
    Members,
    Schema,
    Unknown,
    allowed_name,
    compact,
    declared,
    distinct_items,
    extend_number,
    extra_schema,
    free_keys,
    key_names,
    pattern_suffix,
    resolve,
    rest_of_object,
    shortest_value,
    types_of,
)
from hermes_vllm.schema.unique import item_value, kept_kind


@dataclass(frozen=True)
class Done:
    end: int


@dataclass(frozen=True)
class Open:
    suffix: str
    """What the value still needs, the text having ended inside it."""


Read = Done | Open


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def read_value(schema: Schema, ctx: Ctx, text: str, i: int, depth: int = 0) -> Iterator[Read]:
    """Every reading of a value starting at ``text[i]`` (whitespace before it skipped)."""
    if depth > MAX_DEPTH:
        return
    i = skip_ws(text, i)
    try:
        schema = resolve(schema, ctx)
    except (Unknown, LookupError, TypeError):
        return
    if i == len(text):
        with suppress(Unknown):
            yield Open(shortest_value(schema, ctx, depth))
        return
    if schema is True or schema == {}:
        yield from _read_free(text, i)
        return
    if not isinstance(schema, Mapping) or UNSUPPORTED & schema.keys() or "allOf" in schema or "not" in schema:
        return
    if "const" in schema or "enum" in schema:
        yield from _read_literal([compact(v) for v in schema.get("enum", [schema.get("const")])], text, i)
        return
    branches = schema.get("anyOf", schema.get("oneOf"))
    if branches is not None:
        for branch in branches:
            yield from read_value(branch, ctx, text, i, depth + 1)
        return
    kinds = types_of(schema)
    ch = text[i]
    if ch == "{" and "object" in kinds:
        yield from _ObjectReader(schema, ctx, text, depth).member(Members(-1, 0, frozenset()), i + 1, True)
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


_FREE_ENDINGS = {"value": "0", "first_value": "", "first_key": "", "key": '"":0', "colon": ":0", "more": ""}
"""What a free value's text needs where it ends, by what it expects next (the shortest JSON)."""


def _read_free(text: str, i: int) -> Iterator[Read]:
    """The one reading of a value of any JSON (a schema of ``{}``) from ``text[i]``, read without
    recursion: the grammar lets a model nest a free value as deep as its tokens allow, past any
    bound a recursive reader keeps (a weak model nested one past a hundred levels), and such a
    call must still be closed in time. Its shortest completion finishes the innermost open
    scalar, key or member, then closes each open container, innermost first."""
    closers: list[str] = []
    expect = "value"
    while True:
        i = skip_ws(text, i)
        if i == len(text):
            yield Open(_FREE_ENDINGS[expect] + "".join(reversed(closers)))
            return
        ch = text[i]
        if expect in ("first_value", "first_key") and ch == closers[-1]:
            expect = "more"
        if expect == "more":
            if ch == ",":
                expect = "key" if closers[-1] == "}" else "value"
                i += 1
                continue
            if ch != closers[-1]:
                return
            closers.pop()
            i += 1
            if not closers:
                yield Done(i)
                return
            continue
        if expect == "colon":
            if ch != ":":
                return
            expect, i = "value", i + 1
            continue
        if expect in ("key", "first_key"):
            if ch != '"':
                return
            read = next(_read_string(text, i + 1, 0), None)
            if isinstance(read, Open):
                yield Open(read.suffix + ":0" + "".join(reversed(closers)))
            if not isinstance(read, Done):
                return
            expect, i = "colon", read.end
            continue
        if ch in "{[":
            closers.append("}" if ch == "{" else "]")
            expect, i = ("first_key" if ch == "{" else "first_value"), i + 1
            continue
        if ch == '"':
            read = next(_read_string(text, i + 1, 0), None)
        elif ch == "-" or ch.isdigit():
            read = next(_read_number({}, text, i, False), None)
        else:
            read = next(_read_literal(("true", "false", "null"), text, i), None)
        if isinstance(read, Open):
            yield Open(read.suffix + "".join(reversed(closers)))
        if not isinstance(read, Done):
            return
        if not closers:
            yield read
            return
        expect, i = "more", read.end


def _read_literal(spellings: Sequence[str], text: str, i: int) -> Iterator[Read]:
    rest = text[i:]
    for word in spellings:
        if rest.startswith(word):
            yield Done(i + len(word))
        elif word.startswith(rest):
            yield Open(word[len(rest) :])


_PLAIN_RUN = re.compile(r'[^"\\]*')
"""A run of a JSON string body's characters up to its closing quote or next escape."""


def _read_string(text: str, i: int, min_length: int) -> Iterator[Read]:
    """A string body from ``text[i]`` (after its opening quote). Plain characters are skipped a
    run at a time: steering reads a call's whole text at every position of its alert window, and
    a random or verbose model's string arguments run to hundreds of characters."""
    count = 0
    while True:
        plain = _PLAIN_RUN.match(text, i)
        assert plain is not None  # the run may be empty
        count += plain.end() - i
        i = plain.end()
        if i == len(text):
            break
        if text[i] == '"':
            if count >= min_length:
                yield Done(i + 1)
            return
        escape = text[i + 1 : i + 6]  # text[i] is a backslash
        if not escape:
            yield Open("n" + "a" * max(0, min_length - count - 1) + '"')
            return
        if escape[0] == "u":
            hex_digits = escape[1:]
            if len(hex_digits) < 4:
                if i + 1 + len(escape) == len(text):
                    yield Open("0" * (4 - len(hex_digits)) + "a" * max(0, min_length - count - 1) + '"')
                return
            i += 6
        else:
            i += 2
        count += 1
    yield Open("a" * max(0, min_length - count) + '"')


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


def _read_pattern_string(schema: Mapping[str, Any], text: str, i: int) -> Iterator[Read]:
    """A string body under ``pattern`` from ``text[i]``: a closed one was checked by the grammar;
    an open one is finished by the pattern's automaton, read from its decoded characters (the
    text may end inside an escape: each way to finish that escape is tried)."""
    for r in _read_string(text, i, 0):
        if isinstance(r, Done):
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
            with suppress(Unknown, ValueError):
                written = json.loads('"' + body + ending + '"')
                candidate = ending + pattern_suffix(schema, written) + '"'
                if best is None or len(candidate) < len(best):
                    best = candidate
        if best is not None:
            yield Open(best)


def _read_number(schema: Mapping[str, Any], text: str, i: int, integer: bool) -> Iterator[Read]:
    j = i
    while j < len(text) and text[j] in "+-0123456789.eE":
        j += 1
    if j < len(text):  # the number ended: the grammar checked it
        yield Done(j)
        return
    # The text ends inside the number: it may go on (even from below the range) or end here.
    rest = extend_number(schema, text[i:j], integer)
    if rest is not None:
        yield Open(rest)


def _read_array(schema: Mapping[str, Any], ctx: Ctx, text: str, i: int, depth: int) -> Iterator[Read]:
    prefix = list(schema.get("prefixItems", ()))
    items = schema.get("items", {})
    need = int(schema.get("minItems", 0))
    # Items kept distinct (``uniqueItems`` the processor keeps): a repeated one is no reading, an
    # open one is finished unlike the others, and the items still needed differ too.
    kind = kept_kind(schema)
    distinct = kind is not None

    def item(n: int) -> Schema:
        return prefix[n] if n < len(prefix) else items

    def close(count: int, seen: frozenset[Any]) -> str:
        if distinct:
            more = distinct_items(schema, ctx, seen, need - count)
        else:
            more = [shortest_value(item(n), ctx, depth + 1) for n in range(count, need)]
        return "".join("," + m if count or k else m for k, m in enumerate(more)) + "]"

    def after(count: int, j: int, seen: frozenset[Any]) -> Iterator[Read]:
        j = skip_ws(text, j)
        if j == len(text):
            with suppress(Unknown):
                yield Open(close(count, seen))
        elif text[j] == "]":
            if count >= need:
                yield Done(j + 1)
        elif text[j] == ",":
            yield from value(count, j + 1, seen)

    def value(count: int, j: int, seen: frozenset[Any]) -> Iterator[Read]:
        for r in read_value(item(count), ctx, text, j, depth + 1):
            if isinstance(r, Done):
                written = item_value(text[j : r.end]) if distinct else None
                if written not in seen:
                    yield from after(count + 1, r.end, seen | {written} if distinct else seen)
                continue
            suffix = r.suffix if kind is None else _unlike(kind, text[j:], r.suffix, seen)
            if suffix is not None:
                finished = seen | {item_value(text[j:] + suffix)} if distinct else seen
                with suppress(Unknown):
                    yield Open(suffix + close(count + 1, finished))

    j = skip_ws(text, i)
    if j < len(text) and text[j] == "]":
        if need == 0:
            yield Done(j + 1)
        return
    if j == len(text):
        with suppress(Unknown):
            yield Open(close(0, frozenset()))
        return
    yield from value(0, j, frozenset())


def _unlike(kind: str, written: str, suffix: str, seen: frozenset[Any]) -> str | None:
    """``suffix``, or the shortest change of it that finishes the item begun as ``written`` unlike
    every item in ``seen``: a string gets characters more before its closing quote, a number
    digits more (or a fraction); ``None`` where none is found."""
    if item_value(written + suffix) not in seen:
        return suffix
    if kind == "string":
        if not suffix.endswith('"'):
            return None
        letters = "abcdefghijklmnopqrstuvwxyz0123456789"
        extras = [*letters, *(a + b for a in letters for b in letters)]
        candidates: list[str] = [suffix[:-1] + extra + '"' for extra in extras]
    else:
        digits = [str(n) for n in range(100)]
        candidates = [*digits, *(suffix + d for d in digits)]
        if kind == "number" and not any(c in written + suffix for c in ".eE"):
            candidates += [suffix + "." + d for d in digits]
    for candidate in candidates:
        try:
            value = json.loads(written + candidate)
        except ValueError:
            continue
        if value not in seen and (kind != "integer" or isinstance(value, int)):
            return candidate
    return None


class _ObjectReader:
    """Every reading of an object's members from some point of the text on: which declared
    properties may come next (in declared order, none required skipped), undeclared keys where
    the schema allows them, and the count ``minProperties`` / ``maxProperties`` bound."""

    def __init__(self, schema: Mapping[str, Any], ctx: Ctx, text: str, depth: int) -> None:
        self.schema = schema
        self.ctx = ctx
        self.text = text
        self.depth = depth
        self.props = declared(schema)
        self.index = {k: n for n, (k, _) in enumerate(self.props)}
        self.required = set(schema.get("required", ()))
        extra = extra_schema(schema)
        self.extra: Schema = False if extra is False else extra if isinstance(extra, Mapping) else {}
        most = schema.get("maxProperties")
        self.most = most if isinstance(most, int) else None
        self.names = key_names(schema)

    def rest(self, at: Members, first: bool = False) -> str:
        return rest_of_object(self.schema, self.ctx, at, self.depth, first) + "}"

    def skips_required(self, last: int, n: int) -> bool:
        return any(k in self.required for k, _ in self.props[last + 1 : n])

    def may_end(self, at: Members) -> bool:
        return not self.skips_required(at.last, len(self.props)) and at.count >= int(
            self.schema.get("minProperties", 0)
        )

    def shortest(self, schema: Schema) -> str:
        return shortest_value(schema, self.ctx, self.depth + 1)

    def key_choices(self, at: Members) -> Iterator[tuple[str, Schema, Members]]:
        """(key spelling, value schema, reading after it) of the keys that may come next."""
        if self.most is not None and at.count >= self.most:
            return
        for n, (k, v) in enumerate(self.props):
            if n > at.last and not self.skips_required(at.last, n):
                yield compact(k), v, at.add(n, k)
        if self.extra is not False:
            with suppress(Unknown):
                key = next(free_keys(self.schema, at.free))
                yield compact(key), self.extra, at.add(-1, key)

    def member(self, at: Members, j: int, first: bool) -> Iterator[Read]:
        """A member (or, ``first``, the closing brace) from ``text[j]``."""
        text = self.text
        j = skip_ws(text, j)
        if j == len(text):
            if first and self.may_end(at):
                yield Open("}")
            for spelling, value_schema, after in self.key_choices(at):
                with suppress(Unknown):
                    yield Open(f"{spelling}:{self.shortest(value_schema)}{self.rest(after)}")
            return
        if first and text[j] == "}":
            if self.may_end(at):
                yield Done(j + 1)
            return
        if text[j] == '"':
            for key_read in self.read_key(j + 1):
                if isinstance(key_read, Open):
                    yield from self.open_key(at, j, key_read.suffix)
                else:
                    yield from self.after_key(at, j, key_read.end)

    def read_key(self, i: int) -> Iterator[Read]:
        """A key's body from ``text[i]``, finished (when open) as the ``propertyNames`` allows."""
        names = self.names
        if names is not None and "pattern" in names:
            return _read_pattern_string(names, self.text, i)
        return _read_string(self.text, i, int(names.get("minLength", 0)) if names is not None else 0)

    def open_key(self, at: Members, j: int, closing: str) -> Iterator[Read]:
        """The text ends inside a key begun at ``text[j]``: a declared key it begins, or (where
        allowed) the undeclared key it is when closed there."""
        written = self.text[j:]
        choices = [(s, v, after) for s, v, after in self.key_choices(at) if s.startswith(written)]
        with suppress(ValueError):
            key = json.loads(written + closing)
            free = self.extra is not False and key not in self.index and allowed_name(self.schema, key)
            if free and (key in at.free or self.most is None or at.count < self.most):
                choices.append((written + closing, self.extra, at.add(-1, key)))
        for spelling, value_schema, after in choices:
            with suppress(Unknown):
                yield Open(f"{spelling[len(written) :]}:{self.shortest(value_schema)}{self.rest(after)}")

    def after_key(self, at: Members, j: int, end: int) -> Iterator[Read]:
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
        if n < 0 and (self.extra is False or not allowed_name(self.schema, key)):
            return
        if self.most is not None and at.count >= self.most and key not in at.free:
            return
        value_schema = self.props[n][1] if n >= 0 else self.extra
        after = at.add(n, key)
        k = skip_ws(text, end)
        if k == len(text):
            with suppress(Unknown):
                yield Open(":" + self.shortest(value_schema) + self.rest(after))
            return
        if text[k] != ":":
            return
        for r in read_value(value_schema, self.ctx, text, k + 1, self.depth + 1):
            if isinstance(r, Done):
                yield from self.after_value(after, r.end)
            else:
                with suppress(Unknown):
                    yield Open(r.suffix + self.rest(after))

    def after_value(self, at: Members, j: int) -> Iterator[Read]:
        text = self.text
        j = skip_ws(text, j)
        if j == len(text):
            with suppress(Unknown):
                yield Open(self.rest(at))
        elif text[j] == "}":
            if self.may_end(at):
                yield Done(j + 1)
        elif text[j] == ",":
            yield from self.member(at, j + 1, False)
