"""The shortest valid completion of a (partial) tool call or final answer, read against the turn's schemas.

What the token budgets need (:mod:`hermes_vllm.budget.turn_budget`): the reserve a ``required``
turn keeps for its call is the shortest call from nothing (:mod:`hermes_vllm.budget.shortest`),
and a call that ``max_tokens`` would cut is steered to the shortest completion of what it has
written (every reading of it, :mod:`hermes_vllm.budget.partial`); the shortest text that
completes one of the readings wins. Keywords neither algorithm can satisfy make it answer
``None``: the caller then does not steer. The processor checks every token it forces against
the engine's mask, so a wrong answer here can cost a call but never let an invalid one through.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import replace
from typing import Any

from hermes_vllm.budget.partial import Open, read_value
from hermes_vllm.budget.shortest import (
    MAX_DEPTH,
    WHITESPACE,
    Ctx,
    Measure,
    Schema,
    Unknown,
    compact,
    declared,
    member_text,
    pattern_suffix,
    resolve,
    shortest_value,
)
from hermes_vllm.dialect import Dialect
from hermes_vllm.memo import MISSING, TextKeyed
from hermes_vllm.schema import canonical_json
from hermes_vllm.schema.formats import formats_as_patterns
from hermes_vllm.schema.tree import repoint_refs
from hermes_vllm.turn import ANSWER_NAME


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


def _rebased(parameters: Schema) -> Schema:
    """Tool schemas refer to their own root as ``#``: a copy with those pointers under
    ``#/arguments``, where the completer's root holds them."""
    fixed = copy.deepcopy(parameters)
    repoint_refs(fixed, "#/arguments")
    return fixed


_CACHED_CHARS = 1 << 20
"""Call text a :class:`CallCompleter` keeps completions for (by text and measure), in all."""

_STEP_SLACK = 6
"""What one token can add inside a string or a number beyond the units :func:`_units` counts:
a begun ``\\u`` escape's digits, a split character's continuation bytes."""


def _units(schema: Schema, ctx: Ctx, depth: int, seen: set[int]) -> Iterator[str]:
    """Texts one token may commit a call to at once, anywhere under ``schema``: an optional
    property with its shortest value, one more array item, a longer ``anyOf`` branch or enum
    value, a number pushed towards its range."""
    if depth > MAX_DEPTH:
        return
    with suppress(Unknown, LookupError, TypeError):
        schema = resolve(schema, ctx)
    if not isinstance(schema, Mapping) or id(schema) in seen:
        return
    seen.add(id(schema))
    for value in schema.get("enum", ()):
        yield compact(value)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for branch in schema.get(key, ()):
            with suppress(Unknown):
                yield "," + shortest_value(branch, ctx, depth + 1)
            yield from _units(branch, ctx, depth + 1, seen)
    for key, value in declared(schema):
        with suppress(Unknown):
            yield "," + member_text(key, value, ctx, depth)
        yield from _units(value, ctx, depth + 1, seen)
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            with suppress(Unknown):
                yield ',"":' + shortest_value(sub, ctx, depth + 1)
            yield from _units(sub, ctx, depth + 1, seen)
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        if isinstance(schema.get(key), int | float):
            yield "-" + str(schema[key]) * 2
    if "pattern" in schema:
        with suppress(Unknown):
            yield pattern_suffix(schema, "") * 2


class CallCompleter:
    """Shortest completions of one turn's calls (its tools, its dialect); engine- and vLLM-free."""

    def __init__(self, dialect: Dialect, tools: Sequence[tuple[str, Schema]]) -> None:
        self.dialect = dialect
        self.tools = [(n, formats_as_patterns(_rebased(p))) for n, p in tools]
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
        found = self._completions.get(key, MISSING)
        if found is not MISSING:
            return found  # type: ignore[return-value]
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
                shortest_value(parameters, Ctx({"arguments": parameters}, len))
            except Unknown as err:
                out.append(f"tool {name!r}: no shortest value at parameters{err.path} ({err.reason})")
        return out

    def lookahead(self, measure: Measure = len) -> int:
        """The most one token can add to a call's shortest completion (by ``measure``), over
        the turn's tools: how far ahead of the limit a begun call must be steered so that no
        token the mask allows leaves it unable to finish. Sized from the largest tool."""
        calls = []
        units: list[str] = []
        for name, parameters in self.tools:
            ctx = Ctx({"arguments": parameters}, measure)
            with suppress(Unknown):
                calls.append(measure(compact(name) + shortest_value(parameters, ctx)))
            units += _units(parameters, ctx, 0, set())
        choice = max(calls) - min(calls) if calls else 0
        return max([choice, *map(measure, units)]) + _STEP_SLACK

    def _body(self, body: str, measure: Measure) -> str | None:
        end = self.dialect.tool_call.end
        best: str | None = None
        for schema, root in self._envelopes:
            for r in read_value(schema, Ctx(root, measure), body, 0):
                if isinstance(r, Open):
                    candidate = r.suffix + end
                else:
                    tail = body[r.end :]
                    stripped = tail.lstrip(WHITESPACE)
                    if not end.startswith(stripped):
                        continue
                    candidate = end[len(stripped) :]
                if best is None or measure(candidate) < measure(best):
                    best = candidate
        return best


class AnswerCompleter:
    """The shortest completions of one answer schema (a turn's ``response_format`` JSON).

    The answer is a JSON value under its schema, like a call's arguments: it is read as the
    arguments of a call named :data:`~hermes_vllm.turn.ANSWER_NAME` (name first), and the
    call's own ending (``}`` and the closing tag) is taken off again. So the answer is finished the
    same way a call is, with no second reader of partial JSON to keep in step.
    """

    def __init__(self, dialect: Dialect, schema: Any) -> None:
        self._calls = CallCompleter(replace(dialect, key_order="name_first"), [(ANSWER_NAME, schema)])
        self._head = f'{dialect.tool_call.begin}{{"name": {canonical_json(ANSWER_NAME)}, "arguments": '
        self._end = "}" + dialect.tool_call.end

    def complete(self, answer: str, measure: Measure = len) -> str | None:
        """The shortest text (by ``measure``) that makes ``answer`` (the answer written so far,
        leading whitespace dropped) a complete answer; ``""`` when it is one; ``None`` when no
        reading is known."""
        completion = self._calls.complete(self._head + answer, measure)
        if completion is None or not completion.endswith(self._end):
            return None
        return completion[: -len(self._end)]

    def shortest(self, measure: Measure = len) -> str | None:
        """The shortest whole answer."""
        return self.complete("", measure)

    def lookahead(self, measure: Measure = len) -> int:
        """The most one token can add to a begun answer's shortest completion (see
        :meth:`CallCompleter.lookahead`)."""
        return self._calls.lookahead(measure)

    def unknown(self) -> list[str]:
        """Where the answer's schema has no shortest value, one message each."""
        return self._calls.unknown()
