"""The keyword coverage policy: refuse (strict) or strip and re-validate (lenient) what an engine ignores."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from hermes_vllm.memo import IdentityMemo
from hermes_vllm.schema.names import FREE_NAMES_REASON, free_names
from hermes_vllm.schema.rewrite import (
    JSON_TYPES,
    assertion_keywords,
    declared_types,
    implied,
    open_containers,
    search_as_full_match,
)
from hermes_vllm.schema.spec import JSON, ToolSchemaError, ToolSpec, pointer
from hermes_vllm.schema.tree import CONSTRAINING, iter_subschemas
from hermes_vllm.schema.unique import kept_kind

logger = logging.getLogger(__name__)


Coverage = Literal["strict", "lenient"]


class UnsupportedKeywordError(ToolSchemaError):
    """A strict-coverage refusal: a keyword the request's engine cannot enforce."""


@dataclass(frozen=True)
class UncoveredKeyword:
    """A keyword the engine would silently ignore, and where it sits."""

    tool: str
    path: str
    keyword: str
    reason: str = ""
    """Why, when the keyword is ignored because of where it sits rather than what it is."""


def _trivial(key: str, value: JSON) -> bool:
    """A keyword that admits everything (an engine may ignore it at no cost)."""
    return value in (True, {}) or (
        key == "type" and declared_types({"type": value}) == {*JSON_TYPES, "integer"}
    )


_MAX_DIVISOR = 1024
"""Largest ``multipleOf`` xgrammar 0.2.8 enforces, the only engine that enforces the keyword."""
_MULTIPLE_OF_REASON = (
    f'enforced only on "type": "integer" with a whole divisor from 1 to {_MAX_DIVISOR} and no range '
    "bound beside it (a bounded range of few multiples, integer or number, is spelled out as an enum)"
)
_RANGE = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _kept_multiple(sub: dict[str, JSON]) -> bool:
    """Whether xgrammar keeps this ``multipleOf``: past 1024, on another type or beside a range
    bound it drops the keyword ("range + multipleOf combination not yet supported")."""
    step = sub["multipleOf"]
    whole = isinstance(step, int | float) and not isinstance(step, bool) and float(step).is_integer()
    return (
        sub.get("type") == "integer"
        and whole
        and 1 <= step <= _MAX_DIVISOR
        and not any(k in sub for k in _RANGE)
    )


def _misplaced(sub: dict[str, JSON]) -> Iterator[tuple[str, str]]:
    """Keywords that engines ignore because of their siblings (those :func:`make_explicit` left), and why."""
    assertions = [k for k in assertion_keywords(sub) if not _trivial(k, sub[k])]
    if "$ref" in sub:
        yield from ((k, "beside '$ref'") for k in assertions if k != "$ref")
    branches = sub.get("anyOf")
    if isinstance(branches, list):
        for key in assertions:
            if key != "anyOf" and not all(implied(b, key, sub[key]) for b in branches):
                yield key, "beside 'anyOf', and not implied by every branch"
    if "multipleOf" in sub and not _kept_multiple(sub):
        yield "multipleOf", _MULTIPLE_OF_REASON
    pattern = sub.get("pattern")
    if isinstance(pattern, str):
        if search_as_full_match(pattern) is None:
            yield "pattern", "lookaround, backreference or anchor inside a group"
        yield from ((k, "together with 'pattern'") for k in ("minLength", "maxLength") if k in sub)
    if "propertyNames" in sub and free_names(sub) is None:
        yield "propertyNames", FREE_NAMES_REASON


def uncovered_keywords(spec: ToolSpec, supported: frozenset[str]) -> list[UncoveredKeyword]:
    """Constraining keywords in ``spec`` that the engine would not enforce.

    Those it does not support at all (``supported``), and those it ignores where they sit.
    """
    found = []
    for path, sub in iter_subschemas(spec.parameters):
        where = pointer(("parameters", *path))
        kept = {"uniqueItems"} if kept_kind(sub) else set()  # the processor keeps it (schema/unique.py)
        found += [
            UncoveredKeyword(spec.name, where, k)
            for k in sub
            if k in CONSTRAINING and k not in supported and k not in kept
        ]
        found += [UncoveredKeyword(spec.name, where, k, why) for k, why in _misplaced(sub) if k in supported]
    return found


def strip_keywords(spec: ToolSpec, drop: Sequence[UncoveredKeyword]) -> ToolSpec:
    """A copy of ``spec`` without the listed keywords (lenient coverage), never stricter than before.

    Dropping a keyword that admits keys or items (``patternProperties``, ``unevaluated*``) would
    close the object or array, so those are replaced by ``additionalProperties: true`` / ``items``.
    """
    params = copy.deepcopy(spec.parameters)
    by_path: dict[str, set[str]] = {}
    for item in drop:
        by_path.setdefault(item.path, set()).add(item.keyword)
    for path, sub in list(iter_subschemas(params)):
        for key in by_path.get(pointer(("parameters", *path)), ()):
            sub.pop(key, None)
            if key in ("patternProperties", "unevaluatedProperties"):
                sub["additionalProperties"] = True
    open_containers(params)
    return ToolSpec(spec.name, params, spec.description)


def check_coverage(
    specs: Sequence[ToolSpec], supported: frozenset[str], engine: str, coverage: Coverage
) -> tuple[tuple[ToolSpec, ...], bool]:
    """Apply the coverage policy: (specs to compile, whether calls need post-hoc validation).

    ``strict`` refuses a keyword the engine would silently ignore, naming it and the tool;
    ``lenient`` compiles without it and asks for jsonschema validation of the finished call.
    """
    out: list[ToolSpec] = []
    needs_validation = False
    for spec in specs:
        missing, stripped = _COVERED.get((spec, supported), partial(_covered, spec, supported))
        if missing and coverage == "strict":
            listed = ", ".join(
                f"'{m.keyword}' at {m.path}" + (f" ({m.reason})" if m.reason else "") for m in missing
            )
            raise UnsupportedKeywordError(
                spec.name,
                "",
                f"the {engine} engine cannot enforce {listed}; remove the keyword, or pass "
                "coverage='lenient' to compile without it and validate calls after generation",
            )
        needs_validation = needs_validation or bool(missing)
        out.append(stripped)
    return tuple(out), needs_validation


_COVERED: IdentityMemo[tuple[list[UncoveredKeyword], ToolSpec]] = IdentityMemo(4096)
"""Per tool (the object :func:`~hermes_vllm.schema.read_tools` memoises) and engine: a request
that resends its tools (every agent turn, every cache hit of the public ``compile``) is not
walked again."""


def _covered(spec: ToolSpec, supported: frozenset[str]) -> tuple[list[UncoveredKeyword], ToolSpec]:
    """What the engine would not enforce in ``spec``, and ``spec`` without it."""
    missing = uncovered_keywords(spec, supported)
    return missing, strip_keywords(spec, missing) if missing else spec
