"""The shortest completion of a partial string under a schema's ``pattern``.

What the shortest value (:mod:`hermes_vllm.budget.shortest`) needs for a string argument the
schema constrains by a regex: the reserve's shortest call, and the shortest way to finish a
string the model has begun when ``max_tokens`` comes near. Patterns reach here as the schema
rewrite leaves them (:func:`hermes_vllm.schema.rewrite.search_as_full_match`: anchored, a whole
match, no lookaround or backreference), so a Thompson NFA over Python's own regex parse is
exact for them. The search prefers characters JSON writes without an escape, and gives up
(``None``) on what it does not model (case-insensitive flags, word boundaries, a pattern whose
automaton would be huge): the caller then does not steer, and every forced token is still
checked against the engine's mask.
"""

from __future__ import annotations

import re
import re._constants as sre  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hermes_vllm.memo import memoize_small

_CANDIDATES = "a0A_-. " + "".join(c for c in string.printable if c not in '"\\\t\n\r\x0b\x0c a0A_-.')
"""Characters tried for a negated class, best first: none needs an escape in JSON."""
_MAX_STATES = 4096
"""An automaton past this size (long bounded repeats) is not built."""
_MAX_VISITS = 20_000
"""State sets the search visits before it gives up."""

Match = Callable[[str], bool]


class _Unsupported(Exception):
    """A construct the automaton does not model."""


@dataclass
class _Nfa:
    """Edges per state: character edges ``(match, hint chars, target)`` and epsilon edges."""

    edges: list[list[tuple[Match, str, int]]] = field(default_factory=list)
    epsilon: list[list[int]] = field(default_factory=list)

    def state(self) -> int:
        if len(self.edges) >= _MAX_STATES:
            raise _Unsupported("automaton too large")
        self.edges.append([])
        self.epsilon.append([])
        return len(self.edges) - 1

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        seen = set(states)
        todo = list(seen)
        while todo:
            for nxt in self.epsilon[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)

    def step(self, states: frozenset[int], char: str) -> frozenset[int]:
        return self.closure(t for s in states for match, _, t in self.edges[s] if match(char))


_CATEGORIES: dict[Any, tuple[Match, str]] = {
    sre.CATEGORY_DIGIT: (str.isdigit, "0"),
    sre.CATEGORY_NOT_DIGIT: (lambda c: not c.isdigit(), "a"),
    sre.CATEGORY_SPACE: (str.isspace, " "),
    sre.CATEGORY_NOT_SPACE: (lambda c: not c.isspace(), "a"),
    sre.CATEGORY_WORD: (lambda c: c.isalnum() or c == "_", "a"),
    sre.CATEGORY_NOT_WORD: (lambda c: not (c.isalnum() or c == "_"), "-"),
}


def _equal(value: str) -> Match:
    return lambda c: c == value


def _unequal(value: str) -> Match:
    return lambda c: c != value


def _within(low: int, high: int) -> Match:
    return lambda c: low <= ord(c) <= high


def _char_set(items: list[tuple[Any, Any]]) -> tuple[Match, str]:
    """A ``[...]`` class: its test and the characters worth trying first."""
    negate = bool(items) and items[0][0] == sre.NEGATE
    tests: list[Match] = []
    hints = ""
    for op, arg in items[1:] if negate else items:
        if op == sre.LITERAL:
            tests.append(_equal(chr(arg)))
            hints += chr(arg)
        elif op == sre.RANGE:
            low, high = arg
            tests.append(_within(low, high))
            hints += "".join(ch for ch in _CANDIDATES if low <= ord(ch) <= high)[:1] or chr(low)
        elif op == sre.CATEGORY and arg in _CATEGORIES:
            test, hint = _CATEGORIES[arg]
            tests.append(test)
            hints += hint
        else:
            raise _Unsupported(str(op))

    def inside(c: str) -> bool:
        return any(t(c) for t in tests)

    if negate:
        return (lambda c: not inside(c)), ""
    return inside, hints


def _build(nfa: _Nfa, items: Any, start: int) -> int:
    """Add a parsed sequence from ``start``; return its end state."""
    end = start
    for op, arg in items:
        end = _build_one(nfa, op, arg, end)
    return end


