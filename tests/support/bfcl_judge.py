"""Judge one reply to a BFCL item: did it call, validly, the right tool, with the right arguments?

Four verdicts, each stricter than schema validity alone can say:

- **parsed**: the reply yields at least one call (the server's ``tool_calls``, or for a server
  that parses nothing, the ``<tool_call>`` spans of its raw text: :func:`calls_from_text`);
- **valid**: every call names an offered tool and its arguments are a JSON object that validates
  against that tool's schema (``jsonschema``);
- **right tool**: the calls' names are the expected ones, as a multiset (parallel calls may come
  in any order);
- **exact arguments**: BFCL's AST check (:func:`exact_arguments`), every expected call matched by
  a distinct reply call whose every argument value is among the possible answers' values.

The exact check follows BFCL's ``ast_checker`` in what it accepts: strings compared after its
standardisation (case, spaces and ``,./-_*^`` ignored), an integer where a float is possible,
nested objects checked key by key the same way, ``""`` among the possible values meaning the
argument may be left out, and no argument beyond the possible answers' names.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hermes_vllm.spans import split_spans

PossibleAnswers = Sequence[Mapping[str, Mapping[str, Sequence[Any]]]]
"""BFCL's ground truth: one ``{function name: {argument: [acceptable values]}}`` per expected call."""

_IGNORED = re.compile(r"[ ,./\-_*^]")


@dataclass(frozen=True)
class ParsedCall:
    """One call of a reply: the tool name and its arguments' JSON text, as a server returns it."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` found; each field implies the ones before it except ``right_tool``."""

    parsed: bool
    valid: bool
    right_tool: bool
    exact: bool
    problem: str
    """Why the reply is not exact, for the report's examples; empty when it is."""


def calls_from_text(text: str, dialect: str = "qwen") -> list[ParsedCall]:
    """The closed call spans of ``text`` that hold ``{"name": str, "arguments": object}``.

    What a client would get from a reply no server parsed: a span that is not such JSON is
    no call (and neither is the reply, if it has no other).
    """
    calls = []
    for span in split_spans(text, dialect, strict=True):
        if span.kind != "call" or not span.closed:
            continue
        try:
            payload = json.loads(span.body)
        except json.JSONDecodeError:
            continue
        if isinstance(payload, dict) and isinstance(payload.get("name"), str):
            arguments = payload.get("arguments")
            if isinstance(arguments, dict):
                calls.append(ParsedCall(payload["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls


def _standard(text: str) -> str:
    """BFCL's string standardisation: lower case, quotes unified, spaces and ``,./-_*^`` dropped."""
    return _IGNORED.sub("", text).lower().replace("'", '"')


def value_matches(value: Any, possible: Any) -> bool:
    """Whether ``value`` is equal to the one possible value ``possible``, as BFCL compares them."""
    if isinstance(possible, bool) or isinstance(value, bool):
        return isinstance(possible, bool) and isinstance(value, bool) and value == possible
    if isinstance(possible, float):
        return isinstance(value, (int, float)) and float(value) == possible
    if isinstance(possible, int):
        return isinstance(value, int) and value == possible
    if isinstance(possible, str):
        return isinstance(value, str) and _standard(value) == _standard(possible)
    if isinstance(possible, list):
        return (
            isinstance(value, list)
            and len(value) == len(possible)
            and all(value_matches(v, p) for v, p in zip(value, possible, strict=True))
        )
    if isinstance(possible, dict):
        # BFCL writes a nested object's possible answers as {key: [acceptable values]}
        return isinstance(value, dict) and arguments_match(value, possible, required=())
    return bool(value == possible)


def arguments_match(
    arguments: Mapping[str, Any], possible: Mapping[str, Any], required: Sequence[str]
) -> bool:
    """Whether ``arguments`` satisfy one call's possible answers ``{argument: [values]}``.

    ``required`` (the schema's) must be present; an argument left out must have ``""`` among its
    values; an argument the answers do not name fails.
    """
    if any(name not in arguments for name in required) or any(name not in possible for name in arguments):
        return False
    for name, values in possible.items():
        options = values if isinstance(values, list) else [values]
        if name not in arguments:
            if "" not in options:
                return False
        elif not any(value_matches(arguments[name], p) for p in options if p != ""):
            return False
    return True


def exact_arguments(
    calls: Sequence[tuple[str, Mapping[str, Any]]],
    possible_answers: PossibleAnswers,
    required: Mapping[str, Sequence[str]],
) -> bool:
    """BFCL's AST check: one reply call per expected call, each matching its possible answers.

    ``calls`` are (name, decoded arguments); ``required`` maps a tool name to its schema's
    required arguments. Parallel calls may come in any order: the expected calls are matched to
    distinct reply calls by search (calls are few).
    """
    if len(calls) != len(possible_answers):
        return False
    expected = [next(iter(answer.items())) for answer in possible_answers]

    def match(i: int, used: frozenset[int]) -> bool:
        if i == len(expected):
            return True
        name, possible = expected[i]
        return any(
            j not in used
            and calls[j][0] == name
            and arguments_match(calls[j][1], possible, required.get(name, ()))
            and match(i + 1, used | {j})
            for j in range(len(calls))
        )

    return match(0, frozenset())


def judge(
    calls: Sequence[ParsedCall],
    schemas: Mapping[str, Mapping[str, Any]],
    expected_names: Sequence[str],
    possible_answers: PossibleAnswers,
) -> Verdict:
    """The verdicts on one reply's ``calls`` for an item offering tools with ``schemas``."""
    import jsonschema

    if not calls:
        return Verdict(False, False, False, False, "no call")
    right_tool = Counter(c.name for c in calls) == Counter(expected_names)
    decoded: list[tuple[str, Mapping[str, Any]]] = []
    problem = ""
    for call in calls:
        schema = schemas.get(call.name)
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError:
            arguments = None
        if schema is None:
            problem = problem or f"unknown tool {call.name!r}"
        elif not isinstance(arguments, dict):
            problem = problem or f"{call.name}: arguments are not a JSON object"
        else:
            error = jsonschema.exceptions.best_match(
                jsonschema.Draft202012Validator(schema).iter_errors(arguments)
            )
            if error is not None:
                problem = problem or f"{call.name}: {error.message}"
            decoded.append((call.name, arguments))
    valid = not problem
    required = {name: list(schema.get("required", [])) for name, schema in schemas.items()}
    exact = valid and right_tool and exact_arguments(decoded, possible_answers, required)
    if not problem:
        problem = "" if exact else ("wrong tool" if not right_tool else "arguments differ")
    return Verdict(True, valid, right_tool, exact, problem)
