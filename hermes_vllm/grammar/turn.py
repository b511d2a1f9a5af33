"""A request's tool options -> its :class:`~hermes_vllm.turn.TurnSpec`, and what every engine's
turn grammar shares: the whitespace before spans and calls, the tag initials an answer's strings
keep out.

The shape a spec describes (free text, opaque reasoning/hidden spans, tool-call spans holding
exactly one schema-valid call) is written out once per engine in ``grammar/engines/``. A turn with
an *answer* (the request's ``response_format`` beside its tools) has no free text: reasoning, then
either calls or the answer as JSON matching its schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import xgrammar as xgr

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.schema import ToolSchemaError, ToolSpec, UnsatisfiableToolError
from hermes_vllm.turn import Mode, TurnSpec

LEAD_WHITESPACE = 4
"""Whitespace allowed before each reasoning span and before the first call where no free text may
come first (``required``): Qwen 3 writes two newlines after ``</think>``. Bounded like whitespace in
a call, so a weak model cannot loop on it."""


Ending = Literal["calls", "answer"]
Calls = Literal["none", "one", "any"]


@dataclass(frozen=True)
class TurnShape:
    """What a turn may hold, in order, decided once from its spec (:func:`turn_shape`); each
    engine's file prints it in its own syntax, so adding an engine means writing a printer.

    A turn is one of three:

    - a turn with an answer (:attr:`endings`): reasoning/hidden spans, each after some whitespace,
      then one of its endings (its calls, or the answer as JSON), then only whitespace; the last
      call may be followed by :data:`~hermes_vllm.turn.MARK`. No free text: a reply holds a
      complete call or a complete answer;
    - a turn that opens with a call (:attr:`opens_with_call`, ``required``): spans, each after
      some whitespace, then the call after some whitespace, then free text;
    - free text from its start.

    Free text holds reasoning/hidden spans and :attr:`calls` (none, at most one, any number), and
    the output may end inside an unclosed span.
    """

    endings: tuple[Ending, ...]
    """A turn with an answer: what may end it (calls, the answer, or either). Empty: no answer."""
    opens_with_call: bool
    calls: Calls
    """The calls in the turn's free text (after its first call, where it opens with one); in a
    turn with an answer, its calls ending: ``one`` call or ``any`` number (at least one)."""
    after_call: Calls
    """The calls the free text after a call may hold (the composed matcher's tool grammars
    continue from a call: ``none`` where the turn allows one call)."""
    may_call: bool
    """Whether a call may be written at all (its rules are needed)."""


_ENDINGS: dict[str, tuple[Ending, ...]] = {
    "auto": ("calls", "answer"),
    "required": ("calls",),
    "none": ("answer",),
}
"""A turn with an answer: calls or the answer under ``auto``, calls only where one is required
(the answer unused, as OpenAI serves it), the answer only under ``none``."""


def turn_shape(turn: TurnSpec) -> TurnShape:
    """The one place a turn's mode, parallel calls and answer become its shape."""
    after: Calls = "any" if turn.parallel else "none"
    may_call = turn.mode != "none"
    if turn.answer is not None:
        endings = _ENDINGS[turn.mode]
        return TurnShape(endings, False, "any" if turn.parallel and may_call else "one", after, may_call)
    if turn.mode == "required":
        return TurnShape((), True, after, after, may_call)
    free: Calls = "none" if not may_call else "any" if turn.parallel else "one"
    return TurnShape((), False, free, after, may_call)


def tag_initials(dialect: Dialect) -> str:
    """The first characters of the tags readers of free text act on (the call tag, the span
    openers, the other parsed tags), escaped for a character class (an EBNF one and a regex one
    alike). An answer's strings never hold them raw: the answer is free text to every span reader
    (parsers, the budget's follower), and a raw ``<think>`` there would open a span for them."""
    d = dialect
    firsts = sorted({t[0] for t in (d.tool_call.begin, *(p.begin for p in d.free_spans), *d.parsed_tags)})
    return "".join("\\" + c if c in "[]^-\\" else c for c in firsts)


def resolve_tool_choice(names: Sequence[str], tool_choice: Any) -> tuple[Mode, frozenset[str]]:
    """OpenAI ``tool_choice`` over a request's tool ``names`` -> (mode, the names a call may use).

    Delegates the OpenAI shapes (strings, named function, ``allowed_tools``) to xgrammar's
    ``normalize_tool_choice``; a named or forced choice becomes ``required`` over that one tool.
    """
    if tool_choice == "none":
        return "none", frozenset(names)
    refs = [{"type": "function", "function": {"name": n}} for n in names]
    try:
        functions, _, simplified = xgr.normalize_tool_choice(tools=refs, tool_choice=tool_choice)
    except ValueError as err:
        raise ToolSchemaError(None, "tool_choice", str(err).splitlines()[0]) from None
    return ("auto" if simplified == "auto" else "required"), frozenset(f.function.name for f in functions)


def turn_spec(
    specs: Sequence[ToolSpec],
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = True,
    dialect: str | Dialect = "hermes",
    max_whitespace: int = 1,
    unusable: Sequence[UnsatisfiableToolError] = (),
    answer: ToolSpec | None = None,
) -> TurnSpec:
    """Build the spec of a turn from normalised tools and the request's tool options.

    ``answer`` (the final answer's schema): the turn is calls or that answer under ``auto``,
    the answer under ``none``, calls only where a call is required (the answer unused, as OpenAI
    serves ``tool_choice="required"`` beside a ``response_format``).

    The ``unusable`` tools (no call can satisfy them) are named in the request, so ``tool_choice``
    may name them, but no call to them can be written: they are left out. Refused only where the
    choice needs a call and allows none but them (the named tool, or every tool of ``required``).
    """
    mode, allowed = resolve_tool_choice(
        [*(s.name for s in specs), *(u.tool or "" for u in unusable)], tool_choice
    )
    chosen = tuple(s for s in specs if s.name in allowed)
    needed = [u for u in unusable if u.tool in allowed]
    if mode == "required" and not chosen and needed:
        raise _unusable_choice(needed)
    if not chosen:
        mode = "none"  # ``auto`` with no tool a call can use: nothing can be called, which is ``none``
    return TurnSpec(
        get_dialect(dialect),
        chosen if mode != "none" else (),
        mode,
        parallel_tool_calls,
        max_whitespace,
        answer,
    )


def _unusable_choice(needed: Sequence[UnsatisfiableToolError]) -> UnsatisfiableToolError:
    """The HTTP 400 of a ``tool_choice`` that requires a call, when no allowed tool can take one."""
    if len(needed) == 1:
        (only,) = needed
        return UnsatisfiableToolError(
            only.tool, only.path, f"{only.detail}; tool_choice requires a call to it"
        )
    listed = "; ".join(str(u) for u in needed)
    return UnsatisfiableToolError(
        None, "tool_choice", f"requires a call, and no call can satisfy any tool it allows: {listed}"
    )