def _edge(nfa: _Nfa, start: int, match: Match, hints: str) -> int:
    end = nfa.state()
    nfa.edges[start].append((match, hints, end))
    return end


def _build_one(nfa: _Nfa, op: Any, arg: Any, start: int) -> int:
    if op == sre.LITERAL:
        return _edge(nfa, start, _equal(chr(arg)), chr(arg))
    if op == sre.NOT_LITERAL:
        return _edge(nfa, start, _unequal(chr(arg)), "")
    if op == sre.ANY:
        return _edge(nfa, start, _unequal("\n"), "")
    if op == sre.IN:
        return _edge(nfa, start, *_char_set(arg))
    if op == sre.AT:
        if arg in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING, sre.AT_END, sre.AT_END_STRING):
            return start  # anchored at the ends already: a whole match
        raise _Unsupported(str(arg))
    if op == sre.SUBPATTERN:
        _, add_flags, del_flags, items = arg
        if add_flags & ~re.UNICODE or del_flags:
            raise _Unsupported("inline flags")
        return _build(nfa, items, start)
    if op == sre.BRANCH:
        end = nfa.state()
        for items in arg[1]:
            nfa.epsilon[_build(nfa, items, start)].append(end)
        return end
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        low, high, items = arg
        end = start
        for _ in range(low):
            end = _build(nfa, items, end)
        if high == sre.MAXREPEAT:
            loop = nfa.state()
            nfa.epsilon[end].append(loop)
            nfa.epsilon[_build(nfa, items, loop)].append(loop)
            return loop
        out = nfa.state()
        nfa.epsilon[end].append(out)
        for _ in range(high - low):
            end = _build(nfa, items, end)
            nfa.epsilon[end].append(out)
        return out
    raise _Unsupported(str(op))


@memoize_small(len)
def _automaton(pattern: str) -> tuple[_Nfa, frozenset[int], int] | None:
    """The pattern's NFA, its start set and its accepting state; ``None`` if not modelled."""
    try:
        parsed = sre_parse.parse(pattern)
        if parsed.state.flags & ~(re.UNICODE | re.VERBOSE):
            raise _Unsupported("flags")
        nfa = _Nfa()
        start = nfa.state()
        accept = _build(nfa, parsed, start)
    except (_Unsupported, re.error, RecursionError, OverflowError):
        return None
    return nfa, nfa.closure((start,)), accept


def _plain(char: str) -> bool:
    """Whether JSON writes ``char`` as itself (no escape)."""
    return char not in '"\\' and ord(char) >= 0x20


def _tries(nfa: _Nfa, states: frozenset[int]) -> str:
    """Characters whose steps from ``states`` cover every edge leaving them, each edge's pick
    one JSON writes without an escape where the edge has one."""
    out: dict[str, None] = {}
    for s in states:
        for match, hints, _ in nfa.edges[s]:
            pick = next((c for c in hints if match(c) and _plain(c)), None)
            pick = pick or next((c for c in _CANDIDATES if match(c)), None)
            pick = pick or next((c for c in hints if match(c)), None)
            if pick is not None:
                out.setdefault(pick)
    return "".join(out)


def shortest_completion(pattern: str, prefix: str) -> str | None:
    """The shortest text that makes ``prefix + text`` a whole match of ``pattern``; ``None`` when
    no completion exists or the pattern is not modelled."""
    built = _automaton(pattern)
    if built is None:
        return None
    nfa, states, accept = built
    for char in prefix:
        states = nfa.step(states, char)
        if not states:
            return None
    frontier: list[tuple[frozenset[int], str]] = [(states, "")]
    seen = {states}
    while frontier:  # breadth first: the first accepting set is reached by a shortest text
        nxt: list[tuple[frozenset[int], str]] = []
        for current, text in frontier:
            if accept in current:
                return text
            for char in _tries(nfa, current):
                following = nfa.step(current, char)
                if following and following not in seen:
                    if len(seen) >= _MAX_VISITS:
                        return None
                    seen.add(following)
                    nxt.append((following, text + char))
        frontier = nxt
    return None
