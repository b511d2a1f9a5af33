"""Admission: a request's constraint read into a prepared turn, checked before it is served.

The frontend (:mod:`hermes_vllm.processor.frontend`) refuses here what the engine could not serve
(HTTP 400: a call or an answer that cannot be promised within ``max_tokens``, vLLM's structured
outputs beside the tools), and the engine's core (:mod:`hermes_vllm.processor.core`) reads the same
:class:`Turn` and reserve when it admits a row: one reading of a request, memoized by its
constraint, for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hermes_vllm.budget import Speller
from hermes_vllm.budget.needs import TurnNeeds
from hermes_vllm.constraint import ConstraintRequest, parse_constraint
from hermes_vllm.dialect import Dialect
from hermes_vllm.grammar.compiler import PreparedTurn, prepare_constraint
from hermes_vllm.grammar.engines import get_engine_class
from hermes_vllm.latin1 import as_latin1
from hermes_vllm.memo import memoize_small
from hermes_vllm.metrics import Refusal
from hermes_vllm.settings import Limits, get_limits


def validate_request(
    extra_args: Any, engine: str, max_tokens: int | None = None, speller: Speller | None = None
) -> ConstraintRequest | None:
    """Frontend check of a request's constraint; ``ValueError`` -> HTTP 400.

    Given the served vocabulary's ``speller``, a ``required`` / named request whose ``max_tokens``
    is below the reserve the engine keeps for its call (:func:`turn_reserve`: the shortest call,
    the mark of a call the budget closes, the margin) is refused with both numbers; without it
    the engine still forces the call to open in time.
    """
    request = parse_constraint(extra_args)
    if request is None:
        return None
    turn = prepared_turn(request, engine, get_limits())
    _check_answer(turn, max_tokens, speller)
    if turn.prepared.spec.mode != "required":
        return request
    unknown = turn.needs.completer.unknown()
    if unknown:
        raise Refusal(
            "no_shortest_value",
            f"{'; '.join(unknown)}: the call this tool_choice requires could not be "
            "promised within max_tokens; simplify that schema",
        )
    if max_tokens is not None and speller is not None:
        shortest = turn.needs.shortest_call(speller)
        reserve = turn_reserve(request, engine, speller)
        if shortest is not None and max_tokens < reserve:
            mark = " and the mark of a call the budget closes" if request.budget.closes(True) else ""
            raise Refusal(
                "budget_too_small",
                f"max_tokens={max_tokens} cannot hold the shortest call this tool_choice "
                f"requires: {reserve} tokens (for {shortest!r}{mark}, plus a margin of "
                f"{turn.needs.margin}, HERMES_VLLM_BUDGET_MARGIN); raise max_tokens",
            )
    return request


def _check_answer(turn: Turn, max_tokens: int | None, speller: Speller | None) -> None:
    """Refuse a turn with an answer whose answer could not be promised within ``max_tokens``: its
    schema has no shortest value, or ``max_tokens`` is below its reserve."""
    answer = turn.needs.answer
    if answer is None:
        return
    unknown = answer.unknown()
    if unknown:
        raise Refusal(
            "no_shortest_value",
            f"{'; '.join(unknown)}: the answer this turn owes could not be promised within "
            "max_tokens; simplify that schema",
        )
    needed = 0 if speller is None else turn.needs.answer_reserve(speller)
    if max_tokens is not None and max_tokens < needed:
        raise Refusal(
            "budget_too_small",
            f"max_tokens={max_tokens} cannot hold the shortest answer the response_format asks "
            f"for: {needed} tokens (its shortest spelling plus a margin of "
            f"{turn.needs.margin}, HERMES_VLLM_BUDGET_MARGIN); raise max_tokens",
        )


STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
"""The fields of vLLM's ``StructuredOutputsParams`` that constrain the output."""


def refuse_structured_outputs(request: ConstraintRequest, structured: Any) -> None:
    """Refuse a constrained request that still carries vLLM structured outputs: ``ValueError``.

    vLLM's grammar masks every token the turn grammar needs for a call (and under ``required``
    the two masks leave nothing, which vLLM's backend answers with HTTP 500), so no such request
    is admitted. The tool parser moves a ``response_format`` / ``structured_outputs`` JSON schema
    beside ``tools`` into the turn grammar before this check; what reaches it is what the turn
    grammar cannot take (a regex, a choice, a grammar, a structural tag) or a client's own
    constraint sent beside structured outputs.
    """
    kinds = [k for k in STRUCTURED_KINDS if getattr(structured, k, None) not in (None, False)]
    named = ", ".join(f"structured_outputs.{k}" for k in kinds) or "structured_outputs"
    raise Refusal(
        "combination",
        f"hermes-vllm cannot serve tools (tool_choice={request.tool_choice!r}) together with {named}: "
        "vLLM's structured output would mask the tool calls; send the answer's JSON schema as "
        "response_format (or structured_outputs.json) beside the tools, which the turn grammar "
        "serves, or drop one of the two",
    )


@dataclass(frozen=True)
class Turn:
    """A constraint as admission reads it, once per constraint: the prepared turn (the grammar's
    input) and what its budgets need (:class:`TurnNeeds`)."""

    prepared: PreparedTurn
    needs: TurnNeeds


@memoize_small(lambda request, engine, limits: len(request.raw))
def prepared_turn(request: ConstraintRequest, engine: str, limits: Limits) -> Turn:
    """The request's :class:`Turn`, checked against ``engine``; cached by the constraint (agents
    resend the same tools with every turn, and the frontend and the engine read the same turn)."""
    engine_cls = get_engine_class(engine)
    prepared = prepare_constraint(request, engine_cls, limits)
    engine_cls.check(prepared.spec)
    return Turn(prepared, TurnNeeds(prepared.spec, limits.budget_margin))


def turn_reserve(request: ConstraintRequest, engine: str, speller: Speller) -> int:
    """The tokens a turn keeps for its call (:func:`call_reserve`), as both the frontend's check
    and the engine's budget count them."""
    turn = prepared_turn(request, engine, get_limits())
    spec = turn.prepared.spec
    return turn.needs.reserve(
        speller, request.budget.closes(spec.mode == "required" or spec.answer is not None)
    )


def refused_texts(
    dialect: Dialect, stop: str | Sequence[str], thinking: int | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The texts a budgeted row refuses (latin-1): its stop strings, where a stop would cut the
    call or leave the reply without one (one the call's closing tag holds, or that holds it,
    cannot be refused), and inside calls the reasoning tag where vLLM's own thinking budget
    watches the row."""
    end = dialect.tool_call.end
    stops = [stop] if isinstance(stop, str) else list(stop)
    refused_stops = tuple(as_latin1(s) for s in dict.fromkeys(stops) if s and end not in s and s not in end)
    in_calls = () if thinking is None else tuple(as_latin1(p.begin) for p in dialect.reasoning)
    return refused_stops, in_calls
